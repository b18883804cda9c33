/*
 * ref/panels_fp8.c — the portable FP8_PANELS micro-kernel: each weight widened as the SIMD kernels
 * do (the f16 of value/256, times the stored 256·scale: the checkpoint's dequantized f32 exactly;
 * format_fp8.c), one f32 accumulator per output, k in order.
 */
#include "kernels/cpu/formats.h"

static void panels_fp8(const cv_panel_tile *t) {
    const float *x = t->x;
    for (int i = 0; i < t->mr; i++)
        for (int c = 0; c < t->n_out; c++) {
            const uint8_t *w = t->w + (c / 16) * t->panel_stride + c % 16;
            const float *scale = (const float *)(t->aux + (c / 16) * t->aux_stride);
            float acc = t->first ? 0.0f : t->y[i * t->ldy + c];
            for (int64_t e = 0; e < t->k; e++) {
                const float v = cv_f16_to_f32(cv_fp8_f16_bits(w[e * 16])) * scale[(t->k0 + e) / CV_FP8_SCALE_COLS];
                acc += x[i * t->ldx + e] * v;
            }
            t->y[i * t->ldy + c] = acc;
        }
}

const cv_gemm_kernel cv_ref_panels_fp8 = {.panel = panels_fp8, .mr = 4, .nr = 2};
