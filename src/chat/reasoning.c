/*
 * reasoning.c — the qwen3 reasoning parser as one streaming state machine (see reasoning.h).
 *
 * The non-streaming call is the stream fed in one piece, so both modes agree by construction.
 * Bytes that might still turn into a tag are kept in `pending`; every decision is taken only when
 * the bytes that decide it have arrived (or the output ended), which is what makes the result
 * independent of how the output was cut into deltas.
 */
#define _GNU_SOURCE /* memmem */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "chat/reasoning.h"

enum { R_START_CONTENT, R_START_REASONING, R_REASONING, R_CONTENT };

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char TOOL_CALL[] = "<tool_call>", FUNCTION[] = "<function";

/* The first n in h[0, hn), or NULL. */
static const char *find(const char *h, size_t hn, const char *n) { return memmem(h, hn, n, strlen(n)); }

static const char *find_last(const char *h, size_t hn, const char *n) {
    size_t nn = strlen(n);
    for (size_t i = hn + 1; i-- > 0;)
        if (i + nn <= hn && memcmp(h + i, n, nn) == 0)
            return h + i;
    return NULL;
}

bool cv_reasoning_prompt_opens(const char *prompt, size_t len) {
    const char *open = find_last(prompt, len, THINK_OPEN), *close = find_last(prompt, len, THINK_CLOSE);
    return open && (!close || open > close);
}

/* True when s[0..n) is a proper prefix of tag (n < strlen(tag)). */
static bool is_partial(const char *s, size_t n, const char *tag) {
    return n < strlen(tag) && memcmp(s, tag, n) == 0;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

void cv_reasoning_stream_init(cv_reasoning_stream *s, bool starts_in_reasoning) {
    memset(s, 0, sizeof *s);
    s->state = starts_in_reasoning ? R_START_REASONING : R_START_CONTENT;
}

void cv_reasoning_stream_free(cv_reasoning_stream *s) {
    free(s->pending);
    s->pending = NULL;
    s->n_pending = s->cap_pending = 0;
}

void cv_reasoning_delta_free(cv_reasoning_delta *d) {
    free(d->reasoning);
    free(d->content);
    memset(d, 0, sizeof *d);
}

typedef struct outbufs { size_t rcap, ccap; } outbufs;

static void emit(cv_reasoning_delta *d, outbufs *o, bool reasoning, const char *s, size_t n) {
    if (reasoning)
        cv_buf_append(&d->reasoning, &d->reasoning_len, &o->rcap, s, n);
    else
        cv_buf_append(&d->content, &d->content_len, &o->ccap, s, n);
}

static void consume(cv_reasoning_stream *s, size_t n) {
    assert(n <= s->n_pending);
    if (n == 0)
        return;
    memmove(s->pending, s->pending + n, s->n_pending - n);
    s->n_pending -= n;
}

/* Classifies a "<tool_call>" at p[t]: 1 = an implicit end of reasoning (a function tag follows),
 * 0 = not one, -1 = undecided until more text arrives. */
static int tool_call_verdict(const char *p, size_t n, size_t t, bool at_end) {
    size_t i = t + strlen(TOOL_CALL);
    while (i < n && is_ws(p[i]))
        i++;
    size_t fl = strlen(FUNCTION);
    size_t have = n - i;
    if (have >= fl + 1) {
        char after = p[i + fl];
        return memcmp(p + i, FUNCTION, fl) == 0 && (after == '=' || is_ws(after)) ? 1 : 0;
    }
    if (memcmp(p + i, FUNCTION, have < fl ? have : fl) != 0)
        return 0;
    return at_end ? 0 : -1;
}

/* In reasoning: emits what is surely reasoning, switches state at an end tag. Returns false when
 * it must wait for more text. */
static bool step_reasoning(cv_reasoning_stream *s, cv_reasoning_delta *d, outbufs *o, bool at_end) {
    const char *p = s->pending;
    size_t n = s->n_pending;
    const char *close = find(p, n, THINK_CLOSE);
    size_t limit = close ? (size_t)(close - p) : n;
    for (const char *tc = find(p, limit, TOOL_CALL); tc; tc = find(tc + 1, limit - (size_t)(tc + 1 - p), TOOL_CALL)) {
        size_t t = (size_t)(tc - p);
        int v = tool_call_verdict(p, n, t, at_end);
        if (v == 1) { /* the tool call belongs to the content */
            emit(d, o, true, p, t);
            consume(s, t);
            s->state = R_CONTENT;
            return true;
        }
        if (v == -1) {
            emit(d, o, true, p, t);
            consume(s, t);
            return false;
        }
    }
    if (close) {
        emit(d, o, true, p, limit);
        consume(s, limit + strlen(THINK_CLOSE));
        s->state = R_CONTENT;
        return true;
    }
    size_t keep = 0;
    if (!at_end) /* the longest tail that could still become a tag */
        for (size_t k = n < 10 ? n : 10; k > 0; k--)
            if (is_partial(p + n - k, k, THINK_CLOSE) || is_partial(p + n - k, k, TOOL_CALL)) {
                keep = k;
                break;
            }
    emit(d, o, true, p, n - keep);
    consume(s, n - keep);
    return false;
}

/* At the start: skips whitespace + "<think>" if that is how the output begins. */
static bool step_start(cv_reasoning_stream *s, bool at_end) {
    size_t i = 0;
    while (i < s->n_pending && is_ws(s->pending[i]))
        i++;
    size_t rest = s->n_pending - i;
    size_t tl = strlen(THINK_OPEN);
    if (rest >= tl && memcmp(s->pending + i, THINK_OPEN, tl) == 0) {
        consume(s, i + tl);
        s->state = R_REASONING;
        s->saw_reasoning = true;
        return true;
    }
    if (!at_end && is_partial(s->pending + i, rest, THINK_OPEN))
        return false;
    if (s->state == R_START_REASONING) {
        s->state = R_REASONING;
        s->saw_reasoning = true;
    } else {
        s->state = R_CONTENT;
    }
    return true;
}

static void run(cv_reasoning_stream *s, cv_reasoning_delta *d, bool at_end) {
    outbufs o = {0, 0};
    memset(d, 0, sizeof *d);
    emit(d, &o, true, "", 0);
    emit(d, &o, false, "", 0);
    bool progress = true;
    while (progress) {
        switch (s->state) {
        case R_START_CONTENT:
        case R_START_REASONING: progress = step_start(s, at_end); break;
        case R_REASONING: progress = s->n_pending > 0 && step_reasoning(s, d, &o, at_end); break;
        default:
            emit(d, &o, false, s->pending, s->n_pending);
            consume(s, s->n_pending);
            progress = false;
        }
    }
}

void cv_reasoning_stream_push(cv_reasoning_stream *s, const char *text, size_t len, cv_reasoning_delta *out) {
    cv_buf_append(&s->pending, &s->n_pending, &s->cap_pending, text, len);
    run(s, out, false);
}

void cv_reasoning_stream_finish(cv_reasoning_stream *s, cv_reasoning_delta *out) { run(s, out, true); }

void cv_reasoning_extract(const char *text, size_t len, bool starts_in_reasoning, char **reasoning, char **content) {
    cv_reasoning_stream s;
    cv_reasoning_stream_init(&s, starts_in_reasoning);
    cv_reasoning_delta a, b;
    cv_reasoning_stream_push(&s, text, len, &a);
    cv_reasoning_stream_finish(&s, &b);
    cv_buf_append(&a.reasoning, &a.reasoning_len, &(size_t){a.reasoning_len + 1}, b.reasoning, b.reasoning_len);
    cv_buf_append(&a.content, &a.content_len, &(size_t){a.content_len + 1}, b.content, b.content_len);
    *reasoning = s.saw_reasoning ? a.reasoning : (free(a.reasoning), NULL);
    *content = a.content_len ? a.content : (free(a.content), NULL);
    cv_reasoning_delta_free(&b);
    cv_reasoning_stream_free(&s);
}

void cv_reasoning_set_fields(json_t *message, const char *reasoning, size_t len, bool legacy_name) {
    json_object_set_new(message, "reasoning", json_stringn(reasoning, len));
    if (legacy_name)
        json_object_set_new(message, "reasoning_content", json_stringn(reasoning, len));
}
