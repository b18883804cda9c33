/*
 * error.c — per-thread error messages and aborting allocators. See error.h for the convention.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CV_ERRMSG_MAX 1024

static _Thread_local char errmsg[CV_ERRMSG_MAX];

int cv_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return code;
}

int cv_fail_prefix(int code, const char *fmt, ...) {
    char old[CV_ERRMSG_MAX];
    memcpy(old, errmsg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n + 2 < sizeof errmsg) {
        memcpy(errmsg + n, ": ", 2);
        size_t room = sizeof errmsg - (size_t)n - 2;
        size_t len = strnlen(old, room - 1);
        memcpy(errmsg + n + 2, old, len);
        errmsg[(size_t)n + 2 + len] = '\0';
    }
    return code;
}

const char *cv_error_message(void) { return errmsg; }

void cv_error_clear(void) { errmsg[0] = '\0'; }

const char *cvllm_last_error(void) { return errmsg; }

void cvllm_free(void *ptr) { free(ptr); }

static void out_of_memory(size_t n) {
    fprintf(stderr, "cvllm: out of memory allocating %zu bytes\n", n);
    abort();
}

void *cv_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

void *cv_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) out_of_memory(count * size);
    return p;
}

void *cv_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) out_of_memory(n);
    return q;
}

char *cv_xstrdup(const char *s) { return cv_xstrndup(s, strlen(s)); }

char *cv_xstrndup(const char *s, size_t n) {
    char *d = cv_xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *cv_xasprintf(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = cv_xmalloc((size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

void *cv_aligned_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) / 64 * 64 : 64) != 0) return NULL;
    return p;
}
