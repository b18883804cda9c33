/*
 * ref/ops.c — the portable path: plain C loops, also the reading of what the SIMD paths compute.
 *
 * Weights are widened one element at a time; accumulation is f32 like the SIMD paths so that all
 * three agree to rounding. Dot products keep eight partial sums, which is both what the compiler
 * can vectorize at the baseline ISA and a little more accurate than one running sum.
 * Packed panels are read element by element through their index formula (cpu_ops.h).
 */
#include <assert.h>
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

static inline float weight_at(const void *w, cv_dtype dtype, int64_t i) {
    switch (dtype) {
    case CV_DTYPE_BF16:
        return cv_bf16_to_f32(((const uint16_t *)w)[i]);
    case CV_DTYPE_F16:
        return cv_f16_to_f32(((const uint16_t *)w)[i]);
    default:
        return ((const float *)w)[i];
    }
}

static void tile_scalar(const void *w, int64_t ldw, cv_dtype dtype, const float *x, int64_t ldx, float *y,
                        int64_t ldy, int mr, int nr, int64_t k) {
    for (int j = 0; j < nr; j++) {
        for (int i = 0; i < mr; i++) {
            const float *xi = x + i * ldx;
            float acc = 0.0f;
            for (int64_t e = 0; e < k; e++) acc += xi[e] * weight_at(w, dtype, j * ldw + e);
            y[i * ldy + j] = acc;
        }
    }
}

static float dot_scalar(const float *a, const float *b, int64_t n) {
    float part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) part[l] += a[i + l] * b[i + l];
    for (; i < n; i++) part[0] += a[i] * b[i];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

static void axpy_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void scale_scalar(float *y, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

static void panel_scalar(const cv_panel_tile *t) {
    const float *x = t->x;
    for (int i = 0; i < t->mr; i++)
        for (int c = 0; c < t->n_out; c++) {
            const uint16_t *w = t->w + (c / 16) * t->panel_stride + (c % 16) * 2;
            float acc = t->accumulate ? t->y[i * t->ldy + c] : 0.0f;
            for (int64_t p = 0; p < t->pairs; p++) {
                acc += x[i * t->ldx + 2 * p] * cv_bf16_to_f32(w[p * 32]);
                if (!(t->odd_tail && p == t->pairs - 1)) acc += x[i * t->ldx + 2 * p + 1] * cv_bf16_to_f32(w[p * 32 + 1]);
            }
            t->y[i * t->ldy + c] = acc;
        }
}

static void gemm_rows_scalar(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int m, int n,
                             int k, bool accumulate) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float acc = accumulate ? c[i * ldc + j] : 0.0f;
            for (int p = 0; p < k; p++) acc += a[i * lda + p] * b[p][j];
            c[i * ldc + j] = acc;
        }
}

static void transpose_rows_scalar(float *dst, int64_t ld, const float *const *rows, int n_rows, int n_cols) {
    for (int r = 0; r < n_rows; r++)
        for (int c = 0; c < n_cols; c++) dst[(int64_t)c * ld + r] = rows[r][c];
}

static float exp_sum_scalar(float *y, const float *x, float shift, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += y[i] = expf(x[i] - shift);
    return sum;
}

static void silu_mul_scalar(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static float sum_sq_scalar(const float *x, int64_t n) { return dot_scalar(x, x, n); }

const cv_cpu_ops cv_cpu_ops_scalar = {
    .name = "scalar",
    .mr_max = 4,
    .nr_max = 4,
    .tile = tile_scalar,
    .panel_mr_max = 4,
    .panel_np_max = 2,
    .panel = panel_scalar,
    .dot = dot_scalar,
    .axpy = axpy_scalar,
    .scale = scale_scalar,
    .gemm_rows = gemm_rows_scalar,
    .transpose_rows = transpose_rows_scalar,
    .exp_sum = exp_sum_scalar,
    .silu_mul = silu_mul_scalar,
    .sum_sq = sum_sq_scalar,
};
