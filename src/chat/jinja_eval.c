/*
 * jinja_eval.c — walks the syntax tree and writes the output.
 *
 * Scoping follows what Jinja2's compiler produces, checked against it: the template's top level
 * and its `if` blocks share one scope; every iteration of a `for` body gets a fresh scope whose
 * parent is the enclosing one (so `set` inside a loop is invisible after it and does not carry
 * over to the next iteration — the reason templates use namespace()); a macro call gets a scope
 * whose parent is the scope the macro was defined in, looked up at call time. Names not found in
 * any scope fall back to the globals transformers defines (range, namespace, raise_exception,
 * strftime_now, dict) and otherwise evaluate to Undefined, which only fails when it is used.
 *
 * Errors leave through jfail(), a longjmp to jinja_render(), which frees the render's arena.
 */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "chat/jinja_internal.h"

#define MAX_MACRO_DEPTH 100
#define DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define DEFAULT_MAX_STEPS 50000000ull

_Noreturn void jfail(jctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    longjmp(c->jmp, 1);
}

void jstep(jctx *c) {
    if (++c->steps > c->max_steps)
        jfail(c, "rendering took more than %llu steps", (unsigned long long)c->max_steps);
}

/* ---- scopes --------------------------------------------------------------------------------- */

static jscope *scope_new(jctx *c, jscope *parent) {
    jscope *s = ja_alloc(&c->arena, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static jv *scope_find_local(jscope *s, const jname *nm) {
    for (size_t i = 0; i < s->n; i++)
        if (s->names[i].hash == nm->hash && s->names[i].n == nm->n && memcmp(s->names[i].s, nm->s, nm->n) == 0)
            return &s->vals[i];
    return NULL;
}

static void scope_set(jctx *c, jscope *s, const jname *nm, jv v) {
    jv *old = scope_find_local(s, nm);
    if (old) {
        *old = v;
        return;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        s->names = ja_grow(&c->arena, s->names, s->cap * sizeof *s->names, cap * sizeof *s->names);
        s->vals = ja_grow(&c->arena, s->vals, s->cap * sizeof *s->vals, cap * sizeof *s->vals);
        s->cap = cap;
    }
    s->names[s->n] = *nm;
    s->vals[s->n] = v;
    s->n++;
}

static jv lookup(jctx *c, jscope *s, const jname *nm) {
    for (; s; s = s->parent) {
        jv *v = scope_find_local(s, nm);
        if (v)
            return *v;
    }
    bool found;
    jv g = jb_global(c, nm, &found);
    if (found)
        return g;
    jv u = jv_undef();
    u.ukind = JU_NAME;
    u.s = nm->s;
    u.n = nm->n;
    return u;
}

static jname name_of(const char *s) { return (jname){s, (uint32_t)strlen(s), jname_hash(s, strlen(s))}; }

/* ---- arithmetic -------------------------------------------------------------------------------- */

static bool is_num(const jv *v) { return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL; }
static bool is_intlike(const jv *v) { return v->type == JV_INT || v->type == JV_BOOL; }
static int64_t as_int(const jv *v) { return v->type == JV_INT ? v->i : v->b; }
static double as_f(const jv *v) { return v->type == JV_FLOAT ? v->f : (double)as_int(v); }

static const char *const OP_SYMBOL[] = {"+", "-", "*", "/", "//", "%", "**"};

static _Noreturn void bad_operands(jctx *c, int op, const jv *a, const jv *b) {
    if (a->type == JV_UNDEF)
        jv_fail_undefined(c, a);
    if (b->type == JV_UNDEF)
        jv_fail_undefined(c, b);
    if (op == OP_ADD && a->type == JV_STR)
        jfail(c, "can only concatenate str (not \"%s\") to str", jv_type_name(b->type));
    if (op == OP_ADD && a->type == JV_LIST)
        jfail(c, "can only concatenate %s (not \"%s\") to %s", a->tuple ? "tuple" : "list",
              b->tuple ? "tuple" : jv_type_name(b->type), a->tuple ? "tuple" : "list");
    jfail(c, "unsupported operand type(s) for %s: '%s' and '%s'", OP_SYMBOL[op], jv_type_name(a->type),
          jv_type_name(b->type));
}

static jv repeat(jctx *c, const jv *seq, int64_t times) {
    if (times <= 0)
        return seq->type == JV_STR ? jv_strn("", 0) : (jv){.type = JV_LIST, .tuple = seq->tuple, .l = jl_new(&c->arena, 0)};
    if (seq->type == JV_STR) {
        if (seq->n && (uint64_t)times > (SIZE_MAX / 2) / seq->n)
            jfail(c, "repeated string is too large");
        char *p = ja_alloc(&c->arena, seq->n * (size_t)times + 1);
        for (int64_t i = 0; i < times; i++)
            memcpy(p + (size_t)i * seq->n, seq->s, seq->n);
        return jv_strn(p, seq->n * (size_t)times);
    }
    if (seq->l->n && (uint64_t)times > (SIZE_MAX / 64) / seq->l->n)
        jfail(c, "repeated list is too large");
    jlist *l = jl_new(&c->arena, seq->l->n * (size_t)times);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq->l->n; k++)
            l->v[l->n++] = seq->l->v[k];
    jv r = jv_list(l);
    r.tuple = seq->tuple;
    return r;
}

static int64_t py_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q--;
    return q;
}

jv je_arith(jctx *c, int op, jv a, jv b) {
    if (is_num(&a) && is_num(&b)) {
        bool ints = is_intlike(&a) && is_intlike(&b);
        int64_t x = ints ? as_int(&a) : 0, y = ints ? as_int(&b) : 0, r;
        double fx = as_f(&a), fy = as_f(&b);
        switch (op) {
        case OP_ADD:
            if (!ints) return jv_float(fx + fy);
            if (__builtin_add_overflow(x, y, &r)) jfail(c, "integer overflow");
            return jv_int(r);
        case OP_SUB:
            if (!ints) return jv_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &r)) jfail(c, "integer overflow");
            return jv_int(r);
        case OP_MUL:
            if (!ints) return jv_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &r)) jfail(c, "integer overflow");
            return jv_int(r);
        case OP_DIV:
            if (fy == 0.0) jfail(c, "division by zero");
            return jv_float(fx / fy);
        case OP_FLOORDIV:
            if (ints) {
                if (y == 0) jfail(c, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) jfail(c, "integer overflow");
                return jv_int(py_floordiv(x, y));
            }
            if (fy == 0.0) jfail(c, "float floor division by zero");
            return jv_float(floor(fx / fy));
        case OP_MOD:
            if (ints) {
                if (y == 0) jfail(c, "integer division or modulo by zero");
                if (y == -1) return jv_int(0);
                r = x % y;
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                return jv_int(r);
            } else {
                if (fy == 0.0) jfail(c, "float modulo");
                double m = fmod(fx, fy);
                if (m != 0.0 && ((m < 0) != (fy < 0))) m += fy;
                else if (m == 0.0) m = copysign(0.0, fy);
                return jv_float(m);
            }
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) jfail(c, "integer overflow");
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) jfail(c, "integer overflow");
                }
                return jv_int(acc);
            }
            if (fx == 0.0 && fy < 0) jfail(c, "0.0 cannot be raised to a negative power");
            return jv_float(pow(fx, fy));
        }
    }
    if (op == OP_ADD && a.type == JV_STR && b.type == JV_STR) {
        char *p = ja_alloc(&c->arena, a.n + b.n + 1);
        memcpy(p, a.s, a.n);
        memcpy(p + a.n, b.s, b.n);
        return jv_strn(p, a.n + b.n);
    }
    if (op == OP_ADD && a.type == JV_LIST && b.type == JV_LIST && a.tuple == b.tuple) {
        jlist *l = jl_new(&c->arena, a.l->n + b.l->n);
        memcpy(l->v, a.l->v, a.l->n * sizeof(jv));
        memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
        l->n = a.l->n + b.l->n;
        jv r = jv_list(l);
        r.tuple = a.tuple;
        return r;
    }
    if (op == OP_MUL && (a.type == JV_STR || a.type == JV_LIST) && is_intlike(&b))
        return repeat(c, &a, as_int(&b));
    if (op == OP_MUL && (b.type == JV_STR || b.type == JV_LIST) && is_intlike(&a))
        return repeat(c, &b, as_int(&a));
    if (op == OP_MOD && a.type == JV_STR)
        return jb_percent_format(c, &a, &b);
    bad_operands(c, op, &a, &b);
}

static bool compare(jctx *c, int op, const jv *a, const jv *b) {
    switch (op) {
    case OP_EQ: return jv_eq(a, b);
    case OP_NE: return !jv_eq(a, b);
    case OP_LT: return jv_cmp(c, a, b) < 0;
    case OP_LE: return jv_cmp(c, a, b) <= 0;
    case OP_GT: return jv_cmp(c, a, b) > 0;
    case OP_GE: return jv_cmp(c, a, b) >= 0;
    case OP_IN: return jv_contains(c, b, a);
    case OP_NOTIN: return !jv_contains(c, b, a);
    }
    assert(0);
    return false;
}

/* ---- slicing ------------------------------------------------------------------------------------ */

static int64_t slice_bound(jctx *c, const jv *v, bool *given) {
    *given = false;
    if (v->type == JV_NONE || v->type == JV_UNDEF)
        return 0;
    if (!is_intlike(v))
        jfail(c, "slice indices must be integers or None");
    *given = true;
    return as_int(v);
}

/* Python's slice.indices(): clamps start/stop for a sequence of length len and step. */
static void slice_indices(int64_t len, int64_t step, bool has_start, int64_t start, bool has_stop,
                          int64_t stop, int64_t *ostart, int64_t *ostop) {
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
    if (!has_start) {
        start = step < 0 ? hi : lo;
    } else {
        if (start < 0) start += len;
        if (start < lo) start = lo;
        if (start > hi) start = hi;
    }
    if (!has_stop) {
        stop = step < 0 ? lo : hi;
    } else {
        if (stop < 0) stop += len;
        if (stop < lo) stop = lo;
        if (stop > hi) stop = hi;
    }
    *ostart = start;
    *ostop = stop;
}

static jv eval(jctx *c, jscope *s, const jnode *nd);

static jv eval_slice(jctx *c, jscope *s, const jnode *nd) {
    jv obj = eval(c, s, nd->a);
    jv b[3];
    bool given[3];
    int64_t v[3];
    for (int i = 0; i < 3; i++) {
        b[i] = nd->list[i] ? eval(c, s, nd->list[i]) : jv_none();
        v[i] = slice_bound(c, &b[i], &given[i]);
    }
    int64_t step = given[2] ? v[2] : 1;
    if (step == 0)
        jfail(c, "slice step cannot be zero");
    if (obj.type == JV_UNDEF)
        jv_fail_undefined(c, &obj);
    if (obj.type != JV_LIST && obj.type != JV_STR)
        return jv_undef(); /* Jinja's getitem turns the TypeError into Undefined */
    bool is_str = obj.type == JV_STR;
    bool ascii = is_str && ju_cplen(obj.s, obj.n) == obj.n;
    jlist *chars = is_str && !ascii ? jv_iterate(c, &obj) : NULL;
    int64_t len = is_str ? (int64_t)(chars ? chars->n : obj.n) : (int64_t)obj.l->n;
    int64_t start, stop;
    slice_indices(len, step, given[0], v[0], given[1], v[1], &start, &stop);
    if (is_str) {
        if (ascii && step == 1)
            return jv_strn(obj.s + start, stop > start ? (size_t)(stop - start) : 0);
        jbuf out;
        jb_init(&out, &c->arena);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (chars)
                jb_put(&out, chars->v[i].s, chars->v[i].n);
            else
                jb_putc(&out, obj.s[i]);
        }
        return jv_strn(out.p ? out.p : "", out.n);
    }
    jlist *l = jl_new(&c->arena, 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        jl_push(&c->arena, l, obj.l->v[i]);
    jv r = jv_list(l);
    r.tuple = obj.tuple;
    return r;
}

/* ---- calls --------------------------------------------------------------------------------------- */

static void eval_args(jctx *c, jscope *s, const jnode *nd, jargs *a) {
    jv *pos = nd->n ? ja_alloc(&c->arena, (size_t)nd->n * sizeof(jv)) : NULL;
    jv *kw = nd->n2 ? ja_alloc(&c->arena, (size_t)nd->n2 * sizeof(jv)) : NULL;
    for (int i = 0; i < nd->n; i++)
        pos[i] = eval(c, s, nd->list[i]);
    for (int i = 0; i < nd->n2; i++)
        kw[i] = eval(c, s, nd->list2[i]);
    *a = (jargs){pos, nd->n, nd->names, kw, nd->n2};
}

static void exec_body(jctx *c, jscope *s, jnode *const *body, int n);

static jv call_macro(jctx *c, const jmacro *m, const jargs *a) {
    const jnode *def = m->def;
    if (c->depth >= MAX_MACRO_DEPTH)
        jfail(c, "macro calls nested more than %d deep", MAX_MACRO_DEPTH);
    jstep(c);
    jscope *s = scope_new(c, m->closure);
    jlist *varargs = jl_new(&c->arena, 0);
    jdict *kwargs = jd_new(&c->arena, 0);
    bool *bound = ja_alloc(&c->arena, (size_t)(def->nnames + 1) * sizeof(bool));
    memset(bound, 0, (size_t)(def->nnames + 1) * sizeof(bool));
    for (int i = 0; i < a->npos; i++) {
        if (i < def->nnames) {
            scope_set(c, s, &def->names[i], a->pos[i]);
            bound[i] = true;
        } else {
            jl_push(&c->arena, varargs, a->pos[i]);
        }
    }
    for (int k = 0; k < a->nkw; k++) {
        int i = 0;
        for (; i < def->nnames; i++)
            if (def->names[i].n == a->kwn[k].n && memcmp(def->names[i].s, a->kwn[k].s, a->kwn[k].n) == 0)
                break;
        if (i < def->nnames) {
            if (bound[i])
                jfail(c, "macro '%.*s' got multiple values for argument '%.*s'", (int)def->name.n, def->name.s,
                      (int)a->kwn[k].n, a->kwn[k].s);
            scope_set(c, s, &def->names[i], a->kwv[k]);
            bound[i] = true;
        } else {
            jd_set(&c->arena, kwargs, jv_strn(a->kwn[k].s, a->kwn[k].n), a->kwv[k]);
        }
    }
    for (int i = 0; i < def->nnames; i++) {
        if (bound[i])
            continue;
        jv v;
        if (def->list2[i]) {
            v = eval(c, s, def->list2[i]);
        } else {
            v = jv_undef();
            v.ukind = JU_NAME;
            v.s = def->names[i].s;
            v.n = def->names[i].n;
        }
        scope_set(c, s, &def->names[i], v);
    }
    jname vn = name_of("varargs"), kn = name_of("kwargs");
    scope_set(c, s, &vn, jv_tuple(varargs));
    scope_set(c, s, &kn, jv_dict(kwargs));

    jbuf out, *saved = c->out;
    jb_init(&out, &c->arena);
    c->out = &out;
    c->depth++;
    exec_body(c, s, def->list, def->n);
    c->depth--;
    c->out = saved;
    return jv_strn(out.p ? out.p : "", out.n);
}

jv je_call_value(jctx *c, const jv *callee, const jargs *a) {
    switch (callee->type) {
    case JV_MACRO: return call_macro(c, callee->m, a);
    case JV_FUNC: return jb_call_func(c, callee->fn, a);
    case JV_UNDEF: jv_fail_undefined(c, callee);
    default: jfail(c, "'%s' object is not callable", jv_type_name(callee->type));
    }
}

/* ---- expressions --------------------------------------------------------------------------------- */

static jv eval(jctx *c, jscope *s, const jnode *nd) {
    c->cur_off = nd->off;
    switch (nd->kind) {
    case N_CONST: return nd->cval;
    case N_NAME: return lookup(c, s, &nd->name);
    case N_BLOCKINPUT: return c->block_input;
    case N_GETATTR: {
        jv obj = eval(c, s, nd->a);
        c->cur_off = nd->off;
        return jv_getattr(c, &obj, nd->name.s, nd->name.n);
    }
    case N_GETITEM: {
        jv obj = eval(c, s, nd->a);
        jv key = eval(c, s, nd->b);
        c->cur_off = nd->off;
        return jv_getitem(c, &obj, &key);
    }
    case N_SLICE: return eval_slice(c, s, nd);
    case N_CALL: {
        jv callee = eval(c, s, nd->a);
        jargs a;
        eval_args(c, s, nd, &a);
        c->cur_off = nd->off;
        return je_call_value(c, &callee, &a);
    }
    case N_FILTER: {
        jv in = eval(c, s, nd->a);
        jargs a;
        eval_args(c, s, nd, &a);
        c->cur_off = nd->off;
        return jb_call_filter(c, &nd->name, in, &a);
    }
    case N_TEST: {
        jv in = eval(c, s, nd->a);
        jargs a;
        eval_args(c, s, nd, &a);
        c->cur_off = nd->off;
        bool r = jb_call_test(c, &nd->name, in, &a);
        return jv_bool(nd->flag ? !r : r);
    }
    case N_NEG:
    case N_POS: {
        jv v = eval(c, s, nd->a);
        if (v.type == JV_UNDEF)
            jv_fail_undefined(c, &v);
        if (!is_num(&v))
            jfail(c, "bad operand type for unary %c: '%s'", nd->kind == N_NEG ? '-' : '+', jv_type_name(v.type));
        if (nd->kind == N_POS)
            return v.type == JV_BOOL ? jv_int(v.b) : v;
        if (v.type == JV_FLOAT)
            return jv_float(-v.f);
        if (as_int(&v) == INT64_MIN)
            jfail(c, "integer overflow");
        return jv_int(-as_int(&v));
    }
    case N_BIN: {
        jv a = eval(c, s, nd->a);
        jv b = eval(c, s, nd->b);
        c->cur_off = nd->off;
        return je_arith(c, nd->flag, a, b);
    }
    case N_AND: {
        jv a = eval(c, s, nd->a);
        return jv_truthy(&a) ? eval(c, s, nd->b) : a;
    }
    case N_OR: {
        jv a = eval(c, s, nd->a);
        return jv_truthy(&a) ? a : eval(c, s, nd->b);
    }
    case N_NOT: {
        jv a = eval(c, s, nd->a);
        return jv_bool(!jv_truthy(&a));
    }
    case N_CMP: {
        jv left = eval(c, s, nd->a);
        for (int i = 0; i < nd->n; i++) {
            jv right = eval(c, s, nd->list[i]);
            c->cur_off = nd->off;
            if (!compare(c, nd->ops[i], &left, &right))
                return jv_bool(false);
            left = right;
        }
        return jv_bool(true);
    }
    case N_CONCAT: {
        jbuf b;
        jb_init(&b, &c->arena);
        for (int i = 0; i < nd->n; i++) {
            jv v = eval(c, s, nd->list[i]);
            jv_str(c, &b, &v);
        }
        return jv_strn(b.p ? b.p : "", b.n);
    }
    case N_COND: {
        jv t = eval(c, s, nd->a);
        if (jv_truthy(&t))
            return eval(c, s, nd->b);
        return nd->c ? eval(c, s, nd->c) : jv_undef();
    }
    case N_LIST:
    case N_TUPLE: {
        jlist *l = jl_new(&c->arena, (size_t)nd->n);
        for (int i = 0; i < nd->n; i++)
            l->v[l->n++] = eval(c, s, nd->list[i]);
        return nd->kind == N_TUPLE ? jv_tuple(l) : jv_list(l);
    }
    case N_DICT: {
        jdict *d = jd_new(&c->arena, (size_t)nd->n);
        for (int i = 0; i < nd->n; i++) {
            jv k = eval(c, s, nd->list[i]);
            jv v = eval(c, s, nd->list2[i]);
            if (k.type == JV_LIST && !k.tuple)
                jfail(c, "unhashable type: 'list'");
            if (k.type == JV_DICT)
                jfail(c, "unhashable type: 'dict'");
            jd_set(&c->arena, d, k, v);
        }
        return jv_dict(d);
    }
    default: break;
    }
    jfail(c, "statement used as an expression");
}

/* ---- statements ----------------------------------------------------------------------------------- */

static void assign_target(jctx *c, jscope *s, const jnode *target, jv v) {
    if (target->kind == N_NAME) {
        scope_set(c, s, &target->name, v);
        return;
    }
    assert(target->kind == N_TUPLE);
    if (v.type == JV_UNDEF)
        jv_fail_undefined(c, &v);
    jlist *items = jv_iterate(c, &v);
    if (items->n != (size_t)target->n)
        jfail(c, items->n > (size_t)target->n ? "too many values to unpack (expected %d)"
                                               : "not enough values to unpack (expected %d)", target->n);
    for (int i = 0; i < target->n; i++)
        scope_set(c, s, &target->list[i]->name, items->v[i]);
}

static void exec_for(jctx *c, jscope *s, const jnode *nd) {
    jv iterable = eval(c, s, nd->b);
    jlist *items = jv_iterate(c, &iterable);
    if (nd->c) { /* `for x in xs if cond`: loop.* counts only the items that pass */
        jlist *kept = jl_new(&c->arena, items->n);
        for (size_t i = 0; i < items->n; i++) {
            jstep(c);
            jscope *t = scope_new(c, s);
            assign_target(c, t, nd->a, items->v[i]);
            jv ok = eval(c, t, nd->c);
            if (jv_truthy(&ok))
                kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    if (items->n == 0) {
        exec_body(c, s, nd->list2, nd->n2);
        return;
    }
    jname loop_name = name_of("loop");
    jloop *L = ja_alloc(&c->arena, sizeof *L);
    memset(L, 0, sizeof *L);
    L->length = items->n;
    L->items = jv_list(items);
    jv loopv = {0};
    loopv.type = JV_LOOP;
    loopv.loop = L;
    for (size_t i = 0; i < items->n; i++) {
        jstep(c);
        L->index0 = i;
        L->prev = i ? items->v[i - 1] : jv_undef();
        L->next = i + 1 < items->n ? items->v[i + 1] : jv_undef();
        jscope *it = scope_new(c, s);
        scope_set(c, it, &loop_name, loopv);
        assign_target(c, it, nd->a, items->v[i]);
        exec_body(c, it, nd->list, nd->n);
        if (c->loop_ctl == 1) {
            c->loop_ctl = 0;
            break;
        }
        c->loop_ctl = 0;
    }
}

static void exec_set_ns(jctx *c, jscope *s, const jnode *target, jv v) {
    jv ns = lookup(c, s, &target->name);
    if (ns.type != JV_NS)
        jfail(c, "cannot assign attribute on non-namespace object");
    const jname *attr = &target->a->name;
    jd_set(&c->arena, ns.d, jv_strn(attr->s, attr->n), v);
}

static jv capture(jctx *c, jscope *s, jnode *const *body, int n) {
    jbuf out, *saved = c->out;
    jb_init(&out, &c->arena);
    c->out = &out;
    exec_body(c, s, body, n);
    c->out = saved;
    return jv_strn(out.p ? out.p : "", out.n);
}

static void exec_node(jctx *c, jscope *s, const jnode *nd) {
    c->cur_off = nd->off;
    switch (nd->kind) {
    case N_TEXT: jb_put(c->out, nd->cval.s, nd->cval.n); return;
    case N_OUTPUT: {
        jstep(c);
        jv v = eval(c, s, nd->a);
        jv_str(c, c->out, &v);
        return;
    }
    case N_IF: {
        jv t = eval(c, s, nd->a);
        if (jv_truthy(&t))
            exec_body(c, s, nd->list, nd->n);
        else
            exec_body(c, s, nd->list2, nd->n2);
        return;
    }
    case N_FOR: exec_for(c, s, nd); return;
    case N_SET: {
        jv v = eval(c, s, nd->b);
        if (nd->a->kind == N_NSREF)
            exec_set_ns(c, s, nd->a, v);
        else
            assign_target(c, s, nd->a, v);
        return;
    }
    case N_SETBLOCK: {
        jv v = capture(c, s, nd->list, nd->n);
        if (nd->b) {
            jv saved = c->block_input;
            c->block_input = v;
            v = eval(c, s, nd->b);
            c->block_input = saved;
        }
        if (nd->a->kind == N_NSREF)
            exec_set_ns(c, s, nd->a, v);
        else
            assign_target(c, s, nd->a, v);
        return;
    }
    case N_MACRO: {
        jmacro *m = ja_alloc(&c->arena, sizeof *m);
        m->def = nd;
        m->closure = s;
        jv v = {0};
        v.type = JV_MACRO;
        v.m = m;
        scope_set(c, s, &nd->name, v);
        return;
    }
    case N_BREAK: c->loop_ctl = 1; return;
    case N_CONTINUE: c->loop_ctl = 2; return;
    case N_FILTERBLOCK: {
        jv body = capture(c, s, nd->list, nd->n);
        jv saved = c->block_input;
        c->block_input = body;
        jv v = eval(c, s, nd->a);
        c->block_input = saved;
        jv_str(c, c->out, &v);
        return;
    }
    case N_WITH: {
        jscope *w = scope_new(c, s);
        for (int i = 0; i < nd->nnames; i++) /* values see the outer scope, as in Jinja */
            scope_set(c, w, &nd->names[i], eval(c, s, nd->list2[i]));
        exec_body(c, w, nd->list, nd->n);
        return;
    }
    case N_BLOCK: exec_body(c, s, nd->list, nd->n); return;
    default: jfail(c, "expression used as a statement");
    }
}

static void exec_body(jctx *c, jscope *s, jnode *const *body, int n) {
    for (int i = 0; i < n && !c->loop_ctl; i++)
        exec_node(c, s, body[i]);
}

/* ---- public API ------------------------------------------------------------------------------------ */

int jinja_parse(const char *src, size_t len, jinja_template **out) {
    *out = NULL;
    jinja_template *t = cv_xcalloc(1, sizeof *t);
    char *norm = ja_alloc(&t->arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n')
        n--;
    norm[n] = '\0';
    t->src = norm;
    t->len = n;
    int rc = jinja_parse_source(t, norm, n);
    if (rc) {
        jinja_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_template *t) {
    if (!t)
        return;
    ja_free_all(&t->arena);
    free(t);
}

static int line_of(const jinja_template *t, uint32_t off) {
    int line = 1;
    for (size_t i = 0; i < off && i < t->len; i++)
        line += t->src[i] == '\n';
    return line;
}

int jinja_render(const jinja_template *t, const json_t *vars, const jinja_render_options *opts, char **out,
                 size_t *out_len, bool *raised) {
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (raised)
        *raised = false;
    if (vars && !json_is_object(vars))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "chat template: the variables must be a JSON object");
    jctx *c = cv_xcalloc(1, sizeof *c);
    c->arena.limit = opts && opts->max_memory ? opts->max_memory : DEFAULT_MAX_MEMORY;
    c->arena.ctx = c;
    c->max_steps = opts && opts->max_steps ? opts->max_steps : DEFAULT_MAX_STEPS;
    c->now = opts ? opts->now : 0;
    int rc = 0;
    if (setjmp(c->jmp) == 0) {
        jbuf buf;
        jb_init(&buf, &c->arena);
        c->out = &buf;
        c->globals = scope_new(c, NULL);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v) {
            jname nm = {k, (uint32_t)strlen(k), jname_hash(k, strlen(k))};
            scope_set(c, c->globals, &nm, jv_from_json(c, v));
        }
        exec_body(c, c->globals, t->body, t->n_body);
        *out = cv_xstrndup(buf.p ? buf.p : "", buf.n);
        if (out_len)
            *out_len = buf.n;
    } else if (c->error_is_raise) {
        if (raised)
            *raised = true;
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%s", c->errmsg);
    } else {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "chat template: line %d: %s", line_of(t, c->cur_off), c->errmsg);
    }
    ja_free_all(&c->arena);
    free(c);
    return rc;
}

/* json.dumps(v) (as_json) or repr(v) of a JSON value, in a throwaway render context. */
static char *py_format(const json_t *v, bool as_json, size_t *len) {
    jctx *c = cv_xcalloc(1, sizeof *c);
    char *volatile res = NULL;
    if (setjmp(c->jmp) == 0) {
        jv x = jv_from_json(c, v);
        jjson_opts o = {.indent = "", .item_sep = ", ", .key_sep = ": "};
        jbuf b;
        jb_init(&b, &c->arena);
        if (as_json)
            jv_tojson(c, &b, &x, &o, 0);
        else
            jv_repr(c, &b, &x);
        res = cv_xstrndup(b.p ? b.p : "", b.n);
        if (len)
            *len = b.n;
    }
    ja_free_all(&c->arena);
    free(c);
    assert(res); /* values from JSON always serialize */
    return res;
}

char *jinja_json_dumps(const json_t *v, size_t *len) { return py_format(v, true, len); }
char *jinja_py_repr(const json_t *v) { return py_format(v, false, NULL); }
