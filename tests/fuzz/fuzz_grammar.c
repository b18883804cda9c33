/*
 * fuzz_grammar.c — libFuzzer target for the grammar engine's front ends: the first byte picks the
 * reader (mod 4: JSON schema, compact JSON schema, regex, GBNF; 0xFF: a structural tag), the rest is
 * its text. Whatever is accepted
 * becomes an automaton, and a matcher then takes the input's own bytes as a walk (rejected bytes are
 * skipped), rolling back at the end: no input may crash, hang, leak or make an accepted grammar
 * inconsistent (a rollback to the start must leave the start state's answer to can_end unchanged).
 * Seeds in tests/fuzz/corpus/fuzz_grammar.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample/grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char err[256];
    char *ebnf = NULL;
    cv_json_options jo = {.any_whitespace = true, .strict_additional_properties = true};
    const int reader = data[0] == 0xFF ? 4 : data[0] % 4;
    switch (reader) {
    case 0: ebnf = cv_json_schema_to_ebnf(text, len, &jo, err, sizeof err); break;
    case 1:
        jo.any_whitespace = false;
        ebnf = cv_json_schema_to_ebnf(text, len, &jo, err, sizeof err);
        break;
    case 2: ebnf = cv_regex_to_ebnf(text, len, err, sizeof err); break;
    case 4: ebnf = cv_structural_tag_to_ebnf(text, len, &jo, err, sizeof err); break;
    default: /* GBNF as given, NUL bytes included */
        ebnf = malloc(len + 1), memcpy(ebnf, text, len), ebnf[len] = '\0';
        break;
    }
    if (!ebnf) return 0;
    cv_grammar *g = cv_grammar_parse(ebnf, reader == 3 ? len : strlen(ebnf), NULL, err, sizeof err);
    free(ebnf);
    if (!g) return 0;
    cv_matcher *m = cv_matcher_new(g);
    bool start_can_end = cv_matcher_can_end(m);
    for (size_t i = 0; i < len && i < 256; i++) cv_matcher_accept_bytes(m, text + i, 1);
    cv_matcher_rollback(m, cv_matcher_history(m));
    if (cv_matcher_can_end(m) != start_can_end) abort();
    cv_matcher_free(m);
    cv_grammar_free(g);
    return 0;
}
