/*
 * api_fields.h — request fields read as vLLM's pydantic models read them, and refused as vLLM refuses
 * them (api_fields.c).
 *
 * vLLM validates a request body with pydantic v2 in its default lax mode, through FastAPI, and answers
 * a failed validation with its validation_exception_handler: status 400, type "Bad Request", `param`
 * the first error's location joined with dots ("body.max_tokens"), and a message listing every error
 * as pydantic's error dict prints:
 *
 *   1 validation error:
 *     {'type': 'int_parsing', 'loc': ('body', 'max_tokens'), 'msg': 'Input should be a valid integer,
 *      unable to parse string as an integer', 'input': 'abc'}
 *
 * The readers below take a value exactly when pydantic's lax mode does (an int field takes "5", 5.0
 * and true; a bool field takes "yes" and 0; a str field takes strings only) and report the same error
 * type, message, location and input repr when it does not.
 */
#ifndef CV_SERVER_API_FIELDS_H
#define CV_SERVER_API_FIELDS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/api.h"

/* Where a value sits in the body, innermost segment first: a field `key`, or the list index `index`
 * when key is NULL. The chain ends at the body (up == NULL above the outermost field). */
typedef struct cv_loc {
    const struct cv_loc *up;
    const char *key;
    size_t index;
} cv_loc;

/* The errors of one validation, collected as pydantic lists them (a union reports one error per
 * member it tried). Each is rendered when added, so locations may live on the caller's stack. */
typedef struct cv_pyerrors {
    char *text;
    size_t len, cap, n;
    char param[sizeof(((cv_api_error *)0)->param)];
} cv_pyerrors;

/* Adds one error of pydantic `type` with its `msg` at `at` for `input`; `ctx` is the error's ctx
 * dict as Python prints it, or NULL. */
void cv_pyerrors_add(cv_pyerrors *l, const cv_loc *at, const json_t *input, const char *type, const char *msg,
                     const char *ctx);
/* Fills *err as vLLM's validation_exception_handler answers the collected errors, releases them and
 * returns -1. */
int cv_pyerrors_fail(cv_pyerrors *l, cv_api_error *err);
/* pydantic's too_long for a list of more than `max` items. */
void cv_pyerrors_too_long(cv_pyerrors *l, const cv_loc *at, const json_t *list, size_t max);
/* pydantic's model_type: a nested model (`class_name`) given something other than an object. */
void cv_pyerrors_model_type(cv_pyerrors *l, const cv_loc *at, const json_t *input, const char *class_name);
/* A validation with the single error that cv_pyerrors_add describes; returns -1. */
int cv_api_pyfail(cv_api_error *err, const cv_loc *at, const json_t *input, const char *type, const char *msg,
                  const char *ctx);
/* An exception raised by one of vLLM's model validators, which see the raw body before any field is
 * validated: pydantic wraps it as a value_error on the whole body. For a VLLMValidationError (`cls`)
 * the text carries its parameter and value (NULL: none) and the handler names the parameter; a plain
 * ValueError, or one without a parameter, names the body. Returns -1. */
int cv_api_value_error(cv_api_error *err, const json_t *body, const char *cls, const char *param,
                       const json_t *value, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The same raised while a nested value is validated (a dataclass's __post_init__): the error sits at
 * `at`, with that value as its input. */
int cv_api_value_error_at(cv_api_error *err, const cv_loc *at, const json_t *input, const char *cls,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Readers of o[key]; `up` locates o in the body (NULL: o is the body). An absent field leaves *out
 * alone; so does null for an OPTIONAL field (`T | None` in vLLM's model), while null for any other
 * field is the type error pydantic reports. `given` (may be NULL) is set when a value was read. */
enum { CV_OPTIONAL = 1 };
int cv_get_int(const json_t *o, const cv_loc *up, const char *key, unsigned flags, int64_t *out, bool *given,
               cv_api_error *err);
/* An int that cvllm keeps in 32 bits: beyond them it is refused naming the field. */
int cv_get_int32(const json_t *o, const cv_loc *up, const char *key, unsigned flags, int32_t *out, bool *given,
                 cv_api_error *err);
int cv_get_float(const json_t *o, const cv_loc *up, const char *key, unsigned flags, float *out, cv_api_error *err);
int cv_get_bool(const json_t *o, const cv_loc *up, const char *key, unsigned flags, bool *out, cv_api_error *err);
/* A str: *out is a fresh copy (the previous one freed). */
int cv_get_str(const json_t *o, const cv_loc *up, const char *key, unsigned flags, char **out, cv_api_error *err);
/* Type checks without conversion: *out (may be NULL) is the value, or NULL when not given. */
int cv_check_str(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const json_t **out,
                 cv_api_error *err);
int cv_check_dict(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const json_t **out,
                  cv_api_error *err);
int cv_check_list(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const json_t **out,
                  cv_api_error *err);
/* A Literal[...] of strings: *index is the matching choice (untouched when not given). */
int cv_get_literal(const json_t *o, const cv_loc *up, const char *key, unsigned flags, const char *const *choices,
                   size_t n_choices, int *index, cv_api_error *err);
/* list[int]: *ids is cv_xmalloc'd (never NULL when given), each id clamped to int32 so that an id
 * beyond it reads as out of vocabulary; at most `max` ids (pydantic's too_long beyond). */
int cv_get_ids(const json_t *o, const cv_loc *up, const char *key, unsigned flags, size_t max, int32_t **ids,
               size_t *n, cv_api_error *err);
/* list[str]: *strs is a cv_xmalloc'd array of copies; at most `max` strings. */
int cv_get_strs(const json_t *o, const cv_loc *up, const char *key, unsigned flags, size_t max, char ***strs,
                size_t *n, cv_api_error *err);
/* Field(ge=lo) / Field(le=hi) on an int already read from o[key]. */
int cv_check_range(const json_t *o, const cv_loc *up, const char *key, int64_t v, int64_t lo, int64_t hi,
                   cv_api_error *err);

/* pydantic's lax conversions of one value, for values not read through the readers above (list
 * items, union members). Each returns false with pydantic's error type and message when it fails. */
typedef struct cv_pyfailure {
    const char *type, *msg;
} cv_pyfailure;
bool cv_py_int(const json_t *v, int64_t *out, bool *big, cv_pyfailure *f);
bool cv_py_float(const json_t *v, double *out, cv_pyfailure *f);
bool cv_py_bool(const json_t *v, bool *out, cv_pyfailure *f);

/* Messages of pydantic errors that callers report themselves. */
extern const char CV_PY_STRING_TYPE[], CV_PY_DICT_TYPE[], CV_PY_LIST_TYPE[], CV_PY_INT_TYPE[], CV_PY_FLOAT_TYPE[],
    CV_PY_MISSING[];

#endif
