/*
 * tool_parser.c — hermes and qwen3_coder tool-call extraction, streaming and not, plus the
 * tool_choice rules (see tool_parser.h for the contract).
 *
 * One function turns the text of a single call into (name, arguments) for each format; the
 * non-streaming parser finds calls with vLLM's regular-expression rules and applies it to all of
 * them, the streaming parser applies it to each call as soon as the call's closing tag (or the end
 * of the output) arrives. Parameter conversion for qwen3_coder mirrors vLLM's
 * _convert_param_value. Known differences, all on odd input: integers beyond 64 bits stay strings,
 * and Python literals that are not JSON (single-quoted strings, tuples) are kept as strings where
 * vLLM would run ast.literal_eval.
 */
#define _GNU_SOURCE /* memmem */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "chat/jinja.h"
#include "chat/tool_parser.h"

static const char TC_OPEN[] = "<tool_call>", TC_CLOSE[] = "</tool_call>";
static const char FN_OPEN[] = "<function=", FN_CLOSE[] = "</function>";
static const char PARAM_OPEN[] = "<parameter=", PARAM_CLOSE[] = "</parameter>";

int cv_tool_parser_from_name(const char *name, cv_tool_parser_kind *out) {
    if (strcmp(name, "hermes") == 0)
        *out = CV_TOOL_PARSER_HERMES;
    else if (strcmp(name, "qwen3_coder") == 0)
        *out = CV_TOOL_PARSER_QWEN3_CODER;
    else
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "unknown tool call parser '%s' (supported: hermes, qwen3_coder)", name);
    return 0;
}

/* The first n in h[0, hn), or NULL. */
static const char *find(const char *h, size_t hn, const char *n) { return memmem(h, hn, n, strlen(n)); }

/* ---- one call ---------------------------------------------------------------------------------- */

/* hermes: the text between the tags is {"name": ..., "arguments": ...}. */
static bool parse_hermes_call(const char *body, size_t n, cv_tool_call *call) {
    json_t *obj = json_loadb(body, n, JSON_ALLOW_NUL, NULL);
    if (!json_is_object(obj) || !json_is_string(json_object_get(obj, "name")) || !json_object_get(obj, "arguments")) {
        json_decref(obj);
        return false;
    }
    call->name = cv_xstrdup(json_string_value(json_object_get(obj, "name")));
    call->arguments = jinja_json_dumps(json_object_get(obj, "arguments"), NULL);
    json_decref(obj);
    return true;
}

/* The "properties" of the named tool's parameters, NULL when unknown. */
static const json_t *param_schema(const json_t *tools, const char *name) {
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (fname && strcmp(fname, name) == 0) {
            const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
            return json_is_object(props) ? props : NULL;
        }
    }
    return NULL;
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* Python's int(): optional spaces, sign, digits with single underscores between them. */
static json_t *py_int(const char *v) {
    while (isspace((unsigned char)*v))
        v++;
    char digits[32];
    size_t k = 0;
    if (*v == '+' || *v == '-')
        digits[k++] = *v++;
    if (!isdigit((unsigned char)*v))
        return NULL;
    while (isdigit((unsigned char)*v) || (*v == '_' && isdigit((unsigned char)v[1]) && isdigit((unsigned char)v[-1]))) {
        if (*v != '_') {
            if (k + 1 >= sizeof digits)
                return NULL;
            digits[k++] = *v;
        }
        v++;
    }
    while (isspace((unsigned char)*v))
        v++;
    if (*v)
        return NULL;
    digits[k] = '\0';
    errno = 0;
    long long x = strtoll(digits, NULL, 10);
    return errno ? NULL : json_integer(x);
}

/* Python's float() followed by vLLM's "an integral float becomes an int". *overflow is set for
 * infinities, where vLLM's int() raises an error it does not catch. */
static json_t *py_number(const char *v, bool *overflow) {
    char buf[128];
    size_t k = 0;
    for (const char *p = v; *p; p++)
        if (*p != '_' && k + 1 < sizeof buf)
            buf[k++] = *p;
        else if (*p != '_')
            return NULL;
    buf[k] = '\0';
    char *s = buf, *end;
    while (isspace((unsigned char)*s))
        s++;
    if (!*s || (strpbrk(s, "xXpP") != NULL))
        return NULL;
    double f = strtod(s, &end);
    while (isspace((unsigned char)*end))
        end++;
    if (*end || end == s)
        return NULL;
    if (isinf(f)) {
        *overflow = true;
        return NULL;
    }
    if (isnan(f))
        return NULL; /* int(nan) raises ValueError: vLLM keeps the string */
    if (f == floor(f) && fabs(f) < 9.2e18)
        return json_integer((json_int_t)f);
    return json_real(f);
}

static bool has_json_literal(const json_t *v) {
    if (json_is_true(v) || json_is_false(v) || json_is_null(v))
        return true;
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v))
        json_array_foreach(v, i, x) if (has_json_literal(x)) return true;
    if (json_is_object(v))
        json_object_foreach((json_t *)v, k, x) if (has_json_literal(x)) return true;
    return false;
}

/* ast.literal_eval for the literals JSON shares with Python, plus True/False/None. */
static json_t *literal_eval(const char *v) {
    while (*v == ' ' || *v == '\t')
        v++;
    if (strcmp(v, "True") == 0)
        return json_true();
    if (strcmp(v, "False") == 0)
        return json_false();
    if (strcmp(v, "None") == 0)
        return json_null();
    json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
    if (j && has_json_literal(j)) { /* true/false/null are not Python literals */
        json_decref(j);
        return NULL;
    }
    return j;
}

static void lower_ascii(char *s) {
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

/* One parameter value converted by the declared type (vLLM's _convert_param_value). */
static json_t *convert_param(const char *value, const char *pname, const json_t *props, bool *overflow) {
    char *low = cv_xstrdup(value);
    lower_ascii(low);
    bool is_null = strcmp(low, "null") == 0;
    json_t *out = NULL;
    const json_t *spec = props ? json_object_get(props, pname) : NULL;
    if (is_null) {
        out = json_null();
    } else if (!spec) {
        out = json_string(value);
    } else {
        char type[64] = "string";
        const json_t *t = json_object_get(spec, "type");
        if (json_is_object(spec) && t) {
            if (json_is_string(t)) {
                const char *ts = json_string_value(t);
                while (isspace((unsigned char)*ts))
                    ts++;
                snprintf(type, sizeof type, "%s", ts);
                size_t tl = strlen(type);
                while (tl && isspace((unsigned char)type[tl - 1]))
                    type[--tl] = '\0';
                lower_ascii(type);
            } else {
                snprintf(type, sizeof type, "(composite)"); /* e.g. ["string", "null"]: no rule matches */
            }
        } else if (json_is_object(spec) && json_object_get(spec, "anyOf")) {
            snprintf(type, sizeof type, "object");
        }
        static const char *const STRINGS[] = {"string", "str", "text", "varchar", "char", "enum"};
        bool is_string = false;
        for (size_t i = 0; i < CV_ARRAY_LEN(STRINGS); i++)
            is_string |= strcmp(type, STRINGS[i]) == 0;
        if (is_string) {
            out = json_string(value);
        } else if (starts_with(type, "int") || starts_with(type, "uint") || starts_with(type, "long") ||
                   starts_with(type, "short") || starts_with(type, "unsigned")) {
            out = py_int(value);
        } else if (starts_with(type, "num") || starts_with(type, "float")) {
            out = py_number(value, overflow);
        } else if (strcmp(type, "boolean") == 0 || strcmp(type, "bool") == 0 || strcmp(type, "binary") == 0) {
            out = json_boolean(strcmp(low, "true") == 0);
        } else {
            if (strcmp(type, "object") == 0 || strcmp(type, "array") == 0 || strcmp(type, "arr") == 0 ||
                starts_with(type, "dict") || starts_with(type, "list"))
                out = json_loads(value, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            if (!out)
                out = literal_eval(value);
        }
        if (!out)
            out = json_string(value);
    }
    free(low);
    return out ? out : json_stringn_nocheck(value, strlen(value));
}

/* Python's `$` without MULTILINE: the end, or just before a final newline. */
static size_t dollar_pos(const char *s, size_t from, size_t n) {
    if (n > from && s[n - 1] == '\n')
        return n - 1;
    return n;
}

/* qwen3_coder: body is what follows "<function=" up to "</function>" (or the end). */
static bool parse_coder_call(const char *body, size_t n, const json_t *tools, cv_tool_call *call, bool *overflow) {
    const char *gt = memchr(body, '>', n);
    if (!gt)
        return false;
    char *name = cv_xstrndup(body, (size_t)(gt - body));
    const json_t *props = param_schema(tools, name);
    const char *p = gt + 1;
    size_t rest = n - (size_t)(p - body);
    json_t *args = json_object();
    bool ok = true;
    size_t i = 0;
    while (ok) {
        const char *open = find(p + i, rest - i, PARAM_OPEN);
        if (!open)
            break;
        size_t start = (size_t)(open - p) + strlen(PARAM_OPEN);
        /* the value ends at the first </parameter>, <parameter=, </function> or `$` */
        size_t end = dollar_pos(p, start, rest), next = end;
        const char *c1 = find(p + start, rest - start, PARAM_CLOSE), *c2 = find(p + start, rest - start, PARAM_OPEN),
                   *c3 = find(p + start, rest - start, FN_CLOSE);
        if (c1 && (size_t)(c1 - p) < end)
            end = (size_t)(c1 - p), next = end + strlen(PARAM_CLOSE);
        if (c2 && (size_t)(c2 - p) < end)
            end = next = (size_t)(c2 - p);
        if (c3 && (size_t)(c3 - p) < end)
            end = next = (size_t)(c3 - p);
        if (end < start) /* `$` before a final newline that directly follows the tag */
            end = next = start;
        const char *m = p + start;
        size_t mlen = end - start;
        const char *mgt = memchr(m, '>', mlen);
        if (!mgt) {
            ok = false;
            break;
        }
        char *pname = cv_xstrndup(m, (size_t)(mgt - m));
        const char *v = mgt + 1;
        size_t vlen = mlen - (size_t)(v - m);
        if (vlen && v[0] == '\n')
            v++, vlen--;
        if (vlen && v[vlen - 1] == '\n')
            vlen--;
        char *value = cv_xstrndup(v, vlen);
        json_t *converted = convert_param(value, pname, props, overflow);
        json_object_set_new(args, pname, converted);
        free(pname);
        free(value);
        if (*overflow)
            ok = false;
        i = next > i ? next : i + 1;
        if (next >= rest)
            break;
    }
    if (ok) {
        call->name = name;
        call->arguments = jinja_json_dumps(args, NULL);
    } else {
        free(name);
    }
    json_decref(args);
    return ok;
}

/* ---- non-streaming --------------------------------------------------------------------------------- */

typedef struct span { const char *s; size_t n; } span;
typedef struct spans { span *v; size_t n, cap; } spans;

static void spans_push(spans *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->v = cv_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = (span){s, n};
}

/* All matches of `OPEN(.*?)CLOSE|OPEN(.*?)$` (DOTALL): the bodies. */
static void find_blocks(const char *text, size_t len, const char *open, const char *close, bool dollar, spans *out) {
    size_t i = 0;
    while (i <= len) {
        const char *o = find(text + i, len - i, open);
        if (!o)
            return;
        size_t b = (size_t)(o - text) + strlen(open);
        const char *c = find(text + b, len - b, close);
        if (c) {
            spans_push(out, text + b, (size_t)(c - text) - b);
            i = (size_t)(c - text) + strlen(close);
        } else {
            size_t e = dollar ? dollar_pos(text, b, len) : len;
            spans_push(out, text + b, e > b ? e - b : 0);
            return;
        }
    }
}

static void push_call(cv_tool_result *r, size_t *cap, cv_tool_call call) {
    if (r->n_calls == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        r->calls = cv_xrealloc(r->calls, *cap * sizeof *r->calls);
    }
    r->calls[r->n_calls++] = call;
}

static void drop_calls(cv_tool_result *r) {
    for (size_t i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    r->calls = NULL;
    r->n_calls = 0;
}

void cv_tool_parse(cv_tool_parser_kind kind, const char *text, size_t len, const json_t *tools, cv_tool_result *out) {
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    bool ok = true;
    const char *content_end = NULL;
    spans calls = {0};
    if (kind == CV_TOOL_PARSER_HERMES) {
        content_end = find(text, len, TC_OPEN);
        if (content_end) {
            find_blocks(text, len, TC_OPEN, TC_CLOSE, false, &calls);
            for (size_t i = 0; i < calls.n && ok; i++) {
                cv_tool_call c;
                ok = parse_hermes_call(calls.v[i].s, calls.v[i].n, &c);
                if (ok)
                    push_call(out, &cap, c);
            }
        }
    } else if (find(text, len, FN_OPEN)) {
        spans blocks = {0};
        find_blocks(text, len, TC_OPEN, TC_CLOSE, true, &blocks);
        if (blocks.n == 0)
            spans_push(&blocks, text, len);
        for (size_t i = 0; i < blocks.n; i++)
            find_blocks(blocks.v[i].s, blocks.v[i].n, FN_OPEN, FN_CLOSE, false, &calls);
        free(blocks.v);
        bool overflow = false;
        for (size_t i = 0; i < calls.n && ok; i++) {
            cv_tool_call c;
            ok = parse_coder_call(calls.v[i].s, calls.v[i].n, tools, &c, &overflow);
            if (ok)
                push_call(out, &cap, c);
        }
        if (calls.n) {
            content_end = find(text, len, TC_OPEN);
            if (!content_end)
                content_end = find(text, len, FN_OPEN);
        }
    }
    free(calls.v);
    if (!ok || out->n_calls == 0) {
        drop_calls(out);
        content_end = NULL;
    }
    size_t clen = content_end ? (size_t)(content_end - text) : len;
    out->content = clen ? cv_xstrndup(text, clen) : NULL;
}

void cv_tool_result_free(cv_tool_result *r) {
    drop_calls(r);
    free(r->content);
    r->content = NULL;
}

/* ---- streaming --------------------------------------------------------------------------------------- */

enum { S_CONTENT, S_IN_BLOCK, S_IN_CALL, S_BETWEEN };

struct cv_tool_stream {
    cv_tool_parser_kind kind;
    json_t *tools;
    int state;
    bool in_tool_call; /* qwen3_coder: inside <tool_call> while reading functions */
    char *pending;
    size_t n_pending, cap_pending;
    size_t n_calls;
};

cv_tool_stream *cv_tool_stream_new(cv_tool_parser_kind kind, const json_t *tools) {
    cv_tool_stream *s = cv_xcalloc(1, sizeof *s);
    s->kind = kind;
    s->tools = tools ? json_incref((json_t *)tools) : NULL;
    return s;
}

void cv_tool_stream_free(cv_tool_stream *s) {
    if (!s)
        return;
    json_decref(s->tools);
    free(s->pending);
    free(s);
}

size_t cv_tool_stream_calls(const cv_tool_stream *s) { return s->n_calls; }

void cv_tool_delta_free(cv_tool_delta *d) {
    for (size_t i = 0; i < d->n_calls; i++) {
        free(d->calls[i].name);
        free(d->calls[i].arguments);
    }
    free(d->calls);
    free(d->content);
    memset(d, 0, sizeof *d);
}

typedef struct delta_builder { cv_tool_delta *d; size_t ccap, callcap; } delta_builder;

static void add_content(delta_builder *b, const char *s, size_t n) { cv_buf_append(&b->d->content, &b->d->content_len, &b->ccap, s, n); }

static void add_call(delta_builder *b, cv_tool_stream *s, cv_tool_call c) {
    if (b->d->n_calls == b->callcap) {
        b->callcap = b->callcap ? b->callcap * 2 : 2;
        b->d->calls = cv_xrealloc(b->d->calls, b->callcap * sizeof *b->d->calls);
    }
    b->d->calls[b->d->n_calls++] = c;
    s->n_calls++;
}

static void consume(cv_tool_stream *s, size_t n) {
    if (n == 0)
        return;
    memmove(s->pending, s->pending + n, s->n_pending - n);
    s->n_pending -= n;
}

/* The earliest of the markers in pending: its index in `tags` and offset, or -1. When none is
 * complete, *hold is the length of the longest tail that could still become one. */
static int earliest(const cv_tool_stream *s, const char *const *tags, int ntags, size_t *at, size_t *hold) {
    int best = -1;
    *at = s->n_pending;
    for (int t = 0; t < ntags; t++) {
        const char *hit = find(s->pending, s->n_pending, tags[t]);
        if (hit && (size_t)(hit - s->pending) < *at) {
            *at = (size_t)(hit - s->pending);
            best = t;
        }
    }
    *hold = 0;
    size_t scan_from = best >= 0 ? *at : s->n_pending;
    for (int t = 0; t < ntags; t++) {
        size_t tl = strlen(tags[t]);
        for (size_t k = tl - 1; k > 0; k--)
            if (k <= scan_from && memcmp(s->pending + scan_from - k, tags[t], k) == 0) {
                if (k > *hold)
                    *hold = k;
                break;
            }
    }
    return best;
}

/* A complete call body: either a tool call or, when malformed, content (the raw text). */
static void finish_call(cv_tool_stream *s, delta_builder *b, const char *open, const char *body, size_t n,
                        const char *close) {
    cv_tool_call c;
    bool overflow = false;
    bool ok = s->kind == CV_TOOL_PARSER_HERMES ? parse_hermes_call(body, n, &c)
                                               : parse_coder_call(body, n, s->tools, &c, &overflow);
    if (ok) {
        add_call(b, s, c);
        return;
    }
    add_content(b, open, strlen(open));
    add_content(b, body, n);
    add_content(b, close, strlen(close));
}

/* Advances the state machine as far as the pending text allows; false when it must wait. */
static bool step(cv_tool_stream *s, delta_builder *b, bool at_end) {
    bool hermes = s->kind == CV_TOOL_PARSER_HERMES;
    size_t at, hold;
    switch (s->state) {
    case S_CONTENT:
    case S_BETWEEN: {
        /* content before the first call is emitted; text between calls is dropped */
        static const char *const HERMES_TAGS[] = {TC_OPEN};
        static const char *const CODER_TAGS[] = {TC_OPEN, FN_OPEN};
        int t = hermes ? earliest(s, HERMES_TAGS, 1, &at, &hold) : earliest(s, CODER_TAGS, 2, &at, &hold);
        size_t upto = t >= 0 ? at : s->n_pending - (at_end ? 0 : hold);
        if (s->state == S_CONTENT)
            add_content(b, s->pending, upto);
        consume(s, upto);
        if (t < 0)
            return false;
        bool fn = !hermes && t == 1;
        consume(s, strlen(fn ? FN_OPEN : TC_OPEN));
        s->state = hermes || fn ? S_IN_CALL : S_IN_BLOCK;
        s->in_tool_call = !fn;
        return true;
    }
    case S_IN_BLOCK: { /* qwen3_coder, inside <tool_call>: look for functions */
        static const char *const TAGS[] = {FN_OPEN, TC_CLOSE};
        int t = earliest(s, TAGS, 2, &at, &hold);
        if (t < 0) {
            consume(s, s->n_pending - (at_end ? 0 : hold));
            return false;
        }
        consume(s, at + strlen(TAGS[t]));
        s->state = t == 0 ? S_IN_CALL : S_BETWEEN;
        return true;
    }
    case S_IN_CALL: {
        const char *close = hermes ? TC_CLOSE : FN_CLOSE;
        const char *hit = find(s->pending, s->n_pending, close);
        if (!hit && !at_end)
            return false;
        size_t n = hit ? (size_t)(hit - s->pending) : s->n_pending;
        if (!hit && !hermes && s->in_tool_call) {
            /* the function never closed: it ends where its <tool_call> does, or (as vLLM's
             * `<tool_call>(.*?)$` has it) before a final newline */
            const char *tc = find(s->pending, s->n_pending, TC_CLOSE);
            n = tc ? (size_t)(tc - s->pending) : dollar_pos(s->pending, 0, s->n_pending);
        }
        finish_call(s, b, hermes ? TC_OPEN : FN_OPEN, s->pending, n, hit ? close : "");
        consume(s, n + (hit ? strlen(close) : 0));
        s->state = !hermes && s->in_tool_call && hit ? S_IN_BLOCK : S_BETWEEN;
        return true;
    }
    }
    return false;
}

static void run(cv_tool_stream *s, cv_tool_delta *out, bool at_end) {
    memset(out, 0, sizeof *out);
    delta_builder b = {out, 0, 0};
    add_content(&b, "", 0);
    out->first_index = s->n_calls;
    while (step(s, &b, at_end))
        ;
}

void cv_tool_stream_push(cv_tool_stream *s, const char *text, size_t len, cv_tool_delta *out) {
    cv_buf_append(&s->pending, &s->n_pending, &s->cap_pending, text, len);
    run(s, out, false);
}

void cv_tool_stream_finish(cv_tool_stream *s, cv_tool_delta *out) {
    run(s, out, true);
    s->n_pending = 0;
}

/* ---- tool_choice ------------------------------------------------------------------------------------ */

static const char CORRECT_USAGE[] = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";

int cv_tool_choice_resolve(const json_t *tools, const json_t *tool_choice, bool auto_tool_choice_enabled,
                           cv_tool_choice *choice, const char **named, const char **param) {
    *named = NULL;
    *param = "tools";
    bool have_tools = tools && !json_is_null(tools);
    if (have_tools && !json_is_array(tools))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "`tools` must be an array");
    if (have_tools && json_array_size(tools) == 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.");
    size_t i;
    const json_t *tool;
    if (have_tools)
        json_array_foreach(tools, i, tool) {
            if (!json_is_string(json_object_get(json_object_get(tool, "function"), "name")))
                return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tools[%zu]: expected {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        }
    *param = "tool_choice";
    if (!tool_choice || json_is_null(tool_choice)) {
        *choice = have_tools ? CV_TOOL_CHOICE_AUTO : CV_TOOL_CHOICE_NONE;
    } else if (json_is_string(tool_choice) && strcmp(json_string_value(tool_choice), "none") == 0) {
        *choice = CV_TOOL_CHOICE_NONE;
        return 0;
    } else if (!have_tools) {
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "When using `tool_choice`, `tools` must be set.");
    } else if (json_is_string(tool_choice)) {
        const char *v = json_string_value(tool_choice);
        if (strcmp(v, "auto") == 0)
            *choice = CV_TOOL_CHOICE_AUTO;
        else if (strcmp(v, "required") == 0)
            *choice = CV_TOOL_CHOICE_REQUIRED;
        else
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "Invalid value for `tool_choice`: %s! Only named tools, \"none\", \"auto\" or \"required\" are supported.", v);
    } else if (json_is_object(tool_choice)) {
        const json_t *fn = json_object_get(tool_choice, "function");
        *param = "tool_choice.function";
        if (!json_is_object(fn)) {
            char *shown = fn ? json_dumps(fn, JSON_ENCODE_ANY | JSON_COMPACT) : cv_xstrdup("None");
            int rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Invalid value for `function`: `%s` in `tool_choice`! %s", shown, CORRECT_USAGE);
            free(shown);
            return rc;
        }
        const json_t *name = json_object_get(fn, "name");
        *param = "tool_choice.function.name";
        if (!name)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Expected field `name` in `function` in `tool_choice`! %s", CORRECT_USAGE);
        if (!json_is_string(name) || json_string_length(name) == 0) {
            char *shown = json_is_string(name) ? cv_xstrdup("") : json_dumps(name, JSON_ENCODE_ANY | JSON_COMPACT);
            int rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Invalid `name` in `function`: `%s` in `tool_choice`! %s", shown, CORRECT_USAGE);
            free(shown);
            return rc;
        }
        *param = "tool_choice";
        bool found = false;
        json_array_foreach(tools, i, tool) {
            const char *tn = json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
            found |= strcmp(tn, json_string_value(name)) == 0;
        }
        if (!found)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "The tool specified in `tool_choice` does not match any of the specified `tools`");
        *choice = CV_TOOL_CHOICE_NAMED;
        *named = json_string_value(name);
    } else {
        char *shown = json_dumps(tool_choice, JSON_ENCODE_ANY | JSON_COMPACT);
        int rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                         "Invalid value for `tool_choice`: %s! Only named tools, \"none\", \"auto\" or \"required\" are supported.", shown);
        free(shown);
        return rc;
    }
    *param = NULL; /* vLLM's chat serving refuses this one without naming a field */
    if (*choice == CV_TOOL_CHOICE_AUTO && !auto_tool_choice_enabled)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
    return 0;
}

const char *cv_tool_finish_reason(cv_tool_choice choice, size_t n_calls, const char *otherwise) {
    if (n_calls && (choice == CV_TOOL_CHOICE_AUTO || choice == CV_TOOL_CHOICE_REQUIRED))
        return "tool_calls";
    return otherwise;
}
