/*
 * avx2/panels_i8.c — the I8_PANELS micro-kernel for AVX2: int8 × int8 → int32, exact, then the
 * dequantizing epilogue, bit for bit as the portable kernel (cv_i8_dequant).
 *
 * vpmaddubsw would saturate its int16 pair sums, so the codes are sign-extended to int16 and
 * multiplied with vpmaddwd: a 16-byte quarter of a panel's group (4 rows × 4 k) becomes 16 int16,
 * and against the token's 4 codes (int16, repeated per 64 bits) each 32-bit lane gets the sum of 2
 * products, 2 lanes per row. The pairs are added across lanes once per tile (vphaddd, then a
 * 64-bit permute back into row order). Decode (1-2 tokens) reads each group once with all 16
 * rows in flight (4 accumulators per token); prefill (3-4 tokens) runs the panel's two halves of 8
 * rows one after the other, which fits 4 tokens in the 16 ymm registers — integer sums are exact,
 * so the order changes nothing.
 */
#include <string.h>

#include "kernels/cpu/avx2/vec.h"

/* Row sums of 8 rows from the pair lanes of rows 0-3 (a) and 4-7 (b). */
INLINE __m256i pair_sums(__m256i a, __m256i b) {
    /* vphaddd gives rows 0 1 4 5 | 2 3 6 7; the permute restores 0..7 */
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xd8);
}

/* Stores 8 exact sums (outputs c0.. of token i, n of them valid): int32 for the next k block, or
 * dequantized with the aux of the tile's panel. */
INLINE void i8_finish(const cv_panel_tile *t, int i, int c0, __m256i acc) {
    float *y = t->y + i * t->ldy + c0;
    const int n = t->n_out - c0;
    if (n <= 0) return;
    const __m256i mask = tail_mask(n);
    if (!t->first) acc = _mm256_add_epi32(acc, _mm256_maskload_epi32((const int *)y, mask));
    if (!t->last) {
        _mm256_maskstore_epi32((int *)y, mask, acc);
        return;
    }
    __m256 v = _mm256_cvtepi32_ps(_mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(t->aux + 4 * (CV_I8_AUX_BIAS + c0)))));
    v = _mm256_mul_ps(v, _mm256_loadu_ps((const float *)(t->aux + 4 * (CV_I8_AUX_SCALE + c0))));
    v = _mm256_mul_ps(v, _mm256_set1_ps(t->x_scale ? t->x_scale[i] : 1.0f));
    _mm256_maskstore_ps(y, mask, v);
}

/* Rows 8h..8h+7 of the panel (quarters 2h, 2h+1) for MR tokens over all groups. */
INLINE void i8_half(const cv_panel_tile *t, const int MR, const int h, __m256i acc[][2]) {
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    const int64_t groups = (t->k + 3) / 4; /* x is zero past the row, so whole groups are read */
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *p = t->w + g * 64 + 32 * h;
        if (MR <= CV_STREAM_TOKENS && t->ask) _mm_prefetch(cv_panel_ahead(t, 0, g * 64 + 32 * h, groups * 64), _MM_HINT_T0);
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
        for (int i = 0; i < MR; i++) {
            int32_t quad;
            memcpy(&quad, (const int8_t *)t->x + i * t->ldx + 4 * g, sizeof quad);
            const __m256i xb = _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(quad)));
            acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(w0, xb));
            acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(w1, xb));
        }
    }
}

INLINE void i8_tile(const cv_panel_tile *t, const int MR) {
    if (MR <= 2) { /* decode: both halves in one pass, each group read once */
        __m256i acc[2][4];
        for (int i = 0; i < MR; i++)
            for (int q = 0; q < 4; q++) acc[i][q] = _mm256_setzero_si256();
        const int64_t groups = (t->k + 3) / 4;
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *p = t->w + g * 64;
            if (t->ask) _mm_prefetch(cv_panel_ahead(t, 0, g * 64, groups * 64), _MM_HINT_T0);
            __m256i xb[2];
            for (int i = 0; i < MR; i++) {
                int32_t quad;
                memcpy(&quad, (const int8_t *)t->x + i * t->ldx + 4 * g, sizeof quad);
                xb[i] = _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(quad)));
            }
            for (int q = 0; q < 4; q++) {
                const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * q)));
                for (int i = 0; i < MR; i++) acc[i][q] = _mm256_add_epi32(acc[i][q], _mm256_madd_epi16(w, xb[i]));
            }
        }
        for (int i = 0; i < MR; i++) {
            i8_finish(t, i, 0, pair_sums(acc[i][0], acc[i][1]));
            i8_finish(t, i, 8, pair_sums(acc[i][2], acc[i][3]));
        }
        return;
    }
    /* prefill: more tokens, half a panel at a time (the sums are exact, so the order is free) */
    for (int h = 0; h < 2; h++) {
        __m256i acc[4][2];
        i8_half(t, MR, h, acc);
        for (int i = 0; i < MR; i++) i8_finish(t, i, 8 * h, pair_sums(acc[i][0], acc[i][1]));
    }
}

PANEL_DISPATCH(panels_i8, i8_tile, MR_UP_TO_4)

const cv_gemm_kernel cv_avx2_panels_i8 = {.panel = panels_i8, .mr = 4, .nr = 1};
