/*
 * avx512/panel.h — what the AVX-512 panel micro-kernels (panels_*.c) share: the mask of a partial
 * last panel and the dispatch of a tile to its compile-time shape.
 *
 * Each kernel is an always-inlined body KERNEL(t, MR, NP) with MR and NP constants, so every shape
 * becomes straight-line register code (accumulators in fixed-size arrays the compiler keeps in
 * zmm registers) with no branches in the k loop; PANEL_DISPATCH expands the switch over shapes.
 */
#ifndef CV_AVX512_PANEL_H
#define CV_AVX512_PANEL_H

#include <immintrin.h>

#include "kernels/cpu/formats.h"

#define INLINE static inline __attribute__((always_inline))

/* The lanes of panel j of a tile that hold outputs (the last panel may be partial). */
INLINE __mmask16 panel_mask(const cv_panel_tile *t, int j) {
    int n = t->n_out - 16 * j;
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* The I8_PANELS epilogue (formats.h cv_i8_dequant) of token i's exact sums for panel j: int32 add of
 * the bias, vcvtdq2ps, times the row scales, times the token's scale — the same bits on every ISA. */
INLINE __m512 i8_dequant(const cv_panel_tile *t, int i, int j, __m512i acc) {
    const uint8_t *aux = t->aux + j * t->aux_stride;
    __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(acc, _mm512_loadu_si512(aux + 4 * CV_I8_AUX_BIAS)));
    v = _mm512_mul_ps(v, _mm512_loadu_ps(aux + 4 * CV_I8_AUX_SCALE));
    return _mm512_mul_ps(v, _mm512_set1_ps(t->x_scale ? t->x_scale[i] : 1.0f));
}

/* The FP8_PANELS epilogue of one 128-column scale block (format_fp8.c): token i's block sum for
 * panel j, at column b0 of the tile, added to y as y + sum·(256·scale) (y = 0 at the weight's first
 * block) — one FMA an output per block, the same on both FP8 kernels. */
INLINE void fp8_block_store(const cv_panel_tile *t, int i, int j, int64_t b0, __m512 sum) {
    const __mmask16 m = panel_mask(t, j);
    const __m512 s = _mm512_set1_ps(((const float *)(t->aux + j * t->aux_stride))[(t->k0 + b0) / CV_FP8_SCALE_COLS]);
    float *y = t->y + i * t->ldy + 16 * j;
    const __m512 prev = t->first && b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y);
    _mm512_mask_storeu_ps(y, m, _mm512_fmadd_ps(sum, s, prev));
}

#define PANEL_CASE(KERNEL, MR, NP) \
    case (MR) * 4 + (NP): KERNEL(t, MR, NP); return;
#define PANEL_ROW1(KERNEL, MR) PANEL_CASE(KERNEL, MR, 1)
#define PANEL_ROW2(KERNEL, MR) PANEL_CASE(KERNEL, MR, 1) PANEL_CASE(KERNEL, MR, 2)
#define PANEL_ROW3(KERNEL, MR) PANEL_CASE(KERNEL, MR, 1) PANEL_CASE(KERNEL, MR, 2) PANEL_CASE(KERNEL, MR, 3)
#define PANEL_ROWS_3(R, KERNEL) R(KERNEL, 1) R(KERNEL, 2) R(KERNEL, 3)
#define PANEL_ROWS_4(R, KERNEL) PANEL_ROWS_3(R, KERNEL) R(KERNEL, 4)
#define PANEL_ROWS_6(R, KERNEL) PANEL_ROWS_4(R, KERNEL) R(KERNEL, 5) R(KERNEL, 6)
#define PANEL_ROWS_8(R, KERNEL) PANEL_ROWS_6(R, KERNEL) R(KERNEL, 7) R(KERNEL, 8)

/* static void NAME(const cv_panel_tile *t) running KERNEL at the tile's shape, for shapes up to
 * MR_MAX (3, 4, 6 or 8) tokens × NP_MAX (1 to 3) panels. */
#define PANEL_DISPATCH(NAME, KERNEL, MR_MAX, NP_MAX)                    \
    static void NAME(const cv_panel_tile *t) {                          \
        switch (t->mr * 4 + t->np) {                                    \
            PANEL_ROWS_##MR_MAX(PANEL_ROW##NP_MAX, KERNEL)              \
        default: __builtin_unreachable();                               \
        }                                                               \
    }

#endif
