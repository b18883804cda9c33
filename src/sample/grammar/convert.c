/*
 * convert.c — the choice and json_object converters, and the EBNF-writing pieces that all the
 * converters share (see convert.h for why they write text).
 *
 * Escaping is total: the EBNF written here is plain ASCII whatever the input, every code point
 * outside printable ASCII is spelled as an escape, so a grammar can be logged, compared and pasted
 * into a request unchanged. JSON strings inside grammars are written in one canonical spelling per
 * character (what JSON.stringify writes): a set of strings is then a set of byte strings, which is
 * what lets the schema converter exclude declared property names from additional ones exactly.
 */
#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "sample/grammar/convert.h"
#include "sample/grammar/grammar.h"

/* ---- growing text ----------------------------------------------------------------------------------- */

void cv_text_putn(cv_text *t, const char *s, size_t n) { cv_buf_append(&t->s, &t->len, &t->cap, s, n); }

void cv_text_put(cv_text *t, const char *s) { cv_text_putn(t, s, strlen(s)); }

void cv_text_printf(cv_text *t, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    assert(n >= 0);
    if ((size_t)n < sizeof small) {
        cv_text_putn(t, small, (size_t)n);
        return;
    }
    char *big = cv_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    cv_text_putn(t, big, (size_t)n);
    free(big);
}

char *cv_text_take(cv_text *t) {
    char *s = t->s ? t->s : cv_xstrdup("");
    *t = (cv_text){0};
    return s;
}

void cv_text_free(cv_text *t) {
    free(t->s);
    *t = (cv_text){0};
}

/* ---- sets of code points -------------------------------------------------------------------------- */

static void cpset_push(cv_cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->r = cv_xrealloc(s->r, s->cap * sizeof *s->r);
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
}

/* Adds [lo, hi] keeping the ranges sorted and merged. Sets stay small (tens of ranges), so a linear
 * rebuild is cheaper to get right than anything clever. */
static void cpset_add_raw(cv_cpset *s, uint32_t lo, uint32_t hi) {
    cv_cpset out = {0};
    size_t i = 0;
    while (i < s->n && s->r[i][1] + 1 < lo) {
        cpset_push(&out, s->r[i][0], s->r[i][1]);
        i++;
    }
    while (i < s->n && s->r[i][0] <= hi + 1) {
        if (s->r[i][0] < lo) lo = s->r[i][0];
        if (s->r[i][1] > hi) hi = s->r[i][1];
        i++;
    }
    cpset_push(&out, lo, hi);
    for (; i < s->n; i++) cpset_push(&out, s->r[i][0], s->r[i][1]);
    free(s->r);
    *s = out;
}

void cv_cpset_add(cv_cpset *s, uint32_t lo, uint32_t hi) {
    assert(lo <= hi && hi <= CV_CP_MAX);
    /* split around the surrogates */
    if (lo < 0xD800) cpset_add_raw(s, lo, hi < 0xD800 ? hi : 0xD7FF);
    if (hi > 0xDFFF) cpset_add_raw(s, lo > 0xDFFF ? lo : 0xE000, hi);
}

void cv_cpset_add_set(cv_cpset *s, const cv_cpset *o) {
    for (size_t i = 0; i < o->n; i++) cpset_add_raw(s, o->r[i][0], o->r[i][1]);
}

void cv_cpset_invert(cv_cpset *s) {
    cv_cpset out = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next) cv_cpset_add(&out, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= CV_CP_MAX) cv_cpset_add(&out, next, CV_CP_MAX);
    free(s->r);
    *s = out;
}

void cv_cpset_intersect(cv_cpset *s, const cv_cpset *o) {
    cv_cpset out = {0};
    for (size_t i = 0; i < s->n; i++)
        for (size_t j = 0; j < o->n; j++) {
            uint32_t lo = s->r[i][0] > o->r[j][0] ? s->r[i][0] : o->r[j][0];
            uint32_t hi = s->r[i][1] < o->r[j][1] ? s->r[i][1] : o->r[j][1];
            if (lo <= hi) cpset_add_raw(&out, lo, hi);
        }
    free(s->r);
    *s = out;
}

void cv_cpset_copy(cv_cpset *dst, const cv_cpset *src) {
    cv_cpset_free(dst);
    for (size_t i = 0; i < src->n; i++) cpset_push(dst, src->r[i][0], src->r[i][1]);
}

bool cv_cpset_has(const cv_cpset *s, uint32_t cp) {
    for (size_t i = 0; i < s->n; i++)
        if (cp >= s->r[i][0] && cp <= s->r[i][1]) return true;
    return false;
}

void cv_cpset_free(cv_cpset *s) {
    free(s->r);
    *s = (cv_cpset){0};
}

/* ---- EBNF writing ------------------------------------------------------------------------------------ */

static void put_escape(cv_text *t, uint32_t cp) {
    if (cp < 0x80)
        cv_text_printf(t, "\\x%02X", cp);
    else if (cp <= 0xFFFF)
        cv_text_printf(t, "\\u%04X", cp);
    else
        cv_text_printf(t, "\\U%08X", cp);
}

static void put_literal_cp(cv_text *t, uint32_t cp) {
    char c = (char)cp;
    if (cp == '"' || cp == '\\') {
        char e[2] = {'\\', c};
        cv_text_putn(t, e, 2);
    } else if (cp == '\n') {
        cv_text_put(t, "\\n");
    } else if (cp == '\t') {
        cv_text_put(t, "\\t");
    } else if (cp == '\r') {
        cv_text_put(t, "\\r");
    } else if (cp >= 0x20 && cp < 0x7F) {
        cv_text_putn(t, &c, 1);
    } else {
        put_escape(t, cp);
    }
}

void cv_ebnf_literal(cv_text *t, const char *s, size_t n) {
    cv_text_put(t, "\"");
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k;
        cv_utf8_status st = cv_utf8_decode(s + i, n - i, &cp, &k);
        assert(st == CV_UTF8_OK);
        (void)st;
        put_literal_cp(t, cp);
        i += k;
    }
    cv_text_put(t, "\"");
}

/* Inside a class only letters and digits go raw: every other character is escaped, so ] \ ^ - and
 * friends can never be misread. */
static void put_class_cp(cv_text *t, uint32_t cp) {
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) {
        char c = (char)cp;
        cv_text_putn(t, &c, 1);
    } else {
        put_escape(t, cp);
    }
}

void cv_ebnf_class(cv_text *t, const cv_cpset *s) {
    assert(s->n > 0);
    if (s->n == 1 && s->r[0][0] == s->r[0][1]) {
        cv_text_put(t, "\"");
        put_literal_cp(t, s->r[0][0]);
        cv_text_put(t, "\"");
        return;
    }
    cv_text_put(t, "[");
    for (size_t i = 0; i < s->n; i++) {
        put_class_cp(t, s->r[i][0]);
        if (s->r[i][1] != s->r[i][0]) {
            if (s->r[i][1] > s->r[i][0] + 1) cv_text_put(t, "-");
            put_class_cp(t, s->r[i][1]);
        }
    }
    cv_text_put(t, "]");
}

/* ---- JSON ------------------------------------------------------------------------------------------------ */

/* The short escape of a character that JSON does not allow raw in a string, or 0. */
static char short_escape(uint32_t cp) {
    switch (cp) {
    case '"': return '"';
    case '\\': return '\\';
    case '\b': return 'b';
    case '\f': return 'f';
    case '\n': return 'n';
    case '\r': return 'r';
    case '\t': return 't';
    default: return 0;
    }
}

void cv_json_escape(cv_text *t, const char *s, size_t n) {
    size_t run = 0; /* s[run..i) goes out raw */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        cv_text_putn(t, s + run, i - run);
        char e = short_escape(c);
        if (e) {
            char esc[2] = {'\\', e};
            cv_text_putn(t, esc, 2);
        } else {
            cv_text_printf(t, "\\u%04x", c);
        }
        run = i + 1;
    }
    cv_text_putn(t, s + run, n - run);
}

void cv_ebnf_json_char(cv_text *t, const cv_cpset *s) {
    assert(s->n > 0);
    cv_cpset plain = {0};
    cv_cpset_add(&plain, 0x20, 0x21);
    cv_cpset_add(&plain, 0x23, 0x5B);
    cv_cpset_add(&plain, 0x5D, CV_CP_MAX);
    cv_cpset_intersect(&plain, s);

    /* The alternatives: the raw class, each short escape, and the \u00xx ones grouped by their
     * fifth character. */
    cv_text alts = {0};
    int n_alts = 0;
    if (plain.n) {
        cv_ebnf_class(&alts, &plain);
        n_alts++;
    }
    cv_cpset_free(&plain);
    static const uint32_t shorts[] = {'"', '\\', '\b', '\f', '\n', '\r', '\t'};
    for (size_t i = 0; i < CV_ARRAY_LEN(shorts); i++) {
        if (!cv_cpset_has(s, shorts[i])) continue;
        char lit[3] = {'\\', short_escape(shorts[i]), 0};
        if (n_alts++) cv_text_put(&alts, " | ");
        cv_ebnf_literal(&alts, lit, 2);
    }
    for (uint32_t hi = 0; hi < 2; hi++) {
        cv_cpset low = {0};
        for (uint32_t lo = 0; lo < 16; lo++) {
            uint32_t cp = hi * 16 + lo;
            if (!short_escape(cp) && cv_cpset_has(s, cp)) {
                uint32_t digit = lo < 10 ? '0' + lo : 'a' + lo - 10;
                cv_cpset_add(&low, digit, digit);
            }
        }
        if (low.n) {
            if (n_alts++) cv_text_put(&alts, " | ");
            cv_text_printf(&alts, "\"\\\\u00%u\" ", hi);
            cv_ebnf_class(&alts, &low);
        }
        cv_cpset_free(&low);
    }
    if (n_alts > 1) {
        cv_text_put(t, "(");
        cv_text_putn(t, alts.s, alts.len);
        cv_text_put(t, ")");
    } else {
        cv_text_putn(t, alts.s, alts.len);
    }
    cv_text_free(&alts);
}

const char *cv_json_comma(bool ws) { return ws ? "ws \",\" ws" : "\",\""; }
const char *cv_json_colon(bool ws) { return ws ? "ws \":\" ws" : "\":\""; }

#define CV_STR2(x) #x
#define CV_STR(x) CV_STR2(x)

bool cv_json_ws_rule(const cv_json_options *o, cv_text *buf, const char **body, char *err, size_t err_len) {
    *body = NULL;
    if (!o->whitespace_pattern) {
        if (o->any_whitespace) *body = "[ \\t\\n]{0," CV_STR(CV_JSON_WS_MAX) "}";
        return true;
    }
    char rerr[200];
    const char *pat = o->whitespace_pattern;
    cv_regex *re = cv_regex_parse(pat, strlen(pat), CV_RE_PYTHON, rerr, sizeof rerr);
    if (!re) {
        if (err_len) snprintf(err, err_len, "invalid whitespace pattern: %s", rerr);
        return false;
    }
    cv_cpset json_ws = {0};
    cv_cpset_add(&json_ws, '\t', '\n');
    cv_cpset_add(&json_ws, '\r', '\r');
    cv_cpset_add(&json_ws, ' ', ' ');
    bool ok = cv_regex_within(re, &json_ws);
    cv_cpset_free(&json_ws);
    if (ok) {
        cv_regex_emit(re, false, buf);
        *body = buf->s ? buf->s : "";
    } else if (err_len) {
        snprintf(err, err_len, "whitespace pattern may match characters other than JSON whitespace (space, tab, "
                               "CR, LF)");
    }
    cv_regex_free(re);
    return ok;
}

void cv_json_rules(cv_text *t, unsigned need, const char *ws_body) {
    /* close over the dependencies */
    if (need & CV_JR_VALUE) need |= CV_JR_OBJECT | CV_JR_ARRAY | CV_JR_STRING | CV_JR_NUMBER;
    if (need & CV_JR_OBJECT) need |= CV_JR_STRING | CV_JR_VALUE | CV_JR_ARRAY | CV_JR_NUMBER;
    if (need & CV_JR_ARRAY) need |= CV_JR_VALUE | CV_JR_OBJECT | CV_JR_STRING | CV_JR_NUMBER;
    if (need & CV_JR_STRING) need |= CV_JR_CHAR;
    bool ws = ws_body != NULL;
    if ((need & (CV_JR_OBJECT | CV_JR_ARRAY)) && ws) need |= CV_JR_WS;
    const char *w = ws ? " ws" : "";
    const char *comma = cv_json_comma(ws), *colon = cv_json_colon(ws);

    if (need & CV_JR_WS) {
        assert(ws);
        cv_text_printf(t, "ws ::= %s\n", ws_body);
    }
    if (need & CV_JR_VALUE)
        cv_text_put(t, "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n");
    if (need & CV_JR_OBJECT)
        cv_text_printf(t,
                       "object ::= \"{\"%s \"}\" | \"{\"%s string %s value (%s string %s value)*%s \"}\"\n",
                       w, w, colon, comma, colon, w);
    if (need & CV_JR_ARRAY)
        cv_text_printf(t, "array ::= \"[\"%s \"]\" | \"[\"%s value (%s value)*%s \"]\"\n", w, w, comma, w);
    if (need & CV_JR_STRING) cv_text_put(t, "string ::= \"\\\"\" char* \"\\\"\"\n");
    if (need & CV_JR_CHAR) {
        /* Every escape JSON has; \u escapes name scalar values only: a surrogate escape must come as
         * a high-low pair, which counts as one character (as validators count a string's length). */
        cv_text_put(t, "char ::= [\\x20\\x21\\x23-\\x5B\\x5D-\\uD7FF\\uE000-\\U0010FFFF] | \"\\\\\" "
                       "([\\x22\\x5C\\x2Fbfnrt] | \"u\" [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | "
                       "\"u\" [dD] [0-7] [0-9a-fA-F]{2} | "
                       "\"u\" [dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2})\n");
    }
    if (need & CV_JR_NUMBER)
        cv_text_put(t, "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [\\x2B\\x2D]? [0-9]+)?\n");
    if (need & CV_JR_INTEGER) cv_text_put(t, "integer ::= \"-\"? (\"0\" | [1-9] [0-9]*)\n");
    if (need & CV_JR_BOOLEAN) cv_text_put(t, "boolean ::= \"true\" | \"false\"\n");
    if (need & CV_JR_NULL) cv_text_put(t, "null ::= \"null\"\n");
}

void cv_double_shortest(double d, char out[32]) {
    for (int p = 1; p <= 17; p++) {
        snprintf(out, 32, "%.*g", p, d);
        if (strtod(out, NULL) == d) return;
    }
}

void cv_json_compact(cv_text *t, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        cv_text_put(t, "{");
        const char *k;
        json_t *x;
        bool first = true;
        /* jansson's iteration order is insertion order: the schema's own order */
        json_object_foreach((json_t *)v, k, x) {
            if (!first) cv_text_put(t, ",");
            first = false;
            cv_text_put(t, "\"");
            cv_json_escape(t, k, strlen(k));
            cv_text_put(t, "\":");
            cv_json_compact(t, x);
        }
        cv_text_put(t, "}");
        break;
    }
    case JSON_ARRAY:
        cv_text_put(t, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) cv_text_put(t, ",");
            cv_json_compact(t, json_array_get(v, i));
        }
        cv_text_put(t, "]");
        break;
    case JSON_STRING:
        cv_text_put(t, "\"");
        cv_json_escape(t, json_string_value(v), json_string_length(v));
        cv_text_put(t, "\"");
        break;
    case JSON_INTEGER: cv_text_printf(t, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: {
        char s[32];
        cv_double_shortest(json_real_value(v), s);
        cv_text_put(t, s);
        break;
    }
    case JSON_TRUE: cv_text_put(t, "true"); break;
    case JSON_FALSE: cv_text_put(t, "false"); break;
    case JSON_NULL: cv_text_put(t, "null"); break;
    }
}

/* ---- choice and json_object ---------------------------------------------------------------------- */

char *cv_choice_to_ebnf(const char *const *choices, size_t n) {
    /* Each string once: a repeated choice would only make the grammar ambiguous. An empty list has
     * no grammar (the caller refuses it) and neither has text that is not UTF-8 (no grammar made of
     * code points can produce it). */
    if (n == 0) return NULL;
    for (size_t i = 0; i < n; i++)
        if (!cv_utf8_validate(choices[i], strlen(choices[i]), NULL)) return NULL;
    cv_text t = {0};
    cv_text_put(&t, "root ::=");
    size_t written = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++) seen = strcmp(choices[i], choices[j]) == 0;
        if (seen) continue;
        if (written++) cv_text_put(&t, " |");
        /* the empty string is the empty alternative */
        if (choices[i][0]) {
            cv_text_put(&t, " ");
            cv_ebnf_literal(&t, choices[i], strlen(choices[i]));
        }
    }
    cv_text_put(&t, "\n");
    return cv_text_take(&t);
}

char *cv_json_object_ebnf(const cv_json_options *o) {
    /* an unusable whitespace pattern makes no grammar: cv_json_schema_to_ebnf reports why */
    cv_json_options def = {.any_whitespace = true};
    if (!o) o = &def;
    cv_text ws = {0};
    const char *ws_body;
    if (!cv_json_ws_rule(o, &ws, &ws_body, NULL, 0)) return NULL;
    cv_text t = {0};
    cv_text_put(&t, "root ::= object | array\n");
    cv_json_rules(&t, CV_JR_OBJECT | CV_JR_ARRAY, ws_body);
    cv_text_free(&ws);
    return cv_text_take(&t);
}
