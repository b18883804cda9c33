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

#include "base/error.h"
#include "models/architectures.h"
#include "models/layers/arena.h"
#include "models/layers/attention.h"
#include "models/layers/batch.h"
#include "models/layers/config.h"
#include "models/layers/moe.h"
#include "models/layers/timed.h"
#include "models/layers/trunk.h"

typedef struct moe_layer {
    const float *input_norm, *post_attention_norm;
    nn_attention attn;
    nn_moe mlp;
} moe_layer;

typedef struct moe_scratch {
    nn_attention_scratch attn;
    nn_moe_scratch moe;
} moe_scratch;

typedef struct qwen3_moe_model {
    cv_model base;
    nn_trunk t;
    int32_t n_layers;
    nn_attention_dims dims;
    moe_layer *layers;
    nn_moe_sizes moe_sizes;
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
    nn_binder *b = &m->t.bound;
    const int32_t H = m->t.hidden;
    nn_bind_vocab(b, "model.embed_tokens.weight", m->t.vocab, H, cfg->tie_word_embeddings, &m->t.vocab_w);
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
    nn_bind_vector(b, "model.norm.weight", H, "hidden_size", &m->t.final_norm);
    m->base.weight_bytes = b->matmul_bytes;
}

static void carve_scratch(void *model, int32_t tokens, nn_arena *ar) {
    qwen3_moe_model *m = model;
    moe_scratch *s = &m->s;
    nn_trunk_take(&m->t, ar, tokens);
    nn_attention_scratch_take(&s->attn, &m->dims, ar, tokens);
    nn_moe_scratch_take(&s->moe, &m->moe_sizes, m->base.pool, m->t.hidden, ar, tokens);
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

static void qwen3_moe_destroy(cv_model *base) {
    qwen3_moe_model *m = (qwen3_moe_model *)base;
    nn_linear_list lins = model_linears(m);
    nn_trunk_release(&m->t, &lins);
    free(m->layers);
    free(m);
}

/* ---- forward ---------------------------------------------------------------------------------- */

static int qwen3_moe_forward(cv_model *base, const cv_batch *b, cv_kv_cache *kv, cv_state_cache *state,
                             float *logits) {
    qwen3_moe_model *m = (qwen3_moe_model *)base;
    int rc = nn_check_batch(b, kv, m->t.vocab, m->n_layers, m->t.bound.lora_sites, state, 0);
    if (!rc) rc = nn_scratch_reserve(&m->t.scratch, b->n_tokens > b->n_logits ? b->n_tokens : b->n_logits, carve_scratch, m);
    if (rc || b->n_tokens == 0) return rc;
    moe_scratch *s = &m->s;
    nn_stream *st = &m->t.st;
    const int32_t T = b->n_tokens, H = m->t.hidden;
    const float eps = m->t.eps;
    cv_threadpool *pool = base->pool;
    nn_trunk_embed(&m->t, pool, b);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const moe_layer *ly = &m->layers[l];
        nn_input in;
        NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, st->x, l ? st->o : NULL, st->a, ly->input_norm, T, H, eps,
                                                     &ly->attn.qkv, true, &st->aq, &st->ab));
        nn_attention_forward(pool, &ly->attn, &m->dims, &m->t.rope, st->cos, st->sin, b, kv, l, in, &s->attn, st->o);
        NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, st->x, st->o, st->a, ly->post_attention_norm, T, H, eps,
                                                     nn_moe_input_linear(&ly->mlp), false, &st->aq, &st->ab));
        nn_moe_forward(pool, &ly->mlp, H, in, T, &s->moe, st->o);
    }
    nn_trunk_emit(&m->t, pool, b, m->t.final_norm, logits);
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
    m->base = (cv_model){.ops = &qwen3_moe_ops, .config = cfg, .vocab_size = cfg->vocab_size,
                         .head_tensor = m->t.vocab_w.head_tensor, .pool = p->pool};
    m->base.kv_spec = (cv_kv_spec){cfg->num_hidden_layers, dims.n_kv_heads, cfg->head_dim}; /* this rank's heads */
    m->n_layers = cfg->num_hidden_layers;
    m->dims = dims;
    m->layers = cv_xcalloc((size_t)m->n_layers, sizeof *m->layers);
    rc = nn_trunk_init(&m->t, p, dims.eps);
    if (!rc) {
        bind_weights(m, cfg, &plan);
        rc = m->t.bound.rc;
    }
    free(plan.dense);
    if (!rc) {
        nn_linear_list lins = model_linears(m);
        rc = nn_trunk_pack(&m->t, p->pool, p->weights, QWEN3_MOE_PACK_LAYOUT, &lins);
    }
    if (!rc) {
        for (int32_t l = 0; l < m->n_layers; l++) nn_moe_sizes_add(&m->moe_sizes, &m->layers[l].mlp);
        rc = nn_scratch_reserve(&m->t.scratch, p->max_num_batched_tokens > 0 ? p->max_num_batched_tokens : 1,
                                carve_scratch, m);
    }
    if (rc) {
        qwen3_moe_destroy(&m->base);
        return rc;
    }
    m->base.lora_sites = m->t.bound.lora_sites;
    *out = &m->base;
    return 0;
}
