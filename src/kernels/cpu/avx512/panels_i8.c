/*
 * avx512/panels_i8.c — the I8_PANELS micro-kernels: int8 × int8 → int32, exact, then the
 * dequantizing epilogue; one with AVX512-VNNI and one for AVX-512 CPUs without it.
 *
 * VNNI: vpdpbusd multiplies unsigned bytes by signed bytes, four per 32-bit lane, and adds them to
 * the lane with no saturation. A panel's 64-byte group is 16 rows × 4 k (format_i8.c), so one
 * vpdpbusd against the token's 4 activation codes broadcast to every lane adds 4 products to each
 * of 16 outputs. The activations are the unsigned operand, offset by 128 (a flip of the top bit):
 * Σ (x+128)·w = Σ x·w + 128·Σ w, so the accumulators start at −128 × the row's code sum (stored in
 * the panel) and end at the exact Σ x·w. Intermediate sums may wrap; the int32 arithmetic is
 * modular, so the result is still exact. Up to 8 tokens × 3 panels: 24 accumulators (6 tokens
 * measured 10-15 % slower at 16).
 *
 * Without VNNI (vpmaddwd): the codes are sign-extended to int16, each 32-bit lane then holds the
 * sum of 2 products (never near overflow), rows 0-7 and 8-15 of a group in two vectors with 2
 * lanes per row; the pairs are added across lanes once per tile. Up to 4 tokens × 2 panels: 16
 * accumulators, 4 widened weight vectors, 1 broadcast.
 *
 * Both end in the same epilogue as the portable kernel (cv_i8_dequant): int32 add of the bias,
 * vcvtdq2ps, two vmulps — the same bits on every ISA. A k block that is not the last stores the
 * int32 sums in y for the next block to continue from.
 */
#include <string.h>

#include "kernels/cpu/avx512/panel.h"

#define VNNI __attribute__((target("avx512vnni")))

/* Tile outputs of token i, panel j: their earlier k blocks' int32 sums. */
INLINE __m512i i8_partial(const cv_panel_tile *t, int i, int j) {
    return _mm512_maskz_loadu_epi32(panel_mask(t, j), t->y + i * t->ldy + 16 * j);
}

/* Stores the exact sums of token i, panel j: as int32 for the next k block, or dequantized. */
INLINE void i8_finish(const cv_panel_tile *t, int i, int j, __m512i acc) {
    const __mmask16 m = panel_mask(t, j);
    float *y = t->y + i * t->ldy + 16 * j;
    if (!t->last) {
        _mm512_mask_storeu_epi32(y, m, acc);
        return;
    }
    _mm512_mask_storeu_ps(y, m, i8_dequant(t, i, j, acc));
}

/* The 4 activation codes of token i at group g, as one 32-bit word. */
INLINE int x_quad(const cv_panel_tile *t, int i, int64_t g) {
    int32_t q;
    memcpy(&q, (const int8_t *)t->x + i * t->ldx + 4 * g, sizeof q);
    return q;
}

/* The accumulators are int32-lane vectors (__v16si), the intrinsic's __m512i only a view at each
 * vpdpbusd: held as __m512i (64-bit lanes) across the k loop, gcc 12 moved a 6 × 3 tile's
 * accumulators through the stack and other registers every group, and the kernel ran at half its
 * multiply-adds. */
VNNI INLINE void i8_vnni_tile(const cv_panel_tile *t, const int MR, const int NP) {
    __v16si acc[8][3];
    for (int j = 0; j < NP; j++) {
        const __v16si start = (__v16si)_mm512_sub_epi32(
            _mm512_setzero_si512(), _mm512_slli_epi32(_mm512_loadu_si512(t->aux + j * t->aux_stride + 4 * CV_I8_AUX_SUM), 7));
        for (int i = 0; i < MR; i++) acc[i][j] = t->first ? start : (__v16si)i8_partial(t, i, j);
    }
    const int64_t groups = (t->k + 3) / 4; /* x is zero past the row, so whole groups are read */
    for (int64_t g = 0; g < groups; g++) {
        __v16si w[3];
        for (int j = 0; j < NP; j++) {
            const uint8_t *p = t->w + j * t->panel_stride + g * 64;
            if (MR <= CV_STREAM_TOKENS && t->ask) _mm_prefetch(cv_panel_ahead(t, j, g * 64, groups * 64), _MM_HINT_T0);
            w[j] = (__v16si)_mm512_loadu_si512(p);
        }
        for (int i = 0; i < MR; i++) {
            /* x + 128 as unsigned bytes: a flip of each code's top bit */
            const __v16si xb = (__v16si)_mm512_set1_epi32(x_quad(t, i, g) ^ (int)0x80808080u);
            for (int j = 0; j < NP; j++)
                acc[i][j] = (__v16si)_mm512_dpbusd_epi32((__m512i)acc[i][j], (__m512i)xb, (__m512i)w[j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) i8_finish(t, i, j, (__m512i)acc[i][j]);
}

/* Row sums from the pair lanes: lo holds rows 0-7 at lanes 2r and 2r+1, hi rows 8-15. */
INLINE __m512i pair_sums(__m512i lo, __m512i hi) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    return _mm512_add_epi32(_mm512_permutex2var_epi32(lo, even, hi), _mm512_permutex2var_epi32(lo, odd, hi));
}

INLINE void i8_madd_tile(const cv_panel_tile *t, const int MR, const int NP) {
    __v16su lo[4][2], hi[4][2]; /* int32 lanes, as in i8_vnni_tile (unsigned: the adds wrap) */
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) lo[i][j] = hi[i][j] = (__v16su)_mm512_setzero_si512();
    const int64_t groups = (t->k + 3) / 4;
    for (int64_t g = 0; g < groups; g++) {
        __m512i wlo[2], whi[2];
        for (int j = 0; j < NP; j++) {
            const uint8_t *p = t->w + j * t->panel_stride + g * 64;
            if (MR <= CV_STREAM_TOKENS && t->ask) _mm_prefetch(cv_panel_ahead(t, j, g * 64, groups * 64), _MM_HINT_T0);
            wlo[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
            whi[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32)));
        }
        for (int i = 0; i < MR; i++) {
            /* x0..x3 as int16, repeated in every 64-bit lane: row r's 4 codes meet them in lanes 2r, 2r+1 */
            const __m512i xb = _mm512_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(x_quad(t, i, g))));
            for (int j = 0; j < NP; j++) {
                lo[i][j] += (__v16su)_mm512_madd_epi16(wlo[j], xb);
                hi[i][j] += (__v16su)_mm512_madd_epi16(whi[j], xb);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) {
            __m512i acc = pair_sums((__m512i)lo[i][j], (__m512i)hi[i][j]);
            if (!t->first) acc = _mm512_add_epi32(acc, i8_partial(t, i, j));
            i8_finish(t, i, j, acc);
        }
}

VNNI PANEL_DISPATCH(panels_i8_vnni, i8_vnni_tile, 8, 3)
PANEL_DISPATCH(panels_i8, i8_madd_tile, 4, 2)

const cv_gemm_kernel cv_avx512_panels_i8_vnni = {.panel = panels_i8_vnni, .mr = 8, .nr = 3};
const cv_gemm_kernel cv_avx512_panels_i8 = {.panel = panels_i8, .mr = 4, .nr = 2};
