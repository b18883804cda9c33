/*
 * vocab.c — a model's vocabulary as the grammar sees it: each id's kind (never allowed, bytes, eos),
 * a copy of the byte strings (the tokenizer need not outlive it), and the trie of those strings that
 * mask.c walks.
 *
 * The trie is laid out in preorder in one array: a node's first child is the next entry and `next`
 * skips its whole subtree, so a walk is a forward scan that jumps over rejected subtrees, touching
 * memory in order. It is built from the byte strings sorted lexicographically: each string shares
 * its longest common prefix with the previous one, so only its remaining bytes become new nodes, and
 * the nodes deeper than that prefix are closed (their subtree ends) when the next string arrives.
 *
 * Two ids with the same bytes (an added token spelling a vocabulary entry) share one node; the
 * second is listed in `dup` and mask.c copies its bit.
 *
 * Never allowed: special and added tokens (they are control tokens, not text), ids the tokenizer does
 * not know (the model's padded rows), empty byte strings and strings longer than 4095 bytes. Eos ids are allowed only at a complete
 * sentence (mask.c sets them apart from the trie).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "sample/grammar/grammar_internal.h"

#define MAX_TOKEN_BYTES 4095u  /* the trie's depth field */

typedef struct entry {
    const uint8_t *s;
    uint32_t len;
    int32_t id;
} entry;

static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c) return c;
    return (x->len > y->len) - (x->len < y->len);
}

static void build_trie(cv_vocab *v, entry *e, size_t n) {
    qsort(e, n, sizeof *e, cmp_entry);
    size_t cap = 1024;
    v->trie = cv_xmalloc(cap * sizeof *v->trie);
    uint32_t *open = cv_xmalloc((v->max_depth + 1) * sizeof *open);  /* node at each depth of the path */
    uint32_t n_nodes = 0, prev_len = 0;
    const uint8_t *prev = NULL;
    for (size_t k = 0; k < n; k++) {
        uint32_t lcp = 0;
        while (lcp < prev_len && lcp < e[k].len && prev[lcp] == e[k].s[lcp]) lcp++;
        if (lcp == e[k].len) {  /* sorted, so the same bytes as the previous string */
            v->dup = cv_xrealloc(v->dup, 2 * (v->n_dup + 1) * sizeof *v->dup);
            v->dup[2 * v->n_dup] = e[k].id;
            v->dup[2 * v->n_dup + 1] = (int32_t)v->trie[open[lcp]].token;
            v->n_dup++;
            continue;
        }
        for (uint32_t d = prev_len; d > lcp; d--) v->trie[open[d]].next = n_nodes;
        for (uint32_t d = lcp + 1; d <= e[k].len; d++) {
            assert(n_nodes < (1u << 24) - 1);  /* the node's next field */
            if (n_nodes == cap) {
                cap *= 2;
                v->trie = cv_xrealloc(v->trie, cap * sizeof *v->trie);
            }
            v->trie[n_nodes] = (cv_trie_node){.token = v->no_token, .depth = d, .byte = e[k].s[d - 1]};
            open[d] = n_nodes++;
        }
        v->trie[open[e[k].len]].token = (uint32_t)e[k].id;
        prev = e[k].s;
        prev_len = e[k].len;
    }
    for (uint32_t d = prev_len; d > 0; d--) v->trie[open[d]].next = n_nodes;
    free(open);
    v->n_nodes = n_nodes;
    v->trie = cv_xrealloc(v->trie, (n_nodes ? n_nodes : 1) * sizeof *v->trie);
}

cv_vocab *cv_vocab_new(const cv_tokenizer *tok, int32_t vocab_size, const int32_t *eos, size_t n_eos) {
    assert(vocab_size > 0 && vocab_size < (1 << 20) - 32);  /* the trie's token field */
    cv_vocab *v = cv_xcalloc(1, sizeof *v);
    v->size = vocab_size;
    v->no_token = ((uint32_t)vocab_size + 31) / 32 * 32;
    v->kind = cv_xcalloc((size_t)vocab_size, 1);
    v->off = cv_xcalloc((size_t)vocab_size + 1, sizeof *v->off);
    v->eos = cv_xmalloc((n_eos ? n_eos : 1) * sizeof *v->eos);
    for (size_t k = 0; k < n_eos; k++) {
        if (eos[k] < 0 || eos[k] >= vocab_size || v->kind[eos[k]] == CV_TOK_EOS) continue;
        v->kind[eos[k]] = CV_TOK_EOS;
        v->eos[v->n_eos++] = eos[k];
    }
    int32_t known = cv_tokenizer_vocab_size(tok);
    if (known > vocab_size) known = vocab_size;
    size_t total = 0;
    for (int32_t id = 0; id < known; id++) {
        size_t len;
        if (v->kind[id] != CV_TOK_EOS && !cv_tokenizer_is_special(tok, id) &&
            cv_tokenizer_id_to_bytes(tok, id, &len) && len > 0 && len <= MAX_TOKEN_BYTES)
            total += len;
    }
    v->bytes = cv_xmalloc(total ? total : 1);
    entry *e = cv_xmalloc(((size_t)known + 1) * sizeof *e);
    size_t n = 0, at = 0;
    for (int32_t id = 0; id < vocab_size; id++) {
        v->off[id] = (uint32_t)at;
        if (id >= known || v->kind[id] == CV_TOK_EOS || cv_tokenizer_is_special(tok, id)) continue;
        size_t len;
        const char *s = cv_tokenizer_id_to_bytes(tok, id, &len);
        if (!s || len == 0 || len > MAX_TOKEN_BYTES) continue;
        memcpy(v->bytes + at, s, len);
        v->kind[id] = CV_TOK_BYTES;
        e[n++] = (entry){.s = v->bytes + at, .len = (uint32_t)len, .id = id};
        if (len > v->max_depth) v->max_depth = (uint32_t)len;
        at += len;
    }
    v->off[vocab_size] = (uint32_t)at;
    build_trie(v, e, n);
    free(e);
    return v;
}

void cv_vocab_free(cv_vocab *v) {
    if (!v) return;
    free(v->kind);
    free(v->off);
    free(v->bytes);
    free(v->trie);
    free(v->dup);
    free(v->eos);
    free(v);
}

int32_t cv_vocab_size(const cv_vocab *v) {
    return v->size;
}
