/*
 * avx2/rows.c — the row-major micro-kernels (F32, BF16, F16 weights straight from the checkpoint).
 *
 * A smaller tile than AVX-512's (2 tokens × 4 weight rows: 8 accumulators plus 4 weight and 1
 * activation vector fit the 16 ymm registers without spilling). A row tail (k not a multiple of 8)
 * of 16-bit weights is copied into a zero-padded vector first; f32 tails use vmaskmovps. bf16
 * widening is a zero-extend and shift, f16 uses vcvtph2ps; each output is reduced across lanes at
 * the end. The dtype is a compile-time constant of each kernel (one per format entry).
 */
#include <string.h>

#include "kernels/cpu/avx2/vec.h"

INLINE __m256 widen_half(__m128i h, cv_dtype dt) {
    if (dt == CV_DTYPE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

INLINE __m256 load_w(const void *w, int64_t off, cv_dtype dt) {
    if (dt == CV_DTYPE_F32) return _mm256_loadu_ps((const float *)w + off);
    return widen_half(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + off)), dt);
}

INLINE __m256 load_w_tail(const void *w, int64_t off, cv_dtype dt, int64_t left) {
    if (dt == CV_DTYPE_F32) return _mm256_maskload_ps((const float *)w + off, tail_mask(left));
    uint16_t pad[8] = {0};
    memcpy(pad, (const uint16_t *)w + off, (size_t)left * sizeof(uint16_t));
    return widen_half(_mm_loadu_si128((const __m128i *)pad), dt);
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

const cv_gemm_kernel cv_avx2_rows_f32 = {.rows = tile_f32, .mr = 2, .nr = 4};
const cv_gemm_kernel cv_avx2_rows_bf16 = {.rows = tile_bf16, .mr = 2, .nr = 4};
const cv_gemm_kernel cv_avx2_rows_f16 = {.rows = tile_f16, .mr = 2, .nr = 4};
