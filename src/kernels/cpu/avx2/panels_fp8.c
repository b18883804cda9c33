/*
 * avx2/panels_fp8.c — the FP8_PANELS micro-kernel for AVX2: per k, a panel's 16 codes sign-extend
 * to int16 (vpmovsxbw), become the f16 of value / 256 with a shift and an AND, and widen in two
 * halves of 8 rows (vcvtph2ps); each 128-column block's sum is added to y times the panel's stored
 * 256·scale, as in avx512/panels_fp8.c. Up to 5 tokens × 1 panel: 10 accumulators, 2 widened
 * weights, a broadcast and the AND's constant fit the 16 ymm with no spill. Each output is one FMA
 * chain a k; at 4 tokens the 8 chains were just enough to cover the FMA latency on 2 ports, so every
 * stall cost slots, and the widening of each k's 16 codes served 4 tokens instead of 5.
 */
#include "kernels/cpu/avx2/vec.h"

INLINE void fp8_tile(const cv_panel_tile *t, const int MR) {
    const float *x = t->x;
    const __m256i top = _mm256_set1_epi16((short)0xbf80);
    for (int64_t b0 = 0; b0 < t->k; b0 += CV_FP8_SCALE_COLS) {
        const int64_t b1 = b0 + CV_FP8_SCALE_COLS < t->k ? b0 + CV_FP8_SCALE_COLS : t->k;
        __m256 acc[5][2];
        for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int64_t k = b0; k < b1; k++) {
            const uint8_t *p = t->w + k * 16;
            if (MR <= CV_STREAM_TOKENS && t->ask && k % 4 == 0) _mm_prefetch(cv_panel_ahead(t, 0, k * 16, t->k * 16), _MM_HINT_T0);
            const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)), 7), top);
            const __m256 w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
            for (int i = 0; i < MR; i++) {
                const __m256 xv = _mm256_set1_ps(x[i * t->ldx + k]);
                acc[i][0] = _mm256_fmadd_ps(w0, xv, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(w1, xv, acc[i][1]);
            }
        }
        const bool fresh = t->first && b0 == 0;
        const __m256 s = _mm256_set1_ps(((const float *)t->aux)[(t->k0 + b0) / CV_FP8_SCALE_COLS]);
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++) {
                float *y = t->y + i * t->ldy + 8 * h;
                const int n = t->n_out - 8 * h;
                store_cols(y, _mm256_fmadd_ps(acc[i][h], s, fresh ? _mm256_setzero_ps() : load_cols(y, n)), n);
            }
    }
}

PANEL_DISPATCH(panels_fp8, fp8_tile, MR_UP_TO_5)

const cv_gemm_kernel cv_avx2_panels_fp8 = {.panel = panels_fp8, .mr = 5, .nr = 1};
