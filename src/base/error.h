/*
 * error.h — how failures travel inside cvllm.
 *
 * A function that can fail returns an int: 0 (CVLLM_OK) or a negative cvllm_status. The reason is a
 * one-line message kept per thread, set by cv_fail() at the place that knows most about the failure.
 * Callers that add context (a file name, a tensor name) call cv_fail_prefix(). The public API returns
 * the same codes and exposes the message as cvllm_last_error(); the CLI prints it and exits non-zero,
 * the server wraps it into vLLM's JSON error shape.
 *
 * Allocation failure of small objects is not an error path: cv_xmalloc() and friends abort with a
 * message (as Redis' zmalloc does), because a process that cannot get a few bytes cannot report
 * anything useful either. Large, size-dependent allocations (weights, KV cache) use plain malloc and
 * report CVLLM_ERR_NO_MEMORY.
 */
#ifndef CV_ERROR_H
#define CV_ERROR_H

#include <stddef.h>

#include "cvllm.h"

/* Sets this thread's message from a printf format and returns code (so `return cv_fail(...)`). */
int cv_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "<context>: " to this thread's message and returns code. */
int cv_fail_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *cv_error_message(void);
void cv_error_clear(void);

void *cv_xmalloc(size_t n);
void *cv_xcalloc(size_t count, size_t size);
void *cv_xrealloc(void *p, size_t n);
char *cv_xstrdup(const char *s);
char *cv_xstrndup(const char *s, size_t n);
/* Formats into a new heap string (cv_xmalloc'd). */
char *cv_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 64-byte aligned allocation for vectors; NULL on failure (caller reports). Free with free(). */
void *cv_aligned_alloc(size_t n);

#define CV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
