/*
 * api_fields.c — pydantic's lax mode and vLLM's validation errors (see api_fields.h).
 *
 * What lax mode takes was measured against pydantic 2.13 validating Python objects, which is what
 * FastAPI hands it after json.loads:
 *   int   int; bool (true = 1); a float with an integral value inside int64; a string holding an
 *         integer: surrounding whitespace, one sign, digits with single underscores between them, and
 *         an optional '.' followed by zeros ("5.00"). Integers beyond int64 are valid Python ints;
 *         they are read saturated, so the field's own bound (its Field(ge/le), cvllm's int32 limit or
 *         the context length) refuses them.
 *   float int, float, bool, or a string Python's float() reads (underscores between digits, "inf",
 *         "nan", exponents; no hex).
 *   bool  true/false; 0 and 1 (as ints or integral floats); the strings 0/1, f/t, n/y, no/yes,
 *         false/true, off/on in any letter case, untrimmed.
 *   str   strings only: numbers are not turned into text.
 * Error messages, types and ctx dicts are pydantic's own; locations start at 'body' as FastAPI's do.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "base/utf8.h"
#include "chat/jinja.h"
#include "server/api_fields.h"

/* ------------------------------------------------------------------------------------------------ */
/* Error rendering                                                                                   */

/* The `loc` tuple ('body', 'messages', 0, 'content') as Python prints it. */
static void append_loc(char **buf, size_t *len, size_t *cap, const cv_loc *at) {
    if (!at) {
        cv_buf_append(buf, len, cap, "('body'", 7);
        return;
    }
    append_loc(buf, len, cap, at->up);
    cv_buf_append(buf, len, cap, ", ", 2);
    if (at->key) {
        json_t *k = json_string(at->key);
        char *r = k ? jinja_py_repr(k) : cv_xstrdup("'?'");
        cv_buf_append(buf, len, cap, r, strlen(r));
        free(r);
        json_decref(k);
    } else {
        char n[24];
        snprintf(n, sizeof n, "%zu", at->index);
        cv_buf_append(buf, len, cap, n, strlen(n));
    }
}

/* Union members and wrappers in a location ('str', 'list[str]', 'function-after[...]') are no field a
 * client knows; vLLM's clean_loc_for_param leaves them out of `param`. */
static bool internal_segment(const char *s) {
    static const char *const markers[] = {"str", "int", "float", "bool", "list", "dict", "none", "union", "nullable",
                                          "default", "chain", "tagged-union", "function-wrap", "function-after",
                                          "function-before", "function-plain", "json-or-python", "lax-or-strict"};
    if (strpbrk(s, "[](){}")) return true;
    for (size_t i = 0; i < CV_ARRAY_LEN(markers); i++)
        if (!strcasecmp(s, markers[i])) return true;
    return false;
}

static void append_param(char *param, size_t cap, const cv_loc *at) {
    if (!at) {
        snprintf(param, cap, "body");
        return;
    }
    append_param(param, cap, at->up);
    size_t n = strlen(param);
    if (at->key && internal_segment(at->key)) return;
    if (at->key)
        snprintf(param + n, cap - n, ".%s", at->key);
    else
        snprintf(param + n, cap - n, ".%zu", at->index);
}

static void append_repr(char **buf, size_t *len, size_t *cap, const json_t *v) {
    char *r = v ? jinja_py_repr(v) : cv_xstrdup("None");
    cv_buf_append(buf, len, cap, r, strlen(r));
    free(r);
}

static void append_str(char **buf, size_t *len, size_t *cap, const char *s) {
    json_t *j = json_string(s);
    append_repr(buf, len, cap, j ? j : json_null());
    json_decref(j);
}

/* Fills *err with `message` as vLLM's validation handler sends it. */
static int validation_failure(cv_api_error *err, const char *param, const char *message) {
    cv_api_fail(err, 400, param, "%s", message);
    err->type = "Bad Request"; /* HTTPStatus.BAD_REQUEST.phrase */
    return -1;
}

void cv_pyerrors_add(cv_pyerrors *l, const cv_loc *at, const json_t *input, const char *type, const char *msg,
                     const char *ctx) {
    if (l->n++ == 0) append_param(l->param, sizeof l->param, at);
    cv_buf_append(&l->text, &l->len, &l->cap, "\n  {'type': ", 12);
    append_str(&l->text, &l->len, &l->cap, type);
    cv_buf_append(&l->text, &l->len, &l->cap, ", 'loc': ", 9);
    append_loc(&l->text, &l->len, &l->cap, at);
    if (!at) cv_buf_append(&l->text, &l->len, &l->cap, ",", 1); /* ('body',) */
    cv_buf_append(&l->text, &l->len, &l->cap, "), 'msg': ", 10);
    append_str(&l->text, &l->len, &l->cap, msg);
    cv_buf_append(&l->text, &l->len, &l->cap, ", 'input': ", 11);
    append_repr(&l->text, &l->len, &l->cap, input);
    if (ctx) {
        cv_buf_append(&l->text, &l->len, &l->cap, ", 'ctx': ", 9);
        cv_buf_append(&l->text, &l->len, &l->cap, ctx, strlen(ctx));
    }
    cv_buf_append(&l->text, &l->len, &l->cap, "}", 1);
}

int cv_pyerrors_fail(cv_pyerrors *l, cv_api_error *err) {
    char *m = cv_xasprintf("%zu validation error%s:%.*s", l->n, l->n == 1 ? "" : "s", (int)l->len, l->text ? l->text : "");
    validation_failure(err, l->param, m);
    free(m);
    free(l->text);
    *l = (cv_pyerrors){0};
    return -1;
}

int cv_api_pyfail(cv_api_error *err, const cv_loc *at, const json_t *input, const char *type, const char *msg,
                  const char *ctx) {
    cv_pyerrors l = {0};
    cv_pyerrors_add(&l, at, input, type, msg, ctx);
    return cv_pyerrors_fail(&l, err);
}

static int value_error(cv_api_error *err, const cv_loc *at, const json_t *input, const char *cls, const char *param,
                       const json_t *value, const char *fmt, va_list ap) {
    char text[2048];
    vsnprintf(text, sizeof text, fmt, ap);
    /* VLLMValidationError.__str__ appends its parameter and value; the ctx holds the exception's repr. */
    char *msg = NULL, *ctx = NULL;
    size_t len = 0, cap = 0, clen = 0, ccap = 0;
    cv_buf_append(&msg, &len, &cap, "Value error, ", 13);
    cv_buf_append(&msg, &len, &cap, text, strlen(text));
    if (param || value) {
        cv_buf_append(&msg, &len, &cap, " (", 2);
        if (param) {
            cv_buf_append(&msg, &len, &cap, "parameter=", 10);
            cv_buf_append(&msg, &len, &cap, param, strlen(param));
        }
        if (value) {
            cv_buf_append(&msg, &len, &cap, param ? ", value=" : "value=", param ? 8 : 6);
            char *v = json_is_string(value) ? cv_xstrdup(json_string_value(value)) : jinja_py_repr(value);
            cv_buf_append(&msg, &len, &cap, v, strlen(v));
            free(v);
        }
        cv_buf_append(&msg, &len, &cap, ")", 1);
    }
    cv_buf_append(&ctx, &clen, &ccap, "{'error': ", 10);
    cv_buf_append(&ctx, &clen, &ccap, cls, strlen(cls));
    cv_buf_append(&ctx, &clen, &ccap, "(", 1);
    append_str(&ctx, &clen, &ccap, text);
    cv_buf_append(&ctx, &clen, &ccap, ")}", 2);
    /* The handler names a VLLMValidationError's parameter instead of the location when it has one. */
    cv_api_pyfail(err, at, input, "value_error", msg, ctx);
    if (param) snprintf(err->param, sizeof err->param, "%s", param);
    free(msg);
    free(ctx);
    return -1;
}

int cv_api_value_error(cv_api_error *err, const json_t *body, const char *cls, const char *param,
                       const json_t *value, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    value_error(err, NULL, body, cls, param, value, fmt, ap); /* the whole body is the input and the location */
    va_end(ap);
    return -1;
}

int cv_api_value_error_at(cv_api_error *err, const cv_loc *at, const json_t *input, const char *cls,
                          const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    value_error(err, at, input, cls, NULL, NULL, fmt, ap);
    va_end(ap);
    return -1;
}

/* ------------------------------------------------------------------------------------------------ */
/* Lax conversions                                                                                   */

const char CV_PY_STRING_TYPE[] = "Input should be a valid string", CV_PY_DICT_TYPE[] = "Input should be a valid dictionary",
           CV_PY_LIST_TYPE[] = "Input should be a valid list", CV_PY_INT_TYPE[] = "Input should be a valid integer",
           CV_PY_FLOAT_TYPE[] = "Input should be a valid number", CV_PY_MISSING[] = "Field required";

#define INT_MSG CV_PY_INT_TYPE
static const char INT_PARSING[] = "Input should be a valid integer, unable to parse string as an integer";
#define FLOAT_MSG CV_PY_FLOAT_TYPE
static const char FLOAT_PARSING[] = "Input should be a valid number, unable to parse string as a number";
static const char BOOL_MSG[] = "Input should be a valid boolean";
static const char BOOL_PARSING[] = "Input should be a valid boolean, unable to interpret input";

static const char *skip_space(const char *s, const char *end) {
    while (s < end && isspace((unsigned char)*s)) s++;
    return s;
}

static const char *trim_space(const char *s, const char *end) {
    while (end > s && isspace((unsigned char)end[-1])) end--;
    return end;
}

/* Copies the digits of [s, end) into out (cap bytes) without their separating underscores; false
 * when an underscore does not sit between two digits or a character is not a digit. */
static bool digits_without_underscores(const char *s, const char *end, char *out, size_t cap, size_t *n) {
    *n = 0;
    if (s == end) return false;
    for (const char *p = s; p < end; p++) {
        if (*p == '_') {
            if (p == s || p + 1 == end || !isdigit((unsigned char)p[-1]) || !isdigit((unsigned char)p[1])) return false;
            continue;
        }
        if (!isdigit((unsigned char)*p)) return false;
        if (*n + 1 < cap) out[(*n)++] = *p;
    }
    out[*n] = '\0';
    return true;
}

/* 1: an int within int64; 0: a valid int beyond it (saturated); -1: not an int. */
static int parse_int_string(const char *s, size_t len, int64_t *out) {
    const char *end = trim_space(s, s + len);
    s = skip_space(s, end);
    bool neg = s < end && *s == '-';
    if (s < end && (*s == '-' || *s == '+')) s++;
    const char *dot = memchr(s, '.', (size_t)(end - s));
    if (dot) {
        if (dot + 1 == end) return -1;
        for (const char *p = dot + 1; p < end; p++)
            if (*p != '0') return -1;
        end = dot;
    }
    char digits[32];
    size_t n;
    if (!digits_without_underscores(s, end, digits, sizeof digits, &n)) return -1;
    const char *d = digits;
    while (*d == '0' && d[1]) d++;
    uint64_t mag = 0;
    bool big = strlen(d) > 19 || (size_t)(end - s) >= sizeof digits;
    for (; !big && *d; d++) {
        uint64_t next = mag * 10 + (uint64_t)(*d - '0');
        big = next / 10 != mag;
        mag = next;
    }
    if (big || mag > (uint64_t)INT64_MAX + neg) {
        *out = neg ? INT64_MIN : INT64_MAX;
        return 0;
    }
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return 1;
}

bool cv_py_int(const json_t *v, int64_t *out, bool *big, cv_pyfailure *f) {
    *big = false;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!isfinite(d)) {
            *f = (cv_pyfailure){"finite_number", "Input should be a finite number"};
            return false;
        }
        if (d != floor(d)) {
            *f = (cv_pyfailure){"int_from_float", "Input should be a valid integer, got a number with a fractional part"};
            return false;
        }
        if (fabs(d) >= 9223372036854775808.0) {
            *f = (cv_pyfailure){"int_parsing_size", "Unable to parse input string as an integer, exceeded maximum size"};
            return false;
        }
        *out = (int64_t)d;
        return true;
    }
    if (json_is_string(v)) {
        int rc = parse_int_string(json_string_value(v), json_string_length(v), out);
        if (rc >= 0) {
            *big = rc == 0;
            return true;
        }
        *f = (cv_pyfailure){"int_parsing", INT_PARSING};
        return false;
    }
    *f = (cv_pyfailure){"int_type", INT_MSG};
    return false;
}

/* Python's float() of a string. */
static bool parse_float_string(const char *s, size_t len, double *out) {
    const char *end = trim_space(s, s + len);
    s = skip_space(s, end);
    char buf[128];
    size_t n = 0;
    const char *p = s;
    if (p < end && (*p == '-' || *p == '+')) buf[n++] = *p++;
    size_t rest = (size_t)(end - p);
    if ((rest == 3 && (!strncasecmp(p, "inf", 3) || !strncasecmp(p, "nan", 3))) ||
        (rest == 8 && !strncasecmp(p, "infinity", 8))) {
        bool nan = tolower((unsigned char)*p) == 'n';
        *out = nan ? NAN : (buf[0] == '-' ? -INFINITY : INFINITY);
        return true;
    }
    /* digits [. digits] [e [sign] digits], underscores only between digits */
    bool any_digit = false;
    for (; p < end && n + 2 < sizeof buf; p++) {
        char c = *p;
        if (c == '_') {
            if (p == s || p + 1 == end || !isdigit((unsigned char)p[-1]) || !isdigit((unsigned char)p[1])) return false;
            continue;
        }
        if (isdigit((unsigned char)c)) {
            any_digit = true;
        } else if (c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') {
            return false;
        }
        buf[n++] = c;
    }
    if (p != end || !any_digit) return false;
    buf[n] = '\0';
    char *stop;
    *out = strtod(buf, &stop);
    return *stop == '\0';
}

bool cv_py_float(const json_t *v, double *out, cv_pyfailure *f) {
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return true;
    }
    if (json_is_string(v)) {
        if (parse_float_string(json_string_value(v), json_string_length(v), out)) return true;
        *f = (cv_pyfailure){"float_parsing", FLOAT_PARSING};
        return false;
    }
    *f = (cv_pyfailure){"float_type", FLOAT_MSG};
    return false;
}

bool cv_py_bool(const json_t *v, bool *out, cv_pyfailure *f) {
    static const char *const words[] = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"};
    *f = (cv_pyfailure){"bool_parsing", BOOL_PARSING};
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return true;
    }
    double d = 0;
    if (json_is_integer(v)) d = (double)json_integer_value(v);
    if (json_is_real(v)) {
        d = json_real_value(v);
        if (!isfinite(d) || d != floor(d) || fabs(d) >= 9223372036854775808.0) {
            *f = (cv_pyfailure){"bool_type", BOOL_MSG};
            return false;
        }
    }
    if (json_is_number(v)) {
        *out = d == 1;
        return d == 0 || d == 1;
    }
    if (json_is_string(v)) {
        for (size_t i = 0; i < CV_ARRAY_LEN(words); i++)
            if (!strcasecmp(json_string_value(v), words[i]) && strlen(words[i]) == json_string_length(v)) {
                *out = i >= CV_ARRAY_LEN(words) / 2;
                return true;
            }
        return false;
    }
    *f = (cv_pyfailure){"bool_type", BOOL_MSG};
    return false;
}

/* ------------------------------------------------------------------------------------------------ */
/* Field readers                                                                                     */

/* o[key] when a value is to be read: NULL when absent, or null in an OPTIONAL field. *null_error
 * is set for null in a required-typed field (the caller reports its type error on None). */
static const json_t *field_value(const json_t *o, const char *key, unsigned flags, bool *null_error) {
    const json_t *v = json_object_get(o, key);
    *null_error = v && json_is_null(v) && !(flags & CV_OPTIONAL);
    return v && !json_is_null(v) ? v : NULL;
}

int cv_get_int(const json_t *o, const cv_loc *up, const char *key, unsigned flags, int64_t *out, bool *given,
               cv_api_error *err) {
    cv_loc at = {up, key, 0};
    bool null_error;
    const json_t *v = field_value(o, key, flags, &null_error);
    if (null_error) return cv_api_pyfail(err, &at, json_null(), "int_type", INT_MSG, NULL);
    if (!v) return 0;
    int64_t x;
    bool big;
    cv_pyfailure f;
    /* An integer string beyond int64 stays saturated: the field's range check refuses it. */
    if (!cv_py_int(v, &x, &big, &f)) return cv_api_pyfail(err, &at, v, f.type, f.msg, NULL);
    *out = x;
    if (given) *given = true;
    return 0;
}

int cv_get_int32(const json_t *o, const cv_loc *up, const char *key, unsigned flags, int32_t *out, bool *given,
                 cv_api_error *err) {
    int64_t v = *out;
    bool got = false;
    if (cv_get_int(o, up, key, flags, &v, &got, err)) return -1;
    if (!got) return 0;
    if (v < INT32_MIN || v > INT32_MAX) return cv_api_fail(err, 400, key, "'%s' is out of range: %lld", key, (long long)v);
    *out = (int32_t)v;
    if (given) *given = true;
    return 0;
}

int cv_check_range(const json_t *o, const cv_loc *up, const char *key, int64_t v, int64_t lo, int64_t hi,
                   cv_api_error *err) {
    cv_loc at = {up, key, 0};
    const json_t *input = json_object_get(o, key);
    char msg[96], ctx[64];
    /* An integer string beyond int64 was read saturated; it lies past the bound it saturated to. */
    int64_t x;
    bool big = false;
    cv_pyfailure f;
    cv_py_int(input, &x, &big, &f);
    if (v < lo || (big && v == INT64_MIN)) {
        snprintf(msg, sizeof msg, "Input should be greater than or equal to %lld", (long long)lo);
        snprintf(ctx, sizeof ctx, "{'ge': %lld}", (long long)lo);
        return cv_api_pyfail(err, &at, input, "greater_than_equal", msg, ctx);
    }
    if (v > hi || (big && v == INT64_MAX)) {
        snprintf(msg, sizeof msg, "Input should be less than or equal to %lld", (long long)hi);
        snprintf(ctx, sizeof ctx, "{'le': %lld}", (long long)hi);
        return cv_api_pyfail(err, &at, input, "less_than_equal", msg, ctx);
    }
    return 0;
}

int cv_get_float(const json_t *o, const cv_loc *up, const char *key, unsigned flags, float *out, cv_api_error *err) {
    cv_loc at = {up, key, 0};
    bool null_error;
    const json_t *v = field_value(o, key, flags, &null_error);
    if (null_error) return cv_api_pyfail(err, &at, json_null(), "float_type", FLOAT_MSG, NULL);
    if (!v) return 0;
    double d;
    cv_pyfailure f;
    if (!cv_py_float(v, &d, &f)) return cv_api_pyfail(err, &at, v, f.type, f.msg, NULL);
    *out = (float)d;
    return 0;
}

int cv_get_bool(const json_t *o, const cv_loc *up, const char *key, unsigned flags, bool *out, cv_api_error *err) {
    cv_loc at = {up, key, 0};
    bool null_error;
    const json_t *v = field_value(o, key, flags, &null_error);
    if (null_error) return cv_api_pyfail(err, &at, json_null(), "bool_type", BOOL_MSG, NULL);
    if (!v) return 0;
    cv_pyfailure f;
    if (!cv_py_bool(v, out, &f)) return cv_api_pyfail(err, &at, v, f.type, f.msg, NULL);
    return 0;
}

/* A type check of o[key] by `is`, reporting (type, msg) on failure. */
static int check_kind(const json_t *o, const cv_loc *up, const char *key, unsigned flags, int (*is)(const json_t *),
                      const char *type, const char *msg, const json_t **out, cv_api_error *err) {
    cv_loc at = {up, key, 0};
    bool null_error;
    const json_t *v = field_value(o, key, flags, &null_error);
    if (out) *out = NULL;
    if (null_error) return cv_api_pyfail(err, &at, json_null(), type, msg, NULL);
    if (!v) return 0;
    if (!is(v)) return cv_api_pyfail(err, &at, v, type, msg, NULL);
    if (out) *out = v;
    return 0;
}

static int is_str(const json_t *v) { return json_is_string(v); }
static int is_dict(const json_t *v) { return json_is_object(v); }
static int is_list(const json_t *v) { return json_is_array(v); }

int cv_check_str(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const json_t **out,
                 cv_api_error *err) {
    return check_kind(o, up, key, flags, is_str, "string_type", CV_PY_STRING_TYPE, out, err);
}

int cv_check_dict(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const json_t **out,
                  cv_api_error *err) {
    return check_kind(o, up, key, flags, is_dict, "dict_type", CV_PY_DICT_TYPE, out, err);
}

int cv_check_list(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const json_t **out,
                  cv_api_error *err) {
    return check_kind(o, up, key, flags, is_list, "list_type", CV_PY_LIST_TYPE, out, err);
}

int cv_get_str(const json_t *o, const cv_loc *up, const char *key, unsigned flags, char **out, cv_api_error *err) {
    const json_t *v;
    if (cv_check_str(o, up, key, flags, &v, err)) return -1;
    if (!v) return 0;
    free(*out);
    *out = cv_xstrndup(json_string_value(v), json_string_length(v));
    return 0;
}

int cv_get_literal(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const char *const *choices,
                   size_t n_choices, int *index, cv_api_error *err) {
    cv_loc at = {up, key, 0};
    bool null_error;
    const json_t *v = field_value(o, key, flags, &null_error);
    if (!v && !null_error) return 0;
    for (size_t i = 0; v && json_is_string(v) && i < n_choices; i++)
        if (!strcmp(json_string_value(v), choices[i]) && strlen(choices[i]) == json_string_length(v)) {
            *index = (int)i;
            return 0;
        }
    /* "'a', 'b' or 'c'" */
    char *expected = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; i < n_choices; i++) {
        if (i) cv_buf_append(&expected, &len, &cap, i + 1 == n_choices ? " or " : ", ", i + 1 == n_choices ? 4 : 2);
        append_str(&expected, &len, &cap, choices[i]);
    }
    char *msg = cv_xasprintf("Input should be %s", expected);
    char *ctx = NULL;
    size_t clen = 0, ccap = 0;
    cv_buf_append(&ctx, &clen, &ccap, "{'expected': ", 13);
    append_str(&ctx, &clen, &ccap, expected);
    cv_buf_append(&ctx, &clen, &ccap, "}", 1);
    int rc = cv_api_pyfail(err, &at, v ? v : json_null(), "literal_error", msg, ctx);
    free(expected);
    free(msg);
    free(ctx);
    return rc;
}

void cv_pyerrors_too_long(cv_pyerrors *l, const cv_loc *at, const json_t *list, size_t max) {
    size_t n = json_array_size(list);
    char msg[128], ctx[128];
    snprintf(msg, sizeof msg, "List should have at most %zu item%s after validation, not %zu", max, max == 1 ? "" : "s", n);
    snprintf(ctx, sizeof ctx, "{'field_type': 'List', 'max_length': %zu, 'actual_length': %zu}", max, n);
    cv_pyerrors_add(l, at, list, "too_long", msg, ctx);
}

static int too_long(cv_api_error *err, const cv_loc *at, const json_t *list, size_t max) {
    cv_pyerrors l = {0};
    cv_pyerrors_too_long(&l, at, list, max);
    return cv_pyerrors_fail(&l, err);
}

void cv_pyerrors_model_type(cv_pyerrors *l, const cv_loc *at, const json_t *input, const char *class_name) {
    char *msg = cv_xasprintf("Input should be a valid dictionary or instance of %s", class_name);
    char *ctx = cv_xasprintf("{'class_name': '%s'}", class_name);
    cv_pyerrors_add(l, at, input, "model_type", msg, ctx);
    free(msg);
    free(ctx);
}

int cv_get_ids(const json_t *o, const cv_loc *up, const char *key, unsigned flags, size_t max, int32_t **ids,
               size_t *n, cv_api_error *err) {
    const json_t *a;
    if (cv_check_list(o, up, key, flags, &a, err)) return -1;
    if (!a) return 0;
    cv_loc at = {up, key, 0};
    size_t count = json_array_size(a);
    if (count > max) return too_long(err, &at, a, max);
    int32_t *out = cv_xmalloc((count ? count : 1) * sizeof *out);
    for (size_t i = 0; i < count; i++) {
        const json_t *item = json_array_get(a, i);
        cv_loc item_at = {&at, NULL, i};
        int64_t v;
        bool big;
        cv_pyfailure f;
        if (!cv_py_int(item, &v, &big, &f)) {
            free(out);
            return cv_api_pyfail(err, &item_at, item, f.type, f.msg, NULL);
        }
        /* Ids beyond int32 are reported like any other id outside the vocabulary. */
        out[i] = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
    }
    free(*ids);
    *ids = out;
    *n = count;
    return 0;
}

int cv_get_strs(const json_t *o, const cv_loc *up, const char *key, unsigned flags, size_t max, char ***strs,
                size_t *n, cv_api_error *err) {
    const json_t *a;
    if (cv_check_list(o, up, key, flags, &a, err)) return -1;
    if (!a) return 0;
    cv_loc at = {up, key, 0};
    size_t count = json_array_size(a);
    if (count > max) return too_long(err, &at, a, max);
    for (size_t i = 0; i < count; i++) {
        cv_loc item_at = {&at, NULL, i};
        const json_t *item = json_array_get(a, i);
        if (!json_is_string(item)) return cv_api_pyfail(err, &item_at, item, "string_type", CV_PY_STRING_TYPE, NULL);
    }
    char **out = cv_xcalloc(count ? count : 1, sizeof *out);
    for (size_t i = 0; i < count; i++) {
        const json_t *item = json_array_get(a, i);
        out[i] = cv_xstrndup(json_string_value(item), json_string_length(item));
    }
    *strs = out;
    *n = count;
    return 0;
}
