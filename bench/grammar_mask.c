/*
 * grammar_mask.c — how long a token mask takes on the real Qwen3 vocabulary (151,669 tokens in the
 * tokenizer, 151,936 model rows), for a JSON-like grammar: an object with a string, an integer, an
 * enum and an array of strings.
 *
 * Reports the vocabulary and grammar build times; for a few states (start, inside a string, after a
 * key, inside a number, inside a tag) the first mask (a trie walk) and the second (the grammar's
 * cache); then random walks that draw each next token uniformly among the allowed ones — what a
 * random-weights model does — with the time per mask and the cache's hit rate: once as written
 * (inside an unbounded string the state repeats, so the cache answers) and once with the strings
 * bounded as a JSON schema's maxLength makes them (every position a new state, the hard case).
 *
 *   bench_grammar_mask [steps]      (default 2000)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/timeutil.h"
#include "sample/grammar/grammar.h"
#include "sample/grammar/grammar_internal.h"
#include "tokenizer/tokenizer.h"

#define MODEL_ROWS 151936

static const char GRAMMAR[] =
    "root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws string ws \",\" ws \"\\\"age\\\"\" ws \":\" ws integer ws \",\"\n"
    "         ws \"\\\"color\\\"\" ws \":\" ws color ws \",\" ws \"\\\"tags\\\"\" ws \":\" ws tags ws \"}\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "color ::= \"\\\"red\\\"\" | \"\\\"green\\\"\" | \"\\\"blue\\\"\"\n"
    "tags ::= \"[\" ws (string (ws \",\" ws string)*)? ws \"]\"\n"
    "ws ::= [ \\t\\n]*\n";

/* The same object with JSON-schema bounds, as the converter writes them: strings of at most 40
 * characters, at most 5 tags. Bounded repetitions are chains of optional rules, so every position in
 * a string is a new state: the walk's first visits, not the cache, set the cost. */
static const char GRAMMAR_BOUNDED[] =
    "root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws string ws \",\" ws \"\\\"age\\\"\" ws \":\" ws integer ws \",\"\n"
    "         ws \"\\\"color\\\"\" ws \":\" ws color ws \",\" ws \"\\\"tags\\\"\" ws \":\" ws tags ws \"}\"\n"
    "string ::= \"\\\"\" char{0,40} \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "color ::= \"\\\"red\\\"\" | \"\\\"green\\\"\" | \"\\\"blue\\\"\"\n"
    "tags ::= \"[\" ws (string (ws \",\" ws string){0,4})? ws \"]\"\n"
    "ws ::= [ \\t\\n]{0,2}\n";

static size_t count_allowed(const uint32_t *mask, size_t n_words) {
    size_t n = 0;
    for (size_t w = 0; w < n_words; w++) n += (size_t)__builtin_popcount(mask[w]);
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    cv_tokenizer *tok;
    double t0 = cv_now();
    if (cv_tokenizer_load(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", &tok)) {
        fprintf(stderr, "cannot load the Qwen3 tokenizer\n");
        return 1;
    }
    double t1 = cv_now();
    int32_t eos[] = {cv_tokenizer_token_to_id(tok, "<|im_end|>"), cv_tokenizer_token_to_id(tok, "<|endoftext|>")};
    cv_vocab *v = cv_vocab_new(tok, MODEL_ROWS, eos, 2);
    double t2 = cv_now();
    printf("tokenizer load %.1f ms, vocabulary trie %.1f ms (%u nodes, longest token %u bytes)\n",
           (t1 - t0) * 1e3, (t2 - t1) * 1e3, v->n_nodes, v->max_depth);

    char err[256];
    double t3 = cv_now();
    cv_grammar *g = cv_grammar_parse(GRAMMAR, strlen(GRAMMAR), v, err, sizeof err);
    double t4 = cv_now();
    if (!g) {
        fprintf(stderr, "grammar: %s\n", err);
        return 1;
    }
    printf("grammar parse %.3f ms (%u rules, %u elements)\n", (t4 - t3) * 1e3, g->n_rules, g->n_elems);

    size_t n_words = (MODEL_ROWS + 31) / 32;
    uint32_t *mask = malloc(n_words * sizeof *mask);
    static const struct {
        const char *name, *prefix;
    } states[] = {
        {"start", ""},
        {"inside a string", "{\"name\": \"Al"},
        {"after a key", "{\"name\""},
        {"inside a number", "{\"name\": \"Al\", \"age\": 4"},
        {"inside a tag", "{\"name\": \"Al\", \"age\": 42, \"color\": \"red\", \"tags\": [\"a\", \"b"},
    };
    printf("%-18s %8s %12s %12s\n", "state", "allowed", "first ms", "cached ms");
    for (size_t k = 0; k < sizeof states / sizeof states[0]; k++) {
        cv_matcher *m = cv_matcher_new(g);
        if (!cv_matcher_accept_bytes(m, states[k].prefix, strlen(states[k].prefix))) {
            fprintf(stderr, "the grammar refuses the prefix of '%s'\n", states[k].name);
            return 1;
        }
        double a = cv_now();
        cv_matcher_fill_mask(m, mask);
        double b = cv_now();
        cv_matcher_fill_mask(m, mask);
        double c = cv_now();
        printf("%-18s %8zu %12.3f %12.4f\n", states[k].name, count_allowed(mask, n_words), (b - a) * 1e3, (c - b) * 1e3);
        cv_matcher_free(m);
    }

    /* The random walks: a fresh grammar each (empty cache), tokens drawn uniformly from each mask; a
     * sentence that ends (eos drawn, or nothing may follow) starts over. */
    int32_t *allowed = malloc(MODEL_ROWS * sizeof *allowed);
    double *times = malloc((size_t)steps * sizeof *times);
    static const struct {
        const char *name, *text;
    } walks[] = {{"unbounded strings", GRAMMAR}, {"bounded strings", GRAMMAR_BOUNDED}};
    for (size_t w = 0; w < sizeof walks / sizeof walks[0]; w++) {
        cv_grammar_free(g);
        g = cv_grammar_parse(walks[w].text, strlen(walks[w].text), v, err, sizeof err);
        if (!g) {
            fprintf(stderr, "grammar: %s\n", err);
            return 1;
        }
        cv_matcher *m = cv_matcher_new(g);
        cv_rng rng;
        cv_rng_seed(&rng, 1234);
        double total = 0;
        int sentences = 0;
        for (int step = 0; step < steps; step++) {
            double a = cv_now();
            cv_matcher_fill_mask(m, mask);
            times[step] = cv_now() - a;
            total += times[step];
            size_t n = 0;
            for (int32_t t = 0; t < MODEL_ROWS; t++)
                if ((mask[t >> 5] >> (t & 31)) & 1u) allowed[n++] = t;
            if (n == 0) {
                fprintf(stderr, "no token allowed at step %d\n", step);
                return 1;
            }
            int32_t t = allowed[cv_rng_next(&rng) % n];
            if (!cv_matcher_accept_token(m, t)) {
                fprintf(stderr, "token %d from the mask refused at step %d\n", t, step);
                return 1;
            }
            if (cv_matcher_terminated(m)) {
                sentences++;
                cv_matcher_rollback(m, cv_matcher_history(m));
            }
        }
        cv_mask_cache_stats st;
        cv_grammar_cache_stats(g, &st);
        qsort(times, (size_t)steps, sizeof *times, cmp_double);
        printf("random walk, %s: %d masks, %d objects completed\n", walks[w].name, steps, sentences);
        printf("  per mask: mean %.3f ms, median %.4f ms, p99 %.3f ms, max %.3f ms\n", total / steps * 1e3,
               times[steps / 2] * 1e3, times[steps * 99 / 100] * 1e3, times[steps - 1] * 1e3);
        printf("  cache: %.1f%% hits (%llu hits, %llu misses), %zu entries, %.2f MiB, %llu walks stopped by the budget\n",
               100.0 * (double)st.hits / (double)(st.hits + st.misses), (unsigned long long)st.hits,
               (unsigned long long)st.misses, st.entries, (double)st.bytes / (1 << 20), (unsigned long long)st.stopped);
        cv_matcher_free(m);
    }

    free(times);
    free(allowed);
    free(mask);
    cv_grammar_free(g);
    cv_vocab_free(v);
    cv_tokenizer_free(tok);
    return 0;
}
