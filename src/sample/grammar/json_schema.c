/*
 * json_schema.c — JSON Schema → EBNF, behaving as vLLM's xgrammar backend does where that is
 * exact, and refusing what it cannot express rather than letting invalid output through.
 *
 * Every schema node becomes one rule (identical bodies share one), whose body is the alternatives
 * the node allows. The grammar is kept unambiguous where the schema allows it, because the matcher
 * pays per live parse: properties come in schema order, each optional one either present or
 * skipped, and the separators are arranged so that there is one way to parse every object (see
 * gen_object); additional property names exclude the declared ones, spelled canonically, so a
 * declared property can never reappear as an additional one with another value.
 *
 * Applicators: allOf, and keywords beside $ref / anyOf / oneOf, are merged keyword by keyword into
 * one schema where that is exact (keywords that do not interact, type sets intersected, required
 * lists joined, bounds tightened, properties merged per name); otherwise the schema is refused with
 * the keyword named. oneOf is treated as anyOf (as xgrammar does). $ref reaches "#", "#/$defs/..",
 * "#/definitions/.." and any other JSON pointer into the document; a referenced schema is one rule,
 * so recursion costs nothing, and a reference that loops back before any input is consumed (left
 * recursion, e.g. {"$ref":"#"}) is an error.
 *
 * Numbers with bounds are exact decimal ranges without an exponent; an exclusive bound on a
 * non-integer is tightened by a small step (see dec_beyond) so that the double a validator reads
 * still satisfies it. Formats are regular approximations that each validator (ajv's "full"
 * formats) accepts; pattern is matched against the whole string (a subset of the "contains"
 * semantics JSON Schema gives it).
 */
#include <assert.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "sample/grammar/convert.h"
#include "sample/grammar/grammar.h"

#define MAX_DEPTH 64
#define MAX_EBNF (4u << 20)
#define MAX_WORK 100000     /* schema nodes converted, counting each inlined copy */

/* ---- keywords ---------------------------------------------------------------------------------------- */

/* Keywords that decide validity and are implemented (some only in their common forms, checked
 * where they are used). Keywords in neither list are annotations or unknown, and JSON Schema
 * ignores both. */
static const char *const kw_supported[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "unevaluatedProperties",
    "items", "prefixItems", "additionalItems", "unevaluatedItems", "minItems", "maxItems", "uniqueItems",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minProperties", "maxProperties", "anyOf", "oneOf", "allOf", "$ref", NULL,
};
static const char *const kw_unsupported[] = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "patternProperties",
    "propertyNames", "contains", "minContains", "maxContains", "multipleOf", "$dynamicRef", "$recursiveRef", NULL,
};

/* Whether k is in a NULL-terminated list. */
static bool in_list(const char *k, const char *const *list) {
    for (; *list; list++)
        if (strcmp(k, *list) == 0) return true;
    return false;
}

static bool is_assertion(const char *k) { return in_list(k, kw_supported); }

/* ---- a string map (rule bodies → names) ------------------------------------------------------------- */

typedef struct smap {
    char **key, **val;
    size_t cap, n;
} smap;

static size_t smap_slot(const smap *m, const char *k) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = k; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    size_t i = (size_t)h & (m->cap - 1);
    while (m->key[i] && strcmp(m->key[i], k) != 0) i = (i + 1) & (m->cap - 1);
    return i;
}

static const char *smap_get(const smap *m, const char *k) {
    if (!m->cap) return NULL;
    size_t i = smap_slot(m, k);
    return m->key[i] ? m->val[i] : NULL;
}

static void smap_put(smap *m, char *k, char *v) {
    if (2 * (m->n + 1) > m->cap) {
        smap old = *m;
        m->cap = old.cap ? 2 * old.cap : 64;
        m->key = cv_xcalloc(m->cap, sizeof *m->key);
        m->val = cv_xcalloc(m->cap, sizeof *m->val);
        for (size_t i = 0; i < old.cap; i++)
            if (old.key[i]) {
                size_t j = smap_slot(m, old.key[i]);
                m->key[j] = old.key[i];
                m->val[j] = old.val[i];
            }
        free(old.key);
        free(old.val);
    }
    size_t i = smap_slot(m, k);
    assert(!m->key[i]);
    m->key[i] = k;
    m->val[i] = v;
    m->n++;
}

static void smap_free(smap *m) {
    for (size_t i = 0; i < m->cap; i++) {
        free(m->key[i]);
        free(m->val[i]);
    }
    free(m->key);
    free(m->val);
}

/* ---- the converter's state --------------------------------------------------------------------------- */

typedef struct ref_entry {
    char *ptr;                /* the JSON pointer it resolves to */
    char *name;               /* its rule */
    bool open;                /* being converted now */
    size_t open_at;           /* its place among the open ones */
} ref_entry;

typedef struct conv {
    json_t *root;
    bool ws, strict;
    cv_text rules;            /* finished rules */
    cv_text ptr;              /* the JSON pointer of the schema being converted, for errors */
    unsigned basic;           /* shared rules referenced (CV_JR_*) */
    unsigned n_names;
    int depth;
    unsigned work;
    ref_entry *refs;
    size_t n_refs, cap_refs;
    size_t n_open;            /* refs being converted */
    size_t guard;             /* open refs below this index are behind a consumed '{' or '[' */
    smap bodies;              /* rule body → rule name */
    json_t *keep;             /* the schemas merging made, alive until the end */
    char *err;
    size_t err_len;
    bool failed;
} conv;

static void *fail(conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void *fail(conv *c, const char *fmt, ...) {
    if (c->failed) return NULL;
    c->failed = true;
    if (!c->err_len) return NULL;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *where = c->ptr.len ? c->ptr.s : "/";
    snprintf(c->err, c->err_len, "%s at %.200s", msg, where);
    /* one line, whatever the property names hold */
    for (char *p = c->err; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
    return NULL;
}

static size_t ptr_push(conv *c, const char *token) {
    size_t saved = c->ptr.len;
    cv_text_put(&c->ptr, "/");
    for (const char *p = token; *p; p++) {
        if (*p == '~')
            cv_text_put(&c->ptr, "~0");
        else if (*p == '/')
            cv_text_put(&c->ptr, "~1");
        else
            cv_text_putn(&c->ptr, p, 1);
    }
    return saved;
}

static size_t ptr_push_index(conv *c, size_t i) {
    size_t saved = c->ptr.len;
    cv_text_printf(&c->ptr, "/%zu", i);
    return saved;
}

static void ptr_pop(conv *c, size_t saved) {
    c->ptr.len = saved;
    if (c->ptr.s) c->ptr.s[saved] = 0;
}

/* A fresh rule name from a hint (the last pointer token): readable, and never one of the shared
 * names or "root", which carry no "-N". */
static char *new_name(conv *c) {
    const char *tok = c->ptr.s ? strrchr(c->ptr.s, '/') : NULL;
    tok = tok ? tok + 1 : "";
    char hint[25];
    size_t n = 0;
    for (; tok[n] && n < sizeof hint - 1; n++) {
        char ch = tok[n];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
        hint[n] = ok ? ch : '_';
    }
    hint[n] = 0;
    return cv_xasprintf("%s-%u", n ? hint : "s", ++c->n_names);
}

static bool add_rule(conv *c, const char *name, const char *body) {
    cv_text_put(&c->rules, name);
    cv_text_put(&c->rules, " ::= ");
    cv_text_put(&c->rules, body);
    cv_text_put(&c->rules, "\n");
    if (c->rules.len > MAX_EBNF) return fail(c, "schema too large (its grammar passes %u bytes)", MAX_EBNF), false;
    return true;
}

static bool is_identifier(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return false;
    return true;
}

/* The rule for a body: an existing one with the same body, the rule a lone reference names, or a
 * new rule. */
static const char *intern(conv *c, const char *body) {
    const char *have = smap_get(&c->bodies, body);
    if (have) return have;
    if (is_identifier(body)) {
        smap_put(&c->bodies, cv_xstrdup(body), cv_xstrdup(body));
        return smap_get(&c->bodies, body);
    }
    char *name = new_name(c);
    if (!add_rule(c, name, body)) {
        free(name);
        return NULL;
    }
    smap_put(&c->bodies, cv_xstrdup(body), name);
    return name;
}

static const char *basic(conv *c, unsigned bit, const char *name) {
    c->basic |= bit;
    return name;
}

static const char *ws_tok(conv *c) {
    if (!c->ws) return "";
    c->basic |= CV_JR_WS;
    return " ws";
}

static const char *comma(conv *c) {
    if (c->ws) c->basic |= CV_JR_WS;
    return cv_json_comma(c->ws);
}

static const char *colon(conv *c) {
    if (c->ws) c->basic |= CV_JR_WS;
    return cv_json_colon(c->ws);
}

/* ---- numbers in schemas ----------------------------------------------------------------------------------- */

static bool get_count(conv *c, json_t *s, const char *key, uint64_t *out) {
    json_t *v = json_object_get(s, key);
    if (!v) return false;
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (d < 0 || d != floor(d) || d > 1e15) {
        fail(c, "'%s' must be a non-negative integer", key);
        return false;
    }
    *out = (uint64_t)d;
    return true;
}

/* A count keyword's range made fit for {m,n}: a maximum above the engine's repetition limit is
 * lowered to it (the strings or arrays allowed are then a subset, all valid), a minimum above it is
 * refused. */
static bool fit_counts(conv *c, const char *min_kw, uint64_t *lo, uint64_t *hi) {
    if (*lo > CV_EBNF_MAX_REPEAT) return fail(c, "'%s' above %d is not supported", min_kw, CV_EBNF_MAX_REPEAT), false;
    if (*hi != UINT64_MAX && *hi > CV_EBNF_MAX_REPEAT) *hi = CV_EBNF_MAX_REPEAT;
    return true;
}

/* A decimal number, exactly: sign, integer digits (no leading zeros, "0" for none), fraction digits
 * (no trailing zeros). Zero is never negative. */
typedef struct dec {
    bool neg;
    char *ip, *fp;
} dec;

static void dec_free(dec *d) {
    free(d->ip);
    free(d->fp);
    *d = (dec){0};
}

static void dec_set(dec *d, bool neg, const char *ip, size_t ni, const char *fp, size_t nf) {
    while (ni > 1 && ip[0] == '0') ip++, ni--;
    while (nf && fp[nf - 1] == '0') nf--;
    free(d->ip);
    free(d->fp);
    d->ip = ni ? cv_xstrndup(ip, ni) : cv_xstrdup("0");
    d->fp = cv_xstrndup(fp, nf);
    d->neg = neg && !(strcmp(d->ip, "0") == 0 && !*d->fp);
}

/* From the %g form of a double ("-1.25e-07", "300", "1e+20"). */
static void dec_from_double(dec *d, double x) {
    char s[32];
    cv_double_shortest(x, s);
    const char *p = s;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[32];
    size_t nd = 0;
    long point = -1;
    for (; (*p >= '0' && *p <= '9') || *p == '.'; p++) {
        if (*p == '.')
            point = (long)nd;
        else
            digits[nd++] = *p;
    }
    if (point < 0) point = (long)nd;
    if (*p == 'e' || *p == 'E') point += strtol(p + 1, NULL, 10);
    cv_text ip = {0}, fp = {0};
    for (long i = 0; i < point; i++) cv_text_putn(&ip, i < (long)nd ? &digits[i] : "0", 1);
    for (long i = point; i < (long)nd; i++) cv_text_putn(&fp, i < 0 ? "0" : &digits[i], 1);
    dec_set(d, neg, ip.s ? ip.s : "", ip.len, fp.s ? fp.s : "", fp.len);
    cv_text_free(&ip);
    cv_text_free(&fp);
}

static void dec_from_json(dec *d, const json_t *v) {
    if (json_is_integer(v)) {
        char s[32];
        json_int_t i = json_integer_value(v);
        snprintf(s, sizeof s, "%" JSON_INTEGER_FORMAT, i);
        bool neg = s[0] == '-';
        dec_set(d, neg, s + neg, strlen(s + neg), "", 0);
    } else {
        dec_from_double(d, json_real_value(v));
    }
}

static int mag_cmp(const dec *a, const dec *b) {
    size_t la = strlen(a->ip), lb = strlen(b->ip);
    if (la != lb) return la < lb ? -1 : 1;
    int r = strcmp(a->ip, b->ip);
    if (r) return r < 0 ? -1 : 1;
    size_t fa = strlen(a->fp), fb = strlen(b->fp);
    for (size_t i = 0; i < fa || i < fb; i++) {
        char x = i < fa ? a->fp[i] : '0', y = i < fb ? b->fp[i] : '0';
        if (x != y) return x < y ? -1 : 1;
    }
    return 0;
}

static int dec_cmp(const dec *a, const dec *b) {
    if (a->neg != b->neg) return a->neg ? -1 : 1;
    int m = mag_cmp(a, b);
    return a->neg ? -m : m;
}

/* Magnitude ± 1 on integer digit strings. */
static char *digits_inc(const char *s) {
    size_t n = strlen(s);
    char *r = cv_xmalloc(n + 2);
    memcpy(r + 1, s, n + 1);
    r[0] = '0';
    for (size_t i = n; i > 0; i--) {
        if (r[i] != '9') {
            r[i]++;
            break;
        }
        r[i] = '0';
        if (i == 1) r[0] = '1';
    }
    if (r[0] == '0') memmove(r, r + 1, n + 1);
    return r;
}

static char *digits_dec(const char *s) {
    size_t n = strlen(s);
    char *r = cv_xstrdup(s);
    for (size_t i = n; i > 0; i--) {
        if (r[i - 1] != '0') {
            r[i - 1]--;
            break;
        }
        r[i - 1] = '9';
    }
    if (n > 1 && r[0] == '0') memmove(r, r + 1, n);
    return r;
}

/* The integer next to d: its ceiling (up) or floor, strictly past it when d is already an integer
 * and `strict`. */
static void dec_to_int(dec *d, bool up, bool strict) {
    bool frac = *d->fp != 0;
    bool grow = (up != d->neg) && (frac || strict); /* moves away from zero */
    bool shrink = !frac && strict && (up == d->neg); /* towards zero, past an integer */
    char *ip;
    bool neg = d->neg;
    if (grow) {
        ip = digits_inc(d->ip);
    } else if (shrink) {
        if (strcmp(d->ip, "0") == 0) {
            ip = cv_xstrdup("1");
            neg = !up;
        } else {
            ip = digits_dec(d->ip);
        }
    } else {
        ip = cv_xstrdup(d->ip);
    }
    dec_set(d, neg, ip, strlen(ip), "", 0);
    free(ip);
}

/* For an exclusive bound x on a non-integer: a decimal just beyond x (above it when up) whose double
 * is beyond x's, so a validator that reads the number into a double still sees it beyond. The step
 * grows from 10^-(digits + 1) until the double moves. */
static bool dec_beyond(dec *d, double x, bool up) {
    dec_from_double(d, x);
    int k = (int)strlen(d->fp) + 1;
    if (k < 6) k = 6;
    for (; k > -400; k--) {
        double step = pow(10.0, -k);
        double y = up ? x + step : x - step;
        if (isinf(y)) return false;
        if (y != x) {
            dec_from_double(d, y);
            return true;
        }
    }
    return false;
}

typedef struct bounds {
    bool has_lo, has_hi;
    dec lo, hi;               /* inclusive */
} bounds;

static void bounds_free(bounds *b) {
    dec_free(&b->lo);
    dec_free(&b->hi);
}

/* Tightens b by one bound: lower or upper, exclusive or not, for integers or all numbers. */
static bool bound_add(conv *c, bounds *b, const char *key, json_t *v, bool lower, bool exclusive, bool integer) {
    if (!json_is_number(v)) return fail(c, "'%s' must be a number", key), false;
    dec d = {0};
    if (integer) {
        dec_from_json(&d, v);
        dec_to_int(&d, lower, exclusive);
    } else if (exclusive) {
        if (!dec_beyond(&d, json_number_value(v), lower)) {
            dec_free(&d);
            return fail(c, "'%s' leaves no number", key), false;
        }
    } else {
        dec_from_json(&d, v);
    }
    bool *has = lower ? &b->has_lo : &b->has_hi;
    dec *cur = lower ? &b->lo : &b->hi;
    if (!*has || (lower ? dec_cmp(&d, cur) > 0 : dec_cmp(&d, cur) < 0)) {
        dec_free(cur);
        *cur = d;
        *has = true;
    } else {
        dec_free(&d);
    }
    return true;
}

static bool get_bounds(conv *c, json_t *s, bool integer, bounds *b) {
    json_t *min = json_object_get(s, "minimum"), *max = json_object_get(s, "maximum");
    json_t *xmin = json_object_get(s, "exclusiveMinimum"), *xmax = json_object_get(s, "exclusiveMaximum");
    /* draft 4 spelled exclusivity as a boolean beside minimum / maximum */
    bool min_x = json_is_true(xmin), max_x = json_is_true(xmax);
    if (json_is_boolean(xmin)) xmin = NULL;
    if (json_is_boolean(xmax)) xmax = NULL;
    if (min && !bound_add(c, b, "minimum", min, true, min_x, integer)) return false;
    if (max && !bound_add(c, b, "maximum", max, false, max_x, integer)) return false;
    if (xmin && !bound_add(c, b, "exclusiveMinimum", xmin, true, true, integer)) return false;
    if (xmax && !bound_add(c, b, "exclusiveMaximum", xmax, false, true, integer)) return false;
    return true;
}

/* ---- number ranges as EBNF --------------------------------------------------------------------------------- */

/* Alternatives written one after another into a body. */
typedef struct alts {
    cv_text *t;
    int n;
} alts;

static void alt_next(alts *a) {
    if (a->n++) cv_text_put(a->t, " | ");
}

/* One alternative: a literal prefix, a digit class lo..hi (lo < 0: none), `any` more digits
 * (SIZE_MAX: any number of them, SIZE_MAX - 1: one or more) and a suffix expression. */
#define ANY_STAR SIZE_MAX
#define ANY_PLUS (SIZE_MAX - 1)
static void put_seq(alts *a, const char *prefix, size_t plen, int lo, int hi, size_t any, const char *suffix) {
    alt_next(a);
    bool sep = false;
    if (plen || (lo >= 0 && lo == hi)) {
        /* a one-digit class joins the literal */
        cv_text lit = {0};
        cv_text_putn(&lit, prefix, plen);
        if (lo >= 0 && lo == hi) {
            char d = (char)lo;
            cv_text_putn(&lit, &d, 1);
        }
        cv_ebnf_literal(a->t, lit.s, lit.len);
        cv_text_free(&lit);
        sep = true;
    }
    if (lo >= 0 && lo != hi) {
        if (sep) cv_text_put(a->t, " ");
        cv_text_printf(a->t, "[%c-%c]", lo, hi);
        sep = true;
    }
    if (any) {
        if (sep) cv_text_put(a->t, " ");
        if (any == ANY_STAR)
            cv_text_put(a->t, "[0-9]*");
        else if (any == ANY_PLUS)
            cv_text_put(a->t, "[0-9]+");
        else if (any == 1)
            cv_text_put(a->t, "[0-9]");
        else
            cv_text_printf(a->t, "[0-9]{%zu}", any);
        sep = true;
    }
    if (*suffix) {
        if (sep) cv_text_put(a->t, " ");
        cv_text_put(a->t, suffix);
    }
}

static bool all_digit(const char *s, size_t from, size_t to, char d) {
    for (size_t i = from; i < to; i++)
        if (s[i] != d) return false;
    return true;
}

/* s[0..start) followed by exactly n - start digits >= s[start..n) (or <=). Once the rest of s is
 * all zeros (all nines) one class covers the remaining cases. */
static void ge_fixed(alts *a, const char *s, size_t start, size_t n, const char *suf) {
    for (size_t p = start; p < n; p++) {
        if (all_digit(s, p + 1, n, '0')) {
            put_seq(a, s, p, s[p], '9', n - p - 1, suf);
            return;
        }
        if (s[p] < '9') put_seq(a, s, p, s[p] + 1, '9', n - p - 1, suf);
    }
    put_seq(a, s, n, -1, -1, 0, suf);
}

static void le_fixed(alts *a, const char *s, size_t start, size_t n, const char *suf) {
    for (size_t p = start; p < n; p++) {
        if (all_digit(s, p + 1, n, '9')) {
            put_seq(a, s, p, '0', s[p], n - p - 1, suf);
            return;
        }
        if (s[p] > '0') put_seq(a, s, p, '0', s[p] - 1, n - p - 1, suf);
    }
    put_seq(a, s, n, -1, -1, 0, suf);
}

/* n-digit strings between lo and hi (both n digits, lo <= hi): the common prefix, then the three
 * ways of leaving it. The alternatives are disjoint and flat, so nothing nests deeper with more
 * digits. */
static void same_len(alts *a, const char *lo, const char *hi, size_t n, const char *suf) {
    size_t q = 0;
    while (q < n && lo[q] == hi[q]) q++;
    if (q == n) {
        put_seq(a, lo, n, -1, -1, 0, suf);
        return;
    }
    /* the digit at q: a class for the values whose rest is free, tight branches for the ends
     * unless their rest is free too */
    bool lo_free = all_digit(lo, q + 1, n, '0'), hi_free = all_digit(hi, q + 1, n, '9');
    if (!lo_free) ge_fixed(a, lo, q + 1, n, suf);
    int from = lo[q] + !lo_free, to = hi[q] - !hi_free;
    if (from <= to) put_seq(a, lo, q, from, to, n - q - 1, suf);
    if (!hi_free) le_fixed(a, hi, q + 1, n, suf);
}

/* Canonical integers between lo and hi (hi NULL: no bound), each followed by suf. */
static void int_range(alts *a, const char *lo, const char *hi, const char *suf) {
    size_t la = strlen(lo), lb = hi ? strlen(hi) : 0;
    char *nines = cv_xmalloc(la + 1);
    memset(nines, '9', la);
    nines[la] = 0;
    if (hi && la == lb) {
        same_len(a, lo, hi, la, suf);
        free(nines);
        return;
    }
    same_len(a, lo, nines, la, suf);
    free(nines);
    cv_text mid = {0};
    if (!hi)
        cv_text_printf(&mid, "[1-9] [0-9]{%zu,}", la);
    else if (lb - la == 2)
        cv_text_printf(&mid, la == 1 ? "[1-9] [0-9]" : "[1-9] [0-9]{%zu}", la);
    else if (lb - la > 2)
        cv_text_printf(&mid, "[1-9] [0-9]{%zu,%zu}", la, lb - 2);
    if (mid.len) {
        alt_next(a);
        cv_text_putn(a->t, mid.s, mid.len);
        if (*suf) cv_text_printf(a->t, " %s", suf);
    }
    cv_text_free(&mid);
    if (hi) {
        char *first = cv_xmalloc(lb + 1);
        memset(first, '0', lb);
        first[0] = '1';
        first[lb] = 0;
        same_len(a, first, hi, lb, suf);
        free(first);
    }
}

/* After prefix P: digit strings y (non-empty unless allow_empty) with y >= S, or y <= S, read as
 * fractions (trailing zeros do not count). S has no trailing zeros. */
static void ge_tail(alts *a, const char *P, const char *S, bool allow_empty) {
    cv_text x = {0};
    size_t ns = strlen(S);
    for (size_t p = 0; p < ns; p++) {
        if (S[p] == '9') continue;
        x.len = 0;
        cv_text_put(&x, P);
        cv_text_putn(&x, S, p);
        put_seq(a, x.s, x.len, S[p] + 1, '9', ANY_STAR, "");
    }
    x.len = 0;
    cv_text_put(&x, P);
    cv_text_put(&x, S);
    put_seq(a, x.s, x.len, -1, -1, (ns || allow_empty) ? ANY_STAR : ANY_PLUS, "");
    cv_text_free(&x);
}

static void le_tail(alts *a, const char *P, const char *S, bool allow_empty) {
    cv_text x = {0};
    size_t ns = strlen(S);
    for (size_t p = 0; p < ns; p++) {
        x.len = 0;
        cv_text_put(&x, P);
        cv_text_putn(&x, S, p);
        if (S[p] > '0') put_seq(a, x.s, x.len, '0', S[p] - 1, ANY_STAR, "");
        if (p > 0 || allow_empty) put_seq(a, x.s, x.len, -1, -1, 0, "");
    }
    x.len = 0;
    cv_text_put(&x, P);
    cv_text_put(&x, S);
    alt_next(a);
    if (x.len) {
        cv_ebnf_literal(a->t, x.s, x.len);
        cv_text_put(a->t, ns || allow_empty ? " \"0\"*" : " \"0\"+");
    } else {
        cv_text_put(a->t, allow_empty ? "\"0\"*" : "\"0\"+");
    }
    cv_text_free(&x);
}

/* "P" followed by fraction digits y (at least one) with lo <= y <= hi as fractions. */
static void frac_between(alts *a, const char *P, const char *lo, const char *hi) {
    size_t nl = strlen(lo), nh = strlen(hi), m = nl > nh ? nl : nh;
    size_t q = 0;
    while (q < m && (q < nl ? lo[q] : '0') == (q < nh ? hi[q] : '0')) q++;
    cv_text x = {0};
    cv_text_put(&x, P);
    if (q == m) { /* equal: lo itself, trailing zeros allowed */
        cv_text_put(&x, lo);
        alt_next(a);
        cv_ebnf_literal(a->t, x.s, x.len);
        cv_text_put(a->t, nl ? " \"0\"*" : " \"0\"+");
        cv_text_free(&x);
        return;
    }
    /* y ends inside the common prefix: lo must have nothing left */
    for (size_t j = nl > 1 ? nl : 1; j <= q; j++) {
        x.len = strlen(P);
        cv_text_putn(&x, hi, j);
        put_seq(a, x.s, x.len, -1, -1, 0, "");
    }
    x.len = strlen(P);
    cv_text_putn(&x, hi, q); /* the common prefix (hi has it too, q < nh since they differ) */
    char dl = q < nl ? lo[q] : '0', dh = hi[q];
    size_t base = x.len;
    cv_text_putn(&x, &dl, 1);
    ge_tail(a, x.s, q + 1 < nl ? lo + q + 1 : "", true);
    x.len = base;
    x.s[base] = 0;
    if (dl + 1 <= dh - 1) put_seq(a, x.s, x.len, dl + 1, dh - 1, ANY_STAR, "");
    cv_text_putn(&x, &dh, 1);
    le_tail(a, x.s, hi + q + 1, true);
    cv_text_free(&x);
}

/* Non-negative numbers lo..hi (hi NULL: unbounded), integers only or with an optional fraction. */
static void mag_range(alts *a, const dec *lo, const dec *hi, bool integer) {
    if (integer) {
        int_range(a, lo->ip, hi ? hi->ip : NULL, "");
        return;
    }
    const char *any_frac = "(\".\" [0-9]+)?";
    char *lo_dot = cv_xasprintf("%s.", lo->ip);
    bool same_int = hi && strcmp(lo->ip, hi->ip) == 0;
    if (same_int) {
        if (!*lo->fp) put_seq(a, lo->ip, strlen(lo->ip), -1, -1, 0, "");
        frac_between(a, lo_dot, lo->fp, hi->fp);
        free(lo_dot);
        return;
    }
    if (*lo->fp)
        ge_tail(a, lo_dot, lo->fp, false);
    else
        put_seq(a, lo->ip, strlen(lo->ip), -1, -1, 0, any_frac);
    free(lo_dot);
    char *next = digits_inc(lo->ip);
    if (!hi) {
        int_range(a, next, NULL, any_frac);
    } else {
        char *last = digits_dec(hi->ip);
        dec n = {0}, l = {0};
        dec_set(&n, false, next, strlen(next), "", 0);
        dec_set(&l, false, last, strlen(last), "", 0);
        if (mag_cmp(&n, &l) <= 0) int_range(a, next, last, any_frac);
        dec_free(&n);
        dec_free(&l);
        free(last);
        put_seq(a, hi->ip, strlen(hi->ip), -1, -1, 0, "");
        char *hi_dot = cv_xasprintf("%s.", hi->ip);
        le_tail(a, hi_dot, hi->fp, false);
        free(hi_dot);
    }
    free(next);
}

/* Numbers between b's bounds, without an exponent: the non-negative ones, then "-" and the
 * magnitudes of the negative ones ("-0" included when 0 is allowed, which keeps the halves
 * simple). */
static void number_range(conv *c, const bounds *b, bool integer, cv_text *body) {
    alts a = {body, 0};
    dec zero = {0};
    dec_set(&zero, false, "0", 1, "", 0);
    if (!b->has_hi || !b->hi.neg) {
        const dec *lo = b->has_lo && !b->lo.neg ? &b->lo : &zero;
        mag_range(&a, lo, b->has_hi ? &b->hi : NULL, integer);
    }
    if (!b->has_lo || b->lo.neg) {
        dec lo = {0}, hi = {0};
        if (b->has_hi && b->hi.neg)
            dec_set(&lo, false, b->hi.ip, strlen(b->hi.ip), b->hi.fp, strlen(b->hi.fp));
        else
            dec_set(&lo, false, "0", 1, "", 0);
        if (b->has_lo) dec_set(&hi, false, b->lo.ip, strlen(b->lo.ip), b->lo.fp, strlen(b->lo.fp));
        cv_text neg = {0};
        alts na = {&neg, 0};
        mag_range(&na, &lo, b->has_lo ? &hi : NULL, integer);
        alt_next(&a);
        cv_text_printf(body, "\"-\" (%s)", neg.s);
        cv_text_free(&neg);
        dec_free(&lo);
        dec_free(&hi);
    }
    dec_free(&zero);
    (void)c;
}

static bool gen_number(conv *c, json_t *s, bool integer, cv_text *body) {
    bounds b = {0};
    if (!get_bounds(c, s, integer, &b)) {
        bounds_free(&b);
        return false;
    }
    if (!b.has_lo && !b.has_hi) {
        cv_text_put(body, integer ? basic(c, CV_JR_INTEGER, "integer") : basic(c, CV_JR_NUMBER, "number"));
    } else if (b.has_lo && b.has_hi && dec_cmp(&b.lo, &b.hi) > 0) {
        bounds_free(&b);
        return fail(c, "no %s lies between the minimum and the maximum", integer ? "integer" : "number"), false;
    } else {
        number_range(c, &b, integer, body);
    }
    bounds_free(&b);
    return true;
}

/* ---- strings --------------------------------------------------------------------------------------------- */

#define HEX "[0-9a-fA-F]"
#define D2 "[0-9][0-9]"
#define MD_31 "(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
#define MD_30 "(0[469]|11)-(0[1-9]|[12][0-9]|30)"
#define MD_FEB "02-(0[1-9]|1[0-9]|2[0-8])"
#define LEAP_YEAR "(" D2 "(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
#define DATE "([0-9]{4}-(" MD_31 "|" MD_30 "|" MD_FEB ")|" LEAP_YEAR "-02-29)"
#define TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define H16 HEX "{1,4}"
#define LABEL "[a-zA-Z0-9]+(-+[a-zA-Z0-9]+)*"
#define PCT "%" HEX "{2}"
#define PCHAR "([a-zA-Z0-9._~!$&'()*+,;=:@-]|" PCT ")"

/* Regular approximations of the formats, each a subset of what ajv's "full" formats accept: dates
 * with real month lengths and leap years, times with an offset, hostnames of at most six labels
 * of at most 41 characters (so the whole stays within 253), URIs with a scheme and a registered
 * name as host. */
static const struct {
    const char *name, *regex;
} formats[] = {
    {"date", DATE},
    {"time", TIME},
    {"date-time", DATE "[Tt]" TIME},
    {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@(" LABEL "\\.)+" LABEL},
    {"uuid", HEX "{8}-" HEX "{4}-" HEX "{4}-" HEX "{4}-" HEX "{12}"},
    {"ipv4", OCTET "(\\." OCTET "){3}"},
    {"ipv6", H16 "(:" H16 "){7}|::(" H16 "(:" H16 "){0,6})?|" H16 "::(" H16 "(:" H16 "){0,5})?|" H16 ":" H16
             "::(" H16 "(:" H16 "){0,4})?|" H16 "(:" H16 "){2}::(" H16 "(:" H16 "){0,3})?|" H16 "(:" H16
             "){3}::(" H16 "(:" H16 "){0,2})?|" H16 "(:" H16 "){4}::(" H16 "(:" H16 ")?)?|" H16 "(:" H16
             "){5}::(" H16 ")?|" H16 "(:" H16 "){6}::"},
    {"hostname", "[a-zA-Z0-9]([a-zA-Z0-9-]{0,39}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,39}[a-zA-Z0-9])?){0,5}"},
    {"uri", "[a-zA-Z][a-zA-Z0-9+.-]*:(//(([a-zA-Z0-9._~!$&'()*+,;=:-]|" PCT ")*@)?([a-zA-Z0-9._~!$&'()*+,;=-]|" PCT
            ")*(:[0-9]*)?(/" PCHAR "*)*|/(" PCHAR "+(/" PCHAR "*)*)?|" PCHAR "+(/" PCHAR "*)*)(\\?([/?]|" PCHAR
            ")*)?(#([/?]|" PCHAR ")*)?"},
};

static bool gen_string(conv *c, json_t *s, cv_text *body) {
    json_t *pattern = json_object_get(s, "pattern"), *format = json_object_get(s, "format");
    uint64_t min = 0, max = UINT64_MAX;
    bool has_min = get_count(c, s, "minLength", &min), has_max = get_count(c, s, "maxLength", &max);
    if (c->failed) return false;
    if (has_min && has_max && min > max) return fail(c, "minLength is greater than maxLength"), false;
    const char *src = NULL, *what = NULL;
    cv_re_dialect dialect = CV_RE_ECMA;
    if (pattern && format) return fail(c, "'pattern' together with 'format' is not supported"), false;
    if (pattern) {
        if (!json_is_string(pattern)) return fail(c, "'pattern' must be a string"), false;
        src = json_string_value(pattern);
        what = "pattern";
    } else if (format) {
        if (!json_is_string(format)) return fail(c, "'format' must be a string"), false;
        for (size_t i = 0; i < CV_ARRAY_LEN(formats) && !src; i++)
            if (strcmp(formats[i].name, json_string_value(format)) == 0) src = formats[i].regex;
        if (!src) return fail(c, "unsupported format '%.60s'", json_string_value(format)), false;
        dialect = CV_RE_PYTHON;
        what = "format";
    }
    if (!src) {
        if (!has_min && !has_max) {
            cv_text_put(body, basic(c, CV_JR_STRING, "string"));
            return true;
        }
        if (!fit_counts(c, "minLength", &min, &max)) return false;
        basic(c, CV_JR_CHAR, "char");
        cv_text_put(body, "\"\\\"\" char");
        if (!has_max)
            cv_text_printf(body, min == 0 ? "*" : min == 1 ? "+" : "{%llu,}", (unsigned long long)min);
        else if (min == max)
            cv_text_printf(body, "{%llu}", (unsigned long long)min);
        else
            cv_text_printf(body, "{%llu,%llu}", (unsigned long long)min, (unsigned long long)max);
        cv_text_put(body, " \"\\\"\"");
        return true;
    }
    char err[200];
    cv_regex *re = cv_regex_parse(src, json_is_string(pattern) ? json_string_length(pattern) : strlen(src), dialect,
                                  err, sizeof err);
    if (!re) return fail(c, "unsupported %s (%s)", what, err), false;
    if (has_min || has_max) {
        bool empty;
        if (!cv_regex_limit_length(re, min, max, &empty)) {
            cv_regex_free(re);
            if (empty)
                return fail(c, "no string matching the %s has a length within minLength..maxLength", what), false;
            return fail(c, "minLength/maxLength together with this %s is not supported (its length varies in more "
                           "than one place)", what), false;
        }
    }
    cv_text_put(body, "\"\\\"\" ");
    cv_regex_emit(re, true, body);
    cv_text_put(body, " \"\\\"\"");
    cv_regex_free(re);
    return true;
}

/* The first keyword of a NULL-terminated list that s has, or NULL. */
static const char *first_of(json_t *s, const char *const *list) {
    for (; *list; list++)
        if (json_object_get(s, *list)) return *list;
    return NULL;
}

static const char *const object_kw[] = {"properties", "required", "additionalProperties", "unevaluatedProperties",
                                         "minProperties", "maxProperties", NULL};
static const char *const array_kw[] = {"items", "prefixItems", "additionalItems", "unevaluatedItems", "minItems",
                                        "maxItems", "uniqueItems", NULL};
static const char *const string_kw[] = {"minLength", "maxLength", "pattern", "format", NULL};
static const char *const number_kw[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

/* ---- enum and const ---------------------------------------------------------------------------------- */

/* The JSON types, in the order of their bits below. */
static const char *const type_names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
enum {
    T_NULL = 1, T_BOOLEAN = 2, T_OBJECT = 4, T_ARRAY = 8, T_STRING = 16, T_NUMBER = 32, T_INTEGER = 64, T_ALL = 127
};

static bool get_types(conv *c, json_t *s, unsigned *types) {
    json_t *t = json_object_get(s, "type");
    *types = 0;
    if (!t) {
        *types = T_ALL;
        return true;
    }
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        if (!json_is_string(x)) return fail(c, "'type' must be a string or an array of strings"), false;
        size_t k = 0;
        while (k < CV_ARRAY_LEN(type_names) && strcmp(type_names[k], json_string_value(x)) != 0) k++;
        if (k == CV_ARRAY_LEN(type_names)) return fail(c, "unknown type '%.40s'", json_string_value(x)), false;
        *types |= 1u << k;
    }
    if (!*types) return fail(c, "'type' is an empty list"), false;
    return true;
}

static bool value_has_type(const json_t *v, unsigned types) {
    switch (json_typeof(v)) {
    case JSON_NULL: return types & T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return types & T_BOOLEAN;
    case JSON_OBJECT: return types & T_OBJECT;
    case JSON_ARRAY: return types & T_ARRAY;
    case JSON_STRING: return types & T_STRING;
    case JSON_INTEGER: return types & (T_NUMBER | T_INTEGER);
    case JSON_REAL: {
        double d = json_real_value(v);
        return (types & T_NUMBER) || ((types & T_INTEGER) && d == floor(d));
    }
    }
    return false;
}

/* Whether an enum / const value satisfies the keywords beside it (the ones allowed there). */
static bool value_fits(conv *c, json_t *s, const json_t *v, unsigned types) {
    if (!value_has_type(v, types)) return false;
    if (json_is_string(v)) {
        uint64_t min = 0, max = UINT64_MAX, n = 0;
        get_count(c, s, "minLength", &min);
        get_count(c, s, "maxLength", &max);
        const char *p = json_string_value(v);
        for (size_t i = 0, len = json_string_length(v); i < len; i++) n += ((unsigned char)p[i] & 0xC0) != 0x80;
        return n >= min && n <= max;
    }
    if (json_is_number(v)) {
        bounds b = {0};
        bool ok = get_bounds(c, s, false, &b);
        dec d = {0};
        dec_from_json(&d, v);
        ok = ok && (!b.has_lo || dec_cmp(&d, &b.lo) >= 0) && (!b.has_hi || dec_cmp(&d, &b.hi) <= 0);
        dec_free(&d);
        bounds_free(&b);
        return ok;
    }
    return true;
}

/* enum / const: the values that satisfy the keywords beside them. Lengths and bounds are checked
 * here; a keyword this cannot check (a pattern, an object's properties...) is refused when some
 * value is of the type it constrains, and irrelevant otherwise. */
static bool gen_enum(conv *c, json_t *s, cv_text *body) {
    static const char *const string_unchecked[] = {"pattern", "format", NULL};
    unsigned types;
    if (!get_types(c, s, &types)) return false;
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (en && !json_is_array(en)) return fail(c, "'enum' must be an array"), false;
    size_t n = en ? json_array_size(en) : 1;
    alts a = {body, 0};
    smap seen = {0};
    for (size_t i = 0; i < n && !c->failed; i++) {
        json_t *v = en ? json_array_get(en, i) : cst;
        if (en && cst && !json_equal(v, cst)) continue;
        if (!value_has_type(v, types)) continue;
        const char *k = json_is_object(v)   ? first_of(s, object_kw)
                        : json_is_array(v)  ? first_of(s, array_kw)
                        : json_is_string(v) ? first_of(s, string_unchecked)
                                            : NULL;
        if (k) {
            fail(c, "'%s' together with enum/const is not supported", k);
            break;
        }
        if (!value_fits(c, s, v, types)) continue;
        cv_text lit = {0};
        cv_json_compact(&lit, v);
        if (!smap_get(&seen, lit.s)) {
            alt_next(&a);
            cv_ebnf_literal(body, lit.s, lit.len);
            smap_put(&seen, cv_xstrdup(lit.s), cv_xstrdup(""));
        }
        cv_text_free(&lit);
    }
    smap_free(&seen);
    if (c->failed) return false;
    if (!a.n) return fail(c, "no value of enum/const satisfies the schema"), false;
    return true;
}

/* ---- references ------------------------------------------------------------------------------------------- */

/* The schema a "#..." reference names (a JSON pointer in the fragment, percent-decoded), and the
 * pointer in its plain form. */
static json_t *resolve(conv *c, const char *ref, cv_text *where) {
    if (ref[0] != '#') return fail(c, "unsupported $ref '%.80s' (only references inside the schema are)", ref);
    json_t *node = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') return fail(c, "unsupported $ref '%.80s' (anchors are not supported)", ref);
    cv_text tok = {0};
    while (*p) {
        p++; /* the '/' */
        tok.len = 0;
        cv_text_putn(&tok, "", 0);
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '%' && p[1] && p[2] && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
                char hex[3] = {p[1], p[2], 0};
                ch = (char)strtol(hex, NULL, 16);
                p += 2;
            } else if (ch == '~' && (p[1] == '0' || p[1] == '1')) {
                ch = p[1] == '0' ? '~' : '/';
                p++;
            }
            cv_text_putn(&tok, &ch, 1);
        }
        cv_text_put(where, "/");
        for (size_t i = 0; i < tok.len; i++) {
            if (tok.s[i] == '~')
                cv_text_put(where, "~0");
            else if (tok.s[i] == '/')
                cv_text_put(where, "~1");
            else
                cv_text_putn(where, &tok.s[i], 1);
        }
        if (json_is_object(node)) {
            node = json_object_get(node, tok.s);
        } else if (json_is_array(node)) {
            char *end;
            unsigned long i = strtoul(tok.s, &end, 10);
            node = (*end || !tok.len) ? NULL : json_array_get(node, i);
        } else {
            node = NULL;
        }
        if (!node) break;
    }
    cv_text_free(&tok);
    if (!node) return fail(c, "$ref '%.80s' points to nothing", ref);
    return node;
}

static bool gen_body(conv *c, json_t *s, cv_text *body);
static const char *gen_schema(conv *c, json_t *s);

/* The rule of a referenced schema: one per target, made on first use. */
static const char *gen_ref(conv *c, const char *ref) {
    cv_text where = {0};
    json_t *target = resolve(c, ref, &where);
    if (!target) {
        cv_text_free(&where);
        return NULL;
    }
    const char *key = where.s ? where.s : "";
    for (size_t i = 0; i < c->n_refs; i++) {
        if (strcmp(c->refs[i].ptr, key) != 0) continue;
        cv_text_free(&where);
        if (c->refs[i].open && c->refs[i].open_at >= c->guard)
            return fail(c, "$ref '%.80s' refers back to itself before any input", ref);
        return c->refs[i].name;
    }
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 8;
        c->refs = cv_xrealloc(c->refs, c->cap_refs * sizeof *c->refs);
    }
    size_t me = c->n_refs++;
    cv_text saved = c->ptr;
    c->ptr = where;
    c->refs[me] = (ref_entry){.ptr = cv_xstrdup(key), .name = new_name(c), .open = true, .open_at = c->n_open++};
    cv_text body = {0};
    bool ok = false;
    if (json_is_true(target)) {
        cv_text_put(&body, basic(c, CV_JR_VALUE, "value"));
        ok = true;
    } else if (json_is_false(target)) {
        fail(c, "the schema false accepts nothing");
    } else if (!json_is_object(target)) {
        fail(c, "a schema must be an object or a boolean");
    } else if (c->depth >= MAX_DEPTH) {
        fail(c, "schema too deep (more than %d levels)", MAX_DEPTH);
    } else {
        c->depth++;
        ok = gen_body(c, target, &body);
        c->depth--;
    }
    c->n_open--;
    c->refs[me].open = false;
    cv_text_free(&c->ptr);
    c->ptr = saved;
    ok = ok && add_rule(c, c->refs[me].name, body.s);
    cv_text_free(&body);
    return ok ? c->refs[me].name : NULL;
}

/* ---- merging schemas (allOf, and keywords beside $ref / anyOf / oneOf) ------------------------------- */

static const char *const grp_props[] = {"properties", "additionalProperties", "unevaluatedProperties", NULL};
static const char *const grp_items[] = {"items", "prefixItems", "additionalItems", "unevaluatedItems", NULL};
/* bounds that two schemas tighten to the stricter one */
static const char *const lower_kw[] = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", NULL};
static const char *const upper_kw[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", NULL};

static json_t *merge(conv *c, json_t *a, json_t *b);

/* Whether a and b both use a group of interacting keywords, not identically. The group's first
 * keyword (properties, items) may differ when it merges on its own: per property name, or item
 * schema with item schema. */
static bool group_split(json_t *a, json_t *b, const char *const *grp) {
    bool in_a = false, in_b = false, same = true;
    for (size_t i = 0; grp[i]; i++) {
        json_t *x = json_object_get(a, grp[i]), *y = json_object_get(b, grp[i]);
        in_a |= x != NULL;
        in_b |= y != NULL;
        if (i == 0 && x && y && !json_is_array(x) && !json_is_array(y)) continue;
        if ((x || y) && !(x && y && json_equal(x, y))) same = false;
    }
    return in_a && in_b && !same;
}

static json_t *merge_properties(conv *c, json_t *pa, json_t *pb) {
    if (!json_is_object(pa) || !json_is_object(pb)) return fail(c, "'properties' must be an object");
    json_t *out = json_object();
    const char *k;
    json_t *x;
    json_object_foreach(pa, k, x) {
        json_t *y = json_object_get(pb, k);
        json_t *m = y ? merge(c, x, y) : x;
        if (!m) {
            json_decref(out);
            return NULL;
        }
        json_object_set(out, k, m);
    }
    json_object_foreach(pb, k, x) {
        if (!json_object_get(pa, k)) json_object_set(out, k, x);
    }
    json_array_append_new(c->keep, out);
    return out;
}

/* Keyword k present in both a (as x) and b (as y), differently: the one keyword that means both,
 * as a new reference; NULL (and an error) when there is none this can write. */
static json_t *merge_keyword(conv *c, const char *k, json_t *a, json_t *b, json_t *x, json_t *y) {
    if (strcmp(k, "type") == 0) {
        unsigned ta, tb;
        if (!get_types(c, a, &ta) || !get_types(c, b, &tb)) return NULL;
        /* an integer is a number */
        unsigned both = ta & tb & (T_NULL | T_BOOLEAN | T_OBJECT | T_ARRAY | T_STRING);
        if ((ta & T_NUMBER) && (tb & T_NUMBER))
            both |= T_NUMBER;
        else if ((ta & (T_NUMBER | T_INTEGER)) && (tb & (T_NUMBER | T_INTEGER)))
            both |= T_INTEGER;
        if (!both) return fail(c, "combined schemas allow no common type");
        json_t *t = json_array();
        for (unsigned i = 0; i < CV_ARRAY_LEN(type_names); i++)
            if (both & (1u << i)) json_array_append_new(t, json_string(type_names[i]));
        return t;
    }
    if (strcmp(k, "required") == 0 && json_is_array(x) && json_is_array(y)) {
        json_t *r = json_copy(x);
        for (size_t i = 0; i < json_array_size(y); i++) {
            bool dup = false;
            for (size_t j = 0; j < json_array_size(x) && !dup; j++)
                dup = json_equal(json_array_get(y, i), json_array_get(x, j));
            if (!dup) json_array_append(r, json_array_get(y, i));
        }
        return r;
    }
    json_t *m = NULL;
    if (strcmp(k, "properties") == 0)
        m = merge_properties(c, x, y);
    else if (strcmp(k, "items") == 0 && !json_is_array(x) && !json_is_array(y))
        m = merge(c, x, y);
    else if (in_list(k, lower_kw) && json_is_number(x) && json_is_number(y))
        m = json_number_value(x) >= json_number_value(y) ? x : y;
    else if (in_list(k, upper_kw) && json_is_number(x) && json_is_number(y))
        m = json_number_value(x) <= json_number_value(y) ? x : y;
    else if (!c->failed)
        fail(c, "combining two schemas that both have '%s' is not supported", k);
    return m ? json_incref(m) : NULL;
}

/* One schema that is the conjunction of a and b, keyword by keyword; NULL (and an error) when that
 * needs more than merge_keyword can write. */
static json_t *merge(conv *c, json_t *a, json_t *b) {
    if (json_is_true(a)) return b;
    if (json_is_true(b)) return a;
    if (!json_is_object(a) || !json_is_object(b)) {
        if (json_is_false(a) || json_is_false(b)) return fail(c, "the schema false accepts nothing");
        return fail(c, "a schema must be an object or a boolean");
    }
    const char *k;
    json_t *x;
    for (int side = 0; side < 2; side++)
        json_object_foreach(side ? b : a, k, x) {
            if (in_list(k, kw_unsupported)) return fail(c, "unsupported keyword '%s'", k);
        }
    if (group_split(a, b, grp_props) || group_split(a, b, grp_items))
        return fail(c, "combining schemas whose properties or items interact is not supported");
    json_t *out = json_object();
    json_array_append_new(c->keep, out);
    json_object_foreach(a, k, x) {
        if (!is_assertion(k)) continue;
        json_t *y = json_object_get(b, k);
        json_t *m = y && !json_equal(x, y) ? merge_keyword(c, k, a, b, x, y) : json_incref(x);
        if (!m) return NULL;
        json_object_set_new(out, k, m);
    }
    json_object_foreach(b, k, x) {
        if (is_assertion(k) && !json_object_get(a, k)) json_object_set(out, k, x);
    }
    return out;
}

/* s without the keywords that are not assertions and without `except`: what sits beside an
 * applicator. NULL when nothing does. */
static json_t *siblings(conv *c, json_t *s, const char *const *except) {
    json_t *out = NULL;
    const char *k;
    json_t *x;
    json_object_foreach(s, k, x) {
        if (!is_assertion(k) || in_list(k, except)) continue;
        if (!out) {
            out = json_object();
            json_array_append_new(c->keep, out);
        }
        json_object_set(out, k, x);
    }
    return out;
}

/* A schema with its top-level $ref replaced by the target (repeatedly), merged with what sat
 * beside the $ref. */
static json_t *inline_ref(conv *c, json_t *s) {
    for (int i = 0; json_is_object(s) && json_object_get(s, "$ref"); i++) {
        if (i >= MAX_DEPTH) return fail(c, "schema too deep (a chain of more than %d $ref)", MAX_DEPTH);
        json_t *ref = json_object_get(s, "$ref");
        if (!json_is_string(ref)) return fail(c, "'$ref' must be a string");
        cv_text where = {0};
        json_t *target = resolve(c, json_string_value(ref), &where);
        cv_text_free(&where);
        if (!target) return NULL;
        static const char *const except[] = {"$ref", NULL};
        json_t *rest = siblings(c, s, except);
        s = rest ? merge(c, rest, target) : target;
        if (!s) return NULL;
    }
    return s;
}

/* ---- objects and arrays ----------------------------------------------------------------------------------- */

typedef struct prop {
    const char *key;
    json_t *schema;
    bool required;
    const char *rule;
} prop;

/* A JSON key as an EBNF literal: "\"name\"" in its canonical spelling. */
static void key_literal(cv_text *t, const char *key) {
    cv_text j = {0};
    cv_text_put(&j, "\"");
    cv_json_escape(&j, key, strlen(key));
    cv_text_put(&j, "\"");
    cv_ebnf_literal(t, j.s, j.len);
    cv_text_free(&j);
}

/* The names of additional properties: any JSON string but the declared names. A trie of the names
 * (over code points, in canonical spelling) becomes one rule per node: close the string (unless
 * the path so far is a declared name), continue along a child, or leave the trie with any other
 * character, after which anything may follow. */
typedef struct tnode {
    uint32_t cp;
    size_t first, next;       /* first child, next sibling (0: none; node 0 is the root) */
    bool terminal;
} tnode;

static const char *gen_other_key(conv *c, const prop *props, size_t n) {
    size_t nt = 1, cap = 16;
    tnode *t = cv_xcalloc(cap, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        size_t at = 0;
        const char *k = props[i].key;
        for (size_t j = 0, len = strlen(k); j < len;) {
            uint32_t cp;
            size_t m;
            if (cv_utf8_decode(k + j, len - j, &cp, &m) != CV_UTF8_OK) break; /* jansson checked it */
            j += m;
            size_t ch = t[at].first;
            while (ch && t[ch].cp != cp) ch = t[ch].next;
            if (!ch) {
                if (nt == cap) t = cv_xrealloc(t, (cap *= 2) * sizeof *t);
                t[nt] = (tnode){.cp = cp, .next = t[at].first};
                t[at].first = nt;
                ch = nt++;
            }
            at = ch;
        }
        t[at].terminal = true;
    }
    /* children come after their parents: converted from the last, each node's children have their
     * rules (identical leaves share one) before the node is written */
    const char **names = cv_xcalloc(nt, sizeof *names);
    basic(c, CV_JR_CHAR, "char");
    bool ok = true;
    for (size_t i = nt; i-- > 0 && ok;) {
        cv_text body = {0};
        alts a = {&body, 0};
        if (!t[i].terminal) {
            alt_next(&a);
            cv_text_put(&body, "\"\\\"\"");
        }
        cv_cpset other = {0};
        cv_cpset_add(&other, 0, CV_CP_MAX);
        for (size_t ch = t[i].first; ch; ch = t[ch].next) {
            char u[4];
            size_t m = cv_utf8_encode(t[ch].cp, u);
            cv_text lit = {0};
            cv_json_escape(&lit, u, m);
            alt_next(&a);
            cv_ebnf_literal(&body, lit.s, lit.len);
            cv_text_printf(&body, " %s", names[ch]);
            cv_text_free(&lit);
            cv_cpset one = {0};
            cv_cpset_add(&one, t[ch].cp, t[ch].cp);
            cv_cpset_invert(&one);
            cv_cpset_intersect(&other, &one);
            cv_cpset_free(&one);
        }
        alt_next(&a);
        cv_ebnf_json_char(&body, &other);
        cv_text_put(&body, " char* \"\\\"\"");
        cv_cpset_free(&other);
        names[i] = intern(c, body.s);
        ok = names[i] != NULL;
        cv_text_free(&body);
    }
    free(t);
    const char *root = NULL;
    if (ok) {
        cv_text body = {0};
        cv_text_printf(&body, "\"\\\"\" %s", names[0]);
        root = intern(c, body.s);
        cv_text_free(&body);
    }
    free(names);
    return root;
}

/* Additional properties / items: not allowed, any value, or a schema. */
typedef enum extra { EXTRA_NONE, EXTRA_ANY, EXTRA_SCHEMA } extra;

static extra get_extra(json_t *v, json_t **schema) {
    *schema = NULL;
    if (!v || json_is_true(v)) return EXTRA_ANY;
    if (json_is_false(v)) return EXTRA_NONE;
    *schema = v;
    return EXTRA_SCHEMA;
}

/* Converts a child schema reached after a '{' or '[' (its pointer token already pushed): the
 * references open above it are no longer left recursion. */
static const char *gen_guarded(conv *c, json_t *s) {
    size_t guard = c->guard;
    c->guard = c->n_open;
    const char *name = gen_schema(c, s);
    c->guard = guard;
    return name;
}

static const char *gen_property(conv *c, json_t *s, const char *group, const char *key) {
    size_t saved = ptr_push(c, group);
    if (key) ptr_push(c, key);
    const char *name = gen_guarded(c, s);
    ptr_pop(c, saved);
    return name;
}

/* A property as it follows another: `"," key ":" value`, optional or not when `tail`; as the first
 * one, without the comma. */
static void put_member(cv_text *t, conv *c, const prop *p, bool tail) {
    if (tail) cv_text_printf(t, p->required ? " %s " : " (%s ", comma(c));
    key_literal(t, p->key);
    cv_text_printf(t, " %s %s%s", colon(c), p->rule, tail && !p->required ? ")?" : "");
}

/* Objects. With properties p0..pn-1 in schema order, the first required one at index r (n if
 * none), and A an additional property:
 *
 *   object ::= "{" ws "}"                       (only when nothing is required)
 *            | "{" ws ( p0 T1 | p1 T2 | ... | pr T(r+1) | A Tn ) ws "}"   (A Tn: only when r = n)
 *   Tj     ::= ("," pj)? T(j+1)   (pj optional)   |   "," pj T(j+1)   (pj required)
 *   Tn     ::= ("," A)*
 *
 * The first property present picks the alternative; every later one is preceded by a comma, so
 * each object parses one way. Tj is a rule where two places use it and inline elsewhere, so the
 * grammar grows linearly with the number of properties. */
static bool gen_object(conv *c, json_t *s, cv_text *body) {
    json_t *props_j = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    if (props_j && !json_is_object(props_j)) return fail(c, "'properties' must be an object"), false;
    if (req && !json_is_array(req)) return fail(c, "'required' must be an array"), false;
    json_t *addl_j = json_object_get(s, "additionalProperties");
    const char *addl_kw = "additionalProperties";
    if (!addl_j && (addl_j = json_object_get(s, "unevaluatedProperties"))) addl_kw = "unevaluatedProperties";
    json_t *addl_schema;
    extra addl = get_extra(addl_j, &addl_schema);
    /* strict: an object that lists its properties has no others unless it says so (xgrammar's
     * strict mode, vLLM's default); one that lists none still takes any */
    if (!addl_j && c->strict && props_j) addl = EXTRA_NONE;

    size_t n_declared = props_j ? json_object_size(props_j) : 0;
    size_t cap = n_declared + (req ? json_array_size(req) : 0) + 1;
    prop *all = cv_xcalloc(cap, sizeof *all); /* declared names, then required-only ones */
    size_t na = 0;
    const char *k;
    json_t *x;
    if (props_j) json_object_foreach(props_j, k, x) all[na++] = (prop){.key = k, .schema = x};
    for (size_t i = 0; req && i < json_array_size(req) && !c->failed; i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            fail(c, "'required' must list strings");
            break;
        }
        size_t j = 0;
        while (j < na && strcmp(all[j].key, json_string_value(r)) != 0) j++;
        if (j == na) {
            if (addl == EXTRA_NONE) {
                if (addl_j)
                    fail(c, "required property '%.60s' is not allowed by %s", json_string_value(r), addl_kw);
                else
                    fail(c, "required property '%.60s' is not in properties, and other properties are off (strict)",
                         json_string_value(r));
                break;
            }
            all[na++] = (prop){.key = json_string_value(r), .schema = addl_schema ? addl_schema : json_true()};
        }
        all[j].required = true;
    }
    /* properties whose schema is false must be absent: excluded from additional names, never
     * emitted */
    prop *props = cv_xcalloc(cap, sizeof *props);
    size_t n = 0, n_req = 0;
    for (size_t i = 0; i < na && !c->failed; i++) {
        if (json_is_false(all[i].schema)) {
            if (all[i].required) fail(c, "required property '%.60s' has the schema false", all[i].key);
            continue;
        }
        n_req += all[i].required;
        props[n++] = all[i];
    }
    uint64_t count;
    if (!c->failed && get_count(c, s, "minProperties", &count) && count > n_req)
        fail(c, "unsupported keyword 'minProperties' (beyond the required properties)");
    if (!c->failed && get_count(c, s, "maxProperties", &count) && (addl != EXTRA_NONE || count < n))
        fail(c, "unsupported keyword 'maxProperties' (below the properties allowed)");
    for (size_t i = 0; i < n && !c->failed; i++) {
        bool declared = props_j && json_object_get(props_j, props[i].key) == props[i].schema;
        props[i].rule = declared ? gen_property(c, props[i].schema, "properties", props[i].key)
                        : addl_schema ? gen_property(c, addl_schema, addl_kw, NULL)
                                      : basic(c, CV_JR_VALUE, "value");
    }
    const char *addl_rule = NULL, *addl_key = NULL;
    if (!c->failed && addl != EXTRA_NONE) {
        addl_rule = addl_schema ? gen_property(c, addl_schema, addl_kw, NULL) : basic(c, CV_JR_VALUE, "value");
        addl_key = na ? gen_other_key(c, all, na) : basic(c, CV_JR_STRING, "string");
    }
    free(all);
    if (c->failed) {
        free(props);
        return false;
    }

    const char *w = ws_tok(c), *cm = comma(c), *cl = colon(c);
    size_t first_req = 0;
    while (first_req < n && !props[first_req].required) first_req++;
    size_t last_alt = first_req < n ? first_req : (n ? n - 1 : 0);
    /* The tails: tail[j] is Tj's expression with a leading space (empty when Tj is). T2..T(r+1) are
     * rules (two places use each); the tails after them are used once, so they are one inline run,
     * written front to back; T1 is inline too. */
    char **tail = cv_xcalloc(n + 2, sizeof *tail);
    size_t rules_to = last_alt + 1, run_from = rules_to >= 2 ? rules_to + 1 : 1;
    cv_text t = {0};
    for (size_t j = run_from; j < n; j++) put_member(&t, c, &props[j], true);
    if (addl_rule) cv_text_printf(&t, " (%s %s %s %s)*", cm, addl_key, cl, addl_rule);
    tail[run_from < n ? run_from : n] = cv_text_take(&t);
    bool ok = true;
    for (size_t j = (rules_to < n ? rules_to : n - 1); j >= 1 && j < run_from && ok; j--) {
        put_member(&t, c, &props[j], true);
        cv_text_put(&t, tail[j + 1]);
        if (j >= 2) {
            char *name = new_name(c);
            ok = add_rule(c, name, t.s + 1);
            cv_text_free(&t);
            tail[j] = cv_xasprintf(" %s", name);
            free(name);
        } else {
            tail[j] = cv_text_take(&t);
        }
    }
    alts a = {body, 0};
    if (ok && first_req == n) {
        alt_next(&a);
        cv_text_printf(body, "\"{\"%s \"}\"", w);
    }
    bool any = n > 0 || addl_rule;
    if (ok && any) {
        alt_next(&a);
        cv_text_printf(body, "\"{\"%s (", w);
        alts in = {body, 0};
        for (size_t i = 0; i < n && i <= first_req; i++) {
            alt_next(&in);
            put_member(body, c, &props[i], false);
            cv_text_put(body, tail[i + 1] ? tail[i + 1] : "");
        }
        if (first_req == n && addl_rule) {
            alt_next(&in);
            cv_text_printf(body, "%s %s %s%s", addl_key, cl, addl_rule, tail[n]);
        }
        cv_text_printf(body, ")%s \"}\"", w);
    }
    for (size_t j = 0; j <= n + 1; j++) free(tail[j]);
    free(tail);
    free(props);
    return ok;
}

/* "(" x ")" repeated lo..hi times (hi UINT64_MAX: unbounded), or nothing when hi is 0. */
static void put_repeat(cv_text *t, const char *x, uint64_t lo, uint64_t hi) {
    if (hi == 0) return;
    cv_text_printf(t, " (%s)", x);
    if (hi == UINT64_MAX && lo <= 1)
        cv_text_put(t, lo ? "+" : "*");
    else if (hi == UINT64_MAX)
        cv_text_printf(t, "{%llu,}", (unsigned long long)lo);
    else if (lo == 0 && hi == 1)
        cv_text_put(t, "?");
    else if (lo == hi && lo > 1)
        cv_text_printf(t, "{%llu}", (unsigned long long)lo);
    else if (lo != hi)
        cv_text_printf(t, "{%llu,%llu}", (unsigned long long)lo, (unsigned long long)hi);
}

/* Arrays: prefix items I0..Ik-1 (prefixItems, or items as an array in draft 7), then items of the
 * rest schema R, with minItems m and maxItems M:
 *
 *   array ::= "[" ws "]"                                          (m = 0)
 *           | "[" ws I0 T1 ws "]"       Tj ::= "," Ij T(j+1)  (optional when j >= m)
 *                                       Tk ::= ("," R){max(m-k,0), M-k}
 *           | "[" ws R ("," R){max(m-1,0), M-1} ws "]"            (k = 0) */
static bool gen_array(conv *c, json_t *s, cv_text *body) {
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    json_t *rest_j;
    const char *prefix_kw = "prefixItems", *rest_kw;
    if (prefix) {
        rest_j = items;
        rest_kw = "items";
    } else if (json_is_array(items)) {
        prefix = items;
        prefix_kw = "items";
        rest_j = json_object_get(s, "additionalItems");
        rest_kw = "additionalItems";
    } else {
        rest_j = items;
        rest_kw = "items";
    }
    if (!rest_j && (rest_j = json_object_get(s, "unevaluatedItems"))) rest_kw = "unevaluatedItems";
    if (prefix && !json_is_array(prefix)) return fail(c, "'%s' must be an array", prefix_kw), false;
    json_t *rest_schema;
    extra rest = get_extra(rest_j, &rest_schema);
    /* strict, as for properties: a tuple takes no items beyond the listed ones unless it says so */
    if (!rest_j && prefix && c->strict) rest = EXTRA_NONE;
    size_t k = prefix ? json_array_size(prefix) : 0;
    for (size_t i = 0; i < k; i++)
        if (json_is_false(json_array_get(prefix, i))) {
            k = i; /* no item can stand at i: the array ends before it */
            rest = EXTRA_NONE;
        }
    uint64_t m = 0, M = UINT64_MAX;
    get_count(c, s, "minItems", &m);
    get_count(c, s, "maxItems", &M);
    if (c->failed) return false;
    if (rest == EXTRA_NONE && M > k) M = k;
    if (m > M) return fail(c, "minItems exceeds the items the schema allows"), false;
    json_t *uniq = json_object_get(s, "uniqueItems");
    if (json_is_true(uniq) && M > 1) return fail(c, "unsupported keyword 'uniqueItems'"), false;

    const char **rules = cv_xcalloc(k + 1, sizeof *rules);
    for (size_t i = 0; i < k && i < M && !c->failed; i++) {
        size_t saved = ptr_push(c, prefix_kw);
        ptr_push_index(c, i);
        rules[i] = gen_guarded(c, json_array_get(prefix, i));
        ptr_pop(c, saved);
    }
    const char *rest_rule = NULL;
    if (!c->failed && rest != EXTRA_NONE && M > k)
        rest_rule = rest_schema ? gen_property(c, rest_schema, rest_kw, NULL) : basic(c, CV_JR_VALUE, "value");
    if (c->failed) {
        free(rules);
        return false;
    }
    const char *w = ws_tok(c), *cm = comma(c);
    alts a = {body, 0};
    if (m == 0) {
        alt_next(&a);
        cv_text_printf(body, "\"[\"%s \"]\"", w);
    }
    bool ok = true;
    /* the rest's count after the first item (k = 0) or after the prefix */
    uint64_t r_lo = k ? (m > k ? m - k : 0) : (m ? m - 1 : 0);
    uint64_t r_hi = M == UINT64_MAX ? M : k ? (M > k ? M - k : 0) : M - 1;
    if (M >= 1 && !fit_counts(c, "minItems", &r_lo, &r_hi)) ok = false;
    char *rest_item = cv_xasprintf("%s %s", cm, rest_rule ? rest_rule : "");
    if (ok && M >= 1 && k == 0) {
        alt_next(&a);
        cv_text_printf(body, "\"[\"%s %s", w, rest_rule);
        put_repeat(body, rest_item, r_lo, r_hi);
        cv_text_printf(body, "%s \"]\"", w);
    } else if (ok && M >= 1) {
        /* the optional tails (from item max(m, 1) on) are rules, built from the end; the required
         * items before them are one run */
        size_t K = k < M ? k : (size_t)M, req = m < K ? (size_t)m : K;
        cv_text t = {0};
        if (rest_rule) put_repeat(&t, rest_item, r_lo, r_hi);
        char *after = cv_text_take(&t);
        for (size_t j = K; j-- > (req > 1 ? req : 1) && ok;) {
            cv_text_printf(&t, "(%s %s%s)?", cm, rules[j], after);
            char *name = new_name(c);
            ok = add_rule(c, name, t.s);
            cv_text_free(&t);
            free(after);
            after = cv_xasprintf(" %s", name);
            free(name);
        }
        if (ok) {
            alt_next(&a);
            cv_text_printf(body, "\"[\"%s %s", w, rules[0]);
            for (size_t j = 1; j < req; j++) cv_text_printf(body, " %s %s", cm, rules[j]);
            cv_text_printf(body, "%s%s \"]\"", after, w);
        }
        free(after);
    }
    free(rest_item);
    free(rules);
    return ok;
}

/* ---- schemas ------------------------------------------------------------------------------------------- */

static bool gen_types(conv *c, json_t *s, cv_text *body) {
    unsigned types;
    if (!get_types(c, s, &types)) return false;
    if (types & T_NUMBER) types &= ~(unsigned)T_INTEGER;
    /* no keyword narrows any type: the shared rules say it all */
    bool plain_object = !first_of(s, object_kw), plain_array = !first_of(s, array_kw);
    if (types == (T_ALL & ~(unsigned)T_INTEGER) && plain_object && plain_array && !first_of(s, string_kw) &&
        !first_of(s, number_kw)) {
        cv_text_put(body, basic(c, CV_JR_VALUE, "value"));
        return true;
    }
    if (plain_object && (types & T_OBJECT)) {
        types &= ~(unsigned)T_OBJECT;
        cv_text_put(body, basic(c, CV_JR_OBJECT, "object"));
        if (types) cv_text_put(body, " | ");
    }
    if (plain_array && (types & T_ARRAY)) {
        types &= ~(unsigned)T_ARRAY;
        cv_text_put(body, basic(c, CV_JR_ARRAY, "array"));
        if (types) cv_text_put(body, " | ");
    }
    alts a = {body, 0};
    bool ok = true;
    if (ok && (types & T_OBJECT)) alt_next(&a), ok = gen_object(c, s, body);
    if (ok && (types & T_ARRAY)) alt_next(&a), ok = gen_array(c, s, body);
    if (ok && (types & T_STRING)) alt_next(&a), ok = gen_string(c, s, body);
    if (ok && (types & T_NUMBER)) alt_next(&a), ok = gen_number(c, s, false, body);
    if (ok && (types & T_INTEGER)) alt_next(&a), ok = gen_number(c, s, true, body);
    if (ok && (types & T_BOOLEAN)) alt_next(&a), cv_text_put(body, basic(c, CV_JR_BOOLEAN, "boolean"));
    if (ok && (types & T_NULL)) alt_next(&a), cv_text_put(body, basic(c, CV_JR_NULL, "null"));
    return ok;
}

/* A schema's alternatives (s is an object): applicators first, then enum / const, then types. */
static bool gen_body(conv *c, json_t *s, cv_text *body) {
    const char *k;
    json_t *x;
    /* inlining a shared $ref beside other keywords copies it: bound the copies, not just the depth */
    if (++c->work > MAX_WORK) return fail(c, "schema too large (more than %d schemas to convert)", MAX_WORK), false;
    json_object_foreach(s, k, x) {
        if (in_list(k, kw_unsupported))
            return fail(c, "unsupported keyword '%s'", k), false;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return fail(c, "'$ref' must be a string"), false;
        static const char *const except[] = {"$ref", NULL};
        if (!siblings(c, s, except)) {
            const char *name = gen_ref(c, json_string_value(ref));
            if (name) cv_text_put(body, name);
            return name != NULL;
        }
        json_t *merged = inline_ref(c, s);
        return merged && gen_body(c, merged, body);
    }
    json_t *all = json_object_get(s, "allOf");
    if (all) {
        if (!json_is_array(all) || !json_array_size(all)) return fail(c, "'allOf' must be a non-empty array"), false;
        static const char *const except[] = {"allOf", NULL};
        json_t *acc = siblings(c, s, except);
        for (size_t i = 0; i < json_array_size(all) && !c->failed; i++) {
            json_t *item = json_array_get(all, i);
            if (!acc) {
                acc = item;
                continue;
            }
            json_t *l = inline_ref(c, acc), *r = l ? inline_ref(c, item) : NULL;
            acc = r ? merge(c, l, r) : NULL;
        }
        if (c->failed) return false;
        size_t saved = ptr_push(c, "allOf");
        const char *name = gen_schema(c, acc);
        ptr_pop(c, saved);
        if (name) cv_text_put(body, name);
        return name != NULL;
    }
    json_t *any = json_object_get(s, "anyOf");
    const char *any_kw = "anyOf";
    json_t *one = json_object_get(s, "oneOf");
    if (any && one) return fail(c, "'anyOf' together with 'oneOf' is not supported"), false;
    if (one) { /* treated as anyOf, as xgrammar does: outputs valid for several branches pass too */
        any = one;
        any_kw = "oneOf";
    }
    if (any) {
        if (!json_is_array(any) || !json_array_size(any))
            return fail(c, "'%s' must be a non-empty array", any_kw), false;
        static const char *const except[] = {"anyOf", "oneOf", NULL};
        json_t *sib = siblings(c, s, except);
        alts a = {body, 0};
        smap seen = {0};
        for (size_t i = 0; i < json_array_size(any) && !c->failed; i++) {
            json_t *branch = json_array_get(any, i);
            if (json_is_false(branch)) continue;
            size_t saved = ptr_push(c, any_kw);
            ptr_push_index(c, i);
            json_t *b = sib ? merge(c, sib, branch) : branch;
            const char *name = b ? gen_schema(c, b) : NULL;
            ptr_pop(c, saved);
            if (name && !smap_get(&seen, name)) {
                alt_next(&a);
                cv_text_put(body, name);
                smap_put(&seen, cv_xstrdup(name), cv_xstrdup(""));
            }
        }
        smap_free(&seen);
        if (!c->failed && !a.n) fail(c, "no branch of '%s' accepts anything", any_kw);
        return !c->failed;
    }
    if (json_object_get(s, "enum") || json_object_get(s, "const")) return gen_enum(c, s, body);
    return gen_types(c, s, body);
}

static const char *gen_schema(conv *c, json_t *s) {
    if (c->failed) return NULL;
    if (json_is_true(s)) return basic(c, CV_JR_VALUE, "value");
    if (json_is_false(s)) return fail(c, "the schema false accepts nothing");
    if (!json_is_object(s)) return fail(c, "a schema must be an object or a boolean");
    if (c->depth >= MAX_DEPTH) return fail(c, "schema too deep (more than %d levels)", MAX_DEPTH);
    c->depth++;
    cv_text body = {0};
    bool ok = gen_body(c, s, &body);
    c->depth--;
    const char *name = NULL;
    if (ok && body.len > MAX_EBNF)
        fail(c, "schema too large (its grammar passes %u bytes)", MAX_EBNF);
    else if (ok)
        name = intern(c, body.s);
    cv_text_free(&body);
    return name;
}

char *cv_json_schema_to_ebnf(const char *schema, size_t len, const cv_json_options *o, char *err, size_t err_len) {
    cv_json_options def = {.any_whitespace = true};
    if (!o) o = &def;
    if (err_len) err[0] = 0;
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!root) {
        if (err_len)
            snprintf(err, err_len, "not JSON: %s at line %d column %d", je.text, je.line, je.column);
        return NULL;
    }
    conv c = {.root = root, .strict = o->strict_additional_properties, .err = err, .err_len = err_len};
    c.keep = json_array();
    cv_text ws = {0};
    const char *ws_body = NULL;
    c.failed = !cv_json_ws_rule(o, &ws, &ws_body, err, err_len);
    c.ws = ws_body != NULL;

    /* the root is the reference "#", so that "$ref": "#" finds its rule */
    if (!c.failed) {
        c.refs = cv_xmalloc(sizeof *c.refs);
        c.cap_refs = 1;
        c.refs[c.n_refs++] = (ref_entry){.ptr = cv_xstrdup(""), .name = cv_xstrdup("root"), .open = true};
        c.n_open = 1;
        cv_text body = {0};
        bool ok;
        if (json_is_true(root))
            ok = (cv_text_put(&body, basic(&c, CV_JR_VALUE, "value")), true);
        else if (json_is_false(root))
            ok = fail(&c, "the schema false accepts nothing") != NULL;
        else if (!json_is_object(root))
            ok = fail(&c, "a schema must be an object or a boolean") != NULL;
        else
            ok = gen_body(&c, root, &body);
        if (ok) add_rule(&c, "root", body.s);
        cv_text_free(&body);
    }
    char *out = NULL;
    if (!c.failed) {
        cv_text t = {0};
        cv_text_putn(&t, c.rules.s, c.rules.len);
        cv_json_rules(&t, c.basic, ws_body);
        out = cv_text_take(&t);
    }
    cv_text_free(&ws);
    cv_text_free(&c.rules);
    cv_text_free(&c.ptr);
    for (size_t i = 0; i < c.n_refs; i++) {
        free(c.refs[i].ptr);
        free(c.refs[i].name);
    }
    free(c.refs);
    smap_free(&c.bodies);
    json_decref(c.keep);
    json_decref(root);
    return out;
}
