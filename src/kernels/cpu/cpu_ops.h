/*
 * cpu_ops.h — the per-instruction-set primitives behind kernels.h (internal to src/kernels).
 *
 * Only the loops that dominate run time differ per ISA: the f32 dot/axpy used by attention and
 * the delta rule, the attention tiles and the copies that feed them, and the vector exp behind softmax
 * and SiLU. Everything above them (softmax bookkeeping, threading) is written once in plain C and
 * calls through the active table, so the paths cannot drift apart in anything but the arithmetic
 * order. The matmul micro-kernels are per weight format as well as per ISA and live in the format
 * traits table (formats.h). Each ISA's table is in its folder: ref/ops.c, avx2/ops.c, avx512/ops.c.
 */
#ifndef CV_CPU_OPS_H
#define CV_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_cpu_ops {
    const char *name;
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a·x */
    void (*scale)(float *y, float a, int64_t n);                /* y *= a */
    /* y[i] = exp(x[i] − shift) (|rel err| < 2e-7 on the range softmax uses); returns Σ y. */
    float (*exp_sum)(float *y, const float *x, float shift, int64_t n);
    /* Small row-major GEMM for attention tiles: c[i·ldc + j] (+)= Σ_p a[i·lda + p] · b[p][j] for
     * i < m, j < n, p < k; b given as row pointers (K/V rows live in scattered cache slots). */
    void (*gemm_rows)(float *c, int64_t ldc, const float *a, int64_t lda, const float *const *b, int m, int n, int k,
                      bool accumulate);
    /* dst[c·ld + r] = rows[r][c] for r < n_rows, c < n_cols (K tile → [head_dim][positions]). */
    void (*transpose_rows)(float *dst, int64_t ld, const float *const *rows, int n_rows, int n_cols);
    /* `rows` rows of `bytes` bytes from src to dst, rows ld_src and ld_dst bytes apart (a bf16 KV
     * cache's words into attention's tiles: runs of 64 bytes to a few KiB, too short for memcpy's
     * call). */
    void (*copy_rows)(void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int rows, int64_t bytes);
    /* lo[i] and hi[i] (hi may be NULL) the low and high bf16 halves of w[i], widened (exact): a bf16
     * cache's words for the f32 tile products. */
    void (*widen_pairs)(float *lo, float *hi, const uint32_t *w, int64_t n);
    /* gemm_rows on bf16 pairs (32-bit words, the even element in the low half): c[i·ldc + j] (+)=
     * Σ_p a[i·lda + p] ·· b[p][j], where ·· is the bf16 dot product of AVX512-BF16 (vdpbf16ps: per
     * lane acc + odd·odd, then + even·even, each rounded to nearest even, subnormals flushed). NULL
     * on an ISA without it. */
    void (*gemm_rows_dot)(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *const *b, int m,
                          int n, int k, bool accumulate);
    /* The same products with b as panels of 16 columns: b[j][p] = panels[j / 16][p·ldp + j % 16],
     * panels[] holding ⌈n/16⌉ pointers (a bf16 cache's K words in place, 16 positions of a block
     * per panel). NULL with gemm_rows_dot. */
    void (*gemm_panels_dot)(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *const *panels,
                            int64_t ldp, int m, int n, int k, bool accumulate);
    /* exp_sum with y rounded to bf16 (as round_bf16 rounds): softmax numerators for the bf16 dot
     * products, the sum still of the f32 values in exp_sum's order. NULL with gemm_rows_dot. */
    float (*exp_sum_bf16)(uint16_t *y, const float *x, float shift, int64_t n);
    /* y[i] = w[i] · (x[i] · inv_rms): RMSNorm's scaling, after cv_rms_inverse. */
    void (*rms_apply)(float *y, const float *x, const float *w, int64_t n, float inv_rms);
    /* Rotate-half RoPE of one head's first 2·half elements: y[i] = x[i]·c[i] − x[i+half]·s[i] and
     * y[i+half] = x[i+half]·c[i] + x[i]·s[i], each product rounded alone (no fused multiply-add);
     * y may be x. */
    void (*rotate_half)(float *y, const float *x, const float *c, const float *s, int64_t half);
    /* out[i] = silu(gate[i]) · up[i]. */
    void (*silu_mul)(float *out, const float *gate, const float *up, int64_t n);
    /* silu_mul rounded as round_bf16 rounds, over `rows` rows of n (rows ld_in apart in gate and up,
     * ld_out in out): the fused SwiGLU's epilogue. Only where the CPU has AVX512-BF16; NULL: none. */
    void (*silu_mul_bf16)(uint16_t *out, int64_t ld_out, const float *gate, const float *up, int64_t ld_in, int rows,
                          int64_t n);
    /* Σ x[i]² accumulated in f32 over 16 (or 8) lanes. */
    float (*sum_sq)(const float *x, int64_t n);
    /* The largest of x[0..n), n ≥ 1, as m = x[i] > m ? x[i] : m from m = x[0] reads it (NaNs after
     * the first element are passed over); lanes may meet in any order, which can only pick a
     * different zero among equal ±0 maxima. */
    float (*max)(const float *x, int64_t n);
    /* int8 activations (quantize.c): max |x[i]| (0 for n = 0; NaNs passed over, as fmaxf does),
     * and codes[i] = clamp(rint(x[i] / div + offset), −128, 127) in f32, a true division — the same
     * bits on every ISA. */
    float (*absmax)(const float *x, int64_t n);
    void (*quantize_i8)(int8_t *codes, const float *x, int64_t n, float div, float offset);
    /* out[i] = cv_f32_to_bf16(x[i]): nearest even, NaN kept (quieted), subnormals rounded like any
     * other value — the same bits on every ISA. */
    void (*round_bf16)(uint16_t *out, const float *x, int64_t n);
} cv_cpu_ops;

extern const cv_cpu_ops cv_cpu_ops_scalar;
extern const cv_cpu_ops cv_cpu_ops_avx2;
extern const cv_cpu_ops cv_cpu_ops_avx512;

const cv_cpu_ops *cv_cpu_ops_active(void);

/* Asks for every cache line of `bytes` from p (attention's KV rows and words, ahead of their copy). */
static inline void cv_prefetch_bytes(const void *p, size_t bytes) {
    const uintptr_t first = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + bytes;
    for (uintptr_t at = first; at < end; at += 64) __builtin_prefetch((const void *)at, 0, 3);
}

/* RMSNorm of a row in the two steps every norm kernel shares (elementwise.c): 1/sqrt(mean(x²) + eps),
 * then ops->rms_apply for any slice of the row. */
float cv_rms_inverse(const cv_cpu_ops *ops, const float *x, int64_t dim, float eps);

#endif
