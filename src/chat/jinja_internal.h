/*
 * jinja_internal.h — what the pieces of the Jinja interpreter share: the arena, the dynamic value
 * type, the syntax tree and the render context.
 *
 * Memory: everything a render creates (values, scopes, output buffers) lives in one arena that is
 * dropped when the render ends. Values are therefore plain structs passed by value with no
 * reference counts, strings may point into the request's JSON or the template source without a
 * copy, and a render error can leave by longjmp() from any depth without leaking: the arena goes
 * away as a whole. The arena has a byte budget and the render a step budget, so a hostile
 * template (nested range() loops, string doubling) fails with a message instead of taking the
 * process down. The parse tree of a template lives in its own arena for the template's lifetime.
 *
 * Values follow Python, because byte equality with Jinja2 needs Python's str(), repr(), ==, <,
 * truthiness and json.dumps. Lists are never mutated after construction (the sandbox transformers
 * uses forbids append & co.), so sharing them is safe; namespaces are the only mutable objects.
 */
#ifndef CV_JINJA_INTERNAL_H
#define CV_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat/jinja.h"

/* ---- arena ---------------------------------------------------------------------------------- */

typedef struct jarena_chunk jarena_chunk;
typedef struct jarena {
    jarena_chunk *head;
    size_t used_total, limit; /* bytes handed out, budget (0 = none) */
    struct jctx *ctx;         /* the render to fail when the budget is exceeded; NULL = abort */
} jarena;

void *ja_alloc(jarena *a, size_t n);
/* Grows the block p (old bytes) to n bytes, in place when it is the arena's last allocation. */
void *ja_grow(jarena *a, void *p, size_t old, size_t n);
char *ja_strndup(jarena *a, const char *s, size_t n);
void ja_free_all(jarena *a);

/* ---- values ---------------------------------------------------------------------------------- */

typedef enum jtype {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS, JV_MACRO, JV_FUNC, JV_LOOP,
} jtype;

/* Undefined values remember why they are undefined, for the error raised when one is used. */
enum { JU_NAME, JU_ATTR, JU_INDEX, JU_PLAIN };

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;
typedef struct jloop jloop;
typedef struct jmacro jmacro;

typedef struct jv {
    uint8_t type;
    uint8_t tuple;     /* JV_LIST: a tuple (repr "(1,)", != list) */
    uint8_t ukind;     /* JV_UNDEF: JU_* */
    uint8_t uowner;    /* JV_UNDEF: jtype of the object that lacked the attribute */
    size_t n;          /* JV_STR: byte length; JV_UNDEF: name length or the index */
    union {
        bool b;
        int64_t i;
        double f;
        const char *s; /* JV_STR bytes (not NUL-terminated); JV_UNDEF name */
        jlist *l;
        jdict *d;      /* JV_DICT and JV_NS */
        jfunc *fn;
        jloop *loop;
        jmacro *m;
    };
} jv;

struct jlist { size_t n, cap; jv *v; };
struct jdict { size_t n, cap; jv *k, *v; };

static inline jv jv_undef(void) { jv v = {0}; v.type = JV_UNDEF; v.ukind = JU_PLAIN; return v; }
static inline jv jv_none(void) { jv v = {0}; v.type = JV_NONE; return v; }
static inline jv jv_bool(bool b) { jv v = {0}; v.type = JV_BOOL; v.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {0}; v.type = JV_INT; v.i = i; return v; }
static inline jv jv_float(double f) { jv v = {0}; v.type = JV_FLOAT; v.f = f; return v; }
static inline jv jv_strn(const char *s, size_t n) { jv v = {0}; v.type = JV_STR; v.s = s; v.n = n; return v; }

/* ---- growing byte buffer in the arena ---------------------------------------------------------- */

typedef struct jbuf { jarena *a; char *p; size_t n, cap; } jbuf;
void jb_init(jbuf *b, jarena *a);
void jb_put(jbuf *b, const char *s, size_t n);
void jb_putc(jbuf *b, char c);
void jb_puts(jbuf *b, const char *s);
void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- syntax tree ------------------------------------------------------------------------------ */

typedef enum jkind {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_FILTERBLOCK,
    N_WITH, N_BLOCK,
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_POS, N_BIN,
    N_AND, N_OR, N_NOT, N_CMP, N_CONCAT, N_COND, N_LIST, N_TUPLE, N_DICT, N_NSREF, N_BLOCKINPUT,
} jkind;

typedef enum jop {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
} jop;

typedef struct jname { const char *s; uint32_t n, hash; } jname;

typedef struct jnode jnode;
struct jnode {
    uint8_t kind;
    uint8_t flag;       /* N_TEST: negated */
    uint32_t off;       /* byte offset in the source, for error messages */
    jv cval;            /* N_CONST, N_TEXT */
    jname name;         /* names, attributes, filter/test/macro names */
    jnode *a, *b, *c;
    jnode **list; int n;        /* body, items, positional args, compare operands */
    jnode **list2; int n2;      /* else body, keyword values, dict values, macro defaults */
    jname *names; int nnames;   /* keyword names, macro parameters, with-names */
    uint8_t *ops;               /* N_CMP operators (jop), one per operand */
};

struct jinja_template {
    jarena arena;       /* the tree, the normalised source and the literal strings */
    const char *src;    /* the normalised source */
    size_t len;
    jnode **body;
    int n_body;
};

uint32_t jname_hash(const char *s, size_t n);

/* Parses src (already newline-normalised) into t->body; on failure sets a cv_fail message and
 * returns CVLLM_ERR_INVALID_ARGUMENT. */
int jinja_parse_source(jinja_template *t, const char *src, size_t len);

/* ---- render context --------------------------------------------------------------------------- */

typedef struct jscope jscope;
struct jscope {
    jscope *parent;
    size_t n, cap;
    jname *names;
    jv *vals;
};

struct jmacro { const jnode *def; jscope *closure; };
struct jloop {
    size_t index0, length;
    jv prev, next;
    jv items;           /* the list iterated, for cycle() */
    bool has_changed; jv last_changed;
};
struct jfunc { int id; jv self; };

typedef struct jctx {
    jarena arena;
    jmp_buf jmp;
    char errmsg[768];
    bool error_is_raise;      /* raise_exception(): errmsg is the template's own message */
    jbuf *out;
    jscope *globals;
    int loop_ctl;             /* 0, 1 = break, 2 = continue */
    int depth;                /* macro call depth */
    uint64_t steps, max_steps;
    int64_t now;              /* strftime_now()'s clock (0 = the current time) */
    uint32_t cur_off;         /* offset of the node being evaluated */
    jv block_input;           /* the body of a {% filter %} block */
} jctx;

_Noreturn void jfail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jstep(jctx *c);

/* value helpers (jinja_value.c) */
const char *jv_type_name(int type);
bool jv_truthy(const jv *v);
bool jv_eq(const jv *a, const jv *b);
int jv_cmp(jctx *c, const jv *a, const jv *b);       /* <0, 0, >0 or a TypeError */
bool jv_contains(jctx *c, const jv *container, const jv *item);
void jv_str(jctx *c, jbuf *b, const jv *v);           /* Python str() */
void jv_repr(jctx *c, jbuf *b, const jv *v);          /* Python repr() */
jv jv_to_str(jctx *c, const jv *v);                   /* str() as a value (no copy for strings) */
void jv_format_float(double f, jbuf *b);              /* Python repr(float) */
typedef struct jjson_opts { const char *indent; bool has_indent; const char *item_sep, *key_sep;
                            bool sort_keys, ensure_ascii; } jjson_opts;
void jv_tojson(jctx *c, jbuf *b, const jv *v, const jjson_opts *o, int level);
jv jv_from_json(jctx *c, const void *json_t_ptr);

jlist *jl_new(jarena *a, size_t cap);
void jl_push(jarena *a, jlist *l, jv v);
jv jv_list(jlist *l);
jv jv_tuple(jlist *l);
jdict *jd_new(jarena *a, size_t cap);
void jd_set(jarena *a, jdict *d, jv key, jv val);     /* replaces in place, keeps insertion order */
const jv *jd_get(const jdict *d, const jv *key);
const jv *jd_get_str(const jdict *d, const char *s, size_t n);
jv jv_dict(jdict *d);

/* A list of the values iterating v yields (dict → keys, str → characters, undefined → none). */
jlist *jv_iterate(jctx *c, const jv *v);
size_t jv_length(jctx *c, const jv *v);
jv jv_getattr(jctx *c, const jv *obj, const char *name, size_t n);
jv jv_getitem(jctx *c, const jv *obj, const jv *key);
_Noreturn void jv_fail_undefined(jctx *c, const jv *u);

/* UTF-8 and Python character classes */
size_t ju_cplen(const char *s, size_t n);                        /* code points */
size_t ju_cp_offset(const char *s, size_t n, size_t cp_index);   /* byte offset of code point i */
uint32_t ju_decode(const char *s, size_t n, size_t *adv);
bool ju_py_isspace(uint32_t cp);

/* builtins (jinja_builtins.c) */
typedef struct jargs { const jv *pos; int npos; const jname *kwn; const jv *kwv; int nkw; } jargs;
jv jb_call_filter(jctx *c, const jname *name, jv input, const jargs *args);
bool jb_call_test(jctx *c, const jname *name, jv input, const jargs *args);
jv jb_percent_format(jctx *c, const jv *fmt, const jv *args);   /* Python's str % args */
bool jb_test_exists(const jname *name);
bool jb_filter_exists(const jname *name);
jv jb_global(jctx *c, const jname *name, bool *found);
jv jb_method(jctx *c, const jv *self, const char *name, size_t n, bool *found);
jv jb_call_func(jctx *c, const jfunc *fn, const jargs *args);

/* evaluator entry points used by builtins (jinja_eval.c) */
jv je_call_value(jctx *c, const jv *callee, const jargs *args);
jv je_arith(jctx *c, int op, jv a, jv b);   /* Python's binary operators (jop) */

#endif
