/*
 * elementwise.c — the row-wise and element-wise kernels: RMSNorm (alone and fused with the residual
 * add), SwiGLU, residual add, the low-rank update of LoRA and softmax.
 *
 * These touch each activation once. For one decode token that is a few microseconds and they run
 * on the caller; for a prefill batch (512 tokens × 3072 SwiGLU inputs, each needing an exp) they
 * would cost several percent of the forward pass single-threaded, so the fused forms split rows
 * over the pool and the exp-heavy inner loops go through the ISA's vector exp (cpu_ops.h).
 * The operation order follows Hugging Face's f32 code (normalise, then scale by the gain) so that
 * rounding matches as closely as the summation order allows; the fused norm + int8 quantization
 * (quantize.c) uses the same two steps (cv_rms_inverse, then the ISA's rms_apply), so it normalises to the
 * same bits.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

/* Below this many elements a row-wise op runs on the caller: a pool wake costs more. */
enum { PARALLEL_ELEMENTS = 1 << 14 };

float cv_rms_inverse(const cv_cpu_ops *ops, const float *x, int64_t dim, float eps) {
    float mean_sq = ops->sum_sq(x, dim) / (float)dim;
    return 1.0f / sqrtf(mean_sq + eps);
}

static void rmsnorm_row(const cv_cpu_ops *ops, float *y, const float *x, const float *w, int64_t dim, float eps) {
    ops->rms_apply(y, x, w, dim, cv_rms_inverse(ops, x, dim, eps));
}

void cv_rmsnorm(float *y, const float *x, const float *w, int64_t rows, int64_t dim, float eps) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    for (int64_t r = 0; r < rows; r++) rmsnorm_row(ops, y + r * dim, x + r * dim, w, dim, eps);
}

typedef struct add_norm_job {
    const cv_cpu_ops *ops;
    float *x, *y;
    const float *delta, *w;
    int64_t rows, dim;
    float eps;
} add_norm_job;

static void add_norm_rows(const void *arg, int64_t r0, int64_t r1) {
    const add_norm_job *j = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *xr = j->x + r * j->dim;
        if (j->delta) {
            const float *dr = j->delta + r * j->dim;
            for (int64_t i = 0; i < j->dim; i++) xr[i] += dr[i];
        }
        rmsnorm_row(j->ops, j->y + r * j->dim, xr, j->w, j->dim, j->eps);
    }
}

void cv_add_rmsnorm(cv_threadpool *pool, float *x, const float *delta, float *y, const float *w, int64_t rows,
                    int64_t dim, float eps) {
    add_norm_job j = {cv_cpu_ops_active(), x, y, delta, w, rows, dim, eps};
    cv_threadpool_run_range(pool, add_norm_rows, &j, rows, rows * dim >= PARALLEL_ELEMENTS);
}

void cv_silu_mul(float *out, const float *gate, const float *up, int64_t n) {
    cv_cpu_ops_active()->silu_mul(out, gate, up, n);
}

typedef struct swiglu_job {
    const cv_cpu_ops *ops;
    float *out;
    const float *gu;
    int64_t rows, n, ld, up_offset;
} swiglu_job;

static void swiglu_rows(const void *arg, int64_t r0, int64_t r1) {
    const swiglu_job *j = arg;
    for (int64_t r = r0; r < r1; r++)
        j->ops->silu_mul(j->out + r * j->n, j->gu + r * j->ld, j->gu + r * j->ld + j->up_offset, j->n);
}

void cv_swiglu(cv_threadpool *pool, float *out, const float *gu, int64_t rows, int64_t n, int64_t ld,
               int64_t up_offset) {
    swiglu_job j = {cv_cpu_ops_active(), out, gu, rows, n, ld, up_offset};
    /* In place, output row r lands on input row ≈ r·n/ld, which another thread may not have read
     * yet; only a single in-order pass is safe then (n ≤ ld keeps each write behind its reads). */
    cv_threadpool_run_range(pool, swiglu_rows, &j, rows, rows * n >= PARALLEL_ELEMENTS && out != gu);
}

void cv_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

typedef struct lowrank_job {
    const cv_cpu_ops *ops;
    float *y;
    int64_t ldy, m, rank, n;
    const int64_t *rows;
    const float *h, *bt;
} lowrank_job;

/* Column blocks a share of the pool takes; the tile GEMM walks 64 columns of Bᵀ's rank rows at a time
 * over every token, so they stay in L1 while the tokens use them. */
enum { LOWRANK_COLS = 256 };

/* Columns [LOWRANK_COLS·b0, LOWRANK_COLS·b1): every run of consecutive rows through the tile GEMM of
 * attention (gemm_rows, accumulating), which keeps each output in a register over the rank steps:
 * as rank axpys each step loaded and stored every output again, and a 128-token prefill chunk spent
 * longer on its LoRA updates than it should (37 GFLOP/s on 2 threads). Its FMA chain per element
 * is the axpys' own, so the bits are those of y += h_r·bt_r in r order, whatever the runs. */
static void lowrank_cols(const void *arg, int64_t b0, int64_t b1) {
    const lowrank_job *j = arg;
    const int64_t c0 = b0 * LOWRANK_COLS, c1 = b1 * LOWRANK_COLS < j->n ? b1 * LOWRANK_COLS : j->n;
    const float *b[j->rank];
    for (int64_t r = 0; r < j->rank; r++) b[r] = j->bt + r * j->n + c0;
    for (int64_t i = 0, run; i < j->m; i += run) {
        for (run = 1; i + run < j->m && j->rows[i + run] == j->rows[i] + run; run++) {}
        j->ops->gemm_rows(j->y + j->rows[i] * j->ldy + c0, j->ldy, j->h + i * j->rank, j->rank, b, (int)run,
                          (int)(c1 - c0), (int)j->rank, true);
    }
}

void cv_lowrank_add(cv_threadpool *pool, float *y, int64_t ldy, const int64_t *rows, const float *h, int64_t m,
                    int64_t rank, const float *bt, int64_t n) {
    assert(rank > 0 && rank <= 1024 && n <= INT32_MAX);
    const lowrank_job j = {cv_cpu_ops_active(), y, ldy, m, rank, n, rows, h, bt};
    const int64_t blocks = (n + LOWRANK_COLS - 1) / LOWRANK_COLS;
    cv_threadpool_run_range(pool, lowrank_cols, &j, blocks, m * rank * n >= 4 * PARALLEL_ELEMENTS);
}

void cv_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    float sum = ops->exp_sum(x, x, mx, n);
    ops->scale(x, 1.0f / sum, n);
}

