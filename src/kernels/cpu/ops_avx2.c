/*
 * ops_avx2.c — AVX2/FMA/F16C primitives: 8 f32 lanes, for CPUs without AVX-512.
 *
 * Same structure as the AVX-512 path with a smaller tile (2 tokens × 4 weight rows: 8 accumulators
 * plus 4 weight and 1 activation vector fit the 16 ymm registers without spilling). AVX2 has no
 * masked 16-bit loads, so a row tail (k not a multiple of 8) is copied into a zero-padded vector
 * first; f32 tails use vmaskmovps. bf16 widening is a zero-extend and shift, f16 uses vcvtph2ps.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 widen_half(__m128i h, cv_dtype dt) {
    if (dt == CV_DTYPE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

INLINE __m256 load_w(const void *w, int64_t off, cv_dtype dt) {
    if (dt == CV_DTYPE_F32) return _mm256_loadu_ps((const float *)w + off);
    return widen_half(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + off)), dt);
}

INLINE __m256i tail_mask(int64_t left) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), lane);
}

INLINE __m256 load_w_tail(const void *w, int64_t off, cv_dtype dt, int64_t left) {
    if (dt == CV_DTYPE_F32) return _mm256_maskload_ps((const float *)w + off, tail_mask(left));
    uint16_t pad[8] = {0};
    memcpy(pad, (const uint16_t *)w + off, (size_t)left * sizeof(uint16_t));
    return widen_half(_mm_loadu_si128((const __m128i *)pad), dt);
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE void tile_fixed(const void *w, int64_t ldw, cv_dtype dt, const float *x, int64_t ldx, float *y, int64_t ldy,
                       const int MR, const int NR, int64_t K) {
    __m256 acc[2][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[4];
        for (int j = 0; j < NR; j++) wv[j] = load_w(w, j * ldw + k, dt);
        for (int i = 0; i < MR; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        __m256 wv[4];
        for (int j = 0; j < NR; j++) wv[j] = load_w_tail(w, j * ldw + k, dt, K - k);
        for (int i = 0; i < MR; i++) {
            __m256 xv = _mm256_maskload_ps(x + i * ldx + k, tail_mask(K - k));
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) y[i * ldy + j] = hsum(acc[i][j]);
}

#define TILE_CASE(DT, MR, NR) \
    case (MR) * 8 + (NR): tile_fixed(w, ldw, DT, x, ldx, y, ldy, MR, NR, k); return;
#define TILE_ROW(DT, MR) TILE_CASE(DT, MR, 1) TILE_CASE(DT, MR, 2) TILE_CASE(DT, MR, 3) TILE_CASE(DT, MR, 4)
#define TILE_FN(fn, DT)                                                                                    \
    static void fn(const void *w, int64_t ldw, const float *x, int64_t ldx, float *y, int64_t ldy, int mr, \
                   int nr, int64_t k) {                                                                    \
        switch (mr * 8 + nr) {                                                                             \
            TILE_ROW(DT, 1) TILE_ROW(DT, 2)                                                                \
        default: __builtin_unreachable();                                                                  \
        }                                                                                                  \
    }

TILE_FN(tile_f32, CV_DTYPE_F32)
TILE_FN(tile_bf16, CV_DTYPE_BF16)
TILE_FN(tile_f16, CV_DTYPE_F16)

static void tile_avx2(const void *w, int64_t ldw, cv_dtype dtype, const float *x, int64_t ldx, float *y,
                      int64_t ldy, int mr, int nr, int64_t k) {
    if (dtype == CV_DTYPE_BF16) tile_bf16(w, ldw, x, ldx, y, ldy, mr, nr, k);
    else if (dtype == CV_DTYPE_F16) tile_f16(w, ldw, x, ldx, y, ldy, mr, nr, k);
    else tile_f32(w, ldw, x, ldx, y, ldy, mr, nr, k);
}

static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s0);
    }
    return hsum(_mm256_add_ps(s0, s1));
}

static void axpy_avx2(float *y, float a, const float *x, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
    }
}

static void scale_avx2(float *y, float a, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(av, _mm256_maskload_ps(y + i, m)));
    }
}

const cv_cpu_ops cv_cpu_ops_avx2 = {
    .name = "avx2",
    .mr_max = 2,
    .nr_max = 4,
    .tile = tile_avx2,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .scale = scale_avx2,
};
