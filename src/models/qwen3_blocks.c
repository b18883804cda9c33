/*
 * qwen3_blocks.c — binding, config fields, scratch, attention and MoE blocks shared by
 * qwen3_moe.c and qwen3_hybrid.c (see qwen3_blocks.h for the split of responsibilities).
 *
 * Attention (Qwen3's, and the hybrids' gated full attention): projections, per-head RMSNorm of q
 * and k (gains already in effective form), RoPE on the first rot_dim dims, K/V into the paged
 * cache, causal GQA with scale head_dim^−1/2 (also under partial RoPE), then the optional sigmoid
 * output gate and o_proj. The MoE block: f32 router softmax → top-k → optional renormalisation,
 * then the shared expert added with weight σ(shared_expert_gate · x) after the routed ones.
 *
 * Weights read by every token — lm_head, attention, GDN projections, router, shared expert, dense
 * MLP — are qb_linears: bf16 ones are repacked once at load into the kernels' 16-row panels (the
 * lane-wise kernel decodes near the memory-bandwidth bound, the row-major one well below it),
 * stacking the parts that share an input (q|k|v, gate|up, router|shared gate) into one call. The
 * originals are dropped from memory once packed (madvise DONTNEED), so resident weights stay ~1×
 * their size. The routed experts stay row-major views for the grouped kernel: each is read by few
 * tokens, and packing them all would double the load time of the largest part of the model.
 * Unlike qwen3.c, the packing is not kept in the packed-weight cache: a load packs again.
 */
#include "models/qwen3_blocks.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t for streaming */
#include <xxhash.h>

#include "base/error.h"
#include "loader/pack_cache.h"

/* ---- binding ---------------------------------------------------------------------------------- */

const char *qb_name(qb_binder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->name, sizeof b->name, fmt, ap);
    va_end(ap);
    return b->name;
}

void qb_bind_matrix(qb_binder *b, const char *name, int64_t rows, int64_t cols, const char *hint, cv_matrix *out) {
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

void qb_bind_vector(qb_binder *b, const char *name, int64_t dim, const char *hint, const float **out) {
    if (b->rc) return;
    b->rc = cv_weights_get_f32(b->src, name, 1, &dim, hint, out);
}

void *qb_own(qb_binder *b, size_t bytes) {
    void *p = cv_aligned_alloc(bytes ? bytes : 1);
    if (!p) {
        if (!b->rc) b->rc = cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes for model tables", bytes);
        return NULL;
    }
    memset(p, 0, bytes);
    if (b->n_owned == b->cap_owned) {
        b->cap_owned = b->cap_owned ? 2 * b->cap_owned : 64;
        b->owned = cv_xrealloc(b->owned, (size_t)b->cap_owned * sizeof *b->owned);
    }
    b->owned[b->n_owned++] = p;
    return p;
}

void qb_bind_gain_plus_one(qb_binder *b, const char *name, int64_t dim, const char *hint, const float **out) {
    const float *w;
    qb_bind_vector(b, name, dim, hint, &w);
    if (b->rc) return;
    float *g = qb_own(b, (size_t)dim * sizeof *g);
    if (!g) return;
    for (int64_t i = 0; i < dim; i++) g[i] = 1.0f + w[i];
    *out = g;
}

void qb_binder_free(qb_binder *b) {
    for (int i = 0; i < b->n_owned; i++) free(b->owned[i]);
    free(b->owned);
    b->owned = NULL;
    b->n_owned = b->cap_owned = 0;
}

/* ---- packed linears --------------------------------------------------------------------------- */

void qb_linear_forward(cv_threadpool *pool, const qb_linear *l, const float *x, int64_t T, float *const *ys) {
    if (l->packed.data) {
        int64_t rows[QB_MAX_PARTS];
        for (int j = 0; j < l->n_parts; j++) rows[j] = l->parts[j].rows;
        cv_matmul_panels_parts(pool, &l->packed, x, T, l->n_parts, rows, ys);
        return;
    }
    for (int j = 0; j < l->n_parts; j++) cv_matmul(pool, &l->parts[j], x, T, ys[j]);
}

static bool packable(const qb_linear *l) {
    for (int j = 0; j < l->n_parts; j++)
        if (l->parts[j].dtype != CV_DTYPE_BF16 || (j < l->n_parts - 1 && l->parts[j].rows % CV_PANEL_ROWS))
            return false;
    return l->n_parts > 0;
}

/* Returns the whole pages inside [p, p + n) to the kernel: a file mapping re-reads them if ever
 * touched again, anonymous memory (dummy weights) reads back zeros, so only for weights never read
 * again. */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = ((uintptr_t)p + page - 1) / page * page, end = ((uintptr_t)p + n) / page * page;
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
}

void qb_linear_release(qb_linear *l) { cv_panels_release(&l->packed); }

void qb_bind_vocab(qb_binder *b, const char *embed_name, int32_t vocab, int32_t hidden, bool tied, qb_vocab *out) {
    const size_t streamed = b->matmul_bytes;
    qb_bind_matrix(b, embed_name, vocab, hidden, "vocab_size, hidden_size", &out->embed);
    b->matmul_bytes = streamed; /* gathered one row per token, not streamed */
    out->lm_head.n_parts = 1;
    /* Tied: Hugging Face ties lm_head to embed_tokens and ignores any stored copy; so do we. */
    if (tied) {
        out->lm_head.parts[0] = out->embed;
        b->matmul_bytes += (size_t)vocab * (size_t)hidden * cv_dtype_size(out->embed.dtype);
    } else {
        qb_bind_matrix(b, "lm_head.weight", vocab, hidden, "vocab_size, hidden_size (tie_word_embeddings=false)",
                       &out->lm_head.parts[0]);
    }
}

static bool is_tied(const qb_vocab *v) { return v->lm_head.parts[0].data == v->embed.data; }

/* What the cache key must cover besides the checkpoint files: the model's packing, which tensor
 * lm_head is (a tied load of an untied checkpoint packs embed_tokens, of the same shape) and every
 * packed shape. */
static uint64_t pack_layout_hash(const char *layout, bool tied, qb_linear *const *lins, int n) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, layout, strlen(layout) + 1);
    XXH3_64bits_update(&st, &tied, sizeof tied);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < lins[i]->n_parts; j++) {
            const int64_t shape[3] = {j, lins[i]->parts[j].rows, lins[i]->parts[j].cols};
            XXH3_64bits_update(&st, shape, sizeof shape);
        }
    return XXH3_64bits_digest(&st);
}

/* The packed-weight cache entry for lins[0..n) (NULL for dummy weights or when unavailable). */
static cv_pack_cache *open_pack_cache(cv_weight_source *src, const char *layout, bool tied, qb_linear *const *lins,
                                      int n, cv_threadpool *pool) {
    const size_t n_files = cv_weight_source_n_files(src);
    if (!n_files || !n) return NULL;
    const char **files = cv_xmalloc(n_files * sizeof *files);
    for (size_t i = 0; i < n_files; i++) files[i] = cv_weight_source_file(src, i);
    size_t *sizes = cv_xmalloc((size_t)n * sizeof *sizes);
    for (int i = 0; i < n; i++)
        sizes[i] = cv_panels_bytes(cv_panels_stacked_rows(lins[i]->parts, lins[i]->n_parts), lins[i]->parts[0].cols);
    cv_pack_cache *c = cv_pack_cache_open(files, n_files, pack_layout_hash(layout, tied, lins, n), sizes, n, pool);
    free(sizes);
    free(files);
    return c;
}

int qb_pack_weights(cv_threadpool *pool, cv_weight_source *src, const char *layout, qb_vocab *v,
                    qb_linear *const *lins, int n) {
    qb_linear **packed = cv_xmalloc(sizeof *packed * (size_t)(n + 1));
    int k = 0;
    if (packable(&v->lm_head)) packed[k++] = &v->lm_head;
    for (int i = 0; i < n; i++) {
        assert(lins[i]->n_parts <= QB_MAX_PARTS);
        if (packable(lins[i])) packed[k++] = lins[i];
    }
    const bool tied = is_tied(v);
    v->cache = open_pack_cache(src, layout, tied, packed, k, pool);
    const bool hit = v->cache && cv_pack_cache_hit(v->cache);
    int rc = 0;
    for (int i = 0; i < k && !rc; i++) {
        qb_linear *l = packed[i];
        if (hit) {
            l->packed = (cv_panels){cv_pack_cache_section(v->cache, i), cv_panels_stacked_rows(l->parts, l->n_parts),
                                    l->parts[0].cols, false};
            continue; /* the originals were never touched */
        }
        rc = v->cache ? cv_panels_pack_into(pool, l->parts, l->n_parts, cv_pack_cache_section(v->cache, i), &l->packed)
                      : cv_panels_pack(pool, l->parts, l->n_parts, &l->packed);
        for (int j = 0; j < l->n_parts && !rc; j++)
            drop_pages(l->parts[j].data, (size_t)(l->parts[j].rows * l->parts[j].cols) * sizeof(uint16_t));
    }
    if (!rc && v->cache && !hit) cv_pack_cache_commit(v->cache, pool);
    if (!rc && tied && v->lm_head.packed.data) v->embed = (cv_matrix){0}; /* rows now come from the panels */
    free(packed);
    return rc;
}

void qb_embed(const qb_vocab *v, const int32_t *ids, int32_t n, float *out) {
    if (v->embed.data) cv_embed(&v->embed, ids, n, out);
    else cv_embed_panels(&v->lm_head.packed, ids, n, out);
}

void qb_logits(cv_threadpool *pool, const qb_vocab *v, const float *x, int32_t n, float *logits) {
    if (n > 0) qb_linear_forward(pool, &v->lm_head, x, n, &logits);
}

void qb_vocab_release(qb_vocab *v) {
    qb_linear_release(&v->lm_head);
    cv_pack_cache_close(v->cache);
    v->cache = NULL;
}

/* ---- config fields ---------------------------------------------------------------------------- */

int qb_cfg_int(const cv_model_config *cfg, const char *key, int32_t def, int32_t *out) {
    json_t *v = json_object_get(cfg->text, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return cv_fail(CVLLM_ERR_FORMAT, "config.json: missing required field \"%s\" for %s", key,
                                    cfg->architecture);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" must be a positive integer", key);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

int qb_cfg_bool(const cv_model_config *cfg, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(cfg->text, key);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

int qb_cfg_layer_list(const cv_model_config *cfg, const char *key, int32_t n_layers, bool *in) {
    memset(in, 0, (size_t)n_layers * sizeof *in);
    json_t *v = json_object_get(cfg->text, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" must be a list of layer indices", key);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= n_layers)
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" entry %zu is not a layer index in [0, %d)", key,
                           i, n_layers);
        in[json_integer_value(e)] = true;
    }
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

int qb_init_rope(cv_rope *r, const cv_rope_config *rc, int32_t head_dim) {
    cv_rope_params p = {
        .kind = rope_kind(rc->type),
        .theta = rc->theta,
        .factor = rc->factor,
        .original_max_position = rc->original_max_position,
        .beta_fast = rc->beta_fast,
        .beta_slow = rc->beta_slow,
        .attention_factor = rc->attention_factor,
        .rot_dim = (int32_t)(head_dim * rc->partial_rotary_factor),
    };
    int rc_ = cv_rope_init(r, &p);
    return rc_ ? cv_fail_prefix(rc_, "config.json rope") : 0;
}

/* ---- scratch ---------------------------------------------------------------------------------- */

void *qb_take(qb_arena *a, size_t bytes) {
    size_t at = a->size;
    a->size += (bytes + 63) & ~(size_t)63;
    return a->base ? a->base + at : NULL;
}

/* ---- attention -------------------------------------------------------------------------------- */

void qb_attention_scratch_take(qb_attention_scratch *s, const qb_attention_dims *d, qb_arena *a, int32_t tokens) {
    const size_t q = (size_t)d->n_heads * (size_t)d->head_dim * (size_t)tokens * sizeof(float);
    const size_t kv = (size_t)d->n_kv_heads * (size_t)d->head_dim * (size_t)tokens * sizeof(float);
    /* Ungated, the projection lands in q directly. */
    s->qg = qb_take(a, d->gated ? 2 * q : q);
    s->q = d->gated ? qb_take(a, q) : s->qg;
    s->gate = d->gated ? qb_take(a, q) : NULL;
    s->attn = qb_take(a, q);
    s->k = qb_take(a, kv);
    s->v = qb_take(a, kv);
}

void qb_bind_attention(qb_binder *b, const char *prefix, const qb_attention_dims *d, qb_attention *out) {
    const int64_t H = d->hidden, q_dim = (int64_t)d->n_heads * d->head_dim, kv_dim = (int64_t)d->n_kv_heads * d->head_dim;
    char p[200];
    snprintf(p, sizeof p, "%s", prefix);
    out->qkv.n_parts = 3;
    qb_bind_matrix(b, qb_name(b, "%sq_proj.weight", p), d->gated ? 2 * q_dim : q_dim, H,
                   d->gated ? "2*num_attention_heads*head_dim (query and gate), hidden_size"
                            : "num_attention_heads*head_dim, hidden_size",
                   &out->qkv.parts[0]);
    qb_bind_matrix(b, qb_name(b, "%sk_proj.weight", p), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                   &out->qkv.parts[1]);
    qb_bind_matrix(b, qb_name(b, "%sv_proj.weight", p), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                   &out->qkv.parts[2]);
    out->o_proj.n_parts = 1;
    qb_bind_matrix(b, qb_name(b, "%so_proj.weight", p), H, q_dim, "hidden_size, num_attention_heads*head_dim",
                   &out->o_proj.parts[0]);
    if (d->zero_centred_norms) {
        qb_bind_gain_plus_one(b, qb_name(b, "%sq_norm.weight", p), d->head_dim, "head_dim", &out->q_norm);
        qb_bind_gain_plus_one(b, qb_name(b, "%sk_norm.weight", p), d->head_dim, "head_dim", &out->k_norm);
    } else {
        qb_bind_vector(b, qb_name(b, "%sq_norm.weight", p), d->head_dim, "head_dim", &out->q_norm);
        qb_bind_vector(b, qb_name(b, "%sk_norm.weight", p), d->head_dim, "head_dim", &out->k_norm);
    }
}

int qb_attention_linears(qb_attention *a, qb_linear **out) {
    out[0] = &a->qkv;
    out[1] = &a->o_proj;
    return 2;
}

/* Splits the per-head interleaved [q_h | gate_h] projection into q and gate, both head-major. */
static void split_query_gate(const float *qg, float *q, float *gate, int64_t T, int32_t n_heads, int32_t hd) {
    const size_t bytes = (size_t)hd * sizeof(float);
    for (int64_t t = 0; t < T; t++)
        for (int32_t h = 0; h < n_heads; h++) {
            const float *src = qg + (t * n_heads + h) * 2 * hd;
            memcpy(q + (t * n_heads + h) * hd, src, bytes);
            memcpy(gate + (t * n_heads + h) * hd, src + hd, bytes);
        }
}

static void sigmoid_gate(float *x, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] /= 1.0f + expf(-gate[i]);
}

void qb_attention_forward(cv_threadpool *pool, const qb_attention *w, const qb_attention_dims *d, const cv_rope *rope,
                          const float *cos, const float *sin, const cv_batch *b, const cv_kv_cache *kv, int kv_layer,
                          const float *in, const qb_attention_scratch *s, float *out) {
    const int32_t T = b->n_tokens, hd = d->head_dim;
    float *qkv[] = {s->qg, s->k, s->v};
    qb_linear_forward(pool, &w->qkv, in, T, qkv);
    if (d->gated) split_query_gate(s->qg, s->q, s->gate, T, d->n_heads, hd);
    cv_rmsnorm(s->q, s->q, w->q_norm, (int64_t)T * d->n_heads, hd, d->eps);
    cv_rmsnorm(s->k, s->k, w->k_norm, (int64_t)T * d->n_kv_heads, hd, d->eps);
    cv_rope_apply(rope, s->q, T, d->n_heads, hd, cos, sin);
    cv_rope_apply(rope, s->k, T, d->n_kv_heads, hd, cos, sin);
    cv_kv_write(kv->k[kv_layer], kv->v[kv_layer], s->k, s->v, b->slot_mapping, T, (int64_t)d->n_kv_heads * hd);
    cv_attention_args args = {
        .n_tokens = T, .n_seqs = b->n_seqs, .seq_start = b->seq_start, .positions = b->positions,
        .block_tables = b->block_tables, .block_size = kv->block_size, .n_heads = d->n_heads,
        .n_kv_heads = d->n_kv_heads, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .q = s->q,
        .k_cache = kv->k[kv_layer], .v_cache = kv->v[kv_layer], .out = s->attn,
    };
    cv_attention(pool, &args);
    if (d->gated) sigmoid_gate(s->attn, s->gate, (int64_t)T * d->n_heads * hd);
    qb_linear_forward(pool, &w->o_proj, s->attn, T, &out);
}

/* ---- MoE -------------------------------------------------------------------------------------- */

void qb_moe_sizes_add(qb_moe_sizes *z, const qb_moe *m) {
    for (int32_t e = 0; e < m->n_routed; e++)
        if (m->experts[e].gate.rows > z->max_inter) z->max_inter = (int32_t)m->experts[e].gate.rows;
    if (m->n_routed > 0 && m->top_k > z->top_k) z->top_k = m->top_k;
    if (m->n_routed > z->n_routed) z->n_routed = m->n_routed;
    if (m->gate_up.n_parts && m->gate_up.parts[0].rows > z->dense_inter) z->dense_inter = (int32_t)m->gate_up.parts[0].rows;
}

void qb_moe_scratch_take(qb_moe_scratch *s, const qb_moe_sizes *z, cv_threadpool *pool, int32_t hidden, qb_arena *a,
                         int32_t tokens) {
    const size_t T = (size_t)tokens, f = sizeof(float);
    s->logits = qb_take(a, T * (size_t)z->n_routed * f);
    s->shared_logit = qb_take(a, T * f);
    s->weights = qb_take(a, T * (size_t)z->top_k * f);
    s->ids = qb_take(a, T * (size_t)z->top_k * sizeof(int32_t));
    s->workspace = z->n_routed ? qb_take(a, cv_moe_workspace_bytes(pool, tokens, z->top_k, hidden, z->max_inter,
                                                                   z->n_routed))
                               : NULL;
    s->gate_up = qb_take(a, 2 * T * (size_t)z->dense_inter * f);
    s->h = qb_take(a, T * (size_t)z->dense_inter * f);
    s->shared = qb_take(a, T * (size_t)hidden * f);
}

static void bind_swiglu(qb_binder *b, const char *prefix, int32_t hidden, int32_t inter, const char *inter_name,
                        cv_moe_expert *out) {
    char p[200], hint[96];
    snprintf(p, sizeof p, "%s", prefix);
    snprintf(hint, sizeof hint, "%s, hidden_size", inter_name);
    qb_bind_matrix(b, qb_name(b, "%sgate_proj.weight", p), inter, hidden, hint, &out->gate);
    qb_bind_matrix(b, qb_name(b, "%sup_proj.weight", p), inter, hidden, hint, &out->up);
    snprintf(hint, sizeof hint, "hidden_size, %s", inter_name);
    qb_bind_matrix(b, qb_name(b, "%sdown_proj.weight", p), hidden, inter, hint, &out->down);
}

/* The shared expert or a dense MLP: a SwiGLU as linears gate|up and down. */
static void bind_dense_swiglu(qb_binder *b, const char *prefix, int32_t hidden, int32_t inter, const char *inter_name,
                              qb_moe *out) {
    cv_moe_expert e = {0};
    bind_swiglu(b, prefix, hidden, inter, inter_name, &e);
    out->gate_up = (qb_linear){.n_parts = 2, .parts = {e.gate, e.up}};
    out->down = (qb_linear){.n_parts = 1, .parts = {e.down}};
}

/* Fused 3-D experts: views of expert e's rows, no copy. Returns 1 bound, 0 absent. */
static int bind_fused_experts(qb_binder *b, const char *prefix, int32_t hidden, const qb_moe_config *c,
                              cv_moe_expert *experts) {
    const int64_t E = c->n_experts, I = c->expert_inter, H = hidden;
    int64_t gu_shape[3] = {E, 2 * I, H}, down_shape[3] = {E, H, I};
    cv_tensor gu, down;
    char p[200];
    snprintf(p, sizeof p, "%s", prefix);
    int found = cv_weights_get_optional(b->src, qb_name(b, "%sexperts.gate_up_proj", p), 3, gu_shape,
                                        "num_experts, 2*moe_intermediate_size, hidden_size", &gu);
    if (found <= 0) {
        if (found < 0) b->rc = found;
        return found > 0;
    }
    b->rc = cv_weights_get(b->src, qb_name(b, "%sexperts.down_proj", p), 3, down_shape,
                           "num_experts, hidden_size, moe_intermediate_size", &down);
    if (!b->rc && (!cv_matrix_dtype_supported(gu.dtype) || !cv_matrix_dtype_supported(down.dtype)))
        b->rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "experts of %s have dtype %s/%s; F32, BF16 or F16 expected", p,
                        cv_dtype_name(gu.dtype), cv_dtype_name(down.dtype));
    if (b->rc) return 1;
    const size_t gu_expert = (size_t)(2 * I * H) * cv_dtype_size(gu.dtype), gu_half = gu_expert / 2;
    const size_t down_expert = (size_t)(H * I) * cv_dtype_size(down.dtype);
    for (int64_t e = 0; e < E; e++) {
        const char *g = (const char *)gu.data + (size_t)e * gu_expert, *d = (const char *)down.data + (size_t)e * down_expert;
        experts[e].gate = (cv_matrix){g, gu.dtype, I, H};
        experts[e].up = (cv_matrix){g + gu_half, gu.dtype, I, H};
        experts[e].down = (cv_matrix){d, down.dtype, H, I};
    }
    b->matmul_bytes += gu.nbytes + down.nbytes;
    return 1;
}

void qb_bind_moe(qb_binder *b, const char *prefix, int32_t hidden, const qb_moe_config *c, qb_moe *out) {
    if (b->rc) return;
    if (c->top_k > c->n_experts) {
        b->rc = cv_fail(CVLLM_ERR_FORMAT, "config.json: num_experts_per_tok=%d exceeds num_experts=%d", c->top_k,
                        c->n_experts);
        return;
    }
    char p[200];
    snprintf(p, sizeof p, "%s", prefix);
    *out = (qb_moe){.n_routed = c->n_experts, .top_k = c->top_k, .renormalize = c->renormalize,
                    .has_shared = c->shared_inter > 0};
    out->experts = qb_own(b, (size_t)c->n_experts * sizeof *out->experts);
    if (!out->experts) return;
    out->route.n_parts = out->has_shared ? 2 : 1;
    qb_bind_matrix(b, qb_name(b, "%sgate.weight", p), c->n_experts, hidden, "num_experts, hidden_size",
                   &out->route.parts[0]);
    const size_t before = b->matmul_bytes;
    if (!b->rc && !bind_fused_experts(b, p, hidden, c, out->experts))
        for (int32_t e = 0; e < c->n_experts && !b->rc; e++) {
            char ep[240];
            snprintf(ep, sizeof ep, "%sexperts.%d.", p, e);
            bind_swiglu(b, ep, hidden, c->expert_inter, "moe_intermediate_size", &out->experts[e]);
        }
    /* A token streams only its top_k experts. */
    b->matmul_bytes = before + (b->matmul_bytes - before) / (size_t)c->n_experts * (size_t)c->top_k;
    if (out->has_shared) {
        char sp[240];
        snprintf(sp, sizeof sp, "%sshared_expert.", p);
        bind_dense_swiglu(b, sp, hidden, c->shared_inter, "shared_expert_intermediate_size", out);
        qb_bind_matrix(b, qb_name(b, "%sshared_expert_gate.weight", p), 1, hidden, "1, hidden_size",
                       &out->route.parts[1]);
    }
}

void qb_bind_dense_mlp(qb_binder *b, const char *prefix, int32_t hidden, int32_t inter, qb_moe *out) {
    if (b->rc) return;
    *out = (qb_moe){0};
    bind_dense_swiglu(b, prefix, hidden, inter, "intermediate_size", out);
}

int qb_moe_linears(qb_moe *m, qb_linear **out) {
    out[0] = &m->route;
    out[1] = &m->gate_up;
    out[2] = &m->down;
    return 3;
}

/* y [T][hidden] = SwiGLU of the shared expert / dense MLP. */
static void dense_swiglu(cv_threadpool *pool, const qb_moe *m, const float *in, int32_t T, const qb_moe_scratch *s,
                         float *y) {
    const int64_t I = m->gate_up.parts[0].rows;
    float *gate_up[] = {s->gate_up, s->gate_up + (int64_t)T * I};
    qb_linear_forward(pool, &m->gate_up, in, T, gate_up);
    cv_swiglu(pool, s->h, s->gate_up, T, I, I, (int64_t)T * I);
    qb_linear_forward(pool, &m->down, s->h, T, &y);
}

void qb_moe_forward(cv_threadpool *pool, const qb_moe *m, int32_t hidden, const float *in, int32_t T,
                    const qb_moe_scratch *s, float *out) {
    if (m->n_routed == 0) {
        dense_swiglu(pool, m, in, T, s, out);
        return;
    }
    float *route[] = {s->logits, s->shared_logit};
    qb_linear_forward(pool, &m->route, in, T, route);
    cv_moe_route(s->logits, T, m->n_routed, m->top_k, m->renormalize, s->ids, s->weights);
    memset(out, 0, (size_t)T * (size_t)hidden * sizeof *out);
    cv_moe_args a = {
        .n_tokens = T, .hidden = hidden, .n_experts = m->n_routed, .experts = m->experts, .routes = m->top_k,
        .ids = s->ids, .weights = s->weights, .x = in, .y = out, .workspace = s->workspace,
    };
    cv_moe(pool, &a);
    if (!m->has_shared) return;
    /* Added after the routed experts, as when it was the last route of the grouped kernel. */
    dense_swiglu(pool, m, in, T, s, s->shared);
    for (int32_t t = 0; t < T; t++) {
        const float w = 1.0f / (1.0f + expf(-s->shared_logit[t]));
        float *o = out + (int64_t)t * hidden;
        const float *e = s->shared + (int64_t)t * hidden;
        for (int32_t i = 0; i < hidden; i++) o[i] += w * e[i];
    }
}
