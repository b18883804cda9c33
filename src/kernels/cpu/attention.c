/*
 * attention.c — causal grouped-query attention over a paged KV cache, flash-style.
 *
 * A unit of work is (a block of consecutive tokens of one sequence, KV head): the block's query
 * rows — tokens × the query heads sharing that KV head (the GQA group), ~64 rows (256 on AMX) —
 * meet the context in tiles of 64 positions (128 on AMX) read straight from the cache through the
 * block table. Per tile K is transposed once into a [head_dim][tile] buffer so that S = Q·Kᵀ and
 * then O += P·V are both small lane-wise GEMMs (cpu_ops.h gemm_rows: broadcast one operand, FMA
 * against vectors of the other), which use each K/V row for all rows of the block. The causal
 * mask only cuts the tiles at each row's own position. A decode token is the same unit with one
 * token (group rows): it reads every K/V row once, which is what bounds decode attention; the
 * transpose is an L1-resident copy.
 *
 * One code path for every batch shape is deliberate: each score and output element is one FMA
 * chain in a fixed order (over head_dim, then over positions tile by tile) whatever the block it
 * sits in, so a sequence gets bit-identical results alone, chunked, or batched with others — the
 * engine's batch-invariance contract.
 *
 * A bf16 KV cache (half the bytes a token, so half the traffic of decode attention) is stored in
 * the pairs of bf16 that the dot products below multiply (kernels.h): K as words of two adjacent
 * head_dim elements, V as words of two adjacent positions, one block and KV head a contiguous run of
 * each. A tile's words are copied out of the cache block by block (kv_layout.c: row copies, not
 * transposes), and the f32 tile products widen them first (cpu_ops.h widen_pairs), widening being
 * exact: scores, softmax and accumulation are the same f32 code in the same order, so attention
 * over a bf16 cache is bit for bit attention over an f32 cache holding the same rounded values.
 *
 * In bf16 compute with a bf16 cache, on a CPU whose bf16 dot product beats f32 FMA (bf16_dot), the
 * two tile products run on those pairs instead (cpu_ops.h gemm_panels_dot and gemm_rows_dot, twice
 * the multiply-adds per instruction), reading the words in place in the cache (kv_layout.h): the
 * scaled query rows are rounded to bf16 once per block, Q·Kᵀ pairs over head_dim against K's words
 * 16 positions at a time, and for P·V the softmax numerators of each row are rounded to bf16 and
 * paired over adjacent positions against V's pair rows (an odd last position paired with zero).
 * The running max and sum, the rescaling and the final division stay f32 and unchanged; still one
 * accumulation chain per element whatever the block, so batch invariance holds in this mode too.
 * Where the CPU has AMX (and head_dim is a multiple of 32), the same two products are AMX tile
 * products (amx/pairs.c) on the same words copied into tiles of 16 columns, with zero pairs padding
 * k to whole steps of 16 pairs, and the loops are ordered for them (attend_amx); a decode token
 * takes that path too, so it keeps the prefill's bits.
 *
 * An online softmax (running max m, running sum l, output rescaled when m grows) keeps memory per
 * unit constant in the context length; with the whole context in one tile (≤ 64) it is the
 * textbook f32 softmax exactly.
 *
 * The batch's own K and V rows are stored into the cache here (cv_attention_args.k_new). Where every
 * sequence's tokens fit one block (a decode batch), the unit that reads a sequence's KV head stores
 * that head's rows first, on its own thread: no other unit reads them, and the lines a decode
 * token's rows land in — misses once the weights have streamed through, and the panel the unit reads
 * last — are then in that thread's cache. A separate pass before took 7.5-9 µs a layer of a 0.6B
 * W8A8 decode on one thread (Zen 5), and attention plus the store in units 2-8 µs less than the two
 * apart, 4 of 4 pairs. Otherwise the rows are stored over the pool before the units start.
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
#include "kernels/cpu/kv_layout.h"
#include "kernels/kernels.h"

/* Context positions per tile and query rows per unit: 64 × 64 on the lane-wise paths (an f32 K tile
 * is 32 KiB, in L1); 128 × 256 on AMX, where the tile products are cheap and what costs is per tile
 * (softmax bookkeeping) and per block (every block copies each K/V tile of its context again; it
 * transposed and paired them when this was measured): the larger shapes ran the 3,500-token
 * prefill 1.2× faster (bench latency, Qwen3-0.6B shape, 2 threads, AMX Xeon). On AMX a unit's rows
 * go through a chunk of its context 32 rows at a time (two row tiles), see attend_amx. */
enum {
    CONTEXT_TILE = 64,
    BLOCK_ROWS = 64,
    AMX_CONTEXT_TILE = 128,
    AMX_BLOCK_ROWS = 256,
    AMX_SUB_ROWS = 32,
    AMX_CHUNK = 4 * AMX_CONTEXT_TILE,
    MAX_CONTEXT_TILE = 128,
    STAGE_BYTES = 32768 /* an f32 cache's tile of K (or V) rows copied together: 64 × 128 (fetch_rows) */
};

typedef struct attention_job {
    const cv_attention_args *a;
    const cv_cpu_ops *ops;
    int group, block_tokens;
    bool bf16;           /* the cache holds bf16 (in pairs) */
    bool amx;            /* bf16_dot's products as AMX tile products */
    int ctx_tile;        /* context positions per tile */
    int32_t *unit_start; /* [n_seqs+1]: first unit of sequence s (in KV-head-major blocks) */
    bool store_in_units; /* each unit stores its sequence's new rows of its KV head (k_new) */
    cv_kv_rows rows;     /* k_new's */
} attention_job;

typedef struct head_state {
    float max, sum;
} head_state;

/* ---- an f32 cache: rows ------------------------------------------------------------------------ */

/* Rows of KV head g at positions [j0, j0 + n) of the sequence whose block table is `table`: a
 * block's rows of one head lie one after another (cv_kv_index). */
static void cache_rows(const attention_job *job, const int32_t *table, const float *cache, int32_t j0, int n, int g,
                       const float **out) {
    const cv_attention_args *a = job->a;
    const int32_t bs = a->block_size;
    for (int j = 0; j < n;) {
        const int32_t pos = j0 + j, off = pos % bs, run = bs - off < n - j ? bs - off : n - j;
        const float *at = cache + cv_kv_index(CV_DTYPE_F32, false, (int64_t)table[pos / bs] * bs + off, g, 0,
                                              a->n_kv_heads, a->head_dim, bs);
        for (int32_t i = 0; i < run; i++, j++) out[j] = at + (int64_t)i * a->head_dim;
    }
}

/* Asks for every line of a tile's n rows up front, and copies them into `stage` (STAGE_BYTES,
 * pointing `rows` at the copy) where they fit and `staged`. One head's rows of a tile are 64 rows in
 * 16-slot blocks, a run in each; the hardware's stream prefetchers stop at a 4 KiB page and barely
 * start within one, so without the ask the transpose took the misses a few lines at a time; the
 * copy's plain loads wait out the misses faster than the transpose's scattered ones, which then
 * read L1. attention_bench decode (Zen 5, 2 threads, bf16 rows, before the bf16 cache was stored
 * in pairs): without either, 130 positions 1.2-3.4x slower, 1,000 and 3,500 positions 2x; without
 * the copy 1,000 and 3,500 positions 1.35-1.5x slower, while at 130 positions the copy cost more
 * than it saved (1.3x), so attend_lanes stages only contexts longer than 4 tiles. The bytes are
 * unchanged, so are the results. */
static void fetch_rows(const float **rows, int n, size_t row_bytes, char *stage, bool staged) {
    for (int j = 0; j < n; j++) cv_prefetch_bytes(rows[j], row_bytes);
    if (!staged || (size_t)n * row_bytes > STAGE_BYTES) return; /* heads wider than 128: prefetched only */
    for (int j = 0; j < n; j++) {
        memcpy(stage + (size_t)j * row_bytes, rows[j], row_bytes);
        rows[j] = (const float *)(stage + (size_t)j * row_bytes);
    }
}

/* ---- a bf16 cache: words (kv_layout.h) ------------------------------------------------------- */

static cv_kv_head kv_head(const attention_job *job, const void *cache, const int32_t *table, int g) {
    const cv_attention_args *a = job->a;
    return (cv_kv_head){.cache = cache, .table = table, .g = g, .n_kv_heads = a->n_kv_heads,
                        .head_dim = a->head_dim, .block_size = a->block_size};
}

/* ---- prefill: a block of tokens --------------------------------------------------------------- */

/* Per-thread buffers, sized for a unit's rows (attention_task); CT is the job's ctx_tile. */
typedef struct block_scratch {
    float *q;      /* [rows][hd], pre-scaled; bf16_dot: one row, rounded into qp */
    float *o;      /* [rows][hd] */
    float *kt;     /* [hd][CT]; bf16_dot: [hd/2][CT] K words (those not read in place, kv_layout.h); AMX: one
                    * such tile per 16 positions of a chunk */
    float *s;      /* [rows][CT]; AMX: [AMX_SUB_ROWS][CT] */
    head_state *st;
    /* bf16_dot only: the scaled query [rows][hd/2] and the numerators [rows][CT/2] (AMX: 32 rows) as
     * bf16 pairs */
    uint32_t *qp, *pp;
    /* a bf16 cache: the V tile's words [CT/2][hd] (bf16_dot: those not read in place, kv_layout.h; AMX:
     * one tile per 16 elements and context tile of a chunk) */
    uint32_t *vp;
    /* f32 products over a bf16 cache: the K tile's words [⌈hd/2⌉][CT] and the V tile widened [CT][hd] */
    uint32_t *kw;
    float *vf;
    char *ks, *vs; /* an f32 cache: STAGE_BYTES each, a tile's K and V rows (fetch_rows) */
} block_scratch;

/* The rows r = token·group + head of the block [t0, t1) start: queries scaled (and on the bf16 dot
 * path rounded to pairs), outputs and softmax state cleared. */
static void start_block(const attention_job *job, block_scratch *w, int32_t t0, int32_t t1, int32_t g) {
    const cv_attention_args *a = job->a;
    const int hd = a->head_dim, group = job->group, rows = (t1 - t0) * group;
    const int64_t q_pairs = cv_act_bf16_stride(hd) / 2; /* between rows of qp */
    for (int32_t t = t0; t < t1; t++)
        for (int h = 0; h < group; h++) {
            const int r = (t - t0) * group + h;
            const int64_t at = ((int64_t)t * a->n_heads + (int64_t)g * group + h) * hd;
            w->st[r] = (head_state){-INFINITY, 0.0f};
            if (a->q_bf16) { /* made by the producer as below */
                uint16_t *qp = (uint16_t *)(w->qp + r * q_pairs);
                memcpy(qp, a->q_bf16 + at, (size_t)hd * sizeof *qp);
                memset(qp + hd, 0, (size_t)(2 * q_pairs - hd) * sizeof *qp);
                continue;
            }
            const float *q = a->q + at;
            float *qr = a->bf16_dot ? w->q : w->q + (int64_t)r * hd;
            /* copied, then scaled by the ISA's op: the same products as a loop, at this file's
             * baseline ISA that loop was half of the block's own time */
            memcpy(qr, q, (size_t)hd * sizeof *q);
            job->ops->scale(qr, a->scale, hd);
            if (a->bf16_dot) cv_round_bf16_rows(NULL, qr, hd, 1, hd, (uint16_t *)(w->qp + r * q_pairs));
        }
    memset(w->o, 0, (size_t)rows * (size_t)hd * sizeof(float));
}

/* The online-softmax step of one row over a tile: sr holds its nv ≥ 1 unmasked scores; the running
 * max and sum are updated (the output row rescaled when the max grows), and the numerators
 * exp(s − max) written over sr, or rounded to bf16 into pr when pr is not NULL. */
static void softmax_step(const attention_job *job, head_state *st, float *o_row, float *sr, int nv, uint16_t *pr) {
    const cv_cpu_ops *ops = job->ops;
    const float tile_max = ops->max(sr, nv);
    if (tile_max > st->max) {
        if (st->max != -INFINITY) { /* before the first tile the output and sum are zeros */
            const float shrink = expf(st->max - tile_max);
            ops->scale(o_row, shrink, job->a->head_dim);
            st->sum *= shrink;
        }
        st->max = tile_max;
    }
    st->sum += pr ? ops->exp_sum_bf16(pr, sr, st->max, nv) : ops->exp_sum(sr, sr, st->max, nv);
}

/* The rows' outputs divided by their sums, into a->out or rounded into a->out_bf16. */
static void finish_block(const attention_job *job, block_scratch *w, int32_t t0, int32_t t1, int32_t g) {
    const cv_attention_args *a = job->a;
    const int hd = a->head_dim, group = job->group;
    for (int32_t t = t0; t < t1; t++)
        for (int h = 0; h < group; h++) {
            const int r = (t - t0) * group + h;
            const int64_t at = ((int64_t)t * a->n_heads + (int64_t)g * group + h) * hd;
            float *o = w->o + (int64_t)r * hd;
            job->ops->scale(o, 1.0f / w->st[r].sum, hd);
            if (a->out_bf16) job->ops->round_bf16(a->out_bf16 + at, o, hd);
            else memcpy(a->out + at, o, (size_t)hd * sizeof *o);
        }
}

/* The tile a thread multiplies next (n = 0: none): on the bf16 dot path its lines are asked for while
 * the thread multiplies the tile it is at. */
typedef struct next_tile {
    cv_kv_head k, v;
    int32_t j0;
    int n;
} next_tile;

/* With a next tile and at most ASK_ROWS rows (a decode token's group: the products wait on memory),
 * the tile products run in steps of ASK_K pair rows of K and ASK_V position pairs of V, and before
 * each step the next tile's lines of the same part are asked for (32 lines at a head_dim of 128 in
 * 16-slot blocks): the misses stay in flight while the thread multiplies. Before, each tile's own
 * lines were asked for at once as it began, which held the thread until most had arrived (more
 * misses than the core tracks) with nothing to multiply meanwhile, and the hardware's stream
 * prefetchers stop at each block's 4 KiB run. Each step continues the previous one's sums through c
 * (accumulate), so the bits are those of one product. attention_bench decode-cold (Zen 5, 2
 * threads, Qwen3-0.6B heads, ms per token of 28 layers, four runs each, interleaved): 16 positions
 * 0.15-0.17 against 0.16-0.18, 65 the same (0.52-0.54 against 0.50-0.55), 130 0.76-0.81 against
 * 0.83-0.89, 1,000 4.5-4.8 against 5.6-5.8, 3,500 15.2-19.1 against 19.3-19.9. Steps of 16 and 8
 * gained about half as much at 3,500, steps of 4 and 2 less than 8 and 4. */
enum { ASK_ROWS = 16, ASK_K = 8, ASK_V = 4 };

/* S = Q·Kᵀ of a tile on the bf16 dot path (gemm_panels_dot), asking for the next tile's K. */
static void scores_dot(const attention_job *job, block_scratch *w, const uint32_t *const *k_panels, int64_t ldp,
                       int rows, int n, const next_tile *next) {
    const int pairs = job->a->head_dim / 2, step = next->n && rows <= ASK_ROWS ? ASK_K : pairs;
    const int64_t q_pairs = cv_act_bf16_stride(job->a->head_dim) / 2;
    for (int p0 = 0; p0 < pairs; p0 += step) {
        const int kp = pairs - p0 < step ? pairs - p0 : step;
        const uint32_t *panels[MAX_CONTEXT_TILE / 16];
        for (int j = 0; j < n; j += 16) panels[j / 16] = k_panels[j / 16] + p0 * ldp;
        if (next->n) cv_kv_ask_k(&next->k, next->j0, next->n, p0, p0 + kp);
        job->ops->gemm_panels_dot(w->s, job->ctx_tile, w->qp + p0, q_pairs, panels, ldp, rows, n, kp, p0 > 0);
    }
}

/* O += P·V of a tile on the bf16 dot path (gemm_rows_dot over ⌈n/2⌉ position pairs, the numerators
 * lda pairs apart), asking for the next tile's V. */
static void values_dot(const attention_job *job, block_scratch *w, const uint32_t *const *v_pairs, int64_t lda,
                       int rows, int n, const next_tile *next) {
    const int pairs = (n + 1) / 2, step = next->n && rows <= ASK_ROWS ? ASK_V : pairs;
    for (int q0 = 0; q0 < pairs; q0 += step) {
        const int kq = pairs - q0 < step ? pairs - q0 : step;
        if (next->n) /* the last step asks for the rest of a longer next tile */
            cv_kv_ask_v(&next->v, next->j0, next->n, q0, q0 + kq < pairs ? q0 + kq : (next->n + 1) / 2);
        job->ops->gemm_rows_dot(w->o, job->a->head_dim, w->pp + q0, lda, v_pairs + q0, rows, job->a->head_dim, kq,
                                true);
    }
}

/* The lane-wise paths: the whole block against one context tile at a time; `after` is the thread's
 * tile after this unit's last. */
static void attend_lanes(const attention_job *job, block_scratch *w, int32_t s, int32_t t0, int32_t t1, int32_t g,
                         const next_tile *after) {
    const cv_attention_args *a = job->a;
    const cv_cpu_ops *ops = job->ops;
    const int hd = a->head_dim, group = job->group, rows = (t1 - t0) * group;
    const int32_t *table = a->block_tables[s];
    const bool dot = a->bf16_dot;
    const int CT = job->ctx_tile;
    const int32_t n_ctx = a->positions[t1 - 1] + 1; /* positions ascend within a sequence */
    const bool staged = n_ctx > 4 * CT;             /* an f32 cache: see fetch_rows */
    const float *kt_rows[CV_MAX_HEAD_DIM], *vrow[MAX_CONTEXT_TILE];
    const uint32_t *k_panels[MAX_CONTEXT_TILE / 16], *v_pairs[MAX_CONTEXT_TILE / 2];
    int64_t ldp = 0; /* of k_panels */
    const cv_kv_head kh = kv_head(job, a->k_cache, table, g), vh = kv_head(job, a->v_cache, table, g);
    for (int d = 0; d < hd; d++) kt_rows[d] = w->kt + (int64_t)d * CT;
    if (job->bf16 && !dot)
        for (int j = 0; j < CT; j++) vrow[j] = w->vf + (int64_t)j * hd;
    for (int32_t j0 = 0; j0 < n_ctx; j0 += CT) {
        const int n = n_ctx - j0 < CT ? n_ctx - j0 : CT;
        /* K's copy before V's ask: all of both asked at once measured slower */
        if (!job->bf16) {
            const float *krow[MAX_CONTEXT_TILE];
            const size_t row_bytes = (size_t)hd * sizeof(float);
            cache_rows(job, table, a->k_cache, j0, n, g, krow);
            cache_rows(job, table, a->v_cache, j0, n, g, vrow);
            fetch_rows(krow, n, row_bytes, w->ks, staged);
            fetch_rows(vrow, n, row_bytes, w->vs, staged);
            ops->transpose_rows(w->kt, CT, krow, n, hd);
        } else if (dot) {
            cv_kv_k_panels(&kh, j0, n, k_panels, &ldp, (uint32_t *)w->kt);
            cv_kv_v_pair_rows(&vh, j0, n, v_pairs, w->vp);
        } else {
            cv_kv_gather_k(&kh, j0, n, w->kw, CT);
            cv_kv_gather_v(&vh, j0, n, w->vp, hd, CT / 2);
            for (int p = 0; p < (hd + 1) / 2; p++) /* K word row p → f32 rows 2p, 2p+1 */
                ops->widen_pairs(w->kt + (int64_t)2 * p * CT, 2 * p + 1 < hd ? w->kt + (int64_t)(2 * p + 1) * CT : NULL,
                                 w->kw + (int64_t)p * CT, n);
            for (int q = 0; 2 * q < n; q++) /* V pair row q → f32 rows 2q, 2q+1 */
                ops->widen_pairs(w->vf + (int64_t)2 * q * hd, 2 * q + 1 < n ? w->vf + (int64_t)(2 * q + 1) * hd : NULL,
                                 w->vp + (int64_t)q * hd, hd);
        }
        const int32_t j1 = j0 + CT; /* the next tile's first position */
        const next_tile next = j1 >= n_ctx ? *after : (next_tile){kh, vh, j1, n_ctx - j1 < CT ? n_ctx - j1 : CT};
        if (dot) scores_dot(job, w, k_panels, ldp, rows, n, &next);
        else ops->gemm_rows(w->s, CT, w->q, hd, kt_rows, rows, n, hd, false);
        /* bf16 numerators: rows lda pairs apart, zero past each row's causal end to the row's end */
        const int64_t lda = cv_act_bf16_stride(n) / 2;
        for (int r = 0; r < rows; r++) {
            const int valid = a->positions[t0 + r / group] + 1 - j0; /* causal: keys up to the row's position */
            float *sr = w->s + (int64_t)r * CT;
            uint16_t *pr = dot ? (uint16_t *)(w->pp + r * lda) : NULL;
            const int nv = valid < 0 ? 0 : valid < n ? valid : n;
            if (nv > 0) softmax_step(job, &w->st[r], w->o + (int64_t)r * hd, sr, nv, pr);
            if (dot) memset(pr + nv, 0, (size_t)(2 * lda - nv) * sizeof *pr);
            else if (nv < n) memset(sr + nv, 0, (size_t)(n - nv) * sizeof *sr);
        }
        /* P·V over position pairs, an odd last position paired with zero (kv_layout.h) */
        if (dot) values_dot(job, w, v_pairs, lda, rows, n, &next);
        else ops->gemm_rows(w->o, hd, w->s, CT, vrow, rows, hd, n, true);
    }
}

static int32_t min32(int32_t x, int32_t y) { return x < y ? x : y; }

/* The AMX path. The K and V words of a chunk of AMX_CHUNK positions are copied into tiles once; then
 * each group of 32 rows (two AMX row tiles) goes through the chunk tile by tile: S = Q·Kᵀ into a
 * 32 × CT score block, the softmax step of each row writing its bf16 numerators straight into
 * pairs, and O += P·V — so scores and numerators never leave L1, and the 32 output rows stay hot
 * across the chunk's tiles. The products stop at the group's last position (rounded up to whole
 * tiles of 16 columns, or of 16 pairs in P·V, whose numerators are zero past each row's end): on
 * the diagonal tiles a group skips the masked half. A row still meets its context tile by tile in
 * order, each score one chain over head_dim and each output element one chain over positions
 * whose skipped steps would have added zero products only, so its bits do not depend on the rows
 * it is grouped with. */
static void attend_amx(const attention_job *job, block_scratch *w, int32_t s, int32_t t0, int32_t t1, int32_t g) {
    const cv_attention_args *a = job->a;
    const int hd = a->head_dim, group = job->group, rows = (t1 - t0) * group;
    const int32_t *table = a->block_tables[s];
    const int CT = job->ctx_tile;
    const int64_t q_pairs = cv_act_bf16_stride(hd) / 2, tile_words = (int64_t)hd / 2 * CT;
    const int32_t n_ctx = a->positions[t1 - 1] + 1;
    const cv_kv_head kh = kv_head(job, a->k_cache, table, g), vh = kv_head(job, a->v_cache, table, g);
    for (int32_t c0 = 0; c0 < n_ctx; c0 += AMX_CHUNK) {
        const int32_t c1 = min32(c0 + AMX_CHUNK, n_ctx);
        for (int32_t j0 = c0; j0 < c1; j0 += CT) { /* both as column tiles of 16 (cv_amx_gemm_pairs) */
            const int n = min32(CT, c1 - j0), pairs = (n + 1) / 2;
            uint32_t *kt = (uint32_t *)w->kt + (j0 - c0) / CT * tile_words, *vp = w->vp + (j0 - c0) / CT * tile_words;
            cv_kv_gather_k(&kh, j0, n, kt, 16);
            cv_kv_gather_v(&vh, j0, n, vp, 16, CT / 2);
            /* whole steps of 16 pairs read past n: zero V pairs there meet the numerators' zeros */
            for (int d0 = 0; d0 < hd; d0 += 16)
                memset(vp + (int64_t)d0 / 16 * (CT / 2 * 16) + (int64_t)pairs * 16, 0,
                       (size_t)(CT / 2 - pairs) * 16 * sizeof *vp);
        }
        for (int r0 = 0; r0 < rows; r0 += AMX_SUB_ROWS) {
            const int m = rows - r0 < AMX_SUB_ROWS ? rows - r0 : AMX_SUB_ROWS;
            const int32_t last = a->positions[t0 + (r0 + m - 1) / group]; /* the group's last position */
            float *o = w->o + (int64_t)r0 * hd;
            for (int32_t j0 = c0; j0 < c1 && j0 <= last; j0 += CT) {
                const int n = min32(CT, c1 - j0), reach = min32(n, last + 1 - j0);
                const uint32_t *kt = (const uint32_t *)w->kt + (j0 - c0) / CT * tile_words;
                const uint32_t *vp = w->vp + (j0 - c0) / CT * tile_words;
                cv_amx_gemm_pairs(w->s, CT, w->qp + r0 * q_pairs, q_pairs, kt, hd / 2 * 16, m, (reach + 15) / 16 * 16,
                                  hd / 2, false);
                const int kp = ((reach + 1) / 2 + 15) / 16 * 16; /* pairs of P·V */
                for (int i = 0; i < m; i++) {
                    const int r = r0 + i;
                    const int valid = a->positions[t0 + r / group] + 1 - j0;
                    const int nv = valid < 0 ? 0 : valid < n ? valid : n;
                    uint16_t *pr = (uint16_t *)(w->pp + (int64_t)i * (CT / 2));
                    if (nv > 0) softmax_step(job, &w->st[r], w->o + (int64_t)r * hd, w->s + (int64_t)i * CT, nv, pr);
                    memset(pr + nv, 0, (size_t)(2 * kp - nv) * sizeof *pr);
                }
                cv_amx_gemm_pairs(o, hd, w->pp, CT / 2, vp, CT / 2 * 16, m, hd, kp, true);
            }
        }
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

/* Unit u: sequence s, KV head g, tokens [t0, t1). */
typedef struct unit {
    int32_t s, g, t0, t1;
} unit;

static unit unit_at(const attention_job *job, int64_t u) {
    const cv_attention_args *a = job->a;
    const int32_t s = sequence_of_unit(job, u);
    const int32_t first = a->seq_start[s], n = a->seq_start[s + 1] - first;
    const int64_t local = u - job->unit_start[s];
    const int32_t g = (int32_t)(local % a->n_kv_heads), block = (int32_t)(local / a->n_kv_heads);
    const int32_t t0 = first + block * job->block_tokens;
    return (unit){s, g, t0, t0 + job->block_tokens < first + n ? t0 + job->block_tokens : first + n};
}

/* Unit u's first tile. */
static next_tile first_tile(const attention_job *job, int64_t u) {
    const cv_attention_args *a = job->a;
    const unit x = unit_at(job, u);
    const int32_t n_ctx = a->positions[x.t1 - 1] + 1;
    const int32_t *table = a->block_tables[x.s];
    return (next_tile){kv_head(job, a->k_cache, table, x.g), kv_head(job, a->v_cache, table, x.g), 0,
                       n_ctx < job->ctx_tile ? n_ctx : job->ctx_tile};
}

static void run_unit(const attention_job *job, block_scratch *w, int64_t u, const next_tile *after) {
    const unit x = unit_at(job, u);
    if (job->store_in_units) cv_kv_store(&job->rows, x.t0, x.t1, x.g, x.g + 1);
    start_block(job, w, x.t0, x.t1, x.g);
    if (job->amx) attend_amx(job, w, x.s, x.t0, x.t1, x.g);
    else attend_lanes(job, w, x.s, x.t0, x.t1, x.g, after);
    finish_block(job, w, x.t0, x.t1, x.g);
}

static void attention_task(void *arg, int ti, int nt) {
    const attention_job *job = arg;
    const cv_attention_args *a = job->a;
    const int64_t rows = (int64_t)job->block_tokens * job->group, hd = a->head_dim, CT = job->ctx_tile;
    /* AMX: the K and V word tiles of a whole chunk, and the scores and numerators of one row group */
    const int64_t kt_words = job->amx ? hd / 2 * AMX_CHUNK : hd * CT;
    const int64_t vp_words = job->amx ? hd / 2 * AMX_CHUNK : hd * CT / 2;
    const int64_t s_rows = job->amx ? AMX_SUB_ROWS : rows, q_rows = a->bf16_dot ? 1 : rows;
    const bool widen = job->bf16 && !a->bf16_dot; /* f32 products over a bf16 cache */
    const int64_t vf_floats = widen ? CT * hd : 0, kw_words = widen ? (hd + 1) / 2 * CT : 0;
    /* an f32 cache: on the stack, not with the buffers below: 64 KiB more per call took those past
     * glibc's trim threshold, and every call paid page faults for them again */
    _Alignas(64) char stage[2][STAGE_BYTES];
    /* tens to hundreds of KiB per thread and call: abort on failure like cv_xmalloc */
    float *buf = cv_xmalloc((size_t)(q_rows * hd + rows * hd + kt_words + s_rows * CT + vf_floats) * sizeof(float));
    /* AMX reads whole tiles of K words: positions past a tile's end hold earlier tiles' or these
     * zeros, never uninitialized bytes */
    if (job->amx) memset(buf + q_rows * hd + rows * hd, 0, (size_t)kt_words * sizeof(float));
    block_scratch w = {.q = buf, .o = buf + q_rows * hd, .kt = buf + q_rows * hd + rows * hd,
                       .s = buf + q_rows * hd + rows * hd + kt_words,
                       .vf = buf + q_rows * hd + rows * hd + kt_words + s_rows * CT,
                       .st = cv_xmalloc((size_t)rows * sizeof(head_state)), .ks = stage[0], .vs = stage[1]};
    uint32_t *words = NULL;
    if (job->bf16) {
        const int64_t q_words = a->bf16_dot ? rows * (cv_act_bf16_stride(hd) / 2) : 0;
        const int64_t p_words = a->bf16_dot ? s_rows * CT / 2 : 0;
        words = cv_xmalloc((size_t)(q_words + p_words + vp_words + kw_words) * sizeof(uint32_t));
        w.qp = words;
        w.pp = words + q_words;
        w.vp = w.pp + p_words;
        w.kw = w.vp + vp_words;
    }
    const int64_t units = job->unit_start[a->n_seqs];
    const bool ask = a->bf16_dot && !job->amx; /* the tiles' lines asked for ahead (next_tile) */
    if (ask && ti < units) { /* the first tile: nothing to multiply meanwhile */
        const next_tile first = first_tile(job, ti);
        cv_kv_ask_k(&first.k, 0, first.n, 0, a->head_dim / 2);
        cv_kv_ask_v(&first.v, 0, first.n, 0, (first.n + 1) / 2);
    }
    for (int64_t u = ti; u < units; u += nt) {
        const next_tile after = ask && u + nt < units ? first_tile(job, u + nt) : (next_tile){.n = 0};
        run_unit(job, &w, u, &after);
    }
    free(w.st);
    free(words);
    free(buf);
}

void cv_attention(cv_threadpool *pool, const cv_attention_args *a) {
    assert(a->n_kv_heads > 0 && a->n_heads % a->n_kv_heads == 0 && a->block_size > 0);
    assert(a->kv_dtype == CV_DTYPE_F32 || a->kv_dtype == CV_DTYPE_BF16);
    assert(!a->out_bf16 || (int64_t)a->n_heads * a->head_dim % 32 == 0);
    assert(!a->q_bf16 || a->bf16_dot);
    assert(!a->k_new || (a->v_new && a->slot_mapping));
    assert(a->head_dim > 0 && a->head_dim <= CV_MAX_HEAD_DIM);
    assert(!a->bf16_dot || (a->kv_dtype == CV_DTYPE_BF16 && a->head_dim % 2 == 0 && cv_cpu_ops_active()->gemm_rows_dot &&
                            cv_cpu_ops_active()->gemm_panels_dot && cv_cpu_ops_active()->exp_sum_bf16));
    if (a->n_tokens <= 0) return;
    attention_job job = {.a = a, .ops = cv_cpu_ops_active(), .group = a->n_heads / a->n_kv_heads,
                         .bf16 = a->kv_dtype == CV_DTYPE_BF16};
    job.amx = a->bf16_dot && a->head_dim % 32 == 0 && cv_cpu_amx();
    job.ctx_tile = job.amx ? AMX_CONTEXT_TILE : CONTEXT_TILE;
    const int block_rows = job.amx ? AMX_BLOCK_ROWS : BLOCK_ROWS;
    job.block_tokens = block_rows / job.group > 1 ? block_rows / job.group : 1;
    job.store_in_units = a->k_new != NULL;
    job.unit_start = cv_xmalloc(((size_t)a->n_seqs + 1) * sizeof *job.unit_start);
    job.unit_start[0] = 0;
    for (int32_t s = 0; s < a->n_seqs; s++) {
        int32_t n = a->seq_start[s + 1] - a->seq_start[s];
        int32_t blocks = (n + job.block_tokens - 1) / job.block_tokens;
        job.unit_start[s + 1] = job.unit_start[s] + blocks * a->n_kv_heads;
        if (blocks > 1) job.store_in_units = false;
    }
    /* store_in_units: one unit a sequence and KV head, the only reader of the rows it stores */
    job.rows = (cv_kv_rows){a->k_cache, a->v_cache, a->kv_dtype, a->k_new, a->v_new, a->slot_mapping,
                            a->n_kv_heads, a->head_dim, a->block_size};
    if (a->k_new && !job.store_in_units)
        cv_kv_write(pool, a->k_cache, a->v_cache, a->kv_dtype, a->k_new, a->v_new, a->slot_mapping, a->n_tokens,
                    a->n_kv_heads, a->head_dim, a->block_size);
    cv_threadpool_run(pool, attention_task, &job);
    free(job.unit_start);
}
