/*
 * moe.c — router top-k and grouped execution of routed SwiGLU experts.
 *
 * A decode step of a 256-expert model touches ~8 experts per token but the same expert serves
 * every token routed to it, so tokens are grouped by expert (a counting sort of the (token, expert)
 * routes) and each selected expert runs one matmul over its gathered tokens: its weights cross the
 * memory bus once per call whatever the batch size.
 *
 * Threading: one pool dispatch for all experts' gate/up products and one for all down products,
 * rather than three matmul dispatches per expert. Every thread takes the same share of the weight
 * rows of *every* active expert (cv_split over the rows), so the load is even however unevenly the
 * tokens are routed, and each thread streams disjoint weight rows. A share is a contiguous row
 * slice, run through cv_matmul on the calling thread into a per-thread buffer and then copied out
 * (fused with the SiLU·up product, or with the weighted accumulation into y). In the down phase a
 * thread owns a slice of the hidden columns, so it adds into y without locks, expert by expert in
 * ascending id order — the order Hugging Face accumulates in.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/kernels.h"

enum { ROW_ALIGN = 16, SERIAL_FLOPS = 1 << 17 };

/* ---- routing ---------------------------------------------------------------------------------- */

void cv_moe_route(const float *logits, int64_t n_tokens, int32_t n_experts, int32_t top_k, bool renormalize,
                  int32_t *ids, float *weights) {
    assert(top_k > 0 && top_k <= n_experts);
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *l = logits + t * n_experts;
        int32_t *id = ids + t * top_k;
        float *w = weights + t * top_k;
        float mx = l[0];
        for (int32_t e = 1; e < n_experts; e++) mx = l[e] > mx ? l[e] : mx;
        float sum = 0.0f;
        for (int32_t e = 0; e < n_experts; e++) sum += expf(l[e] - mx);
        /* Insertion into a k-long descending list: k is small (8–10) and E is a few hundred. */
        int32_t n = 0;
        for (int32_t e = 0; e < n_experts; e++) {
            if (n == top_k && !(l[e] > l[id[n - 1]])) continue;
            int32_t i = n < top_k ? n++ : top_k - 1;
            while (i > 0 && l[e] > l[id[i - 1]]) {
                id[i] = id[i - 1];
                i--;
            }
            id[i] = e;
        }
        /* Softmax is monotonic, so the top logits are the top probabilities. */
        float picked = 0.0f;
        for (int32_t i = 0; i < top_k; i++) {
            w[i] = expf(l[id[i]] - mx) / sum;
            picked += w[i];
        }
        if (renormalize)
            for (int32_t i = 0; i < top_k; i++) w[i] /= picked;
    }
}

/* ---- workspace -------------------------------------------------------------------------------- */

typedef struct moe_layout {
    size_t offsets, fill, hs_offset, route_token, route_weight, xs, hs, thread_buf, per_thread, total; /* bytes */
} moe_layout;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Rows of the largest share cv_split hands a thread. */
static int64_t max_share(int64_t rows, int nt) {
    int64_t chunks = (rows + ROW_ALIGN - 1) / ROW_ALIGN;
    return ((chunks + nt - 1) / nt) * ROW_ALIGN;
}

static moe_layout layout_for(int nt, int64_t n_tokens, int32_t routes, int32_t hidden, int32_t max_inter,
                             int32_t n_experts) {
    moe_layout l;
    const size_t R = (size_t)n_tokens * (size_t)routes;
    /* An expert sees each token at most once, so it has at most n_tokens rows. */
    int64_t gate_up = 2 * max_share(max_inter, nt), down = max_share(hidden, nt);
    l.per_thread = align64((size_t)n_tokens * (size_t)(gate_up > down ? gate_up : down) * sizeof(float));
    size_t at = 0;
    l.offsets = at, at += align64((size_t)(n_experts + 1) * sizeof(int32_t));
    l.fill = at, at += align64((size_t)n_experts * sizeof(int32_t));
    l.hs_offset = at, at += align64((size_t)n_experts * sizeof(size_t));
    l.route_token = at, at += align64(R * sizeof(int32_t));
    l.route_weight = at, at += align64(R * sizeof(float));
    l.xs = at, at += align64(R * (size_t)hidden * sizeof(float));
    l.hs = at, at += align64(R * (size_t)max_inter * sizeof(float));
    l.thread_buf = at, at += (size_t)nt * l.per_thread;
    l.total = at;
    return l;
}

size_t cv_moe_workspace_bytes(const cv_threadpool *pool, int64_t n_tokens, int32_t routes, int32_t hidden,
                              int32_t max_inter, int32_t n_experts) {
    return layout_for(cv_threadpool_size(pool), n_tokens, routes, hidden, max_inter, n_experts).total;
}

/* ---- grouped execution ------------------------------------------------------------------------ */

typedef struct moe_job {
    const cv_moe_args *a;
    const int32_t *offsets;      /* [n_experts+1]: expert e owns sorted routes [offsets[e], offsets[e+1]) */
    const int32_t *route_token;  /* sorted route → token */
    const float *route_weight;   /* sorted route → weight */
    const float *xs;             /* [R][hidden] gathered inputs */
    float *hs;                   /* SwiGLU activations, expert e at hs + hs_offset[e] as [m_e][inter_e] */
    const size_t *hs_offset;
    char *thread_buf;
    size_t per_thread;
} moe_job;

static cv_matrix row_slice(const cv_matrix *w, int64_t begin, int64_t end) {
    size_t row_bytes = (size_t)w->cols * cv_dtype_size(w->dtype);
    return (cv_matrix){(const char *)w->data + (size_t)begin * row_bytes, w->dtype, end - begin, w->cols};
}

static void gate_up_task(void *arg, int ti, int nt) {
    const moe_job *job = arg;
    const cv_moe_args *a = job->a;
    float *buf = (float *)(job->thread_buf + (size_t)ti * job->per_thread);
    for (int32_t e = 0; e < a->n_experts; e++) {
        int64_t m = job->offsets[e + 1] - job->offsets[e];
        if (m == 0) continue;
        const cv_moe_expert *ex = &a->experts[e];
        const int64_t inter = ex->gate.rows;
        int64_t b, end;
        cv_split(inter, ROW_ALIGN, ti, nt, &b, &end);
        if (b >= end) continue;
        const int64_t w = end - b;
        float *g = buf, *u = buf + m * w;
        cv_matrix gs = row_slice(&ex->gate, b, end), us = row_slice(&ex->up, b, end);
        const float *x = job->xs + (size_t)job->offsets[e] * (size_t)a->hidden;
        cv_matmul(NULL, &gs, x, m, g);
        cv_matmul(NULL, &us, x, m, u);
        float *h = job->hs + job->hs_offset[e];
        for (int64_t i = 0; i < m; i++) cv_silu_mul(h + i * inter + b, g + i * w, u + i * w, w);
    }
}

static void down_task(void *arg, int ti, int nt) {
    const moe_job *job = arg;
    const cv_moe_args *a = job->a;
    float *buf = (float *)(job->thread_buf + (size_t)ti * job->per_thread);
    int64_t b, end;
    cv_split(a->hidden, ROW_ALIGN, ti, nt, &b, &end);
    if (b >= end) return;
    const int64_t w = end - b;
    for (int32_t e = 0; e < a->n_experts; e++) {
        int64_t m = job->offsets[e + 1] - job->offsets[e];
        if (m == 0) continue;
        cv_matrix ds = row_slice(&a->experts[e].down, b, end);
        cv_matmul(NULL, &ds, job->hs + job->hs_offset[e], m, buf);
        for (int64_t i = 0; i < m; i++) {
            int32_t r = job->offsets[e] + (int32_t)i;
            float *y = a->y + (size_t)job->route_token[r] * (size_t)a->hidden + b;
            const float weight = job->route_weight[r], *o = buf + i * w;
            for (int64_t j = 0; j < w; j++) y[j] += weight * o[j];
        }
    }
}

/* Counting sort of the routes by expert; gathers each route's input row. */
static void group_routes(const cv_moe_args *a, int32_t *offsets, int32_t *fill, int32_t *route_token,
                         float *route_weight, float *xs) {
    const int64_t R = a->n_tokens * a->routes;
    memset(offsets, 0, (size_t)(a->n_experts + 1) * sizeof *offsets);
    for (int64_t r = 0; r < R; r++) {
        assert(a->ids[r] >= 0 && a->ids[r] < a->n_experts);
        offsets[a->ids[r] + 1]++;
    }
    for (int32_t e = 0; e < a->n_experts; e++) offsets[e + 1] += offsets[e];
    memcpy(fill, offsets, (size_t)a->n_experts * sizeof *fill);
    const size_t row_bytes = (size_t)a->hidden * sizeof(float);
    for (int64_t t = 0; t < a->n_tokens; t++)
        for (int32_t k = 0; k < a->routes; k++) {
            int32_t slot = fill[a->ids[t * a->routes + k]]++;
            route_token[slot] = (int32_t)t;
            route_weight[slot] = a->weights[t * a->routes + k];
            memcpy(xs + (size_t)slot * (size_t)a->hidden, a->x + t * a->hidden, row_bytes);
        }
}

void cv_moe(cv_threadpool *pool, const cv_moe_args *a) {
    if (a->n_tokens <= 0) return;
    int32_t max_inter = 0;
    for (int32_t e = 0; e < a->n_experts; e++) {
        assert(a->experts[e].gate.cols == a->hidden && a->experts[e].down.rows == a->hidden);
        assert(a->experts[e].up.rows == a->experts[e].gate.rows && a->experts[e].down.cols == a->experts[e].gate.rows);
        if (a->experts[e].gate.rows > max_inter) max_inter = (int32_t)a->experts[e].gate.rows;
    }
    const int nt = cv_threadpool_size(pool);
    const moe_layout l = layout_for(nt, a->n_tokens, a->routes, a->hidden, max_inter, a->n_experts);
    char *ws = a->workspace;
    assert(((uintptr_t)ws & 63) == 0);
    int32_t *offsets = (int32_t *)(ws + l.offsets);
    group_routes(a, offsets, (int32_t *)(ws + l.fill), (int32_t *)(ws + l.route_token),
                 (float *)(ws + l.route_weight), (float *)(ws + l.xs));

    /* Expert e's activations start after those of the experts before it, each [m_e][inter_e]. */
    size_t *hs_offset = (size_t *)(ws + l.hs_offset), at = 0, work = 0;
    for (int32_t e = 0; e < a->n_experts; e++) {
        hs_offset[e] = at;
        size_t m = (size_t)(offsets[e + 1] - offsets[e]);
        at += m * (size_t)a->experts[e].gate.rows;
        work += m * (size_t)a->experts[e].gate.rows * (size_t)a->hidden * 3;
    }
    moe_job job = {.a = a, .offsets = offsets, .route_token = (int32_t *)(ws + l.route_token),
                   .route_weight = (float *)(ws + l.route_weight), .xs = (float *)(ws + l.xs),
                   .hs = (float *)(ws + l.hs), .hs_offset = hs_offset, .thread_buf = ws + l.thread_buf,
                   .per_thread = l.per_thread};
    if (nt > 1 && work >= SERIAL_FLOPS) {
        cv_threadpool_run(pool, gate_up_task, &job);
        cv_threadpool_run(pool, down_task, &job);
        return;
    }
    /* Waking the pool would cost more than the products. One thread's share is then every row; the
     * nt per-thread buffers together are at least that large, since nt shares cover all rows. */
    job.per_thread = layout_for(1, a->n_tokens, a->routes, a->hidden, max_inter, a->n_experts).per_thread;
    assert(job.per_thread <= l.per_thread * (size_t)nt);
    gate_up_task(&job, 0, 1);
    down_task(&job, 0, 1);
}
