/*
 * matmul.c — y = x · Wᵀ for f32 activations and f32/bf16/f16 weights, blocked and threaded.
 *
 * Decode (one token) is a GEMV bound by memory bandwidth: each thread streams a contiguous slice of
 * weight rows once, four rows at a time so that several streams are in flight. Prefill reuses each
 * 4-row weight block for every token of a 64-token block while the block sits in L1, so the weights
 * cross the memory bus about once per 64 tokens; the tokens of that block (≤ 64·K floats) stay in
 * L2 across weight blocks. The register tile itself is the ISA's (cpu_ops.h).
 *
 * Work is split over weight rows in multiples of 16 (whole cache lines of y per thread, no false
 * sharing); when there are too few rows to go around but many tokens, it is split over tokens
 * instead. Tiny products run on the caller: waking the pool would cost more than the work.
 */
#include <assert.h>

#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

enum { TOKEN_BLOCK = 64, ROW_ALIGN = 16, SERIAL_FLOPS = 1 << 15 };

typedef struct matmul_job {
    const cv_matrix *w;
    const float *x;
    int64_t m;
    float *y;
    const cv_cpu_ops *ops;
    bool split_tokens;
} matmul_job;

bool cv_matrix_dtype_supported(cv_dtype t) {
    return t == CV_DTYPE_F32 || t == CV_DTYPE_BF16 || t == CV_DTYPE_F16;
}

static void matmul_block(const matmul_job *job, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
    const cv_matrix *w = job->w;
    const cv_cpu_ops *ops = job->ops;
    const int64_t k = w->cols, n = w->rows;
    const size_t esize = cv_dtype_size(w->dtype);
    for (int64_t mb = m0; mb < m1; mb += TOKEN_BLOCK) {
        int64_t me = mb + TOKEN_BLOCK < m1 ? mb + TOKEN_BLOCK : m1;
        for (int64_t r = n0; r < n1; r += ops->nr_max) {
            int nr = (int)(n1 - r < ops->nr_max ? n1 - r : ops->nr_max);
            const void *wr = (const char *)w->data + (size_t)r * (size_t)k * esize;
            for (int64_t i = mb; i < me; i += ops->mr_max) {
                int mr = (int)(me - i < ops->mr_max ? me - i : ops->mr_max);
                ops->tile(wr, k, w->dtype, job->x + i * k, k, job->y + i * n + r, n, mr, nr, k);
            }
        }
    }
}

static void matmul_task(void *arg, int ti, int nt) {
    const matmul_job *job = arg;
    int64_t b, e;
    if (job->split_tokens) {
        cv_split(job->m, job->ops->mr_max, ti, nt, &b, &e);
        if (b < e) matmul_block(job, 0, job->w->rows, b, e);
    } else {
        cv_split(job->w->rows, ROW_ALIGN, ti, nt, &b, &e);
        if (b < e) matmul_block(job, b, e, 0, job->m);
    }
}

void cv_matmul(cv_threadpool *pool, const cv_matrix *w, const float *x, int64_t m, float *y) {
    assert(cv_matrix_dtype_supported(w->dtype));
    if (m <= 0 || w->rows <= 0) return;
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    int nt = cv_threadpool_size(pool);
    matmul_job job = {.w = w, .x = x, .m = m, .y = y, .ops = ops};
    job.split_tokens = w->rows < (int64_t)ROW_ALIGN * 4 * nt && m >= (int64_t)ops->mr_max * nt;
    if (nt == 1 || m * w->rows * w->cols < SERIAL_FLOPS) {
        matmul_block(&job, 0, w->rows, 0, m);
        return;
    }
    cv_threadpool_run(pool, matmul_task, &job);
}

void cv_embed(const cv_matrix *table, const int32_t *ids, int64_t n, float *out) {
    assert(cv_matrix_dtype_supported(table->dtype));
    const size_t row_bytes = (size_t)table->cols * cv_dtype_size(table->dtype);
    for (int64_t i = 0; i < n; i++) {
        assert(ids[i] >= 0 && ids[i] < table->rows);
        const void *row = (const char *)table->data + (size_t)ids[i] * row_bytes;
        cv_convert_to_f32(out + i * table->cols, row, table->dtype, (size_t)table->cols);
    }
}
