/*
 * ref/rows.c — the portable row-major micro-kernels (F32, BF16, F16 weights as stored): one f32
 * accumulator per output, weights widened one element at a time.
 */
#include "kernels/cpu/formats.h"

#define ROWS_KERNEL(name, widen)                                                                              \
    static void name(const void *w, int64_t ldw, const float *x, int64_t ldx, float *y, int64_t ldy, int mr, \
                     int nr, int64_t k) {                                                                     \
        for (int j = 0; j < nr; j++)                                                                          \
            for (int i = 0; i < mr; i++) {                                                                    \
                const float *xi = x + i * ldx;                                                                \
                float acc = 0.0f;                                                                             \
                for (int64_t e = 0; e < k; e++) acc += xi[e] * widen(w, j * ldw + e);                         \
                y[i * ldy + j] = acc;                                                                         \
            }                                                                                                 \
    }

static inline float f32_at(const void *w, int64_t i) { return ((const float *)w)[i]; }
static inline float bf16_at(const void *w, int64_t i) { return cv_bf16_to_f32(((const uint16_t *)w)[i]); }
static inline float f16_at(const void *w, int64_t i) { return cv_f16_to_f32(((const uint16_t *)w)[i]); }

ROWS_KERNEL(rows_f32, f32_at)
ROWS_KERNEL(rows_bf16, bf16_at)
ROWS_KERNEL(rows_f16, f16_at)

const cv_gemm_kernel cv_ref_rows_f32 = {.rows = rows_f32, .mr = 4, .nr = 4};
const cv_gemm_kernel cv_ref_rows_bf16 = {.rows = rows_bf16, .mr = 4, .nr = 4};
const cv_gemm_kernel cv_ref_rows_f16 = {.rows = rows_f16, .mr = 4, .nr = 4};
