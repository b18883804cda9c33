/*
 * rows_c.h — element-wise row loops written once in plain C (internal to src/kernels/cpu): the
 * cpu_ops entries (cpu_ops.h) of the ISAs without a hand-written version. Each folder that includes
 * it compiles its own copy with its own flags, so the AVX2 folder gets them vectorized by the
 * compiler, and they define the bits the hand-written versions must match.
 */
#ifndef CV_ROWS_C_H
#define CV_ROWS_C_H

#include <math.h>
#include <stdint.h>

#include "base/dtype.h"

static inline float cv_rows_absmax(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

static inline void cv_rows_quantize_i8(int8_t *codes, const float *x, int64_t n, float div, float offset) {
    for (int64_t i = 0; i < n; i++) {
        float v = rintf(x[i] / div + offset);
        v = v < -128.0f ? -128.0f : v;
        v = v > 127.0f ? 127.0f : v;
        codes[i] = (int8_t)v;
    }
}

static inline void cv_rows_round_bf16(uint16_t *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = cv_f32_to_bf16(x[i]);
}

static inline void cv_rows_rms_apply(float *y, const float *x, const float *w, int64_t n, float inv_rms) {
    for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * inv_rms);
}

/* fp-contract off: gnu17 lets gcc fuse a product into the sum after it where the folder's flags
 * have FMA, and every ISA must give the portable path's bits (each product rounded alone) */
__attribute__((optimize("fp-contract=off"))) static inline void cv_rows_rotate_half(float *y, const float *x,
                                                                                   const float *c, const float *s,
                                                                                   int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        y[i] = a * c[i] - b * s[i];
        y[i + half] = b * c[i] + a * s[i];
    }
}

#endif
