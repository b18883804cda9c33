/*
 * avx512/panels_fp8.c — the FP8_PANELS micro-kernel: f32 FMA on e4m3 weights widened in registers.
 *
 * One 64-byte load is 4 k × 16 outputs. Each half sign-extends to 32 int16 (vpmovsxbw), a shift
 * left by 7 and an AND with 0xbf80 make them the f16 of the code's value / 256 (format_fp8.c), and
 * vcvtph2ps widens each k's 16 lanes to f32; one multiply by the panel's stored 256·scale gives the
 * checkpoint's dequantized weight exactly, and each token's x[k] is broadcast into one FMA per k.
 * The scale changes every 128 columns, at the boundaries of the loop over scale blocks. Up to 6
 * tokens × 3 panels: 18 accumulators + 3 scales + one panel's 4 widened k at a time. Every output is
 * one FMA chain in k order whatever the tile shape (batch invariance, as for bf16).
 */
#include "kernels/cpu/avx512/panel.h"

/* 32 codes (2 k × 16 rows) as the f16 bits of value / 256. */
INLINE __m512i f16_of_codes(__m256i codes) {
    return _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(codes), 7), _mm512_set1_epi16((short)0xbf80));
}

INLINE void fp8_tile(const cv_panel_tile *t, const int MR, const int NP) {
    __m512 acc[6][3];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++)
            acc[i][j] = t->first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(panel_mask(t, j), t->y + i * t->ldy + 16 * j);
    const float *x = t->x;
    for (int64_t b0 = 0; b0 < t->k; b0 += CV_FP8_SCALE_COLS) {
        const int64_t b1 = b0 + CV_FP8_SCALE_COLS < t->k ? b0 + CV_FP8_SCALE_COLS : t->k;
        __m512 scale[3];
        for (int j = 0; j < NP; j++)
            scale[j] = _mm512_set1_ps(((const float *)(t->aux + j * t->aux_stride))[(t->k0 + b0) / CV_FP8_SCALE_COLS]);
        int64_t k = b0;
        for (; k + 4 <= b1; k += 4)
            for (int j = 0; j < NP; j++) {
                const uint8_t *p = t->w + j * t->panel_stride + k * 16;
                if (MR <= 2) _mm_prefetch((const char *)p + PREFETCH_BYTES, _MM_HINT_T0);
                const __m512i v = _mm512_loadu_si512(p);
                const __m512i h01 = f16_of_codes(_mm512_castsi512_si256(v)), h23 = f16_of_codes(_mm512_extracti64x4_epi64(v, 1));
                const __m512 w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h01)), scale[j]);
                const __m512 w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h01, 1)), scale[j]);
                const __m512 w2 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h23)), scale[j]);
                const __m512 w3 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h23, 1)), scale[j]);
                for (int i = 0; i < MR; i++) {
                    const float *xi = x + i * t->ldx + k;
                    acc[i][j] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xi[0]), acc[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xi[1]), acc[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(w2, _mm512_set1_ps(xi[2]), acc[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(w3, _mm512_set1_ps(xi[3]), acc[i][j]);
                }
            }
        for (; k < b1; k++) /* K not a multiple of 4: the last columns one at a time */
            for (int j = 0; j < NP; j++) {
                const __m128i codes = _mm_loadu_si128((const __m128i *)(t->w + j * t->panel_stride + k * 16));
                const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7),
                                                   _mm256_set1_epi16((short)0xbf80));
                const __m512 w = _mm512_mul_ps(_mm512_cvtph_ps(h), scale[j]);
                for (int i = 0; i < MR; i++) acc[i][j] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[i * t->ldx + k]), acc[i][j]);
            }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) _mm512_mask_storeu_ps(t->y + i * t->ldy + 16 * j, panel_mask(t, j), acc[i][j]);
}

PANEL_DISPATCH(panels_fp8, fp8_tile, 6, 3)

const cv_gemm_kernel cv_avx512_panels_fp8 = {.panel = panels_fp8, .mr = 6, .nr = 3};
