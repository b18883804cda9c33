/*
 * cpu_ops.h — the per-instruction-set primitives behind kernels.h (internal to src/kernels).
 *
 * Only the loops that dominate run time differ per ISA: the matmul micro-tile and the f32 dot/axpy
 * used by attention and norms. Everything above them (blocking, threading, softmax bookkeeping) is
 * written once in plain C and calls through the active table, so the three paths cannot drift
 * apart in anything but the arithmetic order.
 */
#ifndef CV_CPU_OPS_H
#define CV_CPU_OPS_H

#include <stdint.h>

#include "base/dtype.h"

/*
 * One micro-tile of a matmul: y[i·ldy + j] = Σ_k x[i·ldx + k] · w[j·ldw + k] for i < mr, j < nr,
 * k < K, with w of element type `dtype` (f32/bf16/f16). mr ≤ mr_max, nr ≤ nr_max.
 */
typedef void (*cv_tile_fn)(const void *w, int64_t ldw, cv_dtype dtype, const float *x, int64_t ldx,
                           float *y, int64_t ldy, int mr, int nr, int64_t k);

typedef struct cv_cpu_ops {
    const char *name;
    int mr_max, nr_max;         /* largest tile: tokens × weight rows */
    cv_tile_fn tile;
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a·x */
    void (*scale)(float *y, float a, int64_t n);                /* y *= a */
} cv_cpu_ops;

extern const cv_cpu_ops cv_cpu_ops_scalar;
extern const cv_cpu_ops cv_cpu_ops_avx2;
extern const cv_cpu_ops cv_cpu_ops_avx512;

const cv_cpu_ops *cv_cpu_ops_active(void);

#endif
