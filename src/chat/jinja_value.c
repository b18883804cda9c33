/*
 * jinja_value.c — the arena and the Python semantics of template values.
 *
 * Everything here mirrors a CPython behaviour that reaches the rendered bytes: str() and repr()
 * (floats in shortest round-trip form, strings quoted the way repr picks quotes), json.dumps with
 * ensure_ascii=False, == across int/float/bool, ordering of strings by code point, `in`, and
 * Jinja's lookups (getattr then getitem for `a.b`, getitem then getattr for `a[b]`, Undefined when
 * both fail). Strings are UTF-8 but indexed by code point, as Python's str is.
 */
#define _GNU_SOURCE /* memmem */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <utf8proc.h>

#include "base/error.h"
#include "chat/jinja_internal.h"

/* ---- arena ---------------------------------------------------------------------------------- */

struct jarena_chunk {
    jarena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define JA_CHUNK 65536

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->limit && a->used_total + n > a->limit) {
        if (a->ctx)
            jfail(a->ctx, "rendering used more than %zu MiB of memory", a->limit >> 20);
        abort();
    }
    jarena_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > JA_CHUNK / 4 ? n : JA_CHUNK;
        jarena_chunk *c = cv_xmalloc(sizeof *c + cap);
        c->used = 0;
        c->cap = cap;
        if (h && cap == n && h->cap - h->used >= 64) {
            /* A big block gets its own chunk behind the current one, which stays open. */
            c->next = h->next;
            h->next = c;
            c->used = n;
            a->used_total += n;
            return c->data;
        }
        c->next = h;
        a->head = h = c;
    }
    void *p = h->data + h->used;
    h->used += n;
    a->used_total += n;
    return p;
}

void *ja_grow(jarena *a, void *p, size_t old, size_t n) {
    jarena_chunk *h = a->head;
    size_t old_r = (old + 15) & ~(size_t)15, n_r = (n + 15) & ~(size_t)15;
    if (p && h && (unsigned char *)p + old_r == h->data + h->used && h->cap - h->used >= n_r - old_r &&
        (!a->limit || a->used_total + (n_r - old_r) <= a->limit)) {
        h->used += n_r - old_r;
        a->used_total += n_r - old_r;
        return p;
    }
    void *q = ja_alloc(a, n);
    if (old)
        memcpy(q, p, old);
    return q;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void ja_free_all(jarena *a) {
    jarena_chunk *c = a->head;
    while (c) {
        jarena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

/* ---- buffers -------------------------------------------------------------------------------- */

void jb_init(jbuf *b, jarena *a) {
    b->a = a;
    b->p = NULL;
    b->n = b->cap = 0;
}

void jb_put(jbuf *b, const char *s, size_t n) {
    if (!n)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n)
            cap *= 2;
        b->p = ja_grow(b->a, b->p, b->cap, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }
void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

void jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    assert(n >= 0 && (size_t)n < sizeof tmp);
    jb_put(b, tmp, (size_t)n);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

uint32_t ju_decode(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *adv = 1;
        return u[0];
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate(u, (utf8proc_ssize_t)n, &cp);
    if (k <= 0) {
        *adv = 1;
        return u[0];
    }
    *adv = (size_t)k;
    return (uint32_t)cp;
}

size_t ju_cplen(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += ((unsigned char)s[i] & 0xC0) != 0x80;
    return count;
}

size_t ju_cp_offset(const char *s, size_t n, size_t cp_index) {
    size_t i = 0, k = 0;
    while (i < n) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (k == cp_index)
                return i;
            k++;
        }
        i++;
    }
    return n;
}

/* str.isspace(): Unicode White_Space plus the four information separators U+001C..U+001F. */
bool ju_py_isspace(uint32_t cp) {
    if (cp < 0x80)
        return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- lists and dicts -------------------------------------------------------------------------- */

jlist *jl_new(jarena *a, size_t cap) {
    jlist *l = ja_alloc(a, sizeof *l);
    l->n = 0;
    /* never NULL, so that memcpy() of zero items stays defined */
    l->cap = cap ? cap : 1;
    l->v = ja_alloc(a, l->cap * sizeof(jv));
    return l;
}

void jl_push(jarena *a, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        l->v = ja_grow(a, l->v, l->cap * sizeof(jv), cap * sizeof(jv));
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

jv jv_list(jlist *l) { jv v = {0}; v.type = JV_LIST; v.l = l; return v; }
jv jv_tuple(jlist *l) { jv v = jv_list(l); v.tuple = 1; return v; }
jv jv_dict(jdict *d) { jv v = {0}; v.type = JV_DICT; v.d = d; return v; }

jdict *jd_new(jarena *a, size_t cap) {
    jdict *d = ja_alloc(a, sizeof *d);
    d->n = 0;
    d->cap = cap ? cap : 1;
    d->k = ja_alloc(a, d->cap * sizeof(jv));
    d->v = ja_alloc(a, d->cap * sizeof(jv));
    return d;
}

const jv *jd_get_str(const jdict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].type == JV_STR && d->k[i].n == n && memcmp(d->k[i].s, s, n) == 0)
            return &d->v[i];
    return NULL;
}

const jv *jd_get(const jdict *d, const jv *key) {
    if (key->type == JV_STR)
        return jd_get_str(d, key->s, key->n);
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(&d->k[i], key))
            return &d->v[i];
    return NULL;
}

void jd_set(jarena *a, jdict *d, jv key, jv val) {
    jv *old = (jv *)jd_get(d, &key);
    if (old) {
        *old = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        d->k = ja_grow(a, d->k, d->cap * sizeof(jv), cap * sizeof(jv));
        d->v = ja_grow(a, d->v, d->cap * sizeof(jv), cap * sizeof(jv));
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}

/* ---- Python semantics ------------------------------------------------------------------------- */

const char *jv_type_name(int type) {
    switch (type) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

bool jv_truthy(const jv *v) {
    switch (v->type) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v->b;
    case JV_INT: return v->i != 0;
    case JV_FLOAT: return v->f != 0.0;
    case JV_STR: return v->n != 0;
    case JV_LIST: return v->l->n != 0;
    case JV_DICT: return v->d->n != 0;
    default: return true;
    }
}

static bool jv_is_number(const jv *v) {
    return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL;
}
static double jv_num(const jv *v) {
    return v->type == JV_FLOAT ? v->f : v->type == JV_INT ? (double)v->i : (double)v->b;
}
static int64_t jv_intval(const jv *v) { return v->type == JV_INT ? v->i : (int64_t)v->b; }

bool jv_eq(const jv *a, const jv *b) {
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT)
            return jv_intval(a) == jv_intval(b);
        return jv_num(a) == jv_num(b);
    }
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a->n == b->n && memcmp(a->s, b->s, a->n) == 0;
    case JV_LIST:
        if (a->tuple != b->tuple || a->l->n != b->l->n)
            return false;
        for (size_t i = 0; i < a->l->n; i++)
            if (!jv_eq(&a->l->v[i], &b->l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a->d->n != b->d->n)
            return false;
        for (size_t i = 0; i < a->d->n; i++) {
            const jv *o = jd_get(b->d, &a->d->k[i]);
            if (!o || !jv_eq(&a->d->v[i], o))
                return false;
        }
        return true;
    case JV_NS: return a->d == b->d;
    case JV_MACRO: return a->m == b->m;
    case JV_FUNC: return a->fn == b->fn;
    case JV_LOOP: return a->loop == b->loop;
    }
    return false;
}

int jv_cmp(jctx *c, const jv *a, const jv *b) {
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) {
            int64_t x = jv_intval(a), y = jv_intval(b);
            return (x > y) - (x < y);
        }
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a->type == JV_STR && b->type == JV_STR) {
        /* UTF-8 byte order is code point order. */
        size_t n = a->n < b->n ? a->n : b->n;
        int r = n ? memcmp(a->s, b->s, n) : 0;
        if (r)
            return r;
        return (a->n > b->n) - (a->n < b->n);
    }
    if (a->type == JV_LIST && b->type == JV_LIST && a->tuple == b->tuple) {
        size_t n = a->l->n < b->l->n ? a->l->n : b->l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(&a->l->v[i], &b->l->v[i]))
                continue;
            return jv_cmp(c, &a->l->v[i], &b->l->v[i]);
        }
        return (a->l->n > b->l->n) - (a->l->n < b->l->n);
    }
    if (a->type == JV_UNDEF)
        jv_fail_undefined(c, a);
    if (b->type == JV_UNDEF)
        jv_fail_undefined(c, b);
    jfail(c, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a->type),
          jv_type_name(b->type));
}

static bool str_find(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0)
        return true;
    if (nn > hn)
        return false;
    return memmem(h, hn, n, nn) != NULL;
}

bool jv_contains(jctx *c, const jv *container, const jv *item) {
    switch (container->type) {
    case JV_STR:
        if (item->type != JV_STR)
            jfail(c, "'in <string>' requires string as left operand, not %s", jv_type_name(item->type));
        return str_find(container->s, container->n, item->s, item->n);
    case JV_LIST:
        for (size_t i = 0; i < container->l->n; i++)
            if (jv_eq(&container->l->v[i], item))
                return true;
        return false;
    case JV_DICT:
    case JV_NS:
        if ((item->type == JV_LIST && !item->tuple) || item->type == JV_DICT)
            jfail(c, "unhashable type: '%s'", jv_type_name(item->type));
        return jd_get(container->d, item) != NULL;
    case JV_UNDEF: return false; /* Undefined iterates as empty */
    default:
        jfail(c, "argument of type '%s' is not iterable", jv_type_name(container->type));
    }
}

/* ---- str(), repr() ---------------------------------------------------------------------------- */

void jv_format_float(double f, jbuf *b) {
    if (isnan(f)) {
        jb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jb_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    /* Shortest digit string that reads back as f, then Python's layout rules for repr(). */
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    char digits[24];
    int nd = 0, exp10;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    if (neg)
        jb_putc(b, '-');
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            jb_puts(b, "0.");
            for (int i = 0; i < -exp10 - 1; i++)
                jb_putc(b, '0');
            jb_put(b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= exp10; i++)
                jb_putc(b, i < nd ? digits[i] : '0');
            jb_putc(b, '.');
            if (nd > exp10 + 1)
                jb_put(b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
            else
                jb_putc(b, '0');
        }
        return;
    }
    jb_putc(b, digits[0]);
    if (nd > 1) {
        jb_putc(b, '.');
        jb_put(b, digits + 1, (size_t)(nd - 1));
    }
    jb_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
}

static bool py_isprintable(uint32_t cp) {
    if (cp < 0x80)
        return cp >= 0x20 && cp < 0x7F;
    if (cp == 0x20)
        return true;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    switch (cat) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
    }
}

static void repr_str(jbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(b, q);
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t cp = ju_decode(s + i, n - i, &adv);
        if (cp == (uint32_t)q || cp == '\\') {
            jb_putc(b, '\\');
            jb_putc(b, (char)cp);
        } else if (cp == '\n') {
            jb_puts(b, "\\n");
        } else if (cp == '\r') {
            jb_puts(b, "\\r");
        } else if (cp == '\t') {
            jb_puts(b, "\\t");
        } else if (py_isprintable(cp)) {
            jb_put(b, s + i, adv);
        } else if (cp < 0x100) {
            jb_printf(b, "\\x%02x", cp);
        } else if (cp < 0x10000) {
            jb_printf(b, "\\u%04x", cp);
        } else {
            jb_printf(b, "\\U%08x", cp);
        }
        i += adv;
    }
    jb_putc(b, q);
}

void jv_repr(jctx *c, jbuf *b, const jv *v) {
    switch (v->type) {
    case JV_STR: repr_str(b, v->s, v->n); return;
    case JV_LIST: {
        jb_putc(b, v->tuple ? '(' : '[');
        for (size_t i = 0; i < v->l->n; i++) {
            if (i)
                jb_puts(b, ", ");
            jv_repr(c, b, &v->l->v[i]);
        }
        if (v->tuple && v->l->n == 1)
            jb_putc(b, ',');
        jb_putc(b, v->tuple ? ')' : ']');
        return;
    }
    case JV_DICT: {
        jb_putc(b, '{');
        for (size_t i = 0; i < v->d->n; i++) {
            if (i)
                jb_puts(b, ", ");
            jv_repr(c, b, &v->d->k[i]);
            jb_puts(b, ": ");
            jv_repr(c, b, &v->d->v[i]);
        }
        jb_putc(b, '}');
        return;
    }
    default: jv_str(c, b, v);
    }
}

void jv_str(jctx *c, jbuf *b, const jv *v) {
    switch (v->type) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v->b ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v->i); return;
    case JV_FLOAT: jv_format_float(v->f, b); return;
    case JV_STR: jb_put(b, v->s, v->n); return;
    case JV_LIST:
    case JV_DICT: jv_repr(c, b, v); return;
    case JV_NS: jb_puts(b, "<Namespace>"); return;
    case JV_MACRO: jb_printf(b, "<Macro '%.*s'>", (int)v->m->def->name.n, v->m->def->name.s); return;
    case JV_FUNC: jb_puts(b, "<built-in function>"); return;
    case JV_LOOP: jb_puts(b, "<LoopContext>"); return;
    }
}

jv jv_to_str(jctx *c, const jv *v) {
    if (v->type == JV_STR)
        return *v;
    if (v->type == JV_UNDEF)
        return jv_strn("", 0);
    jbuf b;
    jb_init(&b, &c->arena);
    jv_str(c, &b, v);
    return jv_strn(b.p ? b.p : "", b.n);
}

/* ---- json.dumps -------------------------------------------------------------------------------- */

static void json_str(jbuf *b, const char *s, size_t n, bool ensure_ascii) {
    jb_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (ch < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", ch);
                esc = tmp;
            } else if (ch >= 0x80 && ensure_ascii) {
                size_t adv;
                uint32_t cp = ju_decode(s + i, n - i, &adv);
                if (cp >= 0x10000) {
                    uint32_t x = cp - 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF));
                } else {
                    snprintf(tmp, sizeof tmp, "\\u%04x", cp);
                }
                jb_put(b, s + i - run, run);
                run = 0;
                jb_puts(b, tmp);
                i += adv - 1;
                continue;
            }
        }
        if (esc) {
            jb_put(b, s + i - run, run);
            run = 0;
            jb_puts(b, esc);
        } else {
            run++;
        }
    }
    jb_put(b, s + n - run, run);
    jb_putc(b, '"');
}

static void json_newline(jbuf *b, const jjson_opts *o, int level) {
    jb_putc(b, '\n');
    for (int i = 0; i < level; i++)
        jb_puts(b, o->indent);
}

static void json_key(jctx *c, jbuf *b, const jv *k, const jjson_opts *o) {
    switch (k->type) {
    case JV_STR: json_str(b, k->s, k->n, o->ensure_ascii); return;
    case JV_BOOL: jb_puts(b, k->b ? "\"true\"" : "\"false\""); return;
    case JV_NONE: jb_puts(b, "\"null\""); return;
    case JV_INT:
    case JV_FLOAT:
        jb_putc(b, '"');
        jv_tojson(c, b, k, o, 0);
        jb_putc(b, '"');
        return;
    default: jfail(c, "keys must be str, int, float, bool or None, not %s", jv_type_name(k->type));
    }
}

static int key_order(jctx *c, const jv *keys, size_t i, size_t j) { return jv_cmp(c, &keys[i], &keys[j]); }

void jv_tojson(jctx *c, jbuf *b, const jv *v, const jjson_opts *o, int level) {
    switch (v->type) {
    case JV_NONE: jb_puts(b, "null"); return;
    case JV_BOOL: jb_puts(b, v->b ? "true" : "false"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v->i); return;
    case JV_FLOAT:
        if (isnan(v->f))
            jb_puts(b, "NaN");
        else if (isinf(v->f))
            jb_puts(b, v->f < 0 ? "-Infinity" : "Infinity");
        else
            jv_format_float(v->f, b);
        return;
    case JV_STR: json_str(b, v->s, v->n, o->ensure_ascii); return;
    case JV_LIST:
        if (v->l->n == 0) {
            jb_puts(b, "[]");
            return;
        }
        jb_putc(b, '[');
        for (size_t i = 0; i < v->l->n; i++) {
            if (i)
                jb_puts(b, o->item_sep);
            if (o->has_indent)
                json_newline(b, o, level + 1);
            jv_tojson(c, b, &v->l->v[i], o, level + 1);
        }
        if (o->has_indent)
            json_newline(b, o, level);
        jb_putc(b, ']');
        return;
    case JV_DICT: {
        size_t n = v->d->n;
        if (n == 0) {
            jb_puts(b, "{}");
            return;
        }
        size_t *order = ja_alloc(&c->arena, n * sizeof *order);
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        if (o->sort_keys) /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && key_order(c, v->d->k, order[j - 1], order[j]) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        jb_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i)
                jb_puts(b, o->item_sep);
            if (o->has_indent)
                json_newline(b, o, level + 1);
            json_key(c, b, &v->d->k[order[i]], o);
            jb_puts(b, o->key_sep);
            jv_tojson(c, b, &v->d->v[order[i]], o, level + 1);
        }
        if (o->has_indent)
            json_newline(b, o, level);
        jb_putc(b, '}');
        return;
    }
    default:
        jfail(c, "Object of type %s is not JSON serializable", jv_type_name(v->type));
    }
}

jv jv_from_json(jctx *c, const void *p) {
    const json_t *j = p;
    switch (json_typeof(j)) {
    case JSON_NULL: return jv_none();
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_STRING: return jv_strn(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jlist *l = jl_new(&c->arena, n);
        for (size_t i = 0; i < n; i++)
            l->v[l->n++] = jv_from_json(c, json_array_get(j, i));
        return jv_list(l);
    }
    case JSON_OBJECT: {
        jdict *d = jd_new(&c->arena, json_object_size(j));
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)j, k, val) {
            /* Keys are unique in a jansson object, so no lookup is needed. */
            d->k[d->n] = jv_strn(k, strlen(k));
            d->v[d->n] = jv_from_json(c, val);
            d->n++;
        }
        return jv_dict(d);
    }
    }
    return jv_none();
}

/* ---- iteration, length, lookups --------------------------------------------------------------- */

jlist *jv_iterate(jctx *c, const jv *v) {
    switch (v->type) {
    case JV_LIST: return v->l;
    case JV_DICT:
    case JV_NS: {
        jlist *l = jl_new(&c->arena, v->d->n);
        memcpy(l->v, v->d->k, v->d->n * sizeof(jv));
        l->n = v->d->n;
        return l;
    }
    case JV_STR: {
        jlist *l = jl_new(&c->arena, v->n);
        for (size_t i = 0; i < v->n;) {
            size_t adv;
            ju_decode(v->s + i, v->n - i, &adv);
            l->v[l->n++] = jv_strn(v->s + i, adv);
            i += adv;
        }
        return l;
    }
    case JV_UNDEF: return jl_new(&c->arena, 0);
    default: jfail(c, "'%s' object is not iterable", jv_type_name(v->type));
    }
}

size_t jv_length(jctx *c, const jv *v) {
    switch (v->type) {
    case JV_STR: return ju_cplen(v->s, v->n);
    case JV_LIST: return v->l->n;
    case JV_DICT:
    case JV_NS: return v->d->n;
    case JV_UNDEF: return 0;
    default: jfail(c, "object of type '%s' has no len()", jv_type_name(v->type));
    }
}

_Noreturn void jv_fail_undefined(jctx *c, const jv *u) {
    assert(u->type == JV_UNDEF);
    switch (u->ukind) {
    case JU_NAME: jfail(c, "'%.*s' is undefined", (int)u->n, u->s);
    case JU_ATTR: jfail(c, "'%s object' has no attribute '%.*s'", jv_type_name(u->uowner), (int)u->n, u->s);
    case JU_INDEX: jfail(c, "%s object has no element %lld", jv_type_name(u->uowner), (long long)(int64_t)u->n);
    default: jfail(c, "undefined value used");
    }
}

static jv undef_attr(const jv *owner, const char *name, size_t n) {
    jv u = jv_undef();
    u.ukind = JU_ATTR;
    u.uowner = owner->type;
    u.s = name;
    u.n = n;
    return u;
}

static jv loop_attr(jctx *c, const jv *obj, const char *name, size_t n, bool *found) {
    const jloop *L = obj->loop;
    *found = true;
#define IS(lit) (n == sizeof lit - 1 && memcmp(name, lit, n) == 0)
    if (IS("index0")) return jv_int((int64_t)L->index0);
    if (IS("index")) return jv_int((int64_t)L->index0 + 1);
    if (IS("revindex")) return jv_int((int64_t)(L->length - L->index0));
    if (IS("revindex0")) return jv_int((int64_t)(L->length - L->index0 - 1));
    if (IS("first")) return jv_bool(L->index0 == 0);
    if (IS("last")) return jv_bool(L->index0 + 1 == L->length);
    if (IS("length")) return jv_int((int64_t)L->length);
    if (IS("previtem")) return L->prev;
    if (IS("nextitem")) return L->next;
    if (IS("depth")) return jv_int(1); /* recursion depth; recursive loops are not supported */
    if (IS("depth0")) return jv_int(0);
#undef IS
    *found = false;
    return jb_method(c, obj, name, n, found);
}

jv jv_getattr(jctx *c, const jv *obj, const char *name, size_t n) {
    bool found = false;
    jv r;
    switch (obj->type) {
    case JV_UNDEF: jv_fail_undefined(c, obj);
    case JV_DICT:
        /* Python attributes (the dict's methods) win over keys, as in Jinja's getattr(). */
        r = jb_method(c, obj, name, n, &found);
        if (found)
            return r;
        {
            const jv *v = jd_get_str(obj->d, name, n);
            if (v)
                return *v;
        }
        return undef_attr(obj, name, n);
    case JV_NS: {
        const jv *v = jd_get_str(obj->d, name, n);
        return v ? *v : undef_attr(obj, name, n);
    }
    case JV_LOOP:
        r = loop_attr(c, obj, name, n, &found);
        return found ? r : undef_attr(obj, name, n);
    default:
        r = jb_method(c, obj, name, n, &found);
        return found ? r : undef_attr(obj, name, n);
    }
}

static bool index_to_pos(int64_t i, size_t len, size_t *pos) {
    if (i < 0)
        i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len)
        return false;
    *pos = (size_t)i;
    return true;
}

jv jv_getitem(jctx *c, const jv *obj, const jv *key) {
    size_t pos;
    if (obj->type == JV_UNDEF)
        jv_fail_undefined(c, obj);
    if ((key->type == JV_INT || key->type == JV_BOOL) &&
        (obj->type == JV_LIST || obj->type == JV_STR)) {
        int64_t i = key->type == JV_INT ? key->i : key->b;
        if (obj->type == JV_LIST) {
            if (index_to_pos(i, obj->l->n, &pos))
                return obj->l->v[pos];
        } else {
            size_t len = ju_cplen(obj->s, obj->n);
            if (index_to_pos(i, len, &pos)) {
                size_t off = ju_cp_offset(obj->s, obj->n, pos), adv;
                ju_decode(obj->s + off, obj->n - off, &adv);
                return jv_strn(obj->s + off, adv);
            }
        }
        jv u = jv_undef();
        u.ukind = JU_INDEX;
        u.uowner = obj->type;
        u.n = (size_t)i;
        return u;
    }
    if (obj->type == JV_DICT) {
        const jv *v = jd_get(obj->d, key);
        if (v)
            return *v;
    }
    if (key->type == JV_STR)
        return jv_getattr(c, obj, key->s, key->n);
    jv u = jv_undef();
    u.ukind = JU_PLAIN;
    return u;
}
