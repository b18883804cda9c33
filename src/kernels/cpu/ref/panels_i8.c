/*
 * ref/panels_i8.c — the portable I8_PANELS micro-kernel: each output's int32 dot product read
 * through the panel index formula (format_i8.c), then the shared epilogue (cv_i8_dequant). The
 * sum is kept in uint32 so that it wraps as the SIMD adds do (it never does within the format's
 * column limit); the SIMD kernels must match it bit for bit.
 */
#include <string.h>

#include "kernels/cpu/formats.h"

static void panels_i8(const cv_panel_tile *t) {
    const int8_t *x = t->x;
    const int64_t groups = (t->k + 3) / 4; /* x is zero past the row, so whole groups are read */
    for (int i = 0; i < t->mr; i++)
        for (int c = 0; c < t->n_out; c++) {
            const int8_t *w = (const int8_t *)t->w + (c / 16) * t->panel_stride + (c % 16) * 4;
            const uint8_t *aux = t->aux + (c / 16) * t->aux_stride;
            float *y = t->y + i * t->ldy + c;
            uint32_t acc = 0;
            if (!t->first) memcpy(&acc, y, sizeof acc); /* earlier k blocks' int32 sum */
            for (int64_t g = 0; g < groups; g++)
                for (int e = 0; e < 4; e++) acc += (uint32_t)((int32_t)x[i * t->ldx + 4 * g + e] * w[g * 64 + e]);
            if (!t->last) {
                memcpy(y, &acc, sizeof acc);
                continue;
            }
            float scale;
            int32_t bias;
            memcpy(&scale, aux + 4 * (CV_I8_AUX_SCALE + c % 16), sizeof scale);
            memcpy(&bias, aux + 4 * (CV_I8_AUX_BIAS + c % 16), sizeof bias);
            *y = cv_i8_dequant((int32_t)acc, bias, scale, t->x_scale ? t->x_scale[i] : 1.0f);
        }
}

const cv_gemm_kernel cv_ref_panels_i8 = {.panel = panels_i8, .mr = 4, .nr = 2};
