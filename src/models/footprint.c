/*
 * footprint.c — see footprint.h. One function per block (attention, dense MLP, MoE, Gated DeltaNet),
 * each returning its parameter count, and one layer walk shared by the families; the config
 * fields, their defaults and the tensors counted are those the model files (src/models/qwen3*.c)
 * read and bind; which family a config belongs to comes from the registry. Fields that are missing
 * or malformed make the estimate unknown rather than wrong: the model loader then reports them with
 * its own messages.
 *
 * Every linear layer is counted by its name, as the models bind it ("model.layers.3.self_attn.q_proj",
 * routed experts one by one as "…mlp.experts.7.up_proj"), so that a quantized checkpoint's scheme for
 * it (loader/quant.h: the msModelSlim description's entry, FP8's modules_to_not_convert) decides its
 * bytes: 1 per quantized weight plus its scales, or the float dtype's size per weight. A linear the
 * description does not list counts as float; binding it then names the missing entry.
 */
#include "models/footprint.h"

#include <stdarg.h>
#include <stdio.h>
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

/* The weights counted so far: parameters at the float dtype, and the bytes of quantized linears. */
typedef struct tally {
    const cv_quant_config *quant;
    uint64_t float_params;
    uint64_t quant_bytes;
} tally;

static void linear(tally *t, int64_t rows, int64_t cols, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* The linear whose weight is "<name>.weight", name from fmt. */
static void linear(tally *t, int64_t rows, int64_t cols, const char *fmt, ...) {
    cv_linear_scheme s = CV_SCHEME_FLOAT;
    if (t->quant) {
        char name[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(name, sizeof name, fmt, ap);
        va_end(ap);
        if (cv_quant_config_scheme(t->quant, name, &s)) s = CV_SCHEME_FLOAT;
    }
    if (s == CV_SCHEME_FLOAT) t->float_params += (uint64_t)(rows * cols);
    else t->quant_bytes += cv_linear_scheme_bytes(s, rows, cols, cv_quant_config_block(t->quant));
}

/* q (with the gate half when gated), k, v, o and the two per-head norms; p ends with "self_attn". */
static void attention(tally *t, const dims *d, const char *p) {
    linear(t, d->q * (d->gated ? 2 : 1), d->H, "%s.q_proj", p);
    linear(t, d->kv, d->H, "%s.k_proj", p);
    linear(t, d->kv, d->H, "%s.v_proj", p);
    linear(t, d->H, d->q, "%s.o_proj", p);
    t->float_params += (uint64_t)(2 * d->head_dim);
}

/* p ends with "mlp", "shared_expert" or "experts.<e>". */
static void swiglu(tally *t, const dims *d, int64_t inter, const char *p) {
    linear(t, inter, d->H, "%s.gate_proj", p);
    linear(t, inter, d->H, "%s.up_proj", p);
    linear(t, d->H, inter, "%s.down_proj", p);
}

/* Router, every routed expert, and the sigmoid-gated shared expert when there is one; p ends with "mlp". */
static void moe(tally *t, const dims *d, const char *p) {
    char name[256];
    linear(t, d->experts, d->H, "%s.gate", p);
    for (int64_t e = 0; e < d->experts; e++) {
        snprintf(name, sizeof name, "%s.experts.%lld", p, (long long)e);
        swiglu(t, d, d->expert_inter, name);
    }
    if (d->shared_inter <= 0) return;
    snprintf(name, sizeof name, "%s.shared_expert", p);
    swiglu(t, d, d->shared_inter, name);
    linear(t, 1, d->H, "%s.shared_expert_gate", p);
}

/* in_proj (q, k, v, z, b, a in either family's split), conv1d, dt_bias, A_log, the gated norm and
 * out_proj; p ends with "linear_attn". */
static void gdn(tally *t, const dims *d, const char *p) {
    if (d->fam == CV_FAMILY_NEXT) {
        linear(t, d->conv_dim + d->value_dim, d->H, "%s.in_proj_qkvz", p);
        linear(t, 2 * d->nv, d->H, "%s.in_proj_ba", p);
    } else {
        linear(t, d->conv_dim, d->H, "%s.in_proj_qkv", p);
        linear(t, d->value_dim, d->H, "%s.in_proj_z", p);
        linear(t, d->nv, d->H, "%s.in_proj_b", p);
        linear(t, d->nv, d->H, "%s.in_proj_a", p);
    }
    linear(t, d->H, d->value_dim, "%s.out_proj", p);
    t->float_params += (uint64_t)(d->conv_dim * d->kernel + 2 * d->nv + d->dv);
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

/* Where the text model's tensors are, as the model files bind them: "model.language_model." inside
 * the Qwen3.5 multimodal wrapper, "model." otherwise — or the other spelling when only that one is
 * in an msModelSlim description (a text tower cut out of the wrapper keeps the wrapper's names). */
static const char *text_root(const cv_model_config *cfg, const dims *d, const cv_quant_config *quant) {
    static const char wrapper_root[] = "model.language_model.", plain_root[] = "model.";
    if (d->fam < CV_FAMILY_QWEN3_5_MOE) return plain_root;
    const bool wrapper = strstr(cfg->architecture, "ForConditionalGeneration") != NULL;
    const char *root = wrapper ? wrapper_root : plain_root, *other = wrapper ? plain_root : wrapper_root;
    char own[64], alt[64];
    snprintf(own, sizeof own, "%sembed_tokens.weight", root);
    snprintf(alt, sizeof alt, "%sembed_tokens.weight", other);
    return !cv_quant_config_tensor_type(quant, own) && cv_quant_config_tensor_type(quant, alt) ? other : root;
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
    const char *root = text_root(cfg, &d, p->quant);
    tally t = {.quant = p->quant, .float_params = (uint64_t)(d.V * d.H) + (uint64_t)d.H}; /* embedding, final norm */
    if (!cfg->tie_word_embeddings) linear(&t, d.V, d.H, "lm_head");
    int64_t attention_layers = 0, linear_layers = 0;
    bool any_dense = false;
    char p_layer[160], p_block[192];
    for (int64_t l = 0; l < d.L; l++) {
        snprintf(p_layer, sizeof p_layer, "%slayers.%lld", root, (long long)l);
        bool is_linear = linear_layer(cfg, &d, l);
        linear_layers += is_linear;
        attention_layers += !is_linear;
        snprintf(p_block, sizeof p_block, "%s.%s", p_layer, is_linear ? "linear_attn" : "self_attn");
        if (is_linear) gdn(&t, &d, p_block);
        else attention(&t, &d, p_block);
        bool dense = dense_mlp(cfg, &d, l);
        if (dense && d.inter <= 0) return false;
        any_dense = any_dense || dense;
        snprintf(p_block, sizeof p_block, "%s.mlp", p_layer);
        if (dense) swiglu(&t, &d, d.inter, p_block);
        else moe(&t, &d, p_block);
        t.float_params += 2 * (uint64_t)d.H;
    }
    if (with_mtp) {
        /* fc over [embedding; hidden], its two input norms and final norm, one full-attention layer. */
        linear(&t, d.H, 2 * d.H, "mtp.fc");
        t.float_params += 3 * (uint64_t)d.H + 2 * (uint64_t)d.H;
        attention(&t, &d, "mtp.layers.0.self_attn");
        if (fam == CV_FAMILY_QWEN3_5_DENSE) swiglu(&t, &d, d.inter, "mtp.layers.0.mlp");
        else moe(&t, &d, "mtp.layers.0.mlp");
        attention_layers++;
    }
    const uint64_t f32 = sizeof(float);
    out->weight_bytes = t.float_params * cv_dtype_size(p->weight_dtype) + t.quant_bytes;
    out->activation_bytes = (uint64_t)p->max_num_batched_tokens * activation_floats_per_token(&d, any_dense, with_mtp) * f32 +
                            (uint64_t)p->max_num_seqs * (uint64_t)d.V * f32;
    out->kv_bytes_per_token = (uint64_t)attention_layers * 2 * (uint64_t)d.kv * cv_dtype_size(p->kv_dtype);
    if (linear_layers)
        out->state_bytes_per_seq =
            (uint64_t)linear_layers * (align64((uint64_t)((d.kernel - 1) * d.conv_dim) * f32) +
                                       align64((uint64_t)(d.nv * d.dk * d.dv) * f32));
    return true;
}
