/*
 * qwen3_blocks.h — pieces shared by the Qwen3-MoE and hybrid (Qwen3-Next, Qwen3.5/3.6-MoE and
 * dense) model files (internal to src/models).
 *
 * A model file owns its layer loop and its config reading; what is identical across the family
 * lives here once: binding named tensors with config-derived shapes, reading architecture fields
 * from config.json, grow-only activation scratch, the attention block (plain, or with the per-head
 * output gate) and the sparse MoE block (router, routed experts in either checkpoint layout, optional sigmoid-gated shared expert; a
 * dense MLP is the same block's shared-expert path with weight 1 and no router), and the linears
 * packed into panels at load (qb_linear, qb_vocab).
 */
#ifndef CV_QWEN3_BLOCKS_H
#define CV_QWEN3_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "loader/pack_cache.h"
#include "models/model.h"

/* ---- binding ---------------------------------------------------------------------------------- */

/* Binds tensors one after another; the first failure sticks in rc and later calls do nothing, so a
 * loader reads as a list of bindings followed by one check. Buffers the model derives from the
 * checkpoint (zero-centred gains, transposed conv weights, expert tables) are recorded in `owned`
 * and freed by qb_binder_free. */
typedef struct qb_binder {
    cv_weight_source *src;
    size_t matmul_bytes;      /* weight bytes streamed per token */
    int rc;
    char name[256];
    void **owned;
    int n_owned, cap_owned;
} qb_binder;

/* Formats a tensor name into b->name (valid until the next call). */
const char *qb_name(qb_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qb_bind_matrix(qb_binder *b, const char *name, int64_t rows, int64_t cols, const char *hint, cv_matrix *out);
/* A 1-D tensor as f32. */
void qb_bind_vector(qb_binder *b, const char *name, int64_t dim, const char *hint, const float **out);
/* A zero-centred RMSNorm gain (stored w, effective 1 + w) as f32 1 + w. */
void qb_bind_gain_plus_one(qb_binder *b, const char *name, int64_t dim, const char *hint, const float **out);
/* An owned, zeroed, 64-byte aligned block of `bytes`, freed with the binder's buffers. */
void *qb_own(qb_binder *b, size_t bytes);
void qb_binder_free(qb_binder *b);

/* ---- linear layers, packed when bf16 ----------------------------------------------------------- */

enum { QB_MAX_PARTS = 4 };

/* One or more projections of the same input: packed together into the kernels' 16-row panels (one
 * call computes all parts), or row-major views of the checkpoint computed one by one. */
typedef struct qb_linear {
    int n_parts;
    cv_matrix parts[QB_MAX_PARTS];
    cv_panels packed;         /* .data NULL: not packed */
} qb_linear;

/* ys[j] [T][parts[j].rows] = x [T][cols] · parts[j]ᵀ for every part. */
void qb_linear_forward(cv_threadpool *pool, const qb_linear *l, const float *x, int64_t T, float *const *ys);
void qb_linear_release(qb_linear *l);

/* The token embedding and the lm_head; a tied lm_head is the embedding itself. Once the lm_head is
 * packed, a tied embedding is read back from its panels and the row-major original is gone. */
typedef struct qb_vocab {
    cv_matrix embed;          /* .data NULL: tied and read from the packed lm_head */
    qb_linear lm_head;
    cv_pack_cache *cache;     /* backs every packed linear of the model (NULL: anonymous memory) */
} qb_vocab;

/* embed_name: "model.embed_tokens.weight"; lm_head.weight unless tied. The embedding is not
 * counted in matmul_bytes (gathered, not streamed), the lm_head is. */
void qb_bind_vocab(qb_binder *b, const char *embed_name, int32_t vocab, int32_t hidden, bool tied, qb_vocab *out);
/* Packs the lm_head, then each of lins[0..n) whose parts are all bf16 and stack (every part but the
 * last a whole number of panels); the others keep the row-major path. The lm_head goes first: it
 * is the largest matrix, and packing it before any layer's pages are touched keeps the load's peak
 * memory near 1× the weights. Each original is dropped from memory once packed (never read again).
 * A checkpoint's packing goes to the packed-weight cache (loader/pack_cache.h) and a later load
 * maps it instead; `layout` names the model's packing (what is stacked, in which order) and must
 * change whenever that does, since the cache key sees only it and the shapes. */
int qb_pack_weights(cv_threadpool *pool, cv_weight_source *src, const char *layout, qb_vocab *v,
                    qb_linear *const *lins, int n);
void qb_embed(const qb_vocab *v, const int32_t *ids, int32_t n, float *out);
/* logits [n][vocab] of the normed hidden rows x [n][hidden]. */
void qb_logits(cv_threadpool *pool, const qb_vocab *v, const float *x, int32_t n, float *logits);
void qb_vocab_release(qb_vocab *v);

/* ---- config.json fields of the text model ----------------------------------------------------- */

/* A positive integer; absent: `def`, or an error naming the field when def < 0. */
int qb_cfg_int(const cv_model_config *cfg, const char *key, int32_t def, int32_t *out);
int qb_cfg_bool(const cv_model_config *cfg, const char *key, bool def, bool *out);
/* A list of layer indices < n_layers (absent: empty) as flags in[n_layers]. */
int qb_cfg_layer_list(const cv_model_config *cfg, const char *key, int32_t n_layers, bool *in);

/* RoPE from the parsed config; rot_dim = int(head_dim · partial_rotary_factor) as Hugging Face. */
int qb_init_rope(cv_rope *r, const cv_rope_config *rc, int32_t head_dim);

/* ---- scratch ---------------------------------------------------------------------------------- */

/* Activation scratch is one allocation carved into buffers by a model function that is run twice:
 * once on an arena without memory to measure, once on the real block. */
typedef struct qb_arena {
    char *base;               /* NULL: measuring */
    size_t size;              /* bytes taken so far */
} qb_arena;

/* The next `bytes` of the arena, 64-byte aligned (NULL while measuring). */
void *qb_take(qb_arena *a, size_t bytes);

/* ---- attention -------------------------------------------------------------------------------- */

typedef struct qb_attention_dims {
    int32_t hidden, n_heads, n_kv_heads, head_dim;
    float eps;
    bool gated;               /* q_proj rows are [q_h | gate_h] per head; output ⊙ σ(gate) */
    bool zero_centred_norms;  /* q_norm/k_norm gains are stored as w, applied as 1 + w */
} qb_attention_dims;

typedef struct qb_attention {
    qb_linear qkv;                 /* q_proj (query and gate rows when gated) | k_proj | v_proj */
    qb_linear o_proj;
    const float *q_norm, *k_norm;  /* effective gains */
} qb_attention;

/* Activations for T tokens: qg [T][n_heads·head_dim·(gated ? 2 : 1)], q, gate, attn
 * [T][n_heads·head_dim], k, v [T][n_kv_heads·head_dim]. */
typedef struct qb_attention_scratch {
    float *qg, *q, *gate, *k, *v, *attn;
} qb_attention_scratch;

void qb_attention_scratch_take(qb_attention_scratch *s, const qb_attention_dims *d, qb_arena *a, int32_t tokens);
/* prefix: "model.layers.3.self_attn." */
void qb_bind_attention(qb_binder *b, const char *prefix, const qb_attention_dims *d, qb_attention *out);
/* Its linears, for qb_pack_weights; returns how many (out must hold 2). */
int qb_attention_linears(qb_attention *a, qb_linear **out);
/* out [T][hidden] = attention of the normed input `in` [T][hidden]; K/V go to kv layer `kv_layer`. */
void qb_attention_forward(cv_threadpool *pool, const qb_attention *w, const qb_attention_dims *d, const cv_rope *rope,
                          const float *cos, const float *sin, const cv_batch *b, const cv_kv_cache *kv, int kv_layer,
                          const float *in, const qb_attention_scratch *s, float *out);

/* ---- sparse MoE (and dense MLP) --------------------------------------------------------------- */

typedef struct qb_moe_config {
    int32_t n_experts, top_k, expert_inter;
    int32_t shared_inter;     /* 0: no shared expert */
    bool renormalize;
} qb_moe_config;

typedef struct qb_moe {
    int32_t n_routed;         /* 0: a dense MLP (no router, the dense expert's output taken as is) */
    int32_t top_k;
    bool renormalize, has_shared;
    qb_linear route;          /* router [n_routed][hidden] | shared_expert_gate [1][hidden] (when shared) */
    cv_moe_expert *experts;   /* the n_routed routed experts; owned by the binder */
    /* The shared expert (with σ(shared_expert_gate · x) as its weight) or the dense MLP, outside
     * the routed-expert kernel so that its weights, read by every token, can be packed. */
    qb_linear gate_up;        /* gate_proj | up_proj; n_parts 0: none */
    qb_linear down;
} qb_moe;

/* The largest MoE shapes over a model's layers, for scratch sizing. */
typedef struct qb_moe_sizes {
    int32_t top_k, max_inter, n_routed;  /* routed experts */
    int32_t dense_inter;                 /* the shared expert or dense MLP */
} qb_moe_sizes;

void qb_moe_sizes_add(qb_moe_sizes *z, const qb_moe *m);

/* prefix: "model.layers.0.mlp." Experts are looked up fused (experts.gate_up_proj [E][2I][H] and
 * experts.down_proj [E][H][I], gate rows first) and otherwise per expert
 * (experts.{e}.{gate,up,down}_proj.weight). */
void qb_bind_moe(qb_binder *b, const char *prefix, int32_t hidden, const qb_moe_config *c, qb_moe *out);
/* A SwiGLU MLP at prefix (gate_proj/up_proj/down_proj). */
void qb_bind_dense_mlp(qb_binder *b, const char *prefix, int32_t hidden, int32_t inter, qb_moe *out);
/* Its linears (the routed experts aside), for qb_pack_weights; returns how many (out must hold 3). */
int qb_moe_linears(qb_moe *m, qb_linear **out);

typedef struct qb_moe_scratch {
    float *logits;            /* [T][n_routed] */
    float *shared_logit;      /* [T] */
    float *weights;           /* [T][top_k] */
    int32_t *ids;             /* [T][top_k] */
    void *workspace;          /* cv_moe_workspace_bytes */
    float *gate_up;           /* [T][dense_inter] gate, then the same for up */
    float *h;                 /* [T][dense_inter] */
    float *shared;            /* [T][hidden] shared expert output */
} qb_moe_scratch;

void qb_moe_scratch_take(qb_moe_scratch *s, const qb_moe_sizes *z, cv_threadpool *pool, int32_t hidden, qb_arena *a,
                         int32_t tokens);

/* out [T][hidden] = MoE(in); out is overwritten. */
void qb_moe_forward(cv_threadpool *pool, const qb_moe *m, int32_t hidden, const float *in, int32_t T,
                    const qb_moe_scratch *s, float *out);

#endif
