/*
 * sse.c — see sse.h. The parser works line by line: bytes are copied into the current line until a
 * line end, then the line is interpreted. A piece boundary can fall anywhere, including between
 * the CR and LF of one line end, which `after_cr` remembers.
 */
#include "bench/sse.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static void append(char **buf, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n + len + 1 > *cap) {
        *cap = (*n + len + 1) * 2;
        *buf = cv_xrealloc(*buf, *cap);
    }
    memcpy(*buf + *n, s, len);
    *n += len;
    (*buf)[*n] = '\0';
}

void cv_sse_init(cv_sse *p) { memset(p, 0, sizeof *p); }

void cv_sse_free(cv_sse *p) {
    free(p->line);
    free(p->data);
    memset(p, 0, sizeof *p);
}

static bool dispatch(cv_sse *p, cv_sse_event_fn fn, void *ctx) {
    bool go_on = true;
    if (p->has_data) {
        static const char empty[] = "";
        go_on = fn(ctx, p->data ? p->data : empty, p->n_data);
    }
    p->n_data = 0;
    p->has_data = false;
    if (!go_on) p->stopped = true;
    return go_on;
}

/* Interprets one complete line (without its line end). */
static bool process_line(cv_sse *p, const char *line, size_t len, cv_sse_event_fn fn, void *ctx) {
    if (len == 0) return dispatch(p, fn, ctx);
    if (line[0] == ':') return true;
    const char *colon = memchr(line, ':', len);
    size_t name_len = colon ? (size_t)(colon - line) : len;
    if (name_len != 4 || memcmp(line, "data", 4) != 0) return true;
    const char *value = colon ? colon + 1 : line + len;
    size_t value_len = (size_t)(line + len - value);
    if (value_len && value[0] == ' ') value++, value_len--;
    if (p->has_data) append(&p->data, &p->n_data, &p->cap_data, "\n", 1);
    append(&p->data, &p->n_data, &p->cap_data, value, value_len);
    p->has_data = true;
    return true;
}

static bool end_line(cv_sse *p, cv_sse_event_fn fn, void *ctx) {
    bool go_on = process_line(p, p->line ? p->line : "", p->n_line, fn, ctx);
    p->n_line = 0;
    return go_on;
}

bool cv_sse_feed(cv_sse *p, const char *bytes, size_t len, cv_sse_event_fn fn, void *ctx) {
    size_t i = 0;
    while (i < len && !p->stopped) {
        if (p->after_cr) {
            p->after_cr = false;
            if (bytes[i] == '\n') {
                i++;
                continue;
            }
        }
        size_t run = i;
        while (run < len && bytes[run] != '\n' && bytes[run] != '\r') run++;
        append(&p->line, &p->n_line, &p->cap_line, bytes + i, run - i);
        if (run == len) break;
        p->after_cr = bytes[run] == '\r';
        i = run + 1;
        end_line(p, fn, ctx);
    }
    return !p->stopped;
}

bool cv_sse_finish(cv_sse *p, cv_sse_event_fn fn, void *ctx) {
    if (p->stopped) return false;
    if (p->n_line && !end_line(p, fn, ctx)) return false;
    return dispatch(p, fn, ctx);
}
