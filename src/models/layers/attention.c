/*
 * attention.c — see attention.h. Each op is charged to its profile role (q|k|v projection, q/k norm
 * and RoPE, attention with the KV cache's write, o_proj).
 */
#include "models/layers/attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "models/layers/timed.h"

enum { MAX_HEAD_DIM = 1024 }; /* the fused per-head norm+RoPE kernel's limit */

int nn_attention_dims_from_config(const cv_model_config *cfg, bool gated, bool zero_centred_norms, int tp_size,
                                  nn_attention_dims *out) {
    if (cfg->hidden_size <= 0 || cfg->num_attention_heads <= 0 || cfg->num_key_value_heads <= 0 || cfg->head_dim <= 0)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: %s needs positive hidden_size, num_attention_heads, "
                                         "num_key_value_heads and head_dim", cfg->architecture);
    if (cfg->num_attention_heads % cfg->num_key_value_heads)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: num_attention_heads=%d is not a multiple of num_key_value_heads=%d",
                       cfg->num_attention_heads, cfg->num_key_value_heads);
    if (cfg->head_dim > MAX_HEAD_DIM)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: head_dim=%d is larger than the supported %d", cfg->head_dim,
                       MAX_HEAD_DIM);
    if (cfg->attention_bias)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: attention_bias=true is not supported for %s",
                       cfg->architecture);
    if (!(cfg->rms_norm_eps > 0)) return cv_fail(CVLLM_ERR_FORMAT, "config.json: rms_norm_eps must be positive");
    const int32_t kv = cfg->num_key_value_heads;
    if (cfg->num_attention_heads % tp_size || (kv % tp_size && tp_size % kv))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "num_attention_heads=%d and num_key_value_heads=%d do not split over "
                       "tensor_parallel_size=%d", cfg->num_attention_heads, kv, tp_size);
    const int32_t kv_parts = kv % tp_size ? kv : tp_size;
    *out = (nn_attention_dims){.hidden = cfg->hidden_size, .n_heads = cfg->num_attention_heads / tp_size,
                               .n_kv_heads = kv / kv_parts, .kv_parts = kv_parts, .head_dim = cfg->head_dim,
                               .eps = (float)cfg->rms_norm_eps, .gated = gated,
                               .zero_centred_norms = zero_centred_norms};
    return 0;
}

void nn_attention_scratch_take(nn_attention_scratch *s, const nn_attention_dims *d, nn_arena *a, int32_t tokens) {
    const size_t q = (size_t)d->n_heads * (size_t)d->head_dim * (size_t)tokens * sizeof(float);
    const size_t kv = (size_t)d->n_kv_heads * (size_t)d->head_dim * (size_t)tokens * sizeof(float);
    /* Ungated, the projection lands in q directly. */
    s->qg = nn_take(a, d->gated ? 2 * q : q);
    s->q = d->gated ? nn_take(a, q) : s->qg;
    s->gate = d->gated ? nn_take(a, q) : NULL;
    s->attn = nn_take(a, q);
    s->qb = nn_take(a, q / 2);
    s->k = nn_take(a, kv);
    s->v = nn_take(a, kv);
}

void nn_bind_attention(nn_binder *b, const char *prefix, const nn_attention_dims *d, nn_attention *out) {
    /* the whole tensors' shapes: this rank's heads times the ranks */
    const int64_t n = b->tp.size, H = d->hidden, q_dim = n * d->n_heads * d->head_dim;
    const int64_t kv_dim = (int64_t)d->kv_parts * d->n_kv_heads * d->head_dim;
    const int kv_piece = (int)((int64_t)b->tp.rank * d->kv_parts / n); /* the KV head(s) of this rank's queries */
    out->bf16_dot = b->bf16_input && d->head_dim % 2 == 0;
    out->tp = n > 1 ? &b->tp : NULL;
    char p[200];
    snprintf(p, sizeof p, "%s", prefix);
    nn_bind_linear_split(b, &out->qkv, nn_name(b, "%sq_proj", p), d->gated ? 2 * q_dim : q_dim, H,
                         d->gated ? "2*num_attention_heads*head_dim (query and gate), hidden_size"
                                  : "num_attention_heads*head_dim, hidden_size", NN_SPLIT_ROWS);
    nn_bind_linear_piece(b, &out->qkv, nn_name(b, "%sk_proj", p), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                         NN_SPLIT_ROWS, d->kv_parts, kv_piece);
    nn_bind_linear_piece(b, &out->qkv, nn_name(b, "%sv_proj", p), kv_dim, H, "num_key_value_heads*head_dim, hidden_size",
                         NN_SPLIT_ROWS, d->kv_parts, kv_piece);
    nn_bind_linear_split(b, &out->o_proj, nn_name(b, "%so_proj", p), H, q_dim, "hidden_size, num_attention_heads*head_dim",
                         NN_SPLIT_COLS);
    void (*bind_gain)(nn_binder *, const char *, int64_t, const char *, const float **) =
        d->zero_centred_norms ? nn_bind_gain_plus_one : nn_bind_vector;
    bind_gain(b, nn_name(b, "%sq_norm.weight", p), d->head_dim, "head_dim", &out->q_norm);
    bind_gain(b, nn_name(b, "%sk_norm.weight", p), d->head_dim, "head_dim", &out->k_norm);
}

void nn_attention_linears(nn_attention *a, nn_linear_list *list) {
    nn_linear_list_add(list, &a->qkv);
    nn_linear_list_add(list, &a->o_proj);
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

void nn_attention_forward(cv_threadpool *pool, const nn_attention *w, const nn_attention_dims *d, const cv_rope *rope,
                          const float *cos, const float *sin, const cv_batch *b, const cv_kv_cache *kv, int kv_layer,
                          nn_input in, const nn_attention_scratch *s, float *out) {
    const int32_t T = b->n_tokens, hd = d->head_dim;
    const int64_t q_dim = (int64_t)d->n_heads * hd, kv_dim = (int64_t)d->n_kv_heads * hd;
    float *qkv[] = {s->qg, s->k, s->v};
    cv_attention_args args = {
        .n_tokens = T, .n_seqs = b->n_seqs, .seq_start = b->seq_start, .positions = b->positions,
        .block_tables = b->block_tables, .block_size = kv->block_size, .n_heads = d->n_heads,
        .n_kv_heads = d->n_kv_heads, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .q = s->q,
        .kv_dtype = kv->dtype, .k_cache = kv->k[kv_layer], .v_cache = kv->v[kv_layer], .k_new = s->k,
        .v_new = s->v, .slot_mapping = b->slot_mapping, .out = s->attn,
        .bf16_dot = w->bf16_dot && kv->dtype == CV_DTYPE_BF16,
    };
    NN_TIMED(CV_OP_QKV_PROJ, nn_linear_forward(pool, &w->qkv, in, T, qkv));
    NN_TIMED(CV_OP_QK_NORM_ROPE, {
        if (d->gated) split_query_gate(s->qg, s->q, s->gate, T, d->n_heads, hd);
        if (args.bf16_dot) { /* the query as attention reads it: scaled and rounded here, half the bytes */
            cv_rmsnorm_rope_bf16(pool, rope, s->qb, q_dim, s->q, q_dim, T, d->n_heads, hd, w->q_norm, d->eps, cos, sin,
                                 args.scale);
            args.q = NULL, args.q_bf16 = s->qb;
        } else {
            cv_rmsnorm_rope(pool, rope, s->q, q_dim, s->q, q_dim, T, d->n_heads, hd, w->q_norm, d->eps, cos, sin);
        }
        cv_rmsnorm_rope(pool, rope, s->k, kv_dim, s->k, kv_dim, T, d->n_kv_heads, hd, w->k_norm, d->eps, cos, sin);
    });
    nn_input o_in = nn_f32(s->attn);
    if (!d->gated && q_dim % 32 == 0 && nn_linear_input_bf16(&w->o_proj) && !w->o_proj.observe.fn) {
        /* o_proj rounds its input to bf16: the attention writes those rows itself, into the shared
         * bf16 scratch, which o_proj reads next and nothing writes in between */
        args.out_bf16 = w->o_proj.bf16_scratch->rows;
        o_in = (nn_input){.bf16 = args.out_bf16};
    }
    NN_TIMED(CV_OP_ATTENTION, {
        cv_attention(pool, &args);
        if (d->gated) sigmoid_gate(s->attn, s->gate, (int64_t)T * d->n_heads * hd);
    });
    NN_TIMED(CV_OP_O_PROJ, nn_linear_forward(pool, &w->o_proj, o_in, T, &out));
    if (w->tp) NN_TIMED(CV_OP_ALLREDUCE, w->tp->allreduce(w->tp->ctx, out, (size_t)T * (size_t)d->hidden));
}
