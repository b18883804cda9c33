/*
 * gdn.c — the Gated DeltaNet pieces: causal depthwise conv + SiLU, gates, L2 norm, and the gated
 * delta rule itself in its recurrent (decode) and chunked (prefill) forms.
 *
 * State: per value head an f32 matrix S [k_dim][v_dim], row r = key dimension r. Every update is a
 * row operation over v_dim (scale a row, add a multiple of a vector to it, accumulate rows into a
 * vector), so both forms run on the ISA's axpy/scale/dot (cpu_ops.h) and vectorise fully; the
 * recurrent step reads and writes each state row once per token while it sits in L1.
 *
 * Chunked form (prefill; equal to the recurrence S ← e^g·S, δ = β(v − Sᵀk), S ← S + k⊗δ, o = Sᵀq),
 * for a run of C ≤ 64 tokens from state S₀, with Γ the within-chunk cumulative sum of g and
 * γ_r = exp(Γ_r):
 *   δ_r = β_r v_r − β_r γ_r S₀ᵀk_r − β_r Σ_{s<r} exp(Γ_r−Γ_s)(k_r·k_s) δ_s   (forward substitution)
 *   o_r = γ_r S₀ᵀq_r + Σ_{s≤r} exp(Γ_r−Γ_s)(q_r·k_s) δ_s
 *   S_C = γ_C S₀ + Σ_s exp(Γ_C−Γ_s) k_s ⊗ δ_s
 * which is the recurrence unrolled: the δ_r are exactly its per-token corrections. Solving for δ
 * row by row is the same triangular system Hugging Face inverts explicitly ((I−L)⁻¹), without
 * forming the inverse. The state is read once (for S₀ᵀk and S₀ᵀq of all C tokens, row by row) and
 * written once per chunk. Every decay factor is formed as exp of a difference Γ_r−Γ_s with s ≤ r,
 * never as exp(Γ_r)·exp(−Γ_s), which would overflow after a few strongly decaying tokens.
 *
 * Checkpoints cut a run's chunks at the requested tokens, so the state right after such a token is
 * the state between two chunks, exactly as the recurrence leaves it; copying it out costs one write
 * of the head's state, and the run carries on from there. A cut leaving one token takes the
 * recurrent step (a speculative-decoding verify run is checkpointed at every token).
 *
 * Threads take (sequence, value head) units round-robin: heads are independent, and a long prefill
 * run next to short decodes spreads over the threads instead of queueing behind one.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

enum { CHUNK = 64 };

void cv_l2norm(float *x, int64_t rows, int64_t dim, float eps, float scale) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * dim;
        ops->scale(xr, scale / sqrtf(ops->dot(xr, xr, dim) + eps), dim);
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

void cv_conv1d_silu(float *y, const float *x, int64_t ld_x, int64_t n, int64_t channels, const float *w, int kernel,
                    float *state) {
    assert(kernel >= 1);
    const int hist = kernel - 1;
    for (int64_t t = 0; t < n; t++) {
        float *yt = y + t * channels;
        const float *xt = x + t * ld_x;
        for (int64_t c = 0; c < channels; c++) yt[c] = w[(int64_t)hist * channels + c] * xt[c];
        for (int j = 0; j < hist; j++) {
            int64_t src = t - hist + j; /* < 0: from the state */
            const float *xs = src >= 0 ? x + src * ld_x : state + (hist + src) * channels;
            const float *wj = w + (int64_t)j * channels;
            for (int64_t c = 0; c < channels; c++) yt[c] += wj[c] * xs[c];
        }
        for (int64_t c = 0; c < channels; c++) yt[c] = silu(yt[c]);
    }
    /* The new state is the last `hist` raw inputs of (old state ++ x). */
    const size_t row = (size_t)channels * sizeof(float);
    if (n >= hist) {
        for (int j = 0; j < hist; j++) memcpy(state + (int64_t)j * channels, x + (n - hist + j) * ld_x, row);
    } else {
        memmove(state, state + n * channels, (size_t)(hist - n) * row);
        for (int64_t j = 0; j < n; j++) memcpy(state + (hist - n + j) * channels, x + j * ld_x, row);
    }
}

void cv_conv1d_state_after(float *dst, const float *x, int64_t ld_x, int64_t j, int64_t channels, int kernel,
                           const float *state) {
    assert(kernel >= 1 && j >= 0);
    const int hist = kernel - 1;
    const size_t row = (size_t)channels * sizeof(float);
    for (int i = 0; i < hist; i++) {
        int64_t src = j - hist + 1 + i; /* < 0: from the state */
        memcpy(dst + (int64_t)i * channels, src >= 0 ? x + src * ld_x : state + (hist + src) * channels, row);
    }
}

void cv_gdn_gates(float *g, float *beta, const float *a, const float *b, int64_t n_tokens, int32_t n_heads,
                  const float *a_log, const float *dt_bias) {
    for (int64_t t = 0; t < n_tokens; t++)
        for (int32_t h = 0; h < n_heads; h++) {
            int64_t i = t * n_heads + h;
            float z = a[i] + dt_bias[h];
            float softplus = z > 20.0f ? z : log1pf(expf(z));
            g[i] = -expf(a_log[h]) * softplus;
            beta[i] = 1.0f / (1.0f + expf(-b[i]));
        }
}

/* ---- the delta rule --------------------------------------------------------------------------- */

typedef struct gdn_scratch {
    float *delta;     /* [CHUNK][v_dim] */
    float *kk, *qk;   /* [CHUNK][CHUNK] key·key and query·key products, times exp(Γ_r − Γ_s) */
    float *cum;       /* [CHUNK] Γ */
    float *tail;      /* [CHUNK] exp(Γ_last − Γ_s) */
} gdn_scratch;

static size_t floats_per_thread(int32_t v_dim) {
    size_t n = (size_t)CHUNK * (size_t)v_dim + 2 * (size_t)CHUNK * CHUNK + 2 * CHUNK;
    return (n + 15) & ~(size_t)15; /* keep every thread's block 64-byte aligned */
}

size_t cv_gdn_workspace_bytes(const cv_threadpool *pool, int32_t k_dim, int32_t v_dim) {
    (void)k_dim;
    return (size_t)cv_threadpool_size(pool) * floats_per_thread(v_dim) * sizeof(float);
}

/* One head of one sequence: where its inputs, state and outputs are. */
typedef struct head_view {
    const float *q, *k, *v;   /* token 0 of the run; rows ld apart */
    int64_t ld;
    const float *g, *beta;    /* token 0; entries n_v_heads apart */
    int32_t gstride;
    float *out;               /* token 0; rows ostride apart */
    int64_t ostride;
    float *state;             /* [k_dim][v_dim] */
    int32_t k_dim, v_dim;
} head_view;

/* One token: S ← e^g·S; δ = β(v − Sᵀk); S ← S + k⊗δ; o = Sᵀq. */
static void recurrent_step(const cv_cpu_ops *ops, const head_view *h, int64_t t, float *delta) {
    const float *q = h->q + t * h->ld, *k = h->k + t * h->ld, *v = h->v + t * h->ld;
    const float decay = expf(h->g[t * h->gstride]), beta = h->beta[t * h->gstride];
    float *o = h->out + t * h->ostride;
    const int32_t dv = h->v_dim;
    /* Sᵀk of the decayed state = decay · (Sᵀk of the old one). */
    memset(delta, 0, (size_t)dv * sizeof *delta);
    for (int32_t r = 0; r < h->k_dim; r++) ops->axpy(delta, k[r], h->state + (int64_t)r * dv, dv);
    for (int32_t c = 0; c < dv; c++) delta[c] = beta * (v[c] - decay * delta[c]);
    memset(o, 0, (size_t)dv * sizeof *o);
    for (int32_t r = 0; r < h->k_dim; r++) {
        float *row = h->state + (int64_t)r * dv;
        ops->scale(row, decay, dv);
        ops->axpy(row, k[r], delta, dv);
        ops->axpy(o, q[r], row, dv);
    }
}

/* Tokens [t0, t0+n) of the head, n ≤ CHUNK, as one chunk (see the file comment). */
static void chunk_step(const cv_cpu_ops *ops, const head_view *h, int64_t t0, int n, const gdn_scratch *s) {
    const int32_t dk = h->k_dim, dv = h->v_dim;
    const float *Q = h->q + t0 * h->ld, *K = h->k + t0 * h->ld, *V = h->v + t0 * h->ld;
    float *O = h->out + t0 * h->ostride, *D = s->delta, *cum = s->cum;
    float acc = 0.0f;
    for (int r = 0; r < n; r++) cum[r] = acc += h->g[(t0 + r) * h->gstride];
    for (int r = 0; r < n; r++)
        for (int j = 0; j <= r; j++) {
            const float decay = expf(cum[r] - cum[j]);
            s->kk[r * CHUNK + j] = ops->dot(K + r * h->ld, K + j * h->ld, dk) * decay;
            s->qk[r * CHUNK + j] = ops->dot(Q + r * h->ld, K + j * h->ld, dk) * decay;
        }
    /* S₀ᵀk_r into D and S₀ᵀq_r into O, row of the state outermost so each row is read once. */
    for (int r = 0; r < n; r++) {
        memset(D + (int64_t)r * dv, 0, (size_t)dv * sizeof *D);
        memset(O + r * h->ostride, 0, (size_t)dv * sizeof *O);
    }
    for (int32_t i = 0; i < dk; i++) {
        const float *row = h->state + (int64_t)i * dv;
        for (int r = 0; r < n; r++) {
            ops->axpy(D + (int64_t)r * dv, K[r * h->ld + i], row, dv);
            ops->axpy(O + r * h->ostride, Q[r * h->ld + i], row, dv);
        }
    }
    for (int r = 0; r < n; r++) {
        const float beta = h->beta[(t0 + r) * h->gstride], gamma = expf(cum[r]);
        const float *v = V + r * h->ld;
        float *d = D + (int64_t)r * dv;
        for (int32_t c = 0; c < dv; c++) d[c] = beta * (v[c] - gamma * d[c]);
        for (int j = 0; j < r; j++) ops->axpy(d, -beta * s->kk[r * CHUNK + j], D + (int64_t)j * dv, dv);
        float *o = O + r * h->ostride;
        ops->scale(o, gamma, dv);
        for (int j = 0; j <= r; j++) ops->axpy(o, s->qk[r * CHUNK + j], D + (int64_t)j * dv, dv);
    }
    const float last = cum[n - 1], gamma_last = expf(last);
    for (int j = 0; j < n; j++) s->tail[j] = expf(last - cum[j]);
    for (int32_t i = 0; i < dk; i++) {
        float *row = h->state + (int64_t)i * dv;
        ops->scale(row, gamma_last, dv);
        for (int j = 0; j < n; j++) ops->axpy(row, s->tail[j] * K[j * h->ld + i], D + (int64_t)j * dv, dv);
    }
}

typedef struct gdn_job {
    const cv_gdn_args *a;
    const cv_cpu_ops *ops;
    float *workspace;
} gdn_job;

static void run_unit(const gdn_job *job, int32_t s_idx, int32_t vh, const gdn_scratch *s) {
    const cv_gdn_args *a = job->a;
    const int32_t t0 = a->seq_start[s_idx], n = a->seq_start[s_idx + 1] - t0;
    const int32_t kh = vh / (a->n_v_heads / a->n_k_heads); /* GVA: consecutive value heads share a key head */
    head_view h = {
        .q = a->q + (int64_t)t0 * a->ld + (int64_t)kh * a->k_dim,
        .k = a->k + (int64_t)t0 * a->ld + (int64_t)kh * a->k_dim,
        .v = a->v + (int64_t)t0 * a->ld + (int64_t)vh * a->v_dim,
        .ld = a->ld,
        .g = a->g + (int64_t)t0 * a->n_v_heads + vh,
        .beta = a->beta + (int64_t)t0 * a->n_v_heads + vh,
        .gstride = a->n_v_heads,
        .out = a->out + (int64_t)t0 * a->n_v_heads * a->v_dim + (int64_t)vh * a->v_dim,
        .ostride = (int64_t)a->n_v_heads * a->v_dim,
        .state = a->states[s_idx] + (int64_t)vh * a->k_dim * a->v_dim,
        .k_dim = a->k_dim,
        .v_dim = a->v_dim,
    };
    const size_t head_floats = (size_t)a->k_dim * (size_t)a->v_dim;
    int32_t ck = a->ckpt_start ? a->ckpt_start[s_idx] : 0;
    const int32_t ck_end = a->ckpt_start ? a->ckpt_start[s_idx + 1] : 0;
    for (int32_t c = 0; c < n;) {
        int32_t end = n - c < CHUNK ? n : c + CHUNK;
        if (ck < ck_end && a->ckpt_token[ck] + 1 < end) end = a->ckpt_token[ck] + 1;
        assert(end > c);
        if (end - c == 1) recurrent_step(job->ops, &h, c, s->delta);
        else chunk_step(job->ops, &h, c, end - c, s);
        c = end;
        for (; ck < ck_end && a->ckpt_token[ck] + 1 == c; ck++)
            memcpy(a->ckpt_states[ck] + (int64_t)vh * a->k_dim * a->v_dim, h.state, head_floats * sizeof(float));
    }
}

static void gdn_task(void *arg, int ti, int nt) {
    const gdn_job *job = arg;
    const cv_gdn_args *a = job->a;
    float *base = job->workspace + (size_t)ti * floats_per_thread(a->v_dim);
    gdn_scratch s = {.delta = base, .kk = base + (size_t)CHUNK * a->v_dim};
    s.qk = s.kk + CHUNK * CHUNK;
    s.cum = s.qk + CHUNK * CHUNK;
    s.tail = s.cum + CHUNK;
    const int64_t units = (int64_t)a->n_seqs * a->n_v_heads;
    for (int64_t u = ti; u < units; u += nt) {
        int32_t s_idx = (int32_t)(u / a->n_v_heads), vh = (int32_t)(u % a->n_v_heads);
        if (a->seq_start[s_idx + 1] > a->seq_start[s_idx]) run_unit(job, s_idx, vh, &s);
    }
}

void cv_gdn(cv_threadpool *pool, const cv_gdn_args *a) {
    assert(a->n_k_heads > 0 && a->n_v_heads % a->n_k_heads == 0);
    assert(((uintptr_t)a->workspace & 63) == 0);
    gdn_job job = {.a = a, .ops = cv_cpu_ops_active(), .workspace = a->workspace};
    cv_threadpool_run(pool, gdn_task, &job);
}
