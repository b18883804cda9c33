/*
 * qwen3_hybrid.c — the hybrid Gated-DeltaNet / gated-attention models: Qwen3NextForCausalLM,
 * Qwen3_5MoeForConditionalGeneration (Qwen3.5- and Qwen3.6-MoE, text tower only) and Qwen3.5 dense,
 * Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM (e.g. Qwen3.6-27B).
 *
 * They differ only in how the checkpoint spells things and in the MLP, so one file serves all:
 * Qwen3.5 nests its fields in text_config, prefixes the text model with
 * "model.language_model." (the multimodal wrapper) or "model." (text-only ForCausalLM) and stores
 * the GDN input projections as four contiguous matrices (in_proj_qkv, in_proj_z, in_proj_b,
 * in_proj_a); Qwen3-Next uses "model." and two fused matrices grouped per key head (in_proj_qkvz,
 * in_proj_ba) whose outputs are unpacked here into the same contiguous [q | k | v], z, b, a order,
 * after which one code path runs. Routed experts may be fused 3-D tensors or per-expert matrices
 * in either family (qwen3_blocks.c binds both); Qwen3.5 dense has a SwiGLU MLP of
 * intermediate_size in every layer instead, a per-layer choice the MoE families make too
 * (Qwen3-Next's mlp_only_layers), so it is one branch of the binding, not another model.
 * model.visual.* tensors are never bound, mtp.* only when asked for (load_mtp).
 *
 * Per layer: (1+w) RMSNorm → GDN (layer_types "linear_attention") or gated attention with partial
 * RoPE and (1+w) QK-norm → residual → (1+w) RMSNorm → MoE with sigmoid-gated shared expert, or the
 * dense MLP → residual. A GDN layer: projections → causal depthwise conv + SiLU over q,k,v (state:
 * the last kernel−1 raw inputs) → L2-normalised q (scaled by dk^−1/2) and k → gates β = σ(b),
 * g = −exp(A_log)·softplus(a + dt_bias) → gated delta rule (kernels/cpu/gdn.c) → per-head RMSNorm
 * with a plain gain, times silu(z) → out_proj.
 *
 * Recurrent state: one engine slot per sequence holding, for each GDN layer in order, its conv
 * state [kernel−1][conv_dim] then its delta-rule state [n_v_heads][k_dim][v_dim], all f32, each part
 * 64-byte aligned. A sequence whose first token in the batch is at position 0 gets its slot zeroed
 * first. Only the full-attention layers use the paged KV cache (kv layer = their rank).
 * A checkpoint (model.h) is written layer by layer as the forward passes through: the conv part
 * from the raw inputs around the token (cv_conv1d_state_after), the delta-rule part by the kernel,
 * which cuts its chunks at the token; attention layers keep nothing in the slot. So a forward with
 * checkpoints costs a few extra chunk boundaries and one state write per checkpoint, not a pass.
 *
 * MTP (every family spells it alike): with load_mtp and an mtp.* module in the
 * checkpoint, its decoder layer is a full-attention layer like the main ones (same code, run_layer;
 * MoE, or dense in Qwen3.5 dense, as vLLM's Qwen3_5MTP) on one more kv layer after the main
 * model's; forward() then also hands out the final-normed hidden states it feeds to lm_head, which
 * are the MTP step's input, as in vLLM's proposer.
 *
 * Weights: every bf16 linear but the routed experts — lm_head (a tied embedding is then read from
 * it), attention, GDN projections, router, shared expert or dense MLP, MTP fc — is packed into
 * panels at load (qwen3_blocks.c), lm_head first.
 *
 * Scratch: the attention and GDN activations are never live together, so they share one region of
 * the arena sized for the larger.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "models/architectures.h"
#include "models/layers/batch.h"
#include "models/qwen3_blocks.h"

typedef enum hybrid_family { FAMILY_NEXT, FAMILY_QWEN3_5 } hybrid_family;

typedef struct gdn_dims {
    int32_t n_k_heads, n_v_heads, k_dim, v_dim, kernel;
    int32_t key_dim, value_dim, conv_dim;   /* nk·dk, nv·dv, 2·key_dim + value_dim */
} gdn_dims;

/* The input projections as linears: Qwen3-Next in_proj_qkvz | in_proj_ba (grouped per key head) in
 * in_proj alone; Qwen3.5 in_proj_qkv | in_proj_z in in_proj and in_proj_b | in_proj_a in in_ba, apart
 * because b has only linear_num_value_heads rows, which need not fill whole panels. */
typedef struct gdn_weights {
    qb_linear in_proj, in_ba;               /* in_ba: Qwen3.5 only */
    const float *conv;                      /* [kernel][conv_dim], tap-major */
    const float *a_log, *dt_bias, *norm;
    qb_linear out_proj;
} gdn_weights;

typedef struct hybrid_layer {
    bool linear;
    int32_t index;                          /* rank among layers of its kind: kv layer or state part */
    const float *input_norm, *post_attention_norm;
    gdn_weights gdn;
    qb_attention attn;
    qb_moe mlp;
} hybrid_layer;

/* The multi-token-prediction module: one gated-attention decoder layer behind
 * a projection of [normed embedding of the next token; normed hidden], sharing the main model's
 * embedding and lm_head. */
typedef struct mtp_module {
    const float *norm_embedding, *norm_hidden, *final_norm;
    qb_linear fc;                           /* [hidden][2·hidden], embedding half first */
    hybrid_layer layer;                     /* layer.index: its kv layer (after the main model's) */
} mtp_module;

typedef struct gdn_scratch {
    float *qkvz, *ba;                       /* Qwen3-Next raw projections */
    float *qkv, *u, *z, *b, *alpha, *g, *beta, *o;
    void *workspace;
} gdn_scratch;

typedef struct hybrid_scratch {
    int32_t capacity;
    void *mem;
    float *x, *a, *t, *cos, *sin;
    float *pair;                            /* [capacity][2·hidden] MTP fc input; NULL without MTP */
    float **states;                         /* [capacity] per sequence of the batch */
    int32_t *ckpt_start, *ckpt_token;       /* [capacity+1], [capacity]: the batch's checkpoints per sequence */
    float **ckpt_states;                    /* [capacity]: their delta-rule states in the current layer */
    qb_attention_scratch attn;
    gdn_scratch gdn;
    qb_moe_scratch moe;
} hybrid_scratch;

typedef struct hybrid_model {
    cv_model base;
    hybrid_family family;
    int32_t hidden, n_layers, vocab, n_linear;
    float eps;
    qb_attention_dims dims;
    gdn_dims gd;
    size_t conv_state_bytes, layer_state_bytes;
    qb_vocab vocab_w;                       /* embedding and lm_head, shared with the MTP module */
    const float *final_norm;
    hybrid_layer *layers;
    mtp_module *mtp;                        /* NULL unless asked for (load_mtp) and present */
    cv_rope rope;
    qb_binder bound;
    qb_moe_sizes moe_sizes;
    hybrid_scratch s;
} hybrid_model;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---- config ----------------------------------------------------------------------------------- */

/* Which layers are linear attention: the explicit layer_types list, else every
 * full_attention_interval-th layer is full attention. */
static int read_layer_types(const cv_model_config *cfg, hybrid_model *m) {
    json_t *types = json_object_get(cfg->text, "layer_types");
    if (!types || json_is_null(types)) {
        int32_t interval;
        int rc = qb_cfg_int(cfg, "full_attention_interval", 4, &interval);
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

static int read_gdn_dims(const cv_model_config *cfg, gdn_dims *g) {
    int rc = qb_cfg_int(cfg, "linear_num_key_heads", -1, &g->n_k_heads);
    if (!rc) rc = qb_cfg_int(cfg, "linear_num_value_heads", -1, &g->n_v_heads);
    if (!rc) rc = qb_cfg_int(cfg, "linear_key_head_dim", -1, &g->k_dim);
    if (!rc) rc = qb_cfg_int(cfg, "linear_value_head_dim", -1, &g->v_dim);
    if (!rc) rc = qb_cfg_int(cfg, "linear_conv_kernel_dim", 4, &g->kernel);
    if (rc) return rc;
    if (g->n_v_heads % g->n_k_heads)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: linear_num_value_heads=%d is not a multiple of "
                       "linear_num_key_heads=%d", g->n_v_heads, g->n_k_heads);
    g->key_dim = g->n_k_heads * g->k_dim;
    g->value_dim = g->n_v_heads * g->v_dim;
    g->conv_dim = 2 * g->key_dim + g->value_dim;
    return 0;
}

typedef struct hybrid_plan {
    qb_moe_config moe;                      /* all zero without MoE */
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
    int rc = qb_cfg_int(cfg, "num_experts", -1, &p->moe.n_experts);
    if (!rc) rc = qb_cfg_int(cfg, "num_experts_per_tok", -1, &p->moe.top_k);
    if (!rc) rc = qb_cfg_int(cfg, "moe_intermediate_size", -1, &p->moe.expert_inter);
    if (!rc) rc = qb_cfg_int(cfg, "shared_expert_intermediate_size", -1, &p->moe.shared_inter);
    if (rc || family == FAMILY_QWEN3_5) {
        p->moe.renormalize = true; /* Qwen3.5's router always renormalises; there is no flag */
        return rc;
    }
    int32_t step;
    rc = qb_cfg_bool(cfg, "norm_topk_prob", true, &p->moe.renormalize);
    if (!rc) rc = qb_cfg_int(cfg, "decoder_sparse_step", 1, &step);
    if (!rc) rc = qb_cfg_layer_list(cfg, "mlp_only_layers", cfg->num_hidden_layers, p->dense);
    for (int32_t l = 0; !rc && l < cfg->num_hidden_layers; l++) {
        p->dense[l] = p->dense[l] || (l + 1) % step != 0;
        if (p->dense[l] && cfg->intermediate_size <= 0)
            rc = cv_fail(CVLLM_ERR_FORMAT, "config.json: layer %d has a dense MLP but intermediate_size is missing", l);
    }
    return rc;
}

static int read_config(const cv_model_config *cfg, hybrid_model *m, hybrid_plan *p) {
    bool gated;
    int rc = qb_cfg_bool(cfg, "attn_output_gate", true, &gated);
    if (!rc && !gated)
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: attn_output_gate=false is not supported for %s",
                     cfg->architecture);
    if (!rc && cfg->attention_bias)
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: attention_bias=true is not supported for %s",
                     cfg->architecture);
    if (!rc) rc = read_layer_types(cfg, m);
    if (!rc) rc = read_gdn_dims(cfg, &m->gd);
    if (!rc) rc = read_mlp_plan(cfg, m->family, p);
    return rc;
}

/* ---- weights ---------------------------------------------------------------------------------- */

/* conv1d.weight [conv_dim][1][kernel] → tap-major [kernel][conv_dim] f32 for the conv kernel. */
static void bind_conv(qb_binder *b, const char *name, const gdn_dims *g, const float **out) {
    if (b->rc) return;
    int64_t shape[3] = {g->conv_dim, 1, g->kernel};
    cv_tensor t;
    b->rc = cv_weights_get(b->src, name, 3, shape, "2*linear_num_key_heads*linear_key_head_dim + "
                           "linear_num_value_heads*linear_value_head_dim, 1, linear_conv_kernel_dim", &t);
    if (b->rc) return;
    const size_t n = (size_t)g->conv_dim * (size_t)g->kernel;
    float *raw = cv_xmalloc(n * sizeof *raw), *w = qb_own(b, n * sizeof *w);
    if (w) {
        cv_convert_to_f32(raw, t.data, t.dtype, n);
        for (int32_t c = 0; c < g->conv_dim; c++)
            for (int32_t j = 0; j < g->kernel; j++) w[(size_t)j * g->conv_dim + c] = raw[(size_t)c * g->kernel + j];
        *out = w;
    }
    free(raw);
}

static void bind_gdn(qb_binder *b, const hybrid_model *m, const char *p, gdn_weights *w) {
    const gdn_dims *g = &m->gd;
    const int32_t H = m->hidden;
    if (m->family == FAMILY_NEXT) {
        w->in_proj.n_parts = 2;
        qb_bind_matrix(b, qb_name(b, "%sin_proj_qkvz.weight", p), 2 * g->key_dim + 2 * g->value_dim, H,
                       "2*linear_num_key_heads*linear_key_head_dim + 2*linear_num_value_heads*linear_value_head_dim, "
                       "hidden_size", &w->in_proj.parts[0]);
        qb_bind_matrix(b, qb_name(b, "%sin_proj_ba.weight", p), 2 * g->n_v_heads, H,
                       "2*linear_num_value_heads, hidden_size", &w->in_proj.parts[1]);
    } else {
        w->in_proj.n_parts = w->in_ba.n_parts = 2;
        qb_bind_matrix(b, qb_name(b, "%sin_proj_qkv.weight", p), g->conv_dim, H,
                       "2*linear_num_key_heads*linear_key_head_dim + linear_num_value_heads*linear_value_head_dim, "
                       "hidden_size", &w->in_proj.parts[0]);
        qb_bind_matrix(b, qb_name(b, "%sin_proj_z.weight", p), g->value_dim, H,
                       "linear_num_value_heads*linear_value_head_dim, hidden_size", &w->in_proj.parts[1]);
        qb_bind_matrix(b, qb_name(b, "%sin_proj_b.weight", p), g->n_v_heads, H, "linear_num_value_heads, hidden_size",
                       &w->in_ba.parts[0]);
        qb_bind_matrix(b, qb_name(b, "%sin_proj_a.weight", p), g->n_v_heads, H, "linear_num_value_heads, hidden_size",
                       &w->in_ba.parts[1]);
    }
    bind_conv(b, qb_name(b, "%sconv1d.weight", p), g, &w->conv);
    qb_bind_vector(b, qb_name(b, "%sdt_bias", p), g->n_v_heads, "linear_num_value_heads", &w->dt_bias);
    qb_bind_vector(b, qb_name(b, "%sA_log", p), g->n_v_heads, "linear_num_value_heads", &w->a_log);
    qb_bind_vector(b, qb_name(b, "%snorm.weight", p), g->v_dim, "linear_value_head_dim", &w->norm);
    w->out_proj.n_parts = 1;
    qb_bind_matrix(b, qb_name(b, "%sout_proj.weight", p), H, g->value_dim,
                   "hidden_size, linear_num_value_heads*linear_value_head_dim", &w->out_proj.parts[0]);
}

/* The MLP at prefix ("...mlp."): the dense SwiGLU or the MoE block, as the plan says. */
static void bind_mlp(qb_binder *b, const char *prefix, int32_t hidden, const cv_model_config *cfg,
                     const hybrid_plan *plan, bool dense, qb_moe *out) {
    if (dense) qb_bind_dense_mlp(b, prefix, hidden, cfg->intermediate_size, out);
    else qb_bind_moe(b, prefix, hidden, &plan->moe, out);
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
    const int64_t shape[2] = {m->vocab, m->hidden};
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
    qb_binder *b = &m->bound;
    const int32_t H = m->hidden;
    qb_bind_vocab(b, qb_name(b, "%sembed_tokens.weight", root), m->vocab, H, cfg->tie_word_embeddings, &m->vocab_w);
    for (int32_t l = 0; l < m->n_layers && !b->rc; l++) {
        hybrid_layer *ly = &m->layers[l];
        char p[128];
        qb_bind_gain_plus_one(b, qb_name(b, "%slayers.%d.input_layernorm.weight", root, l), H, "hidden_size",
                              &ly->input_norm);
        if (ly->linear) {
            snprintf(p, sizeof p, "%slayers.%d.linear_attn.", root, l);
            bind_gdn(b, m, p, &ly->gdn);
        } else {
            snprintf(p, sizeof p, "%slayers.%d.self_attn.", root, l);
            qb_bind_attention(b, p, &m->dims, &ly->attn);
        }
        qb_bind_gain_plus_one(b, qb_name(b, "%slayers.%d.post_attention_layernorm.weight", root, l), H,
                              "hidden_size", &ly->post_attention_norm);
        snprintf(p, sizeof p, "%slayers.%d.mlp.", root, l);
        bind_mlp(b, p, H, cfg, plan, plan->dense[l], &ly->mlp);
    }
    qb_bind_gain_plus_one(b, qb_name(b, "%snorm.weight", root), H, "hidden_size", &m->final_norm);
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
    int64_t shape[2] = {m->hidden, 2 * (int64_t)m->hidden};
    cv_tensor t;
    rc = cv_weights_get_optional(p->weights, "mtp.fc.weight", 2, shape, "hidden_size, 2*hidden_size", &t);
    *present = rc > 0;
    return rc < 0 ? rc : 0;
}

/* mtp.* as a module whose layer writes kv layer `kv_layer`; its weights are not counted in the
 * per-token weight bytes of the main model. */
static void bind_mtp(hybrid_model *m, const cv_model_config *cfg, const hybrid_plan *plan, int32_t kv_layer) {
    qb_binder *b = &m->bound;
    const int32_t H = m->hidden;
    const size_t streamed = b->matmul_bytes;
    mtp_module *t = qb_own(b, sizeof *t);
    if (!t) return;
    qb_bind_gain_plus_one(b, "mtp.pre_fc_norm_embedding.weight", H, "hidden_size", &t->norm_embedding);
    qb_bind_gain_plus_one(b, "mtp.pre_fc_norm_hidden.weight", H, "hidden_size", &t->norm_hidden);
    t->fc.n_parts = 1;
    qb_bind_matrix(b, "mtp.fc.weight", H, 2 * (int64_t)H, "hidden_size, 2*hidden_size", &t->fc.parts[0]);
    qb_bind_gain_plus_one(b, "mtp.norm.weight", H, "hidden_size", &t->final_norm);
    hybrid_layer *ly = &t->layer;
    ly->index = kv_layer;
    qb_bind_gain_plus_one(b, "mtp.layers.0.input_layernorm.weight", H, "hidden_size", &ly->input_norm);
    qb_bind_attention(b, "mtp.layers.0.self_attn.", &m->dims, &ly->attn);
    qb_bind_gain_plus_one(b, "mtp.layers.0.post_attention_layernorm.weight", H, "hidden_size",
                          &ly->post_attention_norm);
    bind_mlp(b, "mtp.layers.0.mlp.", H, cfg, plan, plan->dense_mtp, &ly->mlp);
    b->matmul_bytes = streamed;
    if (!b->rc) m->mtp = t;
}

/* ---- scratch ---------------------------------------------------------------------------------- */

static void take_gdn_scratch(gdn_scratch *s, const hybrid_model *m, qb_arena *ar, int32_t tokens) {
    const gdn_dims *g = &m->gd;
    const size_t T = (size_t)tokens, f = sizeof(float);
    const bool next = m->family == FAMILY_NEXT;
    s->qkvz = next ? qb_take(ar, T * (size_t)(2 * g->key_dim + 2 * g->value_dim) * f) : NULL;
    s->ba = next ? qb_take(ar, T * (size_t)(2 * g->n_v_heads) * f) : NULL;
    s->qkv = qb_take(ar, T * (size_t)g->conv_dim * f);
    s->u = qb_take(ar, T * (size_t)g->conv_dim * f);
    s->z = qb_take(ar, T * (size_t)g->value_dim * f);
    s->o = qb_take(ar, T * (size_t)g->value_dim * f);
    s->b = qb_take(ar, T * (size_t)g->n_v_heads * f);
    s->alpha = qb_take(ar, T * (size_t)g->n_v_heads * f);
    s->g = qb_take(ar, T * (size_t)g->n_v_heads * f);
    s->beta = qb_take(ar, T * (size_t)g->n_v_heads * f);
    s->workspace = qb_take(ar, cv_gdn_workspace_bytes(m->base.pool, g->k_dim, g->v_dim));
}

static void carve_scratch(hybrid_model *m, int32_t tokens, qb_arena *ar) {
    hybrid_scratch *s = &m->s;
    const size_t T = (size_t)tokens, row = (size_t)m->hidden * sizeof(float);
    const size_t half_rot = (size_t)(m->rope.rot_dim / 2) * sizeof(float);
    s->x = qb_take(ar, T * row);
    s->a = qb_take(ar, T * row);
    s->t = qb_take(ar, T * row);
    s->cos = qb_take(ar, T * half_rot);
    s->sin = qb_take(ar, T * half_rot);
    s->pair = m->mtp ? qb_take(ar, 2 * T * row) : NULL;
    s->states = qb_take(ar, T * sizeof *s->states);
    s->ckpt_start = qb_take(ar, (T + 1) * sizeof *s->ckpt_start);
    s->ckpt_token = qb_take(ar, T * sizeof *s->ckpt_token);
    s->ckpt_states = qb_take(ar, T * sizeof *s->ckpt_states);
    qb_moe_scratch_take(&s->moe, &m->moe_sizes, m->base.pool, m->hidden, ar, tokens);
    const size_t mixer = ar->size;
    qb_attention_scratch_take(&s->attn, &m->dims, ar, tokens);
    const size_t attn_end = ar->size;
    ar->size = mixer;
    take_gdn_scratch(&s->gdn, m, ar, tokens);
    if (attn_end > ar->size) ar->size = attn_end;
}

static int reserve_scratch(hybrid_model *m, int32_t tokens) {
    hybrid_scratch *s = &m->s;
    if (tokens <= s->capacity) return 0;
    qb_arena probe = {0};
    carve_scratch(m, tokens, &probe);
    void *mem = cv_aligned_alloc(probe.size);
    if (!mem) return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes of activations for %d tokens", probe.size, tokens);
    free(s->mem);
    s->mem = mem;
    qb_arena ar = {.base = mem};
    carve_scratch(m, tokens, &ar);
    s->capacity = tokens;
    return 0;
}

/* The linears of one decoder layer (at most 6) into out; returns how many. */
static int layer_linears(hybrid_layer *ly, qb_linear **out) {
    int n = 0;
    if (!ly->linear) {
        n = qb_attention_linears(&ly->attn, out);
    } else {
        out[n++] = &ly->gdn.in_proj;
        out[n++] = &ly->gdn.in_ba;
        out[n++] = &ly->gdn.out_proj;
    }
    return n + qb_moe_linears(&ly->mlp, out + n);
}

/* Every linear the layers and the MTP module read (the lm_head aside), in layer order; the caller
 * frees the list. */
static int model_linears(hybrid_model *m, qb_linear ***out) {
    qb_linear **l = cv_xmalloc((size_t)(6 * m->n_layers + 7) * sizeof *l);
    int n = 0;
    for (int32_t i = 0; i < m->n_layers; i++) n += layer_linears(&m->layers[i], l + n);
    if (m->mtp) {
        l[n++] = &m->mtp->fc;
        n += layer_linears(&m->mtp->layer, l + n);
    }
    *out = l;
    return n;
}

/* Bump when what model_linears() lists, or how its parts stack, changes: it keys the packed-weight cache. */
#define HYBRID_PACK_LAYOUT "qwen3-hybrid panels v1: lm_head, then model_linears() in order"

static int pack_weights(hybrid_model *m, cv_weight_source *src, cv_threadpool *pool) {
    qb_linear **lins;
    const int n = model_linears(m, &lins);
    int rc = qb_pack_weights(pool, src, HYBRID_PACK_LAYOUT, &m->vocab_w, lins, n);
    free(lins);
    return rc;
}

static void hybrid_destroy(cv_model *base) {
    hybrid_model *m = (hybrid_model *)base;
    qb_linear **lins;
    const int n = model_linears(m, &lins);
    for (int i = 0; i < n; i++) qb_linear_release(lins[i]);
    free(lins);
    free(m->s.mem);
    qb_vocab_release(&m->vocab_w);
    cv_rope_free(&m->rope);
    qb_binder_free(&m->bound);
    free(m->layers);
    free(m);
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Qwen3-Next's grouped projections into the contiguous layout: per key head g, qkvz holds
 * [q_g | k_g | v of its r value heads | z of them] and ba holds [b of its r heads | a of them]. */
static void unpack_grouped(const gdn_dims *g, const gdn_scratch *s, int32_t T) {
    const int32_t r = g->n_v_heads / g->n_k_heads, group = 2 * g->k_dim + 2 * r * g->v_dim;
    const size_t kb = (size_t)g->k_dim * sizeof(float), vb = (size_t)r * g->v_dim * sizeof(float);
    for (int64_t t = 0; t < T; t++) {
        const float *src = s->qkvz + t * (2 * g->key_dim + 2 * g->value_dim);
        float *qkv = s->qkv + t * g->conv_dim, *z = s->z + t * g->value_dim;
        for (int32_t k = 0; k < g->n_k_heads; k++, src += group) {
            memcpy(qkv + k * g->k_dim, src, kb);
            memcpy(qkv + g->key_dim + k * g->k_dim, src + g->k_dim, kb);
            memcpy(qkv + 2 * g->key_dim + k * r * g->v_dim, src + 2 * g->k_dim, vb);
            memcpy(z + k * r * g->v_dim, src + 2 * g->k_dim + r * g->v_dim, vb);
        }
        const float *ba = s->ba + t * 2 * g->n_v_heads;
        for (int32_t k = 0; k < g->n_k_heads; k++)
            for (int32_t i = 0; i < r; i++) {
                s->b[t * g->n_v_heads + k * r + i] = ba[k * 2 * r + i];
                s->alpha[t * g->n_v_heads + k * r + i] = ba[k * 2 * r + r + i];
            }
    }
}

static void gdn_project(const hybrid_model *m, const gdn_weights *w, const float *in, int32_t T) {
    const gdn_scratch *s = &m->s.gdn;
    cv_threadpool *pool = m->base.pool;
    if (m->family == FAMILY_NEXT) {
        float *ys[] = {s->qkvz, s->ba};
        qb_linear_forward(pool, &w->in_proj, in, T, ys);
        unpack_grouped(&m->gd, s, T);
    } else {
        float *qkvz[] = {s->qkv, s->z}, *ba[] = {s->b, s->alpha};
        qb_linear_forward(pool, &w->in_proj, in, T, qkvz);
        qb_linear_forward(pool, &w->in_ba, in, T, ba);
    }
}

static uint8_t *slot_bytes(const cv_state_cache *st, int32_t slot) { return st->data + (size_t)slot * st->slot_bytes; }

static uint8_t *state_slot(const cv_batch *b, const cv_state_cache *st, int32_t s) {
    return slot_bytes(st, b->state_slots[s]);
}

/* The batch's checkpoints grouped by sequence, as token indices within each sequence's run (the
 * batch checks guarantee they are sorted and inside the run). */
static void index_checkpoints(hybrid_scratch *s, const cv_batch *b) {
    int32_t i = 0;
    for (int32_t q = 0; q < b->n_seqs; q++) {
        s->ckpt_start[q] = i;
        for (; i < b->n_checkpoints && b->checkpoints[i].seq == q; i++)
            s->ckpt_token[i] = b->checkpoints[i].position - b->positions[b->seq_start[q]];
    }
    s->ckpt_start[b->n_seqs] = i;
}

/* Conv states at the checkpoints of sequence q, before the conv advances the sequence's own state. */
static void checkpoint_conv_states(const hybrid_model *m, const cv_batch *b, const cv_state_cache *st, size_t part,
                                   int32_t q) {
    const gdn_dims *g = &m->gd;
    const hybrid_scratch *s = &m->s;
    const float *x = s->gdn.qkv + (int64_t)b->seq_start[q] * g->conv_dim;
    const float *state = (const float *)(state_slot(b, st, q) + part);
    for (int32_t i = s->ckpt_start[q]; i < s->ckpt_start[q + 1]; i++)
        cv_conv1d_state_after((float *)(slot_bytes(st, b->checkpoints[i].slot) + part), x, g->conv_dim,
                              s->ckpt_token[i], g->conv_dim, g->kernel, state);
}

static void gdn_block(hybrid_model *m, const hybrid_layer *ly, const cv_batch *b, const cv_state_cache *st,
                      const float *in, float *out) {
    const gdn_dims *g = &m->gd;
    const gdn_scratch *s = &m->s.gdn;
    const int32_t T = b->n_tokens;
    const size_t part = (size_t)ly->index * m->layer_state_bytes;
    gdn_project(m, &ly->gdn, in, T);
    for (int32_t q = 0; q < b->n_seqs; q++) {
        const int32_t t0 = b->seq_start[q], n = b->seq_start[q + 1] - t0;
        uint8_t *slot = state_slot(b, st, q) + part;
        m->s.states[q] = (float *)(slot + m->conv_state_bytes);
        if (b->n_checkpoints) checkpoint_conv_states(m, b, st, part, q);
        if (n > 0)
            cv_conv1d_silu(s->u + (int64_t)t0 * g->conv_dim, s->qkv + (int64_t)t0 * g->conv_dim, g->conv_dim, n,
                           g->conv_dim, ly->gdn.conv, g->kernel, (float *)slot);
    }
    for (int32_t i = 0; i < b->n_checkpoints; i++)
        m->s.ckpt_states[i] = (float *)(slot_bytes(st, b->checkpoints[i].slot) + part + m->conv_state_bytes);
    for (int64_t t = 0; t < T; t++) {
        float *row = s->u + t * g->conv_dim;
        cv_l2norm(row, g->n_k_heads, g->k_dim, 1e-6f, 1.0f / sqrtf((float)g->k_dim));
        cv_l2norm(row + g->key_dim, g->n_k_heads, g->k_dim, 1e-6f, 1.0f);
    }
    cv_gdn_gates(s->g, s->beta, s->alpha, s->b, T, g->n_v_heads, ly->gdn.a_log, ly->gdn.dt_bias);
    cv_gdn_args args = {
        .n_seqs = b->n_seqs, .seq_start = b->seq_start, .states = m->s.states, .n_k_heads = g->n_k_heads,
        .n_v_heads = g->n_v_heads, .k_dim = g->k_dim, .v_dim = g->v_dim, .q = s->u, .k = s->u + g->key_dim,
        .v = s->u + 2 * g->key_dim, .ld = g->conv_dim, .g = s->g, .beta = s->beta, .out = s->o,
        .workspace = s->workspace, .ckpt_start = b->n_checkpoints ? m->s.ckpt_start : NULL,
        .ckpt_token = m->s.ckpt_token, .ckpt_states = m->s.ckpt_states,
    };
    cv_gdn(m->base.pool, &args);
    cv_rmsnorm(s->o, s->o, ly->gdn.norm, (int64_t)T * g->n_v_heads, g->v_dim, m->eps);
    cv_silu_mul(s->o, s->z, s->o, (int64_t)T * g->value_dim);
    qb_linear_forward(m->base.pool, &ly->gdn.out_proj, s->o, T, &out);
}

/* Sequences starting at position 0 begin from zero state. */
static void clear_new_states(const hybrid_model *m, const cv_batch *b, const cv_state_cache *st) {
    for (int32_t q = 0; q < b->n_seqs; q++)
        if (b->seq_start[q + 1] > b->seq_start[q] && b->positions[b->seq_start[q]] == 0)
            memset(state_slot(b, st, q), 0, m->base.state_bytes_per_seq);
}

/* One decoder layer on the residual stream s->x (cos/sin already filled for the batch). */
static void run_layer(hybrid_model *m, const hybrid_layer *ly, const cv_batch *b, cv_kv_cache *kv,
                      const cv_state_cache *st) {
    hybrid_scratch *s = &m->s;
    const int32_t T = b->n_tokens, H = m->hidden;
    cv_threadpool *pool = m->base.pool;
    cv_rmsnorm(s->a, s->x, ly->input_norm, T, H, m->eps);
    if (ly->linear) gdn_block(m, ly, b, st, s->a, s->t);
    else qb_attention_forward(pool, &ly->attn, &m->dims, &m->rope, s->cos, s->sin, b, kv, ly->index, s->a, &s->attn,
                              s->t);
    cv_add(s->x, s->t, (int64_t)T * H);
    cv_rmsnorm(s->a, s->x, ly->post_attention_norm, T, H, m->eps);
    qb_moe_forward(pool, &ly->mlp, H, s->a, T, &s->moe, s->t);
    cv_add(s->x, s->t, (int64_t)T * H);
}

/* Final norm with `gain`: of every token into batch->hidden_out when asked, then logits of the
 * logit rows. */
static void emit_outputs(hybrid_model *m, const cv_batch *b, const float *gain, float *logits) {
    hybrid_scratch *s = &m->s;
    const int32_t H = m->hidden;
    const size_t row = (size_t)H * sizeof(float);
    if (b->hidden_out) {
        cv_rmsnorm(b->hidden_out, s->x, gain, b->n_tokens, H, m->eps);
        for (int32_t i = 0; i < b->n_logits; i++)
            memcpy(s->a + (int64_t)i * H, b->hidden_out + (int64_t)b->logit_rows[i] * H, row);
    } else {
        for (int32_t i = 0; i < b->n_logits; i++)
            cv_rmsnorm(s->a + (int64_t)i * H, s->x + (int64_t)b->logit_rows[i] * H, gain, 1, H, m->eps);
    }
    qb_logits(m->base.pool, &m->vocab_w, s->a, b->n_logits, logits);
}

static int32_t rows_needed(const cv_batch *b) {
    int32_t need = b->n_tokens > b->n_logits ? b->n_tokens : b->n_logits;
    if (need < b->n_seqs) need = b->n_seqs;
    return need > b->n_checkpoints ? need : b->n_checkpoints;
}

static int hybrid_forward(cv_model *base, const cv_batch *b, cv_kv_cache *kv, cv_state_cache *st, float *logits) {
    hybrid_model *m = (hybrid_model *)base;
    int rc = nn_check_batch(b, kv, m->vocab, base->kv_spec.num_layers, st, base->state_bytes_per_seq);
    if (!rc) rc = reserve_scratch(m, rows_needed(b));
    if (rc || b->n_tokens == 0) return rc;
    hybrid_scratch *s = &m->s;
    clear_new_states(m, b, st);
    index_checkpoints(s, b);
    qb_embed(&m->vocab_w, b->token_ids, b->n_tokens, s->x);
    cv_rope_cos_sin(&m->rope, b->positions, b->n_tokens, s->cos, s->sin);
    for (int32_t l = 0; l < m->n_layers; l++) run_layer(m, &m->layers[l], b, kv, st);
    emit_outputs(m, b, m->final_norm, logits);
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
    int rc = nn_check_batch(&b, kv, m->vocab, base->kv_spec.num_layers, NULL, 0);
    if (!rc && b.n_tokens > 0 && !hidden)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "mtp_forward: no hidden states for its %d tokens", b.n_tokens);
    if (!rc) rc = reserve_scratch(m, rows_needed(&b));
    if (rc || b.n_tokens == 0) return rc;
    hybrid_scratch *s = &m->s;
    const int32_t T = b.n_tokens, H = m->hidden;
    qb_embed(&m->vocab_w, b.token_ids, T, s->a);
    for (int64_t t = 0; t < T; t++) {
        cv_rmsnorm(s->pair + t * 2 * H, s->a + t * H, mtp->norm_embedding, 1, H, m->eps);
        cv_rmsnorm(s->pair + t * 2 * H + H, hidden + t * H, mtp->norm_hidden, 1, H, m->eps);
    }
    qb_linear_forward(base->pool, &mtp->fc, s->pair, T, &s->x);
    cv_rope_cos_sin(&m->rope, b.positions, T, s->cos, s->sin);
    run_layer(m, &mtp->layer, &b, kv, NULL);
    emit_outputs(m, &b, mtp->final_norm, logits);
    return 0;
}

static const cv_model_ops hybrid_ops = {.forward = hybrid_forward, .destroy = hybrid_destroy};
static const cv_model_ops hybrid_mtp_ops = {
    .forward = hybrid_forward, .mtp_forward = hybrid_mtp_forward, .destroy = hybrid_destroy};

/* Layer ranks, KV spec and state size once the layer kinds are known. */
static void lay_out_state(hybrid_model *m, const cv_model_config *cfg) {
    int32_t n_attn = 0;
    for (int32_t l = 0; l < m->n_layers; l++) m->layers[l].index = m->layers[l].linear ? m->n_linear++ : n_attn++;
    m->base.kv_spec = (cv_kv_spec){n_attn, cfg->num_key_value_heads, cfg->head_dim};
    const gdn_dims *g = &m->gd;
    m->conv_state_bytes = align64((size_t)(g->kernel - 1) * (size_t)g->conv_dim * sizeof(float));
    m->layer_state_bytes =
        m->conv_state_bytes + align64((size_t)g->n_v_heads * (size_t)g->k_dim * (size_t)g->v_dim * sizeof(float));
    m->base.state_bytes_per_seq = (size_t)m->n_linear * m->layer_state_bytes;
}

int cv_qwen3_hybrid_load(const cv_model_load_params *p, cv_model **out) {
    const cv_model_config *cfg = p->config;
    *out = NULL;
    hybrid_model *m = cv_xcalloc(1, sizeof *m);
    m->base = (cv_model){.ops = &hybrid_ops, .config = cfg, .vocab_size = cfg->vocab_size, .pool = p->pool,
                         .state_checkpoints = true};
    m->family = strcmp(cfg->architecture, "Qwen3NextForCausalLM") == 0 ? FAMILY_NEXT : FAMILY_QWEN3_5;
    m->hidden = cfg->hidden_size;
    m->n_layers = cfg->num_hidden_layers;
    m->vocab = cfg->vocab_size;
    m->eps = (float)cfg->rms_norm_eps;
    m->dims = (qb_attention_dims){.hidden = cfg->hidden_size, .n_heads = cfg->num_attention_heads,
                                  .n_kv_heads = cfg->num_key_value_heads, .head_dim = cfg->head_dim, .eps = m->eps,
                                  .gated = true, .zero_centred_norms = true};
    m->layers = cv_xcalloc((size_t)m->n_layers, sizeof *m->layers);
    m->bound.src = p->weights;
    hybrid_plan plan = {.dense = cv_xcalloc((size_t)m->n_layers, sizeof(bool))};
    const char *root = NULL;
    int rc = read_config(cfg, m, &plan);
    if (!rc) rc = qb_init_rope(&m->rope, &cfg->rope, cfg->head_dim);
    if (!rc) rc = text_root(p, m, &root);
    if (!rc) {
        lay_out_state(m, cfg);
        bind_weights(m, cfg, &plan, root);
        rc = m->bound.rc;
    }
    bool with_mtp = false;
    if (!rc && p->load_mtp) rc = mtp_present(p, m, &with_mtp);
    if (!rc && with_mtp) {
        bind_mtp(m, cfg, &plan, m->base.kv_spec.num_layers++);
        rc = m->bound.rc;
    }
    free(plan.dense);
    if (!rc) rc = pack_weights(m, p->weights, p->pool);
    if (!rc) {
        for (int32_t l = 0; l < m->n_layers; l++) qb_moe_sizes_add(&m->moe_sizes, &m->layers[l].mlp);
        if (m->mtp) {
            qb_moe_sizes_add(&m->moe_sizes, &m->mtp->layer.mlp);
            m->base.ops = &hybrid_mtp_ops;
        }
        rc = reserve_scratch(m, p->max_num_batched_tokens > 0 ? p->max_num_batched_tokens : 1);
    }
    if (rc) {
        hybrid_destroy(&m->base);
        return rc;
    }
    *out = &m->base;
    return 0;
}
