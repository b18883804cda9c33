/*
 * gdn.h — the Gated DeltaNet block, the linear-attention layers of Qwen3-Next and Qwen3.5/3.6
 * (internal to src/models).
 *
 * projections → causal depthwise conv + SiLU over q,k,v (state: the last kernel−1 raw inputs) →
 * L2-normalised q (scaled by dk^−1/2) and k → gates β = σ(b), g = −exp(A_log)·softplus(a + dt_bias)
 * → gated delta rule (kernels.h cv_gdn) → per-head RMSNorm with a plain gain, times silu(z) →
 * out_proj. The two families store the input projections differently: Qwen3.5 as four contiguous
 * matrices (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), Qwen3-Next as two fused ones grouped per
 * key head (in_proj_qkvz, in_proj_ba), whose outputs are unpacked here into the same contiguous
 * [q | k | v], z, b, a order, after which one code path runs.
 *
 * Recurrent state: each GDN layer owns a part of a sequence's engine state slot, its conv state
 * [kernel−1][conv_dim] then its delta-rule state [n_v_heads][k_dim][v_dim], all f32, each 64-byte
 * aligned (nn_gdn_state_bytes); the model places the parts and clears a slot whose sequence starts
 * at position 0. State checkpoints (model.h) are written as the block runs: the conv part from the
 * raw inputs around the token (cv_conv1d_state_after), the delta-rule part by the kernel, which cuts
 * its chunks at the token.
 */
#ifndef CV_LAYERS_GDN_H
#define CV_LAYERS_GDN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "models/layers/arena.h"
#include "models/layers/linear.h"

typedef struct nn_gdn_dims {
    int32_t n_k_heads, n_v_heads, k_dim, v_dim, kernel; /* heads: this rank's */
    int32_t key_dim, value_dim, conv_dim;   /* nk·dk, nv·dv, 2·key_dim + value_dim */
    bool grouped;                           /* Qwen3-Next's in_proj_qkvz | in_proj_ba */
    float eps;                              /* of the output norm */
} nn_gdn_dims;

/* linear_* fields of config.json, checked; with tensor parallelism over tp_size ranks, each rank's
 * share of the key heads (which must split evenly) and with them of the value heads. */
int nn_gdn_dims_from_config(const cv_model_config *cfg, bool grouped, int tp_size, nn_gdn_dims *out);
/* Bytes of one layer's part of a state slot, and the offset of its delta-rule state in it. */
size_t nn_gdn_state_bytes(const nn_gdn_dims *d);
size_t nn_gdn_conv_state_bytes(const nn_gdn_dims *d);

/* The input projections: grouped, in_proj_qkvz | in_proj_ba in in_proj alone; otherwise
 * in_proj_qkv | in_proj_z in in_proj and in_proj_b | in_proj_a in in_ba, apart because b has only
 * linear_num_value_heads rows, which need not fill whole panels. */
typedef struct nn_gdn {
    nn_linear in_proj, in_ba;               /* in_ba: not grouped only */
    const float *conv;                      /* [kernel][conv_dim], tap-major */
    const float *a_log, *dt_bias, *norm;
    nn_linear out_proj;
    const cv_tp *tp;                        /* tensor parallelism: out_proj's partial sums are all-reduced */
} nn_gdn;

/* prefix: "model.layers.0.linear_attn."; d: this rank's dims. Under tensor parallelism each rank
 * holds its key heads and their value heads: its slice of q, k and v of the projection rows and conv
 * channels, of z, b, a and the per-head gates, and out_proj's matching columns (norm is per head
 * dimension, whole). */
void nn_bind_gdn(nn_binder *b, const char *prefix, const nn_gdn_dims *d, int32_t hidden, nn_gdn *out);
/* Appends its linears to list. */
void nn_gdn_linears(nn_gdn *g, nn_linear_list *list);

typedef struct nn_gdn_scratch {
    float *qkvz, *ba;                       /* grouped raw projections */
    float *qkv, *u, *z, *b, *alpha, *g, *beta, *o;
    void *workspace;
} nn_gdn_scratch;

void nn_gdn_scratch_take(nn_gdn_scratch *s, const nn_gdn_dims *d, cv_threadpool *pool, nn_arena *a, int32_t tokens);

/* A batch's sequences and checkpoints as the GDN layers use them, indexed once per forward call. */
typedef struct nn_gdn_batch {
    float **states;                         /* [rows]: each sequence's delta-rule state in the current layer */
    int32_t *ckpt_start, *ckpt_token;       /* [rows+1], [rows]: checkpoints per sequence, token within its run */
    float **ckpt_states;                    /* [rows]: their delta-rule states in the current layer */
} nn_gdn_batch;

/* For batches of up to `rows` sequences and checkpoints. */
void nn_gdn_batch_take(nn_gdn_batch *g, nn_arena *a, int32_t rows);
void nn_gdn_batch_index(nn_gdn_batch *g, const cv_batch *b);

/* out [T][hidden] = the block of the normed input `in` [T][hidden]; its state is at byte `part` of
 * each sequence's slot (and of each checkpoint's). */
void nn_gdn_forward(cv_threadpool *pool, const nn_gdn *w, const nn_gdn_dims *d, const cv_batch *b,
                    const cv_state_cache *st, size_t part, const nn_gdn_batch *gb, nn_input in,
                    const nn_gdn_scratch *s, float *out);

#endif
