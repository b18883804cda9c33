/*
 * footprint.c — see footprint.h. One function per block (attention, dense MLP, MoE, Gated DeltaNet),
 * each returning its parameter count, and one layer walk shared by the families; the config
 * fields, their defaults and the tensors counted are those the model files (src/models/qwen3*.c)
 * read and bind; which family a config belongs to comes from the registry. Fields that are missing
 * or malformed make the estimate unknown rather than wrong: the model loader then reports them with
 * its own messages.
 */
#include "models/footprint.h"

#include <string.h>

#include "models/architectures.h"

/* An integer field of the text config; `fallback` when absent, -1 when malformed. */
static int64_t field(const cv_model_config *cfg, const char *key, int64_t fallback) {
    json_t *v = json_object_get(cfg->text, key);
    if (!v || json_is_null(v)) return fallback;
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

static uint64_t align64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }

/* The widths a model reads from its config; everything below is arithmetic on them. */
typedef struct dims {
    cv_model_family fam;
    int64_t H, V, L, q, kv, head_dim, inter;
    int64_t experts, top_k, expert_inter, shared_inter, sparse_step;
    int64_t nk, nv, dk, dv, kernel, key_dim, value_dim, conv_dim;
    bool gated;                   /* attention with the per-head output gate (the hybrids) */
} dims;

static bool read_dims(const cv_model_config *cfg, cv_model_family fam, dims *d) {
    *d = (dims){.fam = fam, .H = cfg->hidden_size, .V = cfg->vocab_size, .L = cfg->num_hidden_layers,
                .q = (int64_t)cfg->num_attention_heads * cfg->head_dim,
                .kv = (int64_t)cfg->num_key_value_heads * cfg->head_dim, .head_dim = cfg->head_dim,
                .inter = cfg->intermediate_size, .gated = fam >= CV_FAMILY_NEXT, .sparse_step = 1};
    if (fam == CV_FAMILY_MOE || fam == CV_FAMILY_NEXT || fam == CV_FAMILY_QWEN3_5_MOE) {
        d->experts = field(cfg, "num_experts", -1);
        d->top_k = field(cfg, "num_experts_per_tok", -1);
        d->expert_inter = field(cfg, "moe_intermediate_size", -1);
        /* Qwen3-MoE has no shared expert; the hybrids always have one. */
        d->shared_inter = fam == CV_FAMILY_MOE ? 0 : field(cfg, "shared_expert_intermediate_size", -1);
        if (fam != CV_FAMILY_QWEN3_5_MOE) d->sparse_step = field(cfg, "decoder_sparse_step", 1);
        if (d->experts < 1 || d->top_k < 0 || d->expert_inter < 0 || d->shared_inter < 0 || d->sparse_step < 1)
            return false;
    }
    if (fam >= CV_FAMILY_NEXT) {
        d->nk = field(cfg, "linear_num_key_heads", -1);
        d->nv = field(cfg, "linear_num_value_heads", -1);
        d->dk = field(cfg, "linear_key_head_dim", -1);
        d->dv = field(cfg, "linear_value_head_dim", -1);
        d->kernel = field(cfg, "linear_conv_kernel_dim", 4);
        if (d->nk < 1 || d->nv < 1 || d->dk < 1 || d->dv < 1 || d->kernel < 1) return false;
        d->key_dim = d->nk * d->dk;
        d->value_dim = d->nv * d->dv;
        d->conv_dim = 2 * d->key_dim + d->value_dim;
    }
    return d->H > 0 && d->V > 0 && d->L > 0 && d->q > 0 && d->kv > 0;
}

/* q (with the gate half when gated), k, v, o and the two per-head norms. */
static uint64_t attention_params(const dims *d) {
    return (uint64_t)(d->H * d->q * (d->gated ? 2 : 1) + 2 * d->H * d->kv + d->q * d->H + 2 * d->head_dim);
}

static uint64_t swiglu_params(const dims *d, int64_t inter) { return (uint64_t)(3 * d->H * inter); }

/* Router, every routed expert, and the sigmoid-gated shared expert when there is one. */
static uint64_t moe_params(const dims *d) {
    uint64_t n = (uint64_t)(d->experts * d->H) + (uint64_t)d->experts * swiglu_params(d, d->expert_inter);
    if (d->shared_inter > 0) n += swiglu_params(d, d->shared_inter) + (uint64_t)d->H;
    return n;
}

/* in_proj (q, k, v, z, b, a in either family's split), conv1d, dt_bias, A_log, the gated norm and
 * out_proj. */
static uint64_t gdn_params(const dims *d) {
    return (uint64_t)(d->H * (d->conv_dim + d->value_dim + 2 * d->nv) + d->conv_dim * d->kernel + 2 * d->nv + d->dv +
                      d->value_dim * d->H);
}

/* Whether layer l has a dense MLP: Qwen3-MoE and Qwen3-Next keep one on mlp_only_layers and off the
 * decoder_sparse_step grid; Qwen3.5 is all MoE or all dense. */
static bool dense_mlp(const cv_model_config *cfg, const dims *d, int64_t l) {
    if (d->fam == CV_FAMILY_DENSE || d->fam == CV_FAMILY_QWEN3_5_DENSE) return true;
    if (d->fam == CV_FAMILY_QWEN3_5_MOE) return false;
    json_t *only = json_object_get(cfg->text, "mlp_only_layers");
    size_t i;
    json_t *v;
    json_array_foreach(only, i, v) {
        if (json_is_integer(v) && json_integer_value(v) == l) return true;
    }
    return (l + 1) % d->sparse_step != 0;
}

/* Which layers are Gated DeltaNet: layer_types, else all but every full_attention_interval-th. */
static bool linear_layer(const cv_model_config *cfg, const dims *d, int64_t l) {
    if (d->fam < CV_FAMILY_NEXT) return false;
    json_t *types = json_object_get(cfg->text, "layer_types");
    if (json_is_array(types)) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        return t && !strcmp(t, "linear_attention");
    }
    int64_t interval = field(cfg, "full_attention_interval", 4);
    return interval < 1 || (l + 1) % interval != 0;
}

/* Whether config.json lets an MTP module exist (it may declare none). */
static bool mtp_declared(const cv_model_config *cfg) {
    return field(cfg, "mtp_num_hidden_layers", 1) != 0 && field(cfg, "num_nextn_predict_layers", 1) != 0;
}

/* f32 activations per token: residual, normed input and block output; the attention projections
 * (query, gate, output and k, v); the MLP's gate/up and SwiGLU output, for MoE the router logits and
 * the routed rows (gathered input, gate/up and SwiGLU per route); the GDN projections. */
static uint64_t activation_floats_per_token(const dims *d, bool any_dense, bool with_mtp) {
    int64_t widest_inter = any_dense && d->inter > d->shared_inter ? d->inter : d->shared_inter;
    int64_t n = 3 * d->H + (d->gated ? 5 : 2) * d->q + 2 * d->kv + 3 * widest_inter;
    if (d->experts > 0) n += d->experts + 2 * d->top_k + d->H + d->top_k * (d->H + 3 * d->expert_inter);
    if (d->fam >= CV_FAMILY_NEXT) n += 2 * d->conv_dim + 2 * d->value_dim + 4 * d->nv;
    if (d->fam == CV_FAMILY_NEXT) n += 2 * d->key_dim + 2 * d->value_dim + 2 * d->nv;
    if (with_mtp) n += 2 * d->H;
    return (uint64_t)n;
}

bool cv_model_footprint(const cv_model_config *cfg, const cv_footprint_params *p, cv_footprint *out) {
    *out = (cv_footprint){0};
    cv_model_family fam;
    dims d;
    if (!cv_model_family_of(cfg->architecture, &fam) || !read_dims(cfg, fam, &d)) return false;
    const bool with_mtp = p->with_mtp && fam >= CV_FAMILY_NEXT && mtp_declared(cfg);
    uint64_t params = (uint64_t)(d.V * d.H) * (cfg->tie_word_embeddings ? 1 : 2) + (uint64_t)d.H;
    int64_t attention_layers = 0, linear_layers = 0;
    bool any_dense = false;
    for (int64_t l = 0; l < d.L; l++) {
        bool linear = linear_layer(cfg, &d, l);
        linear_layers += linear;
        attention_layers += !linear;
        params += linear ? gdn_params(&d) : attention_params(&d);
        bool dense = dense_mlp(cfg, &d, l);
        if (dense && d.inter <= 0) return false;
        any_dense = any_dense || dense;
        params += dense ? swiglu_params(&d, d.inter) : moe_params(&d);
        params += 2 * (uint64_t)d.H;
    }
    if (with_mtp) {
        /* fc over [embedding; hidden], its two input norms and final norm, one full-attention layer. */
        params += (uint64_t)(2 * d.H * d.H) + 3 * (uint64_t)d.H + attention_params(&d) + 2 * (uint64_t)d.H;
        params += fam == CV_FAMILY_QWEN3_5_DENSE ? swiglu_params(&d, d.inter) : moe_params(&d);
        attention_layers++;
    }
    const uint64_t f32 = sizeof(float);
    out->weight_bytes = params * cv_dtype_size(p->weight_dtype);
    out->activation_bytes = (uint64_t)p->max_num_batched_tokens * activation_floats_per_token(&d, any_dense, with_mtp) * f32 +
                            (uint64_t)p->max_num_seqs * (uint64_t)d.V * f32;
    out->kv_bytes_per_token = (uint64_t)attention_layers * 2 * (uint64_t)d.kv * f32;
    if (linear_layers)
        out->state_bytes_per_seq =
            (uint64_t)linear_layers * (align64((uint64_t)((d.kernel - 1) * d.conv_dim) * f32) +
                                       align64((uint64_t)(d.nv * d.dk * d.dv) * f32));
    return true;
}
