/*
 * ref/ops.c — the portable primitives (cpu_ops.h): plain C loops, also the reading of what the SIMD
 * paths compute. Accumulation is f32 like the SIMD paths so that all three agree to rounding. Dot
 * products keep eight partial sums, which is both what the compiler can vectorize at the baseline
 * ISA and a little more accurate than one running sum. The matmul micro-kernels of this path are
 * in rows.c and panels_*.c beside this file.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows_c.h"

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

static void copy_rows_scalar(void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int rows, int64_t bytes) {
    for (int r = 0; r < rows; r++) memcpy((char *)dst + r * ld_dst, (const char *)src + r * ld_src, (size_t)bytes);
}

static void widen_pairs_scalar(float *lo, float *hi, const uint32_t *w, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        lo[i] = cv_bf16_to_f32((uint16_t)w[i]);
        if (hi) hi[i] = cv_bf16_to_f32((uint16_t)(w[i] >> 16));
    }
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

static float max_scalar(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

const cv_cpu_ops cv_cpu_ops_scalar = {
    .name = "scalar",
    .dot = dot_scalar,
    .axpy = axpy_scalar,
    .scale = scale_scalar,
    .gemm_rows = gemm_rows_scalar,
    .transpose_rows = transpose_rows_scalar,
    .copy_rows = copy_rows_scalar,
    .widen_pairs = widen_pairs_scalar,
    .exp_sum = exp_sum_scalar,
    .silu_mul = silu_mul_scalar,
    .sum_sq = sum_sq_scalar,
    .max = max_scalar,
    .absmax = cv_rows_absmax,
    .quantize_i8 = cv_rows_quantize_i8,
    .rms_apply = cv_rows_rms_apply,
    .rotate_half = cv_rows_rotate_half,
    .round_bf16 = cv_rows_round_bf16,
};
