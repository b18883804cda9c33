/*
 * api_anthropic.c — vLLM's Anthropic Messages API (POST /v1/messages and /v1/messages/count_tokens)
 * as vLLM serves it (vllm/entrypoints/anthropic): a translation around a chat completion.
 *
 * In: the Messages request becomes a chat completion request — `system` a system message; content
 * blocks text parts (one text block: the content string); `thinking` blocks the assistant's
 * reasoning; `tool_use` blocks tool_calls (arguments as Python's json.dumps writes them, which is
 * what the chat template then prints); `tool_result` blocks tool messages ahead of the rest of the
 * user turn; `tools` functions; `tool_choice` auto / any (required) / tool (named) / none;
 * `stop_sequences` stop; a stream asks for usage on every chunk. That request is read by the chat
 * parser, so every chat check applies.
 *
 * Out: the chat reply becomes a message — a thinking block (with a random signature, as vLLM signs
 * it), a text block, tool_use blocks with the arguments parsed — and finish reasons map stop →
 * end_turn, length → max_tokens, tool_calls → tool_use. A stream's chat chunks become the event
 * stream: message_start (with the prompt's tokens), a content block per kind of output as it
 * changes (content_block_start, deltas, content_block_stop; a thinking block ends with its
 * signature_delta), message_delta with the stop reason and usage from the usage chunk, then
 * message_stop and vLLM's closing "data: [DONE]".
 *
 * Where cvllm goes beyond vLLM's translation (said in the README): a stop sequence that ended the
 * output gives stop_reason "stop_sequence" and stop_sequence (Anthropic's meaning; vLLM says
 * end_turn); `thinking` {"type": "enabled" | "disabled"} sets the chat template's enable_thinking
 * (Qwen3's switch); a tool_result's content given as blocks is their text joined (vLLM prints the
 * Python list); tool argument deltas are matched to their tool_use block by the call's index.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "server/api_fields.h"
#include "server/api_internal.h"

static const char *const ROLES[] = {"user", "assistant"};
static const char *const BLOCK_TYPES[] = {"text", "image", "tool_use", "tool_result", "thinking"};
enum { B_TEXT, B_IMAGE, B_TOOL_USE, B_TOOL_RESULT, B_THINKING };
static const char *const TOOL_CHOICES[] = {"auto", "any", "tool", "none"};
enum { TC_AUTO, TC_ANY, TC_TOOL, TC_NONE };

/* A tool's input as Python's json.dumps prints it (", " and ": ", non-ASCII escaped). */
static json_t *dumps_input(const json_t *input) {
    char *s = json_dumps(input, JSON_ENSURE_ASCII | JSON_ENCODE_ANY);
    json_t *v = json_string(s ? s : "{}");
    free(s);
    return v;
}

/* The text of a block list (system, a tool_result's content): its text blocks joined. */
static int blocks_text(const json_t *blocks, const cv_loc *at, char **out, cv_api_error *err) {
    size_t i;
    const json_t *b;
    char *text = cv_xstrdup("");
    json_array_foreach(blocks, i, b) {
        cv_loc item = {at, NULL, i};
        const json_t *t = NULL;
        int kind = B_TEXT;
        if (!json_is_object(b)) {
            free(text);
            return cv_api_pyfail(err, &item, b, "model_type", "Input should be a valid dictionary or instance of "
                                 "AnthropicContentBlock", NULL);
        }
        if (cv_get_literal(b, &item, "type", 0, BLOCK_TYPES, CV_ARRAY_LEN(BLOCK_TYPES), &kind, err) ||
            cv_check_str(b, &item, "text", CV_OPTIONAL, &t, err)) {
            free(text);
            return -1;
        }
        if (kind != B_TEXT || !t) continue;
        char *grown = cv_xasprintf("%s%s", text, json_string_value(t));
        free(text);
        text = grown;
    }
    *out = text;
    return 0;
}

/* One content block of a message into the chat message being built. */
typedef struct turn {
    json_t *parts;       /* text and image_url parts */
    json_t *tool_calls;
    char *reasoning;
    json_t *tool_msgs;   /* tool messages, which go before the turn */
} turn;

static int add_block(const json_t *b, const cv_loc *at, bool user, turn *t, cv_api_error *err) {
    int kind = 0;
    if (!json_is_object(b))
        return cv_api_pyfail(err, at, b, "model_type", "Input should be a valid dictionary or instance of "
                             "AnthropicContentBlock", NULL);
    const json_t *text = NULL, *id = NULL, *tool_use_id = NULL, *name = NULL, *input = NULL, *thinking = NULL, *source = NULL;
    if (cv_get_literal(b, at, "type", 0, BLOCK_TYPES, CV_ARRAY_LEN(BLOCK_TYPES), &kind, err) ||
        cv_check_str(b, at, "text", CV_OPTIONAL, &text, err) || cv_check_str(b, at, "id", CV_OPTIONAL, &id, err) ||
        cv_check_str(b, at, "tool_use_id", CV_OPTIONAL, &tool_use_id, err) ||
        cv_check_str(b, at, "name", CV_OPTIONAL, &name, err) || cv_check_dict(b, at, "input", CV_OPTIONAL, &input, err) ||
        cv_check_str(b, at, "thinking", CV_OPTIONAL, &thinking, err) ||
        cv_check_dict(b, at, "source", CV_OPTIONAL, &source, err))
        return -1;
    if (!json_object_get(b, "type")) return cv_api_pyfail(err, &(cv_loc){at, "type", 0}, b, "missing", CV_PY_MISSING, NULL);
    switch (kind) {
    case B_TEXT:
        if (text && json_string_length(text))
            json_array_append_new(t->parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
        return 0;
    case B_IMAGE: {
        if (!source) return 0;
        const char *data = json_string_value(json_object_get(source, "data")),
                   *media = json_string_value(json_object_get(source, "media_type")),
                   *url = json_string_value(json_object_get(source, "url"));
        char *u = url ? cv_xstrdup(url) : cv_xasprintf("data:%s;base64,%s", media ? media : "image/png", data ? data : "");
        json_array_append_new(t->parts, json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url", u));
        free(u);
        return 0;
    }
    case B_THINKING:
        if (thinking) {
            char *grown = cv_xasprintf("%s%s", t->reasoning ? t->reasoning : "", json_string_value(thinking));
            free(t->reasoning);
            t->reasoning = grown;
        }
        return 0;
    case B_TOOL_USE: {
        json_t *empty = json_object();
        json_t *call = json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id ? json_string_value(id) : "call_0", "type", "function",
                                 "function", "name", name ? json_string_value(name) : "", "arguments",
                                 dumps_input(input ? input : empty));
        json_decref(empty);
        json_array_append_new(t->tool_calls, call);
        return 0;
    }
    default: { /* B_TOOL_RESULT */
        const json_t *content = json_object_get(b, "content");
        cv_loc content_at = {at, "content", 0};
        char *result = NULL;
        if (json_is_array(content)) {
            if (blocks_text(content, &content_at, &result, err)) return -1;
        } else if (json_is_string(content)) {
            result = cv_xstrdup(json_string_value(content));
        } else if (content && !json_is_null(content)) {
            return cv_api_pyfail(err, &content_at, content, "string_type", "Input should be a valid string", NULL);
        } else {
            result = cv_xstrdup("");
        }
        const json_t *call_id = tool_use_id ? tool_use_id : id;
        if (user) {
            json_array_append_new(t->tool_msgs, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                                                          call_id ? json_string_value(call_id) : "", "content", result));
        } else {
            char *line = cv_xasprintf("Tool result: %s", result);
            json_array_append_new(t->parts, json_pack("{s:s, s:s}", "type", "text", "text", line));
            free(line);
        }
        free(result);
        return 0;
    }
    }
}

/* messages[i] into chat messages appended to `out`. */
static int add_message(const json_t *m, const cv_loc *at, json_t *out, cv_api_error *err) {
    int role = 0;
    if (!json_is_object(m))
        return cv_api_pyfail(err, at, m, "model_type", "Input should be a valid dictionary or instance of "
                             "AnthropicMessage", NULL);
    if (!json_object_get(m, "role")) return cv_api_pyfail(err, &(cv_loc){at, "role", 0}, m, "missing", CV_PY_MISSING, NULL);
    if (cv_get_literal(m, at, "role", 0, ROLES, CV_ARRAY_LEN(ROLES), &role, err)) return -1;
    const json_t *content = json_object_get(m, "content");
    cv_loc content_at = {at, "content", 0};
    if (!content) return cv_api_pyfail(err, &content_at, m, "missing", CV_PY_MISSING, NULL);
    if (json_is_string(content)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", ROLES[role], "content", content));
        return 0;
    }
    if (!json_is_array(content))
        return cv_api_pyfail(err, &content_at, content, "string_type", "Input should be a valid string", NULL);
    if (json_array_size(content) == 0) return cv_api_fail(err, 400, NULL, "message content must not be empty");
    turn t = {json_array(), json_array(), NULL, json_array()};
    size_t i;
    const json_t *b;
    int rc = 0;
    json_array_foreach(content, i, b) {
        cv_loc item = {&content_at, NULL, i};
        if ((rc = add_block(b, &item, role == 0, &t, err))) break;
    }
    if (!rc) {
        json_array_extend(out, t.tool_msgs);
        json_t *msg = json_pack("{s:s}", "role", ROLES[role]);
        if (t.reasoning) json_object_set_new(msg, "reasoning", json_string(t.reasoning));
        if (json_array_size(t.tool_calls)) json_object_set(msg, "tool_calls", t.tool_calls);
        const json_t *only = json_array_size(t.parts) == 1 ? json_array_get(t.parts, 0) : NULL;
        if (only && !strcmp(json_string_value(json_object_get(only, "type")), "text"))
            json_object_set(msg, "content", json_object_get(only, "text"));
        else if (json_array_size(t.parts))
            json_object_set(msg, "content", t.parts);
        else if (!json_array_size(t.tool_calls))
            json_object_set_new(msg, "content", json_string(""));
        json_array_append_new(out, msg);
    }
    json_decref(t.parts);
    json_decref(t.tool_calls);
    json_decref(t.tool_msgs);
    free(t.reasoning);
    return rc;
}

static int convert_tools(const json_t *o, json_t *chat, cv_api_error *err) {
    const json_t *tools = NULL, *choice = NULL;
    if (cv_check_list(o, NULL, "tools", CV_OPTIONAL, &tools, err) ||
        cv_check_dict(o, NULL, "tool_choice", CV_OPTIONAL, &choice, err))
        return -1;
    if (choice) {
        cv_loc at = {NULL, "tool_choice", 0};
        int kind = 0;
        const json_t *name = NULL;
        if (!json_object_get(choice, "type")) return cv_api_pyfail(err, &(cv_loc){&at, "type", 0}, choice, "missing", CV_PY_MISSING, NULL);
        if (cv_get_literal(choice, &at, "type", 0, TOOL_CHOICES, CV_ARRAY_LEN(TOOL_CHOICES), &kind, err) ||
            cv_check_str(choice, &at, "name", CV_OPTIONAL, &name, err))
            return -1;
        if (kind == TC_TOOL && (!name || !json_string_length(name)))
            return cv_api_fail(err, 400, NULL, "tool_choice.name is required when tool_choice.type is 'tool'");
        json_object_set_new(chat, "tool_choice", kind == TC_AUTO  ? json_string("auto")
                                                 : kind == TC_ANY ? json_string("required")
                                                 : kind == TC_NONE
                                                     ? json_string("none")
                                                     : json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    }
    if (!tools) return 0;
    json_t *fns = json_array();
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool) {
        cv_loc at = {&(cv_loc){NULL, "tools", 0}, NULL, i};
        const json_t *name = NULL, *description = NULL, *schema = NULL;
        if (!json_is_object(tool)) {
            json_decref(fns);
            return cv_api_pyfail(err, &at, tool, "model_type", "Input should be a valid dictionary or instance of "
                                 "AnthropicTool", NULL);
        }
        if (cv_check_str(tool, &at, "name", 0, &name, err) || cv_check_str(tool, &at, "description", CV_OPTIONAL, &description, err) ||
            cv_check_dict(tool, &at, "input_schema", 0, &schema, err)) {
            json_decref(fns);
            return -1;
        }
        const char *missing = !name ? "name" : !schema ? "input_schema" : NULL;
        if (missing) {
            json_decref(fns);
            return cv_api_pyfail(err, &(cv_loc){&at, missing, 0}, tool, "missing", CV_PY_MISSING, NULL);
        }
        json_t *params = json_deep_copy(schema);
        if (!json_object_get(params, "type")) json_object_set_new(params, "type", json_string("object"));
        json_t *fn = json_pack("{s:O}", "name", name); /* in the order of vLLM's FunctionDefinition */
        if (description) json_object_set(fn, "description", (json_t *)description);
        json_object_set_new(fn, "parameters", params);
        json_array_append_new(fns, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    json_object_set_new(chat, "tools", fns);
    if (!json_object_get(chat, "tool_choice")) json_object_set_new(chat, "tool_choice", json_string("auto"));
    return 0;
}

/* The chat completion request of a Messages request (count_only: /v1/messages/count_tokens, whose
 * body has no max_tokens and generates nothing). */
static int to_chat(const json_t *o, bool count_only, json_t **out, cv_api_error *err) {
    const json_t *model = NULL, *messages = NULL, *system = NULL, *stops = NULL, *thinking = NULL;
    int64_t max_tokens = 0;
    bool stream = false, given_max = false;
    if (cv_check_str(o, NULL, "model", 0, &model, err) || cv_check_list(o, NULL, "messages", 0, &messages, err) ||
        (!count_only && cv_get_int(o, NULL, "max_tokens", 0, &max_tokens, &given_max, err)) ||
        cv_check_list(o, NULL, "stop_sequences", CV_OPTIONAL, &stops, err) ||
        cv_check_dict(o, NULL, "thinking", CV_OPTIONAL, &thinking, err) ||
        (!count_only && cv_get_bool(o, NULL, "stream", CV_OPTIONAL, &stream, err)))
        return -1;
    const char *missing = !model ? "model" : !messages ? "messages" : !count_only && !given_max ? "max_tokens" : NULL;
    if (missing) return cv_api_pyfail(err, &(cv_loc){NULL, missing, 0}, o, "missing", CV_PY_MISSING, NULL);
    if (!json_string_length(model)) return cv_api_value_error(err, o, "ValueError", NULL, NULL, "Model is required");
    if (!count_only && max_tokens <= 0)
        return cv_api_value_error(err, o, "ValueError", NULL, NULL, "max_tokens must be positive");
    if (json_array_size(messages) == 0) return cv_api_fail(err, 400, NULL, "messages must contain at least one item");
    json_t *chat = json_pack("{s:O, s:[]}", "model", model, "messages");
    json_t *msgs = json_object_get(chat, "messages");
    int rc = 0;
    system = json_object_get(o, "system");
    if (json_is_string(system) && json_string_length(system)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", system));
    } else if (json_is_array(system) && json_array_size(system)) {
        char *text = NULL;
        rc = blocks_text(system, &(cv_loc){NULL, "system", 0}, &text, err);
        if (!rc) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", text));
        free(text);
    } else if (system && !json_is_null(system) && !json_is_string(system) && !json_is_array(system)) {
        rc = cv_api_pyfail(err, &(cv_loc){NULL, "system", 0}, system, "string_type", "Input should be a valid string", NULL);
    }
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        if (rc) break;
        rc = add_message(m, &(cv_loc){&(cv_loc){NULL, "messages", 0}, NULL, i}, msgs, err);
    }
    if (!rc) rc = convert_tools(o, chat, err);
    if (!rc && !count_only) {
        json_object_set_new(chat, "max_tokens", json_integer(max_tokens));
        static const char *const sampling[] = {"temperature", "top_p", "top_k"};
        for (size_t k = 0; k < CV_ARRAY_LEN(sampling); k++) {
            const json_t *v = json_object_get(o, sampling[k]);
            if (v) json_object_set(chat, sampling[k], (json_t *)v);
        }
        if (stops) json_object_set(chat, "stop", (json_t *)stops);
        if (stream) {
            json_object_set_new(chat, "stream", json_true());
            json_object_set_new(chat, "stream_options", json_pack("{s:b, s:b}", "include_usage", 1, "continuous_usage_stats", 1));
        }
    }
    if (!rc && thinking) { /* Qwen3's switch for Anthropic's extended thinking */
        const char *type = json_string_value(json_object_get(thinking, "type"));
        if (type && (!strcmp(type, "enabled") || !strcmp(type, "disabled")))
            json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", !strcmp(type, "enabled")));
    }
    if (rc) {
        json_decref(chat);
        return -1;
    }
    *out = chat;
    return 0;
}

int cv_api_parse_anthropic(const char *body, size_t len, const cv_api_limits *lim, bool count_only, cv_api_request *req,
                           cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_CHAT;
    json_t *root = cv_api_parse_body(body, len, err), *chat = NULL;
    int rc = root ? to_chat(root, count_only, &chat, err) : -1;
    json_decref(root);
    if (rc) return -1;
    rc = cv_api_parse_chat_object(chat, lim, req, err);
    json_decref(chat);
    req->anthropic = true;
    return rc;
}

/* ---- replies ------------------------------------------------------------------------------------- */

/* A chat finish reason as Anthropic's stop_reason (NULL for none it has); *stop_sequence is set when
 * a stop string ended the output. */
static const char *stop_reason(const char *finish, const json_t *chat_stop, const char **stop_sequence) {
    *stop_sequence = json_string_value(chat_stop);
    if (!finish) return NULL;
    if (!strcmp(finish, "stop")) return *stop_sequence ? "stop_sequence" : "end_turn";
    *stop_sequence = NULL;
    return !strcmp(finish, "length") ? "max_tokens" : !strcmp(finish, "tool_calls") ? "tool_use" : NULL;
}

static json_t *signature(void) {
    char hex[33];
    cv_api_random_hex(hex, 16);
    return json_string(hex);
}

char *cv_api_anthropic_json(const cv_api_response *r, cv_api_error *err) {
    json_t *chat = cv_api_generation_object(r);
    const json_t *choice = json_array_get(json_object_get(chat, "choices"), 0), *msg = json_object_get(choice, "message"),
                 *usage = json_object_get(chat, "usage");
    json_t *content = json_array();
    const json_t *reasoning = json_object_get(msg, "reasoning"), *body = json_object_get(msg, "content");
    if (json_string_length(reasoning))
        json_array_append_new(content, json_pack("{s:s, s:O, s:o}", "type", "thinking", "thinking", reasoning, "signature",
                                                 signature()));
    if (json_string_length(body)) json_array_append_new(content, json_pack("{s:s, s:O}", "type", "text", "text", body));
    size_t i;
    const json_t *call;
    int rc = 0;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, call) {
        const json_t *fn = json_object_get(call, "function");
        json_t *input = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        if (!json_is_object(input)) { /* as vLLM's json.loads fails: the model's arguments are no object */
            json_decref(input);
            rc = cv_api_fail(err, 500, NULL, "tool call %s: its arguments are not a JSON object",
                             json_string_value(json_object_get(fn, "name")));
            break;
        }
        json_array_append_new(content, json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id", json_object_get(call, "id"),
                                                 "name", json_object_get(fn, "name"), "input", input));
    }
    const char *seq, *reason = stop_reason(json_string_value(json_object_get(choice, "finish_reason")),
                                            json_object_get(choice, "stop_reason"), &seq);
    json_t *o = json_pack("{s:O, s:s, s:s, s:o, s:O, s:{s:O, s:O}}", "id", json_object_get(chat, "id"), "type", "message",
                          "role", "assistant", "content", content, "model", json_object_get(chat, "model"), "usage",
                          "input_tokens", json_object_get(usage, "prompt_tokens"), "output_tokens",
                          json_object_get(usage, "completion_tokens"));
    if (reason) json_object_set_new(o, "stop_reason", json_string(reason));
    if (seq) json_object_set_new(o, "stop_sequence", json_string(seq));
    json_decref(chat);
    char *out = rc ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return out;
}

char *cv_api_anthropic_error_json(const cv_api_error *err) {
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", err->type, "message", err->message);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- the event stream ---------------------------------------------------------------------------- */

struct cv_anthropic_stream {
    bool started;
    int open;          /* the open block's index, -1: none */
    int next;          /* the next block's index */
    int kind;          /* the open block's (B_TEXT, B_THINKING, B_TOOL_USE) */
    json_int_t tool;   /* an open tool_use block's chat tool-call index */
    char *finish;      /* the chat finish reason seen */
    json_t *chat_stop; /* the chat stop_reason seen (a stop string, an id, or null) */
    char *out;
    size_t len, cap;
};

static void emit(cv_anthropic_stream *st, const char *event, json_t *data) {
    cv_api_sse_event(&st->out, &st->len, &st->cap, event, data);
}

static void stop_block(cv_anthropic_stream *st) {
    if (st->open < 0) return;
    if (st->kind == B_THINKING)
        emit(st, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index",
                                                  st->open, "delta", "type", "signature_delta", "signature", signature()));
    emit(st, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->open));
    st->open = -1;
}

static void start_block(cv_anthropic_stream *st, int kind, json_t *block) {
    stop_block(st);
    st->open = st->next++;
    st->kind = kind;
    emit(st, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->open,
                                              "content_block", block));
}

static void delta(cv_anthropic_stream *st, const char *type, const char *key, const json_t *value) {
    emit(st, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:O}}", "type", "content_block_delta", "index",
                                              st->open, "delta", "type", type, key, value));
}

static void chunk(cv_anthropic_stream *st, const json_t *c) {
    const json_t *usage = json_object_get(c, "usage"), *choices = json_object_get(c, "choices");
    if (!st->started) {
        st->started = true;
        emit(st, "message_start",
             json_pack("{s:s, s:{s:O, s:s, s:s, s:[], s:O, s:n, s:n, s:{s:I, s:i}}}", "type", "message_start", "message",
                       "id", json_object_get(c, "id"), "type", "message", "role", "assistant", "content", "model",
                       json_object_get(c, "model"), "stop_reason", "stop_sequence", "usage", "input_tokens",
                       (json_int_t)json_integer_value(json_object_get(usage, "prompt_tokens")), "output_tokens", 0));
    }
    if (json_array_size(choices) == 0) { /* the usage chunk: the end of the output */
        stop_block(st);
        const char *seq, *reason = stop_reason(st->finish ? st->finish : "stop", st->chat_stop, &seq);
        emit(st, "message_delta",
             json_pack("{s:s, s:{s:s?, s:s?}, s:{s:I, s:I}}", "type", "message_delta", "delta", "stop_reason", reason,
                       "stop_sequence", seq, "usage", "input_tokens",
                       (json_int_t)json_integer_value(json_object_get(usage, "prompt_tokens")), "output_tokens",
                       (json_int_t)json_integer_value(json_object_get(usage, "completion_tokens"))));
        return;
    }
    const json_t *choice = json_array_get(choices, 0), *d = json_object_get(choice, "delta");
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    if (finish) {
        free(st->finish);
        st->finish = cv_xstrdup(finish);
        json_decref(st->chat_stop);
        st->chat_stop = json_incref(json_object_get(choice, "stop_reason"));
    }
    const json_t *reasoning = json_object_get(d, "reasoning"), *content = json_object_get(d, "content");
    if (json_string_length(reasoning)) {
        if (st->open < 0 || st->kind != B_THINKING)
            start_block(st, B_THINKING, json_pack("{s:s, s:s}", "type", "thinking", "thinking", ""));
        delta(st, "thinking_delta", "thinking", reasoning);
    }
    if (json_string_length(content)) {
        if (st->open < 0 || st->kind != B_TEXT) start_block(st, B_TEXT, json_pack("{s:s, s:s}", "type", "text", "text", ""));
        delta(st, "text_delta", "text", content);
    }
    size_t i;
    const json_t *call;
    json_array_foreach(json_object_get(d, "tool_calls"), i, call) {
        const json_t *fn = json_object_get(call, "function"), *id = json_object_get(call, "id"),
                     *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        const json_int_t index = json_integer_value(json_object_get(call, "index"));
        if (json_is_string(id) && json_is_string(name)) {
            start_block(st, B_TOOL_USE, json_pack("{s:s, s:O, s:O, s:{}}", "type", "tool_use", "id", id, "name", name, "input"));
            st->tool = index;
        }
        if (json_string_length(args) && st->open >= 0 && st->kind == B_TOOL_USE && st->tool == index)
            delta(st, "input_json_delta", "partial_json", args);
    }
}

cv_anthropic_stream *cv_anthropic_stream_new(void) {
    cv_anthropic_stream *st = cv_xcalloc(1, sizeof *st);
    st->open = -1;
    return st;
}

void cv_anthropic_stream_free(cv_anthropic_stream *st) {
    if (!st) return;
    free(st->finish);
    json_decref(st->chat_stop);
    free(st->out);
    free(st);
}

static void on_record(void *user, const json_t *c) {
    cv_anthropic_stream *st = user;
    const json_t *e = json_object_get(c, "error");
    if (!c) {
        emit(st, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        cv_buf_append(&st->out, &st->len, &st->cap, "data: [DONE]\n\n", 14);
    } else if (e) {
        emit(st, "error", json_pack("{s:s, s:{s:O, s:O}}", "type", "error", "error", "type", json_object_get(e, "type"),
                                    "message", json_object_get(e, "message")));
    } else {
        chunk(st, c);
    }
}

void cv_anthropic_stream_convert(cv_anthropic_stream *st, char **sse, size_t *len, size_t *cap) {
    cv_api_sse_translate(sse, len, cap, on_record, st, &st->out, &st->len, &st->cap);
}
