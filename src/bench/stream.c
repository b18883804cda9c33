/*
 * stream.c — see stream.h. Each SSE event is parsed with jansson on its own; events are small, and a
 * full parse per event is what makes the parser indifferent to field order and extra fields
 * (llama.cpp adds "timings", vLLM adds "stop_reason", both may add "usage" to the last text chunk).
 * Usage may come in a chunk with or without choices; the last one seen wins.
 */
#include "bench/stream.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

void cv_request_result_init(cv_request_result *r, int32_t prompt_len) {
    memset(r, 0, sizeof *r);
    r->prompt_len = prompt_len;
    r->cap_text = 64;
    r->text = cv_xcalloc(1, r->cap_text);
}

void cv_request_result_free(cv_request_result *r) {
    free(r->itl);
    free(r->text);
    free(r->error);
    memset(r, 0, sizeof *r);
}

void cv_request_fail(cv_request_result *r, const char *fmt, ...) {
    r->success = false;
    if (r->error) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    r->error = cv_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(r->error, (size_t)n + 1, fmt, ap);
    va_end(ap);
}

static void add_itl(cv_request_result *r, double gap) {
    if (r->n_itl == r->cap_itl) {
        r->cap_itl = r->cap_itl ? 2 * r->cap_itl : 64;
        r->itl = cv_xrealloc(r->itl, r->cap_itl * sizeof *r->itl);
    }
    r->itl[r->n_itl++] = gap;
}

static void add_text(cv_request_result *r, const char *s, size_t len) {
    if (r->n_text + len + 1 > r->cap_text) {
        r->cap_text = 2 * (r->n_text + len + 1);
        r->text = cv_xrealloc(r->text, r->cap_text);
    }
    memcpy(r->text + r->n_text, s, len);
    r->n_text += len;
    r->text[r->n_text] = '\0';
}

static void record_output(cv_stream *s, const char *text, size_t len) {
    cv_request_result *r = s->r;
    if (!s->got_output) r->ttft = s->now - r->start_time;
    else add_itl(r, s->now - s->last_output);
    s->got_output = true;
    s->last_output = s->now;
    add_text(r, text, len);
}

/* A non-empty string field of obj, or NULL. */
static const char *text_field(const json_t *obj, const char *key, size_t *len) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v) || json_string_length(v) == 0) return NULL;
    *len = json_string_length(v);
    return json_string_value(v);
}

static void handle_choice(cv_stream *s, const json_t *choice) {
    size_t len = 0;
    const char *text = NULL;
    if (s->api == CV_API_COMPLETIONS) {
        text = text_field(choice, "text", &len);
    } else {
        const json_t *delta = json_object_get(choice, "delta");
        static const char *keys[] = {"content", "reasoning_content", "reasoning"};
        for (size_t k = 0; k < CV_ARRAY_LEN(keys) && !text; k++) text = text_field(delta, keys[k], &len);
    }
    if (text) record_output(s, text, len);
}

static void handle_usage(cv_stream *s, const json_t *usage) {
    const json_t *completion = json_object_get(usage, "completion_tokens");
    const json_t *prompt = json_object_get(usage, "prompt_tokens");
    if (json_is_integer(completion)) s->r->output_tokens = (int32_t)json_integer_value(completion);
    if (json_is_integer(prompt)) s->r->prompt_len = (int32_t)json_integer_value(prompt);
}

static const char *error_message(const json_t *err) {
    const json_t *msg = json_object_get(err, "message");
    if (json_is_string(msg)) return json_string_value(msg);
    return json_is_string(err) ? json_string_value(err) : "(no message)";
}

static bool on_event(void *ctx, const char *data, size_t len) {
    cv_stream *s = ctx;
    if (s->done) return true;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = true;
        return true;
    }
    json_error_t jerr;
    json_t *chunk = json_loadb(data, len, JSON_ALLOW_NUL, &jerr); /* a model may emit U+0000 */
    if (!chunk) {
        cv_request_fail(s->r, "invalid JSON in the event stream: %s: %.80s", jerr.text, data);
        return false;
    }
    const json_t *err = json_object_get(chunk, "error");
    if (err) {
        cv_request_fail(s->r, "server error in stream: %s", error_message(err));
        json_decref(chunk);
        return false;
    }
    const json_t *choices = json_object_get(chunk, "choices");
    if (json_array_size(choices) > 0) handle_choice(s, json_array_get(choices, 0));
    const json_t *usage = json_object_get(chunk, "usage");
    if (json_is_object(usage)) handle_usage(s, usage);
    json_decref(chunk);
    return true;
}

void cv_stream_init(cv_stream *s, cv_bench_api api, cv_request_result *r) {
    memset(s, 0, sizeof *s);
    s->api = api;
    s->r = r;
    cv_sse_init(&s->sse);
}

void cv_stream_feed(cv_stream *s, const char *bytes, size_t len, double now) {
    s->now = now;
    if (!cv_bench_api_pools(s->api)) {
        cv_sse_feed(&s->sse, bytes, len, on_event, s);
        return;
    }
    if (s->n_body + len + 1 > s->cap_body) {
        s->cap_body = 2 * (s->n_body + len + 1);
        s->body = cv_xrealloc(s->body, s->cap_body);
    }
    memcpy(s->body + s->n_body, bytes, len);
    s->n_body += len;
    s->last_output = now;
}

/* A pooling reply (embeddings, rerank): one JSON object whose usage counts the prompt tokens. */
static void finish_pooling(cv_stream *s) {
    cv_request_result *r = s->r;
    json_error_t jerr;
    json_t *reply = s->body ? json_loadb(s->body, s->n_body, 0, &jerr) : NULL;
    if (!json_is_object(reply)) {
        cv_request_fail(r, "invalid JSON in the reply: %.80s", s->body ? s->body : "(empty)");
    } else if (json_object_get(reply, "error")) {
        cv_request_fail(r, "server error: %s", error_message(json_object_get(reply, "error")));
    } else {
        const json_t *prompt = json_object_get(json_object_get(reply, "usage"), "prompt_tokens");
        r->prompt_len = json_is_integer(prompt) ? (int32_t)json_integer_value(prompt) : 0;
        r->success = true;
        r->ttft = r->latency = s->last_output - r->start_time;
    }
    json_decref(reply);
}

void cv_stream_finish(cv_stream *s) {
    if (cv_bench_api_pools(s->api)) {
        finish_pooling(s);
        return;
    }
    cv_sse_finish(&s->sse, on_event, s);
    cv_request_result *r = s->r;
    if (r->error) return;
    if (!s->got_output) {
        cv_request_fail(r, "Never received a valid chunk to calculate TTFT. "
                           "This response will be marked as failed!");
        return;
    }
    r->success = true;
    r->latency = s->last_output - r->start_time;
}

void cv_stream_free(cv_stream *s) {
    cv_sse_free(&s->sse);
    free(s->body);
}
