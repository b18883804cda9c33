/*
 * api_responses.c — OpenAI's Responses API (POST /v1/responses) as vLLM serves it to a model that is
 * not gpt-oss: one turn of generation over the conversation in the request, made here a translation
 * around a chat completion, as api_anthropic.c does for Anthropic's API.
 *
 * In: `instructions` becomes a system message; `input` a user message (a string) or the items'
 * messages (input_text / output_text parts as text parts; the role "developer" as "system", which
 * the Qwen3 templates render and would otherwise drop), `function_call` items the assistant's
 * tool_calls (consecutive ones in one turn), `function_call_output` items tool messages, and
 * `reasoning` items the reasoning of the assistant turn that follows. `tools` (function tools),
 * `tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`, `top_k`,
 * `text.format` (json_schema, json_object) and `include: ["message.output_text.logprobs"]` with
 * `top_logprobs` map to the chat fields; that request is read by the chat parser.
 *
 * Out: the reply is a response object — output items reasoning (reasoning_text content), message
 * (output_text with annotations and, when asked, logprobs) and function_call, status "incomplete"
 * with incomplete_details max_output_tokens when the length ran out, usage in the Responses shape —
 * with the request's settings echoed as vLLM's ResponsesResponse.from_request does. A stream's chat
 * chunks become the Responses events: response.created and .in_progress, then per item
 * output_item.added, content_part.added, the text / reasoning_text / function_call_arguments
 * deltas, their .done events and output_item.done, and response.completed with the whole
 * response; every event has its sequence_number.
 *
 * previous_response_id continues a stored conversation (response_store.h, with vLLM's
 * VLLM_ENABLE_RESPONSES_API_STORE): the server hands its messages in through cv_api_history_fn.
 * background (with the store only, as vLLM) is answered at once with the "queued" response
 * (cv_api_responses_queued), or with stream with the events, while the generation runs on for the
 * client to poll or follow. Hosted tools (web search, file search, code interpreter, MCP) are
 * refused by type.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "server/api_fields.h"
#include "server/api_internal.h"

/* A message item's content: a string, or parts whose text is kept in order. */
static int message_content(const json_t *content, const cv_loc *at, json_t **out, cv_api_error *err) {
    if (json_is_string(content)) {
        *out = json_incref((json_t *)content);
        return 0;
    }
    if (!json_is_array(content))
        return cv_api_pyfail(err, at, content, "string_type", "Input should be a valid string", NULL);
    json_t *parts = json_array();
    size_t i;
    const json_t *p;
    json_array_foreach(content, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *text = json_object_get(p, "text");
        if (type && (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text")) &&
            json_is_string(text)) {
            json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
        } else if (type && !strcmp(type, "input_image")) {
            const json_t *url = json_object_get(p, "image_url");
            json_array_append_new(parts, json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url",
                                                   json_is_string(url) ? json_string_value(url) : ""));
        } else {
            json_decref(parts);
            return cv_api_fail(err, 400, NULL, "content parts of type '%s' are not supported (input_text, output_text, "
                               "input_image)", type ? type : "(none)");
        }
    }
    *out = parts;
    return 0;
}

typedef struct builder {
    json_t *msgs;
    json_t *calls;      /* the assistant turn being built from function_call items, or NULL */
    char *reasoning;    /* a reasoning item's text for the next assistant turn */
} builder;

static void flush_calls(builder *b) {
    if (!b->calls) return;
    json_t *m = json_pack("{s:s, s:s, s:o}", "role", "assistant", "content", "", "tool_calls", b->calls);
    if (b->reasoning) json_object_set_new(m, "reasoning", json_string(b->reasoning));
    free(b->reasoning);
    b->reasoning = NULL;
    json_array_append_new(b->msgs, m);
    b->calls = NULL;
}

static int add_item(builder *b, const json_t *item, const cv_loc *at, cv_api_error *err) {
    if (!json_is_object(item))
        return cv_api_pyfail(err, at, item, "model_type", "Input should be a valid dictionary", NULL);
    const char *type = json_string_value(json_object_get(item, "type"));
    if (!type || !strcmp(type, "message")) {
        const char *role = json_string_value(json_object_get(item, "role"));
        if (!role) return cv_api_pyfail(err, &(cv_loc){at, "role", 0}, item, "missing", CV_PY_MISSING, NULL);
        json_t *content = NULL;
        if (message_content(json_object_get(item, "content"), &(cv_loc){at, "content", 0}, &content, err)) return -1;
        flush_calls(b);
        json_t *m = json_pack("{s:s, s:o}", "role", !strcmp(role, "developer") ? "system" : role, "content", content);
        if (!strcmp(role, "assistant") && b->reasoning) {
            json_object_set_new(m, "reasoning", json_string(b->reasoning));
            free(b->reasoning);
            b->reasoning = NULL;
        }
        json_array_append_new(b->msgs, m);
        return 0;
    }
    if (!strcmp(type, "function_call")) {
        const json_t *call_id = json_object_get(item, "call_id"), *name = json_object_get(item, "name"),
                     *args = json_object_get(item, "arguments");
        const char *missing = !json_is_string(call_id) ? "call_id" : !json_is_string(name) ? "name"
                              : !json_is_string(args)  ? "arguments"
                                                       : NULL;
        if (missing) return cv_api_pyfail(err, &(cv_loc){at, missing, 0}, item, "string_type", "Input should be a valid string", NULL);
        if (!b->calls) b->calls = json_array();
        json_array_append_new(b->calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function", "function",
                                                  "name", name, "arguments", args));
        return 0;
    }
    if (!strcmp(type, "function_call_output")) {
        const json_t *call_id = json_object_get(item, "call_id"), *output = json_object_get(item, "output");
        if (!json_is_string(call_id))
            return cv_api_pyfail(err, &(cv_loc){at, "call_id", 0}, item, "string_type", "Input should be a valid string", NULL);
        json_t *content = NULL;
        if (message_content(output, &(cv_loc){at, "output", 0}, &content, err)) return -1;
        flush_calls(b);
        json_array_append_new(b->msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id, "content", content));
        return 0;
    }
    if (!strcmp(type, "reasoning")) {
        size_t i;
        const json_t *c;
        flush_calls(b);
        json_array_foreach(json_object_get(item, "content"), i, c) {
            const char *text = json_string_value(json_object_get(c, "text"));
            if (!text) continue;
            char *grown = cv_xasprintf("%s%s", b->reasoning ? b->reasoning : "", text);
            free(b->reasoning);
            b->reasoning = grown;
        }
        return 0;
    }
    return cv_api_fail(err, 400, NULL, "input item of type '%s' is not supported", type);
}

static int convert_tools(const json_t *o, json_t *chat, cv_api_error *err) {
    const json_t *tools = json_object_get(o, "tools"), *choice = json_object_get(o, "tool_choice");
    if (tools && !json_is_array(tools))
        return cv_api_pyfail(err, &(cv_loc){NULL, "tools", 0}, tools, "list_type", "Input should be a valid list", NULL);
    if (json_array_size(tools)) {
        json_t *fns = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const char *type = json_string_value(json_object_get(t, "type"));
            const json_t *name = json_object_get(t, "name");
            if (!type || strcmp(type, "function") || !json_is_string(name)) {
                json_decref(fns);
                return cv_api_fail(err, 400, NULL, "tools[%zu]: only function tools (type \"function\" with a name) are "
                                   "supported, not '%s'", i, type ? type : "(none)");
            }
            json_t *fn = json_pack("{s:O}", "name", name);
            const json_t *desc = json_object_get(t, "description"), *params = json_object_get(t, "parameters");
            if (json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
            if (json_is_object(params)) json_object_set(fn, "parameters", (json_t *)params);
            json_array_append_new(fns, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
        json_object_set_new(chat, "tools", fns);
    }
    if (json_is_string(choice)) {
        json_object_set(chat, "tool_choice", (json_t *)choice);
    } else if (json_is_object(choice)) {
        const char *type = json_string_value(json_object_get(choice, "type"));
        const json_t *name = json_object_get(choice, "name");
        if (!type || strcmp(type, "function") || !json_is_string(name))
            return cv_api_fail(err, 400, NULL, "tool_choice: a function (type \"function\" with a name), \"auto\", "
                               "\"none\" or \"required\"");
        json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    }
    const json_t *parallel = json_object_get(o, "parallel_tool_calls");
    if (json_is_boolean(parallel)) json_object_set(chat, "parallel_tool_calls", (json_t *)parallel);
    return 0;
}

/* text.format as the chat response_format. */
static int convert_format(const json_t *o, json_t *chat, cv_api_error *err) {
    const json_t *format = json_object_get(json_object_get(o, "text"), "format");
    const char *type = json_string_value(json_object_get(format, "type"));
    if (!type || !strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (strcmp(type, "json_schema") || !json_is_object(json_object_get(format, "schema")))
        return cv_api_fail(err, 400, "text.format", "text.format: \"text\", \"json_object\", or \"json_schema\" with a schema");
    json_t *js = json_pack("{s:s, s:O}", "name", json_string_value(json_object_get(format, "name")) ?
                                                     json_string_value(json_object_get(format, "name")) : "response",
                           "schema", json_object_get(format, "schema"));
    if (json_is_boolean(json_object_get(format, "strict"))) json_object_set(js, "strict", json_object_get(format, "strict"));
    json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

/* previous_response_id's conversation into b->msgs, as vLLM continues one. */
static int continue_from(const json_t *o, cv_api_history_fn history, void *ctx, builder *b, cv_api_error *err) {
    const char *id = json_string_value(json_object_get(o, "previous_response_id"));
    if (!id) return 0;
    if (strncmp(id, "resp", 4))
        return cv_api_fail(err, 400, "previous_response_id", "Invalid 'previous_response_id': '%s'. Expected an ID that "
                           "begins with 'resp'.", id);
    json_t *messages = history ? history(ctx, id) : NULL;
    if (!messages)
        return cv_api_fail(err, 404, "previous_response_id", "Response with id '%s' not found.%s", id,
                           history ? "" : " (responses are stored with VLLM_ENABLE_RESPONSES_API_STORE=1)");
    json_array_extend(b->msgs, messages);
    json_decref(messages);
    return 0;
}

static int to_chat(const json_t *o, cv_api_history_fn history, void *ctx, json_t **out, cv_api_error *err) {
    const json_t *input = json_object_get(o, "input"), *instructions = json_object_get(o, "instructions");
    if (!input) return cv_api_pyfail(err, &(cv_loc){NULL, "input", 0}, o, "missing", CV_PY_MISSING, NULL);
    if (json_is_true(json_object_get(o, "background"))) {
        if (json_is_false(json_object_get(o, "store")))
            return cv_api_value_error(err, o, "ValueError", NULL, NULL, "background can only be used when `store` is true");
        if (!history)
            return cv_api_fail(err, 400, NULL, "This vLLM engine does not support `store=True` and therefore does not "
                               "support the background mode. To enable these features, set the environment variable "
                               "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.");
    }
    if (json_object_get(o, "prompt") && !json_is_null(json_object_get(o, "prompt")))
        return cv_api_value_error(err, o, "VLLMValidationError", "prompt", json_object_get(o, "prompt"),
                                  "prompt template is not supported");
    if (instructions && !json_is_null(instructions) && !json_is_string(instructions))
        return cv_api_pyfail(err, &(cv_loc){NULL, "instructions", 0}, instructions, "string_type",
                             "Input should be a valid string", NULL);
    builder b = {json_array(), NULL, NULL};
    if (json_string_length(instructions))
        json_array_append_new(b.msgs, json_pack("{s:s, s:O}", "role", "system", "content", instructions));
    int rc = continue_from(o, history, ctx, &b, err);
    if (!rc && json_is_string(input)) {
        json_array_append_new(b.msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
    } else if (!rc && json_is_array(input)) {
        size_t i;
        const json_t *item;
        json_array_foreach(input, i, item) {
            if ((rc = add_item(&b, item, &(cv_loc){&(cv_loc){NULL, "input", 0}, NULL, i}, err))) break;
        }
        if (!rc) flush_calls(&b);
        if (!rc && b.reasoning) /* reasoning last: an assistant turn of its own */
            json_array_append_new(b.msgs, json_pack("{s:s, s:s, s:s}", "role", "assistant", "content", "", "reasoning", b.reasoning));
    } else if (!rc) {
        rc = cv_api_pyfail(err, &(cv_loc){NULL, "input", 0}, input, "string_type", "Input should be a valid string", NULL);
    }
    free(b.reasoning);
    json_decref(b.calls);
    json_t *chat = json_pack("{s:o}", "messages", b.msgs);
    static const char *const same[] = {"model", "temperature", "top_p", "top_k", "user", "logit_bias", "cache_salt",
                                       "priority", "skip_special_tokens"};
    for (size_t k = 0; !rc && k < CV_ARRAY_LEN(same); k++) {
        const json_t *v = json_object_get(o, same[k]);
        if (v && !json_is_null(v)) json_object_set(chat, same[k], (json_t *)v);
    }
    const json_t *max_out = json_object_get(o, "max_output_tokens");
    if (!rc && max_out && !json_is_null(max_out)) json_object_set(chat, "max_tokens", (json_t *)max_out);
    if (!rc && json_is_true(json_object_get(o, "stream"))) {
        json_object_set_new(chat, "stream", json_true());
        json_object_set_new(chat, "stream_options", json_pack("{s:b, s:b}", "include_usage", 1, "continuous_usage_stats", 1));
    }
    const json_t *include = json_object_get(o, "include");
    size_t i;
    const json_t *inc;
    json_array_foreach(include, i, inc) {
        if (rc || !json_is_string(inc) || strcmp(json_string_value(inc), "message.output_text.logprobs")) continue;
        json_object_set_new(chat, "logprobs", json_true());
        const json_t *top = json_object_get(o, "top_logprobs");
        json_object_set_new(chat, "top_logprobs", json_is_integer(top) ? json_incref((json_t *)top) : json_integer(0));
    }
    if (!rc) rc = convert_tools(o, chat, err);
    if (!rc) rc = convert_format(o, chat, err);
    if (rc) {
        json_decref(chat);
        return -1;
    }
    *out = chat;
    return 0;
}

/* The response object but output, status and usage: the request's settings as vLLM's
 * ResponsesResponse.from_request echoes them (the sampling values are filled in later, once the
 * request's defaults are known). */
static json_t *skeleton(const json_t *o) {
    json_t *s = json_object();
    static const char *const echoed[] = {"instructions", "metadata", "max_tool_calls", "reasoning", "text", "user"};
    for (size_t k = 0; k < CV_ARRAY_LEN(echoed); k++) {
        const json_t *v = json_object_get(o, echoed[k]);
        json_object_set(s, echoed[k], v ? (json_t *)v : json_null());
    }
    const json_t *choice = json_object_get(o, "tool_choice"), *tools = json_object_get(o, "tools"),
                 *parallel = json_object_get(o, "parallel_tool_calls");
    json_object_set_new(s, "tool_choice", choice ? json_incref((json_t *)choice) : json_string("auto"));
    json_object_set_new(s, "tools", json_is_array(tools) ? json_incref((json_t *)tools) : json_array());
    json_object_set_new(s, "parallel_tool_calls", json_boolean(!json_is_false(parallel)));
    json_object_set_new(s, "background", json_boolean(json_is_true(json_object_get(o, "background"))));
    const json_t *prev = json_object_get(o, "previous_response_id");
    json_object_set_new(s, "previous_response_id", json_is_string(prev) ? json_incref((json_t *)prev) : json_null());
    json_object_set_new(s, "prompt", json_null());
    json_object_set_new(s, "service_tier", json_string("auto"));
    json_object_set_new(s, "truncation", json_string("disabled"));
    return s;
}

int cv_api_parse_responses(const char *body, size_t len, const cv_api_limits *lim, cv_api_history_fn history, void *ctx,
                           cv_api_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_CHAT;
    json_t *root = cv_api_parse_body(body, len, err), *chat = NULL;
    int rc = root ? to_chat(root, history, ctx, &chat, err) : -1;
    if (!rc) rc = cv_api_parse_chat_object(chat, lim, req, err);
    if (root) req->responses = skeleton(root);
    if (chat) req->responses_messages = json_incref(json_object_get(chat, "messages"));
    req->responses_store = !json_is_false(json_object_get(root, "store"));
    req->responses_background = json_is_true(json_object_get(root, "background"));
    json_decref(root);
    json_decref(chat);
    return rc;
}

/* ---- the response object -------------------------------------------------------------------------- */

/* "PREFIX_HEX" of a chat id's hex part ("chatcmpl-HEX", "chatcmpl-tool-HEX"). */
static char *item_id(const char *prefix, const char *chat_id) {
    const char *dash = chat_id ? strrchr(chat_id, '-') : NULL;
    return cv_xasprintf("%s_%s", prefix, dash ? dash + 1 : chat_id ? chat_id : "0");
}

static json_t *usage_of(const json_t *u) {
    const json_t *details = json_object_get(u, "prompt_tokens_details");
    const json_int_t in = json_integer_value(json_object_get(u, "prompt_tokens")),
                     out = json_integer_value(json_object_get(u, "completion_tokens"));
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:i}, s:I}", "input_tokens", in, "input_tokens_details", "cached_tokens",
                     (json_int_t)json_integer_value(json_object_get(details, "cached_tokens")), "output_tokens", out,
                     "output_tokens_details", "reasoning_tokens", 0, "total_tokens", in + out);
}

/* The whole response object: the skeleton with the request's effective sampling, `output`, status
 * and usage (NULL: null). */
static json_t *response_object(const cv_api_request *req, const char *chat_id, json_int_t created, const char *model,
                               json_t *output, const char *status, json_t *usage) {
    json_t *o = json_deep_copy(req->responses);
    char *id = item_id("resp", chat_id);
    json_object_set_new(o, "id", json_string(id));
    free(id);
    json_object_set_new(o, "created_at", json_integer(created));
    json_object_set_new(o, "incomplete_details", status && !strcmp(status, "incomplete")
                                                     ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                     : json_null());
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "output", output);
    json_object_set_new(o, "temperature", json_real(req->params.temperature));
    json_object_set_new(o, "top_p", json_real(req->params.top_p));
    json_object_set_new(o, "max_output_tokens", json_integer(req->n_prompts ? req->prompts[0].max_tokens : 0));
    json_object_set_new(o, "top_logprobs", req->top_logprobs >= 0 ? json_integer(req->top_logprobs) : json_null());
    json_object_set_new(o, "status", json_string(status));
    json_object_set_new(o, "usage", usage ? usage : json_null());
    return o;
}

static json_t *reasoning_item(const char *id, const json_t *text, const char *status) {
    return json_pack("{s:s, s:[], s:s, s:[{s:O, s:s}], s:n, s:s?}", "id", id, "summary", "type", "reasoning", "content",
                     "text", text, "type", "reasoning_text", "encrypted_content", "status", status);
}

static json_t *message_item(const char *id, const json_t *text, const json_t *logprobs, const char *status) {
    return json_pack("{s:s, s:[{s:[], s:O, s:s, s:O}], s:s, s:s, s:s}", "id", id, "content", "annotations", "text", text,
                     "type", "output_text", "logprobs", logprobs ? logprobs : json_null(), "role", "assistant", "status",
                     status, "type", "message");
}

static json_t *call_item(const char *id, const char *call_id, const json_t *name, const json_t *args, const char *status) {
    return json_pack("{s:O, s:s, s:O, s:s, s:s, s:s}", "arguments", args, "call_id", call_id, "name", name, "type",
                     "function_call", "id", id, "status", status);
}

json_t *cv_api_responses_queued(const cv_api_response *r) {
    return response_object(r->req, r->id, r->created, r->model, json_array(), "queued", NULL);
}

json_t *cv_api_responses_object(const cv_api_response *r) {
    json_t *chat = cv_api_generation_object(r);
    const char *chat_id = json_string_value(json_object_get(chat, "id"));
    const json_t *choice = json_array_get(json_object_get(chat, "choices"), 0), *msg = json_object_get(choice, "message");
    json_t *output = json_array();
    const json_t *reasoning = json_object_get(msg, "reasoning"), *content = json_object_get(msg, "content");
    if (json_string_length(reasoning)) {
        char *id = item_id("rs", chat_id);
        json_array_append_new(output, reasoning_item(id, reasoning, NULL));
        free(id);
    }
    if (json_string_length(content)) {
        char *id = item_id("msg", chat_id);
        json_array_append_new(output, message_item(id, content, json_object_get(json_object_get(choice, "logprobs"), "content"),
                                                   "completed"));
        free(id);
    }
    size_t i;
    const json_t *call;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, call) {
        const char *cid = json_string_value(json_object_get(call, "id"));
        char *id = item_id("fc", cid), *call_id = item_id("call", cid);
        const json_t *fn = json_object_get(call, "function");
        json_array_append_new(output, call_item(id, call_id, json_object_get(fn, "name"), json_object_get(fn, "arguments"),
                                                "completed"));
        free(id);
        free(call_id);
    }
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    json_t *o = response_object(r->req, chat_id, json_integer_value(json_object_get(chat, "created")),
                                json_string_value(json_object_get(chat, "model")), output,
                                finish && !strcmp(finish, "length") ? "incomplete" : "completed",
                                usage_of(json_object_get(chat, "usage")));
    json_decref(chat);
    return o;
}

/* ---- the event stream ------------------------------------------------------------------------------ */

enum { I_NONE, I_REASONING, I_MESSAGE, I_CALL };

struct cv_responses_stream {
    const cv_api_request *req;
    bool started;
    long seq;            /* the next sequence_number */
    char *chat_id, *model;
    json_int_t created;
    json_t *output;      /* the items done so far */
    int open;            /* the open item's kind */
    char *item;          /* its id */
    char *call_id;
    json_t *call_name;
    json_int_t call_index;
    char *text;          /* its text (arguments of a call) so far */
    size_t text_len, text_cap;
    json_t *logprobs;    /* a message's logprobs so far */
    char *finish;
    json_t *final;       /* response.completed's response */
    char *out;
    size_t len, cap;
};

static void emit(cv_responses_stream *st, const char *type, json_t *event) {
    json_object_set_new(event, "type", json_string(type));
    json_object_set_new(event, "sequence_number", json_integer(st->seq++));
    cv_api_sse_event(&st->out, &st->len, &st->cap, type, event);
}

static json_int_t output_index(const cv_responses_stream *st) { return (json_int_t)json_array_size(st->output); }

/* The open item's .done events; the item joins the output. */
static void close_item(cv_responses_stream *st) {
    if (st->open == I_NONE) return;
    json_t *text = json_stringn(st->text ? st->text : "", st->text_len);
    const json_int_t at = output_index(st);
    json_t *item;
    if (st->open == I_REASONING) {
        emit(st, "response.reasoning_text.done",
             json_pack("{s:s, s:I, s:i, s:O}", "item_id", st->item, "output_index", at, "content_index", 0, "text", text));
        emit(st, "response.content_part.done",
             json_pack("{s:s, s:I, s:i, s:{s:O, s:s}}", "item_id", st->item, "output_index", at, "content_index", 0, "part",
                       "text", text, "type", "reasoning_text"));
        item = reasoning_item(st->item, text, "completed");
    } else if (st->open == I_MESSAGE) {
        json_t *lp = st->logprobs ? json_incref(st->logprobs) : json_array();
        emit(st, "response.output_text.done", json_pack("{s:s, s:I, s:i, s:O, s:O}", "item_id", st->item, "output_index", at,
                                                        "content_index", 0, "text", text, "logprobs", lp));
        emit(st, "response.content_part.done",
             json_pack("{s:s, s:I, s:i, s:{s:[], s:O, s:s}}", "item_id", st->item, "output_index", at, "content_index", 0,
                       "part", "annotations", "text", text, "type", "output_text"));
        item = message_item(st->item, text, st->logprobs, "completed");
        json_decref(lp);
    } else {
        emit(st, "response.function_call_arguments.done", json_pack("{s:s, s:I, s:O, s:O}", "item_id", st->item,
                                                                    "output_index", at, "arguments", text, "name",
                                                                    st->call_name));
        item = call_item(st->item, st->call_id, st->call_name, text, "completed");
    }
    emit(st, "response.output_item.done", json_pack("{s:I, s:O}", "output_index", at, "item", item));
    json_array_append_new(st->output, item);
    json_decref(text);
    json_decref(st->logprobs);
    st->logprobs = NULL;
    free(st->item);
    free(st->call_id);
    json_decref(st->call_name);
    st->item = st->call_id = NULL;
    st->call_name = NULL;
    st->text_len = 0;
    st->open = I_NONE;
}

static void open_item(cv_responses_stream *st, int kind, const char *chat_item_id) {
    close_item(st);
    st->open = kind;
    const json_int_t at = output_index(st);
    static const char *const prefix[] = {"", "rs", "msg", "fc"};
    st->item = item_id(prefix[kind], chat_item_id);
    if (kind == I_REASONING) {
        emit(st, "response.output_item.added", json_pack("{s:I, s:{s:s, s:[], s:s, s:s}}", "output_index", at, "item", "id",
                                                         st->item, "summary", "type", "reasoning", "status", "in_progress"));
        emit(st, "response.content_part.added", json_pack("{s:s, s:I, s:i, s:{s:s, s:s}}", "item_id", st->item,
                                                          "output_index", at, "content_index", 0, "part", "type",
                                                          "reasoning_text", "text", ""));
    } else if (kind == I_MESSAGE) {
        emit(st, "response.output_item.added",
             json_pack("{s:I, s:{s:s, s:[], s:s, s:s, s:s}}", "output_index", at, "item", "id", st->item, "content", "role",
                       "assistant", "status", "in_progress", "type", "message"));
        emit(st, "response.content_part.added",
             json_pack("{s:s, s:I, s:i, s:{s:[], s:s, s:s, s:[]}}", "item_id", st->item, "output_index", at,
                       "content_index", 0, "part", "annotations", "text", "", "type", "output_text", "logprobs"));
    }
}

static void stream_response(cv_responses_stream *st, const char *type, const char *status, json_t *usage) {
    json_t *o = response_object(st->req, st->chat_id, st->created, st->model, json_deep_copy(st->output), status, usage);
    if (!strcmp(type, "response.completed")) st->final = json_incref(o);
    emit(st, type, json_pack("{s:o}", "response", o));
}

static void chunk(cv_responses_stream *st, const json_t *c) {
    const json_t *choices = json_object_get(c, "choices");
    if (!st->started) {
        st->started = true;
        st->chat_id = cv_xstrdup(json_string_value(json_object_get(c, "id")) ? json_string_value(json_object_get(c, "id")) : "");
        st->model = cv_xstrdup(json_string_value(json_object_get(c, "model")) ? json_string_value(json_object_get(c, "model")) : "");
        st->created = json_integer_value(json_object_get(c, "created"));
        stream_response(st, "response.created", "in_progress", NULL);
        stream_response(st, "response.in_progress", "in_progress", NULL);
    }
    if (json_array_size(choices) == 0) { /* the usage chunk: the end */
        close_item(st);
        stream_response(st, "response.completed", st->finish && !strcmp(st->finish, "length") ? "incomplete" : "completed",
                        usage_of(json_object_get(c, "usage")));
        return;
    }
    const json_t *choice = json_array_get(choices, 0), *d = json_object_get(choice, "delta");
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    if (finish) {
        free(st->finish);
        st->finish = cv_xstrdup(finish);
    }
    const json_t *reasoning = json_object_get(d, "reasoning"), *content = json_object_get(d, "content");
    if (json_string_length(reasoning)) {
        if (st->open != I_REASONING) open_item(st, I_REASONING, st->chat_id);
        emit(st, "response.reasoning_text.delta", json_pack("{s:s, s:I, s:i, s:O}", "item_id", st->item, "output_index",
                                                            output_index(st), "content_index", 0, "delta", reasoning));
        cv_buf_append(&st->text, &st->text_len, &st->text_cap, json_string_value(reasoning), json_string_length(reasoning));
    }
    if (json_string_length(content)) {
        if (st->open != I_MESSAGE) open_item(st, I_MESSAGE, st->chat_id);
        const json_t *lp = json_object_get(json_object_get(choice, "logprobs"), "content");
        json_t *delta_lp = json_is_array(lp) ? json_incref((json_t *)lp) : json_array();
        if (json_is_array(lp)) {
            if (!st->logprobs) st->logprobs = json_array();
            json_array_extend(st->logprobs, (json_t *)lp);
        }
        emit(st, "response.output_text.delta", json_pack("{s:s, s:I, s:i, s:O, s:o}", "item_id", st->item, "output_index",
                                                         output_index(st), "content_index", 0, "delta", content,
                                                         "logprobs", delta_lp));
        cv_buf_append(&st->text, &st->text_len, &st->text_cap, json_string_value(content), json_string_length(content));
    }
    size_t i;
    const json_t *call;
    json_array_foreach(json_object_get(d, "tool_calls"), i, call) {
        const json_t *fn = json_object_get(call, "function"), *id = json_object_get(call, "id"),
                     *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        const json_int_t index = json_integer_value(json_object_get(call, "index"));
        if (json_is_string(id) && json_is_string(name)) {
            open_item(st, I_CALL, json_string_value(id));
            st->call_id = item_id("call", json_string_value(id));
            st->call_name = json_incref((json_t *)name);
            st->call_index = index;
            emit(st, "response.output_item.added",
                 json_pack("{s:I, s:{s:s, s:s, s:O, s:s, s:s, s:s}}", "output_index", output_index(st), "item",
                           "arguments", "", "call_id", st->call_id, "name", name, "type", "function_call", "id", st->item,
                           "status", "in_progress"));
        }
        if (json_string_length(args) && st->open == I_CALL && st->call_index == index) {
            emit(st, "response.function_call_arguments.delta",
                 json_pack("{s:s, s:I, s:O}", "item_id", st->item, "output_index", output_index(st), "delta", args));
            cv_buf_append(&st->text, &st->text_len, &st->text_cap, json_string_value(args), json_string_length(args));
        }
    }
}

cv_responses_stream *cv_responses_stream_new(const cv_api_request *req) {
    cv_responses_stream *st = cv_xcalloc(1, sizeof *st);
    st->req = req;
    st->output = json_array();
    return st;
}

void cv_responses_stream_free(cv_responses_stream *st) {
    if (!st) return;
    free(st->chat_id);
    free(st->model);
    json_decref(st->output);
    free(st->item);
    free(st->call_id);
    json_decref(st->call_name);
    free(st->text);
    json_decref(st->logprobs);
    free(st->finish);
    json_decref(st->final);
    free(st->out);
    free(st);
}

const json_t *cv_responses_stream_final(const cv_responses_stream *st) { return st->final; }

static void on_record(void *user, const json_t *c) {
    cv_responses_stream *st = user;
    const json_t *e = json_object_get(c, "error");
    if (e) /* (and nothing for [DONE]: the stream ends with response.completed) */
        emit(st, "error", json_pack("{s:O, s:O, s:O}", "code", json_object_get(e, "type"), "message",
                                    json_object_get(e, "message"), "param", json_object_get(e, "param")));
    else if (c)
        chunk(st, c);
}

void cv_responses_stream_convert(cv_responses_stream *st, char **sse, size_t *len, size_t *cap) {
    cv_api_sse_translate(sse, len, cap, on_record, st, &st->out, &st->len, &st->cap);
}
