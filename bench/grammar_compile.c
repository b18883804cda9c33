/*
 * grammar_compile.c — what compiling a constraint costs, for every constraint of the structured-outputs
 * test corpus (tests/data/structured/corpus.json), on the real Qwen3 vocabulary: the conversion to
 * EBNF, the parse into an automaton bound to the vocabulary, and the first token mask at the start
 * (what a request with a new constraint pays before its first token; the vocabulary trie itself is
 * built once per engine and is reported separately). cvllm_grammar_compile does exactly these steps.
 *
 *   bench_grammar_compile [corpus.json]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "sample/grammar/grammar.h"
#include "tokenizer/tokenizer.h"

#define MODEL_ROWS 151936

static char *to_ebnf(json_t *c, char *err, size_t err_len) {
    const char *kind = json_string_value(json_object_get(c, "kind"));
    cv_json_options jo = {.any_whitespace = !json_is_true(json_object_get(c, "compact")),
                          .whitespace_pattern = json_string_value(json_object_get(c, "whitespace_pattern")),
                          .strict_additional_properties = true};
    if (!strcmp(kind, "json")) {
        char *schema = json_dumps(json_object_get(c, "schema"), JSON_COMPACT | JSON_PRESERVE_ORDER);
        char *out = cv_json_schema_to_ebnf(schema, strlen(schema), &jo, err, err_len);
        free(schema);
        return out;
    }
    if (!strcmp(kind, "json_object")) return cv_json_object_ebnf(&jo);
    const char *spec = json_string_value(json_object_get(c, "spec"));
    if (!strcmp(kind, "regex")) return cv_regex_to_ebnf(spec, strlen(spec), err, err_len);
    if (!strcmp(kind, "grammar")) return strdup(spec);
    json_t *ch = json_object_get(c, "choices");
    const char *choices[64];
    size_t n = json_array_size(ch) < 64 ? json_array_size(ch) : 64;
    for (size_t i = 0; i < n; i++) choices[i] = json_string_value(json_array_get(ch, i));
    return cv_choice_to_ebnf(choices, n);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : CVLLM_SOURCE_DIR "/tests/data/structured/corpus.json";
    json_t *corpus = json_load_file(path, JSON_PRESERVE_ORDER, NULL);
    cv_tokenizer *tok = NULL;
    if (!corpus || cv_tokenizer_load(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", &tok)) {
        fprintf(stderr, "cannot load the corpus or the tokenizer\n");
        return 1;
    }
    const int32_t eos[2] = {151645, 151643};
    double t0 = cv_now();
    cv_vocab *vocab = cv_vocab_new(tok, MODEL_ROWS, eos, 2);
    printf("vocabulary trie: %.1f ms (once per engine)\n", (cv_now() - t0) * 1e3);
    printf("%-12s %-12s %10s %10s %10s %12s %10s\n", "case", "kind", "ebnf B", "convert", "parse", "first mask", "total");
    uint32_t *mask = malloc((MODEL_ROWS + 31) / 32 * sizeof *mask);
    double sum = 0, worst = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(corpus, "cases"), i, c) {
        char err[512];
        double a = cv_now();
        char *ebnf = to_ebnf(c, err, sizeof err);
        double b = cv_now();
        cv_grammar *g = ebnf ? cv_grammar_parse(ebnf, strlen(ebnf), vocab, err, sizeof err) : NULL;
        double d = cv_now();
        if (!g) {
            printf("%s: %s\n", json_string_value(json_object_get(c, "name")), err);
            free(ebnf);
            continue;
        }
        cv_matcher *m = cv_matcher_new(g);
        cv_matcher_fill_mask(m, mask);
        double f = cv_now(), total = (f - a) * 1e3;
        printf("%-12s %-12s %10zu %8.2fms %8.2fms %10.2fms %8.2fms\n", json_string_value(json_object_get(c, "name")),
               json_string_value(json_object_get(c, "kind")), strlen(ebnf), (b - a) * 1e3, (d - b) * 1e3,
               (f - d) * 1e3, total);
        sum += total;
        if (total > worst) worst = total;
        cv_matcher_free(m);
        cv_grammar_free(g);
        free(ebnf);
    }
    printf("corpus: %zu constraints, %.2f ms in all, mean %.2f ms, worst %.2f ms\n", json_array_size(json_object_get(corpus, "cases")),
           sum, sum / (double)json_array_size(json_object_get(corpus, "cases")), worst);
    free(mask);
    cv_vocab_free(vocab);
    cv_tokenizer_free(tok);
    json_decref(corpus);
    return 0;
}
