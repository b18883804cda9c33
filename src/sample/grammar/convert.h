/*
 * convert.h — what the three constraint converters (convert.c, regex.c, json_schema.c) share and
 * nothing else sees: a growing text, sets of code points, the writers of EBNF literals and classes,
 * the JSON building blocks (a string character in its canonical spelling, the rules for any JSON
 * value), and the regex parser that both cv_regex_to_ebnf and the JSON schema keywords `pattern` and
 * `format` go through.
 *
 * The converters emit EBNF text rather than building a grammar directly so that every constraint
 * takes one road into the engine (cv_grammar_parse), the one user grammars take too, and so that a
 * converted constraint can be read and tested on its own.
 */
#ifndef CV_SAMPLE_GRAMMAR_CONVERT_H
#define CV_SAMPLE_GRAMMAR_CONVERT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sample/grammar/grammar.h"

/* ---- growing text ----------------------------------------------------------------------------------- */

typedef struct cv_text {
    char *s;                  /* NUL-terminated once anything was written; NULL before */
    size_t len, cap;
} cv_text;

void cv_text_putn(cv_text *t, const char *s, size_t n);
void cv_text_put(cv_text *t, const char *s);
void cv_text_printf(cv_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text as a malloc'd string ("" when nothing was written); t is left empty. */
char *cv_text_take(cv_text *t);
void cv_text_free(cv_text *t);

/* ---- sets of code points -------------------------------------------------------------------------- */

#define CV_CP_MAX 0x10FFFFu

/* Sorted, disjoint, non-adjacent inclusive ranges. Surrogates (U+D800..U+DFFF) are never members:
 * they have no UTF-8 form, so no output can contain one. */
typedef struct cv_cpset {
    uint32_t (*r)[2];
    size_t n, cap;
} cv_cpset;

void cv_cpset_add(cv_cpset *s, uint32_t lo, uint32_t hi);
void cv_cpset_add_set(cv_cpset *s, const cv_cpset *o);
void cv_cpset_invert(cv_cpset *s);                        /* complement within U+0000..U+10FFFF */
void cv_cpset_intersect(cv_cpset *s, const cv_cpset *o);
void cv_cpset_copy(cv_cpset *dst, const cv_cpset *src);
bool cv_cpset_has(const cv_cpset *s, uint32_t cp);
void cv_cpset_free(cv_cpset *s);

/* The largest repetition bound cv_grammar_parse takes ({n,m} with m above it is refused). */
#define CV_EBNF_MAX_REPEAT 10000

/* ---- EBNF writing ------------------------------------------------------------------------------------ */

/* A quoted literal of the code points of UTF-8 text s[0..n) (which must be valid UTF-8): printable
 * ASCII as is, everything else escaped, so the grammar text is plain ASCII. n = 0 writes "". */
void cv_ebnf_literal(cv_text *t, const char *s, size_t n);
/* A class matching one code point of s (not empty); a single code point is written as a literal. */
void cv_ebnf_class(cv_text *t, const cv_cpset *s);

/* ---- JSON ------------------------------------------------------------------------------------------------ */

/* Appends the content of a JSON string for UTF-8 text s[0..n) in the canonical spelling: raw except
 * " and \ and the control characters, which take \" \\ \b \f \n \r \t or \u00xx. */
void cv_json_escape(cv_text *t, const char *s, size_t n);
/* An EBNF expression for one character of s (not empty) inside a JSON string, in the canonical
 * spelling: a character can be written only one way, which keeps grammars built from it
 * unambiguous and lets a set of keys be excluded exactly. */
void cv_ebnf_json_char(cv_text *t, const cv_cpset *s);

/* The shared rules for JSON values. A converter references them by name and then asks for their
 * definitions (and those they depend on) once, at the end. */
enum {
    CV_JR_WS = 1u << 0,       /* ws: the whitespace between tokens */
    CV_JR_VALUE = 1u << 1,    /* value: any JSON value */
    CV_JR_OBJECT = 1u << 2,   /* object: any JSON object */
    CV_JR_ARRAY = 1u << 3,    /* array: any JSON array */
    CV_JR_STRING = 1u << 4,   /* string: any JSON string */
    CV_JR_CHAR = 1u << 5,     /* char: one character inside a JSON string, any spelling */
    CV_JR_NUMBER = 1u << 6,   /* number: any JSON number */
    CV_JR_INTEGER = 1u << 7,  /* integer: a JSON number without fraction or exponent */
    CV_JR_BOOLEAN = 1u << 8,  /* boolean */
    CV_JR_NULL = 1u << 9,     /* null */
};

/* Writes the definitions of the rules in `need` and their dependencies. ws_body is the body of ws
 * (an EBNF expression), NULL when there is no whitespace between tokens (ws is then never named). */
void cv_json_rules(cv_text *t, unsigned need, const char *ws_body);
/* The separators between JSON tokens: `ws "," ws` or `","` (and the same for ":"). */
const char *cv_json_comma(bool ws);
const char *cv_json_colon(bool ws);
/* The whitespace between tokens for the options: *body is NULL when there is none, the default
 * (space, tab and newline, at most CV_JSON_WS_MAX of them between two tokens, so that a model
 * cannot loop on whitespace for ever; JSON itself puts no bound on it), or the whitespace_pattern
 * written as EBNF into buf. False with a one-line err when the pattern is not a regex or could
 * match anything but JSON whitespace (the output would not be JSON). */
#define CV_JSON_WS_MAX 20
bool cv_json_ws_rule(const cv_json_options *o, cv_text *buf, const char **body, char *err, size_t err_len);

/* Compact JSON text of a value (numbers in their shortest round-trip form), as const and enum need. */
struct json_t;
void cv_json_compact(cv_text *t, const struct json_t *v);
/* The shortest %g form of d that reads back as d. */
void cv_double_shortest(double d, char out[32]);

/* ---- regular expressions ---------------------------------------------------------------------------- */

typedef enum cv_re_dialect {
    CV_RE_PYTHON,             /* Python's re: \d \w \s over Unicode, `.` excludes only \n, {,n} */
    CV_RE_ECMA,               /* JSON Schema's `pattern` (ECMA-262 without the u flag): ASCII \d \w,
                               * `.` excludes \n \r U+2028 U+2029, classes match BMP characters */
} cv_re_dialect;

typedef struct cv_regex cv_regex;

/* Parses a regex for a whole-string match. NULL with a one-line error naming the offset when the
 * syntax is unsupported (lookarounds, backreferences, inline flags, anchors inside) or when the
 * regex can match nothing. */
cv_regex *cv_regex_parse(const char *src, size_t len, cv_re_dialect d, char *err, size_t err_len);
void cv_regex_free(cv_regex *re);
/* Narrows the regex to matches of min..max code points where that is exact and cheap: when the
 * bounds already hold, or when every branch is fixed-width but for one repeated part (whose count
 * is also capped at CV_EBNF_MAX_REPEAT, which keeps a subset). Returns false when it cannot, or
 * when no match would be left (*empty set); the regex is then only good for cv_regex_free. */
bool cv_regex_limit_length(cv_regex *re, uint64_t min, uint64_t max, bool *empty);
/* Whether every character the regex can match is in s. */
bool cv_regex_within(const cv_regex *re, const cv_cpset *s);
/* Writes the regex as one EBNF expression (nothing for a regex that matches only ""). json: each
 * character in its canonical spelling inside a JSON string. */
void cv_regex_emit(const cv_regex *re, bool json, cv_text *out);

#endif
