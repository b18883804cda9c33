/*
 * qwen3_hybrid.c — the hybrid Gated-DeltaNet / gated-attention models: Qwen3NextForCausalLM,
 * Qwen3_5MoeForConditionalGeneration (Qwen3.5- and Qwen3.6-MoE, text tower only) and Qwen3.5 dense,
 * Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM (e.g. Qwen3.6-27B).
 *
 * They differ only in how the checkpoint spells things and in the MLP, so one file serves all:
 * Qwen3.5 nests its fields in text_config, prefixes the text model with
 * "model.language_model." (the multimodal wrapper) or "model." (text-only ForCausalLM) and stores
 * the GDN input projections as four contiguous matrices; Qwen3-Next uses "model." and two fused
 * matrices grouped per key head, which the GDN layer unpacks into the same order (layers/gdn.h).
 * Routed experts may be fused 3-D tensors or per-expert matrices in either family (layers/moe.h
 * binds both); Qwen3.5 dense has a SwiGLU MLP of intermediate_size in every layer instead, a
 * per-layer choice the MoE families make too (Qwen3-Next's mlp_only_layers), so it is one branch of
 * the binding, not another model. model.visual.* tensors are never bound, mtp.* only when asked
 * for (load_mtp).
 *
 * Per layer: (1+w) RMSNorm → GDN (layer_types "linear_attention", layers/gdn.h) or gated attention
 * with partial RoPE and (1+w) QK-norm (layers/attention.h) → residual → (1+w) RMSNorm → MoE with
 * sigmoid-gated shared expert, or the dense MLP (layers/moe.h) → residual; each residual add is
 * fused into the next norm.
 *
 * Recurrent state: one engine slot per sequence holding each GDN layer's part in layer order
 * (nn_gdn_state_bytes). A sequence whose first token in the batch is at position 0 gets its slot
 * zeroed first. Only the full-attention layers use the paged KV cache (kv layer = their rank).
 * A checkpoint (model.h) is written layer by layer as the forward passes through; attention layers
 * keep nothing in the slot. So a forward with checkpoints costs a few extra chunk boundaries and
 * one state write per checkpoint, not a pass.
 *
 * MTP (every family spells it alike): with load_mtp and an mtp.* module in the
 * checkpoint, its decoder layer is a full-attention layer like the main ones (same code, run_layer;
 * MoE, or dense in Qwen3.5 dense, as vLLM's Qwen3_5MTP) on one more kv layer after the main
 * model's; forward() then also hands out the final-normed hidden states it feeds to lm_head, which
 * are the MTP step's input, as in vLLM's proposer.
 *
 * Weights: every bf16 linear but the routed experts — lm_head (a tied embedding is then read from
 * it), attention, GDN projections, router, shared expert or dense MLP, MTP fc — is packed into
 * panels at load (layers/linear.h), lm_head first; quantized linears and routed experts
 * (msModelSlim's recipes quantize attention q|k|v and the experts) are packed in their scheme, and
 * each norm quantizes its output for an int8 q|k|v, GDN input projection or gate|up.
 *
 * Tensor parallelism (model.h cv_tp): every rank holds its share of the attention heads and of the
 * GDN key heads (with their value heads and recurrent state: a rank's state slot holds its heads
 * only), the MLP or experts split as in Qwen3-MoE; the residual stream is whole on every rank, so
 * the MTP module's fc runs whole and its layer split like the others.
 *
 * Scratch: the attention and GDN activations are never live together, so they share one region of
 * the arena sized for the larger.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "models/architectures.h"
#include "models/layers/arena.h"
#include "models/layers/attention.h"
#include "models/layers/batch.h"
#include "models/layers/config.h"
#include "models/layers/gdn.h"
#include "models/layers/moe.h"
#include "models/layers/timed.h"
#include "models/layers/trunk.h"

typedef enum hybrid_family { FAMILY_NEXT, FAMILY_QWEN3_5 } hybrid_family;

typedef struct hybrid_layer {
    bool linear;
    int32_t index;                          /* rank among layers of its kind: kv layer or state part */
    const float *input_norm, *post_attention_norm;
    nn_gdn gdn;
    nn_attention attn;
    nn_moe mlp;
} hybrid_layer;

/* The multi-token-prediction module: one gated-attention decoder layer behind
 * a projection of [normed embedding of the next token; normed hidden], sharing the main model's
 * embedding and lm_head. */
typedef struct mtp_module {
    const float *norm_embedding, *norm_hidden, *final_norm;
    nn_linear fc;                           /* [hidden][2·hidden], embedding half first */
    hybrid_layer layer;                     /* layer.index: its kv layer (after the main model's) */
} mtp_module;

typedef struct hybrid_scratch {
    float *pair;                            /* [capacity][2·hidden] MTP fc input; NULL without MTP */
    nn_gdn_batch gdn_batch;
    nn_attention_scratch attn;
    nn_gdn_scratch gdn;
    nn_moe_scratch moe;
} hybrid_scratch;

typedef struct hybrid_model {
    cv_model base;
    nn_trunk t;                             /* its embedding and lm_head are shared with the MTP module */
    hybrid_family family;
    int32_t n_layers, n_linear;
    nn_attention_dims dims;
    nn_gdn_dims gd;
    hybrid_layer *layers;
    mtp_module *mtp;                        /* NULL unless asked for (load_mtp) and present */
    nn_moe_sizes moe_sizes;
    hybrid_scratch s;
} hybrid_model;

/* ---- config ----------------------------------------------------------------------------------- */

/* Which layers are linear attention: the explicit layer_types list, else every
 * full_attention_interval-th layer is full attention. */
static int read_layer_types(const cv_model_config *cfg, hybrid_model *m) {
    json_t *types = json_object_get(cfg->text, "layer_types");
    if (!types || json_is_null(types)) {
        int32_t interval;
        int rc = nn_cfg_int(cfg, "full_attention_interval", 4, &interval);
        if (rc) return rc;
        for (int32_t l = 0; l < m->n_layers; l++) m->layers[l].linear = (l + 1) % interval != 0;
        return 0;
    }
    if (!json_is_array(types) || (int32_t)json_array_size(types) != m->n_layers)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: layer_types must list one type for each of the %d layers",
                       m->n_layers);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        if (t && !strcmp(t, "linear_attention")) m->layers[l].linear = true;
        else if (!t || strcmp(t, "full_attention"))
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: layer_types[%d] must be \"linear_attention\" or "
                           "\"full_attention\"", l);
    }
    return 0;
}

typedef struct hybrid_plan {
    nn_moe_config moe;                      /* all zero without MoE */
    bool *dense;                            /* [n_layers]: dense MLP instead of MoE */
    bool dense_mtp;                         /* the MTP layer's MLP is dense too (no MoE at all) */
} hybrid_plan;

/* Qwen3.5 dense: its config has no MoE fields, and every MLP, the MTP layer's included (as vLLM's
 * Qwen3_5MTP builds it), is a SwiGLU of intermediate_size. */
static bool dense_architecture(const char *arch) {
    return !strcmp(arch, "Qwen3_5ForConditionalGeneration") || !strcmp(arch, "Qwen3_5ForCausalLM");
}

static int read_mlp_plan(const cv_model_config *cfg, hybrid_family family, hybrid_plan *p) {
    if (dense_architecture(cfg->architecture)) {
        if (cfg->intermediate_size <= 0)
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: missing required field \"intermediate_size\" for %s",
                           cfg->architecture);
        for (int32_t l = 0; l < cfg->num_hidden_layers; l++) p->dense[l] = true;
        p->dense_mtp = true;
        return 0;
    }
    int rc = nn_cfg_int(cfg, "num_experts", -1, &p->moe.n_experts);
    if (!rc) rc = nn_cfg_int(cfg, "num_experts_per_tok", -1, &p->moe.top_k);
    if (!rc) rc = nn_cfg_int(cfg, "moe_intermediate_size", -1, &p->moe.expert_inter);
    if (!rc) rc = nn_cfg_int(cfg, "shared_expert_intermediate_size", -1, &p->moe.shared_inter);
    if (rc || family == FAMILY_QWEN3_5) {
        p->moe.renormalize = true; /* Qwen3.5's router always renormalises; there is no flag */
        return rc;
    }
    int32_t step;
    rc = nn_cfg_bool(cfg, "norm_topk_prob", true, &p->moe.renormalize);
    if (!rc) rc = nn_cfg_int(cfg, "decoder_sparse_step", 1, &step);
    if (!rc) rc = nn_cfg_layer_list(cfg, "mlp_only_layers", cfg->num_hidden_layers, p->dense);
    for (int32_t l = 0; !rc && l < cfg->num_hidden_layers; l++) {
        p->dense[l] = p->dense[l] || (l + 1) % step != 0;
        if (p->dense[l] && cfg->intermediate_size <= 0)
            rc = cv_fail(CVLLM_ERR_FORMAT, "config.json: layer %d has a dense MLP but intermediate_size is missing", l);
    }
    return rc;
}

static int read_config(const cv_model_config *cfg, int tp, hybrid_model *m, hybrid_plan *p) {
    bool gated;
    int rc = nn_cfg_bool(cfg, "attn_output_gate", true, &gated);
    if (!rc && !gated)
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: attn_output_gate=false is not supported for %s",
                     cfg->architecture);
    if (!rc) rc = nn_attention_dims_from_config(cfg, true, true, tp, &m->dims);
    if (!rc) rc = read_layer_types(cfg, m);
    if (!rc) rc = nn_gdn_dims_from_config(cfg, m->family == FAMILY_NEXT, tp, &m->gd);
    if (!rc) rc = read_mlp_plan(cfg, m->family, p);
    return rc;
}

/* ---- weights ---------------------------------------------------------------------------------- */

/* The MLP at prefix ("...mlp."): the dense SwiGLU or the MoE block, as the plan says. */
static void bind_mlp(nn_binder *b, const char *prefix, int32_t hidden, const cv_model_config *cfg,
                     const hybrid_plan *plan, bool dense, nn_moe *out) {
    if (dense) nn_bind_dense_mlp(b, prefix, hidden, cfg->intermediate_size, out);
    else nn_bind_moe(b, prefix, hidden, &plan->moe, out);
}

#define WRAPPER_ROOT "model.language_model."

/* Where the text model's tensors are: "model." for Qwen3-Next and text-only Qwen3.5
 * (Qwen3_5ForCausalLM), "model.language_model." inside the multimodal Qwen3.5 wrapper
 * (...ForConditionalGeneration). Text towers cut out of the wrapper are published under a
 * ForCausalLM config but keep the wrapper's names, so a Qwen3.5 checkpoint that lacks its
 * architecture's embedding and has the other spelling's is read under that one. */
static int text_root(const cv_model_load_params *p, const hybrid_model *m, const char **root) {
    const bool wrapper = strstr(p->config->architecture, "ForConditionalGeneration") != NULL;
    *root = wrapper ? WRAPPER_ROOT : "model.";
    if (m->family == FAMILY_NEXT || cv_weight_source_is_dummy(p->weights)) return 0;
    const char *const candidates[2] = {*root, wrapper ? "model." : WRAPPER_ROOT};
    const int64_t shape[2] = {m->t.vocab, m->t.hidden};
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof name, "%sembed_tokens.weight", candidates[i]);
        cv_tensor t;
        int rc = cv_weights_get_optional(p->weights, name, 2, shape, "vocab_size, hidden_size", &t);
        if (rc < 0) return rc;
        if (rc > 0) {
            *root = candidates[i];
            return 0;
        }
    }
    return 0; /* neither: binding names the architecture's own tensor as missing */
}

static void bind_weights(hybrid_model *m, const cv_model_config *cfg, const hybrid_plan *plan, const char *root) {
    nn_binder *b = &m->t.bound;
    const int32_t H = m->t.hidden;
    nn_bind_vocab(b, nn_name(b, "%sembed_tokens.weight", root), m->t.vocab, H, cfg->tie_word_embeddings, &m->t.vocab_w);
    for (int32_t l = 0; l < m->n_layers && !b->rc; l++) {
        hybrid_layer *ly = &m->layers[l];
        char p[128];
        nn_bind_gain_plus_one(b, nn_name(b, "%slayers.%d.input_layernorm.weight", root, l), H, "hidden_size",
                              &ly->input_norm);
        if (ly->linear) {
            snprintf(p, sizeof p, "%slayers.%d.linear_attn.", root, l);
            nn_bind_gdn(b, p, &m->gd, H, &ly->gdn);
        } else {
            snprintf(p, sizeof p, "%slayers.%d.self_attn.", root, l);
            nn_bind_attention(b, p, &m->dims, &ly->attn);
        }
        nn_bind_gain_plus_one(b, nn_name(b, "%slayers.%d.post_attention_layernorm.weight", root, l), H,
                              "hidden_size", &ly->post_attention_norm);
        snprintf(p, sizeof p, "%slayers.%d.mlp.", root, l);
        bind_mlp(b, p, H, cfg, plan, plan->dense[l], &ly->mlp);
    }
    nn_bind_gain_plus_one(b, nn_name(b, "%snorm.weight", root), H, "hidden_size", &m->t.final_norm);
    m->base.weight_bytes = b->matmul_bytes;
}

/* How many MTP layers config.json declares (Qwen3.5: mtp_num_hidden_layers, Qwen3-Next:
 * num_nextn_predict_layers); -1 when it does not say. */
static int mtp_layers_declared(const cv_model_config *cfg, int32_t *out) {
    static const char *const keys[] = {"mtp_num_hidden_layers", "num_nextn_predict_layers"};
    *out = -1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(cfg->text, keys[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" must be a non-negative integer", keys[i]);
        *out = (int32_t)json_integer_value(v);
        if (*out > 1)
            return cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: %s=%d; only one MTP layer is supported", keys[i], *out);
    }
    return 0;
}

/* Whether there is an MTP module to load: the checkpoint decides (a config may declare one its
 * weights were stripped of), unless config.json declares none; made-up weights follow config.json. */
static int mtp_present(const cv_model_load_params *p, const hybrid_model *m, bool *present) {
    int32_t declared;
    int rc = mtp_layers_declared(p->config, &declared);
    *present = false;
    if (rc || declared == 0) return rc;
    if (cv_weight_source_is_dummy(p->weights)) {
        *present = declared > 0;
        return 0;
    }
    int64_t shape[2] = {m->t.hidden, 2 * (int64_t)m->t.hidden};
    cv_tensor t;
    rc = cv_weights_get_optional(p->weights, "mtp.fc.weight", 2, shape, "hidden_size, 2*hidden_size", &t);
    *present = rc > 0;
    return rc < 0 ? rc : 0;
}

/* mtp.* as a module whose layer writes kv layer `kv_layer`; its weights are not counted in the
 * per-token weight bytes of the main model. */
static void bind_mtp(hybrid_model *m, const cv_model_config *cfg, const hybrid_plan *plan, int32_t kv_layer) {
    nn_binder *b = &m->t.bound;
    const int32_t H = m->t.hidden;
    const size_t streamed = b->matmul_bytes;
    mtp_module *t = nn_own(b, sizeof *t);
    if (!t) return;
    b->adapters_off = true; /* drafts come from the base model's MTP module */
    nn_bind_gain_plus_one(b, "mtp.pre_fc_norm_embedding.weight", H, "hidden_size", &t->norm_embedding);
    nn_bind_gain_plus_one(b, "mtp.pre_fc_norm_hidden.weight", H, "hidden_size", &t->norm_hidden);
    nn_bind_linear(b, &t->fc, "mtp.fc", H, 2 * (int64_t)H, "hidden_size, 2*hidden_size");
    nn_bind_gain_plus_one(b, "mtp.norm.weight", H, "hidden_size", &t->final_norm);
    hybrid_layer *ly = &t->layer;
    ly->index = kv_layer;
    nn_bind_gain_plus_one(b, "mtp.layers.0.input_layernorm.weight", H, "hidden_size", &ly->input_norm);
    nn_bind_attention(b, "mtp.layers.0.self_attn.", &m->dims, &ly->attn);
    nn_bind_gain_plus_one(b, "mtp.layers.0.post_attention_layernorm.weight", H, "hidden_size",
                          &ly->post_attention_norm);
    bind_mlp(b, "mtp.layers.0.mlp.", H, cfg, plan, plan->dense_mtp, &ly->mlp);
    b->adapters_off = false;
    b->matmul_bytes = streamed;
    if (!b->rc) m->mtp = t;
}

/* ---- scratch ---------------------------------------------------------------------------------- */

/* `tokens` rows also bound the sequences and checkpoints of a batch (rows_needed). */
static void carve_scratch(void *model, int32_t tokens, nn_arena *ar) {
    hybrid_model *m = model;
    hybrid_scratch *s = &m->s;
    nn_trunk_take(&m->t, ar, tokens);
    s->pair = m->mtp ? nn_take(ar, 2 * (size_t)tokens * (size_t)m->t.hidden * sizeof(float)) : NULL;
    nn_gdn_batch_take(&s->gdn_batch, ar, tokens);
    nn_moe_scratch_take(&s->moe, &m->moe_sizes, m->base.pool, m->t.hidden, ar, tokens);
    const size_t mixer = ar->size;
    nn_attention_scratch_take(&s->attn, &m->dims, ar, tokens);
    const size_t attn_end = ar->size;
    ar->size = mixer;
    nn_gdn_scratch_take(&s->gdn, &m->gd, m->base.pool, ar, tokens);
    if (attn_end > ar->size) ar->size = attn_end;
}

/* Appends the linears of one decoder layer to list. */
static void layer_linears(hybrid_layer *ly, nn_linear_list *list) {
    if (ly->linear) nn_gdn_linears(&ly->gdn, list);
    else nn_attention_linears(&ly->attn, list);
    nn_moe_linears(&ly->mlp, list);
}

/* Every linear the layers and the MTP module read (the lm_head aside), in layer order; the caller
 * frees the list. */
static nn_linear_list model_linears(hybrid_model *m) {
    nn_linear_list l = {0};
    for (int32_t i = 0; i < m->n_layers; i++) layer_linears(&m->layers[i], &l);
    if (m->mtp) {
        nn_linear_list_add(&l, &m->mtp->fc);
        layer_linears(&m->mtp->layer, &l);
    }
    return l;
}

/* Bump when what model_linears() lists, or how its parts stack, changes: it keys the packed-weight cache. */
#define HYBRID_PACK_LAYOUT "qwen3-hybrid panels v1: lm_head, then model_linears() in order"

static void hybrid_destroy(cv_model *base) {
    hybrid_model *m = (hybrid_model *)base;
    nn_linear_list lins = model_linears(m);
    nn_trunk_release(&m->t, &lins);
    free(m->layers);
    free(m);
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Sequences starting at position 0 begin from zero state. */
static void clear_new_states(const hybrid_model *m, const cv_batch *b, const cv_state_cache *st) {
    for (int32_t q = 0; q < b->n_seqs; q++)
        if (b->seq_start[q + 1] > b->seq_start[q] && b->positions[b->seq_start[q]] == 0)
            memset(st->data + (size_t)b->state_slots[q] * st->slot_bytes, 0, m->base.state_bytes_per_seq);
}

/* One decoder layer on the residual stream x, to which the previous layer's output o is added first
 * unless this is the first layer (cos/sin already filled for the batch). */
static void run_layer(hybrid_model *m, const hybrid_layer *ly, bool first, const cv_batch *b, cv_kv_cache *kv,
                      const cv_state_cache *st) {
    hybrid_scratch *s = &m->s;
    nn_stream *sx = &m->t.st;
    const int32_t T = b->n_tokens, H = m->t.hidden;
    const float eps = m->t.eps;
    cv_threadpool *pool = m->base.pool;
    const nn_linear *mixer_input = ly->linear ? &ly->gdn.in_proj : &ly->attn.qkv;
    nn_input in;
    NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, sx->x, first ? NULL : sx->o, sx->a, ly->input_norm, T, H, eps,
                                                 mixer_input, false, &sx->aq, &sx->ab));
    if (ly->linear)
        nn_gdn_forward(pool, &ly->gdn, &m->gd, b, st, (size_t)ly->index * nn_gdn_state_bytes(&m->gd), &s->gdn_batch,
                       in, &s->gdn, sx->o);
    else
        nn_attention_forward(pool, &ly->attn, &m->dims, &m->t.rope, sx->cos, sx->sin, b, kv, ly->index, in, &s->attn,
                             sx->o);
    NN_TIMED(CV_OP_NORM, in = nn_add_rmsnorm_for(pool, sx->x, sx->o, sx->a, ly->post_attention_norm, T, H, eps,
                                                 nn_moe_input_linear(&ly->mlp), false, &sx->aq, &sx->ab));
    nn_moe_forward(pool, &ly->mlp, H, in, T, &s->moe, sx->o);
}

static int32_t rows_needed(const cv_batch *b) {
    int32_t need = b->n_tokens > b->n_logits ? b->n_tokens : b->n_logits;
    if (need < b->n_seqs) need = b->n_seqs;
    return need > b->n_checkpoints ? need : b->n_checkpoints;
}

static int hybrid_forward(cv_model *base, const cv_batch *b, cv_kv_cache *kv, cv_state_cache *st, float *logits) {
    hybrid_model *m = (hybrid_model *)base;
    int rc = nn_check_batch(b, kv, m->t.vocab, base->kv_spec.num_layers, m->t.bound.lora_sites, st,
                            base->state_bytes_per_seq);
    if (!rc) rc = nn_scratch_reserve(&m->t.scratch, rows_needed(b), carve_scratch, m);
    if (rc || b->n_tokens == 0) return rc;
    hybrid_scratch *s = &m->s;
    clear_new_states(m, b, st);
    nn_gdn_batch_index(&s->gdn_batch, b);
    nn_trunk_embed(&m->t, base->pool, b);
    for (int32_t l = 0; l < m->n_layers; l++) run_layer(m, &m->layers[l], l == 0, b, kv, st);
    nn_trunk_emit(&m->t, base->pool, b, m->t.final_norm, logits);
    return 0;
}

/* The MTP step (model.h). `hidden` is read in full before hidden_out is
 * written, so the engine may pass the previous step's hidden_out as both. */
static int hybrid_mtp_forward(cv_model *base, const cv_batch *batch, const float *hidden, cv_kv_cache *kv,
                              float *logits) {
    hybrid_model *m = (hybrid_model *)base;
    const mtp_module *mtp = m->mtp;
    assert(mtp);
    cv_batch b = *batch; /* the MTP layer keeps no recurrent state: slots and checkpoints do not apply */
    b.state_slots = NULL;
    b.checkpoints = NULL;
    b.n_checkpoints = 0;
    int rc = nn_check_batch(&b, kv, m->t.vocab, base->kv_spec.num_layers, m->t.bound.lora_sites, NULL, 0);
    if (!rc && b.n_tokens > 0 && !hidden)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "mtp_forward: no hidden states for its %d tokens", b.n_tokens);
    if (!rc) rc = nn_scratch_reserve(&m->t.scratch, rows_needed(&b), carve_scratch, m);
    if (rc || b.n_tokens == 0) return rc;
    hybrid_scratch *s = &m->s;
    nn_stream *sx = &m->t.st;
    const int32_t T = b.n_tokens, H = m->t.hidden;
    nn_embed(&m->t.vocab_w, b.token_ids, T, sx->a);
    NN_TIMED(CV_OP_NORM, for (int64_t t = 0; t < T; t++) {
        cv_rmsnorm(s->pair + t * 2 * H, sx->a + t * H, mtp->norm_embedding, 1, H, m->t.eps);
        cv_rmsnorm(s->pair + t * 2 * H + H, hidden + t * H, mtp->norm_hidden, 1, H, m->t.eps);
    });
    nn_linear_forward(base->pool, &mtp->fc, nn_f32(s->pair), T, &sx->x);
    NN_TIMED(CV_OP_EMBED, cv_rope_cos_sin(base->pool, &m->t.rope, b.positions, T, sx->cos, sx->sin));
    run_layer(m, &mtp->layer, true, &b, kv, NULL);
    nn_trunk_emit(&m->t, base->pool, &b, mtp->final_norm, logits);
    return 0;
}

static const cv_model_ops hybrid_ops = {.forward = hybrid_forward, .destroy = hybrid_destroy};
static const cv_model_ops hybrid_mtp_ops = {
    .forward = hybrid_forward, .mtp_forward = hybrid_mtp_forward, .destroy = hybrid_destroy};

/* Layer ranks, KV spec and state size once the layer kinds are known. */
static void lay_out_state(hybrid_model *m, const cv_model_config *cfg) {
    int32_t n_attn = 0;
    for (int32_t l = 0; l < m->n_layers; l++) m->layers[l].index = m->layers[l].linear ? m->n_linear++ : n_attn++;
    m->base.kv_spec = (cv_kv_spec){n_attn, m->dims.n_kv_heads, cfg->head_dim}; /* this rank's heads */
    m->base.state_bytes_per_seq = (size_t)m->n_linear * nn_gdn_state_bytes(&m->gd);
}

int cv_qwen3_hybrid_load(const cv_model_load_params *p, cv_model **out) {
    const cv_model_config *cfg = p->config;
    *out = NULL;
    hybrid_model *m = cv_xcalloc(1, sizeof *m);
    m->base = (cv_model){.ops = &hybrid_ops, .config = cfg, .vocab_size = cfg->vocab_size,
                         .head_tensor = m->t.vocab_w.head_tensor, .pool = p->pool,
                         .state_checkpoints = true};
    m->family = strcmp(cfg->architecture, "Qwen3NextForCausalLM") == 0 ? FAMILY_NEXT : FAMILY_QWEN3_5;
    m->n_layers = cfg->num_hidden_layers;
    m->layers = cv_xcalloc((size_t)m->n_layers, sizeof *m->layers);
    hybrid_plan plan = {.dense = cv_xcalloc((size_t)m->n_layers, sizeof(bool))};
    const char *root = NULL;
    int rc = nn_trunk_init(&m->t, p, (float)cfg->rms_norm_eps);
    if (!rc) rc = read_config(cfg, p->tp ? p->tp->size : 1, m, &plan);
    if (!rc) rc = text_root(p, m, &root);
    if (!rc) {
        lay_out_state(m, cfg);
        bind_weights(m, cfg, &plan, root);
        rc = m->t.bound.rc;
    }
    bool with_mtp = false;
    if (!rc && p->load_mtp) rc = mtp_present(p, m, &with_mtp);
    if (!rc && with_mtp) {
        bind_mtp(m, cfg, &plan, m->base.kv_spec.num_layers++);
        rc = m->t.bound.rc;
    }
    free(plan.dense);
    if (!rc) {
        nn_linear_list lins = model_linears(m);
        rc = nn_trunk_pack(&m->t, p->pool, p->weights, HYBRID_PACK_LAYOUT, &lins);
    }
    if (!rc) {
        for (int32_t l = 0; l < m->n_layers; l++) nn_moe_sizes_add(&m->moe_sizes, &m->layers[l].mlp);
        if (m->mtp) {
            nn_moe_sizes_add(&m->moe_sizes, &m->mtp->layer.mlp);
            m->base.ops = &hybrid_mtp_ops;
        }
        rc = nn_scratch_reserve(&m->t.scratch, p->max_num_batched_tokens > 0 ? p->max_num_batched_tokens : 1,
                                carve_scratch, m);
    }
    if (rc) {
        hybrid_destroy(&m->base);
        return rc;
    }
    m->base.lora_sites = m->t.bound.lora_sites;
    *out = &m->base;
    return 0;
}
