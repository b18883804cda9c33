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
 *
 * A forced tool choice replaces the tool-call parser: the content (what follows the reasoning) was
 * constrained to be the call, so it is read as such, and the message's content is "" as in vLLM.
 *   - named: the content is the arguments of the named function. Streamed as vLLM streams it: the
 *     first piece with the call's id, type and name, then argument pieces ({index, function:
 *     {arguments}}), so the pieces add up to the text.
 *   - "required": the content is a JSON array of {name, parameters}; each parameters object, as
 *     Python's json.dumps writes it, is a call's arguments. A scanner finds each element as soon as
 *     it closes, and both modes take the calls from it, so a stream sends each call whole when its
 *     element is complete and adds up to the message. (vLLM streams the raw text of the parameters
 *     in pieces, whose whitespace can differ from the non-streaming arguments; and its non-streaming
 *     reply drops every call when one element is malformed or the array is cut off by max_tokens,
 *     where cvllm keeps the complete ones.)
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "chat/jinja.h"
#include "server/api_internal.h"

/* Where the reading of a forced tool choice's output stands (see the top). */
struct cv_forced_stream {
    char *text;                 /* "required": the content so far */
    size_t len, cap;
    size_t pos;                 /* bytes of text scanned */
    int depth;                  /* JSON nesting at pos */
    bool in_string, escaped;
    bool done;                  /* the array closed, or the content is no array */
    size_t item_start;          /* where the element being read began */
    size_t n_valid;             /* elements that were calls */
};

static bool forced_choice(const cv_api_request *req) {
    return req->tool_choice == CV_TOOL_CHOICE_REQUIRED || req->tool_choice == CV_TOOL_CHOICE_NAMED;
}

void cv_api_chat_choice_init(const cv_api_request *req, cv_api_choice *c) {
    if (req->kind != CV_API_CHAT || !req->stream) return;
    if (req->parse_reasoning) cv_reasoning_stream_init(&c->reasoning, req->starts_in_reasoning);
    if (req->parse_tool_calls) c->tool_stream = cv_tool_stream_new(req->tool_parser, req->tools);
    if (forced_choice(req)) c->forced = cv_xcalloc(1, sizeof *c->forced);
}

void cv_api_chat_choice_free(const cv_api_request *req, cv_api_choice *c) {
    if (req->kind != CV_API_CHAT || !req->stream) return;
    if (req->parse_reasoning) cv_reasoning_stream_free(&c->reasoning);
    cv_tool_stream_free(c->tool_stream);
    c->tool_stream = NULL;
    if (c->forced) free(c->forced->text);
    free(c->forced);
    c->forced = NULL;
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
    if (!name || !(req->parse_tool_calls || forced_choice(req)) || (f != CVLLM_FINISH_STOP && f != CVLLM_FINISH_LENGTH))
        return name;
    return cv_tool_finish_reason(req->tool_choice, n_calls, name);
}

/* ---- forced tool choices ------------------------------------------------------------------------- */

/* One element of the "required" array, the `ordinal`-th call so far: vLLM reads it as a
 * FunctionDefinition (a string name; parameters an object or null) and dumps its parameters as the
 * arguments. False when it is no call; parallel_tool_calls=false keeps the first call only. */
static bool required_call(const cv_api_request *req, const char *s, size_t n, size_t ordinal, bool streamed,
                          json_t *calls) {
    json_t *o = json_loadb(s, n, JSON_ALLOW_NUL, NULL);
    const json_t *name = json_object_get(o, "name"), *params = json_object_get(o, "parameters");
    bool ok = json_is_string(name) && (!params || json_is_null(params) || json_is_object(params));
    if (ok && (req->parallel_tool_calls || ordinal == 0)) {
        cv_tool_call tc = {.name = (char *)json_string_value(name),
                           .arguments = json_is_object(params) ? jinja_json_dumps(params, NULL) : cv_xstrdup("null")};
        json_array_append_new(calls, tool_call_json(&tc, streamed ? (long long)ordinal : -1));
        free(tc.arguments);
    }
    json_decref(o);
    return ok;
}

/* Scans what was added to f->text since the last call; each array element that closes and is a
 * call goes to `calls`. */
static void scan_required(const cv_api_request *req, struct cv_forced_stream *f, json_t *calls, bool streamed) {
    for (; f->pos < f->len && !f->done; f->pos++) {
        char ch = f->text[f->pos];
        if (f->in_string) {
            if (f->escaped) f->escaped = false;
            else if (ch == '\\') f->escaped = true;
            else if (ch == '"') f->in_string = false;
            continue;
        }
        if (f->depth == 0) {
            /* whitespace, then the array */
            if (ch == '[') f->depth = 1;
            else f->done = ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r';
            continue;
        }
        if (ch == '"') {
            f->in_string = true;
        } else if (ch == '{' || ch == '[') {
            if (++f->depth == 2) f->item_start = f->pos;
        } else if (ch == '}' || ch == ']') {
            if (--f->depth == 1 &&
                required_call(req, f->text + f->item_start, f->pos + 1 - f->item_start, f->n_valid, streamed, calls))
                f->n_valid++;
            f->done = f->depth == 0;
        }
    }
}

/* Streaming: the tool-call deltas for `len` new bytes of content. */
static void forced_push(const cv_api_request *req, cv_api_choice *c, const char *text, size_t len, bool finished,
                        json_t *calls) {
    struct cv_forced_stream *f = c->forced;
    if (req->tool_choice == CV_TOOL_CHOICE_REQUIRED) {
        if (f->done) return; /* what follows the array is no call */
        cv_buf_append(&f->text, &f->len, &f->cap, text ? text : "", len);
        scan_required(req, f, calls, true);
        c->n_tool_calls += json_array_size(calls);
        return;
    }
    if (c->n_tool_calls == 0 && (len || finished)) {
        cv_tool_call tc = {.name = req->forced_tool, .arguments = cv_xstrndup(text ? text : "", len)};
        json_array_append_new(calls, tool_call_json(&tc, 0));
        free(tc.arguments);
        c->n_tool_calls = 1;
    } else if (len) {
        json_array_append_new(calls, json_pack("{s:i, s:{s:s%}}", "index", 0, "function", "arguments", text, len));
    }
}

/* Non-streaming: the calls of a whole content. */
static void forced_calls(const cv_api_request *req, const char *content, json_t *calls) {
    if (req->tool_choice == CV_TOOL_CHOICE_NAMED) {
        cv_tool_call tc = {.name = req->forced_tool, .arguments = (char *)(content ? content : "")};
        json_array_append_new(calls, tool_call_json(&tc, -1));
        return;
    }
    struct cv_forced_stream f = {.text = (char *)(content ? content : ""), .len = content ? strlen(content) : 0};
    scan_required(req, &f, calls, false);
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
    } else if (c->forced) {
        forced_push(req, c, content.s, content.len, finished, calls);
        content.len = 0;
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
    if (forced_choice(req)) {
        forced_calls(req, content, calls);
        free(content);
        content = cv_xstrdup("");
    }
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
