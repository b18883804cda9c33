/*
 * regex.c — regular expressions (Python's re, or ECMA-262 for JSON Schema's `pattern`) → EBNF.
 *
 * A regex is parsed into a small tree (sets of code points, concatenation, alternation,
 * repetition), checked, simplified, and written out as one EBNF expression. The output must accept
 * only strings the real regex engine accepts, so wherever the two dialects' classes depend on
 * Unicode tables we do not carry (Python's \d \w cover every script's digits and letters) the set
 * is kept as two bounds: the code points surely in it and those possibly in it. A class uses the
 * first, a negated class the complement of the second; both are subsets of what Python matches.
 * ECMA without the u flag matches UTF-16 units, so there a class or `.` keeps to the BMP, where a
 * character is one unit, and a literal astral character is treated as matching nothing.
 *
 * Anchors are accepted where they are no-ops for a whole-string match (a ^ that nothing can precede,
 * a $ that nothing can follow); anything that is not regular or needs more than sets and
 * repetition (lookarounds, backreferences, \b, inline flags, possessive and atomic forms) is an
 * error naming its offset.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "sample/grammar/convert.h"
#include "sample/grammar/grammar.h"

#define REP_INF UINT32_MAX
#define MAX_NESTING 200

typedef enum rn_kind { RN_EMPTY, RN_NONE, RN_SET, RN_CAT, RN_ALT, RN_REP, RN_BOL, RN_EOL } rn_kind;

typedef struct rnode {
    rn_kind kind;
    size_t off;               /* where it starts in the source, for errors */
    cv_cpset set;             /* RN_SET */
    struct rnode **kid;       /* RN_CAT, RN_ALT: the parts; RN_REP: kid[0] */
    size_t n, cap;
    uint32_t min, max;        /* RN_REP; max REP_INF is unbounded */
} rnode;

struct cv_regex {
    rnode *root;
};

/* ---- nodes ---------------------------------------------------------------------------------------- */

static rnode *node_new(rn_kind kind, size_t off) {
    rnode *n = cv_xcalloc(1, sizeof *n);
    n->kind = kind;
    n->off = off;
    return n;
}

static void node_push(rnode *n, rnode *k) {
    if (n->n == n->cap) {
        n->cap = n->cap ? 2 * n->cap : 4;
        n->kid = cv_xrealloc(n->kid, n->cap * sizeof *n->kid);
    }
    n->kid[n->n++] = k;
}

static void node_free(rnode *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n; i++) node_free(n->kid[i]);
    free(n->kid);
    cv_cpset_free(&n->set);
    free(n);
}

static rnode *rep_new(rnode *kid, uint32_t min, uint32_t max, size_t off) {
    rnode *r = node_new(RN_REP, off);
    node_push(r, kid);
    r->min = min;
    r->max = max;
    return r;
}

/* ---- sets with a lower and an upper bound ------------------------------------------------------------ */

typedef struct rset {
    cv_cpset lo, hi;          /* lo ⊆ the dialect's set ⊆ hi */
} rset;

static void rset_free(rset *s) {
    cv_cpset_free(&s->lo);
    cv_cpset_free(&s->hi);
}

static void rset_add(rset *s, uint32_t a, uint32_t b) {
    cv_cpset_add(&s->lo, a, b);
    cv_cpset_add(&s->hi, a, b);
}

static void rset_union(rset *s, const rset *o) {
    cv_cpset_add_set(&s->lo, &o->lo);
    cv_cpset_add_set(&s->hi, &o->hi);
}

static void rset_negate(rset *s) {
    cv_cpset lo = {0}, hi = {0};
    cv_cpset_copy(&lo, &s->hi);
    cv_cpset_invert(&lo);
    cv_cpset_copy(&hi, &s->lo);
    cv_cpset_invert(&hi);
    rset_free(s);
    s->lo = lo;
    s->hi = hi;
}

/* Python's str.isspace, which is what re's \s matches; ECMA's WhiteSpace and LineTerminator. */
static void add_space(rset *s, cv_re_dialect d) {
    rset_add(s, 0x09, 0x0D);
    rset_add(s, 0x20, 0x20);
    rset_add(s, 0xA0, 0xA0);
    rset_add(s, 0x1680, 0x1680);
    rset_add(s, 0x2000, 0x200A);
    rset_add(s, 0x2028, 0x2029);
    rset_add(s, 0x202F, 0x202F);
    rset_add(s, 0x205F, 0x205F);
    rset_add(s, 0x3000, 0x3000);
    if (d == CV_RE_PYTHON) {
        rset_add(s, 0x1C, 0x1F);
        rset_add(s, 0x85, 0x85);
    } else {
        rset_add(s, 0xFEFF, 0xFEFF);
    }
}

/* The class escapes \d \w \s and their negations. In Python \d and \w reach beyond ASCII: the first
 * non-ASCII decimal digit is U+0660 and the first non-ASCII word character U+00AA, so those bound
 * the sets from above. */
static void class_escape(rset *s, char c, cv_re_dialect d) {
    char lower = (char)(c | 0x20);
    if (lower == 'd') {
        rset_add(s, '0', '9');
        if (d == CV_RE_PYTHON) cv_cpset_add(&s->hi, 0x660, CV_CP_MAX);
    } else if (lower == 'w') {
        rset_add(s, '0', '9');
        rset_add(s, 'A', 'Z');
        rset_add(s, '_', '_');
        rset_add(s, 'a', 'z');
        if (d == CV_RE_PYTHON) cv_cpset_add(&s->hi, 0xAA, CV_CP_MAX);
    } else {
        add_space(s, d);
    }
    if (c != lower) rset_negate(s);
}

/* ---- parser ------------------------------------------------------------------------------------------ */

typedef struct rparser {
    const char *s;
    size_t len, pos;
    cv_re_dialect d;
    char *err;
    size_t err_len;
    bool failed;
    int depth;
} rparser;

static rnode *perr(rparser *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static rnode *perr(rparser *p, size_t off, const char *fmt, ...) {
    if (!p->failed && p->err_len) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(p->err, p->err_len, "%s at offset %zu", msg, off);
    }
    p->failed = true;
    return NULL;
}

static bool at_end(const rparser *p) { return p->pos >= p->len; }
static char peek(const rparser *p) { return at_end(p) ? 0 : p->s[p->pos]; }

/* Decodes the code point at the parser's position (UTF-8). */
static bool next_cp(rparser *p, uint32_t *cp) {
    size_t n;
    if (cv_utf8_decode(p->s + p->pos, p->len - p->pos, cp, &n) != CV_UTF8_OK) {
        perr(p, p->pos, "invalid UTF-8");
        return false;
    }
    p->pos += n;
    return true;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex(rparser *p, size_t start, int n, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        int h = p->pos < p->len ? hexval(p->s[p->pos]) : -1;
        if (h < 0) {
            perr(p, start, "incomplete escape");
            return false;
        }
        v = v * 16 + (uint32_t)h;
        p->pos++;
    }
    if (v > CV_CP_MAX) {
        perr(p, start, "escape beyond U+10FFFF");
        return false;
    }
    *cp = v;
    return true;
}

/* An escape after the backslash (p->pos is past it). Either a code point (*is_set false) or a
 * class escape added to *set. Anchors \A \Z (Python) come back as *anchor 'A' or 'Z'. */
static bool parse_escape(rparser *p, bool in_class, uint32_t *cp, rset *set, bool *is_set, char *anchor) {
    size_t start = p->pos - 1;
    *is_set = false;
    if (at_end(p)) {
        perr(p, start, "bad escape (end of pattern)");
        return false;
    }
    char c = p->s[p->pos];
    bool py = p->d == CV_RE_PYTHON;
    if (c && strchr("dDwWsS", c)) {
        p->pos++;
        class_escape(set, c, p->d);
        *is_set = true;
        return true;
    }
    p->pos++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case 'a':
        if (!py) break;
        *cp = 7;
        return true;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return true;
        }
        perr(p, start, "word boundaries (\\b) are not supported");
        return false;
    case 'B': perr(p, start, "word boundaries (\\B) are not supported"); return false;
    case 'A':
    case 'Z':
        if (!py || in_class) break;
        *anchor = c;
        return true;
    case 'x': return read_hex(p, start, 2, cp);
    case 'u': return read_hex(p, start, 4, cp);
    case 'U':
        if (!py) break;
        return read_hex(p, start, 8, cp);
    case 'c':
        if (py) break;
        if (at_end(p) || !((peek(p) | 0x20) >= 'a' && (peek(p) | 0x20) <= 'z')) break;
        *cp = (uint32_t)(peek(p) & 0x1F);
        p->pos++;
        return true;
    case '0':
        /* NUL; Python reads up to two more octal digits as part of it */
        *cp = 0;
        for (int i = 0; py && i < 2 && peek(p) >= '0' && peek(p) <= '7'; i++)
            *cp = *cp * 8 + (uint32_t)(p->s[p->pos++] - '0');
        if (!py && peek(p) >= '0' && peek(p) <= '9') break;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            perr(p, start, "backreferences are not supported");
            return false;
        }
        if (c == 'k' && !py && peek(p) == '<') {
            perr(p, start, "backreferences are not supported");
            return false;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) break;
        /* any other character stands for itself */
        p->pos--;
        return next_cp(p, cp);
    }
    perr(p, start, "unsupported escape \\%c", c);
    return false;
}

/* Code points a class or `.` may use: ECMA without the u flag works on UTF-16 units, so only the
 * BMP is safe there. */
static void restrict_dialect(const rparser *p, cv_cpset *s) {
    if (p->d != CV_RE_ECMA) return;
    cv_cpset bmp = {0};
    cv_cpset_add(&bmp, 0, 0xFFFF);
    cv_cpset_intersect(s, &bmp);
    cv_cpset_free(&bmp);
}

static rnode *set_node(rparser *p, rset *s, size_t off) {
    rnode *n = node_new(RN_SET, off);
    n->set = s->lo;
    s->lo = (cv_cpset){0};
    rset_free(s);
    restrict_dialect(p, &n->set);
    return n;
}

static rnode *parse_class(rparser *p) {
    size_t start = p->pos - 1;
    rset s = {0};
    bool negate = false;
    if (peek(p) == '^') {
        negate = true;
        p->pos++;
    }
    bool first = true;
    for (;;) {
        if (at_end(p)) {
            rset_free(&s);
            return perr(p, start, "unterminated character set");
        }
        if (peek(p) == ']' && !(first && p->d == CV_RE_PYTHON)) {
            p->pos++;
            break;
        }
        first = false;
        /* one item: a code point, perhaps the start of a range, or a class escape */
        size_t item = p->pos;
        uint32_t a;
        rset esc = {0};
        bool is_set = false;
        char anchor = 0;
        if (peek(p) == '\\') {
            p->pos++;
            if (!parse_escape(p, true, &a, &esc, &is_set, &anchor)) {
                rset_free(&s);
                rset_free(&esc);
                return NULL;
            }
        } else if (!next_cp(p, &a)) {
            rset_free(&s);
            return NULL;
        }
        if (is_set) {
            rset_union(&s, &esc);
            rset_free(&esc);
            if (peek(p) == '-' && p->pos + 1 < p->len && p->s[p->pos + 1] != ']') {
                rset_free(&s);
                return perr(p, item, "bad character range");
            }
            continue;
        }
        uint32_t b = a;
        if (peek(p) == '-' && p->pos + 1 < p->len && p->s[p->pos + 1] != ']') {
            p->pos++;
            if (peek(p) == '\\') {
                p->pos++;
                if (!parse_escape(p, true, &b, &esc, &is_set, &anchor)) {
                    rset_free(&s);
                    rset_free(&esc);
                    return NULL;
                }
                if (is_set) {
                    rset_free(&s);
                    rset_free(&esc);
                    return perr(p, item, "bad character range");
                }
            } else if (!next_cp(p, &b)) {
                rset_free(&s);
                return NULL;
            }
            if (b < a) {
                rset_free(&s);
                return perr(p, item, "bad character range");
            }
        }
        rset_add(&s, a, b);
    }
    if (negate) rset_negate(&s);
    return set_node(p, &s, start);
}

/* The end (past '}') of a quantifier in braces at p->pos: {n} {n,} {n,m}, and in Python {,m} and
 * {,}; 0 when the text is not one, and the brace is then a literal. */
static size_t brace_end(const rparser *p) {
    size_t i = p->pos + 1, na = 0;
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++, na++;
    bool comma = i < p->len && p->s[i] == ',';
    if (comma)
        for (i++; i < p->len && p->s[i] >= '0' && p->s[i] <= '9';) i++;
    if (i >= p->len || p->s[i] != '}') return 0;
    if (na == 0 && (!comma || p->d == CV_RE_ECMA)) return 0;
    return i + 1;
}

static uint64_t read_count(const char *s, size_t *i) {
    uint64_t v = 0;
    for (; s[*i] >= '0' && s[*i] <= '9'; (*i)++)
        if (v <= CV_EBNF_MAX_REPEAT) v = v * 10 + (uint64_t)(s[*i] - '0');
    return v;
}

static bool parse_braces(rparser *p, uint32_t *min, uint32_t *max) {
    size_t end = brace_end(p), i = p->pos + 1;
    assert(end);
    uint64_t a = read_count(p->s, &i), b = REP_INF;
    if (p->s[i] == ',') {
        i++;
        if (p->s[i] != '}') b = read_count(p->s, &i);
    } else {
        b = a;
    }
    if (a > CV_EBNF_MAX_REPEAT || (b != REP_INF && b > CV_EBNF_MAX_REPEAT)) {
        perr(p, p->pos, "repetition count above %d", CV_EBNF_MAX_REPEAT);
        return false;
    }
    if (b < a) {
        perr(p, p->pos, "min repeat greater than max repeat");
        return false;
    }
    *min = (uint32_t)a;
    *max = (uint32_t)b;
    p->pos = end;
    return true;
}

static bool is_quantifier(const rparser *p) {
    char c = peek(p);
    return c == '*' || c == '+' || c == '?' || (c == '{' && brace_end(p));
}

static rnode *parse_alt(rparser *p);

static rnode *parse_group(rparser *p) {
    size_t start = p->pos - 1;
    if (peek(p) == '?') {
        p->pos++;
        char c = peek(p);
        const char *rest = p->s + p->pos;
        size_t left = p->len - p->pos;
        if (c == ':') {
            p->pos++;
        } else if ((c == 'P' && left >= 2 && rest[1] == '<') ||
                   (c == '<' && left >= 2 && rest[1] != '=' && rest[1] != '!')) {
            p->pos += c == 'P' ? 2 : 1;
            size_t name = p->pos;
            while (!at_end(p) && (peek(p) == '_' || ((peek(p) | 0x20) >= 'a' && (peek(p) | 0x20) <= 'z') ||
                                  (peek(p) >= '0' && peek(p) <= '9')))
                p->pos++;
            if (p->pos == name || peek(p) != '>') return perr(p, start, "bad group name");
            p->pos++;
        } else if (c == 'P' && left >= 2 && rest[1] == '=') {
            return perr(p, start, "backreferences are not supported");
        } else if (c == '=' || c == '!' || (c == '<' && left >= 2)) {
            return perr(p, start, "lookarounds are not supported");
        } else if (c == '#') {
            while (!at_end(p) && peek(p) != ')') p->pos++;
            if (at_end(p)) return perr(p, start, "missing ), unterminated comment");
            p->pos++;
            return node_new(RN_EMPTY, start);
        } else if (c == '>') {
            return perr(p, start, "atomic groups are not supported");
        } else if (c == '(') {
            return perr(p, start, "conditional groups are not supported");
        } else {
            return perr(p, start, "inline flags are not supported");
        }
    }
    if (++p->depth > MAX_NESTING) return perr(p, start, "groups nested too deeply");
    rnode *n = parse_alt(p);
    p->depth--;
    if (!n) return NULL;
    if (peek(p) != ')') {
        node_free(n);
        return perr(p, start, "missing ), unterminated subpattern");
    }
    p->pos++;
    return n;
}

static rnode *parse_atom(rparser *p) {
    size_t start = p->pos;
    char c = peek(p);
    if (is_quantifier(p)) return perr(p, start, "nothing to repeat");
    p->pos++;
    switch (c) {
    case '(': return parse_group(p);
    case ')': return perr(p, start, "unbalanced parenthesis");
    case '[': return parse_class(p);
    case '^': return node_new(RN_BOL, start);
    case '$': return node_new(RN_EOL, start);
    case '.': {
        /* everything but the line terminators */
        rset s = {0};
        rset_add(&s, '\n', '\n');
        if (p->d == CV_RE_ECMA) {
            rset_add(&s, '\r', '\r');
            rset_add(&s, 0x2028, 0x2029);
        }
        rset_negate(&s);
        return set_node(p, &s, start);
    }
    case '\\': {
        uint32_t cp;
        rset s = {0};
        bool is_set;
        char anchor = 0;
        if (!parse_escape(p, false, &cp, &s, &is_set, &anchor)) {
            rset_free(&s);
            return NULL;
        }
        if (anchor) return node_new(anchor == 'A' ? RN_BOL : RN_EOL, start);
        if (is_set) return set_node(p, &s, start);
        rset_add(&s, cp, cp);
        rnode *n = set_node(p, &s, start);
        return n;
    }
    default: {
        p->pos--;
        uint32_t cp;
        if (!next_cp(p, &cp)) return NULL;
        rnode *n = node_new(RN_SET, start);
        /* an astral character is two UTF-16 units to ECMA without the u flag: not a safe literal */
        if (p->d == CV_RE_PYTHON || cp <= 0xFFFF) cv_cpset_add(&n->set, cp, cp);
        return n;
    }
    }
}

static rnode *parse_repeat(rparser *p) {
    rnode *n = parse_atom(p);
    if (!n) return NULL;
    bool quantified = false;
    while (is_quantifier(p)) {
        size_t at = p->pos;
        if (quantified) {
            node_free(n);
            return perr(p, at, "multiple repeat");
        }
        if (n->kind == RN_BOL || n->kind == RN_EOL) {
            node_free(n);
            return perr(p, at, "nothing to repeat");
        }
        uint32_t min, max;
        char c = peek(p);
        if (c == '{') {
            if (!parse_braces(p, &min, &max)) {
                node_free(n);
                return NULL;
            }
        } else {
            p->pos++;
            min = c == '+' ? 1 : 0;
            max = c == '?' ? 1 : REP_INF;
        }
        /* lazy forms match the same strings; possessive ones do not */
        if (peek(p) == '?') {
            p->pos++;
        } else if (peek(p) == '+') {
            node_free(n);
            return perr(p, p->pos, "possessive quantifiers are not supported");
        }
        n = rep_new(n, min, max, at);
        quantified = true;
    }
    return n;
}

static rnode *parse_cat(rparser *p) {
    rnode *cat = node_new(RN_CAT, p->pos);
    while (!at_end(p) && peek(p) != '|' && peek(p) != ')') {
        rnode *k = parse_repeat(p);
        if (!k) {
            node_free(cat);
            return NULL;
        }
        node_push(cat, k);
    }
    return cat;
}

static rnode *parse_alt(rparser *p) {
    rnode *alt = node_new(RN_ALT, p->pos);
    for (;;) {
        rnode *k = parse_cat(p);
        if (!k) {
            node_free(alt);
            return NULL;
        }
        node_push(alt, k);
        if (peek(p) != '|') break;
        p->pos++;
    }
    return alt;
}

/* ---- checks and simplification ----------------------------------------------------------------------- */

/* Drops what can never match: empty sets, and the concatenations and branches that contain them. */
static rnode *drop_none(rnode *n) {
    switch (n->kind) {
    case RN_SET:
        if (n->set.n == 0) n->kind = RN_NONE;
        return n;
    case RN_CAT:
        for (size_t i = 0; i < n->n; i++) {
            n->kid[i] = drop_none(n->kid[i]);
            if (n->kid[i]->kind == RN_NONE) n->kind = RN_NONE;
        }
        return n;
    case RN_ALT: {
        size_t w = 0;
        for (size_t i = 0; i < n->n; i++) {
            rnode *k = drop_none(n->kid[i]);
            if (k->kind == RN_NONE)
                node_free(k);
            else
                n->kid[w++] = k;
        }
        n->n = w;
        if (w == 0) n->kind = RN_NONE;
        return n;
    }
    case RN_REP:
        n->kid[0] = drop_none(n->kid[0]);
        if (n->kid[0]->kind == RN_NONE) n->kind = n->min == 0 ? RN_EMPTY : RN_NONE;
        return n;
    default: return n;
    }
}

static bool empty_only(const rnode *n) {
    switch (n->kind) {
    case RN_EMPTY:
    case RN_BOL:
    case RN_EOL: return true;
    case RN_CAT:
    case RN_ALT:
        for (size_t i = 0; i < n->n; i++)
            if (!empty_only(n->kid[i])) return false;
        return true;
    case RN_REP: return empty_only(n->kid[0]);
    default: return false;
    }
}

/* Anchors must sit where they cannot fail: start_ok says nothing can have been consumed before the
 * node, end_ok that nothing can follow it. */
static bool check_anchors(rparser *p, rnode *n, bool start_ok, bool end_ok) {
    switch (n->kind) {
    case RN_BOL:
    case RN_EOL:
        if (!(n->kind == RN_BOL ? start_ok : end_ok)) {
            perr(p, n->off, "'%c' is only supported at the %s", n->kind == RN_BOL ? '^' : '$',
                 n->kind == RN_BOL ? "start" : "end");
            return false;
        }
        n->kind = RN_EMPTY;
        return true;
    case RN_CAT:
        for (size_t i = 0; i < n->n; i++) {
            bool s = start_ok, e = end_ok;
            for (size_t j = 0; j < i && s; j++) s = empty_only(n->kid[j]);
            for (size_t j = i + 1; j < n->n && e; j++) e = empty_only(n->kid[j]);
            if (!check_anchors(p, n->kid[i], s, e)) return false;
        }
        return true;
    case RN_ALT:
        for (size_t i = 0; i < n->n; i++)
            if (!check_anchors(p, n->kid[i], start_ok, end_ok)) return false;
        return true;
    case RN_REP: {
        bool again = n->max > 1 && !empty_only(n->kid[0]);
        return check_anchors(p, n->kid[0], start_ok && !again, end_ok && !again);
    }
    default: return true;
    }
}

static void minmax(const rnode *n, uint64_t *lo, uint64_t *hi);

/* Flattens and folds: no empty parts in concatenations, an alternation with an empty branch becomes
 * an optional one, single-part groups disappear, and a repetition of something that may be empty
 * repeated without bound becomes a plain star (the same strings, far less ambiguity). */
/* Adds k to out; a node of out's own kind (a concatenation in a concatenation, an alternation in an
 * alternation) gives its children instead, which keeps the tree flat. */
static void absorb(rnode *out, rnode *k) {
    if (k->kind != out->kind) {
        node_push(out, k);
        return;
    }
    for (size_t j = 0; j < k->n; j++) node_push(out, k->kid[j]);
    k->n = 0;
    node_free(k);
}

/* A concatenation or alternation of one node is that node. */
static rnode *only_kid(rnode *out) {
    rnode *k = out->kid[0];
    out->n = 0;
    node_free(out);
    return k;
}

static rnode *simplify(rnode *n) {
    switch (n->kind) {
    case RN_CAT: {
        rnode *out = node_new(RN_CAT, n->off);
        for (size_t i = 0; i < n->n; i++) {
            rnode *k = simplify(n->kid[i]);
            if (k->kind == RN_EMPTY) node_free(k);
            else absorb(out, k);
        }
        n->n = 0;
        node_free(n);
        if (out->n == 0) out->kind = RN_EMPTY;
        return out->n == 1 ? only_kid(out) : out;
    }
    case RN_ALT: {
        rnode *out = node_new(RN_ALT, n->off);
        bool empty = false;
        for (size_t i = 0; i < n->n; i++) {
            rnode *k = simplify(n->kid[i]);
            if (k->kind == RN_EMPTY) {
                empty = true;
                node_free(k);
            } else {
                absorb(out, k);
            }
        }
        n->n = 0;
        node_free(n);
        if (out->n == 0) {
            out->kind = RN_EMPTY;
            return out;
        }
        rnode *r = out->n == 1 ? only_kid(out) : out;
        return empty ? simplify(rep_new(r, 0, 1, r->off)) : r;
    }
    case RN_REP: {
        n->kid[0] = simplify(n->kid[0]);
        rnode *k = n->kid[0];
        if (k->kind == RN_EMPTY || n->max == 0) {
            node_free(n);
            return node_new(RN_EMPTY, 0);
        }
        if (k->kind == RN_REP && k->min == 0 && n->max == REP_INF) {
            /* (x{0,m}){a,} is x* */
            n->kid[0] = k->kid[0];
            k->n = 0;
            node_free(k);
            n->min = 0;
            return n;
        }
        if (n->min == 1 && n->max == 1) {
            n->n = 0;
            node_free(n);
            return k;
        }
        return n;
    }
    default: return n;
    }
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static uint64_t sat_mul(uint64_t a, uint64_t b) {
    if (a == 0 || b == 0) return 0;
    return a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static void minmax(const rnode *n, uint64_t *lo, uint64_t *hi) {
    switch (n->kind) {
    case RN_SET: *lo = *hi = 1; return;
    case RN_CAT:
        *lo = *hi = 0;
        for (size_t i = 0; i < n->n; i++) {
            uint64_t a, b;
            minmax(n->kid[i], &a, &b);
            *lo = sat_add(*lo, a);
            *hi = sat_add(*hi, b);
        }
        return;
    case RN_ALT:
        *lo = UINT64_MAX, *hi = 0;
        for (size_t i = 0; i < n->n; i++) {
            uint64_t a, b;
            minmax(n->kid[i], &a, &b);
            if (a < *lo) *lo = a;
            if (b > *hi) *hi = b;
        }
        return;
    case RN_REP: {
        uint64_t a, b;
        minmax(n->kid[0], &a, &b);
        *lo = sat_mul(a, n->min);
        *hi = n->max == REP_INF ? (b ? UINT64_MAX : 0) : sat_mul(b, n->max);
        return;
    }
    default: *lo = *hi = 0; return;
    }
}

/* ---- the public face ----------------------------------------------------------------------------------- */

cv_regex *cv_regex_parse(const char *src, size_t len, cv_re_dialect d, char *err, size_t err_len) {
    rparser p = {.s = src, .len = len, .d = d, .err = err, .err_len = err_len};
    if (err_len) err[0] = 0;
    rnode *n = parse_alt(&p);
    if (n && !at_end(&p)) {
        node_free(n);
        n = perr(&p, p.pos, "unbalanced parenthesis");
    }
    if (!n) return NULL;
    n = drop_none(n);
    if (n->kind == RN_NONE) {
        node_free(n);
        perr(&p, 0, "the regex matches nothing");
        return NULL;
    }
    if (!check_anchors(&p, n, true, true)) {
        node_free(n);
        return NULL;
    }
    cv_regex *re = cv_xmalloc(sizeof *re);
    re->root = simplify(n);
    return re;
}

void cv_regex_free(cv_regex *re) {
    if (!re) return;
    node_free(re->root);
    free(re);
}

typedef enum lim { LIM_OK, LIM_EMPTY, LIM_FAIL } lim;

static lim limit(rnode *n, uint64_t lo, uint64_t hi) {
    uint64_t a, b;
    minmax(n, &a, &b);
    if (a >= lo && b <= hi) return LIM_OK;
    if (a > hi || b < lo) return LIM_EMPTY;
    if (n->kind == RN_ALT) {
        /* every branch first: the tree stays whole when one of them cannot be narrowed */
        lim *r = cv_xmalloc(n->n * sizeof *r);
        bool failed = false;
        for (size_t i = 0; i < n->n && !failed; i++) failed = (r[i] = limit(n->kid[i], lo, hi)) == LIM_FAIL;
        size_t w = 0;
        for (size_t i = 0; i < n->n && !failed; i++) {
            if (r[i] == LIM_EMPTY)
                node_free(n->kid[i]);
            else
                n->kid[w++] = n->kid[i];
        }
        free(r);
        if (failed) return LIM_FAIL;
        n->n = w;
        return w ? LIM_OK : LIM_EMPTY;
    }
    if (n->kind == RN_REP && n->min == 0 && n->max == 1) {
        lim r = limit(n->kid[0], lo, hi);
        if (r == LIM_FAIL) return LIM_FAIL;
        if (lo > 0) {
            if (r == LIM_EMPTY) return LIM_EMPTY;
            n->min = 1;
        } else if (r == LIM_EMPTY) {
            node_free(n->kid[0]);
            n->n = 0;
            n->kind = RN_EMPTY;
        }
        return LIM_OK;
    }
    /* a concatenation (or a lone repetition): fixed-width parts but one repetition of a fixed-width
     * part, whose count range absorbs the bounds */
    rnode **parts = n->kind == RN_CAT ? n->kid : &n;
    size_t n_parts = n->kind == RN_CAT ? n->n : 1;
    uint64_t fixed = 0;
    rnode *var = NULL;
    uint64_t w = 0;
    for (size_t i = 0; i < n_parts; i++) {
        uint64_t x, y;
        minmax(parts[i], &x, &y);
        if (x == y) {
            fixed = sat_add(fixed, x);
            continue;
        }
        if (var || parts[i]->kind != RN_REP) return LIM_FAIL;
        uint64_t kx, ky;
        minmax(parts[i]->kid[0], &kx, &ky);
        if (kx != ky || kx == 0) return LIM_FAIL;
        var = parts[i];
        w = kx;
    }
    if (!var) return LIM_FAIL; /* unreachable: a fixed-width whole is decided above */
    uint64_t kmin = var->min, kmax = var->max == REP_INF ? UINT64_MAX : var->max;
    if (lo > fixed) {
        uint64_t need = (lo - fixed + w - 1) / w;
        if (need > kmin) kmin = need;
    }
    if (hi != UINT64_MAX) {
        if (hi < fixed) return LIM_EMPTY;
        uint64_t room = (hi - fixed) / w;
        if (room < kmax) kmax = room;
    }
    if (kmin > kmax) return LIM_EMPTY;
    if (kmin > CV_EBNF_MAX_REPEAT) return LIM_FAIL;
    if (kmax != UINT64_MAX && kmax > CV_EBNF_MAX_REPEAT) kmax = CV_EBNF_MAX_REPEAT;
    var->min = (uint32_t)kmin;
    var->max = kmax == UINT64_MAX ? REP_INF : (uint32_t)kmax;
    return LIM_OK;
}

bool cv_regex_limit_length(cv_regex *re, uint64_t min, uint64_t max, bool *empty) {
    *empty = false;
    lim r = limit(re->root, min, max);
    if (r == LIM_EMPTY) *empty = true;
    if (r != LIM_OK) return false;
    re->root = simplify(re->root);
    return true;
}

static bool within(const rnode *n, const cv_cpset *s) {
    if (n->kind == RN_SET) {
        cv_cpset outside = {0};
        cv_cpset_copy(&outside, s);
        cv_cpset_invert(&outside);
        cv_cpset_intersect(&outside, &n->set);
        bool ok = outside.n == 0;
        cv_cpset_free(&outside);
        return ok;
    }
    for (size_t i = 0; i < n->n; i++)
        if (!within(n->kid[i], s)) return false;
    return true;
}

bool cv_regex_within(const cv_regex *re, const cv_cpset *s) { return within(re->root, s); }

/* ---- writing EBNF ---------------------------------------------------------------------------------------- */

static bool single_cp(const rnode *n) {
    return n->kind == RN_SET && n->set.n == 1 && n->set.r[0][0] == n->set.r[0][1];
}

static void emit(const rnode *n, bool json, cv_text *out);

/* A node as one element of a sequence or the operand of a repetition. */
static void emit_atom(const rnode *n, bool json, cv_text *out) {
    if (n->kind == RN_CAT || n->kind == RN_ALT) {
        cv_text_put(out, "(");
        emit(n, json, out);
        cv_text_put(out, ")");
    } else {
        emit(n, json, out);
    }
}

static void emit(const rnode *n, bool json, cv_text *out) {
    switch (n->kind) {
    case RN_SET:
        if (json)
            cv_ebnf_json_char(out, &n->set);
        else
            cv_ebnf_class(out, &n->set);
        return;
    case RN_CAT:
        for (size_t i = 0; i < n->n;) {
            if (i) cv_text_put(out, " ");
            if (!single_cp(n->kid[i])) {
                emit_atom(n->kid[i], json, out);
                i++;
                continue;
            }
            /* a run of single characters is one literal */
            cv_text run = {0};
            for (; i < n->n && single_cp(n->kid[i]); i++) {
                char u[4];
                size_t k = cv_utf8_encode(n->kid[i]->set.r[0][0], u);
                if (json)
                    cv_json_escape(&run, u, k);
                else
                    cv_text_putn(&run, u, k);
            }
            cv_ebnf_literal(out, run.s, run.len);
            cv_text_free(&run);
        }
        return;
    case RN_ALT:
        for (size_t i = 0; i < n->n; i++) {
            if (i) cv_text_put(out, " | ");
            emit(n->kid[i], json, out);
        }
        return;
    case RN_REP:
        emit_atom(n->kid[0], json, out);
        if (n->min == 0 && n->max == 1)
            cv_text_put(out, "?");
        else if (n->min == 0 && n->max == REP_INF)
            cv_text_put(out, "*");
        else if (n->min == 1 && n->max == REP_INF)
            cv_text_put(out, "+");
        else if (n->max == REP_INF)
            cv_text_printf(out, "{%u,}", n->min);
        else if (n->min == n->max)
            cv_text_printf(out, "{%u}", n->min);
        else
            cv_text_printf(out, "{%u,%u}", n->min, n->max);
        return;
    default: return; /* RN_EMPTY: nothing to write */
    }
}

void cv_regex_emit(const cv_regex *re, bool json, cv_text *out) {
    if (re->root->kind == RN_ALT)
        emit_atom(re->root, json, out);
    else
        emit(re->root, json, out);
}

char *cv_regex_to_ebnf(const char *regex, size_t len, char *err, size_t err_len) {
    cv_regex *re = cv_regex_parse(regex, len, CV_RE_PYTHON, err, err_len);
    if (!re) return NULL;
    cv_text t = {0};
    cv_text_put(&t, "root ::= ");
    cv_regex_emit(re, false, &t);
    cv_text_put(&t, "\n");
    cv_regex_free(re);
    return cv_text_take(&t);
}
