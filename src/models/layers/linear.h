/*
 * linear.h — a linear layer: one or more projections of the same input (internal to src/models).
 *
 * Every matmul of a model is an nn_linear — attention q|k|v and o, the GDN projections, the router,
 * the shared expert and dense MLP, the MTP fc, the lm_head (vocab.h), and the routed experts'
 * gate|up and down (moe.h) — so what a weight format needs is written once, here: how a part is
 * bound from the checkpoint in its scheme (nn_bind_linear, loader/quant.h), how it is packed at
 * load (nn_pack_linears) and how the layer runs, its input quantized when its weights read int8
 * (nn_linear_forward). A new format or quantization scheme is a case of those functions, not a
 * change to the models.
 *
 * Parts that share an input are stacked (q|k|v, gate|up, router|shared-expert gate) and must share
 * one scheme (a mix is refused naming both tensors): every weight is a kernels cv_weight, stacked
 * parts packed into one so that one call computes all of them. bf16 parts are repacked into the
 * kernels' 16-row panels (the lane-wise panel kernel decodes near the memory-bandwidth bound, the
 * row-major one well below it), int8 (W8A8, W8A8_DYNAMIC) into I8_PANELS with the per-row scale and
 * quant_bias, e4m3 (FP8) into FP8_PANELS with its block scales; f32 and f16 parts run row-major
 * straight from the checkpoint mapping, part by part, as do bf16 parts that cannot stack (a part
 * but the last that is not a whole number of panels) and float routed experts, which are read by
 * few tokens each (nn_linear.float_views). Quantized parts that cannot stack are packed one by one.
 *
 * int8 weights read int8 activations, quantized as the scheme says (static: the part's input_scale
 * and input_offset; dynamic: per token). Calibrated checkpoints give the parts of one input the same
 * static quantization; where they differ (made-up weights draw each part's own) the parts are not
 * stacked but packed one by one, and the input is quantized once per distinct quantization. The op
 * that produces a linear's input may quantize it on the way for the first weight (the add+RMSNorm
 * before q|k|v or gate|up, nn_add_rmsnorm_for; the SwiGLU before down) and hand the codes over in
 * nn_input; otherwise nn_linear_forward quantizes the f32 rows itself into the binder's shared int8
 * scratch.
 *
 * In bf16 compute (cv_model_load_params.bf16_compute) on a CPU whose kernels have a bf16 dot product
 * (cv_linear_bf16_input), bf16 weights (and FP8 ones, without AMX: cv_wformat_bf16_input) read
 * their input rounded to bf16, once per call into the binder's shared bf16 scratch; the output, and
 * everything around the linear, stays f32. Elsewhere they read f32 rows, widened exactly.
 * Row-major views (f32 and f16 checkpoints, float routed experts) always read f32.
 *
 * Each part knows its name, the weight's prefix ("model.layers.0.self_attn.q_proj"), so the
 * calibration observer (model.h) hears every part before the layer runs, each with the same f32
 * input rows.
 */
#ifndef CV_LAYERS_LINEAR_H
#define CV_LAYERS_LINEAR_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "loader/pack_cache.h"
#include "loader/quant.h"
#include "models/layers/arena.h"
#include "models/layers/binder.h"

enum { NN_MAX_PARTS = 4 };

typedef struct nn_linear_part {
    const char *name;         /* weight prefix, binder-owned */
    cv_linear_scheme scheme;
    cv_weight_part w;         /* the checkpoint's [out][in] weight and scales; its pages are dropped once packed */
    cv_act_quant quant;       /* W8A8*: how its input is quantized */
} nn_linear_part;

typedef struct nn_linear {
    int n_parts;              /* 0: no layer */
    nn_linear_part parts[NN_MAX_PARTS];
    bool float_views;         /* set before binding: float parts stay row-major views, never packed */
    /* Weight g computes parts [first[g], first[g+1]) stacked: a view of the checkpoint, or a packed
     * format whose data is NULL until nn_pack_linears. */
    int n_weights;
    int first[NN_MAX_PARTS + 1];
    cv_weight w[NN_MAX_PARTS];
    const nn_qrows *scratch;  /* where an int8-input linear quantizes its input (the binder's) */
    const nn_brows *bf16_scratch; /* where its BF16_PANELS weights' input is rounded (NULL: they read f32) */
    nn_observer observe;
    /* LoRA (layers/lora.h): part j is site lora_site[j] of the model's cv_lora_sites; lora_tokens
     * (the binder's: each token's adapter) NULL when no adapter may target l */
    int32_t lora_site[NN_MAX_PARTS];
    const struct nn_lora_tokens *lora_tokens;
} nn_linear;

/* Appends the part `name` (its linear's tensors "<name>.weight" and the scheme's scales,
 * [rows][cols], hint naming the config fields of that shape) to l. A part whose scheme differs from
 * the parts before it: CVLLM_ERR_FORMAT naming both tensors and schemes. */
void nn_bind_linear(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint);
/* The same for this rank's shard of the tensor under tensor parallelism (binder.h nn_split): rows
 * and cols are the whole tensor's, checked as such; a split dimension must divide evenly over the
 * ranks and the part gets its rank's slice (rows: a view; cols: a copy of the slice, packed like
 * any part). An int8 part split by columns keeps its quant_bias on rank 0 only, as the partial sums
 * are added over the ranks. FP8 block scales are not split: CVLLM_ERR_UNSUPPORTED. */
void nn_bind_linear_split(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint,
                          nn_split split);
/* The same with piece `index` of `parts` (replicated shards: several ranks take the same piece). */
void nn_bind_linear_piece(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint,
                          nn_split split, int parts, int index);
/* The same for a tensor whose rows are consecutive blocks of group[0..n_groups) rows that split over
 * the ranks each on its own (Gated DeltaNet's [q | k | v] projection): the part is this rank's slice
 * of every block, in block order, as one copy. */
void nn_bind_linear_row_groups(nn_binder *b, nn_linear *l, const char *name, const int64_t *group, int n_groups,
                               int64_t cols, const char *hint);
/* Appends a float part whose weight is already bound (a tied lm_head is the embedding; a fused 3-D
 * expert tensor's slices). */
void nn_linear_add_view(nn_binder *b, nn_linear *l, const char *name, const cv_matrix *w);
/* The same for this rank's shard of the view under tensor parallelism (as nn_bind_linear_split). */
void nn_linear_add_view_split(nn_binder *b, nn_linear *l, const char *name, const cv_matrix *w, nn_split split);

/* A linear's input rows: f32, and the same rows already quantized, or rounded to bf16, by the op
 * that produced them. */
typedef struct nn_input {
    const float *f32;         /* [T][cols]; NULL only when i8 or bf16 holds the rows for an unobserved linear */
    const int8_t *i8;         /* [T][cv_act_i8_stride(cols)] quantized with `quant`, or NULL */
    const float *i8_scale;    /* [T] */
    cv_act_quant quant;
    const uint16_t *bf16;     /* [T][cv_act_bf16_stride(cols)] as cv_round_bf16_rows rounds f32, or NULL */
} nn_input;

static inline nn_input nn_f32(const float *x) { return (nn_input){.f32 = x}; }

/* SwiGLU fused into l = gate|up (two parts of equal rows, stacked in one weight): h [T][cv_act_bf16_stride(inter)]
 * = the bf16 rows cv_swiglu_bf16 makes from l's output (kernels.h cv_linear_swiglu_bf16). false,
 * having done nothing, where that does not run (where x's rows would have to be rounded into the
 * shared bf16 scratch, which h may be, and where an adapter adds to gate or up before the SwiGLU). */
bool nn_linear_swiglu_bf16(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, uint16_t *h);

/* How the first weight of l quantizes its input; NULL when it reads f32 (or l is empty). */
const cv_act_quant *nn_linear_input_quant(const nn_linear *l);
/* Every weight of l reads its input rounded to bf16 (BF16_PANELS in bf16 compute). */
bool nn_linear_input_bf16(const nn_linear *l);

/* ys[j] [T][parts[j] rows] = x [T][cols] · part jᵀ for every part, plus each token's LoRA delta
 * where its adapter targets the part; the observer, when set, first hears each part's name with
 * x.f32. Codes in x are used when quantized as l reads them. */
void nn_linear_forward(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, float *const *ys);

/* x += delta (none when NULL), a = rmsnorm(x)·w (rows T of dim), as cv_add_rmsnorm; when `next`
 * (may be NULL) reads int8 (nn_linear_input_quant), the norm quantizes a for it on the way into q
 * (cv_add_rmsnorm_quant), and when it reads bf16 (nn_linear_input_bf16) and ab has rows, rounds a
 * into ab (cv_add_rmsnorm_bf16) — and then, when `only_next` says nothing but next reads the
 * result and next has no observer, a itself is not written (the input's f32 is NULL). Returns a as
 * next's input. */
nn_input nn_add_rmsnorm_for(cv_threadpool *pool, float *x, const float *delta, float *a, const float *w, int64_t T,
                            int64_t dim, float eps, const nn_linear *next, bool only_next, const nn_qrows *q,
                            const nn_brows *ab);

/* int8 rows for `tokens` rows of `cols` columns from the arena (nothing when cols is 0). */
void nn_qrows_take(nn_qrows *q, nn_arena *a, int32_t tokens, int64_t cols);
/* The shared int8 and bf16 scratch of every linear b bound (nothing when none reads them). */
void nn_linear_scratch_take(const nn_binder *b, nn_arena *a, int32_t tokens);

/* A model's linears, in packing order. */
typedef struct nn_linear_list {
    nn_linear **at;
    int n, cap;
} nn_linear_list;

void nn_linear_list_add(nn_linear_list *list, nn_linear *l);
void nn_linear_list_free(nn_linear_list *list);

/* Packs the weights of lins that are not views, in that order, each original dropped from memory
 * once packed (never read again). The packing of a checkpoint goes to the packed-weight cache
 * (loader/pack_cache.h), whose entry is returned in *cache (NULL: anonymous memory, e.g. made-up
 * weights), and a later load maps it instead; `layout` names the packing (which linears, stacked
 * how, in which order) and must change whenever that does, since the cache key sees only it, the
 * files, and each packed weight's format and shapes. */
int nn_pack_linears(cv_threadpool *pool, cv_weight_source *src, const char *layout, const nn_linear_list *lins,
                    cv_pack_cache **cache);
void nn_linear_release(nn_linear *l);
/* Releases every linear of list, then frees the list (a model's destroy). */
void nn_linear_list_release(nn_linear_list *list);

#endif
