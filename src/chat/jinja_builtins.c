/*
 * jinja_builtins.c — Jinja2's filters and tests, Python's str/dict methods, and the globals that
 * transformers adds (raise_exception, strftime_now) or Jinja2 provides (range, dict, namespace).
 *
 * Each behaves like its Python original where the output can differ: filters that take strings
 * call str() on their input first (soft_str), `default` only replaces Undefined unless its second
 * argument is true, sort/unique/min/max compare strings case-insensitively by default, `title` is
 * Jinja's (split at whitespace, '-', brackets) while str.title() is Python's, and tojson is
 * transformers' json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
 * with its positional order. select/map & co. return lists where Jinja returns generators, so only
 * printing such a generator directly (which shows a memory address in Python) differs. The sandbox
 * transformers uses is immutable, so list and dict mutators raise its SecurityError message.
 * Case mapping is Unicode's simple mapping (utf8proc), not Python's full one ('ß'.upper() stays 'ß').
 */
#define _GNU_SOURCE /* memmem */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>

#include <utf8proc.h>

#include "base/error.h"
#include "chat/jinja_internal.h"

#define MAX_RANGE 100000

/* ---- argument access -------------------------------------------------------------------------- */

static const jv *arg(const jargs *a, int pos, const char *kw) {
    if (pos >= 0 && pos < a->npos)
        return &a->pos[pos];
    if (kw) {
        size_t kl = strlen(kw);
        for (int i = 0; i < a->nkw; i++)
            if (a->kwn[i].n == kl && memcmp(a->kwn[i].s, kw, kl) == 0)
                return &a->kwv[i];
    }
    return NULL;
}

static bool arg_bool(const jargs *a, int pos, const char *kw, bool dflt) {
    const jv *v = arg(a, pos, kw);
    return v ? jv_truthy(v) : dflt;
}

static jv arg_str(jctx *c, const jargs *a, int pos, const char *kw, const char *dflt) {
    const jv *v = arg(a, pos, kw);
    if (!v)
        return jv_strn(dflt, strlen(dflt));
    return jv_to_str(c, v);
}

static int64_t arg_int(jctx *c, const jargs *a, int pos, const char *kw, int64_t dflt) {
    const jv *v = arg(a, pos, kw);
    if (!v || v->type == JV_NONE)
        return dflt;
    if (v->type == JV_INT)
        return v->i;
    if (v->type == JV_BOOL)
        return v->b;
    if (v->type == JV_UNDEF)
        jv_fail_undefined(c, v);
    jfail(c, "'%s' object cannot be interpreted as an integer", jv_type_name(v->type));
}

static jv mkstr(jbuf *b) { return jv_strn(b->p ? b->p : "", b->n); }

/* ---- string helpers ----------------------------------------------------------------------------- */

typedef uint32_t (*cp_map)(uint32_t);
static uint32_t cp_lower(uint32_t cp) { return cp < 0x80 ? (cp >= 'A' && cp <= 'Z' ? cp + 32 : cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); }
static uint32_t cp_upper(uint32_t cp) { return cp < 0x80 ? (cp >= 'a' && cp <= 'z' ? cp - 32 : cp) : (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); }
static uint32_t cp_title(uint32_t cp) { return cp < 0x80 ? cp_upper(cp) : (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp); }

static void put_cp(jbuf *b, uint32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, tmp);
    jb_put(b, (const char *)tmp, (size_t)n);
}

static bool cp_is_cased(uint32_t cp) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

static bool cp_is_alnum(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z');
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* The unconditional multi-character mappings of SpecialCasing.txt that Python applies and
 * utf8proc's simple mappings lack: {code point, title, upper, lower}. */
typedef struct special_case { uint32_t cp; const char *title, *upper, *lower; } special_case;
static const special_case SPECIAL_CASES[] = {
    {0x00DF, "Ss", "SS", NULL},          {0x0130, NULL, NULL, "i\xcc\x87"},
    {0x0149, "\xca\xbcN", "\xca\xbcN", NULL}, {0xFB00, "Ff", "FF", NULL},
    {0xFB01, "Fi", "FI", NULL},          {0xFB02, "Fl", "FL", NULL},
    {0xFB03, "Ffi", "FFI", NULL},        {0xFB04, "Ffl", "FFL", NULL},
    {0xFB05, "St", "ST", NULL},          {0xFB06, "St", "ST", NULL},
};

/* Writes the case mapping of cp; prev/next are the neighbouring code points (0 at the ends),
 * needed for the final-sigma rule of str.lower(). */
static void put_mapped(jbuf *b, uint32_t cp, cp_map f, uint32_t prev, uint32_t next) {
    if (cp >= 0x80) {
        for (size_t i = 0; i < CV_ARRAY_LEN(SPECIAL_CASES); i++) {
            if (SPECIAL_CASES[i].cp != cp)
                continue;
            const char *m = f == cp_title ? SPECIAL_CASES[i].title : f == cp_upper ? SPECIAL_CASES[i].upper
                                                                                    : SPECIAL_CASES[i].lower;
            if (m) {
                jb_puts(b, m);
                return;
            }
        }
        if (cp == 0x03A3 && f == cp_lower && prev && cp_is_cased(prev) && !(next && cp_is_cased(next))) {
            put_cp(b, 0x03C2); /* final sigma */
            return;
        }
    }
    put_cp(b, f(cp));
}

static jv map_chars(jctx *c, jv s, cp_map f) {
    jbuf b;
    jb_init(&b, &c->arena);
    uint32_t prev = 0;
    for (size_t i = 0; i < s.n;) {
        size_t adv, adv2 = 0;
        uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
        uint32_t next = i + adv < s.n ? ju_decode(s.s + i + adv, s.n - i - adv, &adv2) : 0;
        put_mapped(&b, cp, f, prev, next);
        prev = cp;
        i += adv;
    }
    return mkstr(&b);
}

/* str.capitalize(): first character title-cased, the rest lower-cased. */
static jv py_capitalize(jctx *c, jv s) {
    jbuf b;
    jb_init(&b, &c->arena);
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
        put_mapped(&b, cp, i == 0 ? cp_title : cp_lower, 0, 0);
        i += adv;
    }
    return mkstr(&b);
}

/* str.title(): a cased character after a cased one is lowered, after anything else titled. */
static jv py_title(jctx *c, jv s) {
    jbuf b;
    jb_init(&b, &c->arena);
    bool prev_cased = false;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
        bool cased = cp_is_cased(cp);
        if (cased)
            put_mapped(&b, cp, prev_cased ? cp_lower : cp_title, 0, 0);
        else
            put_cp(&b, cp);
        prev_cased = cased;
        i += adv;
    }
    return mkstr(&b);
}

/* Jinja's title filter: pieces split at runs of [-\s({[<] get upper(first) + lower(rest). */
static bool is_title_sep(uint32_t cp) { return ju_py_isspace(cp) || (cp < 0x80 && strchr("-({[<", (int)cp)); }
static jv jinja_title(jctx *c, jv s) {
    jbuf b;
    jb_init(&b, &c->arena);
    bool at_start = true;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
        if (is_title_sep(cp)) {
            put_cp(&b, cp);
            at_start = true;
        } else {
            put_mapped(&b, cp, at_start ? cp_upper : cp_lower, 0, 0);
            at_start = false;
        }
        i += adv;
    }
    return mkstr(&b);
}

static bool cp_in(uint32_t cp, const jv *chars) {
    for (size_t i = 0; i < chars->n;) {
        size_t adv;
        if (ju_decode(chars->s + i, chars->n - i, &adv) == cp)
            return true;
        i += adv;
    }
    return false;
}

/* str.strip/lstrip/rstrip; chars NULL means whitespace. */
static jv py_strip(jctx *c, jv s, const jv *chars, bool left, bool right) {
    if (chars && chars->type != JV_STR && chars->type != JV_NONE)
        jfail(c, "strip arg must be None or str");
    if (chars && chars->type == JV_NONE)
        chars = NULL;
    size_t start = 0, end = s.n;
    if (left) {
        while (start < end) {
            size_t adv;
            uint32_t cp = ju_decode(s.s + start, end - start, &adv);
            if (!(chars ? cp_in(cp, chars) : ju_py_isspace(cp)))
                break;
            start += adv;
        }
    }
    if (right) {
        while (end > start) {
            size_t b = end - 1;
            while (b > start && ((unsigned char)s.s[b] & 0xC0) == 0x80)
                b--;
            size_t adv;
            uint32_t cp = ju_decode(s.s + b, end - b, &adv);
            if (!(chars ? cp_in(cp, chars) : ju_py_isspace(cp)))
                break;
            end = b;
        }
    }
    return jv_strn(s.s + start, end - start);
}

static const char *find_sub(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0)
        return h;
    if (nn > hn)
        return NULL;
    return memmem(h, hn, n, nn);
}

static jv py_replace(jctx *c, jv s, jv old, jv new_, int64_t count) {
    jbuf b;
    jb_init(&b, &c->arena);
    if (old.n == 0) { /* Python inserts `new` before every character and at the end */
        int64_t done = 0;
        size_t i = 0;
        while (i <= s.n) {
            if (count < 0 || done < count) {
                jb_put(&b, new_.s, new_.n);
                done++;
            }
            if (i == s.n)
                break;
            size_t adv;
            ju_decode(s.s + i, s.n - i, &adv);
            jb_put(&b, s.s + i, adv);
            i += adv;
        }
        return mkstr(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        const char *hit = find_sub(s.s + i, s.n - i, old.s, old.n);
        if (!hit)
            break;
        size_t at = (size_t)(hit - s.s);
        jb_put(&b, s.s + i, at - i);
        jb_put(&b, new_.s, new_.n);
        i = at + old.n;
        done++;
    }
    jb_put(&b, s.s + i, s.n - i);
    return mkstr(&b);
}

static jv py_split(jctx *c, jv s, const jv *sep, int64_t maxsplit, bool from_right) {
    jlist *l = jl_new(&c->arena, 0);
    if (sep && sep->type != JV_NONE) {
        if (sep->type != JV_STR)
            jfail(c, "must be str or None, not %s", jv_type_name(sep->type));
        if (sep->n == 0)
            jfail(c, "empty separator");
        if (!from_right) {
            size_t i = 0;
            while (maxsplit < 0 || (int64_t)l->n < maxsplit) {
                const char *hit = find_sub(s.s + i, s.n - i, sep->s, sep->n);
                if (!hit)
                    break;
                jl_push(&c->arena, l, jv_strn(s.s + i, (size_t)(hit - s.s) - i));
                i = (size_t)(hit - s.s) + sep->n;
            }
            jl_push(&c->arena, l, jv_strn(s.s + i, s.n - i));
            return jv_list(l);
        }
        size_t end = s.n;
        int64_t done = 0;
        jlist *rev = jl_new(&c->arena, 0);
        while (maxsplit < 0 || done < maxsplit) {
            const char *hit = NULL;
            for (size_t k = end; k >= sep->n; k--)
                if (memcmp(s.s + k - sep->n, sep->s, sep->n) == 0) {
                    hit = s.s + k - sep->n;
                    break;
                }
            if (!hit)
                break;
            size_t at = (size_t)(hit - s.s);
            jl_push(&c->arena, rev, jv_strn(s.s + at + sep->n, end - at - sep->n));
            end = at;
            done++;
        }
        jl_push(&c->arena, rev, jv_strn(s.s, end));
        for (size_t k = rev->n; k > 0; k--)
            jl_push(&c->arena, l, rev->v[k - 1]);
        return jv_list(l);
    }
    /* whitespace split: runs of whitespace separate, ends are ignored */
    jlist *chars = jv_iterate(c, &s);
    size_t n = chars->n;
    bool *sp = ja_alloc(&c->arena, n + 1);
    for (size_t k = 0; k < n; k++) {
        size_t adv;
        sp[k] = ju_py_isspace(ju_decode(chars->v[k].s, chars->v[k].n, &adv));
    }
    const char *base = s.s;
#define OFF(k) ((k) < n ? (size_t)(chars->v[k].s - base) : s.n)
    if (!from_right) {
        size_t k = 0;
        while (true) {
            while (k < n && sp[k])
                k++;
            if (k == n)
                break;
            if (maxsplit >= 0 && (int64_t)l->n == maxsplit) { /* the rest, trailing spaces included */
                jl_push(&c->arena, l, jv_strn(base + OFF(k), s.n - OFF(k)));
                break;
            }
            size_t st = k;
            while (k < n && !sp[k])
                k++;
            jl_push(&c->arena, l, jv_strn(base + OFF(st), OFF(k) - OFF(st)));
        }
        return jv_list(l);
    }
    jlist *rev = jl_new(&c->arena, 0);
    size_t k = n;
    while (true) {
        while (k > 0 && sp[k - 1])
            k--;
        if (k == 0)
            break;
        if (maxsplit >= 0 && (int64_t)rev->n == maxsplit) { /* the rest, leading spaces included */
            jl_push(&c->arena, rev, jv_strn(base, OFF(k)));
            break;
        }
        size_t e = k;
        while (k > 0 && !sp[k - 1])
            k--;
        jl_push(&c->arena, rev, jv_strn(base + OFF(k), OFF(e) - OFF(k)));
    }
#undef OFF
    for (size_t q = rev->n; q > 0; q--)
        jl_push(&c->arena, l, rev->v[q - 1]);
    return jv_list(l);
}

static bool is_line_break(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static jv py_splitlines(jctx *c, jv s) {
    jlist *l = jl_new(&c->arena, 0);
    size_t start = 0, i = 0;
    while (i < s.n) {
        size_t adv;
        uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
        if (is_line_break(cp)) {
            jl_push(&c->arena, l, jv_strn(s.s + start, i - start));
            i += adv;
            if (cp == '\r' && i < s.n && s.s[i] == '\n')
                i++;
            start = i;
        } else {
            i += adv;
        }
    }
    if (start < s.n)
        jl_push(&c->arena, l, jv_strn(s.s + start, s.n - start));
    return jv_list(l);
}

static bool has_affix(jctx *c, jv s, const jv *fix, bool prefix) {
    if (fix->type == JV_LIST && fix->tuple) {
        for (size_t i = 0; i < fix->l->n; i++)
            if (has_affix(c, s, &fix->l->v[i], prefix))
                return true;
        return false;
    }
    if (fix->type != JV_STR)
        jfail(c, "%s first arg must be str or a tuple of str, not %s", prefix ? "startswith" : "endswith",
              jv_type_name(fix->type));
    if (fix->n > s.n)
        return false;
    return memcmp(prefix ? s.s : s.s + s.n - fix->n, fix->s, fix->n) == 0;
}

/* ---- printf-style formatting (str % args) ------------------------------------------------------- */

/* The digits of a width or precision at *i (none: `none`; Python reads "%.f" as precision 0), bounded: a template asks for a million characters at most, so snprintf's int never
 * overflows and a runaway width fails with a message instead of gigabytes of padding. */
enum { FORMAT_COUNT_MAX = 1 << 20 };

static long format_count(jctx *c, const jv *fmt, size_t *i, const char *what, long none) {
    if (*i >= fmt->n || fmt->s[*i] < '0' || fmt->s[*i] > '9')
        return none;
    long v = 0;
    for (; *i < fmt->n && fmt->s[*i] >= '0' && fmt->s[*i] <= '9'; (*i)++) {
        v = v * 10 + (fmt->s[*i] - '0');
        if (v > FORMAT_COUNT_MAX)
            jfail(c, "format %s too large (at most %d)", what, FORMAT_COUNT_MAX);
    }
    return v;
}

/* "%" flags width .prec conv into spec (40 bytes: 5 flags, two 7-digit numbers). */
static void format_spec(char *spec, const char *flags, long width, long prec, char conv) {
    int n = sprintf(spec, "%%%s", flags);
    if (width >= 0)
        n += sprintf(spec + n, "%ld", width);
    if (prec >= 0)
        n += sprintf(spec + n, ".%ld", prec);
    sprintf(spec + n, "%c", conv);
}

/* A float through spec, into a buffer of its own length (a wide field or a long %f is not cut). */
static void put_double(jctx *c, jbuf *b, const char *spec, double f) {
    const int n = snprintf(NULL, 0, spec, f);
    if (n < 0)
        jfail(c, "cannot format a number with %s", spec);
    char *tmp = ja_alloc(&c->arena, (size_t)n + 1);
    snprintf(tmp, (size_t)n + 1, spec, f);
    jb_put(b, tmp, (size_t)n);
}

static void put_fill(jbuf *b, char ch, long n) {
    for (; n > 0; n--)
        jb_putc(b, ch);
}

/* %s and %r: the first prec code points of s (all when prec < 0), padded with spaces to width code
 * points, on the left unless left-justified — Python's str formatting ('0' pads strings with spaces). */
static void put_padded(jbuf *b, const char *s, size_t n, long prec, long width, bool left) {
    size_t bytes = 0;
    long points = 0;
    while (bytes < n && (prec < 0 || points < prec)) {
        size_t adv;
        ju_decode(s + bytes, n - bytes, &adv);
        bytes += adv;
        points++;
    }
    if (!left)
        put_fill(b, ' ', width - points);
    jb_put(b, s, bytes);
    if (left)
        put_fill(b, ' ', width - points);
}

/* %d %i %x %X %o as Python writes an int (not C): a '-' sign of its own before the digits of the
 * magnitude, '+' or ' ' for the others when flagged; '#' puts 0x, 0X or 0o after the sign; at least
 * prec digits; '0' fills the width with zeros between those and the digits, even with a precision;
 * else spaces before, or after when left-justified ('-'). */
static void put_int(jbuf *b, long long v, char conv, const char *flags, long prec, long width) {
    char digits[24];
    const unsigned long long m = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    const char *base = conv == 'o' ? "%llo" : conv == 'x' ? "%llx" : conv == 'X' ? "%llX" : "%llu";
    const long nd = snprintf(digits, sizeof digits, base, m);
    const char *sign = v < 0 ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
    const char *prefix = !strchr(flags, '#') ? "" : conv == 'x' ? "0x" : conv == 'X' ? "0X" : conv == 'o' ? "0o" : "";
    long zeros = prec > nd ? prec - nd : 0;
    const long len = (long)(strlen(sign) + strlen(prefix)) + zeros + nd;
    const bool left = strchr(flags, '-') != NULL;
    long pad = width > len ? width - len : 0;
    if (!left && strchr(flags, '0'))
        zeros += pad, pad = 0;
    if (!left)
        put_fill(b, ' ', pad);
    jb_puts(b, sign);
    jb_puts(b, prefix);
    put_fill(b, '0', zeros);
    jb_put(b, digits, (size_t)nd);
    if (left)
        put_fill(b, ' ', pad);
}

jv jb_percent_format(jctx *c, const jv *fmt, const jv *args) {
    jbuf b;
    jb_init(&b, &c->arena);
    size_t argi = 0;
    bool tuple = args->type == JV_LIST && args->tuple;
    size_t nargs = tuple ? args->l->n : 1;
    for (size_t i = 0; i < fmt->n; i++) {
        char ch = fmt->s[i];
        if (ch != '%') {
            jb_putc(&b, ch);
            continue;
        }
        if (++i >= fmt->n)
            jfail(c, "incomplete format");
        const jv *val = NULL;
        if (fmt->s[i] == '(') {
            size_t e = i + 1;
            while (e < fmt->n && fmt->s[e] != ')')
                e++;
            if (e >= fmt->n || args->type != JV_DICT)
                jfail(c, "format requires a mapping");
            val = jd_get_str(args->d, fmt->s + i + 1, e - i - 1);
            if (!val)
                jfail(c, "KeyError: '%.*s'", (int)(e - i - 1), fmt->s + i + 1);
            i = e + 1;
        }
        char flags[8] = "";
        size_t nf = 0;
        for (; i < fmt->n && fmt->s[i] && strchr("-+ #0", fmt->s[i]); i++)
            if (nf < sizeof flags - 1 && !memchr(flags, fmt->s[i], nf))
                flags[nf++] = fmt->s[i];
        const long width = format_count(c, fmt, &i, "width", -1);
        long prec = -1;
        if (i < fmt->n && fmt->s[i] == '.') {
            i++;
            prec = format_count(c, fmt, &i, "precision", 0);
        }
        if (i >= fmt->n)
            jfail(c, "incomplete format");
        char conv = fmt->s[i];
        if (conv == '%') {
            jb_putc(&b, '%');
            continue;
        }
        if (!val) {
            if (argi >= nargs)
                jfail(c, "not enough arguments for format string");
            val = tuple ? &args->l->v[argi] : args;
            argi++;
        }
        switch (conv) {
        case 's':
        case 'r': {
            jbuf t;
            jb_init(&t, &c->arena);
            if (conv == 's')
                jv_str(c, &t, val);
            else
                jv_repr(c, &t, val);
            put_padded(&b, t.p, t.n, prec, width, strchr(flags, '-') != NULL);
            continue;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o': {
            const bool real = conv == 'd' || conv == 'i';
            if (val->type != JV_INT && val->type != JV_BOOL && (!real || val->type != JV_FLOAT))
                jfail(c, "%%%c format: %s is required, not %s", conv, real ? "a real number" : "an integer",
                      jv_type_name(val->type));
            if (val->type == JV_FLOAT && (isnan(val->f) || isinf(val->f)))
                jfail(c, "cannot convert float %s to integer", isnan(val->f) ? "NaN" : "infinity");
            if (val->type == JV_FLOAT && !(fabs(val->f) < 0x1p63))
                jfail(c, "%%%c format of a float beyond 2^63 is not supported", conv);
            put_int(&b, val->type == JV_FLOAT ? (long long)val->f : val->type == JV_INT ? val->i : val->b, conv, flags,
                    prec, width);
            continue;
        }
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G': {
            if (val->type != JV_INT && val->type != JV_BOOL && val->type != JV_FLOAT)
                jfail(c, "must be real number, not %s", jv_type_name(val->type));
            double v = val->type == JV_FLOAT ? val->f : val->type == JV_INT ? (double)val->i : val->b;
            char spec[40];
            format_spec(spec, flags, width, prec, conv);
            put_double(c, &b, spec, v);
            continue;
        }
        default: jfail(c, "unsupported format character '%c'", conv);
        }
    }
    if (argi < nargs && args->type != JV_DICT)
        jfail(c, "not all arguments converted during string formatting");
    return mkstr(&b);
}

/* ---- tojson --------------------------------------------------------------------------------------- */

static jv do_tojson(jctx *c, jv v, const jargs *a) {
    jjson_opts o = {.indent = "", .has_indent = false, .item_sep = ", ", .key_sep = ": "};
    o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
    const jv *indent = arg(a, 1, "indent");
    if (indent && indent->type != JV_NONE) {
        o.has_indent = true;
        o.item_sep = ",";
        if (indent->type == JV_STR) {
            o.indent = ja_strndup(&c->arena, indent->s, indent->n);
        } else {
            int64_t w = arg_int(c, a, 1, "indent", 0);
            if (w < 0)
                w = 0;
            if (w > 64)
                jfail(c, "tojson indent %lld is too large", (long long)w);
            char *sp = ja_alloc(&c->arena, (size_t)w + 1);
            memset(sp, ' ', (size_t)w);
            sp[w] = '\0';
            o.indent = sp;
        }
    }
    const jv *seps = arg(a, 2, "separators");
    if (seps && seps->type != JV_NONE) {
        if (seps->type != JV_LIST || seps->l->n != 2 || seps->l->v[0].type != JV_STR || seps->l->v[1].type != JV_STR)
            jfail(c, "tojson separators must be a pair of strings");
        o.item_sep = ja_strndup(&c->arena, seps->l->v[0].s, seps->l->v[0].n);
        o.key_sep = ja_strndup(&c->arena, seps->l->v[1].s, seps->l->v[1].n);
    }
    o.sort_keys = arg_bool(a, 3, "sort_keys", false);
    jbuf b;
    jb_init(&b, &c->arena);
    jv_tojson(c, &b, &v, &o, 0);
    return mkstr(&b);
}

/* ---- sorting ------------------------------------------------------------------------------------- */

/* Resolves "a.b.0" the way Jinja's make_attrgetter does (each part through getitem). */
static jv get_attr_path(jctx *c, jv item, const jv *path) {
    if (path->type == JV_INT)
        return jv_getitem(c, &item, path);
    jv p = jv_to_str(c, path);
    size_t i = 0;
    while (true) {
        size_t e = i;
        while (e < p.n && p.s[e] != '.')
            e++;
        jv key = jv_strn(p.s + i, e - i);
        bool digits = e > i;
        for (size_t k = i; k < e; k++)
            digits &= p.s[k] >= '0' && p.s[k] <= '9';
        if (digits)
            key = jv_int(strtoll(key.s, NULL, 10));
        item = jv_getitem(c, &item, &key);
        if (e >= p.n)
            return item;
        i = e + 1;
    }
}

static jv sort_key(jctx *c, jv v, bool case_sensitive) {
    return !case_sensitive && v.type == JV_STR ? map_chars(c, v, cp_lower) : v;
}

/* Stable merge sort of items by keys; comparisons may fail (TypeError) via jfail. */
static void merge_sort(jctx *c, jv *items, jv *keys, size_t n, bool reverse) {
    if (n < 2)
        return;
    jv *ti = ja_alloc(&c->arena, n * sizeof(jv)), *tk = ja_alloc(&c->arena, n * sizeof(jv));
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r = jv_cmp(c, &keys[j], &keys[i]);
                bool take_right = reverse ? r > 0 : r < 0;
                if (take_right) {
                    ti[k] = items[j];
                    tk[k++] = keys[j++];
                } else {
                    ti[k] = items[i];
                    tk[k++] = keys[i++];
                }
            }
            while (i < mid) {
                ti[k] = items[i];
                tk[k++] = keys[i++];
            }
            while (j < hi) {
                ti[k] = items[j];
                tk[k++] = keys[j++];
            }
        }
        memcpy(items, ti, n * sizeof(jv));
        memcpy(keys, tk, n * sizeof(jv));
    }
}

static jv do_sort(jctx *c, jv v, bool reverse, bool case_sensitive, const jv *attribute) {
    jlist *src = jv_iterate(c, &v);
    jlist *l = jl_new(&c->arena, src->n);
    jv *keys = ja_alloc(&c->arena, (src->n + 1) * sizeof(jv));
    for (size_t i = 0; i < src->n; i++) {
        l->v[i] = src->v[i];
        jv k = attribute && attribute->type != JV_NONE ? get_attr_path(c, src->v[i], attribute) : src->v[i];
        keys[i] = sort_key(c, k, case_sensitive);
    }
    l->n = src->n;
    merge_sort(c, l->v, keys, l->n, reverse);
    return jv_list(l);
}

static jv do_minmax(jctx *c, jv v, const jargs *a, bool want_max) {
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    const jv *attribute = arg(a, 1, "attribute");
    jlist *items = jv_iterate(c, &v);
    if (items->n == 0) {
        jv u = jv_undef();
        return u;
    }
    size_t best = 0;
    jv bk = sort_key(c, attribute ? get_attr_path(c, items->v[0], attribute) : items->v[0], cs);
    for (size_t i = 1; i < items->n; i++) {
        jv k = sort_key(c, attribute ? get_attr_path(c, items->v[i], attribute) : items->v[i], cs);
        int r = jv_cmp(c, &k, &bk);
        if (want_max ? r > 0 : r < 0) {
            best = i;
            bk = k;
        }
    }
    return items->v[best];
}

/* ---- filter table --------------------------------------------------------------------------------- */

typedef jv (*filter_fn)(jctx *c, jv in, const jargs *a);

static jv f_abs(jctx *c, jv in, const jargs *a) {
    (void)a;
    if (in.type == JV_INT) {
        if (in.i == INT64_MIN)
            jfail(c, "integer overflow");
        return jv_int(in.i < 0 ? -in.i : in.i);
    }
    if (in.type == JV_BOOL)
        return jv_int(in.b);
    if (in.type == JV_FLOAT)
        return jv_float(fabs(in.f));
    jfail(c, "bad operand type for abs(): '%s'", jv_type_name(in.type));
}
static jv f_attr(jctx *c, jv in, const jargs *a) {
    jv name = arg_str(c, a, 0, "name", "");
    if (in.type == JV_DICT) { /* attributes only: keys are not attributes */
        bool found;
        jv m = jb_method(c, &in, name.s, name.n, &found);
        return found ? m : jv_undef();
    }
    return jv_getattr(c, &in, name.s, name.n);
}
static jv f_capitalize(jctx *c, jv in, const jargs *a) { (void)a; return py_capitalize(c, jv_to_str(c, &in)); }
static jv f_center(jctx *c, jv in, const jargs *a) {
    jv s = jv_to_str(c, &in);
    int64_t width = arg_int(c, a, 0, "width", 80);
    int64_t len = (int64_t)ju_cplen(s.s, s.n), marg = width - len;
    if (marg <= 0)
        return s;
    if (width > 1 << 20)
        jfail(c, "center width too large");
    int64_t left = marg / 2 + (marg & width & 1);
    jbuf b;
    jb_init(&b, &c->arena);
    for (int64_t i = 0; i < left; i++)
        jb_putc(&b, ' ');
    jb_put(&b, s.s, s.n);
    for (int64_t i = 0; i < marg - left; i++)
        jb_putc(&b, ' ');
    return mkstr(&b);
}
static jv f_default(jctx *c, jv in, const jargs *a) {
    (void)c;
    const jv *d = arg(a, 0, "default_value");
    bool boolean = arg_bool(a, 1, "boolean", false);
    if (in.type == JV_UNDEF || (boolean && !jv_truthy(&in)))
        return d ? *d : jv_strn("", 0);
    return in;
}
static jv f_dictsort(jctx *c, jv in, const jargs *a) {
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    jv by = arg_str(c, a, 1, "by", "key");
    bool reverse = arg_bool(a, 2, "reverse", false);
    if (in.type != JV_DICT)
        jfail(c, "dictsort needs a mapping");
    int pos;
    if (by.n == 3 && memcmp(by.s, "key", 3) == 0)
        pos = 0;
    else if (by.n == 5 && memcmp(by.s, "value", 5) == 0)
        pos = 1;
    else
        jfail(c, "You can only sort by either \"key\" or \"value\"");
    jlist *l = jl_new(&c->arena, in.d->n);
    jv *keys = ja_alloc(&c->arena, (in.d->n + 1) * sizeof(jv));
    for (size_t i = 0; i < in.d->n; i++) {
        jlist *pair = jl_new(&c->arena, 2);
        pair->v[0] = in.d->k[i];
        pair->v[1] = in.d->v[i];
        pair->n = 2;
        l->v[l->n++] = jv_tuple(pair);
        keys[i] = sort_key(c, pair->v[pos], cs);
    }
    merge_sort(c, l->v, keys, l->n, reverse);
    return jv_list(l);
}
static jv f_escape(jctx *c, jv in, const jargs *a) {
    (void)a;
    jv s = jv_to_str(c, &in);
    jbuf b;
    jb_init(&b, &c->arena);
    for (size_t i = 0; i < s.n; i++) {
        switch (s.s[i]) {
        case '&': jb_puts(&b, "&amp;"); break;
        case '<': jb_puts(&b, "&lt;"); break;
        case '>': jb_puts(&b, "&gt;"); break;
        case '"': jb_puts(&b, "&#34;"); break;
        case '\'': jb_puts(&b, "&#39;"); break;
        default: jb_putc(&b, s.s[i]);
        }
    }
    return mkstr(&b);
}
static jv f_first(jctx *c, jv in, const jargs *a) {
    (void)a;
    jlist *l = jv_iterate(c, &in);
    return l->n ? l->v[0] : jv_undef();
}
static jv f_last(jctx *c, jv in, const jargs *a) {
    (void)a;
    jlist *l = jv_iterate(c, &in);
    return l->n ? l->v[l->n - 1] : jv_undef();
}
static bool parse_full_number(jv s, bool *is_int, int64_t *iv, double *fv) {
    char buf[128];
    size_t k = 0;
    jv t = s;
    /* Python accepts surrounding whitespace and '_' between digits */
    size_t st = 0, en = t.n;
    while (st < en && (t.s[st] == ' ' || (t.s[st] >= 9 && t.s[st] <= 13)))
        st++;
    while (en > st && (t.s[en - 1] == ' ' || (t.s[en - 1] >= 9 && t.s[en - 1] <= 13)))
        en--;
    if (en - st == 0 || en - st >= sizeof buf)
        return false;
    for (size_t i = st; i < en; i++)
        if (t.s[i] != '_')
            buf[k++] = t.s[i];
    buf[k] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (!*end && !errno) {
        *is_int = true;
        *iv = v;
        return true;
    }
    double d = strtod(buf, &end);
    if (*end || strpbrk(buf, "xXpP"))
        return false;
    *is_int = false;
    *fv = d;
    return true;
}
static jv f_float(jctx *c, jv in, const jargs *a) {
    (void)c;
    const jv *d = arg(a, 0, "default");
    jv dflt = d ? *d : jv_float(0.0);
    if (in.type == JV_FLOAT) return in;
    if (in.type == JV_INT) return jv_float((double)in.i);
    if (in.type == JV_BOOL) return jv_float(in.b);
    if (in.type == JV_STR) {
        bool is_int;
        int64_t iv;
        double fv;
        if (parse_full_number(in, &is_int, &iv, &fv))
            return jv_float(is_int ? (double)iv : fv);
    }
    return dflt;
}
static jv f_int(jctx *c, jv in, const jargs *a) {
    const jv *d = arg(a, 0, "default");
    jv dflt = d ? *d : jv_int(0);
    int64_t base = arg_int(c, a, 1, "base", 10);
    if (in.type == JV_INT) return in;
    if (in.type == JV_BOOL) return jv_int(in.b);
    if (in.type == JV_FLOAT) {
        if (!isfinite(in.f) || fabs(in.f) >= 9.2e18)
            return dflt;
        return jv_int((int64_t)in.f);
    }
    if (in.type == JV_STR) {
        if (base != 10) {
            char buf[80];
            if (in.n == 0 || in.n >= sizeof buf)
                return dflt;
            memcpy(buf, in.s, in.n);
            buf[in.n] = 0;
            char *end;
            errno = 0;
            long long v = strtoll(buf, &end, (int)base);
            return *end || errno ? dflt : jv_int(v);
        }
        bool is_int;
        int64_t iv;
        double fv;
        if (parse_full_number(in, &is_int, &iv, &fv)) {
            if (is_int)
                return jv_int(iv);
            if (isfinite(fv) && fabs(fv) < 9.2e18)
                return jv_int((int64_t)fv);
        }
    }
    return dflt;
}
static jv f_indent(jctx *c, jv in, const jargs *a) {
    if (in.type != JV_STR) /* Jinja appends "\n" to its input, which only works on strings */
        jfail(c, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(in.type));
    jv s = in;
    const jv *w = arg(a, 0, "width");
    jv ind;
    if (w && w->type == JV_STR) {
        ind = *w;
    } else {
        int64_t n = arg_int(c, a, 0, "width", 4);
        if (n < 0)
            n = 0;
        if (n > 1024)
            jfail(c, "indent width too large");
        char *sp = ja_alloc(&c->arena, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        ind = jv_strn(sp, (size_t)n);
    }
    bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
    char *tmp = ja_alloc(&c->arena, s.n + 1);
    memcpy(tmp, s.s, s.n);
    tmp[s.n] = '\n';
    jv lines = py_splitlines(c, jv_strn(tmp, s.n + 1));
    jbuf b;
    jb_init(&b, &c->arena);
    if (first)
        jb_put(&b, ind.s, ind.n);
    for (size_t i = 0; i < lines.l->n; i++) {
        jv ln = lines.l->v[i];
        if (i) {
            jb_putc(&b, '\n');
            if (blank || ln.n)
                jb_put(&b, ind.s, ind.n);
        }
        jb_put(&b, ln.s, ln.n);
    }
    return mkstr(&b);
}
static jv f_items(jctx *c, jv in, const jargs *a) {
    (void)a;
    if (in.type == JV_UNDEF)
        return jv_list(jl_new(&c->arena, 0));
    if (in.type != JV_DICT)
        jfail(c, "Can only get item pairs from a mapping.");
    jlist *l = jl_new(&c->arena, in.d->n);
    for (size_t i = 0; i < in.d->n; i++) {
        jlist *pair = jl_new(&c->arena, 2);
        pair->v[0] = in.d->k[i];
        pair->v[1] = in.d->v[i];
        pair->n = 2;
        l->v[l->n++] = jv_tuple(pair);
    }
    return jv_list(l);
}
static jv f_join(jctx *c, jv in, const jargs *a) {
    jv sep = arg_str(c, a, 0, "d", "");
    const jv *attribute = arg(a, 1, "attribute");
    jlist *l = jv_iterate(c, &in);
    jbuf b;
    jb_init(&b, &c->arena);
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jb_put(&b, sep.s, sep.n);
        jv item = attribute && attribute->type != JV_NONE ? get_attr_path(c, l->v[i], attribute) : l->v[i];
        jv_str(c, &b, &item);
    }
    return mkstr(&b);
}
static jv f_length(jctx *c, jv in, const jargs *a) { (void)a; return jv_int((int64_t)jv_length(c, &in)); }
static jv f_list(jctx *c, jv in, const jargs *a) {
    (void)a;
    jlist *src = jv_iterate(c, &in);
    jlist *l = jl_new(&c->arena, src->n);
    memcpy(l->v, src->v, src->n * sizeof(jv));
    l->n = src->n;
    return jv_list(l);
}
static jv f_lower(jctx *c, jv in, const jargs *a) { (void)a; return map_chars(c, jv_to_str(c, &in), cp_lower); }
static jv f_upper(jctx *c, jv in, const jargs *a) { (void)a; return map_chars(c, jv_to_str(c, &in), cp_upper); }
static jv f_max(jctx *c, jv in, const jargs *a) { return do_minmax(c, in, a, true); }
static jv f_min(jctx *c, jv in, const jargs *a) { return do_minmax(c, in, a, false); }
static jv f_replace(jctx *c, jv in, const jargs *a) {
    jv s = jv_to_str(c, &in);
    jv old = arg_str(c, a, 0, "old", ""), nw = arg_str(c, a, 1, "new", "");
    int64_t count = arg_int(c, a, 2, "count", -1);
    return py_replace(c, s, old, nw, count);
}
static jv f_reverse(jctx *c, jv in, const jargs *a) {
    (void)a;
    jlist *src = jv_iterate(c, &in);
    if (in.type == JV_STR) {
        jbuf b;
        jb_init(&b, &c->arena);
        for (size_t i = src->n; i > 0; i--)
            jb_put(&b, src->v[i - 1].s, src->v[i - 1].n);
        return mkstr(&b);
    }
    jlist *l = jl_new(&c->arena, src->n);
    for (size_t i = src->n; i > 0; i--)
        l->v[l->n++] = src->v[i - 1];
    return jv_list(l);
}
static jv f_round(jctx *c, jv in, const jargs *a) {
    int64_t prec = arg_int(c, a, 0, "precision", 0);
    jv method = arg_str(c, a, 1, "method", "common");
    if (in.type != JV_INT && in.type != JV_FLOAT && in.type != JV_BOOL)
        jfail(c, "round needs a number, not %s", jv_type_name(in.type));
    double v = in.type == JV_FLOAT ? in.f : in.type == JV_INT ? (double)in.i : in.b;
    if (prec > 300 || prec < -300)
        jfail(c, "round precision out of range");
    if (method.n == 6 && memcmp(method.s, "common", 6) == 0) {
        if (prec >= 0 && isfinite(v)) { /* correctly rounded, ties to even: Python's round() */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, v);
            return jv_float(strtod(buf, NULL));
        }
        double m = pow(10.0, (double)-prec);
        return jv_float(nearbyint(v / m) * m);
    }
    double m = pow(10.0, (double)prec);
    if (method.n == 4 && memcmp(method.s, "ceil", 4) == 0)
        return jv_float(ceil(v * m) / m);
    if (method.n == 5 && memcmp(method.s, "floor", 5) == 0)
        return jv_float(floor(v * m) / m);
    jfail(c, "method must be common, ceil or floor");
}
static jv f_safe(jctx *c, jv in, const jargs *a) { (void)a; return jv_to_str(c, &in); }
static jv f_sort(jctx *c, jv in, const jargs *a) {
    return do_sort(c, in, arg_bool(a, 0, "reverse", false), arg_bool(a, 1, "case_sensitive", false),
                   arg(a, 2, "attribute"));
}
static jv f_string(jctx *c, jv in, const jargs *a) { (void)a; return jv_to_str(c, &in); }
static jv f_sum(jctx *c, jv in, const jargs *a) {
    const jv *attribute = arg(a, 0, "attribute");
    const jv *start = arg(a, 1, "start");
    jv acc = start ? *start : jv_int(0);
    jlist *l = jv_iterate(c, &in);
    for (size_t i = 0; i < l->n; i++)
        acc = je_arith(c, OP_ADD, acc, attribute && attribute->type != JV_NONE ? get_attr_path(c, l->v[i], attribute) : l->v[i]);
    return acc;
}
static jv f_title(jctx *c, jv in, const jargs *a) { (void)a; return jinja_title(c, jv_to_str(c, &in)); }
static jv f_tojson(jctx *c, jv in, const jargs *a) { return do_tojson(c, in, a); }
static jv f_trim(jctx *c, jv in, const jargs *a) {
    return py_strip(c, jv_to_str(c, &in), arg(a, 0, "chars"), true, true);
}
static jv f_unique(jctx *c, jv in, const jargs *a) {
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    const jv *attribute = arg(a, 1, "attribute");
    jlist *src = jv_iterate(c, &in);
    jlist *l = jl_new(&c->arena, src->n), *seen = jl_new(&c->arena, src->n);
    for (size_t i = 0; i < src->n; i++) {
        jv k = sort_key(c, attribute ? get_attr_path(c, src->v[i], attribute) : src->v[i], cs);
        bool dup = false;
        for (size_t j = 0; j < seen->n && !dup; j++)
            dup = jv_eq(&seen->v[j], &k);
        if (!dup) {
            seen->v[seen->n++] = k;
            l->v[l->n++] = src->v[i];
        }
    }
    return jv_list(l);
}
static jv f_wordcount(jctx *c, jv in, const jargs *a) {
    (void)a;
    jv s = jv_to_str(c, &in);
    int64_t words = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
        bool w = cp == '_' || cp_is_alnum(cp);
        if (w && !in_word)
            words++;
        in_word = w;
        i += adv;
    }
    return jv_int(words);
}
static jv f_format(jctx *c, jv in, const jargs *a) {
    jv fmt = jv_to_str(c, &in);
    jlist *l = jl_new(&c->arena, (size_t)a->npos);
    for (int i = 0; i < a->npos; i++)
        l->v[l->n++] = a->pos[i];
    jv args = jv_tuple(l);
    if (a->nkw) {
        jdict *d = jd_new(&c->arena, (size_t)a->nkw);
        for (int i = 0; i < a->nkw; i++)
            jd_set(&c->arena, d, jv_strn(a->kwn[i].s, a->kwn[i].n), a->kwv[i]);
        args = jv_dict(d);
    }
    return jb_percent_format(c, &fmt, &args);
}

/* map / select / reject / selectattr / rejectattr */
static jargs shift_args(const jargs *a, int k) {
    jargs r = *a;
    r.pos = a->npos > k ? a->pos + k : NULL;
    r.npos = a->npos > k ? a->npos - k : 0;
    return r;
}

static jv f_map(jctx *c, jv in, const jargs *a) {
    jlist *src = jv_iterate(c, &in);
    jlist *l = jl_new(&c->arena, src->n);
    const jv *attribute = a->npos == 0 ? arg(a, -1, "attribute") : NULL;
    if (attribute) {
        const jv *dflt = arg(a, -1, "default");
        for (size_t i = 0; i < src->n; i++) {
            jv v = get_attr_path(c, src->v[i], attribute);
            l->v[l->n++] = v.type == JV_UNDEF && dflt ? *dflt : v;
        }
        return jv_list(l);
    }
    if (a->npos == 0 || a->pos[0].type != JV_STR)
        jfail(c, "map requires a filter argument");
    jname fname = {a->pos[0].s, (uint32_t)a->pos[0].n, jname_hash(a->pos[0].s, a->pos[0].n)};
    jargs rest = shift_args(a, 1);
    for (size_t i = 0; i < src->n; i++)
        l->v[l->n++] = jb_call_filter(c, &fname, src->v[i], &rest);
    return jv_list(l);
}

static jv select_impl(jctx *c, jv in, const jargs *a, bool use_attr, bool want) {
    jlist *src = jv_iterate(c, &in);
    jlist *l = jl_new(&c->arena, src->n);
    int k = 0;
    const jv *attribute = NULL;
    if (use_attr) {
        attribute = arg(a, 0, "attribute");
        if (!attribute)
            jfail(c, "Missing parameter for attribute name");
        k = 1;
    }
    bool has_test = a->npos > k;
    jname tname = {0};
    if (has_test) {
        if (a->pos[k].type != JV_STR)
            jfail(c, "test name must be a string");
        tname = (jname){a->pos[k].s, (uint32_t)a->pos[k].n, jname_hash(a->pos[k].s, a->pos[k].n)};
        if (!jb_test_exists(&tname))
            jfail(c, "No test named '%.*s'.", (int)tname.n, tname.s);
    }
    jargs rest = shift_args(a, k + 1);
    rest.nkw = 0;
    for (size_t i = 0; i < src->n; i++) {
        jv v = attribute ? get_attr_path(c, src->v[i], attribute) : src->v[i];
        bool ok = has_test ? jb_call_test(c, &tname, v, &rest) : jv_truthy(&v);
        if (ok == want)
            l->v[l->n++] = src->v[i];
    }
    return jv_list(l);
}
static jv f_select(jctx *c, jv in, const jargs *a) { return select_impl(c, in, a, false, true); }
static jv f_reject(jctx *c, jv in, const jargs *a) { return select_impl(c, in, a, false, false); }
static jv f_selectattr(jctx *c, jv in, const jargs *a) { return select_impl(c, in, a, true, true); }
static jv f_rejectattr(jctx *c, jv in, const jargs *a) { return select_impl(c, in, a, true, false); }

typedef struct filter_entry { const char *name; filter_fn fn; } filter_entry;
static const filter_entry FILTERS[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"capitalize", f_capitalize}, {"center", f_center},
    {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort},
    {"e", f_escape}, {"escape", f_escape}, {"first", f_first}, {"float", f_float},
    {"format", f_format}, {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join},
    {"last", f_last}, {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map},
    {"max", f_max}, {"min", f_min}, {"reject", f_reject}, {"rejectattr", f_rejectattr},
    {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
    {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
    {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
    {"upper", f_upper}, {"wordcount", f_wordcount},
};

static const filter_entry *find_filter(const jname *nm) {
    for (size_t i = 0; i < CV_ARRAY_LEN(FILTERS); i++)
        if (strlen(FILTERS[i].name) == nm->n && memcmp(FILTERS[i].name, nm->s, nm->n) == 0)
            return &FILTERS[i];
    return NULL;
}

bool jb_filter_exists(const jname *name) { return find_filter(name) != NULL; }

jv jb_call_filter(jctx *c, const jname *name, jv input, const jargs *args) {
    const filter_entry *f = find_filter(name);
    if (!f)
        jfail(c, "No filter named '%.*s'.", (int)name->n, name->s);
    jstep(c);
    return f->fn(c, input, args);
}

/* ---- tests ---------------------------------------------------------------------------------------- */

static bool num_of(const jv *v, double *out, bool *is_int, int64_t *iv) {
    if (v->type == JV_INT || v->type == JV_BOOL) {
        *iv = v->type == JV_INT ? v->i : v->b;
        *out = (double)*iv;
        *is_int = true;
        return true;
    }
    if (v->type == JV_FLOAT) {
        *out = v->f;
        *is_int = false;
        return true;
    }
    return false;
}

static bool case_test(jctx *c, jv in, bool want_lower) {
    jv s = jv_to_str(c, &in);
    bool cased = false;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
        i += adv;
        if (!cp_is_cased(cp))
            continue;
        cased = true;
        bool lower = cp_lower(cp) == cp && cp_upper(cp) != cp;
        bool upper = cp_upper(cp) == cp && cp_lower(cp) != cp;
        if (want_lower ? !lower : !upper)
            return false;
    }
    return cased;
}

static bool run_test(jctx *c, const jname *nm, jv in, const jargs *a) {
#define IS(lit) (nm->n == sizeof lit - 1 && memcmp(nm->s, lit, nm->n) == 0)
    const jv *other = arg(a, 0, NULL);
    if (IS("defined")) return in.type != JV_UNDEF;
    if (IS("undefined")) return in.type == JV_UNDEF;
    if (IS("none")) return in.type == JV_NONE;
    if (IS("boolean")) return in.type == JV_BOOL;
    if (IS("true")) return in.type == JV_BOOL && in.b;
    if (IS("false")) return in.type == JV_BOOL && !in.b;
    if (IS("integer")) return in.type == JV_INT;
    if (IS("float")) return in.type == JV_FLOAT;
    if (IS("number")) return in.type == JV_INT || in.type == JV_FLOAT || in.type == JV_BOOL;
    if (IS("string")) return in.type == JV_STR;
    if (IS("mapping")) return in.type == JV_DICT;
    if (IS("iterable") || IS("sequence"))
        return in.type == JV_STR || in.type == JV_LIST || in.type == JV_DICT || in.type == JV_UNDEF;
    if (IS("callable")) return in.type == JV_MACRO || in.type == JV_FUNC || in.type == JV_UNDEF;
    if (IS("escaped")) return false;
    if (IS("lower")) return case_test(c, in, true);
    if (IS("upper")) return case_test(c, in, false);
    if (IS("filter") || IS("test")) {
        jv s = jv_to_str(c, &in);
        jname q = {s.s, (uint32_t)s.n, 0};
        return IS("filter") ? jb_filter_exists(&q) : jb_test_exists(&q);
    }
    if (IS("odd") || IS("even")) {
        if (in.type != JV_INT && in.type != JV_BOOL) {
            if (in.type == JV_UNDEF)
                jv_fail_undefined(c, &in);
            jfail(c, "%s test needs an integer", IS("odd") ? "odd" : "even");
        }
        int64_t v = in.type == JV_INT ? in.i : in.b;
        return (v % 2 != 0) == IS("odd");
    }
    if (!other)
        jfail(c, "test '%.*s' needs an argument", (int)nm->n, nm->s);
    if (IS("divisibleby")) {
        double x, y;
        bool xi, yi;
        int64_t xv, yv;
        if (!num_of(&in, &x, &xi, &xv) || !num_of(other, &y, &yi, &yv))
            jfail(c, "divisibleby needs numbers");
        if (xi && yi) {
            if (yv == 0)
                jfail(c, "integer division or modulo by zero");
            return yv == -1 || xv % yv == 0;
        }
        if (y == 0.0)
            jfail(c, "float modulo");
        return fmod(x, y) == 0.0;
    }
    if (IS("in")) return jv_contains(c, other, &in);
    if (IS("sameas")) {
        if (in.type != other->type)
            return false;
        switch (in.type) {
        case JV_LIST: return in.l == other->l;
        case JV_DICT:
        case JV_NS: return in.d == other->d;
        default: return jv_eq(&in, other);
        }
    }
    if (IS("eq") || IS("equalto") || IS("==")) return jv_eq(&in, other);
    if (IS("ne") || IS("!=")) return !jv_eq(&in, other);
    if (IS("lt") || IS("lessthan") || IS("<")) return jv_cmp(c, &in, other) < 0;
    if (IS("le") || IS("<=")) return jv_cmp(c, &in, other) <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">")) return jv_cmp(c, &in, other) > 0;
    if (IS("ge") || IS(">=")) return jv_cmp(c, &in, other) >= 0;
#undef IS
    jfail(c, "No test named '%.*s'.", (int)nm->n, nm->s);
}

static const char *const TESTS[] = {
    "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string",
    "mapping", "iterable", "sequence", "callable", "escaped", "lower", "upper", "filter", "test", "odd",
    "even", "divisibleby", "in", "sameas", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le",
    "<=", "gt", "greaterthan", ">", "ge", ">=",
};

bool jb_test_exists(const jname *name) {
    for (size_t i = 0; i < CV_ARRAY_LEN(TESTS); i++)
        if (strlen(TESTS[i]) == name->n && memcmp(TESTS[i], name->s, name->n) == 0)
            return true;
    return false;
}

bool jb_call_test(jctx *c, const jname *name, jv input, const jargs *args) {
    return run_test(c, name, input, args);
}

/* ---- methods and global functions ------------------------------------------------------------------ */

enum {
    FN_RANGE, FN_DICT, FN_NAMESPACE, FN_RAISE, FN_STRFTIME,
    /* str */
    FN_STARTSWITH, FN_ENDSWITH, FN_SPLIT, FN_RSPLIT, FN_STRIP, FN_LSTRIP, FN_RSTRIP, FN_UPPER, FN_LOWER,
    FN_TITLE, FN_CAPITALIZE, FN_REPLACE, FN_FIND, FN_RFIND, FN_COUNT, FN_JOIN, FN_SPLITLINES,
    FN_ISDIGIT, FN_ISALPHA, FN_ISALNUM, FN_ISSPACE, FN_ISLOWER, FN_ISUPPER, FN_FORMAT_UNSUPPORTED,
    /* dict */
    FN_ITEMS, FN_KEYS, FN_VALUES, FN_GET,
    /* loop */
    FN_CYCLE, FN_CHANGED,
};

typedef struct method_entry { const char *name; int id; } method_entry;

static const method_entry STR_METHODS[] = {
    {"startswith", FN_STARTSWITH}, {"endswith", FN_ENDSWITH}, {"split", FN_SPLIT}, {"rsplit", FN_RSPLIT},
    {"strip", FN_STRIP}, {"lstrip", FN_LSTRIP}, {"rstrip", FN_RSTRIP}, {"upper", FN_UPPER},
    {"lower", FN_LOWER}, {"title", FN_TITLE}, {"capitalize", FN_CAPITALIZE}, {"replace", FN_REPLACE},
    {"find", FN_FIND}, {"rfind", FN_RFIND}, {"count", FN_COUNT}, {"join", FN_JOIN},
    {"splitlines", FN_SPLITLINES}, {"isdigit", FN_ISDIGIT}, {"isalpha", FN_ISALPHA},
    {"isalnum", FN_ISALNUM}, {"isspace", FN_ISSPACE}, {"islower", FN_ISLOWER}, {"isupper", FN_ISUPPER},
    {"format", FN_FORMAT_UNSUPPORTED},
};
static const method_entry DICT_METHODS[] = {
    {"items", FN_ITEMS}, {"keys", FN_KEYS}, {"values", FN_VALUES}, {"get", FN_GET},
};
static const char *const MUTATORS[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort",
                                       "reverse", "update", "popitem", "setdefault"};

static int find_method(const method_entry *t, size_t n, const char *name, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(t[i].name) == len && memcmp(t[i].name, name, len) == 0)
            return t[i].id;
    return -1;
}

static jv bound(jctx *c, int id, const jv *self) {
    jfunc *f = ja_alloc(&c->arena, sizeof *f);
    f->id = id;
    f->self = self ? *self : jv_none();
    jv v = {0};
    v.type = JV_FUNC;
    v.fn = f;
    return v;
}

jv jb_method(jctx *c, const jv *self, const char *name, size_t n, bool *found) {
    int id = -1;
    *found = false;
    if (self->type == JV_STR)
        id = find_method(STR_METHODS, CV_ARRAY_LEN(STR_METHODS), name, n);
    else if (self->type == JV_DICT)
        id = find_method(DICT_METHODS, CV_ARRAY_LEN(DICT_METHODS), name, n);
    else if (self->type == JV_LOOP) {
        if (n == 5 && memcmp(name, "cycle", 5) == 0) id = FN_CYCLE;
        if (n == 7 && memcmp(name, "changed", 7) == 0) id = FN_CHANGED;
    }
    if (id < 0 && (self->type == JV_LIST || self->type == JV_DICT))
        for (size_t i = 0; i < CV_ARRAY_LEN(MUTATORS); i++)
            if (strlen(MUTATORS[i]) == n && memcmp(MUTATORS[i], name, n) == 0)
                jfail(c, "access to attribute '%.*s' of '%s' object is unsafe.", (int)n, name,
                      jv_type_name(self->type));
    if (id < 0)
        return jv_undef();
    *found = true;
    return bound(c, id, self);
}

jv jb_global(jctx *c, const jname *nm, bool *found) {
#define IS(lit) (nm->n == sizeof lit - 1 && memcmp(nm->s, lit, nm->n) == 0)
    int id = IS("range") ? FN_RANGE : IS("dict") ? FN_DICT : IS("namespace") ? FN_NAMESPACE
           : IS("raise_exception") ? FN_RAISE : IS("strftime_now") ? FN_STRFTIME : -1;
#undef IS
    *found = id >= 0;
    return id >= 0 ? bound(c, id, NULL) : jv_undef();
}

static jv fn_range(jctx *c, const jargs *a) {
    int64_t start = 0, stop, step = 1;
    if (a->npos == 1) {
        stop = arg_int(c, a, 0, NULL, 0);
    } else if (a->npos == 2 || a->npos == 3) {
        start = arg_int(c, a, 0, NULL, 0);
        stop = arg_int(c, a, 1, NULL, 0);
        if (a->npos == 3)
            step = arg_int(c, a, 2, NULL, 1);
    } else {
        jfail(c, "range expected 1 to 3 arguments, got %d", a->npos);
    }
    if (step == 0)
        jfail(c, "range() arg 3 must not be zero");
    int64_t count = 0;
    if (step > 0 && stop > start)
        count = (int64_t)(((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1);
    else if (step < 0 && start > stop)
        count = (int64_t)(((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-(step + 1) + 1) + 1);
    if (count > MAX_RANGE)
        jfail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    jlist *l = jl_new(&c->arena, (size_t)count);
    for (int64_t i = 0; i < count; i++)
        l->v[l->n++] = jv_int(start + i * step);
    return jv_list(l);
}

static jv kwargs_dict(jctx *c, const jargs *a, bool allow_positional_dict) {
    jdict *d = jd_new(&c->arena, (size_t)a->nkw);
    if (a->npos) {
        if (!allow_positional_dict || a->npos > 1 || a->pos[0].type != JV_DICT)
            jfail(c, "expected keyword arguments");
        for (size_t i = 0; i < a->pos[0].d->n; i++)
            jd_set(&c->arena, d, a->pos[0].d->k[i], a->pos[0].d->v[i]);
    }
    for (int i = 0; i < a->nkw; i++)
        jd_set(&c->arena, d, jv_strn(a->kwn[i].s, a->kwn[i].n), a->kwv[i]);
    return jv_dict(d);
}

static jv fn_strftime(jctx *c, const jargs *a) {
    jv fmt = arg_str(c, a, 0, "format", "");
    char *f = ja_strndup(&c->arena, fmt.s, fmt.n);
    time_t now = c->now ? (time_t)c->now : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char out[512];
    size_t n = strftime(out, sizeof out, f, &tm);
    return jv_strn(ja_strndup(&c->arena, out, n), n);
}

static jv str_method(jctx *c, int id, jv s, const jargs *a) {
    switch (id) {
    case FN_STARTSWITH:
    case FN_ENDSWITH: {
        const jv *fix = arg(a, 0, NULL);
        if (!fix)
            jfail(c, "%s() takes at least 1 argument", id == FN_STARTSWITH ? "startswith" : "endswith");
        jv sub = s;
        if (a->npos > 1) { /* optional start/end, in code points */
            size_t len = ju_cplen(s.s, s.n);
            int64_t st = arg_int(c, a, 1, NULL, 0), en = a->npos > 2 ? arg_int(c, a, 2, NULL, (int64_t)len) : (int64_t)len;
            if (st < 0) st = st + (int64_t)len < 0 ? 0 : st + (int64_t)len;
            if (en < 0) en = en + (int64_t)len < 0 ? 0 : en + (int64_t)len;
            if (st > (int64_t)len) return jv_bool(false);
            if (en > (int64_t)len) en = (int64_t)len;
            if (en < st) return jv_bool(false);
            size_t bs = ju_cp_offset(s.s, s.n, (size_t)st), be = ju_cp_offset(s.s, s.n, (size_t)en);
            sub = jv_strn(s.s + bs, be - bs);
        }
        return jv_bool(has_affix(c, sub, fix, id == FN_STARTSWITH));
    }
    case FN_SPLIT:
    case FN_RSPLIT:
        return py_split(c, s, arg(a, 0, "sep"), arg_int(c, a, 1, "maxsplit", -1), id == FN_RSPLIT);
    case FN_STRIP: return py_strip(c, s, arg(a, 0, NULL), true, true);
    case FN_LSTRIP: return py_strip(c, s, arg(a, 0, NULL), true, false);
    case FN_RSTRIP: return py_strip(c, s, arg(a, 0, NULL), false, true);
    case FN_UPPER: return map_chars(c, s, cp_upper);
    case FN_LOWER: return map_chars(c, s, cp_lower);
    case FN_TITLE: return py_title(c, s);
    case FN_CAPITALIZE: return py_capitalize(c, s);
    case FN_REPLACE: {
        const jv *o = arg(a, 0, NULL), *nw = arg(a, 1, NULL);
        if (!o || !nw || o->type != JV_STR || nw->type != JV_STR)
            jfail(c, "replace() arguments must be str");
        return py_replace(c, s, *o, *nw, arg_int(c, a, 2, "count", -1));
    }
    case FN_FIND:
    case FN_RFIND:
    case FN_COUNT: {
        const jv *sub = arg(a, 0, NULL);
        if (!sub || sub->type != JV_STR)
            jfail(c, "must be str");
        if (id == FN_COUNT) {
            if (sub->n == 0)
                return jv_int((int64_t)ju_cplen(s.s, s.n) + 1);
            int64_t k = 0;
            for (const char *p = s.s; (p = find_sub(p, s.n - (size_t)(p - s.s), sub->s, sub->n)); p += sub->n)
                k++;
            return jv_int(k);
        }
        const char *hit = NULL;
        if (id == FN_FIND) {
            hit = find_sub(s.s, s.n, sub->s, sub->n);
        } else {
            for (size_t k = s.n + 1; k-- > 0;)
                if (k + sub->n <= s.n && memcmp(s.s + k, sub->s, sub->n) == 0) {
                    hit = s.s + k;
                    break;
                }
        }
        return jv_int(hit ? (int64_t)ju_cplen(s.s, (size_t)(hit - s.s)) : -1);
    }
    case FN_JOIN: {
        const jv *it = arg(a, 0, NULL);
        if (!it)
            jfail(c, "join() takes exactly one argument");
        jlist *l = jv_iterate(c, it);
        jbuf b;
        jb_init(&b, &c->arena);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].type != JV_STR)
                jfail(c, "sequence item %zu: expected str instance, %s found", i, jv_type_name(l->v[i].type));
            if (i)
                jb_put(&b, s.s, s.n);
            jb_put(&b, l->v[i].s, l->v[i].n);
        }
        return mkstr(&b);
    }
    case FN_SPLITLINES: return py_splitlines(c, s);
    case FN_ISDIGIT:
    case FN_ISALPHA:
    case FN_ISALNUM:
    case FN_ISSPACE: {
        if (s.n == 0)
            return jv_bool(false);
        for (size_t i = 0; i < s.n;) {
            size_t adv;
            uint32_t cp = ju_decode(s.s + i, s.n - i, &adv);
            i += adv;
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            bool ok = id == FN_ISDIGIT   ? cat == UTF8PROC_CATEGORY_ND
                    : id == FN_ISALPHA ? (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO)
                    : id == FN_ISALNUM ? cp_is_alnum(cp)
                                       : ju_py_isspace(cp);
            if (!ok)
                return jv_bool(false);
        }
        return jv_bool(true);
    }
    case FN_ISLOWER: return jv_bool(case_test(c, s, true));
    case FN_ISUPPER: return jv_bool(case_test(c, s, false));
    case FN_FORMAT_UNSUPPORTED: jfail(c, "str.format() is not supported in chat templates");
    }
    jfail(c, "unknown string method");
}

jv jb_call_func(jctx *c, const jfunc *fn, const jargs *a) {
    jstep(c);
    switch (fn->id) {
    case FN_RANGE: return fn_range(c, a);
    case FN_DICT: return kwargs_dict(c, a, true);
    case FN_NAMESPACE: {
        jv d = kwargs_dict(c, a, true);
        d.type = JV_NS;
        return d;
    }
    case FN_RAISE: {
        jv msg = arg_str(c, a, 0, "message", "");
        c->error_is_raise = true;
        jfail(c, "%.*s", (int)msg.n, msg.s);
    }
    case FN_STRFTIME: return fn_strftime(c, a);
    case FN_ITEMS: return f_items(c, fn->self, a);
    case FN_KEYS: return f_list(c, fn->self, a);
    case FN_VALUES: {
        jlist *l = jl_new(&c->arena, fn->self.d->n);
        memcpy(l->v, fn->self.d->v, fn->self.d->n * sizeof(jv));
        l->n = fn->self.d->n;
        return jv_list(l);
    }
    case FN_GET: {
        const jv *k = arg(a, 0, NULL);
        if (!k)
            jfail(c, "get expected at least 1 argument");
        const jv *v = jd_get(fn->self.d, k);
        const jv *d = arg(a, 1, NULL);
        return v ? *v : d ? *d : jv_none();
    }
    case FN_CYCLE: {
        if (a->npos == 0)
            jfail(c, "no items for cycling given");
        return a->pos[fn->self.loop->index0 % (size_t)a->npos];
    }
    case FN_CHANGED: {
        jloop *L = fn->self.loop;
        jlist *l = jl_new(&c->arena, (size_t)a->npos);
        memcpy(l->v, a->pos, (size_t)a->npos * sizeof(jv));
        l->n = (size_t)a->npos;
        jv now = jv_list(l);
        bool changed = !L->has_changed || !jv_eq(&L->last_changed, &now);
        L->has_changed = true;
        L->last_changed = now;
        return jv_bool(changed);
    }
    default: return str_method(c, fn->id, fn->self, a);
    }
}
