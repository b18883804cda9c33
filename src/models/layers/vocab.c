/*
 * vocab.c — see vocab.h. Embedding rows and logits are charged to the profile's embed and lm_head
 * roles.
 */
#include "models/layers/vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "models/layers/timed.h"

void nn_bind_vocab(nn_binder *b, const char *embed_name, int32_t vocab, int32_t hidden, bool tied, nn_vocab *out) {
    const size_t streamed = b->matmul_bytes;
    cv_matrix embed;
    nn_bind_matrix(b, embed_name, vocab, hidden, "vocab_size, hidden_size", &embed);
    b->matmul_bytes = streamed; /* gathered one row per token, not streamed */
    if (b->rc) return;
    snprintf(out->head_tensor, sizeof out->head_tensor, "%s", tied ? embed_name : "lm_head.weight");
    /* A pooling model computes no logits but keeps the tied head: one view of the embedding, no bytes
     * of its own, and the forward pass stays the generating one's. */
    tied = tied || b->pooling;
    out->embed = cv_weight_view(&embed);
    out->tied = tied;
    out->tp = b->tp.size > 1 ? &b->tp : NULL;
    b->adapters_off = true; /* its rows are the logit rows, not the batch's tokens */
    if (tied) {
        nn_linear_add_view_split(b, &out->lm_head, "lm_head", &embed, NN_SPLIT_ROWS);
        if (!b->rc)
            b->matmul_bytes += (size_t)out->lm_head.parts[0].w.rows * (size_t)hidden * cv_dtype_size(embed.dtype);
    } else {
        nn_bind_linear_split(b, &out->lm_head, "lm_head", vocab, hidden,
                             "vocab_size, hidden_size (tie_word_embeddings=false)", NN_SPLIT_ROWS);
    }
    b->adapters_off = false;
}

int nn_pack_model(cv_threadpool *pool, cv_weight_source *src, const char *layout, nn_vocab *v,
                  const nn_linear_list *lins) {
    nn_linear_list all = {0};
    nn_linear_list_add(&all, &v->lm_head);
    for (int i = 0; i < lins->n; i++) nn_linear_list_add(&all, lins->at[i]);
    /* Which tensor the lm_head is belongs in the key: a tied load of an untied checkpoint packs
     * embed_tokens, of the same shape as lm_head.weight. */
    /* each tensor-parallel rank packs its own shard */
    char *key = cv_xasprintf("%s; lm_head %s; tensor-parallel rank %d of %d", layout,
                             v->tied ? "tied to the embedding" : "lm_head.weight", v->tp ? v->tp->rank : 0,
                             v->tp ? v->tp->size : 1);
    int rc = nn_pack_linears(pool, src, key, &all, &v->cache);
    /* Packed, the rows now come from the panels (unless they are only this rank's slice). */
    if (!rc && v->tied && !v->tp && v->lm_head.w[0].data != v->embed.data) v->embed = (cv_weight){0};
    free(key);
    nn_linear_list_free(&all);
    return rc;
}

void nn_embed(const nn_vocab *v, const int32_t *ids, int32_t n, float *out) {
    NN_TIMED(CV_OP_EMBED, cv_embed_weight(v->embed.data ? &v->embed : &v->lm_head.w[0], ids, n, out));
}

void nn_logits(cv_threadpool *pool, nn_vocab *v, const float *x, int32_t n, float *logits) {
    if (n <= 0) return;
    if (!v->tp) {
        NN_TIMED(CV_OP_LM_HEAD, nn_linear_forward(pool, &v->lm_head, nn_f32(x), n, &logits));
        return;
    }
    const int ranks = v->tp->size;
    const int64_t slice = v->lm_head.parts[0].w.rows;
    if ((size_t)n > v->part_rows) {
        free(v->part);
        free(v->all);
        v->part = cv_xmalloc((size_t)n * (size_t)slice * sizeof *v->part);
        v->all = v->tp->rank == 0 ? cv_xmalloc((size_t)ranks * (size_t)n * (size_t)slice * sizeof *v->all) : NULL;
        v->part_rows = (size_t)n;
    }
    NN_TIMED(CV_OP_LM_HEAD, nn_linear_forward(pool, &v->lm_head, nn_f32(x), n, &v->part));
    NN_TIMED(CV_OP_ALLREDUCE, v->tp->gather(v->tp->ctx, v->part, (size_t)n * (size_t)slice, v->all));
    if (v->tp->rank != 0) return;
    for (int r = 0; r < ranks; r++) /* [rank][row][slice] → [row][rank·slice] */
        for (int32_t i = 0; i < n; i++)
            memcpy(logits + (int64_t)i * ranks * slice + r * slice, v->all + ((int64_t)r * n + i) * slice,
                   (size_t)slice * sizeof *logits);
}

void nn_vocab_release(nn_vocab *v) {
    free(v->part);
    free(v->all);
    v->part = v->all = NULL;
    nn_linear_release(&v->lm_head);
    cv_pack_cache_close(v->cache);
    v->cache = NULL;
}
