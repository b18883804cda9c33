/*
 * qwen3_moe.c — Qwen3MoeForCausalLM: Qwen3's attention with a routed sparse MoE in place of the MLP.
 *
 * Per layer: RMSNorm → attention with QK-norm and RoPE (layers/attention.h) → residual → RMSNorm →
 * MoE (layers/moe.h) → residual. A layer is sparse iff it is not in mlp_only_layers and
 * (l+1) % decoder_sparse_step == 0 (Hugging Face's rule); the other layers run a dense SwiGLU MLP
 * of intermediate_size, the MoE block's dense form. Router: f32 softmax over all experts → top-k →
 * renormalised only when norm_topk_prob (HF's default is false, the released checkpoints set true).
 * No shared expert, no router bias.
 *
 * Numerics and memory as in qwen3.c: f32 activations and residual (each residual add fused into
 * the next RMSNorm, which also quantizes for an int8 q|k|v or dense gate|up), weights read in
 * checkpoint dtype (bf16 lm_head, attention and dense/MLP linears packed into panels at load, float
 * routed experts straight from the mapping, quantized linears and experts packed in their scheme),
 * activation scratch sized for max_num_batched_tokens and grown only on demand (layers/arena.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "models/architectures.h"
#include "models/layers/arena.h"
#include "models/layers/attention.h"
#include "models/layers/batch.h"
#include "models/layers/config.h"
#include "models/layers/moe.h"
#include "models/layers/timed.h"
#include "models/layers/stream.h"
#include "models/layers/vocab.h"

typedef struct moe_layer {
    const float *input_norm, *post_attention_norm;
    nn_attention attn;
    nn_moe mlp;
} moe_layer;

typedef struct moe_scratch {
    nn_stream st;                 /* x, a, o, cos, sin, aq, ab */
    nn_attention_scratch attn;
    nn_moe_scratch moe;
} moe_scratch;

typedef struct qwen3_moe_model {
    cv_model base;
    int32_t hidden, n_layers, vocab;
    float eps;
    nn_attention_dims dims;
    nn_vocab vocab_w;         /* embedding and lm_head */
    const float *final_norm;
    moe_layer *layers;
    cv_rope rope;
    nn_binder bound;
    nn_moe_sizes moe_sizes;
    nn_scratch scratch;
    moe_scratch s;
} qwen3_moe_model;

/* ---- loading ---------------------------------------------------------------------------------- */

typedef struct moe_plan {
    nn_moe_config moe;
    int32_t sparse_step;
    bool *dense;              /* [n_layers] */
} moe_plan;

static int read_plan(const cv_model_config *cfg, moe_plan *p) {
    int rc = nn_cfg_int(cfg, "num_experts", -1, &p->moe.n_experts);
    if (!rc) rc = nn_cfg_int(cfg, "num_experts_per_tok", -1, &p->moe.top_k);
    if (!rc) rc = nn_cfg_int(cfg, "moe_intermediate_size", -1, &p->moe.expert_inter);
    if (!rc) rc = nn_cfg_bool(cfg, "norm_topk_prob", false, &p->moe.renormalize);
    if (!rc) rc = nn_cfg_int(cfg, "decoder_sparse_step", 1, &p->sparse_step);
    if (!rc) rc = nn_cfg_layer_list(cfg, "mlp_only_layers", cfg->num_hidden_layers, p->dense);
    if (rc) return rc;
    for (int32_t l = 0; l < cfg->num_hidden_layers; l++) {
        p->dense[l] = p->dense[l] || (l + 1) % p->sparse_step != 0;
        if (p->dense[l] && cfg->intermediate_size <= 0)
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: layer %d has a dense MLP but intermediate_size is missing", l);
    }
    return 0;
}

static void bind_weights(qwen3_moe_model *m, const cv_model_config *cfg, const moe_plan *p) {
    nn_binder *b = &m->bound;
    const int32_t H = m->hidden;
    nn_bind_vocab(b, "model.embed_tokens.weight", m->vocab, H, cfg->tie_word_embeddings, &m->vocab_w);
    for (int32_t l = 0; l < m->n_layers; l++) {
        moe_layer *ly = &m->layers[l];
        nn_bind_vector(b, nn_name(b, "model.layers.%d.input_layernorm.weight", l), H, "hidden_size", &ly->input_norm);
        char prefix[96];
        snprintf(prefix, sizeof prefix, "model.layers.%d.self_attn.", l);
        nn_bind_attention(b, prefix, &m->dims, &ly->attn);
        nn_bind_vector(b, nn_name(b, "model.layers.%d.post_attention_layernorm.weight", l), H, "hidden_size",
                       &ly->post_attention_norm);
        snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.", l);
        if (p->dense[l]) nn_bind_dense_mlp(b, prefix, H, cfg->intermediate_size, &ly->mlp);
        else nn_bind_moe(b, prefix, H, &p->moe, &ly->mlp);
    }
    nn_bind_vector(b, "model.norm.weight", H, "hidden_size", &m->final_norm);
    m->base.weight_bytes = b->matmul_bytes;
}

static void carve_scratch(void *model, int32_t tokens, nn_arena *ar) {
    qwen3_moe_model *m = model;
    moe_scratch *s = &m->s;
    nn_stream_take(&s->st, ar, tokens, m->hidden, m->rope.rot_dim, &m->bound);
    nn_linear_scratch_take(&m->bound, ar, tokens);
    nn_attention_scratch_take(&s->attn, &m->dims, ar, tokens);
    nn_moe_scratch_take(&s->moe, &m->moe_sizes, m->base.pool, m->hidden, ar, tokens);
}

/* Every linear the layers read (the lm_head aside), in layer order; the caller frees the list. */
static nn_linear_list model_linears(qwen3_moe_model *m) {
    nn_linear_list l = {0};
    for (int32_t i = 0; i < m->n_layers; i++) {
        nn_attention_linears(&m->layers[i].attn, &l);
        nn_moe_linears(&m->layers[i].mlp, &l);
    }
    return l;
}

/* Bump when what model_linears() lists, or how its parts stack, changes: it keys the packed-weight cache. */
#define QWEN3_MOE_PACK_LAYOUT "qwen3-moe panels v1: lm_head, then model_linears() in order"

static int pack_weights(qwen3_moe_model *m, cv_weight_source *src, cv_threadpool *pool) {
    nn_linear_list lins = model_linears(m);
    int rc = nn_pack_model(pool, src, QWEN3_MOE_PACK_LAYOUT, &m->vocab_w, &lins);
    nn_linear_list_free(&lins);
    return rc;
}

static void qwen3_moe_destroy(cv_model *base) {
    qwen3_moe_model *m = (qwen3_moe_model *)base;
    nn_linear_list lins = model_linears(m);
    nn_linear_list_release(&lins);
    nn_scratch_free(&m->scratch);
    nn_vocab_release(&m->vocab_w);
    cv_rope_free(&m->rope);
    nn_binder_free(&m->bound);
    free(m->layers);
    free(m);
}

/* ---- forward ---------------------------------------------------------------------------------- */

static int qwen3_moe_forward(cv_model *base, const cv_batch *b, cv_kv_cache *kv, cv_state_cache *state,
                             float *logits) {
    qwen3_moe_model *m = (qwen3_moe_model *)base;
    int rc = nn_check_batch(b, kv, m->vocab, m->n_layers, state, 0);
    if (!rc) rc = nn_scratch_reserve(&m->scratch, b->n_tokens > b->n_logits ? b->n_tokens : b->n_logits, carve_scratch, m);
    if (rc || b->n_tokens == 0) return rc;
    moe_scratch *s = &m->s;
    const int32_t T = b->n_tokens, H = m->hidden;
    cv_threadpool *pool = base->pool;
    nn_embed(&m->vocab_w, b->token_ids, T, s->st.x);
    NN_TIMED(CV_OP_EMBED, cv_rope_cos_sin(pool, &m->rope, b->positions, T, s->st.cos, s->st.sin));
    for (int32_t l = 0; l < m->n_layers; l++) {
        const moe_layer *ly = &m->layers[l];
        nn_input in;
        NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, s->st.x, l ? s->st.o : NULL, s->st.a, ly->input_norm, T, H, m->eps,
                                                     &ly->attn.qkv, true, &s->st.aq, &s->st.ab));
        nn_attention_forward(pool, &ly->attn, &m->dims, &m->rope, s->st.cos, s->st.sin, b, kv, l, in, &s->attn, s->st.o);
        NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, s->st.x, s->st.o, s->st.a, ly->post_attention_norm, T, H, m->eps,
                                                     nn_moe_input_linear(&ly->mlp), false, &s->st.aq, &s->st.ab));
        nn_moe_forward(pool, &ly->mlp, H, in, T, &s->moe, s->st.o);
    }
    /* The last residual add and the final norm, for the rows whose logits are wanted only. */
    NN_TIMED(CV_OP_NORM, for (int32_t i = 0; i < b->n_logits; i++) {
        const int64_t r = b->logit_rows[i];
        float *row = s->st.a + (int64_t)i * H; /* x itself stays: a row may be asked for twice */
        memcpy(row, s->st.x + r * H, (size_t)H * sizeof *row);
        cv_add_rmsnorm(NULL, row, s->st.o + r * H, row, m->final_norm, 1, H, m->eps);
    });
    nn_logits(pool, &m->vocab_w, s->st.a, b->n_logits, logits);
    return 0;
}

static const cv_model_ops qwen3_moe_ops = {.forward = qwen3_moe_forward, .destroy = qwen3_moe_destroy};

int cv_qwen3_moe_load(const cv_model_load_params *p, cv_model **out) {
    const cv_model_config *cfg = p->config;
    *out = NULL;
    nn_attention_dims dims;
    moe_plan plan = {.dense = cv_xcalloc((size_t)cfg->num_hidden_layers, sizeof(bool))};
    int rc = nn_attention_dims_from_config(cfg, false, false, p->tp ? p->tp->size : 1, &dims);
    if (!rc) rc = read_plan(cfg, &plan);
    if (rc) {
        free(plan.dense);
        return rc;
    }
    qwen3_moe_model *m = cv_xcalloc(1, sizeof *m);
    m->base = (cv_model){.ops = &qwen3_moe_ops, .config = cfg, .vocab_size = cfg->vocab_size, .pool = p->pool};
    m->base.kv_spec = (cv_kv_spec){cfg->num_hidden_layers, dims.n_kv_heads, cfg->head_dim}; /* this rank's heads */
    m->hidden = cfg->hidden_size;
    m->n_layers = cfg->num_hidden_layers;
    m->vocab = cfg->vocab_size;
    m->eps = dims.eps;
    m->dims = dims;
    m->layers = cv_xcalloc((size_t)m->n_layers, sizeof *m->layers);
    m->bound = nn_binder_for(p);
    rc = nn_init_rope(&m->rope, &cfg->rope, cfg->head_dim);
    if (!rc) {
        bind_weights(m, cfg, &plan);
        rc = m->bound.rc;
    }
    free(plan.dense);
    if (!rc) rc = pack_weights(m, p->weights, p->pool);
    if (!rc) {
        for (int32_t l = 0; l < m->n_layers; l++) nn_moe_sizes_add(&m->moe_sizes, &m->layers[l].mlp);
        rc = nn_scratch_reserve(&m->scratch, p->max_num_batched_tokens > 0 ? p->max_num_batched_tokens : 1,
                                carve_scratch, m);
    }
    if (rc) {
        qwen3_moe_destroy(&m->base);
        return rc;
    }
    *out = &m->base;
    return 0;
}
