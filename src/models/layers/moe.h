/*
 * moe.h — the sparse mixture-of-experts block of Qwen3-MoE, Qwen3-Next and Qwen3.5/3.6-MoE
 * (internal to src/models).
 *
 * Router (f32 softmax over the experts → top-k → renormalised when the config says so) → the routed
 * SwiGLU experts in the grouped kernel (kernels.h cv_moe). Each expert is two linears (gate|up
 * stacked, and down; layers/linear.h), so a quantized expert binds, packs and is cached like any
 * linear: int8 or e4m3 experts are packed at load (there is no row-major kernel for them), gate|up
 * into one weight when moe_intermediate_size is whole panels, and their inputs are quantized in the
 * kernel (each expert's gathered rows, then its SwiGLU rows per token before down, as msModelSlim's
 * runtime does). Float experts stay row-major views of the checkpoint (float_views): each is read by
 * few tokens, and packing them all would double the load time of the largest part of the model.
 * Then, when there is one, the shared expert (an ffn.h block, packed like every weight read by all
 * tokens) added with weight σ(shared_expert_gate · x); the router and that gate are one stacked
 * linear. A layer that the config makes dense (mlp_only_layers, decoder_sparse_step, or the dense
 * Qwen3.5) is the same block with no router: its ffn alone, so a model's layers are one type
 * whatever their MLP.
 *
 * Checkpoints store routed experts fused (experts.gate_up_proj [E][2I][H], experts.down_proj
 * [E][H][I], gate rows first) or per expert (experts.{e}.{gate,up,down}_proj.weight); both bind
 * here. For calibration, each routed expert reports its gate_proj/up_proj input (the rows of the
 * tokens routed to it, in token order) and its down_proj input under its per-expert name,
 * "...mlp.experts.{e}.gate_proj", whichever layout the checkpoint has.
 *
 * Tensor parallelism (model.h cv_tp) splits every expert as the dense MLP is split: gate|up by rows,
 * down by columns, the router whole on every rank. The routed experts' and the shared expert's
 * partial sums add up to the block's partial output, which is all-reduced once, after both. Fused
 * expert tensors are split the same way, expert by expert. With expert parallelism
 * (cv_tp.expert_parallel, vLLM's --enable-expert-parallel) the routed experts are placed whole
 * instead, n_experts / ranks consecutive ones on each rank; every rank routes all its tokens (the
 * residual stream is whole on every rank, so no token moves), runs the routes to its own experts,
 * and the one all-reduce adds the other ranks' routes in. The shared expert stays split.
 */
#ifndef CV_LAYERS_MOE_H
#define CV_LAYERS_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "models/layers/ffn.h"

typedef struct nn_moe_config {
    int32_t n_experts, top_k, expert_inter;
    int32_t shared_inter;     /* 0: no shared expert */
    bool renormalize;
} nn_moe_config;

typedef struct nn_moe {
    int32_t n_routed;         /* 0: a dense MLP (no router, the ffn's output taken as is) */
    int32_t first_expert, n_local; /* the routed experts this rank holds: all (0, n_routed) but under
                                    * expert parallelism */
    int32_t top_k;
    bool renormalize, has_shared;
    nn_linear route;          /* gate [n_routed][hidden] | shared_expert_gate [1][hidden] (when shared) */
    nn_linear *gate_up, *down; /* [n_local]: routed expert first_expert + i's gate_proj | up_proj and down_proj */
    cv_moe_expert *experts;   /* [n_local]: the same weights as the kernel takes them; owned by the binder */
    nn_observer observe;
    bool bf16_input;          /* bf16 compute with the bf16 dot product: experts whose format can read bf16
                               * rows do (cv_wformat_bf16_input) */
    nn_ffn ffn;               /* the shared expert, or the dense MLP */
    const cv_tp *tp;          /* tensor parallelism with routed experts: the block's output is all-reduced */
} nn_moe;

/* prefix: "model.layers.0.mlp." */
void nn_bind_moe(nn_binder *b, const char *prefix, int32_t hidden, const nn_moe_config *c, nn_moe *out);
/* 0 when n_experts routed experts split over `ranks` expert-parallel ranks, else the error. */
int nn_moe_check_expert_split(int32_t n_experts, int ranks);
/* The dense form: a SwiGLU of `inter` (config field intermediate_size) at prefix. */
void nn_bind_dense_mlp(nn_binder *b, const char *prefix, int32_t hidden, int32_t inter, nn_moe *out);
/* Appends its linears to list: the router, the shared expert or dense MLP, the routed experts. */
void nn_moe_linears(nn_moe *m, nn_linear_list *list);
/* The linear that reads the block's input as it is (the shared expert's or dense MLP's gate|up;
 * n_parts 0 when none), for the norm before the block to quantize it for. */
const nn_linear *nn_moe_input_linear(const nn_moe *m);

/* The largest MoE shapes over a model's layers, for scratch sizing. */
typedef struct nn_moe_sizes {
    int32_t top_k, max_inter, n_routed;  /* routed experts */
    bool int8;                           /* some routed expert reads int8 */
    bool bf16;                           /* some routed expert reads bf16 rows */
    int32_t ffn_inter;                   /* the shared expert or dense MLP */
    bool observed;                       /* routed experts report their inputs (scratch to gather them) */
} nn_moe_sizes;

void nn_moe_sizes_add(nn_moe_sizes *z, const nn_moe *m);

typedef struct nn_moe_scratch {
    float *logits;            /* [T][n_routed] */
    float *shared_logit;      /* [T] */
    float *weights;           /* [T][top_k] */
    int32_t *ids;             /* [T][top_k] */
    void *workspace;          /* cv_moe_workspace_bytes */
    nn_ffn_scratch ffn;
    float *shared;            /* [T][hidden] shared expert output */
    float *xs, *gate_up, *h;  /* observed only: one expert's rows [T][hidden], [2][T][max_inter], [T][max_inter] */
} nn_moe_scratch;

void nn_moe_scratch_take(nn_moe_scratch *s, const nn_moe_sizes *z, cv_threadpool *pool, int32_t hidden, nn_arena *a,
                         int32_t tokens);
/* out [T][hidden] = the block of in [T][hidden] (f32 rows always: the router and routed experts
 * read them); out is overwritten. */
void nn_moe_forward(cv_threadpool *pool, const nn_moe *m, int32_t hidden, nn_input in, int32_t T,
                    const nn_moe_scratch *s, float *out);

#endif
