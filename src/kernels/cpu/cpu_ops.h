/*
 * cpu_ops.h — the per-instruction-set primitives behind kernels.h (internal to src/kernels).
 *
 * Only the loops that dominate run time differ per ISA: the matmul micro-kernels, the f32
 * dot/axpy used by attention, and the vector exp behind softmax and SiLU. Everything above them
 * (blocking, threading, softmax bookkeeping) is written once in plain C and calls through the
 * active table, so the paths cannot drift apart in anything but the arithmetic order.
 *
 * Two matmul micro-kernels exist. `tile` reads weights row-major straight from the checkpoint
 * (f32/bf16/f16) and reduces each output across the vector lanes at the end. `panel` reads bf16
 * weights repacked once at load into 16-row panels (CV_PANEL_ROWS, see kernels.h): one vector
 * load brings 16 outputs × 2 k, so outputs accumulate lane-wise with the activations broadcast,
 * with no horizontal reduction and a single register tile for any K.
 */
#ifndef CV_CPU_OPS_H
#define CV_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

/*
 * One micro-tile of a matmul: y[i·ldy + j] = Σ_k x[i·ldx + k] · w[j·ldw + k] for i < mr, j < nr,
 * k < K, with w of element type `dtype` (f32/bf16/f16). mr ≤ mr_max, nr ≤ nr_max.
 */
typedef void (*cv_tile_fn)(const void *w, int64_t ldw, cv_dtype dtype, const float *x, int64_t ldx,
                           float *y, int64_t ldy, int mr, int nr, int64_t k);

/*
 * One micro-tile over packed panels: for token i < mr and output c < n_out (n_out ≤ 16·np),
 *   y[i·ldy + c] (+)= Σ_{p < pairs} w(c, 2p)·x_i[2p] + w(c, 2p+1)·x_i[2p+1]
 * where panel c/16 starts at w + (c/16)·panel_stride (uint16 elements, already offset to the first
 * pair of this k block) and holds pair p of its 16 rows at [p·32, p·32 + 32).
 * Activations are f32 rows x + i·ldx (offset to element 2·pair0); when `odd_tail`, the block's last
 * pair has only its first element in x (K odd) and the second is never read.
 * accumulate: add to y instead of overwriting (k blocks after the first).
 */
typedef struct cv_panel_tile {
    const uint16_t *w;
    int64_t panel_stride;
    int64_t pairs;
    const float *x;
    int64_t ldx;
    bool odd_tail, accumulate;
    float *y;
    int64_t ldy;
    int mr, np, n_out;
} cv_panel_tile;

typedef void (*cv_panel_fn)(const cv_panel_tile *t);

typedef struct cv_cpu_ops {
    const char *name;
    int mr_max, nr_max;         /* largest `tile`: tokens × weight rows */
    cv_tile_fn tile;
    int panel_mr_max, panel_np_max; /* largest `panel` tile: tokens × panels */
    cv_panel_fn panel;
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
    /* out[i] = silu(gate[i]) · up[i]. */
    void (*silu_mul)(float *out, const float *gate, const float *up, int64_t n);
    /* Σ x[i]² accumulated in f32 over 16 (or 8) lanes. */
    float (*sum_sq)(const float *x, int64_t n);
} cv_cpu_ops;

extern const cv_cpu_ops cv_cpu_ops_scalar;
extern const cv_cpu_ops cv_cpu_ops_avx2;
extern const cv_cpu_ops cv_cpu_ops_avx512;

const cv_cpu_ops *cv_cpu_ops_active(void);

#endif
