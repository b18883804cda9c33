/*
 * attention.h — the full-attention block of every Qwen3 model (internal to src/models).
 *
 * Qwen3's attention and the hybrids' gated attention differ in two flags, so they are one block:
 * q|k|v projection (one stacked linear) → per-head RMSNorm of q and k and RoPE on their first
 * rot_dim dims (one fused pass per head) → K/V into the paged cache → causal GQA over the cache
 * with scale head_dim^−1/2 (also under partial RoPE) → o_proj. Gated (Qwen3-Next, Qwen3.5/3.6):
 * q_proj's rows are [q_h | gate_h] per head and the attention output is multiplied by σ(gate)
 * before o_proj; their q/k norm gains are stored zero-centred (applied as 1 + w).
 * The residual add and the input norm around the block are the model's (they fuse with the
 * previous block's output).
 */
#ifndef CV_LAYERS_ATTENTION_H
#define CV_LAYERS_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "models/layers/arena.h"
#include "models/layers/linear.h"

typedef struct nn_attention_dims {
    int32_t hidden, n_heads, n_kv_heads, head_dim; /* heads: this rank's */
    int32_t kv_parts;         /* tensor parallelism: pieces the KV heads are cut into (the ranks, or the
                               * KV heads themselves when there are fewer, each then on several ranks) */
    float eps;
    bool gated;               /* q_proj rows are [q_h | gate_h] per head; output ⊙ σ(gate) */
    bool zero_centred_norms;  /* q_norm/k_norm gains are stored as w, applied as 1 + w */
} nn_attention_dims;

/* The dims from config.json, checked: heads grouped evenly over the KV heads, head_dim within what
 * the fused norm+RoPE kernel takes, no attention_bias. With tensor parallelism over tp_size ranks,
 * each rank's share of the query heads (which must split evenly) and of the KV heads: split evenly,
 * or, with fewer KV heads than ranks, one each, replicated over tp_size / num_key_value_heads ranks
 * as vLLM does. */
int nn_attention_dims_from_config(const cv_model_config *cfg, bool gated, bool zero_centred_norms, int tp_size,
                                  nn_attention_dims *out);

typedef struct nn_attention {
    nn_linear qkv;                 /* q_proj (query and gate rows when gated) | k_proj | v_proj */
    nn_linear o_proj;
    const float *q_norm, *k_norm;  /* effective gains */
    const cv_tp *tp;               /* tensor parallelism: o_proj's partial sums are all-reduced; else NULL */
    bool bf16_dot;                 /* bf16 compute with the bf16 dot product: so is attention over a bf16 cache */
} nn_attention;

/* Activations for T tokens: qg [T][n_heads·head_dim·(gated ? 2 : 1)], q, gate, attn
 * [T][n_heads·head_dim], k, v [T][n_kv_heads·head_dim]. */
typedef struct nn_attention_scratch {
    float *qg, *q, *gate, *k, *v, *attn;
    uint16_t *qb; /* [T][n_heads·head_dim]: bf16-dot attention's query rows */
} nn_attention_scratch;

void nn_attention_scratch_take(nn_attention_scratch *s, const nn_attention_dims *d, nn_arena *a, int32_t tokens);
/* prefix: "model.layers.3.self_attn."; d: this rank's dims (heads split over the binder's ranks). */
void nn_bind_attention(nn_binder *b, const char *prefix, const nn_attention_dims *d, nn_attention *out);
/* Appends its linears to list. */
void nn_attention_linears(nn_attention *a, nn_linear_list *list);
/* out [T][hidden] = attention of the normed input `in` [T][hidden] of batch b (cos/sin: the RoPE
 * tables of its positions); K/V go to kv layer `kv_layer`. */
void nn_attention_forward(cv_threadpool *pool, const nn_attention *w, const nn_attention_dims *d, const cv_rope *rope,
                          const float *cos, const float *sin, const cv_batch *b, const cv_kv_cache *kv, int kv_layer,
                          nn_input in, const nn_attention_scratch *s, float *out);

#endif
