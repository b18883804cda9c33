/*
 * embed_chunks.h — vLLM's chunked processing of long embedding inputs (--pooler-config
 * enable_chunked_processing): an /v1/embeddings input longer than max_model_len is cut into chunks of
 * max_model_len tokens, each its own pooling request (positions from 0, as a separate prompt; the
 * model's own pooling, normalization and dimensions apply within a chunk), and the prompt's vector is
 * the mean of the chunks' vectors weighted by their token counts. As in vLLM, the mean is not
 * normalized again, and inputs up to max_model_len run as one request.
 *
 * The session submits the chunks and hands each chunk's final event to cv_embed_chunks_fold, which
 * keeps the running weighted sum (in double, whatever the number of chunks) and turns the last one
 * into the prompt's event: the mean, and the whole prompt's token count for the usage.
 */
#ifndef CV_SERVER_EMBED_CHUNKS_H
#define CV_SERVER_EMBED_CHUNKS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine_loop.h"

typedef struct cv_embed_chunks {
    size_t n_chunks;  /* requests the prompt became (1: not chunked, and not folded) */
    size_t left;      /* of them without their final event */
    size_t n_tokens;  /* the prompt's whole length */
    size_t n_cached;  /* prefix-cache hits over the chunks */
    double *sum;      /* Σ chunk vector × chunk tokens; NULL until the first vector */
    size_t width;
    size_t weight;    /* Σ chunk tokens of the vectors summed */
    bool lost;        /* a chunk ended without a vector (aborted) or with another width */
} cv_embed_chunks;

/* How many chunks of chunk_len tokens a prompt of n_ids becomes: 1 when it fits (or chunk_len is 0,
 * chunking off), else ⌈n_ids / chunk_len⌉. */
size_t cv_embed_chunk_count(size_t n_ids, size_t chunk_len);

/* A prompt of n_ids tokens in chunks of chunk_len. */
void cv_embed_chunks_init(cv_embed_chunks *c, size_t n_ids, size_t chunk_len);

/* Folds one of the prompt's chunk events in (non-final ones carry nothing to fold). True when it
 * was the last chunk's final event: ev then is the prompt's — its embedding the weighted mean (NULL
 * when a chunk was lost), n_prompt_token_ids and n_cached_tokens the whole prompt's. */
bool cv_embed_chunks_fold(cv_embed_chunks *c, cv_request_event *ev);

/* Frees the running sum of a prompt whose chunks did not all fold (the last fold frees it). */
void cv_embed_chunks_free(cv_embed_chunks *c);

#endif
