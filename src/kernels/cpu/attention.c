/*
 * attention.c — causal grouped-query attention over a paged KV cache.
 *
 * A unit of work is one (token, KV head) pair: the token's query heads that share that KV head
 * (the GQA group) are processed together, so each K/V row fetched from the cache serves the whole
 * group while it is in L1. Context is consumed in tiles of 64 positions with an online softmax
 * (running max m, running sum l, output rescaled when m grows), so memory per unit is constant
 * and long contexts need no score buffer of context length; with the whole context in one tile
 * (≤ 64) it is the textbook f32 softmax exactly.
 *
 * Units are dealt to threads round-robin rather than in contiguous ranges: in a prefill, later
 * tokens see longer contexts, and interleaving evens out the per-thread work. Positions come from
 * the batch, not from the token's index, so chunked prefill (earlier context already cached) and
 * batches mixing sequences at different lengths need nothing special.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

enum { CONTEXT_TILE = 64 };

typedef struct attention_job {
    const cv_attention_args *a;
    const cv_cpu_ops *ops;
} attention_job;

static int32_t sequence_of(const cv_attention_args *a, int32_t t) {
    int32_t lo = 0, hi = a->n_seqs - 1; /* last s with seq_start[s] <= t */
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (a->seq_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

typedef struct head_state {
    float max, sum;
} head_state;

/* Folds one tile of scores for one query head into its running output. */
static void fold_tile(const cv_cpu_ops *ops, const float *q, float *o, head_state *st, const float *const *krow,
                      const float *const *vrow, int n, int hd, float scale) {
    float score[CONTEXT_TILE];
    float tile_max = -INFINITY;
    for (int j = 0; j < n; j++) {
        score[j] = ops->dot(q, krow[j], hd) * scale;
        tile_max = score[j] > tile_max ? score[j] : tile_max;
    }
    if (tile_max > st->max) {
        float shrink = expf(st->max - tile_max); /* 0 on the first tile (max = -inf) */
        ops->scale(o, shrink, hd);
        st->sum *= shrink;
        st->max = tile_max;
    }
    for (int j = 0; j < n; j++) {
        float p = expf(score[j] - st->max);
        st->sum += p;
        ops->axpy(o, p, vrow[j], hd);
    }
}

static void attend(const attention_job *job, int32_t t, int32_t g) {
    const cv_attention_args *a = job->a;
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int64_t kv_width = (int64_t)a->n_kv_heads * hd;
    const int32_t s = sequence_of(a, t);
    const int32_t *table = a->block_tables[s];
    const int32_t n_ctx = a->positions[t] + 1;
    head_state st[group];
    for (int h = 0; h < group; h++) {
        st[h] = (head_state){-INFINITY, 0.0f};
        memset(a->out + ((int64_t)t * a->n_heads + g * group + h) * hd, 0, (size_t)hd * sizeof(float));
    }
    const float *krow[CONTEXT_TILE], *vrow[CONTEXT_TILE];
    for (int32_t j0 = 0; j0 < n_ctx; j0 += CONTEXT_TILE) {
        int n = n_ctx - j0 < CONTEXT_TILE ? n_ctx - j0 : CONTEXT_TILE;
        for (int j = 0; j < n; j++) {
            int32_t pos = j0 + j;
            int64_t slot = (int64_t)table[pos / a->block_size] * a->block_size + pos % a->block_size;
            krow[j] = a->k_cache + slot * kv_width + (int64_t)g * hd;
            vrow[j] = a->v_cache + slot * kv_width + (int64_t)g * hd;
        }
        for (int h = 0; h < group; h++) {
            int64_t head = (int64_t)t * a->n_heads + g * group + h;
            fold_tile(job->ops, a->q + head * hd, a->out + head * hd, &st[h], krow, vrow, n, hd, a->scale);
        }
    }
    for (int h = 0; h < group; h++)
        job->ops->scale(a->out + ((int64_t)t * a->n_heads + g * group + h) * hd, 1.0f / st[h].sum, hd);
}

static void attention_task(void *arg, int ti, int nt) {
    const attention_job *job = arg;
    const int64_t units = (int64_t)job->a->n_tokens * job->a->n_kv_heads;
    for (int64_t u = ti; u < units; u += nt) attend(job, (int32_t)(u / job->a->n_kv_heads), (int32_t)(u % job->a->n_kv_heads));
}

void cv_attention(cv_threadpool *pool, const cv_attention_args *a) {
    assert(a->n_kv_heads > 0 && a->n_heads % a->n_kv_heads == 0 && a->block_size > 0);
    if (a->n_tokens <= 0) return;
    attention_job job = {.a = a, .ops = cv_cpu_ops_active()};
    cv_threadpool_run(pool, attention_task, &job);
}
