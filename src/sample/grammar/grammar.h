/*
 * grammar.h — the grammar engine behind structured outputs: constraints become EBNF text, EBNF
 * becomes a byte-level pushdown automaton, and a matcher walks it per sequence, answering "which
 * tokens may come next" as a bitmask over the vocabulary.
 *
 * Everything is bytes. Character classes over code points are compiled to UTF-8 byte sequences when
 * the grammar is built, so a token's bytes (the tokenizer's id → bytes table) feed the automaton
 * directly, and a token that ends inside a multi-byte character is judged like any other prefix.
 *
 * Three layers, each usable alone (the tests use each):
 *   - converters (json_schema.c, regex.c, choice in convert.c): a constraint → EBNF text;
 *   - cv_grammar (ebnf.c + the automaton): EBNF text → an immutable grammar, bound to a vocabulary;
 *   - cv_matcher (matcher.c, mask.c): one sequence's position in the grammar, advanced by accepted
 *     tokens; its token mask is computed by walking a trie of the vocabulary's byte strings and is
 *     cached in the grammar per automaton state.
 *
 * EBNF syntax (GBNF, the one llama.cpp and xgrammar read):
 *   rule ::= alternative ( "|" alternative )*        # comment to end of line
 *   elements: "literal" (escapes \n \r \t \\ \" \' \[ \] \xHH \uHHHH \UHHHHHHHH), [a-z_] [^"\\] (the
 *   same escapes, ranges of code points), . (any code point), rule-name, ( group ), and the postfix
 *   operators * + ? {m} {m,} {m,n}. Rule names are [A-Za-z0-9_-]+; the start rule is "root".
 *   Empty alternatives are allowed ("a ::= "b" | " matches "b" or nothing).
 *
 * Threads: a cv_grammar is immutable apart from its mask cache, which has its own lock, so matchers
 * of one grammar may run on different threads; one matcher belongs to one thread at a time.
 */
#ifndef CV_SAMPLE_GRAMMAR_H
#define CV_SAMPLE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* ---- vocabulary ---------------------------------------------------------------------------------- */

/* The byte strings of a model's tokens, as a trie, plus its end-of-sequence ids. Ids past the
 * tokenizer's vocabulary (the model's padded rows) and special tokens are never allowed by a grammar,
 * except the eos ids, which are allowed exactly when the matcher is in an accepting state. Added tokens
 * that are not special (Qwen3's <think>, <tool_call>) are text like any other: their bytes decide. */
typedef struct cv_vocab cv_vocab;

cv_vocab *cv_vocab_new(const cv_tokenizer *tok, int32_t vocab_size, const int32_t *eos, size_t n_eos);
void cv_vocab_free(cv_vocab *v);
int32_t cv_vocab_size(const cv_vocab *v);

/* ---- grammars ------------------------------------------------------------------------------------ */

typedef struct cv_grammar cv_grammar;

/* Parses EBNF text (syntax above) into a grammar whose start rule is `root`, bound to `vocab` for the
 * token functions (NULL: bytes only, for tests of the automaton). On failure returns NULL and writes
 * one line to err, naming the place: "line 3 col 7: undefined rule 'valu'". A grammar past the
 * engine's limits (too many rules or elements, a repetition count too large, nesting too deep) is
 * refused the same way, never built slowly. */
cv_grammar *cv_grammar_parse(const char *text, size_t len, const cv_vocab *vocab, char *err, size_t err_len);
void cv_grammar_free(cv_grammar *g);

/* ---- matchers ------------------------------------------------------------------------------------ */

typedef struct cv_matcher cv_matcher;

cv_matcher *cv_matcher_new(const cv_grammar *g);
void cv_matcher_free(cv_matcher *m);

/* Advances by one token (its bytes; an eos id ends the sentence). Returns false, changing nothing,
 * when the grammar does not allow it here. */
bool cv_matcher_accept_token(cv_matcher *m, int32_t token);
/* Advances by raw bytes, all or nothing (tests and converters' self-checks). */
bool cv_matcher_accept_bytes(cv_matcher *m, const void *bytes, size_t n);
/* Undoes the last n accepted tokens or byte strings (n <= cv_matcher_history(m)). */
void cv_matcher_rollback(cv_matcher *m, size_t n);
size_t cv_matcher_history(const cv_matcher *m);
/* The input so far is a complete sentence of the grammar. */
bool cv_matcher_can_end(const cv_matcher *m);
/* Nothing may follow: the sentence is complete and no byte extends it, or eos was accepted. */
bool cv_matcher_terminated(const cv_matcher *m);

/* Bit t of mask (word t / 32, bit t % 32) is set when token t may come next; words for the whole
 * vocabulary, (cv_vocab_size + 31) / 32 of them. Eos ids are set exactly when cv_matcher_can_end. */
void cv_matcher_fill_mask(cv_matcher *m, uint32_t *mask);

/* ---- converters: constraint → EBNF text (malloc'd, start rule "root"), or NULL with err set ---------- */

typedef struct cv_json_options {
    bool any_whitespace;          /* whitespace allowed between JSON tokens (vLLM's default); false:
                                   * compact separators "," and ":" with no whitespace at all */
    const char *whitespace_pattern; /* a regex for the whitespace between tokens; NULL = default */
    bool strict_additional_properties; /* an object schema without additionalProperties admits no
                                        * other properties (vLLM's disable_additional_properties) */
} cv_json_options;

/* A JSON schema (JSON text) → EBNF. Supported: type (and type lists), properties / required /
 * additionalProperties, items / prefixItems / minItems / maxItems, enum, const, string minLength /
 * maxLength / pattern / format, number and integer bounds, anyOf / oneOf / allOf of one, $ref to
 * #/$defs and #/definitions (recursion included). Unsupported keywords that would change what is
 * valid are an error naming the keyword and its JSON pointer, never silently ignored. */
char *cv_json_schema_to_ebnf(const char *schema, size_t len, const cv_json_options *o, char *err, size_t err_len);
/* vLLM's json_object: any JSON object or array. */
char *cv_json_object_ebnf(const cv_json_options *o);
/* A regular expression (Python re syntax, the subset that regular languages need) → EBNF for a
 * whole-output match. Lookarounds and backreferences are an error naming the offset. */
char *cv_regex_to_ebnf(const char *regex, size_t len, char *err, size_t err_len);
/* The output is exactly one of the strings. */
char *cv_choice_to_ebnf(const char *const *choices, size_t n);
/* A structural tag (JSON text: xgrammar's "format" spelling, or vLLM's legacy structures and
 * triggers) → EBNF; JSON schema contents take the options o. An unsupported format type, a tag
 * whose begin starts with no trigger, and the like are an error saying which. */
char *cv_structural_tag_to_ebnf(const char *spec, size_t len, const cv_json_options *o, char *err, size_t err_len);

#endif
