/*
 * attention.c — causal grouped-query attention over a paged KV cache, flash-style.
 *
 * A unit of work is (a block of consecutive tokens of one sequence, KV head): the block's query
 * rows — tokens × the query heads sharing that KV head (the GQA group), ~64 rows (256 on AMX) —
 * meet the context in tiles of 64 positions (128 on AMX) read straight from the cache through the
 * block table. Per tile K is transposed once into a [head_dim][tile] buffer so that S = Q·Kᵀ and
 * then O += P·V are both small lane-wise GEMMs (cpu_ops.h gemm_rows: broadcast one operand, FMA
 * against vectors of the other), which use each K/V row for all rows of the block. The causal mask only cuts the tiles at
 * each row's own position. A decode token is the same unit with one token (group rows): it reads
 * every K/V row once, which is what bounds decode attention; the transpose is an L1-resident copy.
 *
 * One code path for every batch shape is deliberate: each score and output element is one FMA
 * chain in a fixed order (over head_dim, then over positions tile by tile) whatever the block it
 * sits in, so a sequence gets bit-identical results alone, chunked, or batched with others — the
 * engine's batch-invariance contract.
 *
 * A bf16 KV cache (half the bytes a token, so half the traffic of decode attention) changes only
 * where the rows come from: K rows are widened while they are transposed into the f32 tile and V
 * rows inside the P·V tile product (the cpu_ops.h _bf16 variants), widening being exact. Scores,
 * softmax and accumulation are the same f32 code in the same order, so attention over a bf16 cache
 * is bit for bit attention over an f32 cache holding the same rounded values.
 *
 * In bf16 compute with a bf16 cache, on a CPU whose bf16 dot product beats f32 FMA (bf16_dot), the
 * two tile products run on bf16 pairs instead (cpu_ops.h gemm_rows_dot, twice the multiply-adds per
 * instruction): the scaled query rows are rounded to bf16 once per block, the K tile is transposed
 * as 32-bit words — a pair of adjacent head_dim elements stays together, which is what Q·Kᵀ pairs
 * over — and for P·V the softmax numerators of each row are rounded to bf16 and paired over
 * adjacent positions, against V rows interleaved in the same position pairs. The running max and
 * sum, the rescaling and the final division stay f32 and unchanged; still one accumulation chain
 * per element whatever the block, so batch invariance holds in this mode too. Where the CPU has AMX
 * (and head_dim is a multiple of 32), the same two products on the same pair buffers are AMX tile
 * products (amx/pairs.c): the buffers already are tiles, with zero pairs padding k to whole steps of
 * 16 pairs; a decode token takes that path too, so it keeps the prefill's bits.
 *
 * An online softmax (running max m, running sum l, output rescaled when m grows) keeps memory per
 * unit constant in the context length; with the whole context in one tile (≤ 64) it is the
 * textbook f32 softmax exactly.
 *
 * Units are dealt to threads round-robin: in a prefill, later blocks see longer contexts, and
 * interleaving evens out the per-thread work. Positions come from the batch, not from the token's
 * index, so chunked prefill (earlier context already cached) and batches mixing sequences at
 * different lengths need nothing special.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "kernels/cpu/amx/amx.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/formats.h"
#include "kernels/kernels.h"

/* Context positions per tile and query rows per unit: 64 × 64 on the lane-wise paths (a K tile
 * transposed to f32 is 32 KiB, in L1); 128 × 256 on AMX, where the tile products are cheap and
 * what costs is per tile (softmax bookkeeping, the accumulators' round trip in P·V) and per block
 * (every block transposes and pairs each K/V tile of its context again): the larger shapes ran the
 * 3,500-token prefill 1.2× faster (bench latency, Qwen3-0.6B shape, 2 threads, AMX Xeon). */
enum { CONTEXT_TILE = 64, BLOCK_ROWS = 64, AMX_CONTEXT_TILE = 128, AMX_BLOCK_ROWS = 256, MAX_CONTEXT_TILE = 128 };

typedef struct attention_job {
    const cv_attention_args *a;
    const cv_cpu_ops *ops;
    int group, block_tokens;
    bool bf16;           /* the cache holds bf16 */
    bool amx;            /* bf16_dot's products as AMX tile products */
    int ctx_tile;        /* context positions per tile */
    int64_t kv_width;
    int32_t *unit_start; /* [n_seqs+1]: first unit of sequence s (in KV-head-major blocks) */
} attention_job;

typedef struct head_state {
    float max, sum;
} head_state;

/* The K or V rows of one context tile, in the cache's element type. */
typedef union tile_rows {
    const float *f32[MAX_CONTEXT_TILE];
    const uint16_t *bf16[MAX_CONTEXT_TILE];
} tile_rows;

/* Rows of KV head g at positions [j0, j0 + n) of the sequence whose block table is `table`. */
static void cache_rows(const attention_job *job, const void *cache, const int32_t *table, int32_t j0, int n, int g,
                       tile_rows *out) {
    const cv_attention_args *a = job->a;
    for (int j = 0; j < n; j++) {
        const int32_t pos = j0 + j;
        const int64_t slot = (int64_t)table[pos / a->block_size] * a->block_size + pos % a->block_size;
        const int64_t at = slot * job->kv_width + (int64_t)g * a->head_dim;
        if (job->bf16) out->bf16[j] = (const uint16_t *)cache + at;
        else out->f32[j] = (const float *)cache + at;
    }
}

/* ---- prefill: a block of tokens --------------------------------------------------------------- */

/* Per-thread buffers of the tiled path, sized for a unit's rows; CT is the job's ctx_tile. */
typedef struct block_scratch {
    float *q;      /* [rows][hd], pre-scaled */
    float *o;      /* [rows][hd] */
    float *kt;     /* [hd][CT]; bf16_dot: [hd/2][CT] pairs */
    float *s;      /* [rows][CT] */
    head_state *st;
    /* bf16_dot only: the scaled query [rows][hd/2], the numerators [rows][CT/2] and the V tile
     * [CT/2][hd] as bf16 pairs */
    uint32_t *qp, *pp, *vp;
} block_scratch;

/* O += P·V of one tile on bf16 pairs: the rows' numerators s (f32, zero past each row's causal end)
 * rounded and paired over adjacent positions, V rows of the tile interleaved in the same pairs (an
 * odd last position pairs with zero). */
static void pv_dot(const attention_job *job, block_scratch *w, const tile_rows *vrow, int rows, int n) {
    const int hd = job->a->head_dim, pairs = (n + 1) / 2;
    const int64_t lda = cv_act_bf16_stride(n) / 2; /* ≤ CT / 2 pairs a row, zero past n */
    cv_round_bf16_rows(NULL, w->s, job->ctx_tile, rows, n, (uint16_t *)w->pp);
    job->ops->pair_rows_bf16(w->vp, hd, vrow->bf16, n, hd);
    if (job->amx) { /* k padded to lda pairs: zero V pairs meet the numerators' zero pairs */
        memset(w->vp + (int64_t)pairs * hd, 0, (size_t)(lda - pairs) * (size_t)hd * sizeof *w->vp);
        cv_amx_gemm_pairs(w->o, hd, w->pp, lda, w->vp, hd, rows, hd, (int)lda, true);
        return;
    }
    const uint32_t *v_pairs[MAX_CONTEXT_TILE / 2];
    for (int p = 0; p < pairs; p++) v_pairs[p] = w->vp + (int64_t)p * hd;
    job->ops->gemm_rows_dot(w->o, hd, w->pp, lda, v_pairs, rows, hd, pairs, true);
}

/* Rows r = token·group + head of the block [t0, t1) attend over their contexts. */
static void attend_block(const attention_job *job, block_scratch *w, int32_t s, int32_t t0, int32_t t1, int32_t g) {
    const cv_attention_args *a = job->a;
    const cv_cpu_ops *ops = job->ops;
    const int hd = a->head_dim, group = job->group, rows = (t1 - t0) * group;
    const int32_t *table = a->block_tables[s];
    const bool dot = a->bf16_dot;
    const int CT = job->ctx_tile;
    for (int32_t t = t0; t < t1; t++)
        for (int h = 0; h < group; h++) {
            int r = (t - t0) * group + h;
            const float *q = a->q + ((int64_t)t * a->n_heads + (int64_t)g * group + h) * hd;
            /* copied, then scaled by the ISA's op: the same products as a loop, at this file's
             * baseline ISA that loop was half of attend_block's own time */
            memcpy(w->q + (int64_t)r * hd, q, (size_t)hd * sizeof *q);
            ops->scale(w->q + (int64_t)r * hd, a->scale, hd);
            w->st[r] = (head_state){-INFINITY, 0.0f};
        }
    const int64_t q_pairs = cv_act_bf16_stride(hd) / 2; /* between rows of qp */
    if (dot) cv_round_bf16_rows(NULL, w->q, hd, rows, hd, (uint16_t *)w->qp);
    memset(w->o, 0, (size_t)rows * (size_t)hd * sizeof(float));
    const int32_t n_ctx = a->positions[t1 - 1] + 1; /* positions ascend within a sequence */
    const float *kt_rows[1024];
    const uint32_t *kt_pairs[512];
    tile_rows krow, vrow;
    assert(hd <= 1024);
    for (int d = 0; d < hd; d++) kt_rows[d] = w->kt + (int64_t)d * CT;
    for (int d = 0; d < hd / 2; d++) kt_pairs[d] = (const uint32_t *)w->kt + (int64_t)d * CT;
    for (int32_t j0 = 0; j0 < n_ctx; j0 += CT) {
        const int n = n_ctx - j0 < CT ? n_ctx - j0 : CT;
        cache_rows(job, a->k_cache, table, j0, n, g, &krow);
        cache_rows(job, a->v_cache, table, j0, n, g, &vrow);
        if (dot) {
            /* K rows as hd/2 32-bit words each: the transpose moves words, never reads them as numbers */
            ops->transpose_rows(w->kt, CT, (const float *const *)krow.bf16, n, hd / 2);
            if (job->amx) /* whole tiles of 16 positions: the scores past n are never read */
                cv_amx_gemm_pairs(w->s, CT, w->qp, q_pairs, (const uint32_t *)w->kt, CT, rows,
                                  (n + 15) / 16 * 16, hd / 2, false);
            else ops->gemm_rows_dot(w->s, CT, w->qp, q_pairs, kt_pairs, rows, n, hd / 2, false);
        } else {
            if (job->bf16) ops->transpose_rows_bf16(w->kt, CT, krow.bf16, n, hd);
            else ops->transpose_rows(w->kt, CT, krow.f32, n, hd);
            ops->gemm_rows(w->s, CT, w->q, hd, kt_rows, rows, n, hd, false);
        }
        for (int r = 0; r < rows; r++) {
            const int valid = a->positions[t0 + r / group] + 1 - j0; /* causal: keys up to the row's position */
            float *sr = w->s + (int64_t)r * CT;
            const int nv = valid < n ? valid : n;
            if (nv <= 0) {
                memset(sr, 0, (size_t)n * sizeof *sr);
                continue;
            }
            const float tile_max = ops->max(sr, nv);
            head_state *st = &w->st[r];
            if (tile_max > st->max) {
                float shrink = expf(st->max - tile_max);
                ops->scale(w->o + (int64_t)r * hd, shrink, hd);
                st->sum *= shrink;
                st->max = tile_max;
            }
            st->sum += ops->exp_sum(sr, sr, st->max, nv);
            if (nv < n) memset(sr + nv, 0, (size_t)(n - nv) * sizeof *sr);
        }
        if (dot) pv_dot(job, w, &vrow, rows, n);
        else if (job->bf16) ops->gemm_rows_bf16(w->o, hd, w->s, CT, vrow.bf16, rows, hd, n, true);
        else ops->gemm_rows(w->o, hd, w->s, CT, vrow.f32, rows, hd, n, true);
    }
    for (int32_t t = t0; t < t1; t++)
        for (int h = 0; h < group; h++) {
            int r = (t - t0) * group + h;
            float *out = a->out + ((int64_t)t * a->n_heads + (int64_t)g * group + h) * hd;
            ops->scale(w->o + (int64_t)r * hd, 1.0f / w->st[r].sum, hd);
            memcpy(out, w->o + (int64_t)r * hd, (size_t)hd * sizeof *out);
        }
}

/* ---- scheduling ------------------------------------------------------------------------------- */

static int32_t sequence_of_unit(const attention_job *job, int64_t u) {
    int32_t lo = 0, hi = job->a->n_seqs - 1; /* last s with unit_start[s] <= u */
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (job->unit_start[mid] <= u) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static void run_unit(const attention_job *job, block_scratch *w, int64_t u) {
    const cv_attention_args *a = job->a;
    const int32_t s = sequence_of_unit(job, u);
    const int32_t first = a->seq_start[s], n = a->seq_start[s + 1] - first;
    const int64_t local = u - job->unit_start[s];
    const int32_t g = (int32_t)(local % a->n_kv_heads), block = (int32_t)(local / a->n_kv_heads);
    const int32_t t0 = first + block * job->block_tokens;
    const int32_t t1 = t0 + job->block_tokens < first + n ? t0 + job->block_tokens : first + n;
    attend_block(job, w, s, t0, t1, g);
}

static void attention_task(void *arg, int ti, int nt) {
    const attention_job *job = arg;
    const cv_attention_args *a = job->a;
    const int64_t rows = (int64_t)job->block_tokens * job->group, hd = a->head_dim, CT = job->ctx_tile;
    /* a few tens of KiB per thread and call: small-object allocation, abort on failure like cv_xmalloc */
    float *buf = cv_xmalloc((size_t)(2 * rows * hd + hd * CT + rows * CT) * sizeof(float));
    /* AMX reads whole tiles of the K transpose: positions past a tile's end hold earlier tiles' or
     * these zeros, never uninitialized bytes */
    if (job->amx) memset(buf + 2 * rows * hd, 0, (size_t)(hd * CT) * sizeof(float));
    block_scratch w = {.q = buf, .o = buf + rows * hd, .kt = buf + 2 * rows * hd,
                       .s = buf + 2 * rows * hd + hd * CT,
                       .st = cv_xmalloc((size_t)rows * sizeof(head_state))};
    if (a->bf16_dot) {
        const int64_t q_words = rows * (cv_act_bf16_stride(hd) / 2);
        w.qp = cv_xmalloc((size_t)(q_words + rows * CT / 2 + CT / 2 * hd) * sizeof(uint32_t));
        w.pp = w.qp + q_words;
        w.vp = w.pp + rows * CT / 2;
    }
    const int64_t units = job->unit_start[a->n_seqs];
    for (int64_t u = ti; u < units; u += nt) run_unit(job, &w, u);
    free(w.st);
    free(w.qp);
    free(buf);
}

void cv_attention(cv_threadpool *pool, const cv_attention_args *a) {
    assert(a->n_kv_heads > 0 && a->n_heads % a->n_kv_heads == 0 && a->block_size > 0);
    assert(a->kv_dtype == CV_DTYPE_F32 || a->kv_dtype == CV_DTYPE_BF16);
    assert(!a->bf16_dot || (a->kv_dtype == CV_DTYPE_BF16 && a->head_dim % 2 == 0 && cv_cpu_ops_active()->gemm_rows_dot &&
                            cv_cpu_ops_active()->pair_rows_bf16));
    if (a->n_tokens <= 0) return;
    attention_job job = {.a = a, .ops = cv_cpu_ops_active(), .group = a->n_heads / a->n_kv_heads,
                         .bf16 = a->kv_dtype == CV_DTYPE_BF16, .kv_width = (int64_t)a->n_kv_heads * a->head_dim};
    job.amx = a->bf16_dot && a->head_dim % 32 == 0 && cv_cpu_amx();
    job.ctx_tile = job.amx ? AMX_CONTEXT_TILE : CONTEXT_TILE;
    const int block_rows = job.amx ? AMX_BLOCK_ROWS : BLOCK_ROWS;
    job.block_tokens = block_rows / job.group > 1 ? block_rows / job.group : 1;
    job.unit_start = cv_xmalloc(((size_t)a->n_seqs + 1) * sizeof *job.unit_start);
    job.unit_start[0] = 0;
    for (int32_t s = 0; s < a->n_seqs; s++) {
        int32_t n = a->seq_start[s + 1] - a->seq_start[s];
        int32_t blocks = (n + job.block_tokens - 1) / job.block_tokens;
        job.unit_start[s + 1] = job.unit_start[s] + blocks * a->n_kv_heads;
    }
    cv_threadpool_run(pool, attention_task, &job);
    free(job.unit_start);
}
