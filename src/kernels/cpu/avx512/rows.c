/*
 * avx512/rows.c — the row-major micro-kernels (F32, BF16, F16 weights straight from the checkpoint).
 *
 * Up to 4 tokens × 4 weight rows of accumulators, each weight vector feeding up to four FMAs; bf16
 * widens by a zero-extend and a shift, f16 through vcvtph2ps, and each output is reduced across
 * lanes at the end. The dtype is a compile-time constant of each kernel (one per format entry), so
 * the k loop has no branches.
 */
#include <immintrin.h>

#include "kernels/cpu/formats.h"

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

const cv_gemm_kernel cv_avx512_rows_f32 = {.rows = tile_f32, .mr = 4, .nr = 4};
const cv_gemm_kernel cv_avx512_rows_bf16 = {.rows = tile_bf16, .mr = 4, .nr = 4};
const cv_gemm_kernel cv_avx512_rows_f16 = {.rows = tile_f16, .mr = 4, .nr = 4};
