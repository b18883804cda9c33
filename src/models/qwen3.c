/*
 * qwen3.c — Qwen3ForCausalLM (dense Qwen3): weights and one forward pass in kernels.
 *
 * Per layer: RMSNorm → q/k/v projections → per-head RMSNorm of q and k →
 * rotate-half RoPE → K/V into the paged cache → causal GQA → o_proj + residual → RMSNorm → SwiGLU
 * MLP + residual; then the final norm and lm_head (embed_tokens when tied) for the rows whose logits
 * are wanted only.
 *
 * Numerics: the residual stream and every activation stay f32 and the weights are read in their
 * checkpoint dtype by the kernels, so the result follows Hugging Face's f32 reference to rounding
 * (it does not reproduce the rounding of a bf16 HF run, which rounds every residual add to bf16;
 * keeping the residual in f32 is a deliberate choice for accuracy).
 *
 * Weights: f32/f16 matrices are views into the checkpoint mapping. bf16 matrices — the common
 * case, and the one the speed targets are about — are repacked once at load into the kernels'
 * 16-row panels (kernels.h), stacked where one call can serve several outputs: q|k|v and
 * gate|up are one matmul each. Packing costs one pass over the weights and fresh memory for the
 * copy, and buys the lane-wise f32 kernel (1.5-1.85× the row-major one, tools/matmul_bench.c). The
 * packing, the dropping of originals, the packed-weight cache and the tied embedding read back from
 * the packed lm_head are shared with the other Qwen3 models (qb_pack_weights, qwen3_blocks.h).
 *
 * Fusions: the residual add is folded into the next RMSNorm (one pass over the residual stream),
 * q/k RMSNorm and RoPE are one pass per head, SwiGLU runs on the pool over the gate|up output.
 * Each op is timed into the kernels' profile (kernels/profile.h) when profiling is on.
 *
 * Memory: the activation scratch is sized for max_num_batched_tokens at load and only grows if a
 * larger batch ever arrives, so a steady-state forward() allocates nothing. The batch is checked up front (models/layers/batch.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/kernels.h"
#include "kernels/profile.h"
#include "models/architectures.h"
#include "models/layers/batch.h"
#include "models/qwen3_blocks.h"

enum { MAX_HEAD_DIM = 1024 };

typedef struct qwen3_layer {
    const float *input_norm, *post_attention_norm, *q_norm, *k_norm;
    qb_linear qkv, o_proj, gate_up, down_proj; /* packed together where they share an input */
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
    qb_vocab vocab_w;      /* embed_tokens and lm_head */
    const float *final_norm;
    qwen3_layer *layers;
    cv_rope rope;
    qwen3_scratch s;
} qwen3_model;

/* ---- loading --------------------------------------------------------------------------------- */

static void bind_layer(qb_binder *b, const qwen3_model *m, int l, qwen3_layer *ly) {
    const int64_t H = m->hidden, q_dim = (int64_t)m->n_heads * m->head_dim, kv_dim = (int64_t)m->n_kv_heads * m->head_dim;
    char name[160];
#define LAYER_NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), name)
    qb_bind_vector(b, LAYER_NAME("input_layernorm.weight"), H, "hidden_size", &ly->input_norm);
    ly->qkv.n_parts = 3;
    qb_bind_matrix(b, LAYER_NAME("self_attn.q_proj.weight"), q_dim, H, "num_attention_heads*head_dim, hidden_size",
                &ly->qkv.parts[0]);
    qb_bind_matrix(b, LAYER_NAME("self_attn.k_proj.weight"), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                &ly->qkv.parts[1]);
    qb_bind_matrix(b, LAYER_NAME("self_attn.v_proj.weight"), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                &ly->qkv.parts[2]);
    ly->o_proj.n_parts = 1;
    qb_bind_matrix(b, LAYER_NAME("self_attn.o_proj.weight"), H, q_dim, "hidden_size, num_attention_heads*head_dim",
                &ly->o_proj.parts[0]);
    qb_bind_vector(b, LAYER_NAME("self_attn.q_norm.weight"), m->head_dim, "head_dim", &ly->q_norm);
    qb_bind_vector(b, LAYER_NAME("self_attn.k_norm.weight"), m->head_dim, "head_dim", &ly->k_norm);
    qb_bind_vector(b, LAYER_NAME("post_attention_layernorm.weight"), H, "hidden_size", &ly->post_attention_norm);
    ly->gate_up.n_parts = 2;
    qb_bind_matrix(b, LAYER_NAME("mlp.gate_proj.weight"), m->intermediate, H, "intermediate_size, hidden_size",
                &ly->gate_up.parts[0]);
    qb_bind_matrix(b, LAYER_NAME("mlp.up_proj.weight"), m->intermediate, H, "intermediate_size, hidden_size",
                &ly->gate_up.parts[1]);
    ly->down_proj.n_parts = 1;
    qb_bind_matrix(b, LAYER_NAME("mlp.down_proj.weight"), H, m->intermediate, "hidden_size, intermediate_size",
                &ly->down_proj.parts[0]);
#undef LAYER_NAME
}

static int bind_weights(qwen3_model *m, const cv_model_config *cfg, cv_weight_source *src) {
    qb_binder b = {.src = src};
    qb_bind_vocab(&b, "model.embed_tokens.weight", m->vocab, m->hidden, cfg->tie_word_embeddings, &m->vocab_w);
    for (int l = 0; l < m->n_layers; l++) bind_layer(&b, m, l, &m->layers[l]);
    qb_bind_vector(&b, "model.norm.weight", m->hidden, "hidden_size", &m->final_norm);
    m->base.weight_bytes = b.matmul_bytes;
    qb_binder_free(&b); /* nothing is derived: every tensor is a view or owned by the source */
    return b.rc;
}

/* Bump when the packed bytes of the same checkpoint would change (what is stacked, in which order). */
#define QWEN3_PACK_LAYOUT "qwen3 panels v1: lm_head, then per layer q|k|v, o, gate|up, down"

static int pack_weights(qwen3_model *m, cv_weight_source *src, cv_threadpool *pool) {
    qb_linear **lins = cv_xmalloc(sizeof *lins * (size_t)(4 * m->n_layers));
    for (int l = 0; l < m->n_layers; l++) {
        qwen3_layer *ly = &m->layers[l];
        lins[4 * l] = &ly->qkv, lins[4 * l + 1] = &ly->o_proj, lins[4 * l + 2] = &ly->gate_up;
        lins[4 * l + 3] = &ly->down_proj;
    }
    int rc = qb_pack_weights(pool, src, QWEN3_PACK_LAYOUT, &m->vocab_w, lins, 4 * m->n_layers);
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
        qb_linear *lins[] = {&ly->qkv, &ly->o_proj, &ly->gate_up, &ly->down_proj};
        for (size_t i = 0; i < CV_ARRAY_LEN(lins); i++) qb_linear_release(lins[i]);
    }
    qb_vocab_release(&m->vocab_w);
    cv_rope_free(&m->rope);
    free(m->layers);
    free(m);
}

/* ---- forward ---------------------------------------------------------------------------------- */

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
    TIMED(CV_OP_QKV_PROJ, qb_linear_forward(pool, &ly->qkv, s->a, T, qkv));
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
    TIMED(CV_OP_O_PROJ, qb_linear_forward(pool, &ly->o_proj, s->attn, T, &s->o));
}

static void mlp_block(qwen3_model *m, const qwen3_layer *ly, int32_t T) {
    qwen3_scratch *s = &m->s;
    cv_threadpool *pool = m->base.pool;
    const int64_t I = m->intermediate;
    TIMED(CV_OP_NORM, cv_add_rmsnorm(pool, s->x, s->o, s->a, ly->post_attention_norm, T, m->hidden, m->eps));
    float *gate_up[] = {s->gate_up, s->gate_up + (int64_t)s->capacity * I};
    TIMED(CV_OP_GATE_UP_PROJ, qb_linear_forward(pool, &ly->gate_up, s->a, T, gate_up));
    TIMED(CV_OP_SWIGLU, cv_swiglu(pool, s->h, s->gate_up, T, I, I, (int64_t)s->capacity * I));
    TIMED(CV_OP_DOWN_PROJ, qb_linear_forward(pool, &ly->down_proj, s->h, T, &s->o));
}

static void embed_tokens(const qwen3_model *m, const int32_t *ids, int32_t n, float *out) {
    qb_embed(&m->vocab_w, ids, n, out);
}

static int qwen3_forward(cv_model *base, const cv_batch *b, cv_kv_cache *kv, cv_state_cache *state, float *logits) {
    qwen3_model *m = (qwen3_model *)base;
    int rc = nn_check_batch(b, kv, m->vocab, m->n_layers, state, 0);
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
    TIMED(CV_OP_LM_HEAD, qb_logits(base->pool, &m->vocab_w, s->a, b->n_logits, logits));
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
    rc = qb_init_rope(&m->rope, &cfg->rope, m->head_dim);
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
