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
 * rows of *every* active expert (cv_split over the rows, in whole panels), so the load is even
 * however unevenly the tokens are routed, and each thread streams disjoint weight rows. A share is
 * a contiguous row range, run through cv_linear_rows on the calling thread into a per-thread buffer
 * and then copied out (fused with the SiLU·up product, or with the weighted accumulation into y).
 * In the down phase a thread owns a slice of the hidden columns, so it adds into y without locks,
 * expert by expert in ascending id order — the order Hugging Face accumulates in.
 *
 * Experts whose weights read int8 need their inputs whole before a product can start, so each
 * quantization is a pass of its own over the gathered rows, split by rows over the pool: before the
 * gate/up phase (each expert's rows with its gate's quantization, and again with up's where that
 * differs) and between the phases (the SwiGLU rows with down's). In bf16 compute (bf16_input),
 * the weights whose format reads bf16 rows (cv_wformat_bf16_input: BF16_PANELS, FP8_PANELS without
 * AMX) get them rounded in the same passes: the gathered rows of experts whose gate or up reads
 * them, and the SwiGLU rows of those whose down does. Other float experts skip both passes.
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
    size_t offsets, fill, hs_offset, hq_offset, hb_offset, route_token, route_weight, xs, hs, xq, x_scale, uq, u_scale,
        hq, h_scale, xb, hb;
    size_t thread_buf, per_thread, total; /* bytes */
} moe_layout;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Rows of the largest share cv_split hands a thread. */
static int64_t max_share(int64_t rows, int nt) {
    int64_t chunks = (rows + ROW_ALIGN - 1) / ROW_ALIGN;
    return ((chunks + nt - 1) / nt) * ROW_ALIGN;
}

static moe_layout layout_for(int nt, int64_t n_tokens, int32_t routes, int32_t hidden, int32_t max_inter,
                             int32_t n_experts, bool int8, bool bf16) {
    moe_layout l;
    const size_t R = (size_t)n_tokens * (size_t)routes;
    /* An expert sees each token at most once, so it has at most n_tokens rows. */
    int64_t gate_up = 2 * max_share(max_inter, nt), down = max_share(hidden, nt);
    l.per_thread = align64((size_t)n_tokens * (size_t)(gate_up > down ? gate_up : down) * sizeof(float));
    const size_t q = int8 ? 1 : 0, b = bf16 ? 1 : 0; /* the int8 and bf16 buffers exist only where read */
    size_t at = 0;
    l.offsets = at, at += align64((size_t)(n_experts + 1) * sizeof(int32_t));
    l.fill = at, at += align64((size_t)n_experts * sizeof(int32_t));
    l.hs_offset = at, at += align64((size_t)n_experts * sizeof(size_t));
    l.hq_offset = at, at += align64((size_t)n_experts * sizeof(size_t));
    l.hb_offset = at, at += b * align64((size_t)n_experts * sizeof(size_t));
    l.route_token = at, at += align64(R * sizeof(int32_t));
    l.route_weight = at, at += align64(R * sizeof(float));
    l.xs = at, at += align64(R * (size_t)hidden * sizeof(float));
    l.hs = at, at += align64(R * (size_t)max_inter * sizeof(float));
    l.xq = at, at += q * align64(R * (size_t)cv_act_i8_stride(hidden));
    l.x_scale = at, at += q * align64(R * sizeof(float));
    l.uq = at, at += q * align64(R * (size_t)cv_act_i8_stride(hidden));
    l.u_scale = at, at += q * align64(R * sizeof(float));
    l.hq = at, at += q * align64(R * (size_t)cv_act_i8_stride(max_inter));
    l.h_scale = at, at += q * align64(R * sizeof(float));
    l.xb = at, at += b * align64(R * (size_t)cv_act_bf16_stride(hidden) * sizeof(uint16_t));
    l.hb = at, at += b * align64(R * (size_t)cv_act_bf16_stride(max_inter) * sizeof(uint16_t));
    l.thread_buf = at, at += (size_t)nt * l.per_thread;
    l.total = at;
    return l;
}

size_t cv_moe_workspace_bytes(const cv_threadpool *pool, int64_t n_tokens, int32_t routes, int32_t hidden,
                              int32_t max_inter, int32_t n_experts, bool int8, bool bf16) {
    return layout_for(cv_threadpool_size(pool), n_tokens, routes, hidden, max_inter, n_experts, int8, bf16).total;
}

/* ---- grouped execution ------------------------------------------------------------------------ */

typedef struct moe_job {
    const cv_moe_args *a;
    const int32_t *offsets;      /* [n_experts+1]: expert e owns sorted routes [offsets[e], offsets[e+1]) */
    const int32_t *route_token;  /* sorted route → token */
    const float *route_weight;   /* sorted route → weight */
    const float *xs;             /* [R][hidden] gathered inputs */
    int8_t *xq, *uq;             /* [R][cv_act_i8_stride(hidden)] their codes for gate, and for up where
                                  * its quantization differs (int8 experts) */
    float *x_scale, *u_scale;    /* [R] */
    float *hs;                   /* SwiGLU activations, expert e at hs + hs_offset[e] as [m_e][inter_e] */
    const size_t *hs_offset;
    int8_t *hq;                  /* their codes, expert e at hq + hq_offset[e], rows cv_act_i8_stride(inter_e) apart */
    const size_t *hq_offset;
    float *h_scale;              /* [R] */
    uint16_t *xb;                /* [R][cv_act_bf16_stride(hidden)] the gathered inputs rounded (bf16 experts) */
    uint16_t *hb;                /* the SwiGLU rows rounded, expert e at hb + hb_offset[e], rows
                                  * cv_act_bf16_stride(inter_e) apart */
    const size_t *hb_offset;
    char *thread_buf;
    size_t per_thread;
} moe_job;

static bool int8_x(const cv_moe_expert *ex) { return cv_wformat_int8_input(ex->gate->format); }
static bool int8_h(const cv_moe_expert *ex) { return cv_wformat_int8_input(ex->down->format); }
/* In bf16 compute, BF16_PANELS weights (and FP8_PANELS ones without AMX) read bf16 rows. */
static bool reads_bf16(const cv_moe_args *a, const cv_weight *w) {
    return a->bf16_input && cv_wformat_bf16_input(w->format);
}
static bool bf16_x(const cv_moe_args *a, const cv_moe_expert *ex) {
    return reads_bf16(a, ex->gate) || reads_bf16(a, ex->up);
}
static bool bf16_h(const cv_moe_args *a, const cv_moe_expert *ex) { return reads_bf16(a, ex->down); }
/* up reads codes of its own quantization. */
static bool own_up_codes(const cv_moe_expert *ex) {
    return int8_x(ex) && !cv_act_quant_same(&ex->gate_quant, &ex->up_quant);
}

/* The conversion passes: sorted routes [r0, r1) of every expert that reads int8 codes or bf16 rows
 * there. */
static void convert_x_rows(const void *arg, int64_t r0, int64_t r1) {
    const moe_job *job = arg;
    const cv_moe_args *a = job->a;
    const int64_t stride = cv_act_i8_stride(a->hidden);
    for (int32_t e = 0; e < a->n_experts; e++) {
        const int64_t b = r0 > job->offsets[e] ? r0 : job->offsets[e];
        const int64_t end = r1 < job->offsets[e + 1] ? r1 : job->offsets[e + 1];
        const cv_moe_expert *ex = &a->experts[e];
        if (b >= end) continue;
        const float *x = job->xs + b * a->hidden;
        if (bf16_x(a, ex))
            cv_round_bf16_rows(NULL, x, a->hidden, end - b, a->hidden, job->xb + b * cv_act_bf16_stride(a->hidden));
        if (!int8_x(ex)) continue;
        cv_quantize_rows(NULL, &ex->gate_quant, x, a->hidden, end - b, a->hidden, job->xq + b * stride, job->x_scale + b);
        if (own_up_codes(ex))
            cv_quantize_rows(NULL, &ex->up_quant, x, a->hidden, end - b, a->hidden, job->uq + b * stride, job->u_scale + b);
    }
}

static void convert_h_rows(const void *arg, int64_t r0, int64_t r1) {
    const moe_job *job = arg;
    const cv_moe_args *a = job->a;
    for (int32_t e = 0; e < a->n_experts; e++) {
        const int64_t first = job->offsets[e];
        const int64_t b = r0 > first ? r0 : first, end = r1 < job->offsets[e + 1] ? r1 : job->offsets[e + 1];
        const cv_moe_expert *ex = &a->experts[e];
        if (b >= end) continue;
        const float *h = job->hs + job->hs_offset[e] + (b - first) * ex->inter;
        if (int8_h(ex))
            cv_quantize_rows(NULL, &ex->down_quant, h, ex->inter, end - b, ex->inter,
                             job->hq + job->hq_offset[e] + (b - first) * cv_act_i8_stride(ex->inter), job->h_scale + b);
        else if (bf16_h(a, ex))
            cv_round_bf16_rows(NULL, h, ex->inter, end - b, ex->inter,
                               job->hb + job->hb_offset[e] + (b - first) * cv_act_bf16_stride(ex->inter));
    }
}

/* Expert e's gathered inputs (rows from sorted route `first` on) as its gate, or its up, reads them. */
static cv_act expert_x(const moe_job *job, const cv_moe_expert *ex, int64_t first, bool up) {
    const cv_moe_args *a = job->a;
    const int64_t at = first * cv_act_i8_stride(a->hidden);
    /* with bf16 rows, a weight of another float format (gate and up packed apart) reads f32 */
    if (bf16_x(a, ex))
        return (cv_act){.f32 = job->xs + first * a->hidden, .bf16 = job->xb + first * cv_act_bf16_stride(a->hidden)};
    if (!int8_x(ex)) return (cv_act){.f32 = job->xs + first * a->hidden};
    if (up && own_up_codes(ex)) return (cv_act){.i8 = job->uq + at, .i8_scale = job->u_scale + first};
    return (cv_act){.i8 = job->xq + at, .i8_scale = job->x_scale + first};
}

static void gate_up_task(void *arg, int ti, int nt) {
    const moe_job *job = arg;
    const cv_moe_args *a = job->a;
    float *buf = (float *)(job->thread_buf + (size_t)ti * job->per_thread);
    for (int32_t e = 0; e < a->n_experts; e++) {
        int64_t m = job->offsets[e + 1] - job->offsets[e];
        if (m == 0) continue;
        const cv_moe_expert *ex = &a->experts[e];
        const int64_t inter = ex->inter;
        int64_t b, end;
        cv_split(inter, ROW_ALIGN, ti, nt, &b, &end);
        if (b >= end) continue;
        const int64_t w = end - b;
        float *g = buf, *u = buf + m * w;
        const cv_act xg = expert_x(job, ex, job->offsets[e], false), xu = expert_x(job, ex, job->offsets[e], true);
        cv_linear_rows(ex->gate, &xg, m, b, end, g);
        cv_linear_rows(ex->up, &xu, m, ex->up_row + b, ex->up_row + end, u);
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
        const cv_moe_expert *ex = &a->experts[e];
        cv_act h = {.f32 = job->hs + job->hs_offset[e]};
        if (int8_h(ex)) h = (cv_act){.i8 = job->hq + job->hq_offset[e], .i8_scale = job->h_scale + job->offsets[e]};
        else if (bf16_h(a, ex)) h = (cv_act){.bf16 = job->hb + job->hb_offset[e]};
        cv_linear_rows(ex->down, &h, m, b, end, buf);
        for (int64_t i = 0; i < m; i++) {
            int32_t r = job->offsets[e] + (int32_t)i;
            float *y = a->y + (size_t)job->route_token[r] * (size_t)a->hidden + b;
            const float weight = job->route_weight[r], *o = buf + i * w;
            for (int64_t j = 0; j < w; j++) y[j] += weight * o[j];
        }
    }
}

/* Counting sort of the routes by expert (skipping those with no expert); gathers each route's
 * input row. */
static void group_routes(const cv_moe_args *a, int32_t *offsets, int32_t *fill, int32_t *route_token,
                         float *route_weight, float *xs) {
    const int64_t R = a->n_tokens * a->routes;
    memset(offsets, 0, (size_t)(a->n_experts + 1) * sizeof *offsets);
    for (int64_t r = 0; r < R; r++) {
        assert(a->ids[r] < a->n_experts);
        if (a->ids[r] >= 0) offsets[a->ids[r] + 1]++;
    }
    for (int32_t e = 0; e < a->n_experts; e++) offsets[e + 1] += offsets[e];
    memcpy(fill, offsets, (size_t)a->n_experts * sizeof *fill);
    const size_t row_bytes = (size_t)a->hidden * sizeof(float);
    for (int64_t t = 0; t < a->n_tokens; t++)
        for (int32_t k = 0; k < a->routes; k++) {
            if (a->ids[t * a->routes + k] < 0) continue;
            int32_t slot = fill[a->ids[t * a->routes + k]]++;
            route_token[slot] = (int32_t)t;
            route_weight[slot] = a->weights[t * a->routes + k];
            memcpy(xs + (size_t)slot * (size_t)a->hidden, a->x + t * a->hidden, row_bytes);
        }
}

static void check_expert(const cv_moe_expert *ex, int32_t hidden) {
    assert(ex->gate->cols == hidden && ex->up->cols == hidden && ex->inter <= ex->gate->rows);
    assert(ex->up_row >= 0 && ex->up_row + ex->inter <= ex->up->rows);
    assert(ex->down->rows == hidden && ex->down->cols == ex->inter);
    assert(int8_x(ex) == cv_wformat_int8_input(ex->up->format));
    (void)ex, (void)hidden;
}

void cv_moe(cv_threadpool *pool, const cv_moe_args *a) {
    if (a->n_tokens <= 0) return;
    int32_t max_inter = 0;
    bool int8 = false, bf16 = false;
    for (int32_t e = 0; e < a->n_experts; e++) {
        const cv_moe_expert *ex = &a->experts[e];
        check_expert(ex, a->hidden);
        if (ex->inter > max_inter) max_inter = (int32_t)ex->inter;
        int8 = int8 || int8_x(ex) || int8_h(ex);
        bf16 = bf16 || bf16_x(a, ex) || bf16_h(a, ex);
    }
    const int nt = cv_threadpool_size(pool);
    const moe_layout l = layout_for(nt, a->n_tokens, a->routes, a->hidden, max_inter, a->n_experts, int8, bf16);
    char *ws = a->workspace;
    assert(((uintptr_t)ws & 63) == 0);
    int32_t *offsets = (int32_t *)(ws + l.offsets);
    group_routes(a, offsets, (int32_t *)(ws + l.fill), (int32_t *)(ws + l.route_token),
                 (float *)(ws + l.route_weight), (float *)(ws + l.xs));

    /* Expert e's activations start after those of the experts before it, each [m_e][inter_e]. */
    size_t *hs_offset = (size_t *)(ws + l.hs_offset), *hq_offset = (size_t *)(ws + l.hq_offset);
    size_t *hb_offset = (size_t *)(ws + l.hb_offset); /* used only when bf16 */
    size_t at = 0, at_q = 0, at_b = 0, work = 0;
    bool convert_x = false, convert_h = false;
    for (int32_t e = 0; e < a->n_experts; e++) {
        const cv_moe_expert *ex = &a->experts[e];
        const size_t m = (size_t)(offsets[e + 1] - offsets[e]);
        hs_offset[e] = at;
        hq_offset[e] = at_q;
        if (bf16) hb_offset[e] = at_b;
        at += m * (size_t)ex->inter;
        at_q += m * (size_t)cv_act_i8_stride(ex->inter);
        at_b += m * (size_t)cv_act_bf16_stride(ex->inter);
        work += m * (size_t)ex->inter * (size_t)a->hidden * 3;
        convert_x = convert_x || (m && (int8_x(ex) || bf16_x(a, ex)));
        convert_h = convert_h || (m && (int8_h(ex) || bf16_h(a, ex)));
    }
    moe_job job = {.a = a, .offsets = offsets, .route_token = (int32_t *)(ws + l.route_token),
                   .route_weight = (float *)(ws + l.route_weight), .xs = (float *)(ws + l.xs),
                   .xq = (int8_t *)(ws + l.xq), .x_scale = (float *)(ws + l.x_scale), .uq = (int8_t *)(ws + l.uq),
                   .u_scale = (float *)(ws + l.u_scale), .hs = (float *)(ws + l.hs),
                   .hs_offset = hs_offset, .hq = (int8_t *)(ws + l.hq), .hq_offset = hq_offset,
                   .h_scale = (float *)(ws + l.h_scale), .xb = (uint16_t *)(ws + l.xb), .hb = (uint16_t *)(ws + l.hb),
                   .hb_offset = hb_offset, .thread_buf = ws + l.thread_buf, .per_thread = l.per_thread};
    if (nt > 1 && work >= SERIAL_FLOPS) {
        if (convert_x) cv_threadpool_run_range(pool, convert_x_rows, &job, offsets[a->n_experts], true);
        cv_threadpool_run(pool, gate_up_task, &job);
        if (convert_h) cv_threadpool_run_range(pool, convert_h_rows, &job, offsets[a->n_experts], true);
        cv_threadpool_run(pool, down_task, &job);
        return;
    }
    /* Waking the pool would cost more than the products. One thread's share is then every row; the
     * nt per-thread buffers together are at least that large, since nt shares cover all rows. */
    job.per_thread = layout_for(1, a->n_tokens, a->routes, a->hidden, max_inter, a->n_experts, int8, bf16).per_thread;
    assert(job.per_thread <= l.per_thread * (size_t)nt);
    const int64_t R = offsets[a->n_experts];
    if (convert_x) convert_x_rows(&job, 0, R);
    gate_up_task(&job, 0, 1);
    if (convert_h) convert_h_rows(&job, 0, R);
    down_task(&job, 0, 1);
}
