/*
 * grammar_cache.c — cvllm_grammar_compile and the per-engine cache of compiled constraints (see
 * grammar_cache.h).
 *
 * The lock covers the list and the lazy vocabulary only; conversion and parsing run outside it, so
 * two request threads compile two schemas at once. When both compile the same new constraint, the
 * second to finish finds the first's entry and drops its own copy.
 */
#include "engine/grammar_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/error.h"
#include "base/utf8.h"
#include "engine/engine.h"

struct cvllm_grammar {
    atomic_int refs;
    const cv_grammar_cache *owner;
    cv_grammar *grammar;
    char *key;                      /* the constraint's exact content */
    size_t key_len;
    uint64_t hash;
};

struct cv_grammar_cache {
    pthread_mutex_t mu;
    const cv_tokenizer *tok;
    int32_t vocab_size;
    int32_t *eos;
    size_t n_eos;
    cv_vocab *vocab;                /* built at the first compile, under mu */
    cvllm_grammar *entries[CV_GRAMMAR_CACHE_SIZE]; /* most recently used first */
    size_t n_entries;
};

cv_grammar_cache *cv_grammar_cache_new(const cv_tokenizer *tok, int32_t vocab_size, const int32_t *eos, size_t n_eos) {
    cv_grammar_cache *c = cv_xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->tok = tok;
    c->vocab_size = vocab_size;
    c->eos = cv_xmalloc((n_eos ? n_eos : 1) * sizeof *c->eos);
    if (n_eos) memcpy(c->eos, eos, n_eos * sizeof *eos);
    c->n_eos = n_eos;
    return c;
}

void cv_grammar_cache_free(cv_grammar_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_entries; i++) cvllm_grammar_release(c->entries[i]);
    cv_vocab_free(c->vocab);
    free(c->eos);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const cv_grammar *cv_grammar_of(const cvllm_grammar *g) { return g->grammar; }

bool cv_grammar_belongs_to(const cvllm_grammar *g, const cv_grammar_cache *c) { return g->owner == c; }

cvllm_grammar *cv_grammar_retain(const cvllm_grammar *g) {
    cvllm_grammar *m = (cvllm_grammar *)g;
    atomic_fetch_add(&m->refs, 1);
    return m;
}

void cvllm_grammar_release(cvllm_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    cv_grammar_free(g->grammar);
    free(g->key);
    free(g);
}

/* ---- the key: everything that changes the compiled result, length-prefixed ---------------------- */

static void key_add(char **buf, size_t *len, size_t *cap, const void *p, size_t n) {
    uint64_t n64 = n;
    cv_buf_append(buf, len, cap, (const char *)&n64, sizeof n64);
    cv_buf_append(buf, len, cap, p, n);
}

static void key_add_str(char **buf, size_t *len, size_t *cap, const char *s) {
    /* NULL and "" differ (a whitespace_pattern of "" allows no whitespace at all) */
    key_add(buf, len, cap, s ? "s" : "n", 1);
    if (s) key_add(buf, len, cap, s, strlen(s));
}

static char *constraint_key(const cvllm_constraint *c, size_t spec_len, size_t *out_len) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int32_t kind = c->kind;
    bool flags[2] = {c->disable_any_whitespace, c->disable_additional_properties};
    key_add(&buf, &len, &cap, &kind, sizeof kind);
    key_add(&buf, &len, &cap, flags, sizeof flags);
    key_add_str(&buf, &len, &cap, c->whitespace_pattern);
    if (c->spec) key_add(&buf, &len, &cap, c->spec, spec_len);
    for (size_t i = 0; i < c->n_choices; i++) key_add_str(&buf, &len, &cap, c->choices[i]);
    *out_len = len;
    return buf;
}

/* ---- compiling ---------------------------------------------------------------------------------- */

static int check_constraint(const cvllm_constraint *c) {
    const int bad = CVLLM_ERR_INVALID_ARGUMENT;
    switch (c->kind) {
    case CVLLM_CONSTRAINT_JSON:
    case CVLLM_CONSTRAINT_REGEX:
    case CVLLM_CONSTRAINT_GRAMMAR:
    case CVLLM_CONSTRAINT_STRUCTURAL_TAG:
        if (!c->spec) return cv_fail(bad, "the structured output constraint has no text");
        return 0;
    case CVLLM_CONSTRAINT_JSON_OBJECT: return 0;
    case CVLLM_CONSTRAINT_CHOICE:
        if (!c->n_choices) return cv_fail(bad, "choice must list at least one string");
        for (size_t i = 0; i < c->n_choices; i++)
            if (!c->choices[i]) return cv_fail(bad, "choice %zu is not a string", i);
        return 0;
    }
    return cv_fail(bad, "unknown structured output constraint kind %d", (int)c->kind);
}

/* The constraint as EBNF, or NULL with the converter's reason in err. */
static char *to_ebnf(const cvllm_constraint *c, size_t spec_len, char *err, size_t err_len) {
    /* Objects admit only the properties their schema names unless it says additionalProperties, as
     * xgrammar's strict mode (the default of vLLM's default backend) does; disable_additional_properties
     * asks for exactly that, so it is already the behaviour. */
    cv_json_options jo = {.any_whitespace = !c->disable_any_whitespace,
                          .whitespace_pattern = c->whitespace_pattern,
                          .strict_additional_properties = true};
    switch (c->kind) {
    case CVLLM_CONSTRAINT_JSON: return cv_json_schema_to_ebnf(c->spec, spec_len, &jo, err, err_len);
    case CVLLM_CONSTRAINT_JSON_OBJECT: return cv_json_object_ebnf(&jo);
    case CVLLM_CONSTRAINT_REGEX: return cv_regex_to_ebnf(c->spec, spec_len, err, err_len);
    case CVLLM_CONSTRAINT_CHOICE: return cv_choice_to_ebnf(c->choices, c->n_choices);
    case CVLLM_CONSTRAINT_STRUCTURAL_TAG: return cv_structural_tag_to_ebnf(c->spec, spec_len, &jo, err, err_len);
    case CVLLM_CONSTRAINT_GRAMMAR: {
        char *copy = cv_xmalloc(spec_len + 1);
        memcpy(copy, c->spec, spec_len);
        copy[spec_len] = '\0';
        return copy;
    }
    }
    return NULL;
}

/* The converters for json_object and choice have no error text of their own: a json_object fails only
 * on its whitespace pattern (which the schema converter explains), a choice only on text that is not
 * UTF-8. */
static void reason_without_message(const cvllm_constraint *c, char *err, size_t err_len) {
    if (c->kind == CVLLM_CONSTRAINT_CHOICE) {
        snprintf(err, err_len, "a choice is not valid UTF-8");
        return;
    }
    cv_json_options jo = {.whitespace_pattern = c->whitespace_pattern, .any_whitespace = !c->disable_any_whitespace};
    free(cv_json_schema_to_ebnf("{}", 2, &jo, err, err_len));
}

static const char *kind_name(cvllm_constraint_kind k) {
    switch (k) {
    case CVLLM_CONSTRAINT_JSON: return "JSON schema";
    case CVLLM_CONSTRAINT_JSON_OBJECT: return "JSON object";
    case CVLLM_CONSTRAINT_REGEX: return "regex";
    case CVLLM_CONSTRAINT_CHOICE: return "choice";
    case CVLLM_CONSTRAINT_GRAMMAR: return "grammar";
    case CVLLM_CONSTRAINT_STRUCTURAL_TAG: return "structural tag";
    }
    return "constraint";
}

static cvllm_grammar *lookup(cv_grammar_cache *c, uint64_t hash, const char *key, size_t key_len) {
    for (size_t i = 0; i < c->n_entries; i++) {
        cvllm_grammar *g = c->entries[i];
        if (g->hash != hash || g->key_len != key_len || memcmp(g->key, key, key_len) != 0) continue;
        memmove(c->entries + 1, c->entries, i * sizeof *c->entries);
        c->entries[0] = g;
        return cv_grammar_retain(g);
    }
    return NULL;
}

static void insert(cv_grammar_cache *c, cvllm_grammar *g) {
    if (c->n_entries == CV_GRAMMAR_CACHE_SIZE) cvllm_grammar_release(c->entries[--c->n_entries]);
    memmove(c->entries + 1, c->entries, c->n_entries * sizeof *c->entries);
    c->entries[0] = cv_grammar_retain(g);
    c->n_entries++;
}

cvllm_status cvllm_grammar_compile(const cvllm_engine *e, const cvllm_constraint *con, cvllm_grammar **out) {
    if (!e || !con || !out) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_grammar_compile: NULL argument");
    *out = NULL;
    int rc = check_constraint(con);
    if (rc) return rc;
    cv_grammar_cache *c = e->grammars;
    size_t spec_len = con->spec ? (con->spec_len ? con->spec_len : strlen(con->spec)) : 0, key_len;
    char *key = constraint_key(con, spec_len, &key_len);
    uint64_t hash = XXH3_64bits(key, key_len);

    pthread_mutex_lock(&c->mu);
    cvllm_grammar *hit = lookup(c, hash, key, key_len);
    if (!hit && !c->vocab) c->vocab = cv_vocab_new(c->tok, c->vocab_size, c->eos, c->n_eos);
    pthread_mutex_unlock(&c->mu);
    if (hit) {
        free(key);
        *out = hit;
        return CVLLM_OK;
    }

    char err[512] = "";
    cv_grammar *grammar = NULL;
    char *ebnf = to_ebnf(con, spec_len, err, sizeof err);
    if (ebnf) grammar = cv_grammar_parse(ebnf, strlen(ebnf), c->vocab, err, sizeof err);
    else if (!err[0]) reason_without_message(con, err, sizeof err);
    free(ebnf);
    if (!grammar) {
        free(key);
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid %s: %s", kind_name(con->kind), err);
    }
    cvllm_grammar *g = cv_xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    g->owner = c;
    g->grammar = grammar;
    g->key = key;
    g->key_len = key_len;
    g->hash = hash;

    pthread_mutex_lock(&c->mu);
    hit = lookup(c, hash, key, key_len);
    if (!hit) insert(c, g);
    pthread_mutex_unlock(&c->mu);
    if (hit) {
        cvllm_grammar_release(g);
        g = hit;
    }
    *out = g;
    return CVLLM_OK;
}
