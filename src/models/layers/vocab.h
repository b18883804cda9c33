/*
 * vocab.h — the token embedding and the lm_head, and the packing of a model's linears around them
 * (internal to src/models).
 *
 * A tied lm_head is the embedding itself (Hugging Face ties them and ignores any stored lm_head).
 * Once the lm_head is packed, a tied embedding is read back from its panels and the row-major
 * original is gone, so the largest matrix of a small model is resident once. The lm_head is packed
 * first: it is the largest matrix, and packing it before any layer's pages are touched keeps the
 * load's peak memory near 1× the weights.
 *
 * Tensor parallelism (model.h cv_tp): each rank's lm_head is its slice of the vocabulary rows (a
 * tied one a slice of the embedding, which every rank keeps whole for the gather of token rows);
 * nn_logits computes the rank's slice of each row and gathers the slices at rank 0.
 */
#ifndef CV_LAYERS_VOCAB_H
#define CV_LAYERS_VOCAB_H

#include <stdbool.h>
#include <stdint.h>

#include "models/layers/linear.h"

typedef struct nn_vocab {
    cv_weight embed;          /* a view; .data NULL: tied and read from the packed lm_head */
    nn_linear lm_head;        /* one part, named "lm_head" (tied or not): this rank's vocabulary rows */
    bool tied;
    char head_tensor[160];    /* the checkpoint tensor whose rows are the logits' rows: lm_head.weight,
                               * or the embedding when the config ties them (also when pooling) */
    cv_pack_cache *cache;     /* backs every packed linear of the model (NULL: anonymous memory) */
    const cv_tp *tp;          /* tensor parallelism, else NULL */
    float *part, *all;        /* tensor parallelism: this rank's logit slices, and rank 0's gathered ones */
    size_t part_rows;         /* rows part and all hold */
} nn_vocab;

/* embed_name: e.g. "model.embed_tokens.weight"; lm_head.weight unless tied. The embedding is not
 * counted in matmul_bytes (gathered, not streamed), the lm_head is. */
void nn_bind_vocab(nn_binder *b, const char *embed_name, int32_t vocab, int32_t hidden, bool tied, nn_vocab *out);
/* Packs the lm_head, then lins (nn_pack_linears; `layout` names the model's packing). */
int nn_pack_model(cv_threadpool *pool, cv_weight_source *src, const char *layout, nn_vocab *v,
                  const nn_linear_list *lins);
void nn_embed(const nn_vocab *v, const int32_t *ids, int32_t n, float *out);
/* logits [n][vocab] of the final-normed hidden rows x [n][hidden] (under tensor parallelism, every
 * rank calls it and rank 0 gets them; logits is NULL on the others). */
void nn_logits(cv_threadpool *pool, nn_vocab *v, const float *x, int32_t n, float *logits);
void nn_vocab_release(nn_vocab *v);

#endif
