/*
 * avx512/ops.c — AVX-512 primitives: 16 f32 lanes, masked tails (cpu_ops.h). The matmul
 * micro-kernels of this ISA are in rows.c and panels_*.c beside this file.
 *
 * Tile shapes are compile-time constants of always-inlined code: each shape becomes straight-line
 * register code with no branches in the inner loop.
 */
#include <immintrin.h>

#include <math.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/formats.h"
#include "kernels/cpu/rows_c.h"

#define INLINE static inline __attribute__((always_inline))

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

/* ---- attention tiles --------------------------------------------------------------------------- */

/* What the attention tile products share: the masks of up to 64 columns as 4 vectors (the last ones
 * partial or empty), and the MR × 4 accumulators loaded from c (accumulate) or zeroed, and stored. */
INLINE void column_masks(int n, __mmask16 m[4]) {
    for (int v = 0; v < 4; v++) m[v] = n - 16 * v >= 16 ? (__mmask16)0xffff : n - 16 * v > 0 ? tail_mask(n - 16 * v) : 0;
}

INLINE void acc_load(__m512 acc[4][4], const float *c, int64_t ldc, const __mmask16 m[4], bool accumulate, const int MR) {
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 4; v++)
            acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(m[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
}

INLINE void acc_store(float *c, int64_t ldc, __m512 acc[4][4], const __mmask16 m[4], const int MR) {
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m[v], acc[i][v]);
}

/* The tile product over row blocks of 4 and column blocks of 64: BLOCK(c, ldc, a, lda, col, n, k,
 * accumulate, MR, operands of b...) for every block, MR a constant in each call. */
#define TILE_ROWS(BLOCK, c, ldc, a, lda, m, n, k, accumulate, ...)                                          \
    for (int j_ = 0; j_ < (n); j_ += 64) {                                                                   \
        const int nj_ = (n) - j_ < 64 ? (n) - j_ : 64;                                                       \
        int i_ = 0;                                                                                          \
        for (; i_ + 4 <= (m); i_ += 4)                                                                       \
            BLOCK((c) + i_ * (ldc) + j_, ldc, (a) + i_ * (lda), lda, j_, nj_, k, accumulate, 4, __VA_ARGS__); \
        switch ((m) - i_) {                                                                                  \
        case 3: BLOCK((c) + i_ * (ldc) + j_, ldc, (a) + i_ * (lda), lda, j_, nj_, k, accumulate, 3, __VA_ARGS__); break; \
        case 2: BLOCK((c) + i_ * (ldc) + j_, ldc, (a) + i_ * (lda), lda, j_, nj_, k, accumulate, 2, __VA_ARGS__); break; \
        case 1: BLOCK((c) + i_ * (ldc) + j_, ldc, (a) + i_ * (lda), lda, j_, nj_, k, accumulate, 1, __VA_ARGS__); break; \
        default: break;                                                                                      \
        }                                                                                                    \
    }

/* MR rows × up to 64 columns from col (4 vectors, the last ones masked): the row of a broadcasts
 * against four vectors of b's row per step, so each b load feeds MR FMAs. */
INLINE void gemm_block(float *c, int64_t ldc, const float *a, int64_t lda, int col, int n, int k, bool accumulate,
                       const int MR, const float *const *b) {
    __mmask16 m[4];
    column_masks(n, m);
    __m512 acc[4][4];
    acc_load(acc, c, ldc, m, accumulate, MR);
    for (int p = 0; p < k; p++) {
        __m512 bv[4];
        for (int v = 0; v < 4; v++) bv[v] = _mm512_maskz_loadu_ps(m[v], b[p] + col + 16 * v);
        for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(a[i * lda + p]);
            for (int v = 0; v < 4; v++) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
    acc_store(c, ldc, acc, m, MR);
}

static void gemm_rows_avx512(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int m, int n,
                             int k, bool accumulate) {
    TILE_ROWS(gemm_block, c, ldc, a, lda, m, n, k, accumulate, b)
}

/* gemm_block on bf16 pairs with vdpbf16ps: MR rows × up to 64 columns, each pair of a broadcast
 * against four vectors of pairs of b: of its row p (b row pointers), or of the panels of 16 columns
 * (PANELS: b[j / 16] + p·ldp holds row p's columns j..j+15 of its panel; a constant in each caller). */
#define BF16_DOT __attribute__((target("avx512bf16")))
BF16_DOT INLINE void dot_block(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int col, int n, int k,
                               bool accumulate, const int MR, const uint32_t *const *b, int64_t ldp,
                               const bool PANELS) {
    __mmask16 m[4];
    column_masks(n, m);
    __m512 acc[4][4];
    acc_load(acc, c, ldc, m, accumulate, MR);
    const uint32_t *panel[4]; /* columns past n: no panel, a masked load of the first one's address */
    for (int v = 0; v < 4; v++) panel[v] = PANELS ? b[col / 16 + (m[v] ? v : 0)] : NULL;
    for (int p = 0; p < k; p++) {
        __m512bh bv[4];
        for (int v = 0; v < 4; v++)
            bv[v] = (__m512bh)_mm512_maskz_loadu_epi32(m[v], PANELS ? panel[v] + p * ldp : b[p] + col + 16 * v);
        for (int i = 0; i < MR; i++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * lda + p]);
            for (int v = 0; v < 4; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
        }
    }
    acc_store(c, ldc, acc, m, MR);
}

BF16_DOT static void gemm_rows_dot_avx512(float *c, int64_t ldc, const uint32_t *a, int64_t lda,
                                          const uint32_t *const *b, int m, int n, int k, bool accumulate) {
    TILE_ROWS(dot_block, c, ldc, a, lda, m, n, k, accumulate, b, 0, false)
}

BF16_DOT static void gemm_panels_dot_avx512(float *c, int64_t ldc, const uint32_t *a, int64_t lda,
                                            const uint32_t *const *panels, int64_t ldp, int m, int n, int k,
                                            bool accumulate) {
    TILE_ROWS(dot_block, c, ldc, a, lda, m, n, k, accumulate, panels, ldp, true)
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
            for (int i = 0; i < 16; i++) v[i] = i < nr ? _mm512_maskz_loadu_ps(tail_mask(nc), rows[r0 + i] + c0) : _mm512_setzero_ps();
            transpose16(v);
            for (int c = 0; c < nc; c++) _mm512_mask_storeu_ps(dst + (int64_t)(c0 + c) * ld + r0, tail_mask(nr), v[c]);
        }
    }
}

static void copy_rows_avx512(void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int rows, int64_t bytes) {
    for (int r = 0; r < rows; r++) {
        const char *from = (const char *)src + r * ld_src;
        char *to = (char *)dst + r * ld_dst;
        for (int64_t i = 0; i < bytes; i += 64) {
            const __mmask64 m = bytes - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (bytes - i)) - 1;
            _mm512_mask_storeu_epi8(to + i, m, _mm512_maskz_loadu_epi8(m, from + i));
        }
    }
}

static void widen_pairs_avx512(float *lo, float *hi, const uint32_t *w, int64_t n) {
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        const __m512i v = _mm512_maskz_loadu_epi32(m, w + i);
        _mm512_mask_storeu_epi32(lo + i, m, _mm512_slli_epi32(v, 16));
        if (hi) _mm512_mask_storeu_epi32(hi + i, m, _mm512_and_si512(v, top));
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

/* One vector of exp_sum: exp(x − shift) of the lanes under m, added into *s (zero elsewhere). */
INLINE __m512 exp_step(__m512 *s, const float *x, __m512 shift, __mmask16 m) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x), shift));
    *s = _mm512_add_ps(*s, _mm512_maskz_mov_ps(m, e));
    return e;
}

static float exp_sum_avx512(float *y, const float *x, float shift, int64_t n) {
    __m512 s = _mm512_setzero_ps(), sh = _mm512_set1_ps(shift);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, exp_step(&s, x + i, sh, m));
    }
    return _mm512_reduce_add_ps(s);
}

/* silu(g) · u on the lanes under m (zero elsewhere). */
INLINE __m512 silu_mul16(const float *gate, const float *up, __mmask16 m) {
    const __m512 g = _mm512_maskz_loadu_ps(m, gate), u = _mm512_maskz_loadu_ps(m, up);
    const __m512 sig = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    return _mm512_mul_ps(sig, u);
}

static void silu_mul_avx512(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        _mm512_mask_storeu_ps(out + i, m, silu_mul16(gate + i, up + i, m));
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

/* vmaxps(x, m) is x > m ? x : m per lane, the scalar rule; a tail's missing lanes keep m */
static float max_avx512(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(x[0]);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, x + i), m);
    }
    float lanes[16], r;
    _mm512_storeu_ps(lanes, m);
    r = lanes[0];
    for (int l = 1; l < 16; l++) r = lanes[l] > r ? lanes[l] : r;
    return r;
}

/* vmaxps(|x|, m) returns m where |x| is NaN, as fmaxf passes NaNs over; the maximum of absolute
 * values does not depend on the order they meet in. */
static float absmax_avx512(const float *x, int64_t n) {
    const __m512 abs = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        m = _mm512_max_ps(_mm512_and_ps(_mm512_maskz_loadu_ps(k, x + i), abs), m);
    }
    return _mm512_reduce_max_ps(m);
}

/* The scalar steps per lane: vdivps, vaddps, round to nearest even, clamp, convert (exact: the
 * value is an integer in range), narrow. */
static void quantize_i8_avx512(int8_t *codes, const float *x, int64_t n, float div, float offset) {
    const __m512 d = _mm512_set1_ps(div), o = _mm512_set1_ps(offset);
    const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 v = _mm512_add_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), d), o);
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        _mm512_mask_cvtepi32_storeu_epi8(codes + i, k, _mm512_cvtps_epi32(v));
    }
}

/* cv_f32_to_bf16 on 16 lanes: NaN → its top half with the quiet bit set; otherwise + 0x7fff + the
 * lowest kept bit, then the top half. */
INLINE void round16_int(uint16_t *out, __mmask16 m, __m512i u) {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
    _mm512_mask_cvtepi32_storeu_epi16(out, m, r);
}

/* With AVX512-BF16, vcvtneps2bf16 gives the same bits in one instruction for every input but f32
 * subnormals, which it flushes to zero: a vector holding one takes the integer route. Rounding ran at
 * 4-6 % of an AMX prefill with the integer route alone. */
BF16_DOT INLINE void round16_cvt(uint16_t *out, __mmask16 m, __m512 v) {
    const __m512i exp = _mm512_set1_epi32(0x7f800000), mant = _mm512_set1_epi32(0x007fffff);
    const __m512i u = _mm512_castps_si512(v);
    if (_mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(u, exp), u, mant)) round16_int(out, m, u);
    else _mm256_mask_storeu_epi16(out, m, (__m256i)_mm512_cvtneps_pbh(v));
}

BF16_DOT static void round_bf16_cvt(uint16_t *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        round16_cvt(out + i, m, _mm512_maskz_loadu_ps(m, x + i));
    }
}

/* exp_sum with the values rounded to bf16 on the way out (only where the CPU has AVX512-BF16, as
 * every caller of the bf16 dot products): the sum is exp_sum's, of the f32 values. */
BF16_DOT static float exp_sum_bf16_avx512(uint16_t *y, const float *x, float shift, int64_t n) {
    __m512 s = _mm512_setzero_ps(), sh = _mm512_set1_ps(shift);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        round16_cvt(y + i, m, exp_step(&s, x + i, sh, m));
    }
    return _mm512_reduce_add_ps(s);
}

static void round_bf16_avx512(uint16_t *out, const float *x, int64_t n) {
    if (cv_cpu_avx512_bf16()) {
        round_bf16_cvt(out, x, n);
        return;
    }
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        round16_int(out + i, m, _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* silu_mul then round_bf16 over rows (only where the CPU has AVX512-BF16, as every bf16-input
 * linear): one call for many short rows, whose exps then overlap. */
BF16_DOT static void silu_mul_bf16_avx512(uint16_t *out, int64_t ld_out, const float *gate, const float *up,
                                          int64_t ld_in, int rows, int64_t n) {
    for (int r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
            round16_cvt(out + r * ld_out + i, m, silu_mul16(gate + r * ld_in + i, up + r * ld_in + i, m));
        }
}

const cv_cpu_ops cv_cpu_ops_avx512 = {
    .name = "avx512",
    .dot = dot_avx512,
    .axpy = axpy_avx512,
    .scale = scale_avx512,
    .gemm_rows = gemm_rows_avx512,
    .transpose_rows = transpose_rows_avx512,
    .copy_rows = copy_rows_avx512,
    .widen_pairs = widen_pairs_avx512,
    .gemm_rows_dot = gemm_rows_dot_avx512,
    .gemm_panels_dot = gemm_panels_dot_avx512,
    .exp_sum = exp_sum_avx512,
    .exp_sum_bf16 = exp_sum_bf16_avx512,
    .silu_mul = silu_mul_avx512,
    .silu_mul_bf16 = silu_mul_bf16_avx512,
    .sum_sq = sum_sq_avx512,
    .max = max_avx512,
    .absmax = absmax_avx512,
    .quantize_i8 = quantize_i8_avx512,
    .rms_apply = cv_rows_rms_apply,
    .rotate_half = cv_rows_rotate_half,
    .round_bf16 = round_bf16_avx512,
};
