/*
 * vocab.c — see vocab.h. Embedding rows and logits are charged to the profile's embed and lm_head
 * roles.
 */
#include "models/layers/vocab.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "models/layers/timed.h"

void nn_bind_vocab(nn_binder *b, const char *embed_name, int32_t vocab, int32_t hidden, bool tied, nn_vocab *out) {
    const size_t streamed = b->matmul_bytes;
    cv_matrix embed;
    nn_bind_matrix(b, embed_name, vocab, hidden, "vocab_size, hidden_size", &embed);
    b->matmul_bytes = streamed; /* gathered one row per token, not streamed */
    if (b->rc) return;
    out->embed = cv_weight_view(&embed);
    if (tied) {
        nn_linear_add_view(b, &out->lm_head, "lm_head", &embed);
        b->matmul_bytes += (size_t)vocab * (size_t)hidden * cv_dtype_size(embed.dtype);
    } else {
        nn_bind_linear(b, &out->lm_head, "lm_head", vocab, hidden, "vocab_size, hidden_size (tie_word_embeddings=false)");
    }
}

static bool is_tied(const nn_vocab *v) { return v->lm_head.parts[0].w.data == v->embed.data; }

int nn_pack_model(cv_threadpool *pool, cv_weight_source *src, const char *layout, nn_vocab *v,
                  const nn_linear_list *lins) {
    nn_linear_list all = {0};
    nn_linear_list_add(&all, &v->lm_head);
    for (int i = 0; i < lins->n; i++) nn_linear_list_add(&all, lins->at[i]);
    /* Which tensor the lm_head is belongs in the key: a tied load of an untied checkpoint packs
     * embed_tokens, of the same shape as lm_head.weight. */
    const bool tied = is_tied(v);
    char *key = cv_xasprintf("%s; lm_head %s", layout, tied ? "tied to the embedding" : "lm_head.weight");
    int rc = nn_pack_linears(pool, src, key, &all, &v->cache);
    /* Packed, the rows now come from the panels. */
    if (!rc && tied && v->lm_head.w[0].data != v->embed.data) v->embed = (cv_weight){0};
    free(key);
    nn_linear_list_free(&all);
    return rc;
}

void nn_embed(const nn_vocab *v, const int32_t *ids, int32_t n, float *out) {
    NN_TIMED(CV_OP_EMBED, cv_embed_weight(v->embed.data ? &v->embed : &v->lm_head.w[0], ids, n, out));
}

void nn_logits(cv_threadpool *pool, const nn_vocab *v, const float *x, int32_t n, float *logits) {
    if (n > 0) NN_TIMED(CV_OP_LM_HEAD, nn_linear_forward(pool, &v->lm_head, nn_f32(x), n, &logits));
}

void nn_vocab_release(nn_vocab *v) {
    nn_linear_release(&v->lm_head);
    cv_pack_cache_close(v->cache);
    v->cache = NULL;
}
