/*
 * avx512/panels_fp8.c — the FP8_PANELS micro-kernel: f32 FMA on e4m3 weights widened in registers.
 *
 * Per k, a panel's 16 codes sign-extend to int16 (vpmovsxbw), a shift left by 7 and an AND with
 * 0xbf80 make them the f16 of the code's value / 256 (format_fp8.c), and vcvtph2ps widens them to
 * f32; each token's x[k] is broadcast into one FMA per panel. The scale is applied once per
 * 128-column block, not per weight: each block's sum starts at zero and is added to y as
 * y + sum·(256·scale) — one FMA per output per block, and the weight path is 4-5 instructions per 16
 * codes (vcvtph2ps bounds it: ~2 cycles per 16 on Zen 4). Up to 6 tokens × 3 panels: 18 block
 * accumulators, the running totals live in y (in L1). Every output is the same chain of operations
 * whatever the tile shape (batch invariance, as for bf16).
 */
#include "kernels/cpu/avx512/panel.h"

/* The 16 codes of one k of a panel, as f32 values / 256 (exact). */
INLINE __m512 widen16(const uint8_t *p) {
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80)));
}

/* The 32 codes of two consecutive k: one sign extension, shift and AND make both k's f16 halves
 * (the high one reaches vcvtph2ps through an extract), 5 shuffle-port and ALU µops per 32 codes
 * where two widen16 take 6 — the conversion, not memory, bounds a decode stream on Intel cores. */
INLINE void widen32(const uint8_t *p, __m512 *lo, __m512 *hi) {
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)), 7),
                                       _mm512_set1_epi16((short)0xbf80));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

INLINE void fp8_tile(const cv_panel_tile *t, const int MR, const int NP) {
    const float *x = t->x;
    for (int64_t b0 = 0; b0 < t->k; b0 += CV_FP8_SCALE_COLS) {
        const int64_t b1 = b0 + CV_FP8_SCALE_COLS < t->k ? b0 + CV_FP8_SCALE_COLS : t->k;
        __m512 acc[6][3];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NP; j++) acc[i][j] = _mm512_setzero_ps();
        int64_t k = b0;
        /* A group's two k pairs in turn: the NP panels' widened pair (2·NP vectors), then each
         * token's two activations broadcast once for all panels. (With every panel's whole group
         * widened first, gcc kept all 4·MR broadcasts in registers beside the accumulators and
         * spilled them to the stack every group.) */
        for (; k + 4 <= b1; k += 4)
            for (int h = 0; h < 4; h += 2) {
                __m512 w0[3], w1[3];
                for (int j = 0; j < NP; j++) {
                    const uint8_t *p = t->w + j * t->panel_stride + k * 16;
                    if (MR <= CV_STREAM_TOKENS && t->ask && h == 0)
                        _mm_prefetch(cv_panel_ahead(t, j, k * 16, t->k * 16), _MM_HINT_T0);
                    widen32(p + 16 * h, &w0[j], &w1[j]);
                }
                for (int i = 0; i < MR; i++) {
                    const __m512 x0 = _mm512_set1_ps(x[i * t->ldx + k + h]), x1 = _mm512_set1_ps(x[i * t->ldx + k + h + 1]);
                    for (int j = 0; j < NP; j++) acc[i][j] = _mm512_fmadd_ps(w1[j], x1, _mm512_fmadd_ps(w0[j], x0, acc[i][j]));
                }
            }
        for (; k < b1; k++) /* the block's last columns when K is not a multiple of 4 */
            for (int j = 0; j < NP; j++) {
                const __m512 w = widen16(t->w + j * t->panel_stride + k * 16);
                for (int i = 0; i < MR; i++) acc[i][j] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[i * t->ldx + k]), acc[i][j]);
            }
        for (int j = 0; j < NP; j++)
            for (int i = 0; i < MR; i++) fp8_block_store(t, i, j, b0, acc[i][j]);
    }
}

PANEL_DISPATCH(panels_fp8, fp8_tile, 6, 3)

const cv_gemm_kernel cv_avx512_panels_fp8 = {.panel = panels_fp8, .mr = 6, .nr = 3};
