/*
 * ref/panels_bf16.c — the portable BF16_PANELS micro-kernel: each output read through the panel
 * index formula (formats.h), one f32 accumulator per output, k in order.
 */
#include <string.h>

#include "kernels/cpu/formats.h"

static void panels_bf16(const cv_panel_tile *t) {
    const float *x = t->x;
    for (int i = 0; i < t->mr; i++)
        for (int c = 0; c < t->n_out; c++) {
            const uint8_t *w = t->w + (c / 16) * t->panel_stride + (c % 16) * 4; /* pair p of row c: 64·p */
            float acc = t->first ? 0.0f : t->y[i * t->ldy + c];
            for (int64_t e = 0; e < t->k; e++) {
                uint16_t h;
                memcpy(&h, w + (e / 2) * 64 + (e % 2) * 2, sizeof h);
                acc += x[i * t->ldx + e] * cv_bf16_to_f32(h);
            }
            t->y[i * t->ldy + c] = acc;
        }
}

const cv_gemm_kernel cv_ref_panels_bf16 = {.panel = panels_bf16, .mr = 4, .nr = 2};
