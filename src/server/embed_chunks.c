/*
 * embed_chunks.c — the weighted mean of a long embedding input's chunk vectors (see embed_chunks.h).
 */
#include "server/embed_chunks.h"

#include <assert.h>
#include <stdlib.h>

#include "base/error.h"

size_t cv_embed_chunk_count(size_t n_ids, size_t chunk_len) {
    if (chunk_len == 0 || n_ids <= chunk_len) return 1;
    return n_ids / chunk_len + (n_ids % chunk_len != 0);
}

void cv_embed_chunks_init(cv_embed_chunks *c, size_t n_ids, size_t chunk_len) {
    *c = (cv_embed_chunks){.n_chunks = cv_embed_chunk_count(n_ids, chunk_len), .n_tokens = n_ids};
    c->left = c->n_chunks;
}

bool cv_embed_chunks_fold(cv_embed_chunks *c, cv_request_event *ev) {
    if (!ev->finished) return false;
    assert(c->left > 0 && !ev->prompt_logprobs); /* a pooling request has none, so its count may change */
    c->n_cached += ev->n_cached_tokens;
    if (!ev->embedding || (c->sum && ev->n_embedding != c->width)) {
        c->lost = true;
    } else if (!c->lost) {
        if (!c->sum) {
            c->width = ev->n_embedding;
            c->sum = cv_xcalloc(c->width ? c->width : 1, sizeof *c->sum);
        }
        for (size_t k = 0; k < c->width; k++) c->sum[k] += (double)ev->embedding[k] * (double)ev->n_prompt_token_ids;
        c->weight += ev->n_prompt_token_ids;
    }
    if (--c->left > 0) return false;
    free(ev->embedding);
    ev->embedding = NULL;
    ev->n_embedding = 0;
    if (!c->lost && c->weight > 0) {
        ev->embedding = cv_xmalloc((c->width ? c->width : 1) * sizeof *ev->embedding);
        for (size_t k = 0; k < c->width; k++) ev->embedding[k] = (float)(c->sum[k] / (double)c->weight);
        ev->n_embedding = c->width;
    }
    ev->n_prompt_token_ids = c->n_tokens;
    ev->n_cached_tokens = c->n_cached;
    cv_embed_chunks_free(c);
    return true;
}

void cv_embed_chunks_free(cv_embed_chunks *c) {
    free(c->sum);
    c->sum = NULL;
}
