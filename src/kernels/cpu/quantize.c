/*
 * quantize.c — int8 activations for I8_PANELS weights: msModelSlim's static and dynamic schemes,
 * alone and fused into the add+RMSNorm and the SwiGLU that produce the rows.
 *
 * The codes must be the ones PyTorch computes for the same f32 rows (the references are computed
 * that way, and one code flip at a .5 boundary moves a logit), so the arithmetic is spelled out in
 * f32 exactly as torch evaluates it: static `round(x / scale + offset)` — a true division, then the
 * add — and dynamic `s = max|x| / 127`, `round(x / s)`; round half to even (rintf in the default
 * rounding mode, as torch.round), then clamp to [-128, 127] (cpu_ops absmax and quantize_i8, the
 * same bits on every ISA). A dynamic row of zeros has codes 0 and scale 0 (it would divide 0 by 0).
 *
 * The fused forms compute each row's values in chunks of a small stack buffer and quantize them
 * there, so the f32 rows need not exist (the norm's output is still written when asked for); the
 * dynamic scheme needs the row's maximum first, so without a row to keep it computes the values
 * twice. Chunking changes nothing: the norm and SiLU are element-wise with the same per-element
 * operations as the unfused kernels (the ISA's rms_apply and silu_mul), so fused and unfused give
 * the same codes bit for bit. Rows split over the pool as the unfused kernels do.
 *
 * The same two fused forms also round to bf16 (cv_add_rmsnorm_bf16, cv_swiglu_bf16) for BF16_PANELS
 * weights in bf16 compute: the rows cv_round_bf16_rows would make from the f32 output, without the
 * pass that reads that output back (4-6 % of an AMX prefill).
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

enum { CHUNK = 256, PARALLEL_ELEMENTS = 1 << 14 };

/* Writes values [c0, c0 + n) of one row to dst. */
typedef void (*row_fill)(const void *ctx, float *dst, int64_t c0, int64_t n);

/* One row's codes (zero-padded to cv_act_i8_stride) and scale; its values are read from `row`, or
 * made chunk by chunk by fill when row is NULL. */
static void quantize_row(const cv_act_quant *q, const float *row, row_fill fill, const void *ctx, int64_t cols,
                         int8_t *codes, float *scale) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    float buf[CHUNK], div = q->scale, offset = q->offset;
    if (q->dynamic) {
        float amax = 0.0f;
        for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
            const int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
            const float *v = row ? row + c0 : buf;
            if (!row) fill(ctx, buf, c0, n);
            amax = fmaxf(amax, ops->absmax(v, n));
        }
        div = amax / 127.0f;
        offset = 0.0f;
    }
    *scale = q->dynamic ? div : 1.0f;
    if (q->dynamic && div == 0.0f) {
        memset(codes, 0, (size_t)cols);
    } else {
        for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
            const int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
            const float *v = row ? row + c0 : buf;
            if (!row) fill(ctx, buf, c0, n);
            ops->quantize_i8(codes + c0, v, n, div, offset);
        }
    }
    memset(codes + cols, 0, (size_t)(cv_act_i8_stride(cols) - cols));
}

static void check_scheme(const cv_act_quant *q) {
    assert(q->dynamic || (q->scale > 0.0f && isfinite(q->scale) && isfinite(q->offset)));
    (void)q;
}

typedef struct quantize_job {
    const cv_act_quant *q;
    const float *x;
    int64_t ldx, m, cols;
    int8_t *xq;
    float *scale;
} quantize_job;

static void quantize_rows(const void *arg, int64_t r0, int64_t r1) {
    const quantize_job *j = arg;
    const int64_t stride = cv_act_i8_stride(j->cols);
    for (int64_t r = r0; r < r1; r++)
        quantize_row(j->q, j->x + r * j->ldx, NULL, NULL, j->cols, j->xq + r * stride, j->scale + r);
}

/* On the pool from PARALLEL_ELEMENTS on: a linear whose producer did not quantize its input (the
 * o_proj after attention) has a whole prompt's rows here, and on one thread they took as long as the
 * 16-thread int8 GEMM that reads them (a 512-token Qwen3-0.6B prefill on AMX). */
void cv_quantize_rows(cv_threadpool *pool, const cv_act_quant *q, const float *x, int64_t ldx, int64_t m,
                      int64_t cols, int8_t *xq, float *scale) {
    check_scheme(q);
    quantize_job j = {q, x, ldx, m, cols, xq, scale};
    cv_threadpool_run_range(pool, quantize_rows, &j, m, m * cols >= PARALLEL_ELEMENTS);
}

/* One row rounded to bf16 (zero-padded to cv_act_bf16_stride), its values read or made as above. */
static void bf16_row(const float *row, row_fill fill, const void *ctx, int64_t cols, uint16_t *out) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    float buf[CHUNK];
    for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
        const int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
        if (!row) fill(ctx, buf, c0, n);
        ops->round_bf16(out + c0, row ? row + c0 : buf, n);
    }
    memset(out + cols, 0, (size_t)(cv_act_bf16_stride(cols) - cols) * sizeof *out);
}

/* Row r's activations for the next linear: int8 codes and scale when q, else bf16 into yb. */
static void act_row(const cv_act_quant *q, const float *row, row_fill fill, const void *ctx, int64_t cols,
                    int64_t r, int8_t *yq, float *yscale, uint16_t *yb) {
    if (q) quantize_row(q, row, fill, ctx, cols, yq + r * cv_act_i8_stride(cols), yscale + r);
    else bf16_row(row, fill, ctx, cols, yb + r * cv_act_bf16_stride(cols));
}

/* ---- fused into the add + RMSNorm ------------------------------------------------------------- */

typedef struct norm_quant_job {
    const cv_cpu_ops *ops;
    float *x, *y;
    const float *delta, *w;
    int64_t rows, dim;
    float eps;
    const cv_act_quant *q; /* NULL: bf16 into yb */
    int8_t *yq;
    float *yscale;
    uint16_t *yb;
} norm_quant_job;

typedef struct norm_row {
    const cv_cpu_ops *ops;
    const float *x, *w;
    float inv_rms;
} norm_row;

static void fill_norm(const void *ctx, float *dst, int64_t c0, int64_t n) {
    const norm_row *r = ctx;
    r->ops->rms_apply(dst, r->x + c0, r->w + c0, n, r->inv_rms);
}

static void norm_quant_rows(const void *arg, int64_t r0, int64_t r1) {
    const norm_quant_job *j = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *xr = j->x + r * j->dim;
        if (j->delta) {
            const float *dr = j->delta + r * j->dim;
            for (int64_t i = 0; i < j->dim; i++) xr[i] += dr[i];
        }
        const norm_row row = {j->ops, xr, j->w, cv_rms_inverse(j->ops, xr, j->dim, j->eps)};
        float *yr = j->y ? j->y + r * j->dim : NULL;
        if (yr) fill_norm(&row, yr, 0, j->dim);
        act_row(j->q, yr, fill_norm, &row, j->dim, r, j->yq, j->yscale, j->yb);
    }
}

void cv_add_rmsnorm_quant(cv_threadpool *pool, float *x, const float *delta, float *y, const float *w, int64_t rows,
                          int64_t dim, float eps, const cv_act_quant *q, int8_t *yq, float *yscale) {
    check_scheme(q);
    norm_quant_job j = {cv_cpu_ops_active(), x, y, delta, w, rows, dim, eps, q, yq, yscale, NULL};
    cv_threadpool_run_range(pool, norm_quant_rows, &j, rows, rows * dim >= PARALLEL_ELEMENTS);
}

void cv_add_rmsnorm_bf16(cv_threadpool *pool, float *x, const float *delta, float *y, const float *w, int64_t rows,
                         int64_t dim, float eps, uint16_t *yb) {
    norm_quant_job j = {cv_cpu_ops_active(), x, y, delta, w, rows, dim, eps, NULL, NULL, NULL, yb};
    cv_threadpool_run_range(pool, norm_quant_rows, &j, rows, rows * dim >= PARALLEL_ELEMENTS);
}

/* ---- fused into the SwiGLU -------------------------------------------------------------------- */

typedef struct swiglu_quant_job {
    const cv_cpu_ops *ops;
    const float *gu;
    int64_t rows, n, ld, up_offset;
    const cv_act_quant *q; /* NULL: bf16 into hb */
    int8_t *hq;
    float *hscale;
    uint16_t *hb;
} swiglu_quant_job;

typedef struct swiglu_row {
    const cv_cpu_ops *ops;
    const float *gate, *up;
} swiglu_row;

static void fill_swiglu(const void *ctx, float *dst, int64_t c0, int64_t n) {
    const swiglu_row *r = ctx;
    r->ops->silu_mul(dst, r->gate + c0, r->up + c0, n);
}

static void swiglu_quant_rows(const void *arg, int64_t r0, int64_t r1) {
    const swiglu_quant_job *j = arg;
    for (int64_t r = r0; r < r1; r++) {
        const swiglu_row row = {j->ops, j->gu + r * j->ld, j->gu + r * j->ld + j->up_offset};
        act_row(j->q, NULL, fill_swiglu, &row, j->n, r, j->hq, j->hscale, j->hb);
    }
}

void cv_swiglu_quant(cv_threadpool *pool, const float *gu, int64_t rows, int64_t n, int64_t ld, int64_t up_offset,
                     const cv_act_quant *q, int8_t *hq, float *hscale) {
    check_scheme(q);
    swiglu_quant_job j = {cv_cpu_ops_active(), gu, rows, n, ld, up_offset, q, hq, hscale, NULL};
    cv_threadpool_run_range(pool, swiglu_quant_rows, &j, rows, rows * n >= PARALLEL_ELEMENTS);
}

void cv_swiglu_bf16(cv_threadpool *pool, const float *gu, int64_t rows, int64_t n, int64_t ld, int64_t up_offset,
                    uint16_t *hb) {
    swiglu_quant_job j = {cv_cpu_ops_active(), gu, rows, n, ld, up_offset, NULL, NULL, NULL, hb};
    cv_threadpool_run_range(pool, swiglu_quant_rows, &j, rows, rows * n >= PARALLEL_ELEMENTS);
}
