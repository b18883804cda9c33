/*
 * avx2/ops.c — AVX2/FMA/F16C primitives: 8 f32 lanes, for CPUs without AVX-512 (cpu_ops.h). The
 * matmul micro-kernels of this ISA are in rows.c and panels_*.c beside this file.
 */
#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/avx2/vec.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows_c.h"

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

/* ---- attention tiles --------------------------------------------------------------------------- */

/* MR rows × up to 16 columns from col (2 vectors, masked at the edge); see avx512/ops.c. */
INLINE void gemm_block(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int col, int n,
                       int k, bool accumulate, const int MR) {
    __m256 acc[4][2];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 2; v++) acc[i][v] = accumulate ? load_cols(c + i * ldc + 8 * v, n - 8 * v) : _mm256_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m256 bv[2];
        for (int v = 0; v < 2; v++) bv[v] = load_cols(b[p] + col + 8 * v, n - 8 * v);
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
    for (int j = 0; j < n; j += 16) {
        int nj = n - j < 16 ? n - j : 16;
        int i = 0;
        for (; i + 4 <= m; i += 4) gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, b, j, nj, k, accumulate, 4);
        switch (m - i) {
        case 3: gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, b, j, nj, k, accumulate, 3); break;
        case 2: gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, b, j, nj, k, accumulate, 2); break;
        case 1: gemm_block(c + i * ldc + j, ldc, a + i * lda, lda, b, j, nj, k, accumulate, 1); break;
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

static void copy_rows_avx2(void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int rows, int64_t bytes) {
    for (int r = 0; r < rows; r++) {
        const char *from = (const char *)src + r * ld_src;
        char *to = (char *)dst + r * ld_dst;
        int64_t i = 0;
        for (; i + 32 <= bytes; i += 32) _mm256_storeu_si256((__m256i *)(to + i), _mm256_loadu_si256((const __m256i *)(from + i)));
        if (i < bytes) memcpy(to + i, from + i, (size_t)(bytes - i));
    }
}

static void widen_pairs_avx2(float *lo, float *hi, const uint32_t *w, int64_t n) {
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(w + i));
        _mm256_storeu_si256((__m256i *)(lo + i), _mm256_slli_epi32(v, 16));
        if (hi) _mm256_storeu_si256((__m256i *)(hi + i), _mm256_and_si256(v, top));
    }
    for (; i < n; i++) {
        lo[i] = cv_bf16_to_f32((uint16_t)w[i]);
        if (hi) hi[i] = cv_bf16_to_f32((uint16_t)(w[i] >> 16));
    }
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

/* vmaxps(x, m) is x > m ? x : m per lane, the scalar rule */
static float max_avx2(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(x[0]);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float r = m[0];
    for (int l = 1; l < 8; l++) r = m[l] > r ? m[l] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

const cv_cpu_ops cv_cpu_ops_avx2 = {
    .name = "avx2",
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .scale = scale_avx2,
    .gemm_rows = gemm_rows_avx2,
    .transpose_rows = transpose_rows_avx2,
    .copy_rows = copy_rows_avx2,
    .widen_pairs = widen_pairs_avx2,
    .exp_sum = exp_sum_avx2,
    .silu_mul = silu_mul_avx2,
    .sum_sq = sum_sq_avx2,
    .max = max_avx2,
    .absmax = cv_rows_absmax,
    .quantize_i8 = cv_rows_quantize_i8,
    .rms_apply = cv_rows_rms_apply,
    .rotate_half = cv_rows_rotate_half,
    .round_bf16 = cv_rows_round_bf16,
};
