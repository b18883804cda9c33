/*
 * avx2/vec.h — what the AVX2 kernels of this folder share: tail masks, partial loads and stores of
 * up to 8 floats, the horizontal sum, and the dispatch of a panel tile to its compile-time shape.
 *
 * AVX2 has no masked 16-bit or 8-bit loads, only 32-bit vmaskmov, so f32 tails use masks and
 * narrower data is padded by the caller (panels, int8 rows) or copied (row-major tails).
 */
#ifndef CV_AVX2_VEC_H
#define CV_AVX2_VEC_H

#include <immintrin.h>

#include "kernels/cpu/formats.h"

#define INLINE static inline __attribute__((always_inline))

/* Lanes [0, left) set. */
INLINE __m256i tail_mask(int64_t left) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), lane);
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The first n (any n; ≥ 8: all) floats of a vector. */
INLINE void store_cols(float *y, __m256 v, int n) {
    if (n >= 8) _mm256_storeu_ps(y, v);
    else if (n > 0) _mm256_maskstore_ps(y, tail_mask(n), v);
}

INLINE __m256 load_cols(const float *y, int n) {
    if (n >= 8) return _mm256_loadu_ps(y);
    return n > 0 ? _mm256_maskload_ps(y, tail_mask(n)) : _mm256_setzero_ps();
}

/* static void NAME(const cv_panel_tile *t) running KERNEL(t, MR) at the tile's token count, for
 * MR_UP_TO_2, MR_UP_TO_4 or MR_UP_TO_5; every AVX2 panel kernel is one panel wide (16 outputs are
 * already two ymm per token). */
#define MR_UP_TO_2(KERNEL) \
    case 1: KERNEL(t, 1); return; \
    case 2: KERNEL(t, 2); return;
#define MR_UP_TO_4(KERNEL) MR_UP_TO_2(KERNEL) \
    case 3: KERNEL(t, 3); return; \
    case 4: KERNEL(t, 4); return;
#define MR_UP_TO_5(KERNEL) MR_UP_TO_4(KERNEL) \
    case 5: KERNEL(t, 5); return;
#define PANEL_DISPATCH(NAME, KERNEL, CASES)     \
    static void NAME(const cv_panel_tile *t) {  \
        switch (t->mr) {                        \
            CASES(KERNEL)                       \
        default: __builtin_unreachable();       \
        }                                       \
    }

#endif
