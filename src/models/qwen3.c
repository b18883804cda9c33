/*
 * qwen3.c — Qwen3ForCausalLM (dense Qwen3): weights and one forward pass, built on the shared layers
 * (models/layers/).
 *
 * Per layer: RMSNorm → attention (q/k/v projections → per-head RMSNorm of q and k → rotate-half
 * RoPE → K/V into the paged cache → causal GQA → o_proj) + residual → RMSNorm → SwiGLU MLP +
 * residual; then the final norm and lm_head (embed_tokens when tied) for the rows whose logits are
 * wanted only.
 *
 * Numerics: the residual stream and every activation stay f32 and the weights are read in their
 * checkpoint dtype by the kernels, so the result follows Hugging Face's f32 reference to rounding
 * (it does not reproduce the rounding of a bf16 HF run, which rounds every residual add to bf16;
 * keeping the residual in f32 is a deliberate choice for accuracy).
 *
 * Weights: bf16 matrices — the common case, and the one the speed targets are about — are packed
 * at load into the kernels' panels, q|k|v and gate|up stacked into one matmul each, and kept in the
 * packed-weight cache (layers/linear.h, layers/vocab.h); f32/f16 ones are views of the checkpoint.
 * Quantized checkpoints (msModelSlim W8A8 / W8A8_DYNAMIC, FP8) pack their int8 or e4m3 linears the
 * same way, each in its scheme (layers/linear.h).
 *
 * Fusions: the residual add is folded into the next RMSNorm (one pass over the residual stream),
 * and the last one into the final norm of the logit rows only; when q|k|v or gate|up read int8,
 * that norm also quantizes its output for them. Each op is timed into the kernels' profile
 * (kernels/profile.h) by the layers when profiling is on.
 *
 * The batch is checked up front (layers/batch.h); the activation scratch is sized for
 * max_num_batched_tokens at load and grown only on demand (layers/arena.h).
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "models/architectures.h"
#include "models/layers/arena.h"
#include "models/layers/attention.h"
#include "models/layers/batch.h"
#include "models/layers/config.h"
#include "models/layers/ffn.h"
#include "models/layers/timed.h"
#include "models/layers/trunk.h"

typedef struct qwen3_layer {
    const float *input_norm, *post_attention_norm;
    nn_attention attn;
    nn_ffn mlp;
} qwen3_layer;

/* Activations for up to the scratch's capacity of tokens. */
typedef struct qwen3_scratch {
    nn_attention_scratch attn;
    nn_ffn_scratch mlp;
} qwen3_scratch;

typedef struct qwen3_model {
    cv_model base;
    nn_trunk t;
    int32_t n_layers, intermediate;
    nn_attention_dims dims;
    qwen3_layer *layers;
    qwen3_scratch s;
} qwen3_model;

/* ---- loading --------------------------------------------------------------------------------- */

static void bind_weights(qwen3_model *m, const cv_model_config *cfg) {
    nn_binder *b = &m->t.bound;
    const int32_t H = m->t.hidden;
    nn_bind_vocab(b, "model.embed_tokens.weight", m->t.vocab, H, cfg->tie_word_embeddings, &m->t.vocab_w);
    for (int l = 0; l < m->n_layers; l++) {
        qwen3_layer *ly = &m->layers[l];
        char prefix[96];
        nn_bind_vector(b, nn_name(b, "model.layers.%d.input_layernorm.weight", l), H, "hidden_size", &ly->input_norm);
        snprintf(prefix, sizeof prefix, "model.layers.%d.self_attn.", l);
        nn_bind_attention(b, prefix, &m->dims, &ly->attn);
        nn_bind_vector(b, nn_name(b, "model.layers.%d.post_attention_layernorm.weight", l), H, "hidden_size",
                       &ly->post_attention_norm);
        snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.", l);
        nn_bind_ffn(b, prefix, H, m->intermediate, "intermediate_size", &ly->mlp);
    }
    nn_bind_vector(b, "model.norm.weight", H, "hidden_size", &m->t.final_norm);
    m->base.weight_bytes = b->matmul_bytes;
}

/* Every linear of the layers (the lm_head aside), in layer order; the caller frees the list. */
static nn_linear_list model_linears(qwen3_model *m) {
    nn_linear_list l = {0};
    for (int i = 0; i < m->n_layers; i++) {
        nn_attention_linears(&m->layers[i].attn, &l);
        nn_ffn_linears(&m->layers[i].mlp, &l);
    }
    return l;
}

/* Bump when the packed bytes of the same checkpoint would change (what is stacked, in which order). */
#define QWEN3_PACK_LAYOUT "qwen3 panels v1: lm_head, then per layer q|k|v, o, gate|up, down"

static int check_config(const cv_model_config *cfg) {
    if (cfg->num_hidden_layers <= 0 || cfg->intermediate_size <= 0 || cfg->vocab_size <= 0)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: Qwen3 needs positive num_hidden_layers, intermediate_size "
                                         "and vocab_size");
    return 0;
}

static void carve_scratch(void *model, int32_t tokens, nn_arena *ar) {
    qwen3_model *m = model;
    qwen3_scratch *s = &m->s;
    nn_trunk_take(&m->t, ar, tokens);
    nn_attention_scratch_take(&s->attn, &m->dims, ar, tokens);
    nn_ffn_scratch_take(&s->mlp, m->intermediate, ar, tokens);
}

static void qwen3_destroy(cv_model *base) {
    qwen3_model *m = (qwen3_model *)base;
    nn_linear_list lins = model_linears(m);
    nn_trunk_release(&m->t, &lins);
    free(m->layers);
    free(m);
}

/* ---- forward ---------------------------------------------------------------------------------- */

static int qwen3_forward(cv_model *base, const cv_batch *b, cv_kv_cache *kv, cv_state_cache *state, float *logits) {
    qwen3_model *m = (qwen3_model *)base;
    int rc = nn_check_batch(b, kv, m->t.vocab, m->n_layers, m->t.bound.lora_sites, state, 0);
    if (!rc) rc = nn_scratch_reserve(&m->t.scratch, b->n_tokens > b->n_logits ? b->n_tokens : b->n_logits, carve_scratch, m);
    if (rc || b->n_tokens == 0) return rc;
    qwen3_scratch *s = &m->s;
    nn_stream *st = &m->t.st;
    const int32_t T = b->n_tokens, H = m->t.hidden;
    const float eps = m->t.eps;
    cv_threadpool *pool = base->pool;
    nn_trunk_embed(&m->t, pool, b);
    for (int l = 0; l < m->n_layers; l++) {
        const qwen3_layer *ly = &m->layers[l];
        /* Layer input: x += the previous block's output (none before layer 0), a = input_norm(x). */
        nn_input in;
        NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, st->x, l ? st->o : NULL, st->a, ly->input_norm, T, H, eps,
                                                     &ly->attn.qkv, true, &st->aq, &st->ab));
        nn_attention_forward(pool, &ly->attn, &m->dims, &m->t.rope, st->cos, st->sin, b, kv, l, in, &s->attn, st->o);
        NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, st->x, st->o, st->a, ly->post_attention_norm, T, H, eps,
                                                     &ly->mlp.gate_up, true, &st->aq, &st->ab));
        nn_ffn_forward(pool, &ly->mlp, in, T, &s->mlp, st->o);
    }
    nn_trunk_emit(&m->t, pool, b, m->t.final_norm, logits);
    return 0;
}

static const cv_model_ops qwen3_ops = {.forward = qwen3_forward, .destroy = qwen3_destroy};

int cv_qwen3_load(const cv_model_load_params *p, cv_model **out) {
    const cv_model_config *cfg = p->config;
    *out = NULL;
    nn_attention_dims dims;
    int rc = check_config(cfg);
    const int tp = p->tp ? p->tp->size : 1;
    if (!rc) rc = nn_attention_dims_from_config(cfg, false, false, tp, &dims);
    if (rc) return rc;
    qwen3_model *m = cv_xcalloc(1, sizeof *m);
    m->base = (cv_model){.ops = &qwen3_ops, .config = cfg, .vocab_size = cfg->vocab_size,
                         .head_tensor = m->t.vocab_w.head_tensor, .pool = p->pool};
    m->base.kv_spec = (cv_kv_spec){cfg->num_hidden_layers, dims.n_kv_heads, cfg->head_dim}; /* this rank's heads */
    m->n_layers = cfg->num_hidden_layers;
    m->intermediate = cfg->intermediate_size;
    m->dims = dims;
    m->layers = cv_xcalloc((size_t)m->n_layers, sizeof *m->layers);
    rc = nn_trunk_init(&m->t, p, dims.eps);
    if (!rc) {
        bind_weights(m, cfg);
        rc = m->t.bound.rc;
    }
    if (!rc) {
        nn_linear_list lins = model_linears(m);
        rc = nn_trunk_pack(&m->t, p->pool, p->weights, QWEN3_PACK_LAYOUT, &lins);
    }
    if (!rc) rc = nn_scratch_reserve(&m->t.scratch, p->max_num_batched_tokens, carve_scratch, m);
    if (rc) {
        qwen3_destroy(&m->base);
        return rc;
    }
    m->base.lora_sites = m->t.bound.lora_sites;
    *out = &m->base;
    return 0;
}
