/*
 * api_chat_output.c — a chat choice's generated text → OpenAI message / stream deltas, through the
 * output parsers (see api_internal.h).
 *
 * The two parsers are chained the way vLLM chains them: reasoning first (text inside <think> goes
 * to `reasoning`), then the tool-call parser over what is left (the content). Non-streaming parses
 * the whole text once at the end; streaming keeps one parser state per choice and feeds it each
 * delta as it arrives. The libraries guarantee that both give the same split for any cut of the
 * text, so the streamed deltas add up to the non-streaming message.
 *
 * Tool-call ids are vLLM's "chatcmpl-tool-<32 hex>". A streamed call goes out whole in one delta
 * ({index, id, type, function{name, arguments}}), which OpenAI clients accumulate like vLLM's
 * piecewise argument deltas. parallel_tool_calls=false keeps only the first call.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "server/api_internal.h"

void cv_api_chat_choice_init(const cv_api_request *req, cv_api_choice *c) {
    if (req->kind != CV_API_CHAT || !req->stream) return;
    if (req->parse_reasoning) cv_reasoning_stream_init(&c->reasoning, req->starts_in_reasoning);
    if (req->parse_tool_calls) c->tool_stream = cv_tool_stream_new(req->tool_parser, req->tools);
}

void cv_api_chat_choice_free(const cv_api_request *req, cv_api_choice *c) {
    if (req->kind != CV_API_CHAT || !req->stream) return;
    if (req->parse_reasoning) cv_reasoning_stream_free(&c->reasoning);
    cv_tool_stream_free(c->tool_stream);
    c->tool_stream = NULL;
}

static json_t *tool_call_json(const cv_tool_call *call, long long index) {
    char id[64] = "chatcmpl-tool-";
    cv_api_random_hex(id + strlen(id), 16);
    json_t *o = index >= 0 ? json_pack("{s:I}", "index", (json_int_t)index) : json_object();
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "type", json_string("function"));
    json_object_set_new(o, "function", json_pack("{s:s, s:s}", "name", call->name, "arguments", call->arguments));
    return o;
}

const char *cv_api_chat_finish_reason(const cv_api_request *req, cvllm_finish_reason f, size_t n_calls) {
    const char *name = cvllm_finish_reason_name(f);
    if (!name || !req->parse_tool_calls || (f != CVLLM_FINISH_STOP && f != CVLLM_FINISH_LENGTH)) return name;
    return cv_tool_finish_reason(req->tool_choice, n_calls, name);
}

/* ---- streaming --------------------------------------------------------------------------------- */

typedef struct text_buf {
    char *s;
    size_t len, cap;
} text_buf;

static void buf_add(text_buf *b, const char *s, size_t n) {
    cv_buf_append(&b->s, &b->len, &b->cap, s, n);
}

static void take_reasoning(cv_reasoning_delta *d, text_buf *reasoning, text_buf *content) {
    buf_add(reasoning, d->reasoning, d->reasoning_len);
    buf_add(content, d->content, d->content_len);
    cv_reasoning_delta_free(d);
}

/* Appends the calls of one tool-parser step to `calls` (kept or dropped by parallel_tool_calls). */
static void take_tools(const cv_api_request *req, cv_api_choice *c, cv_tool_delta *d, text_buf *content,
                       json_t *calls) {
    buf_add(content, d->content, d->content_len);
    for (size_t k = 0; k < d->n_calls; k++) {
        size_t index = d->first_index + k;
        if (!req->parallel_tool_calls && index > 0) continue;
        json_array_append_new(calls, tool_call_json(&d->calls[k], (long long)index));
        c->n_tool_calls++;
    }
    cv_tool_delta_free(d);
}

json_t *cv_api_chat_stream_delta(const cv_api_request *req, cv_api_choice *c, const char *text, size_t len,
                                 bool finished) {
    text_buf reasoning = {0}, content = {0};
    if (req->parse_reasoning) {
        cv_reasoning_delta d;
        cv_reasoning_stream_push(&c->reasoning, text, len, &d);
        take_reasoning(&d, &reasoning, &content);
        if (finished) {
            cv_reasoning_stream_finish(&c->reasoning, &d);
            take_reasoning(&d, &reasoning, &content);
        }
    } else {
        buf_add(&content, text, len);
    }
    json_t *calls = json_array();
    if (c->tool_stream) {
        text_buf rest = {0};
        cv_tool_delta d;
        cv_tool_stream_push(c->tool_stream, content.s ? content.s : "", content.len, &d);
        take_tools(req, c, &d, &rest, calls);
        if (finished) {
            cv_tool_stream_finish(c->tool_stream, &d);
            take_tools(req, c, &d, &rest, calls);
        }
        free(content.s);
        content = rest;
    }
    json_t *delta = json_object();
    if (reasoning.len && req->include_reasoning)
        cv_reasoning_set_fields(delta, reasoning.s, reasoning.len, req->reasoning_content);
    if (content.len) json_object_set_new(delta, "content", json_stringn(content.s, content.len));
    if (json_array_size(calls)) json_object_set_new(delta, "tool_calls", calls);
    else json_decref(calls);
    free(reasoning.s);
    free(content.s);
    return delta;
}

/* ---- non-streaming ----------------------------------------------------------------------------- */

/* Replaces *content with the text before the first tool call and collects the calls. */
static void extract_tool_calls(const cv_api_request *req, char **content, json_t *calls) {
    cv_tool_result res;
    cv_tool_parse(req->tool_parser, *content, strlen(*content), req->tools, &res);
    if (res.n_calls) {
        free(*content);
        *content = res.content;
        res.content = NULL;
        size_t n = req->parallel_tool_calls ? res.n_calls : 1;
        for (size_t k = 0; k < n; k++) json_array_append_new(calls, tool_call_json(&res.calls[k], -1));
    }
    cv_tool_result_free(&res);
}

json_t *cv_api_chat_message(const cv_api_request *req, const cv_api_choice *c, size_t *n_calls) {
    const char *text = c->text ? c->text : "";
    char *reasoning = NULL, *content = NULL;
    if (req->parse_reasoning) cv_reasoning_extract(text, c->text_len, req->starts_in_reasoning, &reasoning, &content);
    else content = cv_xstrndup(text, c->text_len);
    json_t *calls = json_array();
    if (req->parse_tool_calls && content) extract_tool_calls(req, &content, calls);
    if (req->echo_text) {
        char *joined = cv_xasprintf("%s%s", req->echo_text, content ? content : "");
        free(content);
        content = joined;
    }
    json_t *message = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                content ? json_string(content) : json_null());
    if (reasoning && req->include_reasoning) {
        cv_reasoning_set_fields(message, reasoning, strlen(reasoning), req->reasoning_content);
    } else {
        json_object_set_new(message, "reasoning", json_null());
        if (req->reasoning_content) json_object_set_new(message, "reasoning_content", json_null());
    }
    *n_calls = json_array_size(calls);
    json_object_set_new(message, "tool_calls", calls);
    free(reasoning);
    free(content);
    return message;
}
