/*
 * ops_scalar.c — the portable path: plain C loops, also the reading of what the SIMD paths compute.
 *
 * Weights are widened one element at a time; accumulation is f32 like the SIMD paths so that all
 * three agree to rounding. Dot products keep eight partial sums, which is both what the compiler
 * can vectorize at the baseline ISA and a little more accurate than one running sum.
 */
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

const cv_cpu_ops cv_cpu_ops_scalar = {
    .name = "scalar",
    .mr_max = 4,
    .nr_max = 4,
    .tile = tile_scalar,
    .dot = dot_scalar,
    .axpy = axpy_scalar,
    .scale = scale_scalar,
};
