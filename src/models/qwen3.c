/*
 * qwen3.c — Qwen3ForCausalLM (dense Qwen3): weights and one forward pass in kernels.
 *
 * Per layer (qwen-arch.md §2.3): RMSNorm → q/k/v projections → per-head RMSNorm of q and k →
 * rotate-half RoPE → K/V into the paged cache → causal GQA → o_proj + residual → RMSNorm → SwiGLU
 * MLP + residual; then the final norm and lm_head (embed_tokens when tied) for the rows whose logits
 * are wanted only.
 *
 * Numerics: the residual stream and every activation stay f32 and the weights are read in their
 * checkpoint dtype by the kernels, so the result follows Hugging Face's f32 reference to rounding
 * (it does not reproduce the bf16-activation rounding of a bf16 HF run; that is a deliberate choice
 * for accuracy, see §2.4 item 10).
 *
 * Weights: f32/f16 matrices are views into the checkpoint mapping. bf16 matrices — the common
 * case, and the one the speed targets are about — are repacked once at load into the kernels'
 * 16-row panels (kernels.h), stacked where one call can serve several outputs: q|k|v and
 * gate|up are one matmul each. Packing costs one pass over the weights and fresh memory for the
 * copy, and buys the lane-wise f32 kernel that runs prefill at several times the row-major kernel's
 * rate. The originals are dropped from memory once packed (madvise DONTNEED: file pages simply
 * leave the process; a dummy source's buffers are never read again), so resident weights stay ~1×
 * their size. A checkpoint's packing goes into the packed-weight cache (loader/pack_cache.h), so a
 * later load maps it and starts without packing or allocating. A tied embedding is read back from
 * the packed lm_head.
 *
 * Fusions: the residual add is folded into the next RMSNorm (one pass over the residual stream),
 * q/k RMSNorm and RoPE are one pass per head, SwiGLU runs on the pool over the gate|up output.
 * Each op is timed into the kernels' profile (kernels/profile.h) when profiling is on.
 *
 * Memory: the activation scratch is sized for max_num_batched_tokens at load and only grows if a
 * larger batch ever arrives, so a steady-state forward() allocates nothing.
 *
 * The batch is validated up front (token ids, slots, positions, block tables, logit rows), because
 * the kernels below trust their indices and a bad one would otherwise be a wild memory access.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t for streaming */
#include <xxhash.h>

#include "base/error.h"
#include "kernels/kernels.h"
#include "kernels/profile.h"
#include "loader/pack_cache.h"
#include "models/architectures.h"

enum { MAX_PARTS = 3, MAX_HEAD_DIM = 1024 };

/* One or more projections of the same input: packed together into panels (one call for all), or
 * row-major views computed one by one. */
typedef struct qwen3_linear {
    int n_parts;
    cv_matrix parts[MAX_PARTS];
    cv_panels packed;          /* .data NULL: not packed */
} qwen3_linear;

typedef struct qwen3_layer {
    const float *input_norm, *post_attention_norm, *q_norm, *k_norm;
    qwen3_linear qkv, o_proj, gate_up, down_proj;
} qwen3_layer;

/* Activations for up to `capacity` tokens, each a [capacity][width] f32 array. */
typedef struct qwen3_scratch {
    int32_t capacity;
    float *x;          /* residual stream [H] */
    float *a;          /* normed input [H] */
    float *o;          /* block output, added to x by the next norm [H] */
    float *q, *attn;   /* [nh·hd] */
    float *k, *v;      /* [nkv·hd] */
    float *gate_up;    /* gate [capacity][I] then up [capacity][I] */
    float *h;          /* SwiGLU output [I] */
    float *cos, *sin;  /* [rot_dim/2] */
} qwen3_scratch;

typedef struct qwen3_model {
    cv_model base;
    int32_t hidden, n_layers, n_heads, n_kv_heads, head_dim, intermediate, vocab;
    float eps;
    cv_matrix embed;       /* .data NULL when tied and read from the packed lm_head */
    qwen3_linear lm_head;
    const float *final_norm;
    qwen3_layer *layers;
    cv_rope rope;
    qwen3_scratch s;
    cv_pack_cache *pack_cache; /* backs the packed weights when caching (NULL: anonymous memory) */
} qwen3_model;

/* ---- loading --------------------------------------------------------------------------------- */

typedef struct binder {
    cv_weight_source *src;
    size_t matmul_bytes;
    int rc;
} binder;

static void bind_matrix(binder *b, const char *name, int64_t rows, int64_t cols, const char *hint, cv_matrix *out) {
    if (b->rc) return;
    cv_tensor t;
    int64_t shape[2] = {rows, cols};
    b->rc = cv_weights_get(b->src, name, 2, shape, hint, &t);
    if (b->rc) return;
    if (!cv_matrix_dtype_supported(t.dtype)) {
        b->rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "tensor %s has dtype %s; matmul weights must be F32, BF16 or F16",
                        name, cv_dtype_name(t.dtype));
        return;
    }
    *out = (cv_matrix){t.data, t.dtype, rows, cols};
    b->matmul_bytes += t.nbytes;
}

static void bind_gain(binder *b, const char *name, int64_t dim, const char *hint, const float **out) {
    if (b->rc) return;
    b->rc = cv_weights_get_f32(b->src, name, 1, &dim, hint, out);
}

/* Returns the whole pages inside [p, p + n) to the kernel: a file mapping re-reads them if ever
 * touched again, anonymous memory reads back zeros (so only for weights never read again). */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = ((uintptr_t)p + page - 1) / page * page, end = ((uintptr_t)p + n) / page * page;
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
}

static bool packable(const qwen3_linear *l) {
    for (int j = 0; j < l->n_parts; j++)
        if (l->parts[j].dtype != CV_DTYPE_BF16 || (j < l->n_parts - 1 && l->parts[j].rows % CV_PANEL_ROWS))
            return false;
    return true;
}

static void bind_layer(binder *b, const qwen3_model *m, int l, qwen3_layer *ly) {
    const int64_t H = m->hidden, q_dim = (int64_t)m->n_heads * m->head_dim, kv_dim = (int64_t)m->n_kv_heads * m->head_dim;
    char name[160];
#define LAYER_NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), name)
    bind_gain(b, LAYER_NAME("input_layernorm.weight"), H, "hidden_size", &ly->input_norm);
    ly->qkv.n_parts = 3;
    bind_matrix(b, LAYER_NAME("self_attn.q_proj.weight"), q_dim, H, "num_attention_heads*head_dim, hidden_size",
                &ly->qkv.parts[0]);
    bind_matrix(b, LAYER_NAME("self_attn.k_proj.weight"), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                &ly->qkv.parts[1]);
    bind_matrix(b, LAYER_NAME("self_attn.v_proj.weight"), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                &ly->qkv.parts[2]);
    ly->o_proj.n_parts = 1;
    bind_matrix(b, LAYER_NAME("self_attn.o_proj.weight"), H, q_dim, "hidden_size, num_attention_heads*head_dim",
                &ly->o_proj.parts[0]);
    bind_gain(b, LAYER_NAME("self_attn.q_norm.weight"), m->head_dim, "head_dim", &ly->q_norm);
    bind_gain(b, LAYER_NAME("self_attn.k_norm.weight"), m->head_dim, "head_dim", &ly->k_norm);
    bind_gain(b, LAYER_NAME("post_attention_layernorm.weight"), H, "hidden_size", &ly->post_attention_norm);
    ly->gate_up.n_parts = 2;
    bind_matrix(b, LAYER_NAME("mlp.gate_proj.weight"), m->intermediate, H, "intermediate_size, hidden_size",
                &ly->gate_up.parts[0]);
    bind_matrix(b, LAYER_NAME("mlp.up_proj.weight"), m->intermediate, H, "intermediate_size, hidden_size",
                &ly->gate_up.parts[1]);
    ly->down_proj.n_parts = 1;
    bind_matrix(b, LAYER_NAME("mlp.down_proj.weight"), H, m->intermediate, "hidden_size, intermediate_size",
                &ly->down_proj.parts[0]);
#undef LAYER_NAME
}

static int bind_weights(qwen3_model *m, const cv_model_config *cfg, cv_weight_source *src) {
    binder b = {.src = src};
    bind_matrix(&b, "model.embed_tokens.weight", m->vocab, m->hidden, "vocab_size, hidden_size", &m->embed);
    b.matmul_bytes = 0; /* the embedding is gathered one row per token, not streamed */
    m->lm_head.n_parts = 1;
    /* Tied: Hugging Face ties lm_head to embed_tokens and ignores any stored copy; so do we. */
    if (cfg->tie_word_embeddings) {
        m->lm_head.parts[0] = m->embed;
        b.matmul_bytes += (size_t)m->vocab * (size_t)m->hidden * cv_dtype_size(m->embed.dtype);
    } else {
        bind_matrix(&b, "lm_head.weight", m->vocab, m->hidden, "vocab_size, hidden_size (tie_word_embeddings=false)",
                    &m->lm_head.parts[0]);
    }
    for (int l = 0; l < m->n_layers; l++) bind_layer(&b, m, l, &m->layers[l]);
    bind_gain(&b, "model.norm.weight", m->hidden, "hidden_size", &m->final_norm);
    m->base.weight_bytes = b.matmul_bytes;
    return b.rc;
}

/* ---- packing ---------------------------------------------------------------------------------- */

/* Bump when the packed bytes of the same checkpoint would change (panel format, what is stacked). */
#define QWEN3_PACK_LAYOUT "qwen3 panels v1: lm_head, then per layer q|k|v, o, gate|up, down"

static bool is_tied(const qwen3_model *m) { return m->lm_head.parts[0].data == m->embed.data; }

/* The linears to pack, lm_head first: it is the largest, and packing it before the layers' pages
 * are touched keeps the load's peak memory near 1× the weights. Returns how many. */
static int packable_linears(qwen3_model *m, qwen3_linear **out) {
    int n = 0;
    if (packable(&m->lm_head)) out[n++] = &m->lm_head;
    for (int l = 0; l < m->n_layers; l++) {
        qwen3_layer *ly = &m->layers[l];
        qwen3_linear *lins[] = {&ly->qkv, &ly->o_proj, &ly->gate_up, &ly->down_proj};
        for (size_t i = 0; i < CV_ARRAY_LEN(lins); i++)
            if (packable(lins[i])) out[n++] = lins[i];
    }
    return n;
}

/* What the cache key must cover besides the checkpoint files: the format, which tensor lm_head is
 * (a tied load of an untied checkpoint packs embed_tokens, of the same shape) and every shape. */
static uint64_t pack_layout_hash(bool tied, qwen3_linear *const *lins, int n) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, QWEN3_PACK_LAYOUT, sizeof QWEN3_PACK_LAYOUT);
    XXH3_64bits_update(&st, &tied, sizeof tied);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < lins[i]->n_parts; j++) {
            const int64_t shape[3] = {j, lins[i]->parts[j].rows, lins[i]->parts[j].cols};
            XXH3_64bits_update(&st, shape, sizeof shape);
        }
    return XXH3_64bits_digest(&st);
}

/* Opens the packed-weight cache for this checkpoint (NULL for dummy weights or when unavailable). */
static cv_pack_cache *open_pack_cache(const qwen3_model *m, cv_weight_source *src, qwen3_linear *const *lins, int n,
                                      cv_threadpool *pool) {
    const size_t n_files = cv_weight_source_n_files(src);
    if (!n_files || !n) return NULL;
    const char **files = cv_xmalloc(n_files * sizeof *files);
    for (size_t i = 0; i < n_files; i++) files[i] = cv_weight_source_file(src, i);
    size_t *sizes = cv_xmalloc((size_t)n * sizeof *sizes);
    for (int i = 0; i < n; i++)
        sizes[i] = cv_panels_bytes(cv_panels_stacked_rows(lins[i]->parts, lins[i]->n_parts), lins[i]->parts[0].cols);
    cv_pack_cache *c = cv_pack_cache_open(files, n_files, pack_layout_hash(is_tied(m), lins, n), sizes, n, pool);
    free(sizes);
    free(files);
    return c;
}

/* Packs every bf16 linear into panels — into the cache's file when there is one, mapped as is on a
 * hit — and drops the originals from memory. */
static int pack_weights(qwen3_model *m, cv_weight_source *src, cv_threadpool *pool) {
    qwen3_linear **lins = cv_xmalloc(sizeof *lins * (size_t)(1 + 4 * m->n_layers));
    const int n = packable_linears(m, lins);
    m->pack_cache = open_pack_cache(m, src, lins, n, pool);
    const bool hit = m->pack_cache && cv_pack_cache_hit(m->pack_cache);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        qwen3_linear *l = lins[i];
        if (hit) {
            l->packed = (cv_panels){cv_pack_cache_section(m->pack_cache, i),
                                    cv_panels_stacked_rows(l->parts, l->n_parts), l->parts[0].cols, false};
            continue; /* the originals were never touched */
        }
        rc = m->pack_cache ? cv_panels_pack_into(pool, l->parts, l->n_parts, cv_pack_cache_section(m->pack_cache, i),
                                                 &l->packed)
                           : cv_panels_pack(pool, l->parts, l->n_parts, &l->packed);
        for (int j = 0; j < l->n_parts && !rc; j++)
            drop_pages(l->parts[j].data, (size_t)(l->parts[j].rows * l->parts[j].cols) * sizeof(uint16_t));
    }
    if (!rc && m->pack_cache && !hit) cv_pack_cache_commit(m->pack_cache, pool);
    if (!rc && m->lm_head.packed.data && is_tied(m))
        m->embed = (cv_matrix){0}; /* tied: rows now come from the panels */
    free(lins);
    return rc;
}

static int check_config(const cv_model_config *cfg) {
    if (cfg->hidden_size <= 0 || cfg->num_hidden_layers <= 0 || cfg->num_attention_heads <= 0 ||
        cfg->num_key_value_heads <= 0 || cfg->head_dim <= 0 || cfg->intermediate_size <= 0 || cfg->vocab_size <= 0)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: Qwen3 needs positive hidden_size, num_hidden_layers, "
                                         "num_attention_heads, num_key_value_heads, head_dim, intermediate_size "
                                         "and vocab_size");
    if (cfg->num_attention_heads % cfg->num_key_value_heads)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: num_attention_heads=%d is not a multiple of num_key_value_heads=%d",
                       cfg->num_attention_heads, cfg->num_key_value_heads);
    if (cfg->attention_bias)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: attention_bias=true is not supported for Qwen3ForCausalLM");
    if (!(cfg->rms_norm_eps > 0)) return cv_fail(CVLLM_ERR_FORMAT, "config.json: rms_norm_eps must be positive");
    if (cfg->head_dim > MAX_HEAD_DIM)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: head_dim=%d is larger than the supported %d", cfg->head_dim,
                       MAX_HEAD_DIM);
    return 0;
}

static cv_rope_kind rope_kind(cv_rope_type t) {
    switch (t) {
    case CV_ROPE_LINEAR: return CV_ROPE_KIND_LINEAR;
    case CV_ROPE_DYNAMIC: return CV_ROPE_KIND_DYNAMIC;
    case CV_ROPE_YARN: return CV_ROPE_KIND_YARN;
    default: return CV_ROPE_KIND_DEFAULT;
    }
}

static int init_rope(qwen3_model *m, const cv_rope_config *rc) {
    cv_rope_params p = {
        .kind = rope_kind(rc->type),
        .theta = rc->theta,
        .factor = rc->factor,
        .original_max_position = rc->original_max_position,
        .beta_fast = rc->beta_fast,
        .beta_slow = rc->beta_slow,
        .attention_factor = rc->attention_factor,
        .rot_dim = (int32_t)(m->head_dim * rc->partial_rotary_factor), /* HF: int(head_dim · factor) */
    };
    int rc_ = cv_rope_init(&m->rope, &p);
    return rc_ ? cv_fail_prefix(rc_, "config.json rope") : 0;
}

static void free_scratch(qwen3_scratch *s) {
    float **bufs[] = {&s->x, &s->a, &s->o, &s->q, &s->attn, &s->k, &s->v, &s->gate_up, &s->h, &s->cos, &s->sin};
    for (size_t i = 0; i < CV_ARRAY_LEN(bufs); i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    s->capacity = 0;
}

static int reserve_scratch(qwen3_model *m, int32_t tokens) {
    qwen3_scratch *s = &m->s;
    if (tokens <= s->capacity) return 0;
    free_scratch(s);
    const int64_t q_dim = (int64_t)m->n_heads * m->head_dim, kv_dim = (int64_t)m->n_kv_heads * m->head_dim;
    struct { float **buf; int64_t width; } plan[] = {
        {&s->x, m->hidden}, {&s->a, m->hidden}, {&s->o, m->hidden}, {&s->q, q_dim}, {&s->attn, q_dim},
        {&s->k, kv_dim}, {&s->v, kv_dim}, {&s->gate_up, 2 * (int64_t)m->intermediate}, {&s->h, m->intermediate},
        {&s->cos, m->rope.rot_dim / 2}, {&s->sin, m->rope.rot_dim / 2},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(plan); i++) {
        size_t bytes = (size_t)tokens * (size_t)plan[i].width * sizeof(float);
        *plan[i].buf = cv_aligned_alloc(bytes);
        if (!*plan[i].buf) {
            free_scratch(s);
            return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes of activations for %d tokens", bytes, tokens);
        }
    }
    s->capacity = tokens;
    return 0;
}

static void qwen3_destroy(cv_model *base) {
    qwen3_model *m = (qwen3_model *)base;
    free_scratch(&m->s);
    for (int l = 0; l < m->n_layers; l++) {
        qwen3_layer *ly = &m->layers[l];
        qwen3_linear *lins[] = {&ly->qkv, &ly->o_proj, &ly->gate_up, &ly->down_proj};
        for (size_t i = 0; i < CV_ARRAY_LEN(lins); i++) cv_panels_release(&lins[i]->packed);
    }
    cv_panels_release(&m->lm_head.packed);
    cv_pack_cache_close(m->pack_cache);
    cv_rope_free(&m->rope);
    free(m->layers);
    free(m);
}

/* ---- forward ---------------------------------------------------------------------------------- */

static int check_sequence(const qwen3_model *m, const cv_batch *b, const cv_kv_cache *kv, int32_t s) {
    const int32_t begin = b->seq_start[s], end = b->seq_start[s + 1];
    if (begin > end) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: seq_start is not ascending at sequence %d", s);
    const int32_t ctx = b->context_lens[s];
    const int64_t n_blocks = ((int64_t)ctx + kv->block_size - 1) / kv->block_size;
    for (int64_t j = 0; j < n_blocks; j++)
        if (b->block_tables[s][j] < 0 || b->block_tables[s][j] >= kv->num_blocks)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: sequence %d block %lld is %d, outside [0, %d)", s,
                           (long long)j, b->block_tables[s][j], kv->num_blocks);
    for (int32_t t = begin; t < end; t++) {
        int32_t p = b->positions[t];
        if (p < 0 || p >= ctx)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: token %d has position %d outside its context of %d",
                           t, p, ctx);
        if (t > begin && p <= b->positions[t - 1])
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: positions of sequence %d are not increasing", s);
        int64_t slot = (int64_t)b->block_tables[s][p / kv->block_size] * kv->block_size + p % kv->block_size;
        if (b->slot_mapping[t] != slot)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "batch: token %d (position %d) maps to slot %lld but its block table says %lld", t, p,
                           (long long)b->slot_mapping[t], (long long)slot);
        if (b->token_ids[t] < 0 || b->token_ids[t] >= m->vocab)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: token id %d is outside the vocabulary [0, %d)",
                           b->token_ids[t], m->vocab);
    }
    return 0;
}

static int check_batch(const qwen3_model *m, const cv_batch *b, const cv_kv_cache *kv) {
    if (b->n_tokens < 0 || b->n_seqs < 0 || b->n_logits < 0 || (b->n_tokens > 0 && b->n_seqs == 0))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: negative counts or tokens without sequences");
    if (kv->block_size <= 0 || kv->num_blocks <= 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "KV cache has no blocks");
    for (int l = 0; l < m->n_layers; l++)
        if (!kv->k[l] || !kv->v[l]) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "KV cache layer %d is missing", l);
    if (b->n_seqs > 0 && (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: seq_start must run from 0 to n_tokens=%d", b->n_tokens);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int rc = check_sequence(m, b, kv, s);
        if (rc) return rc;
    }
    for (int32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: logit row %d is outside [0, %d)", b->logit_rows[i],
                           b->n_tokens);
    return 0;
}

/* ys[j] = x · parts[j]ᵀ for every part. */
static void linear_forward(cv_threadpool *pool, const qwen3_linear *l, const float *x, int64_t T, float *const *ys) {
    if (l->packed.data) {
        int64_t rows[MAX_PARTS];
        for (int j = 0; j < l->n_parts; j++) rows[j] = l->parts[j].rows;
        cv_matmul_panels_parts(pool, &l->packed, x, T, l->n_parts, rows, ys);
        return;
    }
    for (int j = 0; j < l->n_parts; j++) cv_matmul(pool, &l->parts[j], x, T, ys[j]);
}

/* Runs `call` and charges its time to profile op `kind` (a no-op clock read when profiling is off). */
#define TIMED(kind, call)                          \
    do {                                           \
        uint64_t t0_ = cv_profile_begin();         \
        call;                                      \
        cv_profile_end(kind, t0_);                 \
    } while (0)

/* Layer input: x += the previous block's output (none before layer 0), a = input_norm(x). */
static void attention_block(qwen3_model *m, const qwen3_layer *ly, int l, const cv_batch *b, cv_kv_cache *kv) {
    qwen3_scratch *s = &m->s;
    const int32_t T = b->n_tokens, hd = m->head_dim;
    const int64_t q_dim = (int64_t)m->n_heads * hd, kv_dim = (int64_t)m->n_kv_heads * hd;
    cv_threadpool *pool = m->base.pool;
    TIMED(CV_OP_NORM, cv_add_rmsnorm(pool, s->x, l ? s->o : NULL, s->a, ly->input_norm, T, m->hidden, m->eps));
    float *qkv[] = {s->q, s->k, s->v};
    TIMED(CV_OP_QKV_PROJ, linear_forward(pool, &ly->qkv, s->a, T, qkv));
    TIMED(CV_OP_QK_NORM_ROPE, {
        cv_rmsnorm_rope(pool, &m->rope, s->q, q_dim, s->q, q_dim, T, m->n_heads, hd, ly->q_norm, m->eps, s->cos, s->sin);
        cv_rmsnorm_rope(pool, &m->rope, s->k, kv_dim, s->k, kv_dim, T, m->n_kv_heads, hd, ly->k_norm, m->eps, s->cos,
                        s->sin);
    });
    TIMED(CV_OP_KV_WRITE, cv_kv_write(kv->k[l], kv->v[l], s->k, s->v, b->slot_mapping, T, kv_dim));
    cv_attention_args args = {
        .n_tokens = T, .n_seqs = b->n_seqs, .seq_start = b->seq_start, .positions = b->positions,
        .block_tables = b->block_tables, .block_size = kv->block_size, .n_heads = m->n_heads,
        .n_kv_heads = m->n_kv_heads, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .q = s->q,
        .k_cache = kv->k[l], .v_cache = kv->v[l], .out = s->attn,
    };
    TIMED(CV_OP_ATTENTION, cv_attention(pool, &args));
    TIMED(CV_OP_O_PROJ, linear_forward(pool, &ly->o_proj, s->attn, T, &s->o));
}

static void mlp_block(qwen3_model *m, const qwen3_layer *ly, int32_t T) {
    qwen3_scratch *s = &m->s;
    cv_threadpool *pool = m->base.pool;
    const int64_t I = m->intermediate;
    TIMED(CV_OP_NORM, cv_add_rmsnorm(pool, s->x, s->o, s->a, ly->post_attention_norm, T, m->hidden, m->eps));
    float *gate_up[] = {s->gate_up, s->gate_up + (int64_t)s->capacity * I};
    TIMED(CV_OP_GATE_UP_PROJ, linear_forward(pool, &ly->gate_up, s->a, T, gate_up));
    TIMED(CV_OP_SWIGLU, cv_swiglu(pool, s->h, s->gate_up, T, I, I, (int64_t)s->capacity * I));
    TIMED(CV_OP_DOWN_PROJ, linear_forward(pool, &ly->down_proj, s->h, T, &s->o));
}

static void embed_tokens(const qwen3_model *m, const int32_t *ids, int32_t n, float *out) {
    if (m->embed.data) cv_embed(&m->embed, ids, n, out);
    else cv_embed_panels(&m->lm_head.packed, ids, n, out);
}

static int qwen3_forward(cv_model *base, const cv_batch *b, cv_kv_cache *kv, cv_state_cache *state, float *logits) {
    qwen3_model *m = (qwen3_model *)base;
    int rc = check_batch(m, b, kv);
    if (!rc) rc = reserve_scratch(m, b->n_tokens > b->n_logits ? b->n_tokens : b->n_logits);
    if (rc || b->n_tokens == 0) return rc;
    qwen3_scratch *s = &m->s;
    const int32_t T = b->n_tokens;
    const int64_t H = m->hidden;
    TIMED(CV_OP_EMBED, {
        embed_tokens(m, b->token_ids, T, s->x);
        cv_rope_cos_sin(&m->rope, b->positions, T, s->cos, s->sin);
    });
    for (int l = 0; l < m->n_layers; l++) {
        attention_block(m, &m->layers[l], l, b, kv);
        mlp_block(m, &m->layers[l], T);
    }
    /* The last residual add and the final norm, for the rows whose logits are wanted only. */
    TIMED(CV_OP_NORM, for (int32_t i = 0; i < b->n_logits; i++) {
        const int64_t r = b->logit_rows[i];
        float *row = s->a + (int64_t)i * H; /* x itself stays: a row may be asked for twice */
        memcpy(row, s->x + r * H, (size_t)H * sizeof *row);
        cv_add_rmsnorm(NULL, row, s->o + r * H, row, m->final_norm, 1, H, m->eps);
    });
    TIMED(CV_OP_LM_HEAD, linear_forward(base->pool, &m->lm_head, s->a, b->n_logits, &logits));
    return 0;
}

static const cv_model_ops qwen3_ops = {.forward = qwen3_forward, .destroy = qwen3_destroy};

int cv_qwen3_load(const cv_model_load_params *p, cv_model **out) {
    const cv_model_config *cfg = p->config;
    int rc = check_config(cfg);
    if (rc) return rc;
    qwen3_model *m = cv_xcalloc(1, sizeof *m);
    m->base = (cv_model){.ops = &qwen3_ops, .config = cfg, .vocab_size = cfg->vocab_size, .pool = p->pool};
    m->base.kv_spec = (cv_kv_spec){cfg->num_hidden_layers, cfg->num_key_value_heads, cfg->head_dim};
    m->hidden = cfg->hidden_size;
    m->n_layers = cfg->num_hidden_layers;
    m->n_heads = cfg->num_attention_heads;
    m->n_kv_heads = cfg->num_key_value_heads;
    m->head_dim = cfg->head_dim;
    m->intermediate = cfg->intermediate_size;
    m->vocab = cfg->vocab_size;
    m->eps = (float)cfg->rms_norm_eps;
    m->layers = cv_xcalloc((size_t)m->n_layers, sizeof *m->layers);
    rc = init_rope(m, &cfg->rope);
    if (!rc) rc = bind_weights(m, cfg, p->weights);
    if (!rc) rc = pack_weights(m, p->weights, p->pool);
    if (!rc) rc = reserve_scratch(m, p->max_num_batched_tokens);
    if (rc) {
        qwen3_destroy(&m->base);
        return rc;
    }
    *out = &m->base;
    return 0;
}
