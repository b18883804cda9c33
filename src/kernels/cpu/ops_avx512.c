/*
 * ops_avx512.c — AVX-512 primitives: 16 f32 lanes, masked tails, f32/bf16/f16 weights.
 *
 * The matmul micro-tile keeps up to 4 tokens × 4 weight rows of accumulators in registers (16 of
 * the 32 zmm), so every weight vector loaded from memory feeds up to four FMAs and every activation
 * vector four. bf16 weights widen by a zero-extend and a 16-bit shift (bf16 is the top half of an
 * f32), f16 through vcvtph2ps; both are exact, so the only rounding is f32 FMA accumulation.
 * Tails (k not a multiple of 16) use masked loads, which read no byte past the row end.
 *
 * The tile shape and dtype are compile-time constants of always-inlined code, so each of the 48
 * (mr, nr, dtype) combinations becomes straight-line register code without branches in the k loop.
 */
#include <immintrin.h>

#include "kernels/cpu/cpu_ops.h"

#define INLINE static inline __attribute__((always_inline))

INLINE __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

INLINE __m512 load_w(const void *w, int64_t off, cv_dtype dt) {
    if (dt == CV_DTYPE_F32) return _mm512_loadu_ps((const float *)w + off);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + off));
    return dt == CV_DTYPE_BF16 ? widen_bf16(h) : _mm512_cvtph_ps(h);
}

INLINE __m512 load_w_masked(const void *w, int64_t off, cv_dtype dt, __mmask16 m) {
    if (dt == CV_DTYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)w + off);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + off);
    return dt == CV_DTYPE_BF16 ? widen_bf16(h) : _mm512_cvtph_ps(h);
}

INLINE void tile_fixed(const void *w, int64_t ldw, cv_dtype dt, const float *x, int64_t ldx, float *y, int64_t ldy,
                       const int MR, const int NR, int64_t K) {
    __m512 acc[4][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[4];
        for (int j = 0; j < NR; j++) wv[j] = load_w(w, j * ldw + k, dt);
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 wv[4];
        for (int j = 0; j < NR; j++) wv[j] = load_w_masked(w, j * ldw + k, dt, m);
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

#define TILE_CASE(DT, MR, NR) \
    case (MR) * 8 + (NR): tile_fixed(w, ldw, DT, x, ldx, y, ldy, MR, NR, k); return;
#define TILE_ROW(DT, MR) TILE_CASE(DT, MR, 1) TILE_CASE(DT, MR, 2) TILE_CASE(DT, MR, 3) TILE_CASE(DT, MR, 4)
#define TILE_FN(fn, DT)                                                                                    \
    static void fn(const void *w, int64_t ldw, const float *x, int64_t ldx, float *y, int64_t ldy, int mr, \
                   int nr, int64_t k) {                                                                    \
        switch (mr * 8 + nr) {                                                                             \
            TILE_ROW(DT, 1) TILE_ROW(DT, 2) TILE_ROW(DT, 3) TILE_ROW(DT, 4)                                \
        default: __builtin_unreachable();                                                                  \
        }                                                                                                  \
    }

TILE_FN(tile_f32, CV_DTYPE_F32)
TILE_FN(tile_bf16, CV_DTYPE_BF16)
TILE_FN(tile_f16, CV_DTYPE_F16)

static void tile_avx512(const void *w, int64_t ldw, cv_dtype dtype, const float *x, int64_t ldx, float *y,
                        int64_t ldy, int mr, int nr, int64_t k) {
    if (dtype == CV_DTYPE_BF16) tile_bf16(w, ldw, x, ldx, y, ldy, mr, nr, k);
    else if (dtype == CV_DTYPE_F16) tile_f16(w, ldw, x, ldx, y, ldy, mr, nr, k);
    else tile_f32(w, ldw, x, ldx, y, ldy, mr, nr, k);
}

INLINE __mmask16 tail_mask(int64_t left) { return (__mmask16)((1u << left) - 1u); }

static float dot_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static void axpy_avx512(float *y, float a, const float *x, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 r = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

static void scale_avx512(float *y, float a, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

const cv_cpu_ops cv_cpu_ops_avx512 = {
    .name = "avx512",
    .mr_max = 4,
    .nr_max = 4,
    .tile = tile_avx512,
    .dot = dot_avx512,
    .axpy = axpy_avx512,
    .scale = scale_avx512,
};
