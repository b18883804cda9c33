/*
 * ref/panels_fp8.c — the portable FP8_PANELS micro-kernel: each code widened as the SIMD kernels do
 * (the f16 of value / 256, format_fp8.c), one f32 sum per output and 128-column block, added to the
 * output times the panel's stored 256·scale.
 */
#include "kernels/cpu/formats.h"

static void panels_fp8(const cv_panel_tile *t) {
    const float *x = t->x;
    for (int i = 0; i < t->mr; i++)
        for (int c = 0; c < t->n_out; c++) {
            const uint8_t *w = t->w + (c / 16) * t->panel_stride + c % 16;
            const float *scale = (const float *)(t->aux + (c / 16) * t->aux_stride);
            float *y = t->y + i * t->ldy + c;
            for (int64_t b0 = 0; b0 < t->k; b0 += CV_FP8_SCALE_COLS) {
                const int64_t b1 = b0 + CV_FP8_SCALE_COLS < t->k ? b0 + CV_FP8_SCALE_COLS : t->k;
                float sum = 0.0f;
                for (int64_t e = b0; e < b1; e++) sum += x[i * t->ldx + e] * cv_f16_to_f32(cv_fp8_f16_bits(w[e * 16]));
                const float prev = t->first && b0 == 0 ? 0.0f : *y;
                *y = prev + sum * scale[(t->k0 + b0) / CV_FP8_SCALE_COLS];
            }
        }
}

const cv_gemm_kernel cv_ref_panels_fp8 = {.panel = panels_fp8, .mr = 4, .nr = 2};
