/*
 * trunk.h — what every decoder-only model holds around its layers (internal to src/models): the
 * weight binder, the embedding and lm_head, the final norm, the RoPE table, the activation scratch
 * and the residual stream's buffers; with the steps before the first layer and after the last.
 *
 * Residual stream: each decoder layer reads x, normalises it into a (folding in the previous block's
 * output o, so x is touched once per block), and writes its block's output to o; RoPE's cos/sin rows
 * are computed once per forward for all layers. When an int8 linear reads the normed rows, the norm
 * also writes them quantized into aq (bf16 rows into ab for a bf16-input linear).
 *
 * A model file embeds an nn_trunk, binds its own layers (and the trunk's vocab and final norm, whose
 * tensor names differ between families) through trunk.bound, and lists its layers' linears for
 * nn_trunk_pack and nn_trunk_release; the packing, the carving of the stream, the output rows and
 * the teardown are then the same code for every model.
 */
#ifndef CV_LAYERS_TRUNK_H
#define CV_LAYERS_TRUNK_H

#include <stdbool.h>
#include <stdint.h>

#include "models/layers/arena.h"
#include "models/layers/binder.h"
#include "models/layers/linear.h"
#include "models/layers/vocab.h"

typedef struct nn_stream {
    float *x;          /* residual stream [T][hidden] */
    float *a;          /* normed input [T][hidden]; the logit rows' final-normed states at the end */
    float *o;          /* block output, added to x by the next norm [T][hidden] */
    float *cos, *sin;  /* [T][rot_dim/2] */
    nn_qrows aq;       /* a quantized, for an int8 linear reading it */
    nn_brows ab;       /* a rounded to bf16, for a bf16-input linear reading it */
} nn_stream;

typedef struct nn_trunk {
    int32_t hidden, vocab;
    float eps;                /* RMSNorm epsilon, of the final norm and of the layers' norms */
    nn_binder bound;
    nn_vocab vocab_w;         /* embedding and lm_head */
    const float *final_norm;  /* [hidden] */
    cv_rope rope;
    nn_scratch scratch;       /* its carve function starts with nn_trunk_take */
    nn_stream st;
} nn_trunk;

/* hidden and vocab from the config, the binder for p, the RoPE table (an error: the rope config). */
int nn_trunk_init(nn_trunk *t, const cv_model_load_params *p, float eps);
/* Carves the stream for `tokens` rows (aq where some linear bound reads int8 rows, ab where some
 * reads bf16) and the linears' shared scratch. */
void nn_trunk_take(nn_trunk *t, nn_arena *a, int32_t tokens);
/* Packs the lm_head, then lins in order (`layout` names the model's packing: it keys the
 * packed-weight cache), and frees the list. */
int nn_trunk_pack(nn_trunk *t, cv_threadpool *pool, cv_weight_source *src, const char *layout, nn_linear_list *lins);
/* st.x = the batch's token embeddings; st.cos/st.sin for its positions. */
void nn_trunk_embed(nn_trunk *t, cv_threadpool *pool, const cv_batch *b);
/* After the last layer: the last residual add (st.x + st.o) and the final norm with `gain`, of
 * every token into b->hidden_out when asked, else of the logit rows only; then their logits. */
void nn_trunk_emit(nn_trunk *t, cv_threadpool *pool, const cv_batch *b, const float *gain, float *logits);
/* Releases lins' packed weights and frees the list, then all the trunk holds. */
void nn_trunk_release(nn_trunk *t, nn_linear_list *lins);

#endif
