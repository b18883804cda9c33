/*
 * linear.h — a linear layer: one or more projections of the same input (internal to src/models).
 *
 * Every matmul of a model but the routed experts is an nn_linear — attention q|k|v and o, the GDN
 * projections, the router, the shared expert and dense MLP, the MTP fc, the lm_head (vocab.h) — so
 * what a weight format needs is written once, here: how a part is bound from the checkpoint
 * (nn_bind_linear), whether and how it is packed at load, and how the layer runs (nn_linear_forward).
 * A new format or quantization scheme is a case of those three functions, not a change to the
 * models.
 *
 * Parts that share an input are stacked (q|k|v, gate|up, router|shared-expert gate): bf16 parts
 * are repacked once at load into the kernels' 16-row panels, stacked so that one call computes all
 * of them (the lane-wise panel kernel decodes near the memory-bandwidth bound, the row-major one
 * well below it); other dtypes run row-major straight from the checkpoint mapping, part by part.
 *
 * Each part knows its name, the weight's prefix ("model.layers.0.self_attn.q_proj"), so the
 * calibration observer (model.h) hears every part before the layer runs, each with the same input
 * rows.
 */
#ifndef CV_LAYERS_LINEAR_H
#define CV_LAYERS_LINEAR_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "loader/pack_cache.h"
#include "models/layers/binder.h"

enum { NN_MAX_PARTS = 4 };

typedef struct nn_linear_part {
    const char *name;         /* weight prefix, binder-owned */
    cv_matrix w;              /* [out][in] view of the checkpoint; its pages are dropped once packed */
} nn_linear_part;

typedef struct nn_linear {
    int n_parts;              /* 0: no layer */
    nn_linear_part parts[NN_MAX_PARTS];
    cv_panels packed;         /* .data NULL: not packed */
    nn_observer observe;
} nn_linear;

/* Appends the part `name` (its tensor "<name>.weight", [rows][cols], hint naming the config fields
 * of that shape) to l. */
void nn_bind_linear(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint);
/* Appends a part whose weight is already bound (a tied lm_head is the embedding). */
void nn_linear_add_view(nn_binder *b, nn_linear *l, const char *name, const cv_matrix *w);

/* ys[j] [T][parts[j] rows] = x [T][cols] · part jᵀ for every part; the observer, when set, first
 * hears each part's name with x. */
void nn_linear_forward(cv_threadpool *pool, const nn_linear *l, const float *x, int64_t T, float *const *ys);

/* Packs those of lins[0..n) whose parts are all bf16 and stack (every part but the last a whole
 * number of panels), in that order; the others keep the row-major path. Each original is dropped
 * from memory once packed (never read again). The packing of a checkpoint goes to the packed-weight
 * cache (loader/pack_cache.h), whose entry is returned in *cache (NULL: anonymous memory, e.g. made-up
 * weights), and a later load maps it instead; `layout` names the packing (which linears, stacked how,
 * in which order) and must change whenever that does, since the cache key sees only it, the files
 * and the shapes. */
int nn_pack_linears(cv_threadpool *pool, cv_weight_source *src, const char *layout, nn_linear *const *lins, int n,
                    cv_pack_cache **cache);
void nn_linear_release(nn_linear *l);

#endif
