/*
 * jinja_parse.c — template source to syntax tree: Jinja2's lexer rules and its recursive-descent
 * grammar (jinja2/lexer.py, jinja2/parser.py), rewritten in C for the chat-template subset.
 *
 * Lexing is where most byte-equality risk lies, so it follows Jinja2's rules literally:
 *   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` all after it.
 *   - trim_blocks: one newline right after `%}` or `#}` is dropped (not after `}}`, not after
 *     `{% raw %}`'s own end).
 *   - lstrip_blocks: spaces before `{%` or `{#` are dropped when only whitespace separates the tag
 *     from the start of its line; "start of line" includes the text right after a tag whose end
 *     consumed a newline. `{%+` opts out.
 *   - inside a tag, `%}`/`}}` only ends it when brackets are balanced (`{{ {'a': 1}}}` works).
 * The lexer yields the whole token array first; the parser then walks it with one token of look-
 * ahead (two for `not in` and `ns.attr =`). Errors unwind by longjmp to jinja_parse(), which turns
 * them into "chat template: line L column C: message". Nesting is capped so that a hostile template
 * cannot exhaust the C stack.
 */
#include <assert.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "chat/jinja_internal.h"

#define MAX_NESTING 200

enum { T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct jtok {
    uint8_t type;
    const char *s; /* token text (T_DATA: the text after whitespace control) */
    size_t n;
    size_t off;    /* byte offset in the source, for line/column */
} jtok;

typedef struct jparser {
    jinja_template *t;
    const char *src;
    size_t len;
    jtok *toks;
    size_t ntok, cap, pos;
    int depth;
    int loop_depth; /* for bodies enclosing the current token (macros reset it) */
    jmp_buf jmp;
    char err[512];
} jparser;

uint32_t jname_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static void line_col(const jparser *p, size_t off, int *line, int *col) {
    int l = 1;
    size_t ls = 0;
    for (size_t i = 0; i < off && i < p->len; i++)
        if (p->src[i] == '\n') {
            l++;
            ls = i + 1;
        }
    *line = l;
    *col = (int)ju_cplen(p->src + ls, off - ls) + 1;
}

__attribute__((format(printf, 3, 4))) static _Noreturn void perr(jparser *p, size_t off, const char *fmt, ...) {
    int line, col;
    line_col(p, off, &line, &col);
    int k = snprintf(p->err, sizeof p->err, "chat template: line %d column %d: ", line, col);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, sizeof p->err - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(p->jmp, 1);
}

/* ---- lexer ----------------------------------------------------------------------------------- */

static void push_tok(jparser *p, int type, const char *s, size_t n, size_t off) {
    if (p->ntok == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 256;
        p->toks = cv_xrealloc(p->toks, p->cap * sizeof *p->toks);
    }
    p->toks[p->ntok++] = (jtok){(uint8_t)type, s, n, off};
}

static bool is_space_at(const char *s, size_t n, size_t *adv) {
    uint32_t cp = ju_decode(s, n, adv);
    return ju_py_isspace(cp);
}

static size_t skip_space(const char *s, size_t i, size_t n) {
    size_t adv;
    while (i < n && is_space_at(s + i, n - i, &adv))
        i += adv;
    return i;
}

/* Length of text once trailing whitespace is removed (str.rstrip()). */
static size_t rstrip_len(const char *s, size_t n) {
    size_t end = 0, i = 0, adv;
    while (i < n) {
        bool sp = is_space_at(s + i, n - i, &adv);
        i += adv;
        if (!sp)
            end = i;
    }
    return end;
}

/* Applies the opener's whitespace control to the data before a tag and returns its new length. */
static size_t strip_before_tag(const char *text, size_t n, char sign, bool is_var, bool line_starting) {
    if (sign == '-')
        return rstrip_len(text, n);
    if (sign == '+' || is_var)
        return n;
    size_t l_pos = 0;
    for (size_t i = n; i > 0; i--)
        if (text[i - 1] == '\n') {
            l_pos = i;
            break;
        }
    if (!(l_pos > 0 || line_starting) || l_pos == n)
        return n;
    size_t i = l_pos, adv;
    while (i < n && is_space_at(text + i, n - i, &adv))
        i += adv;
    return i == n ? l_pos : n;
}

/* Matches a block end at i: "+%}", "-%}" + spaces, or "%}" + optional newline (trim_blocks).
 * Returns the end offset or 0. */
static size_t match_block_end(const char *s, size_t i, size_t n, const char *close) {
    if (i + 3 <= n && s[i] == '+' && memcmp(s + i + 1, close, 2) == 0)
        return i + 3;
    if (i + 3 <= n && s[i] == '-' && memcmp(s + i + 1, close, 2) == 0)
        return skip_space(s, i + 3, n);
    if (i + 2 <= n && memcmp(s + i, close, 2) == 0)
        return i + 2 < n && s[i + 2] == '\n' ? i + 3 : i + 2;
    return 0;
}

static size_t match_var_end(const char *s, size_t i, size_t n) {
    if (i + 3 <= n && s[i] == '-' && s[i + 1] == '}' && s[i + 2] == '}')
        return skip_space(s, i + 3, n);
    if (i + 2 <= n && s[i] == '}' && s[i + 1] == '}')
        return i + 2;
    return 0;
}

static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* `{%[-+]?\s*raw\s*(-%}\s*|%})` at i; returns the end offset or 0. */
static size_t match_raw_begin(const char *s, size_t i, size_t n) {
    size_t j = i + 2;
    if (j < n && (s[j] == '-' || s[j] == '+'))
        j++;
    j = skip_space(s, j, n);
    if (j + 3 > n || memcmp(s + j, "raw", 3) != 0 || (j + 3 < n && is_name_char(s[j + 3])))
        return 0;
    j = skip_space(s, j + 3, n);
    if (j + 3 <= n && memcmp(s + j, "-%}", 3) == 0)
        return skip_space(s, j + 3, n);
    if (j + 2 <= n && memcmp(s + j, "%}", 2) == 0)
        return j + 2;
    return 0;
}

/* Finds `{%[-+]?\s*endraw\s*` + a block end from i. Sets *tag_start and *sign; returns the end. */
static size_t find_endraw(const char *s, size_t i, size_t n, size_t *tag_start, char *sign) {
    for (; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%')
            continue;
        size_t j = i + 2;
        char sg = 0;
        if (j < n && (s[j] == '-' || s[j] == '+'))
            sg = s[j++];
        j = skip_space(s, j, n);
        if (j + 6 > n || memcmp(s + j, "endraw", 6) != 0)
            continue;
        j = skip_space(s, j + 6, n);
        size_t e = match_block_end(s, j, n, "%}");
        if (e) {
            *tag_start = i;
            *sign = sg;
            return e;
        }
    }
    return 0;
}

static size_t lex_number(jparser *p, const char *s, size_t i, size_t n) {
    size_t j = i;
    bool prev_dot = i > 0 && s[i - 1] == '.';
    if (s[j] == '0' && j + 1 < n && strchr("bBoOxX", s[j + 1]) && s[j + 1]) {
        j += 2;
        while (j < n && (is_name_char(s[j])))
            j++;
        push_tok(p, T_INT, s + i, j - i, i);
        return j;
    }
    while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1]))))
        j++;
    bool is_float = false;
    if (!prev_dot && j + 1 < n && s[j] == '.' && is_digit(s[j + 1])) {
        is_float = true;
        j++;
        while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1]))))
            j++;
    }
    if (!prev_dot && j < n && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < n && (s[k] == '+' || s[k] == '-'))
            k++;
        if (k < n && is_digit(s[k])) {
            is_float = true;
            j = k;
            while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1]))))
                j++;
        }
    }
    push_tok(p, is_float ? T_FLOAT : T_INT, s + i, j - i, i);
    return j;
}

static const char *const OPERATORS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%",
                                        "~", "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":",
                                        "|", ",", ";"};

/* Lexes the inside of a `{{ }}` or `{% %}` tag from i; returns the offset after its end. */
static size_t lex_tag(jparser *p, size_t i, bool is_var, size_t open_off) {
    const char *s = p->src;
    size_t n = p->len;
    char stack[MAX_NESTING];
    int depth = 0;
    for (;;) {
        i = skip_space(s, i, n);
        if (i >= n)
            perr(p, open_off, "unexpected end of template, expected '%s'", is_var ? "}}" : "%}");
        if (depth == 0) {
            size_t e = is_var ? match_var_end(s, i, n) : match_block_end(s, i, n, "%}");
            if (e) {
                push_tok(p, is_var ? T_VEND : T_BEND, s + i, e - i, i);
                return e;
            }
        }
        char c = s[i];
        if (is_name_start(c)) {
            size_t j = i;
            while (j < n && is_name_char(s[j]))
                j++;
            push_tok(p, T_NAME, s + i, j - i, i);
            i = j;
        } else if (is_digit(c)) {
            i = lex_number(p, s, i, n);
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != c)
                j += s[j] == '\\' && j + 1 < n ? 2 : 1;
            if (j >= n)
                perr(p, i, "unexpected char %c (unterminated string)", c);
            push_tok(p, T_STRING, s + i, j + 1 - i, i);
            i = j + 1;
        } else {
            size_t k = 0;
            for (; k < CV_ARRAY_LEN(OPERATORS); k++) {
                size_t ol = strlen(OPERATORS[k]);
                if (i + ol <= n && memcmp(s + i, OPERATORS[k], ol) == 0)
                    break;
            }
            if (k == CV_ARRAY_LEN(OPERATORS))
                perr(p, i, "unexpected char '%c'", c);
            const char *op = OPERATORS[k];
            if (op[1] == 0 && strchr("([{", op[0])) {
                if (depth == MAX_NESTING)
                    perr(p, i, "brackets nested too deeply");
                stack[depth++] = op[0];
            } else if (op[1] == 0 && strchr(")]}", op[0])) {
                char want = op[0] == ')' ? '(' : op[0] == ']' ? '[' : '{';
                if (depth == 0 || stack[depth - 1] != want)
                    perr(p, i, "unexpected '%c'", op[0]);
                depth--;
            }
            push_tok(p, T_OP, s + i, strlen(op), i);
            i += strlen(op);
        }
    }
}

static void lex(jparser *p) {
    const char *s = p->src;
    size_t n = p->len, pos = 0;
    bool line_starting = true;
    while (pos < n) {
        size_t i = pos;
        while (i + 1 < n && !(s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')))
            i++;
        if (i + 1 >= n) {
            push_tok(p, T_DATA, s + pos, n - pos, pos);
            break;
        }
        char kind = s[i + 1];
        char sign = i + 2 < n && (s[i + 2] == '-' || s[i + 2] == '+') ? s[i + 2] : 0;
        size_t text_len = strip_before_tag(s + pos, i - pos, sign, kind == '{', line_starting);
        if (text_len)
            push_tok(p, T_DATA, s + pos, text_len, pos);
        size_t body = i + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *end = NULL;
            for (size_t j = body; j + 1 < n; j++)
                if (s[j] == '#' && s[j + 1] == '}') {
                    end = s + j;
                    break;
                }
            if (!end)
                perr(p, i, "Missing end of comment tag");
            size_t j = (size_t)(end - s), e;
            if (j > body && s[j - 1] == '+')
                e = j + 2;
            else if (j > body && s[j - 1] == '-')
                e = skip_space(s, j + 2, n);
            else
                e = j + 2 < n && s[j + 2] == '\n' ? j + 3 : j + 2;
            pos = e;
            line_starting = s[e - 1] == '\n';
            continue;
        }
        size_t raw_end = kind == '%' ? match_raw_begin(s, i, n) : 0;
        if (raw_end) {
            size_t tag_start;
            char esign;
            size_t e = find_endraw(s, raw_end, n, &tag_start, &esign);
            if (!e)
                perr(p, i, "Missing end of raw directive");
            bool ls = s[raw_end - 1] == '\n';
            size_t len = strip_before_tag(s + raw_end, tag_start - raw_end, esign, false, ls);
            if (len)
                push_tok(p, T_DATA, s + raw_end, len, raw_end);
            pos = e;
            line_starting = s[e - 1] == '\n';
            continue;
        }
        push_tok(p, kind == '{' ? T_VBEGIN : T_BBEGIN, s + i, body - i, i);
        pos = lex_tag(p, body, kind == '{', i);
        line_starting = s[pos - 1] == '\n';
    }
    push_tok(p, T_EOF, s + n, 0, n);
}

/* ---- parser helpers ---------------------------------------------------------------------------- */

static jtok *cur(jparser *p) { return &p->toks[p->pos]; }
static jtok *peek(jparser *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->ntok ? i : p->ntok - 1];
}
static void advance(jparser *p) {
    if (p->pos + 1 < p->ntok)
        p->pos++;
}
static bool tok_is(const jtok *t, int type, const char *text) {
    return t->type == type && (!text || (t->n == strlen(text) && memcmp(t->s, text, t->n) == 0));
}
static bool is_op(jparser *p, const char *op) { return tok_is(cur(p), T_OP, op); }
static bool is_name(jparser *p, const char *name) { return tok_is(cur(p), T_NAME, name); }

static const char *describe(const jtok *t, char *buf, size_t cap) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_VEND: return "end of print statement";
    case T_BEND: return "end of statement block";
    case T_DATA: return "template data";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}

static _Noreturn void unexpected(jparser *p, const char *wanted) {
    char b[64];
    if (wanted)
        perr(p, cur(p)->off, "expected %s, got %s", wanted, describe(cur(p), b, sizeof b));
    perr(p, cur(p)->off, "unexpected %s", describe(cur(p), b, sizeof b));
}

static void expect_op(jparser *p, const char *op) {
    if (!is_op(p, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(p, w);
    }
    advance(p);
}

static void expect_type(jparser *p, int type, const char *what) {
    if (cur(p)->type != type)
        unexpected(p, what);
    advance(p);
}

static jname take_name(jparser *p) {
    if (cur(p)->type != T_NAME)
        unexpected(p, "a name");
    jtok *t = cur(p);
    advance(p);
    return (jname){t->s, (uint32_t)t->n, jname_hash(t->s, t->n)};
}

static jnode *new_node(jparser *p, int kind, size_t off) {
    jnode *nd = ja_alloc(&p->t->arena, sizeof *nd);
    memset(nd, 0, sizeof *nd);
    nd->kind = (uint8_t)kind;
    nd->off = (uint32_t)off;
    return nd;
}

/* Small growable arrays of node pointers, kept in the template's arena so that an error that
 * unwinds mid-parse leaks nothing. */
typedef struct nvec { jnode **v; int n, cap; jarena *a; } nvec;
static void nv_push(nvec *v, jnode *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        v->v = ja_grow(v->a, v->v, (size_t)v->cap * sizeof *v->v, (size_t)cap * sizeof *v->v);
        v->cap = cap;
    }
    v->v[v->n++] = x;
}
static jnode **nv_finish(nvec *v, int *n) {
    *n = v->n;
    return v->v;
}
#define NVEC(p) ((nvec){NULL, 0, 0, &(p)->t->arena})

static void enter(jparser *p) {
    if (++p->depth > MAX_NESTING)
        perr(p, cur(p)->off, "template nested too deeply");
}
static void leave(jparser *p) { p->depth--; }

/* ---- literals ---------------------------------------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a string literal the way Python's unicode-escape codec does. */
static jv decode_string(jparser *p, const jtok *t) {
    const char *s = t->s + 1;
    size_t n = t->n - 2;
    if (!memchr(s, '\\', n))
        return jv_strn(s, n);
    char *out = ja_alloc(&p->t->arena, n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            out[o++] = s[i];
            continue;
        }
        char e = s[++i];
        uint32_t cp;
        int digits = 0;
        switch (e) {
        case 'n': out[o++] = '\n'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'r': out[o++] = '\r'; continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'v': out[o++] = '\v'; continue;
        case '\n': continue;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = 0;
                int k = 0;
                for (; k < 3 && i < n && s[i] >= '0' && s[i] <= '7'; k++, i++)
                    cp = cp * 8 + (uint32_t)(s[i] - '0');
                i--;
                goto emit;
            }
            out[o++] = '\\';
            out[o++] = e;
            continue;
        }
        cp = 0;
        for (int k = 0; k < digits; k++) {
            int h = i + 1 + (size_t)k < n ? hexval(s[i + 1 + (size_t)k]) : -1;
            if (h < 0)
                perr(p, t->off, "truncated \\%c escape in string literal", e);
            cp = cp * 16 + (uint32_t)h;
        }
        i += (size_t)digits;
    emit:
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            perr(p, t->off, "string literal has an escape that is not a Unicode scalar value");
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else if (cp < 0x800) {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[o++] = (char)(0xE0 | (cp >> 12));
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[o++] = (char)(0xF0 | (cp >> 18));
            out[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return jv_strn(out, o);
}

static jv parse_number(jparser *p, const jtok *t) {
    char buf[64];
    size_t k = 0;
    for (size_t i = 0; i < t->n && k + 1 < sizeof buf; i++)
        if (t->s[i] != '_')
            buf[k++] = t->s[i];
    buf[k] = '\0';
    errno = 0;
    if (t->type == T_FLOAT) {
        double f = strtod(buf, NULL);
        return jv_float(f);
    }
    int base = 10;
    const char *digits = buf;
    if (k > 1 && buf[0] == '0' && strchr("bBoOxX", buf[1])) {
        base = buf[1] == 'b' || buf[1] == 'B' ? 2 : buf[1] == 'o' || buf[1] == 'O' ? 8 : 16;
        digits = buf + 2;
    }
    char *end;
    long long v = strtoll(digits, &end, base);
    if (errno || *end || end == digits)
        perr(p, t->off, "integer literal '%.*s' is invalid or too large", (int)t->n, t->s);
    return jv_int(v);
}

/* ---- expressions ----------------------------------------------------------------------------- */

static jnode *parse_expression(jparser *p, bool with_condexpr);
static jnode *parse_tuple(jparser *p, int mode, const char *extra_end, bool explicit_parens);
enum { TUPLE_SIMPLIFIED, TUPLE_CONDEXPR, TUPLE_NO_CONDEXPR };

static jnode *parse_unary(jparser *p, bool with_filter);
static jnode *parse_postfix(jparser *p, jnode *node);

static jnode *parse_primary(jparser *p) {
    jtok *t = cur(p);
    jnode *nd;
    enter(p);
    if (t->type == T_NAME) {
        advance(p);
        nd = new_node(p, N_CONST, t->off);
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True"))
            nd->cval = jv_bool(true);
        else if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False"))
            nd->cval = jv_bool(false);
        else if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None"))
            nd->cval = jv_none();
        else {
            nd->kind = N_NAME;
            nd->name = (jname){t->s, (uint32_t)t->n, jname_hash(t->s, t->n)};
        }
    } else if (t->type == T_STRING) {
        nd = new_node(p, N_CONST, t->off);
        nd->cval = decode_string(p, t);
        advance(p);
        while (cur(p)->type == T_STRING) { /* adjacent literals concatenate */
            jv more = decode_string(p, cur(p));
            char *joined = ja_alloc(&p->t->arena, nd->cval.n + more.n + 1);
            memcpy(joined, nd->cval.s, nd->cval.n);
            memcpy(joined + nd->cval.n, more.s, more.n);
            nd->cval = jv_strn(joined, nd->cval.n + more.n);
            advance(p);
        }
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        nd = new_node(p, N_CONST, t->off);
        nd->cval = parse_number(p, t);
        advance(p);
    } else if (tok_is(t, T_OP, "(")) {
        advance(p);
        nd = parse_tuple(p, TUPLE_CONDEXPR, NULL, true);
        expect_op(p, ")");
    } else if (tok_is(t, T_OP, "[")) {
        advance(p);
        nvec items = NVEC(p);
        while (!is_op(p, "]")) {
            if (items.n)
                expect_op(p, ",");
            if (is_op(p, "]"))
                break;
            nv_push(&items, parse_expression(p, true));
        }
        expect_op(p, "]");
        nd = new_node(p, N_LIST, t->off);
        nd->list = nv_finish(&items, &nd->n);
    } else if (tok_is(t, T_OP, "{")) {
        advance(p);
        nvec keys = NVEC(p), vals = NVEC(p);
        while (!is_op(p, "}")) {
            if (keys.n)
                expect_op(p, ",");
            if (is_op(p, "}"))
                break;
            nv_push(&keys, parse_expression(p, true));
            expect_op(p, ":");
            nv_push(&vals, parse_expression(p, true));
        }
        expect_op(p, "}");
        nd = new_node(p, N_DICT, t->off);
        nd->list = nv_finish(&keys, &nd->n);
        nd->list2 = nv_finish(&vals, &nd->n2);
    } else {
        unexpected(p, NULL);
    }
    leave(p);
    return nd;
}

static void parse_call_args(jparser *p, jnode *call) {
    expect_op(p, "(");
    nvec args = NVEC(p), kwvals = NVEC(p);
    jname *kwnames = NULL;
    int nkw = 0;
    while (!is_op(p, ")")) {
        if (args.n || kwvals.n)
            expect_op(p, ",");
        if (is_op(p, ")"))
            break;
        if (is_op(p, "*") || is_op(p, "**"))
            perr(p, cur(p)->off, "*args and **kwargs in calls are not supported");
        if (cur(p)->type == T_NAME && tok_is(peek(p, 1), T_OP, "=")) {
            jname k = take_name(p);
            advance(p);
            kwnames = ja_grow(&p->t->arena, kwnames, (size_t)nkw * sizeof *kwnames, (size_t)(nkw + 1) * sizeof *kwnames);
            kwnames[nkw++] = k;
            nv_push(&kwvals, parse_expression(p, true));
        } else {
            if (kwvals.n)
                perr(p, cur(p)->off, "positional argument follows keyword argument");
            nv_push(&args, parse_expression(p, true));
        }
    }
    expect_op(p, ")");
    call->list = nv_finish(&args, &call->n);
    call->list2 = nv_finish(&kwvals, &call->n2);
    call->nnames = nkw;
    call->names = kwnames;
}

static jnode *parse_subscribed(jparser *p) {
    jnode *args[3] = {NULL, NULL, NULL};
    size_t off = cur(p)->off;
    if (is_op(p, ":")) {
        advance(p);
    } else {
        jnode *e = parse_expression(p, true);
        if (!is_op(p, ":"))
            return e;
        advance(p);
        args[0] = e;
    }
    if (!is_op(p, ":") && !is_op(p, "]") && !is_op(p, ","))
        args[1] = parse_expression(p, true);
    if (is_op(p, ":")) {
        advance(p);
        if (!is_op(p, "]") && !is_op(p, ","))
            args[2] = parse_expression(p, true);
    }
    jnode *s = new_node(p, N_SLICE, off);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static jnode *parse_subscript(jparser *p, jnode *node) {
    jtok *t = cur(p);
    advance(p);
    if (tok_is(t, T_OP, ".")) {
        jtok *a = cur(p);
        if (a->type == T_NAME) {
            jnode *g = new_node(p, N_GETATTR, a->off);
            g->a = node;
            g->name = take_name(p);
            return g;
        }
        if (a->type == T_INT) {
            jnode *g = new_node(p, N_GETITEM, a->off);
            g->a = node;
            g->b = new_node(p, N_CONST, a->off);
            g->b->cval = parse_number(p, a);
            advance(p);
            return g;
        }
        unexpected(p, "a name or number after '.'");
    }
    nvec args = NVEC(p);
    while (!is_op(p, "]")) {
        if (args.n)
            expect_op(p, ",");
        if (is_op(p, "]"))
            break;
        nv_push(&args, parse_subscribed(p));
    }
    expect_op(p, "]");
    jnode *g = new_node(p, N_GETITEM, t->off);
    g->a = node;
    for (int i = 0; args.n > 1 && i < args.n; i++)
        if (args.v[i]->kind == N_SLICE)
            perr(p, t->off, "multi-dimensional slicing is not supported");
    if (args.n == 1) {
        g->b = args.v[0];
            } else {
        g->b = new_node(p, N_TUPLE, t->off);
        g->b->list = nv_finish(&args, &g->b->n);
    }
    if (g->b->kind == N_SLICE) { /* a[x:y] becomes a slice node whose .a is the object */
        jnode *sl = g->b;
        sl->list = ja_alloc(&p->t->arena, 3 * sizeof(jnode *));
        sl->list[0] = sl->a;
        sl->list[1] = sl->b;
        sl->list[2] = sl->c;
        sl->n = 3;
        sl->a = node;
        sl->b = sl->c = NULL;
        return sl;
    }
    return g;
}

static jnode *parse_postfix(jparser *p, jnode *node) {
    for (;;) {
        if (is_op(p, ".") || is_op(p, "[")) {
            node = parse_subscript(p, node);
        } else if (is_op(p, "(")) {
            jnode *call = new_node(p, N_CALL, cur(p)->off);
            call->a = node;
            parse_call_args(p, call);
            node = call;
        } else {
            return node;
        }
    }
}

static jname parse_dotted_name(jparser *p) {
    jname nm = take_name(p);
    while (is_op(p, ".") && peek(p, 1)->type == T_NAME) {
        advance(p);
        jname more = take_name(p);
        nm.n = (uint32_t)(more.s + more.n - nm.s);
    }
    nm.hash = jname_hash(nm.s, nm.n);
    return nm;
}

static jnode *parse_filter_expr(jparser *p, jnode *node) {
    for (;;) {
        if (is_op(p, "|")) {
            advance(p);
            size_t name_off = cur(p)->off;
            jnode *f = new_node(p, N_FILTER, name_off);
            f->a = node;
            f->name = parse_dotted_name(p);
            if (!jb_filter_exists(&f->name))
                perr(p, name_off, "No filter named '%.*s'.", (int)f->name.n, f->name.s);
            if (is_op(p, "("))
                parse_call_args(p, f);
            node = f;
        } else if (is_name(p, "is")) {
            advance(p);
            jnode *t = new_node(p, N_TEST, cur(p)->off);
            t->a = node;
            if (is_name(p, "not")) {
                advance(p);
                t->flag = 1;
            }
            size_t name_off = cur(p)->off;
            t->name = parse_dotted_name(p);
            if (!jb_test_exists(&t->name))
                perr(p, name_off, "No test named '%.*s'.", (int)t->name.n, t->name.s);
            jtok *c = cur(p);
            if (is_op(p, "(")) {
                parse_call_args(p, t);
            } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                        tok_is(c, T_OP, "(") || tok_is(c, T_OP, "[") || tok_is(c, T_OP, "{")) &&
                       !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
                if (is_name(p, "is"))
                    perr(p, c->off, "You cannot chain multiple tests with is");
                jnode *arg = parse_postfix(p, parse_primary(p));
                t->list = ja_alloc(&p->t->arena, sizeof(jnode *));
                t->list[0] = arg;
                t->n = 1;
            }
            node = t;
        } else if (is_op(p, "(")) {
            jnode *call = new_node(p, N_CALL, cur(p)->off);
            call->a = node;
            parse_call_args(p, call);
            node = call;
        } else {
            return node;
        }
    }
}

static jnode *parse_unary(jparser *p, bool with_filter) {
    jnode *node;
    enter(p);
    if (is_op(p, "-") || is_op(p, "+")) {
        node = new_node(p, is_op(p, "-") ? N_NEG : N_POS, cur(p)->off);
        advance(p);
        node->a = parse_unary(p, false);
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter)
        node = parse_filter_expr(p, node);
    leave(p);
    return node;
}

static jnode *binary(jparser *p, int op, jnode *a, jnode *b, size_t off) {
    jnode *nd = new_node(p, N_BIN, off);
    nd->flag = (uint8_t)op;
    nd->a = a;
    nd->b = b;
    return nd;
}

static jnode *parse_pow(jparser *p) {
    jnode *left = parse_unary(p, true);
    while (is_op(p, "**")) {
        size_t off = cur(p)->off;
        advance(p);
        left = binary(p, OP_POW, left, parse_unary(p, true), off);
    }
    return left;
}

static jnode *parse_math2(jparser *p) {
    jnode *left = parse_pow(p);
    for (;;) {
        int op = is_op(p, "*") ? OP_MUL : is_op(p, "/") ? OP_DIV : is_op(p, "//") ? OP_FLOORDIV
               : is_op(p, "%") ? OP_MOD : -1;
        if (op < 0)
            return left;
        size_t off = cur(p)->off;
        advance(p);
        left = binary(p, op, left, parse_pow(p), off);
    }
}

static jnode *parse_concat(jparser *p) {
    jnode *first = parse_math2(p);
    if (!is_op(p, "~"))
        return first;
    nvec args = NVEC(p);
    nv_push(&args, first);
    size_t off = cur(p)->off;
    while (is_op(p, "~")) {
        advance(p);
        nv_push(&args, parse_math2(p));
    }
    jnode *nd = new_node(p, N_CONCAT, off);
    nd->list = nv_finish(&args, &nd->n);
    return nd;
}

static jnode *parse_math1(jparser *p) {
    jnode *left = parse_concat(p);
    for (;;) {
        int op = is_op(p, "+") ? OP_ADD : is_op(p, "-") ? OP_SUB : -1;
        if (op < 0)
            return left;
        size_t off = cur(p)->off;
        advance(p);
        left = binary(p, op, left, parse_concat(p), off);
    }
}

static int compare_op(jparser *p) {
    if (is_op(p, "==")) return OP_EQ;
    if (is_op(p, "!=")) return OP_NE;
    if (is_op(p, "<")) return OP_LT;
    if (is_op(p, "<=")) return OP_LE;
    if (is_op(p, ">")) return OP_GT;
    if (is_op(p, ">=")) return OP_GE;
    if (is_name(p, "in")) return OP_IN;
    if (is_name(p, "not") && tok_is(peek(p, 1), T_NAME, "in")) return OP_NOTIN;
    return -1;
}

static jnode *parse_compare(jparser *p) {
    size_t off = cur(p)->off;
    jnode *expr = parse_math1(p);
    int op = compare_op(p);
    if (op < 0)
        return expr;
    nvec operands = NVEC(p);
    uint8_t ops[64];
    int nops = 0;
    while ((op = compare_op(p)) >= 0) {
        if (nops == (int)sizeof ops)
            perr(p, cur(p)->off, "comparison chain too long");
        advance(p);
        if (op == OP_NOTIN)
            advance(p);
        ops[nops++] = (uint8_t)op;
        nv_push(&operands, parse_math1(p));
    }
    jnode *nd = new_node(p, N_CMP, off);
    nd->a = expr;
    nd->list = nv_finish(&operands, &nd->n);
    nd->ops = ja_alloc(&p->t->arena, (size_t)nops);
    memcpy(nd->ops, ops, (size_t)nops);
    return nd;
}

static jnode *parse_not(jparser *p) {
    if (is_name(p, "not")) {
        jnode *nd = new_node(p, N_NOT, cur(p)->off);
        advance(p);
        enter(p);
        nd->a = parse_not(p);
        leave(p);
        return nd;
    }
    return parse_compare(p);
}

static jnode *parse_and(jparser *p) {
    jnode *left = parse_not(p);
    while (is_name(p, "and")) {
        jnode *nd = new_node(p, N_AND, cur(p)->off);
        advance(p);
        nd->a = left;
        nd->b = parse_not(p);
        left = nd;
    }
    return left;
}

static jnode *parse_or(jparser *p) {
    jnode *left = parse_and(p);
    while (is_name(p, "or")) {
        jnode *nd = new_node(p, N_OR, cur(p)->off);
        advance(p);
        nd->a = left;
        nd->b = parse_and(p);
        left = nd;
    }
    return left;
}

static jnode *parse_condexpr(jparser *p) {
    enter(p);
    jnode *expr1 = parse_or(p);
    while (is_name(p, "if")) {
        jnode *nd = new_node(p, N_COND, cur(p)->off);
        advance(p);
        nd->a = parse_or(p);
        nd->b = expr1;
        if (is_name(p, "else")) {
            advance(p);
            nd->c = parse_condexpr(p);
        }
        expr1 = nd;
    }
    leave(p);
    return expr1;
}

static jnode *parse_expression(jparser *p, bool with_condexpr) {
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static bool tuple_end(jparser *p, const char *extra_end) {
    jtok *t = cur(p);
    if (t->type == T_VEND || t->type == T_BEND || t->type == T_EOF || tok_is(t, T_OP, ")"))
        return true;
    return extra_end && tok_is(t, T_NAME, extra_end);
}

static jnode *parse_tuple(jparser *p, int mode, const char *extra_end, bool explicit_parens) {
    size_t off = cur(p)->off;
    nvec args = NVEC(p);
    bool is_tuple = false;
    for (;;) {
        if (args.n)
            expect_op(p, ",");
        if (tuple_end(p, extra_end))
            break;
        jnode *e = mode == TUPLE_SIMPLIFIED ? parse_primary(p) : parse_expression(p, mode == TUPLE_CONDEXPR);
        nv_push(&args, e);
        if (is_op(p, ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n) {
            jnode *only = args.v[0];
                        return only;
        }
        if (!explicit_parens) {
                        unexpected(p, "an expression");
        }
    }
    jnode *nd = new_node(p, N_TUPLE, off);
    nd->list = nv_finish(&args, &nd->n);
    return nd;
}

/* ---- statements --------------------------------------------------------------------------------- */

static jnode **subparse(jparser *p, const char *const *end_tags, int *n);

static void expect_block_end(jparser *p) { expect_type(p, T_BEND, "end of statement block"); }

static jnode *parse_assign_target(jparser *p, bool with_namespace, const char *extra_end) {
    size_t off = cur(p)->off;
    if (with_namespace && cur(p)->type == T_NAME && tok_is(peek(p, 1), T_OP, ".")) {
        jnode *nd = new_node(p, N_NSREF, off);
        nd->name = take_name(p);
        advance(p);
        jnode *attr = new_node(p, N_CONST, cur(p)->off);
        jname an = take_name(p);
        attr->name = an;
        nd->a = attr;
        return nd;
    }
    jnode *target = parse_tuple(p, TUPLE_SIMPLIFIED, extra_end, false);
    if (target->kind == N_NAME)
        return target;
    if (target->kind == N_TUPLE) {
        for (int i = 0; i < target->n; i++)
            if (target->list[i]->kind != N_NAME)
                perr(p, off, "can't assign to this tuple element");
        return target;
    }
    perr(p, off, "can't assign to %s", target->kind == N_CONST ? "a literal" : "this expression");
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_ENDIF[] = {"endif", NULL};
static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_ENDFOR[] = {"endfor", NULL};

static jnode *parse_if(jparser *p, size_t off) {
    jnode *nd = new_node(p, N_IF, off);
    nd->a = parse_tuple(p, TUPLE_NO_CONDEXPR, NULL, false);
    expect_block_end(p);
    nd->list = subparse(p, END_IF, &nd->n);
    if (is_name(p, "elif")) {
        size_t eoff = cur(p)->off;
        advance(p);
        nd->list2 = ja_alloc(&p->t->arena, sizeof(jnode *));
        nd->list2[0] = parse_if(p, eoff);
        nd->n2 = 1;
        return nd; /* the innermost elif consumed the endif */
    }
    if (is_name(p, "else")) {
        advance(p);
        expect_block_end(p);
        nd->list2 = subparse(p, END_ENDIF, &nd->n2);
    }
    advance(p); /* endif */
    expect_block_end(p);
    return nd;
}

static jnode *parse_for(jparser *p, size_t off) {
    jnode *nd = new_node(p, N_FOR, off);
    nd->a = parse_assign_target(p, false, "in");
    if (!is_name(p, "in"))
        unexpected(p, "'in'");
    advance(p);
    nd->b = parse_tuple(p, TUPLE_NO_CONDEXPR, "recursive", false);
    if (is_name(p, "if")) {
        advance(p);
        nd->c = parse_expression(p, true);
    }
    if (is_name(p, "recursive"))
        perr(p, cur(p)->off, "recursive loops are not supported");
    expect_block_end(p);
    p->loop_depth++;
    nd->list = subparse(p, END_FOR, &nd->n);
    p->loop_depth--;
    if (is_name(p, "else")) {
        advance(p);
        expect_block_end(p);
        nd->list2 = subparse(p, END_ENDFOR, &nd->n2);
    }
    advance(p); /* endfor */
    expect_block_end(p);
    return nd;
}

/* Parses `| f(args) | g` after an implicit input node; used by filter blocks and set blocks. */
static jnode *parse_filter_chain(jparser *p, jnode *input, bool first_needs_bar) {
    jnode *node = input;
    bool first = true;
    while (is_op(p, "|") || (first && !first_needs_bar)) {
        if (is_op(p, "|"))
            advance(p);
        size_t name_off = cur(p)->off;
        jnode *f = new_node(p, N_FILTER, name_off);
        f->a = node;
        f->name = parse_dotted_name(p);
        if (!jb_filter_exists(&f->name))
            perr(p, name_off, "No filter named '%.*s'.", (int)f->name.n, f->name.s);
        if (is_op(p, "("))
            parse_call_args(p, f);
        node = f;
        first = false;
    }
    return node;
}

static jnode *parse_set(jparser *p, size_t off) {
    jnode *target = parse_assign_target(p, true, NULL);
    if (is_op(p, "=")) {
        advance(p);
        jnode *nd = new_node(p, N_SET, off);
        nd->a = target;
        nd->b = parse_tuple(p, TUPLE_CONDEXPR, NULL, false);
        expect_block_end(p);
        return nd;
    }
    jnode *nd = new_node(p, N_SETBLOCK, off);
    nd->a = target;
    if (is_op(p, "|"))
        nd->b = parse_filter_chain(p, new_node(p, N_BLOCKINPUT, off), true);
    expect_block_end(p);
    static const char *const end[] = {"endset", NULL};
    nd->list = subparse(p, end, &nd->n);
    advance(p);
    expect_block_end(p);
    return nd;
}

static jnode *parse_macro(jparser *p, size_t off) {
    jnode *nd = new_node(p, N_MACRO, off);
    nd->name = take_name(p);
    expect_op(p, "(");
    jname params[64];
    nvec defaults = NVEC(p);
    int np = 0;
    bool seen_default = false;
    while (!is_op(p, ")")) {
        if (np)
            expect_op(p, ",");
        if (is_op(p, ")"))
            break;
        if (np == (int)CV_ARRAY_LEN(params))
            perr(p, cur(p)->off, "too many macro parameters");
        params[np++] = take_name(p);
        if (is_op(p, "=")) {
            advance(p);
            nv_push(&defaults, parse_expression(p, true));
            seen_default = true;
        } else {
            if (seen_default)
                perr(p, cur(p)->off, "parameter without a default follows one with a default");
            nv_push(&defaults, NULL);
        }
    }
    expect_op(p, ")");
    expect_block_end(p);
    nd->nnames = np;
    nd->names = ja_alloc(&p->t->arena, (size_t)(np ? np : 1) * sizeof(jname));
    memcpy(nd->names, params, (size_t)np * sizeof(jname));
    nd->list2 = nv_finish(&defaults, &nd->n2);
    static const char *const end[] = {"endmacro", NULL};
    int saved_loops = p->loop_depth;
    p->loop_depth = 0; /* a macro body is a function of its own */
    nd->list = subparse(p, end, &nd->n);
    p->loop_depth = saved_loops;
    advance(p);
    if (cur(p)->type == T_NAME) /* {% endmacro name %} */
        advance(p);
    expect_block_end(p);
    return nd;
}

static jnode *parse_with(jparser *p, size_t off) {
    jnode *nd = new_node(p, N_WITH, off);
    nvec vals = NVEC(p);
    jname names[64];
    int nn = 0;
    while (cur(p)->type != T_BEND) {
        if (nn)
            expect_op(p, ",");
        if (nn == (int)CV_ARRAY_LEN(names))
            perr(p, cur(p)->off, "too many with-variables");
        names[nn++] = take_name(p);
        expect_op(p, "=");
        nv_push(&vals, parse_expression(p, true));
    }
    expect_block_end(p);
    nd->nnames = nn;
    nd->names = ja_alloc(&p->t->arena, (size_t)(nn ? nn : 1) * sizeof(jname));
    memcpy(nd->names, names, (size_t)nn * sizeof(jname));
    nd->list2 = nv_finish(&vals, &nd->n2);
    static const char *const end[] = {"endwith", NULL};
    nd->list = subparse(p, end, &nd->n);
    advance(p);
    expect_block_end(p);
    return nd;
}

static jnode *parse_statement(jparser *p) {
    jtok *t = cur(p);
    if (t->type != T_NAME)
        perr(p, t->off, "tag name expected");
    size_t off = t->off;
    enter(p);
    advance(p);
    jnode *nd;
    if (tok_is(t, T_NAME, "if")) {
        nd = parse_if(p, off);
    } else if (tok_is(t, T_NAME, "for")) {
        nd = parse_for(p, off);
    } else if (tok_is(t, T_NAME, "set")) {
        nd = parse_set(p, off);
    } else if (tok_is(t, T_NAME, "macro")) {
        nd = parse_macro(p, off);
    } else if (tok_is(t, T_NAME, "with")) {
        nd = parse_with(p, off);
    } else if (tok_is(t, T_NAME, "break") || tok_is(t, T_NAME, "continue")) {
        if (p->loop_depth == 0)
            perr(p, off, "'%.*s' outside of a loop", (int)t->n, t->s);
        nd = new_node(p, tok_is(t, T_NAME, "break") ? N_BREAK : N_CONTINUE, off);
        expect_block_end(p);
    } else if (tok_is(t, T_NAME, "filter")) {
        nd = new_node(p, N_FILTERBLOCK, off);
        nd->a = parse_filter_chain(p, new_node(p, N_BLOCKINPUT, off), false);
        expect_block_end(p);
        static const char *const end[] = {"endfilter", NULL};
        nd->list = subparse(p, end, &nd->n);
        advance(p);
        expect_block_end(p);
    } else if (tok_is(t, T_NAME, "generation")) {
        /* transformers' assistant-mask marker: renders its body unchanged */
        nd = new_node(p, N_BLOCK, off);
        expect_block_end(p);
        static const char *const end[] = {"endgeneration", NULL};
        nd->list = subparse(p, end, &nd->n);
        advance(p);
        expect_block_end(p);
    } else {
        perr(p, off, "Encountered unknown tag '%.*s'.", (int)t->n, t->s);
    }
    leave(p);
    return nd;
}

static bool is_end_tag(jparser *p, const char *const *end_tags) {
    for (int i = 0; end_tags && end_tags[i]; i++)
        if (is_name(p, end_tags[i]))
            return true;
    return false;
}

static jnode **subparse(jparser *p, const char *const *end_tags, int *n) {
    nvec body = NVEC(p);
    for (;;) {
        jtok *t = cur(p);
        if (t->type == T_EOF) {
            if (end_tags) {
                char want[128] = "";
                for (int i = 0; end_tags[i]; i++) {
                    size_t l = strlen(want);
                    snprintf(want + l, sizeof want - l, "%s'%s'", i ? " or " : "", end_tags[i]);
                }
                                perr(p, t->off, "Unexpected end of template. Jinja was looking for the following tags: %s.", want);
            }
            break;
        }
        if (t->type == T_DATA) {
            jnode *nd = new_node(p, N_TEXT, t->off);
            nd->cval = jv_strn(t->s, t->n);
            nv_push(&body, nd);
            advance(p);
        } else if (t->type == T_VBEGIN) {
            advance(p);
            jnode *nd = new_node(p, N_OUTPUT, t->off);
            nd->a = parse_tuple(p, TUPLE_CONDEXPR, NULL, false);
            expect_type(p, T_VEND, "end of print statement");
            nv_push(&body, nd);
        } else if (t->type == T_BBEGIN) {
            advance(p);
            if (is_end_tag(p, end_tags))
                break;
            nv_push(&body, parse_statement(p));
        } else {
            unexpected(p, NULL);
        }
    }
    return nv_finish(&body, n);
}

int jinja_parse_source(jinja_template *t, const char *src, size_t len) {
    jparser *p = cv_xcalloc(1, sizeof *p);
    p->t = t;
    p->src = src;
    p->len = len;
    int rc = 0;
    if (setjmp(p->jmp) == 0) {
        lex(p);
        t->body = subparse(p, NULL, &t->n_body);
    } else {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%s", p->err);
    }
    free(p->toks);
    free(p);
    return rc;
}

/* ---- vLLM's content-format detection ------------------------------------------------------------ */

/*
 * vLLM decides per template whether message content reaches it as a string or as a list of parts
 * (vllm/renderers/hf.py: _detect_content_format over _iter_nodes_assign_var_or_elems,
 * _iter_nodes_assign_messages_item and _iter_nodes_assign_content_item). The template takes parts
 * ("openai") when a for loop iterates
 *   - a message's content: `X.content` / `X['content']` (under filters, tests or a slice), X being
 *     the target of a loop over `messages` or over a variable assigned from it, transitively;
 *   - inside a macro, a parameter that some call of that macro fills with a message's content, by
 *     position or by keyword (vLLM PR #53824; the innermost such macro counts) — Qwen3.5/3.6 pass
 *     message.content to render_content(content, ...), which loops `for item in content`;
 *   - outside any macro, a plain variable named `content` (vLLM PR #42660).
 * vLLM asserts that the targets its walk meets are plain names; where one is not, the walk raises
 * and the template gets the default, "string". That is kept: the messages/assignment walks are
 * exhaustive (any such target decides "string"), the content walk stops at the first loop that
 * matches, in document order, whose target then decides.
 */

typedef struct namelist { jname v[64]; int n; } namelist;

static bool name_eq(const jname *a, const char *s, size_t n) { return a->n == n && memcmp(a->s, s, n) == 0; }
static bool in_list(const namelist *l, const jname *nm) {
    for (int i = 0; i < l->n; i++)
        if (name_eq(&l->v[i], nm->s, nm->n))
            return true;
    return false;
}
static void add_name(namelist *l, const jname *nm) {
    if (!in_list(l, nm) && l->n < (int)CV_ARRAY_LEN(l->v))
        l->v[l->n++] = *nm;
}

/* A variable (or `var.key` / `var['key']`), possibly under filters, tests and slices. */
static bool var_or_elems_access(const jnode *nd, const namelist *vars, const char *key) {
    while (nd && (nd->kind == N_FILTER || nd->kind == N_TEST || nd->kind == N_SLICE))
        nd = nd->a;
    if (!nd)
        return false;
    if (!key)
        return nd->kind == N_NAME && in_list(vars, &nd->name);
    size_t kl = strlen(key);
    if (nd->kind == N_GETATTR)
        return name_eq(&nd->name, key, kl) && nd->a->kind == N_NAME && in_list(vars, &nd->a->name);
    if (nd->kind == N_GETITEM)
        return nd->b->kind == N_CONST && nd->b->cval.type == JV_STR && nd->b->cval.n == kl &&
               memcmp(nd->b->cval.s, key, kl) == 0 && nd->a->kind == N_NAME && in_list(vars, &nd->a->name);
    return false;
}

typedef void (*node_visitor)(const jnode *nd, void *arg);

/* Every node, in document order (a node before its children, a body before its else). */
static void visit_all(const jnode *nd, node_visitor f, void *arg) {
    if (!nd)
        return;
    f(nd, arg);
    visit_all(nd->a, f, arg);
    visit_all(nd->b, f, arg);
    visit_all(nd->c, f, arg);
    for (int i = 0; i < nd->n; i++)
        visit_all(nd->list[i], f, arg);
    for (int i = 0; i < nd->n2; i++)
        visit_all(nd->list2[i], f, arg);
}

static void visit_template(const jinja_template *t, node_visitor f, void *arg) {
    for (int i = 0; i < t->n_body; i++)
        visit_all(t->body[i], f, arg);
}

typedef struct detect_state {
    const jinja_template *t;
    namelist messages;  /* `messages` and the variables assigned from it */
    namelist message;   /* loop targets over those: one message each */
    bool grew;
    bool failed;        /* vLLM's walk would have raised: "string" */
    int found;          /* the content walk: -1 = no loop yet, 1 = "openai", 0 = its target raised */
    const jnode *macro; /* the macro whose content parameters are being collected */
    namelist *params;
} detect_state;

static void visit_assign(const jnode *nd, void *arg) {
    detect_state *s = arg;
    if (nd->kind != N_SET || !var_or_elems_access(nd->b, &s->messages, NULL))
        return;
    if (nd->a->kind != N_NAME)
        s->failed = true;
    else if (!in_list(&s->messages, &nd->a->name)) {
        add_name(&s->messages, &nd->a->name);
        s->grew = true;
    }
}

static void visit_message_loop(const jnode *nd, void *arg) {
    detect_state *s = arg;
    if (nd->kind != N_FOR || !var_or_elems_access(nd->b, &s->messages, NULL))
        return;
    if (nd->a->kind != N_NAME)
        s->failed = true;
    else
        add_name(&s->message, &nd->a->name);
}

/* The parameters of s->macro that a call fills with a message's content. */
static void visit_macro_call(const jnode *nd, void *arg) {
    detect_state *s = arg;
    const jnode *m = s->macro;
    if (nd->kind != N_CALL || nd->a->kind != N_NAME || !name_eq(&nd->a->name, m->name.s, m->name.n))
        return;
    for (int i = 0; i < nd->n && i < m->nnames; i++)
        if (var_or_elems_access(nd->list[i], &s->message, "content"))
            add_name(s->params, &m->names[i]);
    for (int k = 0; k < nd->nnames; k++) {
        bool is_param = false;
        for (int i = 0; i < m->nnames; i++)
            is_param |= name_eq(&m->names[i], nd->names[k].s, nd->names[k].n);
        if (is_param && var_or_elems_access(nd->list2[k], &s->message, "content"))
            add_name(s->params, &nd->names[k]);
    }
}

static bool is_plain_name(const jnode *nd, const char *s) { return nd->kind == N_NAME && name_eq(&nd->name, s, strlen(s)); }

/* The first loop over a message's content in document order; `params` are the content
 * parameters of the innermost enclosing macro that has any. */
static void find_content_loop(detect_state *s, const jnode *nd, bool in_macro, const namelist *params) {
    if (!nd || s->found >= 0)
        return;
    if (nd->kind == N_FOR) {
        const jnode *it = nd->b;
        if (var_or_elems_access(it, &s->message, "content") ||
            (params && it->kind == N_NAME && in_list(params, &it->name)) ||
            (!in_macro && is_plain_name(it, "content"))) {
            s->found = nd->a->kind == N_NAME;
            return;
        }
    }
    namelist own = {0};
    if (nd->kind == N_MACRO) {
        s->macro = nd;
        s->params = &own;
        visit_template(s->t, visit_macro_call, s);
        in_macro = true;
        if (own.n)
            params = &own;
    }
    find_content_loop(s, nd->a, in_macro, params);
    find_content_loop(s, nd->b, in_macro, params);
    find_content_loop(s, nd->c, in_macro, params);
    for (int i = 0; i < nd->n; i++)
        find_content_loop(s, nd->list[i], in_macro, params);
    for (int i = 0; i < nd->n2; i++)
        find_content_loop(s, nd->list2[i], in_macro, params);
}

bool jinja_loops_over_message_content(const jinja_template *t) {
    detect_state s = {.t = t, .found = -1};
    jname messages = {"messages", 8, 0};
    add_name(&s.messages, &messages);
    do {
        s.grew = false;
        visit_template(t, visit_assign, &s);
    } while (s.grew);
    visit_template(t, visit_message_loop, &s);
    if (s.failed)
        return false;
    for (int i = 0; i < t->n_body && s.found < 0; i++)
        find_content_loop(&s, t->body[i], false, NULL);
    return s.found == 1;
}
