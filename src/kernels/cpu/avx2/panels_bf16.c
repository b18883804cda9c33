/*
 * avx2/panels_bf16.c — the BF16_PANELS micro-kernel for AVX2: a panel's 64-byte pair group is read
 * as two 32-byte halves of 8 outputs × 2 k; the halves widen exactly by a shift and an AND (see
 * avx512/panels_bf16.c). Up to 5 tokens × 1 panel: 10 accumulators, 4 widened weights and a token's
 * 2 broadcasts fill the 16 ymm (the AND's mask is read from memory).
 *
 * Why 5 tokens: each output is one FMA chain in k order (the bits of every other path), 2 dependent
 * FMAs a pair. At 4 tokens the tile's 8 chains took 8 cycles a pair at FMA latency 4, exactly the
 * 16 FMAs' issue time on 2 ports, so every stall lost FMA slots; 10 chains leave a fifth of slack.
 */
#include "kernels/cpu/avx2/vec.h"

INLINE void bf16_tile(const cv_panel_tile *t, const int MR) {
    __m256 acc[5][2];
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++)
            acc[i][h] = t->first ? _mm256_setzero_ps() : load_cols(t->y + i * t->ldy + 8 * h, t->n_out - 8 * h);
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    const float *x = t->x;
    const int64_t full = t->k / 2; /* pairs with both halves in the row; an odd k leaves a half pair */
    for (int64_t p = 0; p < full; p++) {
        __m256 lo[2], hi[2];
        if (MR <= CV_STREAM_TOKENS && t->ask) _mm_prefetch(cv_panel_ahead(t, 0, p * 64, (t->k + 1) / 2 * 64), _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(t->w + p * 64 + h * 32));
            lo[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            hi[h] = _mm256_castsi256_ps(_mm256_and_si256(v, top));
        }
        for (int i = 0; i < MR; i++) {
            const __m256 x0 = _mm256_set1_ps(x[i * t->ldx + 2 * p]), x1 = _mm256_set1_ps(x[i * t->ldx + 2 * p + 1]);
            for (int h = 0; h < 2; h++) acc[i][h] = _mm256_fmadd_ps(hi[h], x1, _mm256_fmadd_ps(lo[h], x0, acc[i][h]));
        }
    }
    if (t->k % 2) /* x[k] is past the row: only the low half of the last pair is read */
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(t->w + full * 64 + h * 32));
            const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            for (int i = 0; i < MR; i++) acc[i][h] = _mm256_fmadd_ps(lo, _mm256_set1_ps(x[i * t->ldx + 2 * full]), acc[i][h]);
        }
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++) store_cols(t->y + i * t->ldy + 8 * h, acc[i][h], t->n_out - 8 * h);
}

PANEL_DISPATCH(panels_bf16, bf16_tile, MR_UP_TO_5)

const cv_gemm_kernel cv_avx2_panels_bf16 = {.panel = panels_bf16, .mr = 5, .nr = 1};
