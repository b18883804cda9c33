/*
 * grammar_proc.c — see grammar_proc.h.
 *
 * The mask is a bitmask the matcher fills (from its cache when the state was seen before); turning
 * it into -inf logits goes a 32-bit word at a time, and a word of all-allowed tokens costs one test,
 * so a state that allows most of the vocabulary (the inside of a JSON string) is as cheap as one
 * that allows little.
 *
 * After the sentence has ended with an eos, the matcher accepts nothing. A request with ignore_eos
 * goes on generating; it is then held to eos ids, the only tokens that keep the output complete,
 * rather than left with an empty mask.
 */
#include "sample/grammar_proc.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct grammar_proc {
    cv_logits_proc base;
    cv_matcher *matcher;
    int32_t after_token;       /* -1 once the constraint is active */
    int32_t *eos;
    size_t n_eos;
    uint32_t *mask;            /* (vocab + 31) / 32 words */
    size_t n_words;
} grammar_proc;

static bool is_eos(const grammar_proc *g, int32_t token) {
    for (size_t i = 0; i < g->n_eos; i++)
        if (g->eos[i] == token) return true;
    return false;
}

static void apply(cv_logits_proc *p, float *logits, int32_t vocab_size) {
    grammar_proc *g = (grammar_proc *)p;
    if (g->after_token >= 0) return;
    assert((size_t)vocab_size <= g->n_words * 32);
    cv_matcher_fill_mask(g->matcher, g->mask);
    if (cv_matcher_terminated(g->matcher)) {
        memset(g->mask, 0, g->n_words * sizeof *g->mask);
        for (size_t i = 0; i < g->n_eos; i++)
            if (g->eos[i] >= 0 && g->eos[i] < vocab_size) g->mask[g->eos[i] / 32] |= 1u << (g->eos[i] % 32);
    }
    for (size_t w = 0; w < g->n_words; w++) {
        uint32_t bits = g->mask[w];
        if (bits == UINT32_MAX) continue;
        int32_t base = (int32_t)w * 32, end = base + 32 < vocab_size ? base + 32 : vocab_size;
        for (int32_t t = base; t < end; t++)
            if (!(bits >> (t - base) & 1u)) logits[t] = -INFINITY;
    }
}

static bool accept(cv_logits_proc *p, int32_t token) {
    grammar_proc *g = (grammar_proc *)p;
    if (g->after_token >= 0) {
        if (token == g->after_token) g->after_token = -1;
        return true;
    }
    if (cv_matcher_terminated(g->matcher) && is_eos(g, token)) return true;
    return cv_matcher_accept_token(g->matcher, token);
}

static void proc_free(cv_logits_proc *p) {
    grammar_proc *g = (grammar_proc *)p;
    cv_matcher_free(g->matcher);
    free(g->eos);
    free(g->mask);
    free(g);
}

static const cv_logits_proc_i GRAMMAR_PROC = {apply, accept, proc_free};

cv_logits_proc *cv_grammar_proc_new(const cv_grammar *gr, int32_t vocab_size, int32_t after_token, const int32_t *eos,
                                    size_t n_eos) {
    grammar_proc *g = cv_xcalloc(1, sizeof *g);
    g->base.i = &GRAMMAR_PROC;
    g->matcher = cv_matcher_new(gr);
    g->after_token = after_token;
    g->eos = cv_xmalloc((n_eos ? n_eos : 1) * sizeof *g->eos);
    if (n_eos) memcpy(g->eos, eos, n_eos * sizeof *eos);
    g->n_eos = n_eos;
    g->n_words = ((size_t)vocab_size + 31) / 32;
    g->mask = cv_xmalloc(g->n_words * sizeof *g->mask);
    return &g->base;
}
