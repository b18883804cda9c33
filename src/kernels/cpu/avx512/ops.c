/*
 * avx512/ops.c — AVX-512 primitives: 16 f32 lanes, masked tails, f32/bf16/f16 weights.
 *
 * Row-major tile (weights straight from the checkpoint): up to 4 tokens × 4 weight rows of
 * accumulators, each weight vector feeding up to four FMAs; bf16 widens by a zero-extend and a
 * shift, f16 through vcvtph2ps, and each output is reduced across lanes at the end.
 *
 * Panel tile (bf16 weights packed at load, cpu_ops.h): one 64-byte load is 16 outputs × 2 k; the
 * two k halves widen exactly with one shift and one AND (bf16 is the top half of an f32), then
 * each token's x[k] and x[k+1] are broadcast into two FMAs per panel. Up to 6 tokens × 3 panels:
 * 18 accumulators + 6 widened weights + 2 broadcasts ≤ 32 zmm. Per pair that is 2·np widening ops
 * against 2·mr·np FMAs, so at 6 × 3 the FMA ports are busy ~86 % of the time, with no horizontal
 * sums at all. Every output is one FMA chain in k order whatever the tile shape, so a token's
 * result does not depend on the tokens batched with it (the engine's batch invariance); a lone
 * decode token is then FMA-latency bound at ~24 B/cycle of weights, still well above what memory
 * delivers to one core.
 *
 * Why not vdpbf16ps: on the Xeon this was tuned on it issues at half the rate of vfmadd231ps, so
 * with 2 multiply-adds per lane it delivers the same 64 flops/cycle as f32 FMA at best — measured
 * 83 vs 167 GFLOP/s per core peak — while also needing activations rounded to bf16 (~2e-3 logit
 * error instead of f32's ~1e-6). f32 FMA on widened weights is both faster and exact.
 *
 * Tile shapes and dtypes are compile-time constants of always-inlined code: each (mr, np) becomes
 * straight-line register code with no branches in the k loop.
 */
#include <immintrin.h>

#include <math.h>

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

/* ---- packed panels ----------------------------------------------------------------------------- */

/* Decode streams panels from memory: a software prefetch 1 KiB ahead in each panel stream (on top
 * of the hardware prefetchers) measured +12-15 % GEMV bandwidth on the lm_head shape (23 → 26-27
 * GB/s, 2 threads). Prefetches past a panel's end only touch the next panel, and never fault. */
enum { PREFETCH_PAIRS = 16 };

INLINE __mmask16 cols_mask(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* Loads or zeroes the accumulators of a tile; MR·NP vectors, the last panel possibly partial. */
#define PANEL_ACC_INIT(acc, t, MR, NP)                                                                         \
    for (int i = 0; i < MR; i++)                                                                               \
        for (int j = 0; j < NP; j++)                                                                           \
            acc[i][j] = (t)->accumulate ? _mm512_maskz_loadu_ps(cols_mask((t)->n_out - 16 * j),                \
                                                                (t)->y + i * (t)->ldy + 16 * j)                \
                                        : _mm512_setzero_ps();

#define PANEL_ACC_STORE(acc, t, MR, NP)                                                                        \
    for (int i = 0; i < MR; i++)                                                                               \
        for (int j = 0; j < NP; j++)                                                                           \
            _mm512_mask_storeu_ps((t)->y + i * (t)->ldy + 16 * j, cols_mask((t)->n_out - 16 * j), acc[i][j]);

INLINE void panel_f32_fixed(const cv_panel_tile *t, const int MR, const int NP) {
    __m512 acc[6][3]; /* fixed bounds (not VLAs) so the compiler keeps them in registers */
    PANEL_ACC_INIT(acc, t, MR, NP)
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    const float *x = t->x;
    const int64_t full = t->pairs - (t->odd_tail ? 1 : 0);
    for (int64_t p = 0; p < full; p++) {
        __m512 lo[3], hi[3];
        for (int j = 0; j < NP; j++) {
            if (MR <= 2) _mm_prefetch((const char *)(t->w + j * t->panel_stride + (p + PREFETCH_PAIRS) * 32), _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512(t->w + j * t->panel_stride + p * 32);
            lo[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            hi[j] = _mm512_castsi512_ps(_mm512_and_si512(v, top));
        }
        for (int i = 0; i < MR; i++) {
            __m512 x0 = _mm512_set1_ps(x[i * t->ldx + 2 * p]), x1 = _mm512_set1_ps(x[i * t->ldx + 2 * p + 1]);
            for (int j = 0; j < NP; j++) acc[i][j] = _mm512_fmadd_ps(hi[j], x1, _mm512_fmadd_ps(lo[j], x0, acc[i][j]));
        }
    }
    if (t->odd_tail) {
        for (int j = 0; j < NP; j++) {
            __m512i v = _mm512_loadu_si512(t->w + j * t->panel_stride + full * 32);
            __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            for (int i = 0; i < MR; i++)
                acc[i][j] = _mm512_fmadd_ps(lo, _mm512_set1_ps(x[i * t->ldx + 2 * full]), acc[i][j]);
        }
    }
    PANEL_ACC_STORE(acc, t, MR, NP)
}

#define PANEL_CASE(KIND, MR, NP) \
    case (MR) * 4 + (NP): panel_##KIND##_fixed(t, MR, NP); return;
#define PANEL_ROW(KIND, MR) PANEL_CASE(KIND, MR, 1) PANEL_CASE(KIND, MR, 2) PANEL_CASE(KIND, MR, 3)

static void panel_f32(const cv_panel_tile *t) {
    switch (t->mr * 4 + t->np) {
        PANEL_ROW(f32, 1) PANEL_ROW(f32, 2) PANEL_ROW(f32, 3) PANEL_ROW(f32, 4) PANEL_ROW(f32, 5) PANEL_ROW(f32, 6)
    default: __builtin_unreachable();
    }
}

static void panel_avx512(const cv_panel_tile *t) { panel_f32(t); }

/* ---- attention tiles --------------------------------------------------------------------------- */

/* MR rows × up to 64 columns (4 vectors, the last ones masked): the row of a broadcasts against
 * four vectors of b's row per step, so each b load feeds MR FMAs. */
INLINE void gemm_block(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int n, int k,
                       bool accumulate, const int MR) {
    __mmask16 m[4];
    for (int v = 0; v < 4; v++) m[v] = n - 16 * v >= 16 ? (__mmask16)0xffff : n - 16 * v > 0 ? tail_mask(n - 16 * v) : 0;
    __m512 acc[4][4];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 4; v++)
            acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(m[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m512 bv[4];
        for (int v = 0; v < 4; v++) bv[v] = _mm512_maskz_loadu_ps(m[v], b[p] + 16 * v);
        for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(a[i * lda + p]);
            for (int v = 0; v < 4; v++) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m[v], acc[i][v]);
}

static void gemm_rows_avx512(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int m, int n,
                             int k, bool accumulate) {
    const float *shifted[k > 0 ? k : 1];
    for (int j = 0; j < n; j += 64) {
        for (int p = 0; p < k; p++) shifted[p] = b[p] + j;
        int nj = n - j < 64 ? n - j : 64;
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

/* 16 rows × 16 columns in registers (r[i] = row i in, column i out): 32-bit, 64-bit and two 128-bit
 * interleave stages, 64 shuffles for 256 elements instead of 256 scattered scalar stores. */
INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

static void transpose_rows_avx512(float *dst, int64_t ld, const float *const *rows, int n_rows, int n_cols) {
    for (int r0 = 0; r0 < n_rows; r0 += 16) {
        const int nr = n_rows - r0 < 16 ? n_rows - r0 : 16;
        for (int c0 = 0; c0 < n_cols; c0 += 16) {
            const int nc = n_cols - c0 < 16 ? n_cols - c0 : 16;
            __m512 v[16];
            for (int i = 0; i < 16; i++)
                v[i] = i < nr ? _mm512_maskz_loadu_ps(tail_mask(nc), rows[r0 + i] + c0) : _mm512_setzero_ps();
            transpose16(v);
            for (int c = 0; c < nc; c++) _mm512_mask_storeu_ps(dst + (int64_t)(c0 + c) * ld + r0, tail_mask(nr), v[c]);
        }
    }
}

/* ---- element-wise ------------------------------------------------------------------------------ */

/* exp(x) for x ≤ 0-ish inputs of softmax and SiLU: 2^n · p(r), r = x − n·ln2 in [−ln2/2, ln2/2],
 * p a degree-6 Taylor polynomial (error < 1.5 ulp on that range); below −87.3 the result is 0. */
INLINE __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static float exp_sum_avx512(float *y, const float *x, float shift, int64_t n) {
    __m512 s = _mm512_setzero_ps(), sh = _mm512_set1_ps(shift);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), sh));
        _mm512_mask_storeu_ps(y + i, m, e);
        s = _mm512_add_ps(s, _mm512_maskz_mov_ps(m, e));
    }
    return _mm512_reduce_add_ps(s);
}

static void silu_mul_avx512(float *out, const float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        __m512 sig = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(sig, u));
    }
}

static float sum_sq_avx512(const float *x, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        s0 = _mm512_fmadd_ps(a, a, s0);
        s1 = _mm512_fmadd_ps(b, b, s1);
    }
    for (; i < n; i += 16) {
        __m512 a = _mm512_maskz_loadu_ps(n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i), x + i);
        s0 = _mm512_fmadd_ps(a, a, s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

const cv_cpu_ops cv_cpu_ops_avx512 = {
    .name = "avx512",
    .mr_max = 4,
    .nr_max = 4,
    .tile = tile_avx512,
    .panel_mr_max = 6,
    .panel_np_max = 3,
    .panel = panel_avx512,
    .dot = dot_avx512,
    .axpy = axpy_avx512,
    .scale = scale_avx512,
    .gemm_rows = gemm_rows_avx512,
    .transpose_rows = transpose_rows_avx512,
    .exp_sum = exp_sum_avx512,
    .silu_mul = silu_mul_avx512,
    .sum_sq = sum_sq_avx512,
};
