/*
 * stream.h — the residual stream's buffers, which every model's forward pass carves first (internal
 * to src/models).
 *
 * Each decoder layer reads the residual stream x, normalises it into a (folding in the previous
 * block's output o, so x is touched once per block), and writes its block's output to o; RoPE's
 * cos/sin rows are computed once per forward for all layers. When an int8 linear reads the normed
 * rows, the norm also writes them quantized into aq. Every model has exactly these, so they are
 * declared and carved here once.
 */
#ifndef CV_LAYERS_STREAM_H
#define CV_LAYERS_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "models/layers/arena.h"
#include "models/layers/linear.h"

typedef struct nn_stream {
    float *x;          /* residual stream [T][hidden] */
    float *a;          /* normed input [T][hidden] */
    float *o;          /* block output, added to x by the next norm [T][hidden] */
    float *cos, *sin;  /* [T][rot_dim/2] */
    nn_qrows aq;       /* a quantized, for an int8 linear reading it */
    nn_brows ab;       /* a rounded to bf16, for a bf16-input linear reading it */
} nn_stream;

/* aq holds `hidden` columns where some linear bound by b reads int8 rows, ab where some reads bf16. */
void nn_stream_take(nn_stream *s, nn_arena *a, int32_t tokens, int32_t hidden, int32_t rot_dim, const nn_binder *b);

#endif
