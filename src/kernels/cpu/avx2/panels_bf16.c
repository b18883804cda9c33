/*
 * avx2/panels_bf16.c — the BF16_PANELS micro-kernel for AVX2: a panel's 64-byte pair group is read
 * as two 32-byte halves of 8 outputs × 2 k; the halves widen exactly by a shift and an AND (see
 * avx512/panels_bf16.c). Up to 4 tokens × 1 panel: 8 accumulators, 4 widened weights, 2 broadcasts.
 */
#include "kernels/cpu/avx2/vec.h"

INLINE void bf16_tile(const cv_panel_tile *t, const int MR) {
    __m256 acc[4][2];
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++)
            acc[i][h] = t->first ? _mm256_setzero_ps() : load_cols(t->y + i * t->ldy + 8 * h, t->n_out - 8 * h);
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    const float *x = t->x;
    const int64_t pairs = (t->k + 1) / 2;
    for (int64_t p = 0; p < pairs; p++) {
        const bool last_half = t->k % 2 && p == pairs - 1; /* x[2p+1] is past the row */
        __m256 lo[2], hi[2];
        if (MR <= CV_STREAM_TOKENS) _mm_prefetch(cv_panel_ahead(t, 0, p * 64, pairs * 64), _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(t->w + p * 64 + h * 32));
            lo[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            hi[h] = _mm256_castsi256_ps(_mm256_and_si256(v, top));
        }
        for (int i = 0; i < MR; i++) {
            __m256 x0 = _mm256_set1_ps(x[i * t->ldx + 2 * p]);
            __m256 x1 = _mm256_set1_ps(last_half ? 0.0f : x[i * t->ldx + 2 * p + 1]);
            for (int h = 0; h < 2; h++) acc[i][h] = _mm256_fmadd_ps(hi[h], x1, _mm256_fmadd_ps(lo[h], x0, acc[i][h]));
        }
    }
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++) store_cols(t->y + i * t->ldy + 8 * h, acc[i][h], t->n_out - 8 * h);
}

PANEL_DISPATCH(panels_bf16, bf16_tile, MR_UP_TO_4)

const cv_gemm_kernel cv_avx2_panels_bf16 = {.panel = panels_bf16, .mr = 4, .nr = 1};
