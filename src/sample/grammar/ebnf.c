/*
 * ebnf.c — GBNF text → cv_grammar (the syntax is in grammar.h).
 *
 * One recursive-descent pass builds rules directly; everything that is not a plain sequence becomes
 * a helper rule, so the automaton only knows byte sets, rule references and alternative ends:
 *   - a literal is one byte-set element per UTF-8 byte;
 *   - a character class (and `.`) is a set of code-point ranges, split into UTF-8 byte-range
 *     sequences (the classic splitting: by encoded length, then until every byte position is a plain
 *     range) and laid out as a byte trie, so that at most one alternative survives each byte; a class
 *     of ASCII only is a single byte-set element. Surrogates are never in a class, so only
 *     well-formed UTF-8 matches one;
 *   - x* is S ::= x S | "" — the reference to S is last in its alternative, and the matcher does not
 *     push a return for a last reference (a tail call), so a long run keeps the stack flat;
 *     x+ is x S, x? is O ::= x | "", and x{m,n} is m copies of x then n-m nested optionals
 *     (O_k ::= x O_k-1 | ""), which is linear in n;
 *   - a group of several alternatives is a helper rule; a group of one is inlined.
 * Rules are separated by lookahead: a sequence ends where `name ::=` starts (newlines are ordinary
 * white space, as in xgrammar; a grammar that llama.cpp reads reads the same way here).
 *
 * After parsing: every referenced rule must be defined and "root" must exist; then left recursion is
 * refused. The matcher expands a rule's alternatives when a byte needs them, remembering which
 * (rule, return) pairs it expanded in that step, so a cycle of expansions through nullable prefixes
 * that returns to the same place (x* with x nullable) ends by itself. A cycle that pushes a return on
 * the way (a ::= a "x", or a ::= b "x" with b ::= a?) would grow the stack forever: those are found
 * as "left-corner" edges (r → s where s can start r after nullable elements; "grows" unless s is the
 * last element) inside one strongly connected component, and refused naming the rule.
 *
 * Limits, refused with a message naming the place, never built slowly:
 *   100,000 rules and 500,000 elements after expansion (helpers included), repetition bounds up to
 *   10,000, groups nested 256 deep.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/error.h"
#include "base/utf8.h"
#include "sample/grammar/grammar_internal.h"

#define MAX_RULES 100000u
#define MAX_ELEMS 500000u
#define MAX_REPEAT 10000u
#define MAX_NESTING 256

/* ---- growing arrays --------------------------------------------------------------------------------- */

typedef struct u32vec {
    uint32_t *v;
    uint32_t n, cap;
} u32vec;

static void u32_push(u32vec *a, uint32_t x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 8;
        a->v = cv_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = x;
}

typedef struct altvec {
    u32vec *v;
    uint32_t n, cap;
} altvec;

static void alt_push(altvec *a, u32vec seq) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 4;
        a->v = cv_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = seq;
}

static void altvec_free(altvec *a) {
    for (uint32_t i = 0; i < a->n; i++) free(a->v[i].v);
    free(a->v);
    *a = (altvec){0};
}

/* ---- the parser's state ---------------------------------------------------------------------------- */

typedef struct brule {
    char *name;               /* NULL for a helper */
    uint32_t origin;          /* the user rule a helper was made for (itself for a user rule) */
    altvec body;
    bool defined;
    size_t ref_off, def_off;  /* first reference, definition (text offsets) */
} brule;

typedef struct class_entry {
    uint64_t hash;
    uint32_t *ranges;         /* lo, hi pairs */
    uint32_t n, rule;
} class_entry;

typedef struct parser {
    const char *s;
    size_t len, i;
    char *err;
    size_t err_len;
    bool failed;
    int depth;
    uint32_t cur_rule;        /* the user rule being defined */

    brule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *name_slots;     /* rule id + 1, by name */
    uint32_t name_mask;
    uint64_t n_elems;

    cv_byteset *sets;
    uint32_t n_sets, cap_sets;
    uint32_t *set_slots;      /* set index + 1, by content */
    uint32_t set_mask;
    uint32_t byte_set[256];   /* the one-byte set of each byte, UINT32_MAX until made */

    class_entry *classes;     /* the non-ASCII classes made so far, by content */
    uint32_t n_classes, cap_classes;
    uint32_t *class_slots;    /* class index + 1, by hash */
    uint32_t class_mask;
} parser;

static void fail(parser *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void fail(parser *p, size_t off, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = true;
    if (!p->err || !p->err_len) return;
    int line = 1, col = 1;
    for (size_t k = 0; k < off && k < p->len; k++) {
        unsigned char c = (unsigned char)p->s[k];
        if (c == '\n') {
            line++;
            col = 1;
        } else if ((c & 0xC0) != 0x80) {
            col++;  /* columns count characters, not UTF-8 continuation bytes */
        }
    }
    int n = snprintf(p->err, p->err_len, "line %d col %d: ", line, col);
    if (n < 0 || (size_t)n >= p->err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + n, p->err_len - (size_t)n, fmt, ap);
    va_end(ap);
}

static int line_of(const parser *p, size_t off) {
    int line = 1;
    for (size_t k = 0; k < off && k < p->len; k++) line += p->s[k] == '\n';
    return line;
}

static int peek_at(const parser *p, size_t k) {
    return k < p->len ? (unsigned char)p->s[k] : -1;
}

static int peek(const parser *p) {
    return peek_at(p, p->i);
}

static bool is_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* White space and comments, newlines included. */
static size_t skip_ws_from(const parser *p, size_t k) {
    for (;;) {
        int c = peek_at(p, k);
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            k++;
        } else if (c == '#') {
            while (k < p->len && p->s[k] != '\n') k++;
        } else {
            return k;
        }
    }
}

static void skip_ws(parser *p) {
    p->i = skip_ws_from(p, p->i);
}

static size_t name_end(const parser *p, size_t k) {
    while (is_name_char(peek_at(p, k))) k++;
    return k;
}

/* `name ::=` starts at k: the current sequence ends here. */
static bool starts_rule(const parser *p, size_t k) {
    size_t e = name_end(p, k);
    if (e == k) return false;
    e = skip_ws_from(p, e);
    return e + 3 <= p->len && memcmp(p->s + e, "::=", 3) == 0;
}

/* Counts n elements against the limit; false once the grammar is too large. */
static bool count_elems(parser *p, uint64_t n) {
    p->n_elems += n;
    if (p->n_elems > MAX_ELEMS) fail(p, p->i, "grammar too large: more than %u elements after expansion", MAX_ELEMS);
    return !p->failed;
}

static bool add_elem(parser *p, u32vec *seq, uint32_t e) {
    if (!count_elems(p, 1)) return false;
    u32_push(seq, e);
    return true;
}

/* ---- rules ------------------------------------------------------------------------------------------ */

static uint32_t new_rule(parser *p, char *name) {
    if (p->n_rules >= MAX_RULES) {
        fail(p, p->i, "grammar too large: more than %u rules after expansion", MAX_RULES);
        free(name);
        return 0;
    }
    if (p->n_rules == p->cap_rules) {
        p->cap_rules = p->cap_rules ? p->cap_rules * 2 : 64;
        p->rules = cv_xrealloc(p->rules, p->cap_rules * sizeof *p->rules);
    }
    uint32_t id = p->n_rules++;
    p->rules[id] = (brule){.name = name, .origin = name ? id : p->cur_rule};
    return id;
}

/* A helper rule with the given alternatives (taken over), its END elements counted. */
static uint32_t helper_rule(parser *p, altvec *alts) {
    uint32_t id = new_rule(p, NULL);
    if (p->failed) {
        altvec_free(alts);
        return 0;
    }
    count_elems(p, alts->n);
    p->rules[id].body = *alts;
    p->rules[id].defined = true;
    *alts = (altvec){0};
    return id;
}

static void grow_name_table(parser *p) {
    uint32_t n_slots = p->name_mask ? (p->name_mask + 1) * 2 : 256;
    free(p->name_slots);
    p->name_slots = cv_xcalloc(n_slots, sizeof *p->name_slots);
    p->name_mask = n_slots - 1;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        if (!p->rules[r].name) continue;
        uint32_t h = (uint32_t)XXH3_64bits(p->rules[r].name, strlen(p->rules[r].name)) & p->name_mask;
        while (p->name_slots[h]) h = (h + 1) & p->name_mask;
        p->name_slots[h] = r + 1;
    }
}

/* The user rule called s[off .. off + n), made (undefined) on first sight. */
static uint32_t named_rule(parser *p, size_t off, size_t n) {
    if (!p->name_mask) grow_name_table(p);
    uint32_t h = (uint32_t)XXH3_64bits(p->s + off, n) & p->name_mask;
    for (; p->name_slots[h]; h = (h + 1) & p->name_mask) {
        brule *r = &p->rules[p->name_slots[h] - 1];
        if (r->name && strlen(r->name) == n && memcmp(r->name, p->s + off, n) == 0) return p->name_slots[h] - 1;
    }
    uint32_t id = new_rule(p, cv_xstrndup(p->s + off, n));
    if (p->failed) return 0;
    p->rules[id].ref_off = off;
    p->name_slots[h] = id + 1;
    if ((uint64_t)p->n_rules * 2 > p->name_mask) grow_name_table(p);
    return id;
}

/* ---- byte sets ---------------------------------------------------------------------------------------- */

static uint32_t intern_set(parser *p, const cv_byteset *set) {
    if ((uint64_t)p->n_sets * 2 >= p->set_mask) {
        uint32_t n_slots = p->set_mask ? (p->set_mask + 1) * 2 : 512;
        free(p->set_slots);
        p->set_slots = cv_xcalloc(n_slots, sizeof *p->set_slots);
        p->set_mask = n_slots - 1;
        for (uint32_t k = 0; k < p->n_sets; k++) {
            uint32_t h = (uint32_t)XXH3_64bits(&p->sets[k], sizeof *set) & p->set_mask;
            while (p->set_slots[h]) h = (h + 1) & p->set_mask;
            p->set_slots[h] = k + 1;
        }
    }
    uint32_t h = (uint32_t)XXH3_64bits(set, sizeof *set) & p->set_mask;
    for (; p->set_slots[h]; h = (h + 1) & p->set_mask)
        if (memcmp(&p->sets[p->set_slots[h] - 1], set, sizeof *set) == 0) return p->set_slots[h] - 1;
    if (p->n_sets == p->cap_sets) {
        p->cap_sets = p->cap_sets ? p->cap_sets * 2 : 64;
        p->sets = cv_xrealloc(p->sets, p->cap_sets * sizeof *p->sets);
    }
    p->sets[p->n_sets] = *set;
    p->set_slots[h] = ++p->n_sets;
    return p->n_sets - 1;
}

static uint32_t range_set(parser *p, unsigned lo, unsigned hi) {
    cv_byteset set = {0};
    for (unsigned b = lo; b <= hi; b++) set.w[b >> 5] |= 1u << (b & 31);
    return intern_set(p, &set);
}

static uint32_t byte_elem(parser *p, uint8_t b) {
    if (p->byte_set[b] == UINT32_MAX) p->byte_set[b] = range_set(p, b, b);
    return CV_GE(CV_GE_BYTES, p->byte_set[b]);
}

/* ---- characters ----------------------------------------------------------------------------------- */

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (raw UTF-8 or an escape) at p->i. `what` names the construct
 * for the unterminated case; `open` is where it began. */
static bool parse_char(parser *p, uint32_t *cp, const char *what, size_t open) {
    int c = peek(p);
    if (c < 0 || c == '\n' || c == '\r') {
        fail(p, open, "unterminated %s", what);
        return false;
    }
    if (c != '\\') {
        size_t n;
        if (cv_utf8_decode(p->s + p->i, p->len - p->i, cp, &n) != CV_UTF8_OK) {
            fail(p, p->i, "invalid UTF-8 in the grammar text");
            return false;
        }
        p->i += n;
        return true;
    }
    size_t at = p->i;
    int e = peek_at(p, at + 1);
    int digits = 0;
    switch (e) {
    case 'n': *cp = '\n'; break;
    case 'r': *cp = '\r'; break;
    case 't': *cp = '\t'; break;
    case '\\': case '"': case '\'': case '[': case ']': *cp = (uint32_t)e; break;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    case -1: case '\n': case '\r':
        fail(p, open, "unterminated %s", what);
        return false;
    default:
        if (e >= 0x20 && e < 0x7F)
            fail(p, at, "bad escape '\\%c'", e);
        else
            fail(p, at, "bad escape: '\\' before byte 0x%02X", (unsigned)e);
        return false;
    }
    if (!digits) {
        p->i = at + 2;
        return true;
    }
    uint64_t v = 0;
    for (int k = 0; k < digits; k++) {
        int h = hex_value(peek_at(p, at + 2 + (size_t)k));
        if (h < 0) {
            fail(p, at, "bad escape '\\%c': expected %d hex digits", e, digits);
            return false;
        }
        v = v * 16 + (uint64_t)h;
    }
    if (v > 0x10FFFF) {
        fail(p, at, "bad escape '%.*s': above U+10FFFF", digits + 2, p->s + at);
        return false;
    }
    if (v >= 0xD800 && v <= 0xDFFF) {
        fail(p, at, "bad escape '%.*s': a surrogate is not a character", digits + 2, p->s + at);
        return false;
    }
    *cp = (uint32_t)v;
    p->i = at + 2 + (size_t)digits;
    return true;
}

static void parse_literal(parser *p, u32vec *frag) {
    size_t open = p->i++;
    while (!p->failed) {
        if (peek(p) == '"') {
            p->i++;
            return;
        }
        uint32_t cp;
        if (!parse_char(p, &cp, "literal", open)) return;
        char buf[4];
        size_t n = cv_utf8_encode(cp, buf);
        for (size_t k = 0; k < n; k++)
            if (!add_elem(p, frag, byte_elem(p, (uint8_t)buf[k]))) return;
    }
}

/* ---- character classes ------------------------------------------------------------------------------- */

typedef struct range_list {
    uint32_t *v;              /* lo, hi pairs */
    uint32_t n, cap;          /* n counts pairs */
} range_list;

static void range_add(range_list *r, uint32_t lo, uint32_t hi) {
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 8;
        r->v = cv_xrealloc(r->v, 2 * r->cap * sizeof *r->v);
    }
    r->v[2 * r->n] = lo;
    r->v[2 * r->n + 1] = hi;
    r->n++;
}

static int cmp_range(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Sorted, merged, complemented when negated, surrogates removed: the class's scalar values. */
static void normalize_ranges(range_list *r, bool negate) {
    qsort(r->v, r->n, 2 * sizeof *r->v, cmp_range);
    uint32_t m = 0;
    for (uint32_t k = 0; k < r->n; k++) {
        uint32_t lo = r->v[2 * k], hi = r->v[2 * k + 1];
        if (m && lo <= r->v[2 * m - 1] + 1) {
            if (hi > r->v[2 * m - 1]) r->v[2 * m - 1] = hi;
        } else {
            r->v[2 * m] = lo;
            r->v[2 * m + 1] = hi;
            m++;
        }
    }
    r->n = m;
    range_list out = {0};
    if (negate) {
        uint32_t next = 0;
        for (uint32_t k = 0; k < r->n; k++) {
            if (r->v[2 * k] > next) range_add(&out, next, r->v[2 * k] - 1);
            next = r->v[2 * k + 1] + 1;
        }
        if (next <= 0x10FFFF) range_add(&out, next, 0x10FFFF);
        free(r->v);
        *r = out;
        out = (range_list){0};
    }
    for (uint32_t k = 0; k < r->n; k++) {
        uint32_t lo = r->v[2 * k], hi = r->v[2 * k + 1];
        if (hi < 0xD800 || lo > 0xDFFF) {
            range_add(&out, lo, hi);
            continue;
        }
        if (lo < 0xD800) range_add(&out, lo, 0xD7FF);
        if (hi > 0xDFFF) range_add(&out, 0xE000, hi);
    }
    free(r->v);
    *r = out;
}

/* A UTF-8 byte-range sequence: byte k lies in [lo[k], hi[k]]. */
typedef struct u8seq {
    uint8_t lo[4], hi[4];
    uint8_t len;
} u8seq;

typedef struct seq_list {
    u8seq *v;
    size_t n, cap;
} seq_list;

/* [lo, hi] within one encoded length, split until each byte position is an independent range. */
static void split_same_length(uint32_t lo, uint32_t hi, seq_list *out) {
    char a[4], b[4];
    size_t len = cv_utf8_encode(lo, a);
    assert(len >= 1 && len <= 4);
    for (size_t k = 1; k < len; k++) {
        uint32_t m = (1u << (6 * k)) - 1;  /* the low k continuation bytes */
        if ((lo & ~m) == (hi & ~m)) continue;
        if (lo & m) {
            split_same_length(lo, lo | m, out);
            split_same_length((lo | m) + 1, hi, out);
            return;
        }
        if ((hi & m) != m) {
            split_same_length(lo, (hi & ~m) - 1, out);
            split_same_length(hi & ~m, hi, out);
            return;
        }
    }
    cv_utf8_encode(hi, b);
    if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 16;
        out->v = cv_xrealloc(out->v, out->cap * sizeof *out->v);
    }
    u8seq *s = &out->v[out->n++];
    s->len = (uint8_t)len;
    for (size_t k = 0; k < len; k++) {
        s->lo[k] = (uint8_t)a[k];
        s->hi[k] = (uint8_t)b[k];
    }
}

static void split_range(uint32_t lo, uint32_t hi, seq_list *out) {
    static const uint32_t band_end[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    uint32_t start = 0;
    for (size_t k = 0; k < CV_ARRAY_LEN(band_end); k++) {
        uint32_t a = lo > start ? lo : start, b = hi < band_end[k] ? hi : band_end[k];
        if (a <= b) split_same_length(a, b, out);
        start = band_end[k] + 1;
    }
}

static bool same_range(const u8seq *a, const u8seq *b, int k) {
    return a->lo[k] == b->lo[k] && a->hi[k] == b->hi[k];
}

/* A rule matching seqs[0 .. n) from byte k on, as a byte trie: sequences agreeing on byte k share
 * one alternative, and all sequences ending at byte k share one byte set. */
static uint32_t seq_rule(parser *p, const u8seq *seqs, size_t n, int k) {
    assert(k >= 0 && k < 4);
    altvec alts = {0};
    cv_byteset last = {0};
    bool any_last = false;
    for (size_t i = 0; i < n && !p->failed;) {
        size_t j = i + 1;
        while (j < n && same_range(&seqs[i], &seqs[j], k)) j++;
        if (seqs[i].len == k + 1) {
            for (unsigned b = seqs[i].lo[k]; b <= seqs[i].hi[k]; b++) last.w[b >> 5] |= 1u << (b & 31);
            any_last = true;
        } else {
            u32vec alt = {0};
            add_elem(p, &alt, CV_GE(CV_GE_BYTES, range_set(p, seqs[i].lo[k], seqs[i].hi[k])));
            if (j - i == 1) {
                int len = seqs[i].len;
                assert(len <= 4);
                for (int q = k + 1; q < len; q++)
                    add_elem(p, &alt, CV_GE(CV_GE_BYTES, range_set(p, seqs[i].lo[q], seqs[i].hi[q])));
            } else {
                add_elem(p, &alt, CV_GE(CV_GE_REF, seq_rule(p, seqs + i, j - i, k + 1)));
            }
            alt_push(&alts, alt);
        }
        i = j;
    }
    if (any_last) {
        u32vec alt = {0};
        add_elem(p, &alt, CV_GE(CV_GE_BYTES, intern_set(p, &last)));
        alt_push(&alts, alt);
    }
    return helper_rule(p, &alts);
}

/* The element for a class (normalized ranges): one byte set when all of it is ASCII, else a
 * reference to its byte-trie rule, shared by every class with the same ranges. */
static uint32_t class_elem(parser *p, range_list *r) {
    if (r->n == 0) return CV_GE(CV_GE_BYTES, intern_set(p, &(cv_byteset){{0}}));
    if (r->v[2 * r->n - 1] < 0x80) {
        cv_byteset set = {0};
        for (uint32_t k = 0; k < r->n; k++)
            for (uint32_t b = r->v[2 * k]; b <= r->v[2 * k + 1]; b++) set.w[b >> 5] |= 1u << (b & 31);
        return CV_GE(CV_GE_BYTES, intern_set(p, &set));
    }
    uint64_t h = XXH3_64bits(r->v, 2 * r->n * sizeof *r->v);
    if ((uint64_t)(p->n_classes + 1) * 2 > (uint64_t)p->class_mask + 1) {
        uint32_t n_slots = p->class_mask ? (p->class_mask + 1) * 2 : 64;
        free(p->class_slots);
        p->class_slots = cv_xcalloc(n_slots, sizeof *p->class_slots);
        p->class_mask = n_slots - 1;
        for (uint32_t c = 0; c < p->n_classes; c++) {
            uint32_t at = (uint32_t)p->classes[c].hash & p->class_mask;
            while (p->class_slots[at]) at = (at + 1) & p->class_mask;
            p->class_slots[at] = c + 1;
        }
    }
    uint32_t at = (uint32_t)h & p->class_mask;
    for (; p->class_slots[at]; at = (at + 1) & p->class_mask) {
        const class_entry *e = &p->classes[p->class_slots[at] - 1];
        if (e->hash == h && e->n == r->n && memcmp(e->ranges, r->v, 2 * r->n * sizeof *r->v) == 0)
            return CV_GE(CV_GE_REF, e->rule);
    }
    seq_list seqs = {0};
    for (uint32_t k = 0; k < r->n; k++) split_range(r->v[2 * k], r->v[2 * k + 1], &seqs);
    uint32_t rule = seq_rule(p, seqs.v, seqs.n, 0);
    free(seqs.v);
    if (p->n_classes == p->cap_classes) {
        p->cap_classes = p->cap_classes ? p->cap_classes * 2 : 16;
        p->classes = cv_xrealloc(p->classes, p->cap_classes * sizeof *p->classes);
    }
    p->classes[p->n_classes++] = (class_entry){.hash = h, .ranges = r->v, .n = r->n, .rule = rule};
    p->class_slots[at] = p->n_classes;
    *r = (range_list){0};
    return CV_GE(CV_GE_REF, rule);
}

static void parse_class(parser *p, u32vec *frag) {
    size_t open = p->i++;
    bool negate = false;
    if (peek(p) == '^') {
        negate = true;
        p->i++;
    }
    range_list r = {0};
    bool empty = true;
    while (!p->failed && peek(p) != ']') {
        size_t item = p->i;
        uint32_t lo, hi;
        if (!parse_char(p, &lo, "character class", open)) break;
        hi = lo;
        if (peek(p) == '-' && peek_at(p, p->i + 1) != ']' && peek_at(p, p->i + 1) >= 0) {
            p->i++;
            if (!parse_char(p, &hi, "character class", open)) break;
            if (hi < lo) {
                fail(p, item, "bad range '%.*s' in character class: its end is below its start",
                     (int)(p->i - item), p->s + item);
                break;
            }
        }
        range_add(&r, lo, hi);
        empty = false;
    }
    if (!p->failed && empty) fail(p, open, "empty character class");
    if (!p->failed) {
        p->i++;
        normalize_ranges(&r, negate);
        add_elem(p, frag, class_elem(p, &r));
    }
    free(r.v);
}

/* ---- sequences and repetition ----------------------------------------------------------------------- */

static void parse_alternatives(parser *p, altvec *out);

/* frag as one element: itself when it is one, else a helper rule of that one alternative. */
static uint32_t single_elem(parser *p, u32vec *frag) {
    if (frag->n == 1) {
        uint32_t e = frag->v[0];
        frag->n = 0;
        return e;
    }
    altvec alts = {0};
    alt_push(&alts, *frag);
    *frag = (u32vec){0};
    return CV_GE(CV_GE_REF, helper_rule(p, &alts));
}

/* S ::= x S | "" */
static uint32_t star_rule(parser *p, uint32_t x) {
    uint32_t id = helper_rule(p, &(altvec){0});
    if (p->failed) return 0;
    u32vec loop = {0};
    add_elem(p, &loop, x);
    add_elem(p, &loop, CV_GE(CV_GE_REF, id));
    alt_push(&p->rules[id].body, loop);
    alt_push(&p->rules[id].body, (u32vec){0});
    count_elems(p, 2);
    return id;
}

/* O ::= x tail | "" (tail: a rule, or none) */
static uint32_t optional_rule(parser *p, uint32_t x, uint32_t tail, bool has_tail) {
    altvec alts = {0};
    u32vec some = {0};
    add_elem(p, &some, x);
    if (has_tail) add_elem(p, &some, CV_GE(CV_GE_REF, tail));
    alt_push(&alts, some);
    alt_push(&alts, (u32vec){0});
    return helper_rule(p, &alts);
}

static bool parse_bound(parser *p, uint32_t *v) {
    skip_ws(p);
    size_t at = p->i;
    uint64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (uint64_t)(peek(p) - '0');
        if (x > MAX_REPEAT) {
            while (peek(p) >= '0' && peek(p) <= '9') p->i++;
            fail(p, at, "repetition bound %.*s exceeds the limit of %u", (int)(p->i - at), p->s + at, MAX_REPEAT);
            return false;
        }
        p->i++;
    }
    if (p->i == at) {
        fail(p, at, "expected a number in repetition bounds");
        return false;
    }
    *v = (uint32_t)x;
    skip_ws(p);
    return true;
}

/* Applies the postfix operator at p->i to frag, which becomes the repetition's elements. */
static void apply_postfix(parser *p, u32vec *frag) {
    size_t at = p->i;
    int op = peek(p);
    p->i++;
    uint32_t m = 0, n = 0;
    bool unbounded = false;
    if (op == '*') {
        unbounded = true;
    } else if (op == '+') {
        m = 1;
        unbounded = true;
    } else if (op == '?') {
        n = 1;
    } else {
        if (!parse_bound(p, &m)) return;
        n = m;
        if (peek(p) == ',') {
            p->i++;
            skip_ws(p);
            if (peek(p) == '}') {
                unbounded = true;
            } else if (!parse_bound(p, &n)) {
                return;
            }
        }
        if (peek(p) != '}') {
            fail(p, p->i, "expected '}' to close the repetition bounds");
            return;
        }
        p->i++;
        if (!unbounded && n < m) {
            fail(p, at, "bad repetition bounds '%.*s': the maximum is below the minimum", (int)(p->i - at), p->s + at);
            return;
        }
        /* Known size up front: m copies, then a rule of 4 elements per optional level. */
        uint64_t need = (uint64_t)m + (unbounded ? 4 : 4 * (uint64_t)(n - m));
        if (p->n_elems + need > MAX_ELEMS) {
            fail(p, at, "grammar too large: repetition '%.*s' would pass %u elements after expansion",
                 (int)(p->i - at), p->s + at, MAX_ELEMS);
            return;
        }
        if ((uint64_t)p->n_rules + (n - m) + 1 > MAX_RULES) {
            fail(p, at, "grammar too large: repetition '%.*s' would pass %u rules after expansion",
                 (int)(p->i - at), p->s + at, MAX_RULES);
            return;
        }
    }
    uint32_t x = single_elem(p, frag);
    if (p->failed) return;
    for (uint32_t k = 0; k < m; k++)
        if (!add_elem(p, frag, x)) return;
    if (unbounded) {
        add_elem(p, frag, CV_GE(CV_GE_REF, star_rule(p, x)));
    } else if (n > m) {
        uint32_t opt = optional_rule(p, x, 0, false);
        for (uint32_t k = m + 1; k < n && !p->failed; k++) opt = optional_rule(p, x, opt, true);
        add_elem(p, frag, CV_GE(CV_GE_REF, opt));
    }
}

static void parse_atom(parser *p, u32vec *frag) {
    int c = peek(p);
    size_t at = p->i;
    if (c == '"') {
        parse_literal(p, frag);
    } else if (c == '[') {
        parse_class(p, frag);
    } else if (c == '.') {
        p->i++;
        range_list any = {0};
        range_add(&any, 0, 0x10FFFF);
        normalize_ranges(&any, false);
        add_elem(p, frag, class_elem(p, &any));
        free(any.v);
    } else if (c == '(') {
        if (p->depth >= MAX_NESTING) {
            fail(p, at, "groups nested deeper than %d", MAX_NESTING);
            return;
        }
        p->i++;
        p->depth++;
        altvec alts = {0};
        parse_alternatives(p, &alts);
        p->depth--;
        if (!p->failed && peek(p) != ')')
            fail(p, p->i, "expected ')' to close the group opened on line %d", line_of(p, at));
        if (p->failed) {
            altvec_free(&alts);
            return;
        }
        p->i++;
        if (alts.n == 1) {
            for (uint32_t k = 0; k < alts.v[0].n; k++) u32_push(frag, alts.v[0].v[k]);
            altvec_free(&alts);
        } else {
            add_elem(p, frag, CV_GE(CV_GE_REF, helper_rule(p, &alts)));
        }
    } else if (is_name_char(c)) {
        size_t e = name_end(p, at);
        uint32_t r = named_rule(p, at, e - at);
        p->i = e;
        add_elem(p, frag, CV_GE(CV_GE_REF, r));
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        fail(p, at, "'%c' follows nothing it could repeat", c);
    } else if (c >= 0x20 && c < 0x7F) {
        fail(p, at, "unexpected character '%c'", c);
    } else {
        fail(p, at, "unexpected byte 0x%02X", (unsigned)c);
    }
}

static void parse_sequence(parser *p, u32vec *seq) {
    for (;;) {
        skip_ws(p);
        int c = peek(p);
        if (p->failed || c < 0 || c == '|' || c == ')' || (is_name_char(c) && starts_rule(p, p->i))) return;
        u32vec frag = {0};
        parse_atom(p, &frag);
        for (;;) {
            skip_ws(p);
            c = peek(p);
            if (p->failed || (c != '*' && c != '+' && c != '?' && c != '{')) break;
            apply_postfix(p, &frag);
        }
        for (uint32_t k = 0; k < frag.n; k++) u32_push(seq, frag.v[k]);
        free(frag.v);
        if (p->failed) return;
    }
}

static void parse_alternatives(parser *p, altvec *out) {
    for (;;) {
        u32vec seq = {0};
        parse_sequence(p, &seq);
        alt_push(out, seq);
        if (p->failed || peek(p) != '|') return;
        p->i++;
    }
}

static void parse_rule(parser *p) {
    size_t at = p->i;
    size_t e = name_end(p, at);
    if (e == at) {
        int c = peek(p);
        if (c == ')')
            fail(p, at, "unmatched ')'");
        else
            fail(p, at, "expected a rule name");
        return;
    }
    p->i = skip_ws_from(p, e);
    if (p->i + 3 > p->len || memcmp(p->s + p->i, "::=", 3) != 0) {
        fail(p, p->i, "expected '::=' after the rule name '%.*s'", (int)(e - at), p->s + at);
        return;
    }
    p->i += 3;
    uint32_t id = named_rule(p, at, e - at);
    if (p->failed) return;
    if (p->rules[id].defined) {
        fail(p, at, "rule '%s' is defined twice (first on line %d)", p->rules[id].name,
             line_of(p, p->rules[id].def_off));
        return;
    }
    p->rules[id].defined = true;
    p->rules[id].def_off = at;
    p->cur_rule = id;
    altvec alts = {0};
    parse_alternatives(p, &alts);
    p->rules[id].body = alts;
    count_elems(p, alts.n);
    if (!p->failed && peek(p) == ')') fail(p, p->i, "unmatched ')'");
}

/* ---- checks after parsing -------------------------------------------------------------------------- */

static bool *nullable_rules(const parser *p) {
    uint32_t n_alts = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) n_alts += p->rules[r].body.n;
    bool *nullable = cv_xcalloc(p->n_rules + 1, sizeof *nullable);
    uint32_t *pending = cv_xmalloc((n_alts + 1) * sizeof *pending);  /* refs not yet nullable */
    uint32_t *alt_rule = cv_xmalloc((n_alts + 1) * sizeof *alt_rule);
    uint32_t *occ_start = cv_xcalloc(p->n_rules + 2, sizeof *occ_start);  /* CSR: alts referring to r */
    uint32_t *work = cv_xmalloc((p->n_rules + 1) * sizeof *work);
    uint32_t n_work = 0;
    /* Alternatives with a byte set can never be empty; the rest wait for their references. */
    uint32_t a = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        for (uint32_t k = 0; k < p->rules[r].body.n; k++, a++) {
            const u32vec *alt = &p->rules[r].body.v[k];
            alt_rule[a] = r;
            pending[a] = 0;
            for (uint32_t q = 0; q < alt->n; q++) {
                if (CV_GE_KIND(alt->v[q]) == CV_GE_BYTES) {
                    pending[a] = UINT32_MAX;
                    break;
                }
                pending[a]++;
            }
            if (pending[a] == UINT32_MAX) continue;
            for (uint32_t q = 0; q < alt->n; q++) occ_start[CV_GE_ARG(alt->v[q]) + 1]++;
            if (pending[a] == 0 && !nullable[r]) {
                nullable[r] = true;
                work[n_work++] = r;
            }
        }
    }
    for (uint32_t r = 0; r < p->n_rules; r++) occ_start[r + 1] += occ_start[r];
    uint32_t *occ = cv_xmalloc((occ_start[p->n_rules] + 1) * sizeof *occ);
    uint32_t *fill = cv_xmalloc((p->n_rules + 1) * sizeof *fill);
    memcpy(fill, occ_start, p->n_rules * sizeof *fill);
    a = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        for (uint32_t k = 0; k < p->rules[r].body.n; k++, a++) {
            if (pending[a] == UINT32_MAX) continue;
            const u32vec *alt = &p->rules[r].body.v[k];
            for (uint32_t q = 0; q < alt->n; q++) occ[fill[CV_GE_ARG(alt->v[q])]++] = a;
        }
    }
    while (n_work) {
        uint32_t s = work[--n_work];
        for (uint32_t o = occ_start[s]; o < occ_start[s + 1]; o++) {
            uint32_t alt = occ[o];
            if (--pending[alt] == 0 && !nullable[alt_rule[alt]]) {
                nullable[alt_rule[alt]] = true;
                work[n_work++] = alt_rule[alt];
            }
        }
    }
    free(pending);
    free(alt_rule);
    free(occ_start);
    free(occ);
    free(fill);
    free(work);
    return nullable;
}

/* Left-corner edges r → s with `grows` set when a return is pushed; refuses a growing edge inside a
 * strongly connected component (Tarjan's algorithm, iterative: chains of rules may be long). */
static void check_left_recursion(parser *p) {
    bool *nullable = nullable_rules(p);
    uint32_t n = p->n_rules;
    uint32_t *edge_start = cv_xcalloc(n + 1, sizeof *edge_start);
    u32vec to = {0}, grows = {0};
    for (uint32_t r = 0; r < n; r++) {
        edge_start[r] = to.n;
        for (uint32_t k = 0; k < p->rules[r].body.n; k++) {
            const u32vec *alt = &p->rules[r].body.v[k];
            for (uint32_t q = 0; q < alt->n; q++) {
                if (CV_GE_KIND(alt->v[q]) != CV_GE_REF) break;
                uint32_t s = CV_GE_ARG(alt->v[q]);
                u32_push(&to, s);
                u32_push(&grows, q + 1 < alt->n);
                if (!nullable[s]) break;
            }
        }
    }
    edge_start[n] = to.n;

    uint32_t *index = cv_xmalloc((n + 1) * sizeof *index), *low = cv_xmalloc((n + 1) * sizeof *low);
    uint32_t *comp = cv_xmalloc((n + 1) * sizeof *comp), *next_edge = cv_xmalloc((n + 1) * sizeof *next_edge);
    uint32_t *stack = cv_xmalloc((n + 1) * sizeof *stack), *call = cv_xmalloc((n + 1) * sizeof *call);
    bool *on_stack = cv_xcalloc(n + 1, sizeof *on_stack);
    for (uint32_t r = 0; r < n; r++) index[r] = UINT32_MAX;
    uint32_t counter = 0, n_stack = 0, n_comp = 0;
    for (uint32_t start = 0; start < n; start++) {
        if (index[start] != UINT32_MAX) continue;
        uint32_t depth = 0;
        call[depth++] = start;
        index[start] = low[start] = counter++;
        next_edge[start] = edge_start[start];
        stack[n_stack++] = start;
        on_stack[start] = true;
        while (depth) {
            uint32_t v = call[depth - 1];
            if (next_edge[v] < edge_start[v + 1]) {
                uint32_t w = to.v[next_edge[v]++];
                if (index[w] == UINT32_MAX) {
                    index[w] = low[w] = counter++;
                    next_edge[w] = edge_start[w];
                    stack[n_stack++] = w;
                    on_stack[w] = true;
                    call[depth++] = w;
                } else if (on_stack[w] && index[w] < low[v]) {
                    low[v] = index[w];
                }
                continue;
            }
            if (low[v] == index[v]) {
                uint32_t w;
                do {
                    w = stack[--n_stack];
                    on_stack[w] = false;
                    comp[w] = n_comp;
                } while (w != v);
                n_comp++;
            }
            depth--;
            if (depth && low[v] < low[call[depth - 1]]) low[call[depth - 1]] = low[v];
        }
    }
    for (uint32_t r = 0; r < n && !p->failed; r++) {
        for (uint32_t e = edge_start[r]; e < edge_start[r + 1]; e++) {
            if (grows.v[e] && comp[to.v[e]] == comp[r]) {
                const brule *u = &p->rules[p->rules[r].origin];
                fail(p, u->def_off, "rule '%s' is left-recursive", u->name);
                break;
            }
        }
    }
    free(nullable);
    free(edge_start);
    free(to.v);
    free(grows.v);
    free(index);
    free(low);
    free(comp);
    free(next_edge);
    free(stack);
    free(call);
    free(on_stack);
}

/* ---- the grammar ---------------------------------------------------------------------------------- */

static cv_grammar *flatten(parser *p, uint32_t root, const cv_vocab *vocab) {
    cv_grammar *g = cv_xcalloc(1, sizeof *g);
    uint32_t n_alts = 0, n_elems = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        n_alts += p->rules[r].body.n;
        for (uint32_t k = 0; k < p->rules[r].body.n; k++) n_elems += p->rules[r].body.v[k].n + 1;
    }
    g->elems = cv_xmalloc(n_elems * sizeof *g->elems);
    g->alt_start = cv_xmalloc(n_alts * sizeof *g->alt_start);
    g->rule_alt = cv_xmalloc((p->n_rules + 1) * sizeof *g->rule_alt);
    uint32_t e = 0, a = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        g->rule_alt[r] = a;
        for (uint32_t k = 0; k < p->rules[r].body.n; k++) {
            const u32vec *alt = &p->rules[r].body.v[k];
            g->alt_start[a++] = e;
            if (alt->n) memcpy(g->elems + e, alt->v, alt->n * sizeof *alt->v);
            e += alt->n;
            g->elems[e++] = CV_GE(CV_GE_END, 0);
        }
    }
    g->rule_alt[p->n_rules] = a;
    assert(e == n_elems && a == n_alts);
    g->n_elems = n_elems;
    g->n_rules = p->n_rules;
    g->root = root;
    g->sets = p->sets;
    g->n_sets = p->n_sets;
    p->sets = NULL;
    g->vocab = vocab;
    g->cache = vocab ? cv_mask_cache_new() : NULL;
    return g;
}

static void parser_free(parser *p) {
    for (uint32_t r = 0; r < p->n_rules; r++) {
        free(p->rules[r].name);
        altvec_free(&p->rules[r].body);
    }
    free(p->rules);
    free(p->name_slots);
    free(p->sets);
    free(p->set_slots);
    for (uint32_t c = 0; c < p->n_classes; c++) free(p->classes[c].ranges);
    free(p->classes);
    free(p->class_slots);
}

/* Whether the start state stays within the matcher's limits (matcher.c): a grammar whose every
 * request would start with no stacks is refused here, once, with a message. */
static bool start_fits(const cv_grammar *g) {
    cv_gpool pool = {0};
    cv_gstep st = {0};
    const bool ok = cv_gstep_start(g, &pool, &st);
    cv_gstep_free(&st);
    cv_gpool_free(&pool);
    return ok;
}

cv_grammar *cv_grammar_parse(const char *text, size_t len, const cv_vocab *vocab, char *err, size_t err_len) {
    parser p = {.s = text, .len = len, .err = err, .err_len = err_len};
    if (err && err_len) err[0] = '\0';
    memset(p.byte_set, 0xff, sizeof p.byte_set);
    skip_ws(&p);
    while (!p.failed && p.i < p.len) {
        parse_rule(&p);
        skip_ws(&p);
    }
    for (uint32_t r = 0; r < p.n_rules && !p.failed; r++)
        if (p.rules[r].name && !p.rules[r].defined) fail(&p, p.rules[r].ref_off, "undefined rule '%s'", p.rules[r].name);
    uint32_t root = 0;
    if (!p.failed) {
        static const char root_name[] = "root";
        bool found = false;
        for (uint32_t r = 0; r < p.n_rules && !found; r++) {
            if (p.rules[r].name && strcmp(p.rules[r].name, root_name) == 0) {
                root = r;
                found = true;
            }
        }
        if (!found) fail(&p, p.len, "the grammar has no rule named 'root'");
    }
    if (!p.failed) check_left_recursion(&p);
    cv_grammar *g = p.failed ? NULL : flatten(&p, root, vocab);
    parser_free(&p);
    if (g && !start_fits(g)) {
        if (err && err_len)
            snprintf(err, err_len, "the grammar is too ambiguous: its start alone expands %d rule references more than "
                     "it has rules, or leaves more than %d stacks (nested repetitions of parts that may be empty?)",
                     CV_GRAMMAR_MAX_EXPANSIONS, CV_GRAMMAR_MAX_STACKS);
        cv_grammar_free(g);
        g = NULL;
    }
    return g;
}

void cv_grammar_free(cv_grammar *g) {
    if (!g) return;
    free(g->elems);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->sets);
    cv_mask_cache_free(g->cache);
    free(g);
}
