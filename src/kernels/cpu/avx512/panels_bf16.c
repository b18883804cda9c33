/*
 * avx512/panels_bf16.c — the BF16_PANELS micro-kernel: f32 FMA on bf16 weights widened in registers.
 *
 * One 64-byte load is 16 outputs × 2 k; the two k halves widen exactly with one shift and one AND
 * (bf16 is the top half of an f32), then each token's x[k] and x[k+1] are broadcast into two FMAs
 * per panel. Up to 6 tokens × 3 panels: 18 accumulators + 6 widened weights + 2 broadcasts ≤ 32
 * zmm. Per pair that is 2·np widening ops against 2·mr·np FMAs, so at 6 × 3 the FMA ports are busy
 * ~86 % of the time, with no horizontal sums at all. Every output is one FMA chain in k order
 * whatever the tile shape, so a token's result does not depend on the tokens batched with it (the
 * engine's batch invariance); a lone decode token is then FMA-latency bound at ~24 B/cycle of
 * weights, still well above what memory delivers to one core.
 *
 * Why not vdpbf16ps: on the Xeon this was tuned on it issues at half the rate of vfmadd231ps, so
 * with 2 multiply-adds per lane it delivers the same 64 flops/cycle as f32 FMA at best — measured
 * 83 vs 167 GFLOP/s per core peak — while also needing activations rounded to bf16 (~2e-3 logit
 * error instead of f32's ~1e-6). f32 FMA on widened weights is both faster and exact.
 */
#include "kernels/cpu/avx512/panel.h"

INLINE void bf16_tile(const cv_panel_tile *t, const int MR, const int NP) {
    __m512 acc[6][3]; /* fixed bounds (not VLAs) so the compiler keeps them in registers */
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++)
            acc[i][j] = t->first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(panel_mask(t, j), t->y + i * t->ldy + 16 * j);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    const float *x = t->x;
    const int64_t full = t->k / 2; /* pairs with both halves in the row; an odd k leaves a half pair */
    for (int64_t p = 0; p < full; p++) {
        __m512 lo[3], hi[3];
        for (int j = 0; j < NP; j++) {
            const uint8_t *w = t->w + j * t->panel_stride + p * 64;
            if (MR <= CV_STREAM_TOKENS && t->ask) _mm_prefetch(cv_panel_ahead(t, j, p * 64, (t->k + 1) / 2 * 64), _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512(w);
            lo[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            hi[j] = _mm512_castsi512_ps(_mm512_and_si512(v, top));
        }
        for (int i = 0; i < MR; i++) {
            __m512 x0 = _mm512_set1_ps(x[i * t->ldx + 2 * p]), x1 = _mm512_set1_ps(x[i * t->ldx + 2 * p + 1]);
            for (int j = 0; j < NP; j++) acc[i][j] = _mm512_fmadd_ps(hi[j], x1, _mm512_fmadd_ps(lo[j], x0, acc[i][j]));
        }
    }
    if (t->k % 2) { /* x[k] is past the row: only the low half of the last pair is read */
        for (int j = 0; j < NP; j++) {
            __m512i v = _mm512_loadu_si512(t->w + j * t->panel_stride + full * 64);
            __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            for (int i = 0; i < MR; i++)
                acc[i][j] = _mm512_fmadd_ps(lo, _mm512_set1_ps(x[i * t->ldx + 2 * full]), acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) _mm512_mask_storeu_ps(t->y + i * t->ldy + 16 * j, panel_mask(t, j), acc[i][j]);
}

PANEL_DISPATCH(panels_bf16, bf16_tile, 6, 3)

const cv_gemm_kernel cv_avx512_panels_bf16 = {.panel = panels_bf16, .mr = 6, .nr = 3};
