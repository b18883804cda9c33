/*
 * ffn.h — the SwiGLU feed-forward block: down · (silu(gate · x) ⊙ (up · x)) (internal to
 * src/models).
 *
 * Qwen3's MLP, the dense MLP layers of the MoE and hybrid models, and the MoE's shared expert are
 * all this block: gate|up as one stacked linear (one call computes both), SwiGLU on the pool, then
 * down. When down reads int8, the SwiGLU quantizes its rows for it on the way (cv_swiglu_quant)
 * unless the observer needs them as f32. The routed experts are not this block (moe.h): they run in
 * the grouped kernel.
 */
#ifndef CV_LAYERS_FFN_H
#define CV_LAYERS_FFN_H

#include <stdint.h>

#include "models/layers/arena.h"
#include "models/layers/linear.h"

typedef struct nn_ffn {
    nn_linear gate_up;        /* gate_proj | up_proj; n_parts 0: no block */
    nn_linear down;
    const cv_tp *tp;          /* tensor parallelism: down's partial sums are all-reduced; else NULL */
} nn_ffn;

/* prefix: "model.layers.0.mlp." (gate_proj, up_proj, down_proj there); inter_name: the config field
 * of the intermediate size, for error messages; inter is the whole block's, split over the binder's
 * tensor-parallel ranks (gate|up by rows, down by columns). */
void nn_bind_ffn(nn_binder *b, const char *prefix, int32_t hidden, int32_t inter, const char *inter_name, nn_ffn *out);
/* The intermediate size (0: no block). */
int32_t nn_ffn_inter(const nn_ffn *f);
/* Appends its linears to list. */
void nn_ffn_linears(nn_ffn *f, nn_linear_list *list);

typedef struct nn_ffn_scratch {
    float *gate_up;           /* [T][inter] gate, then [T][inter] up */
    float *h;                 /* [T][inter] */
} nn_ffn_scratch;

/* Scratch for T tokens of blocks of up to `inter`. */
void nn_ffn_scratch_take(nn_ffn_scratch *s, int32_t inter, nn_arena *a, int32_t tokens);
/* out [T][hidden] = the block of in [T][hidden]. */
void nn_ffn_forward(cv_threadpool *pool, const nn_ffn *f, nn_input in, int32_t T, const nn_ffn_scratch *s, float *out);

#endif
