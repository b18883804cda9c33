/*
 * avx2/ops.c — AVX2/FMA/F16C primitives: 8 f32 lanes, for CPUs without AVX-512.
 *
 * Same structure as the AVX-512 path with a smaller tile (2 tokens × 4 weight rows: 8 accumulators
 * plus 4 weight and 1 activation vector fit the 16 ymm registers without spilling). AVX2 has no
 * masked 16-bit loads, so a row tail (k not a multiple of 8) is copied into a zero-padded vector
 * first; f32 tails use vmaskmovps. bf16 widening is a zero-extend and shift, f16 uses vcvtph2ps.
 *
 * Packed panels (cpu_ops.h) are read as two 32-byte halves of 8 outputs × 2 k; the halves widen by
 * a shift and an AND. Up to 4 tokens × 1 panel: 8 accumulators, 4 widened weights, 2 broadcasts.
 */
#include <immintrin.h>
#include <string.h>

#include <assert.h>

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

/* ---- packed panels ----------------------------------------------------------------------------- */

INLINE void store_cols(float *y, __m256 v, int n) {
    if (n >= 8) _mm256_storeu_ps(y, v);
    else if (n > 0) _mm256_maskstore_ps(y, tail_mask(n), v);
}

INLINE __m256 load_cols(const float *y, int n) {
    if (n >= 8) return _mm256_loadu_ps(y);
    return n > 0 ? _mm256_maskload_ps(y, tail_mask(n)) : _mm256_setzero_ps();
}

INLINE void panel_fixed(const cv_panel_tile *t, const int MR) {
    __m256 acc[4][2];
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++)
            acc[i][h] = t->accumulate ? load_cols(t->y + i * t->ldy + 8 * h, t->n_out - 8 * h) : _mm256_setzero_ps();
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    const float *x = t->x;
    for (int64_t p = 0; p < t->pairs; p++) {
        const bool last_half = t->odd_tail && p == t->pairs - 1; /* x[2p+1] is past the row */
        __m256 lo[2], hi[2];
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(t->w + p * 32 + h * 16));
            lo[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            hi[h] = _mm256_castsi256_ps(_mm256_and_si256(v, top));
        }
        for (int i = 0; i < MR; i++) {
            __m256 x0 = _mm256_set1_ps(x[i * t->ldx + 2 * p]);
            __m256 x1 = _mm256_set1_ps(last_half ? 0.0f : x[i * t->ldx + 2 * p + 1]);
            for (int h = 0; h < 2; h++) acc[i][h] = _mm256_fmadd_ps(hi[h], x1, _mm256_fmadd_ps(lo[h], x0, acc[i][h]));
        }
    }
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++) store_cols(t->y + i * t->ldy + 8 * h, acc[i][h], t->n_out - 8 * h);
}

static void panel_avx2(const cv_panel_tile *t) {
    assert(t->np == 1);
    switch (t->mr) {
    case 1: panel_fixed(t, 1); return;
    case 2: panel_fixed(t, 2); return;
    case 3: panel_fixed(t, 3); return;
    case 4: panel_fixed(t, 4); return;
    default: __builtin_unreachable();
    }
}

/* ---- attention tiles --------------------------------------------------------------------------- */

/* MR rows × up to 16 columns (2 vectors, masked at the edge); see avx512/ops.c. */
INLINE void gemm_block(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int n, int k,
                       bool accumulate, const int MR) {
    __m256 acc[4][2];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 2; v++) acc[i][v] = accumulate ? load_cols(c + i * ldc + 8 * v, n - 8 * v) : _mm256_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m256 bv[2];
        for (int v = 0; v < 2; v++) bv[v] = load_cols(b[p] + 8 * v, n - 8 * v);
        for (int i = 0; i < MR; i++) {
            __m256 av = _mm256_set1_ps(a[i * lda + p]);
            for (int v = 0; v < 2; v++) acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 2; v++) store_cols(c + i * ldc + 8 * v, acc[i][v], n - 8 * v);
}

static void gemm_rows_avx2(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int m, int n,
                           int k, bool accumulate) {
    const float *shifted[k > 0 ? k : 1];
    for (int j = 0; j < n; j += 16) {
        for (int p = 0; p < k; p++) shifted[p] = b[p] + j;
        int nj = n - j < 16 ? n - j : 16;
        int i = 0;
        for (; i + 4 <= m; i += 4) gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, shifted, nj, k, accumulate, 4);
        switch (m - i) {
        case 3: gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, shifted, nj, k, accumulate, 3); break;
        case 2: gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, shifted, nj, k, accumulate, 2); break;
        case 1: gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, shifted, nj, k, accumulate, 1); break;
        default: break;
        }
    }
}

/* ---- element-wise ------------------------------------------------------------------------------ */

/* exp as in avx512/ops.c: 2^n · p(r) with a degree-6 polynomial; 2^n built in the exponent bits. */
INLINE __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* n in [-126, 127]: split in two halves so 2^n never needs a denormal or infinite factor */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i h1 = _mm256_srai_epi32(ni, 1), h2 = _mm256_sub_epi32(ni, h1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static void transpose_rows_avx2(float *dst, int64_t ld, const float *const *rows, int n_rows, int n_cols) {
    for (int r = 0; r < n_rows; r++)
        for (int c = 0; c < n_cols; c++) dst[(int64_t)c * ld + r] = rows[r][c];
}

static float exp_sum_avx2(float *y, const float *x, float shift, int64_t n) {
    __m256 s = _mm256_setzero_ps(), sh = _mm256_set1_ps(shift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
        _mm256_storeu_ps(y + i, e);
        s = _mm256_add_ps(s, e);
    }
    float total = hsum(s);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), sh)), _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(y + i, m, e);
        total += hsum(e);
    }
    return total;
}

INLINE __m256 silu_mul8(__m256 g, __m256 u) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void silu_mul_avx2(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(out + i, m, silu_mul8(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
    }
}

static float sum_sq_avx2(const float *x, int64_t n) { return dot_avx2(x, x, n); }

const cv_cpu_ops cv_cpu_ops_avx2 = {
    .name = "avx2",
    .mr_max = 2,
    .nr_max = 4,
    .tile = tile_avx2,
    .panel_mr_max = 4,
    .panel_np_max = 1,
    .panel = panel_avx2,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .scale = scale_avx2,
    .gemm_rows = gemm_rows_avx2,
    .transpose_rows = transpose_rows_avx2,
    .exp_sum = exp_sum_avx2,
    .silu_mul = silu_mul_avx2,
    .sum_sq = sum_sq_avx2,
};
