/*
 * api_request.c — request JSON → cv_api_request (see api.h).
 *
 * Parsing is strict about types and lenient about presence, as vLLM's pydantic models are: unknown
 * fields are ignored (and logged as vLLM logs them, see log_ignored_fields), JSON null means "not
 * given", and an integer field also takes a float with an integral value (16.0). Every type error is
 * a 400 naming the field in `param`. Sizes that would make the server allocate without bound (n, the
 * number of prompts, stop lists) are capped here, before anything is allocated for them.
 *
 * Chat requests are rendered here with the server's chat template (see api.h); the template's own
 * errors, raise_exception() messages included, are 400s carrying its message.
 *
 * Context-length rules (cv_api_prepare) follow vLLM 0.10–0.11, whose two messages clients match on
 * ("maximum context length", "is too large"):
 *   - a prompt of P >= L tokens is rejected;
 *   - a max_tokens M that is given (completions always give one: 16 by default) must satisfy
 *     P + M <= L;
 *   - chat without max_tokens generates up to L - P tokens, capped by generation_config's
 *     max_new_tokens.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/utf8.h"
#include "chat/jinja.h"
#include "server/api.h"

enum { MAX_STOP_STRINGS = 64, MAX_ID_LIST = 4096, MAX_LOGIT_BIAS = 4096 };

int cv_api_fail(cv_api_error *err, int status, const char *param, const char *fmt, ...) {
    err->status = status;
    switch (status) {
    case 400: err->type = "BadRequestError"; break;
    case 401: err->type = "Unauthorized"; break;
    case 404: err->type = "NotFoundError"; break;
    case 413: err->type = "RequestEntityTooLarge"; break;
    case 415: err->type = "UnsupportedMediaType"; break;
    case 501: err->type = "NotImplementedError"; break;
    case 503: err->type = "ServiceUnavailableError"; break;
    default: err->type = "InternalServerError"; break;
    }
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    /* A cut may have split a character; the message must stay valid UTF-8 for the JSON encoder. */
    size_t bad;
    if (!cv_utf8_validate(err->message, strlen(err->message), &bad)) err->message[bad] = '\0';
    return -1;
}

char *cv_api_error_json(const cv_api_error *err) {
    json_t *e = json_pack("{s:s, s:s, s:o, s:i}", "message", err->message, "type", err->type, "param",
                          err->param[0] ? json_string(err->param) : json_null(), "code", err->status);
    json_t *o = json_pack("{s:o}", "error", e);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ------------------------------------------------------------------------------------------------ */
/* Typed field access: absent and null leave the default in place                                  */

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static json_t *field(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int wrong_type(cv_api_error *err, const char *key, const char *want, const json_t *v) {
    return cv_api_fail(err, 400, key, "'%s' must be %s, got %s", key, want, json_type_name(v));
}

/* An integer, or a float with an integral value (as pydantic accepts). */
static bool as_integer(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.2e18) {
            *out = (int64_t)d;
            return true;
        }
    }
    return false;
}

static int get_int64(const json_t *o, const char *key, int64_t *out, bool *given, cv_api_error *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!as_integer(v, out)) return wrong_type(err, key, "an integer", v);
    if (given) *given = true;
    return 0;
}

static int get_int32(const json_t *o, const char *key, int32_t *out, cv_api_error *err) {
    int64_t v = *out;
    if (get_int64(o, key, &v, NULL, err)) return -1;
    if (v < INT32_MIN || v > INT32_MAX)
        return cv_api_fail(err, 400, key, "'%s' is out of range: %lld", key, (long long)v);
    *out = (int32_t)v;
    return 0;
}

static int get_float(const json_t *o, const char *key, float *out, cv_api_error *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return wrong_type(err, key, "a number", v);
    *out = (float)json_number_value(v);
    return 0;
}

static int get_bool(const json_t *o, const char *key, bool *out, cv_api_error *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return wrong_type(err, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static int get_string(const json_t *o, const char *key, char **out, cv_api_error *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) return wrong_type(err, key, "a string", v);
    free(*out);
    *out = cv_xstrndup(json_string_value(v), json_string_length(v));
    return 0;
}

/* [int, ...] with each id in int32; *ids is cv_xmalloc'd (never NULL on success). Prompt lists are
 * bounded by the body size; `max` bounds lists that cost work per generated token. */
static int id_list(const json_t *a, const char *key, size_t max, int32_t **ids, size_t *n, cv_api_error *err) {
    size_t count = json_array_size(a);
    if (count > max) return cv_api_fail(err, 400, key, "'%s' has %zu entries, at most %zu are allowed", key, count, max);
    int32_t *out = cv_xmalloc((count ? count : 1) * sizeof *out);
    for (size_t i = 0; i < count; i++) {
        int64_t v;
        json_t *item = json_array_get(a, i);
        if (!as_integer(item, &v)) {
            free(out);
            return wrong_type(err, key, "a list of integers", item);
        }
        /* Out-of-range ids are reported like any other id outside the vocabulary. */
        out[i] = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
    }
    *ids = out;
    *n = count;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Fields vLLM does not know                                                                         */

/* The fields of vLLM's request models (current main): what a request may carry without being told
 * that it was ignored. Shared by CompletionRequest and ChatCompletionRequest
 * (vllm/entrypoints/openai/completion/protocol.py, chat_completion/protocol.py), then each one's own,
 * then TokenizeCompletionRequest, TokenizeChatRequest and DetokenizeRequest
 * (vllm/entrypoints/serve/tokenize/protocol.py). best_of is in none of them since vLLM v1 dropped it
 * (PR #29090): it is ignored like any other unknown field, whatever its value. */
static const char *const GENERATE_FIELDS[] = {
    "model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty", "seed", "stop",
    "stream", "stream_options", "temperature", "top_p", "user", "use_beam_search", "top_k", "min_p",
    "repetition_penalty", "watermarking", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "truncation_side", "prompt_logprobs", "logprob_token_ids", "allowed_token_ids", "bad_words", "echo",
    "add_special_tokens", "response_format", "structured_outputs", "priority", "request_id", "session_id",
    "return_tokens_as_token_ids", "return_token_ids", "routed_experts_prompt_start", "return_token_offsets",
    "return_mm_kwargs", "cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs",
    "repetition_detection", "thinking_token_budget", "stream_interval", NULL};
static const char *const COMPLETION_FIELDS[] = {"prompt", "suffix", "prompt_embeds", NULL};
static const char *const CHAT_FIELDS[] = {
    "messages", "top_logprobs", "max_completion_tokens", "tools", "tool_choice", "reasoning_effort",
    "include_reasoning", "parallel_tool_calls", "add_generation_prompt", "continue_final_message", "documents",
    "chat_template", "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs", "return_prompt_text", NULL};
static const char *const TOKENIZE_PROMPT_FIELDS[] = {"model", "prompt", "add_special_tokens", "return_token_strs", NULL};
static const char *const TOKENIZE_CHAT_FIELDS[] = {
    "model", "messages", "add_generation_prompt", "return_token_strs", "continue_final_message", "add_special_tokens",
    "chat_template", "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs", "tools", NULL};
static const char *const DETOKENIZE_FIELDS[] = {"model", "tokens", NULL};

/* The guided-decoding fields structured outputs replaced (PR #22772); vLLM warns about them. */
static const char *const REMOVED_GUIDED_FIELDS[] = {
    "guided_choice", "guided_decoding_backend", "guided_grammar", "guided_json", "guided_regex",
    "guided_whitespace_pattern"}; /* sorted, as vLLM prints them */

static bool in_fields(const char *const *fields, const char *key) {
    for (; fields && *fields; fields++)
        if (!strcmp(*fields, key)) return true;
    return false;
}

static void append_repr(char **buf, size_t *len, size_t *cap, const char *s) {
    json_t *str = json_string(s);
    char *r = jinja_py_repr(str);
    cv_buf_append(buf, len, cap, r, strlen(r));
    free(r);
    json_decref(str);
}

/* vLLM's OpenAIBaseModel.__log_extra_fields__ (vllm/entrypoints/openai/engine/protocol.py): once per
 * request that validated, a DEBUG line naming the fields outside the model, as a Python set; and, once
 * per process for each combination, a WARNING when some are the removed guided_* fields, since
 * their requests silently lose their constraint. */
static void log_ignored_fields(const json_t *o, const char *const *fields, const char *const *more) {
    static _Atomic uint64_t warned; /* bit m: the combination with mask m was warned about */
    bool debug = cv_log_enabled(CV_LOG_DEBUG); /* the set is only spelled out for the DEBUG line */
    char *set = NULL, *guided = NULL;
    size_t len = 0, cap = 0, glen = 0, gcap = 0;
    unsigned mask = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (in_fields(fields, key) || in_fields(more, key)) continue;
        if (debug) {
            cv_buf_append(&set, &len, &cap, len ? ", " : "{", len ? 2 : 1);
            append_repr(&set, &len, &cap, key);
        }
        for (size_t i = 0; i < CV_ARRAY_LEN(REMOVED_GUIDED_FIELDS); i++)
            if (!strcmp(key, REMOVED_GUIDED_FIELDS[i])) mask |= 1u << i;
    }
    if (mask && !(atomic_fetch_or(&warned, (uint64_t)1 << mask) & ((uint64_t)1 << mask))) {
        for (size_t i = 0; i < CV_ARRAY_LEN(REMOVED_GUIDED_FIELDS); i++) {
            if (!(mask & (1u << i))) continue;
            cv_buf_append(&guided, &glen, &gcap, glen ? ", " : "[", glen ? 2 : 1);
            append_repr(&guided, &glen, &gcap, REMOVED_GUIDED_FIELDS[i]);
        }
        cv_buf_append(&guided, &glen, &gcap, "]", 1);
        cv_warn("protocol", "Request contains the removed guided-decoding field(s) %s, which are ignored; output "
                "will NOT be constrained. Use `structured_outputs` (or `response_format`) instead; see "
                "docs/features/structured_outputs.md.", guided);
        free(guided);
    }
    if (set) {
        cv_buf_append(&set, &len, &cap, "}", 1);
        cv_debug("protocol", "The following fields were present in the request but ignored: %s", set);
        free(set);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Fields shared by completions and chat                                                            */

static int parse_stop(const json_t *o, cv_api_request *req, cv_api_error *err) {
    json_t *v = field(o, "stop");
    if (!v) return 0;
    if (json_is_string(v)) {
        req->stop = cv_xcalloc(1, sizeof *req->stop);
        req->stop[0] = cv_xstrdup(json_string_value(v));
        req->params.n_stop = 1;
        return 0;
    }
    if (!json_is_array(v)) return wrong_type(err, "stop", "a string or a list of strings", v);
    size_t n = json_array_size(v);
    if (n > MAX_STOP_STRINGS) return cv_api_fail(err, 400, "stop", "'stop' has %zu entries, at most %d are allowed", n, MAX_STOP_STRINGS);
    req->stop = cv_xcalloc(n ? n : 1, sizeof *req->stop);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s)) return wrong_type(err, "stop", "a string or a list of strings", s);
        req->stop[i] = cv_xstrdup(json_string_value(s));
        req->params.n_stop = i + 1;
    }
    return 0;
}

static int parse_logit_bias(const json_t *o, cv_api_request *req, cv_api_error *err) {
    json_t *v = field(o, "logit_bias");
    if (!v) return 0;
    if (!json_is_object(v)) return wrong_type(err, "logit_bias", "an object", v);
    size_t n = json_object_size(v), i = 0;
    if (n > MAX_LOGIT_BIAS) return cv_api_fail(err, 400, "logit_bias", "'logit_bias' has %zu entries, at most %d are allowed", n, MAX_LOGIT_BIAS);
    req->bias_ids = cv_xmalloc((n ? n : 1) * sizeof *req->bias_ids);
    req->bias_values = cv_xmalloc((n ? n : 1) * sizeof *req->bias_values);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (end == key || *end || id < INT32_MIN || id > INT32_MAX)
            return cv_api_fail(err, 400, "logit_bias",
                               "Found token_id `%.64s` in logit_bias but token_id must be an integer or string representing an integer", key);
        if (!json_is_number(val)) return wrong_type(err, "logit_bias", "a map of token ids to numbers", val);
        /* OpenAI's documented range; vLLM clamps rather than rejects. */
        double b = json_number_value(val);
        req->bias_ids[i] = (int32_t)id;
        req->bias_values[i++] = (float)(b < -100 ? -100 : b > 100 ? 100 : b);
        req->params.n_logit_bias = i;
    }
    return 0;
}

static int parse_stream_options(const json_t *o, cv_api_request *req, cv_api_error *err) {
    if (get_bool(o, "stream", &req->stream, err)) return -1;
    json_t *so = field(o, "stream_options");
    if (!so) return 0;
    if (!json_is_object(so)) return wrong_type(err, "stream_options", "an object", so);
    if (!req->stream) return cv_api_fail(err, 400, "stream_options", "Stream options can only be defined when `stream=True`.");
    if (get_bool(so, "include_usage", &req->include_usage, err)) return -1;
    return get_bool(so, "continuous_usage_stats", &req->continuous_usage, err);
}

static int reject_unsupported(const json_t *o, cv_api_error *err) {
    bool beam = false;
    if (get_bool(o, "use_beam_search", &beam, err)) return -1;
    if (beam) return cv_api_fail(err, 400, "use_beam_search", "beam search is not supported by this server");
    json_t *rf = field(o, "response_format");
    if (rf) {
        json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(type)) return wrong_type(err, "response_format", "an object with a string 'type'", rf);
        if (strcmp(json_string_value(type), "text") != 0)
            return cv_api_fail(err, 400, "response_format", "response_format type '%.32s' is not supported yet; only 'text' is",
                               json_string_value(type));
    }
    if (field(o, "structured_outputs"))
        return cv_api_fail(err, 400, "structured_outputs", "structured outputs are not supported yet");
    return 0;
}

static int parse_common(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    cvllm_sampling_params *p = &req->params;
    *p = lim->defaults;
    p->logprobs = p->prompt_logprobs = -1;
    req->top_logprobs = req->prompt_logprobs = -1;
    if (get_string(o, "model", &req->model, err) || get_int32(o, "n", &p->n, err)) return -1;
    if (p->n < 1) return cv_api_fail(err, 400, "n", "n must be at least 1, got %d.", p->n);
    if (p->n > lim->max_n) return cv_api_fail(err, 400, "n", "n must be at most %d, got %d.", lim->max_n, p->n);
    if (get_float(o, "temperature", &p->temperature, err) || get_float(o, "top_p", &p->top_p, err) ||
        get_int32(o, "top_k", &p->top_k, err) || get_float(o, "min_p", &p->min_p, err) ||
        get_float(o, "repetition_penalty", &p->repetition_penalty, err) ||
        get_float(o, "presence_penalty", &p->presence_penalty, err) ||
        get_float(o, "frequency_penalty", &p->frequency_penalty, err) ||
        get_int32(o, "min_tokens", &p->min_tokens, err) || get_bool(o, "ignore_eos", &p->ignore_eos, err) ||
        get_bool(o, "skip_special_tokens", &p->skip_special_tokens, err) ||
        get_bool(o, "spaces_between_special_tokens", &p->spaces_between_special_tokens, err) ||
        get_bool(o, "include_stop_str_in_output", &p->include_stop_str_in_output, err) ||
        get_int64(o, "seed", &p->seed, &p->has_seed, err) || parse_stop(o, req, err) ||
        parse_logit_bias(o, req, err) || parse_stream_options(o, req, err) ||
        get_int32(o, "prompt_logprobs", &req->prompt_logprobs, err) ||
        get_bool(o, "return_token_ids", &req->return_token_ids, err) ||
        get_bool(o, "return_tokens_as_token_ids", &req->tokens_as_ids, err) ||
        get_string(o, "cache_salt", &req->cache_salt, err) || get_string(o, "request_id", &req->request_id, err) ||
        reject_unsupported(o, err))
        return -1;
    json_t *ids = field(o, "stop_token_ids");
    if (ids) {
        if (!json_is_array(ids)) return wrong_type(err, "stop_token_ids", "a list of integers", ids);
        if (id_list(ids, "stop_token_ids", MAX_ID_LIST, &req->stop_token_ids, &p->n_stop_token_ids, err)) return -1;
    }
    if (req->prompt_logprobs < -1 || (req->prompt_logprobs == -1 && field(o, "prompt_logprobs")))
        return cv_api_fail(err, 400, "prompt_logprobs", "prompt_logprobs must be non-negative, got %d.", req->prompt_logprobs);
    if (req->prompt_logprobs >= 0 && req->stream)
        return cv_api_fail(err, 400, "prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`.");
    if (req->request_id && strlen(req->request_id) > 64)
        return cv_api_fail(err, 400, "request_id", "'request_id' is longer than 64 bytes");
    p->stop = (const char *const *)req->stop;
    p->stop_token_ids = req->stop_token_ids;
    p->logit_bias_ids = req->bias_ids;
    p->logit_bias_values = req->bias_values;
    return 0;
}

static json_t *parse_body(const char *body, size_t len, cv_api_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) {
        cv_api_fail(err, 400, NULL, "JSON decode error: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        cv_api_fail(err, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ------------------------------------------------------------------------------------------------ */
/* /v1/completions                                                                                   */

static void add_prompt(cv_api_request *req, cv_api_prompt p) {
    req->prompts = cv_xrealloc(req->prompts, (req->n_prompts + 1) * sizeof *req->prompts);
    req->prompts[req->n_prompts++] = p;
}

static cv_api_prompt text_prompt(const json_t *s) {
    size_t n = json_string_length(s);
    return (cv_api_prompt){.text = cv_xstrndup(json_string_value(s), n), .text_len = n};
}

/* A string, a list of strings, a list of ids, or a list of id lists. */
static int parse_prompt_field(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    static const char want[] = "a string, a list of strings, a list of token ids or a list of token id lists";
    json_t *v = field(o, "prompt");
    if (!v) return cv_api_fail(err, 400, "prompt", "'prompt' is required");
    if (json_is_string(v)) {
        add_prompt(req, text_prompt(v));
        return 0;
    }
    if (!json_is_array(v)) return wrong_type(err, "prompt", want, v);
    size_t n = json_array_size(v);
    if (n == 0) return cv_api_fail(err, 400, "prompt", "'prompt' must not be an empty list");
    json_t *first = json_array_get(v, 0);
    if (json_is_number(first)) {
        cv_api_prompt p = {0};
        if (id_list(v, "prompt", SIZE_MAX, &p.ids, &p.n_ids, err)) return -1;
        add_prompt(req, p);
        return 0;
    }
    if (n > (size_t)lim->max_prompts)
        return cv_api_fail(err, 400, "prompt", "'prompt' has %zu prompts, at most %d are allowed", n, lim->max_prompts);
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(v, i);
        if (json_is_string(item) && json_is_string(first)) {
            add_prompt(req, text_prompt(item));
        } else if (json_is_array(item) && json_is_array(first)) {
            cv_api_prompt p = {0};
            if (id_list(item, "prompt", SIZE_MAX, &p.ids, &p.n_ids, err)) return -1;
            add_prompt(req, p);
        } else {
            return wrong_type(err, "prompt", want, item);
        }
    }
    return 0;
}

static int parse_completion_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    if (parse_common(o, lim, req, err) || parse_prompt_field(o, lim, req, err)) return -1;
    if (field(o, "suffix")) return cv_api_fail(err, 400, "suffix", "suffix is not currently supported");
    req->max_tokens = 16;
    if (get_int64(o, "max_tokens", &req->max_tokens, NULL, err) || get_bool(o, "echo", &req->echo, err) ||
        get_int32(o, "logprobs", &req->top_logprobs, err))
        return -1;
    if (req->max_tokens < (req->echo ? 0 : 1))
        return cv_api_fail(err, 400, "max_tokens", "max_tokens must be at least 1, got %lld.", (long long)req->max_tokens);
    if (req->top_logprobs < -1 || (req->top_logprobs == -1 && field(o, "logprobs")))
        return cv_api_fail(err, 400, "logprobs", "logprobs must be non-negative, got %d.", req->top_logprobs);
    /* With echo, the prompt's logprobs are part of the reply (vLLM: prompt_logprobs = logprobs). */
    if (req->echo && req->top_logprobs >= 0 && req->prompt_logprobs < 0) req->prompt_logprobs = req->top_logprobs;
    req->params.logprobs = req->top_logprobs;
    return 0;
}

int cv_api_parse_completion(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                            cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_COMPLETION;
    json_t *root = parse_body(body, len, err);
    if (!root) return -1;
    int rc = parse_completion_fields(root, lim, req, err);
    if (!rc) log_ignored_fields(root, GENERATE_FIELDS, COMPLETION_FIELDS);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* /v1/chat/completions                                                                              */

static const char NO_TEMPLATE[] =
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if "
    "the tokenizer does not define one.";

/* chat echo: the text of a final assistant message (a string, or its text parts joined by newlines)
 * is sent back before the generated text. The template has already vetted the content's shape. */
static void chat_echo_text(const json_t *messages, cv_api_request *req) {
    json_t *last = json_array_get(messages, json_array_size(messages) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!role || strcmp(role, "assistant") != 0) return;
    json_t *content = json_object_get(last, "content");
    size_t len = 0, cap = 0, n_parts = 0;
    if (json_is_string(content)) cv_buf_append(&req->echo_text, &len, &cap, json_string_value(content), json_string_length(content));
    for (size_t i = 0; json_is_array(content) && i < json_array_size(content); i++) {
        json_t *text = json_object_get(json_array_get(content, i), "text");
        if (!json_is_string(text)) continue;
        if (n_parts++) cv_buf_append(&req->echo_text, &len, &cap, "\n", 1);
        cv_buf_append(&req->echo_text, &len, &cap, json_string_value(text), json_string_length(text));
    }
    if (!req->echo_text) req->echo_text = cv_xstrdup("");
}

/* The request's chat_template_kwargs (a new object, or NULL when it has none) with reasoning_effort
 * forwarded to the template, as vLLM does for a chat completion (`generation`; /tokenize has no such
 * field); "none" also turns thinking off unless the request decides that itself. */
static int chat_kwargs(const json_t *o, bool generation, json_t **out, cv_api_error *err) {
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    *out = NULL;
    json_t *kw = field(o, "chat_template_kwargs"), *effort = generation ? field(o, "reasoning_effort") : NULL;
    if (kw && !json_is_object(kw)) return wrong_type(err, "chat_template_kwargs", "an object", kw);
    if (effort && !json_is_string(effort)) return wrong_type(err, "reasoning_effort", "a string", effort);
    bool known = false;
    for (size_t i = 0; effort && i < CV_ARRAY_LEN(efforts); i++) known |= !strcmp(json_string_value(effort), efforts[i]);
    if (effort && !known)
        return cv_api_fail(err, 400, "reasoning_effort",
                           "reasoning_effort must be one of none, minimal, low, medium, high, xhigh or max, got '%.32s'",
                           json_string_value(effort));
    if (!kw && !effort) return 0;
    *out = kw ? json_copy(kw) : json_object();
    if (!effort) return 0;
    json_object_set(*out, "reasoning_effort", effort);
    if (!strcmp(json_string_value(effort), "none") && !json_object_get(*out, "enable_thinking"))
        json_object_set_new(*out, "enable_thinking", json_false());
    return 0;
}

/* tools and tool_choice (vLLM's validation and messages), and whether the output is parsed for
 * tool calls. vLLM forces "required" and named choices with structured outputs; without those here,
 * they read the model's own tool-call syntax, so they need a --tool-call-parser too. */
static int chat_tools(const json_t *o, const cv_api_chat_config *cfg, cv_api_request *req, cv_api_error *err) {
    json_t *tools = field(o, "tools");
    const char *named = NULL, *param;
    if (cv_tool_choice_resolve(tools, field(o, "tool_choice"), cfg->auto_tool_choice && cfg->has_tool_parser,
                               &req->tool_choice, &named, &param))
        return cv_api_fail(err, 400, param, "%s", cvllm_last_error());
    req->parallel_tool_calls = true;
    if (get_bool(o, "parallel_tool_calls", &req->parallel_tool_calls, err)) return -1;
    if (req->tool_choice == CV_TOOL_CHOICE_NONE) return 0;
    if (!cfg->has_tool_parser)
        return cv_api_fail(err, 400, "tool_choice",
                           "tool_choice %s%.64s%s needs --tool-call-parser on this server (vLLM forces it with "
                           "structured outputs, which are not supported yet)",
                           named ? "'" : "", named ? named : "\"required\"", named ? "'" : "");
    req->parse_tool_calls = true;
    req->tool_parser = cfg->tool_parser;
    req->tools = json_incref(tools);
    return 0;
}

/* /tokenize takes tools without a tool_choice; they are vetted as for a chat completion, except that
 * an empty list is fine: TokenizeChatRequest has no check_tool_usage validator. */
static int check_tools(const json_t *tools, cv_api_error *err) {
    if (json_is_array(tools) && json_array_size(tools) == 0) return 0;
    cv_tool_choice choice;
    const char *named, *param;
    if (cv_tool_choice_resolve(tools, NULL, true, &choice, &named, &param))
        return cv_api_fail(err, 400, param, "%s", cvllm_last_error());
    return 0;
}

/* Renders the conversation with the server's chat template into the request's one prompt, as vLLM
 * does for /v1/chat/completions (`generation`: tool_choice and the output parsers are settled too)
 * and for the chat form of /tokenize, whose TokenizeChatRequest has no documents or reasoning_effort. */
static int parse_chat_prompt(const json_t *o, const cv_api_limits *lim, bool generation, cv_api_request *req,
                             cv_api_error *err) {
    const cv_api_chat_config *cfg = lim->chat;
    json_t *messages = field(o, "messages"), *docs = generation ? field(o, "documents") : NULL;
    if (!messages) return cv_api_fail(err, 400, "messages", "'messages' is required");
    if (!json_is_array(messages)) return wrong_type(err, "messages", "a list of messages", messages);
    if (json_array_size(messages) == 0) return cv_api_fail(err, 400, "messages", "'messages' must not be empty");
    if (docs && !json_is_array(docs)) return wrong_type(err, "documents", "a list of documents", docs);
    if (field(o, "chat_template"))
        return cv_api_fail(err, 400, "chat_template",
                           "Chat template is passed with request, but --trust-request-chat-template is not set. "
                           "Refused request with untrusted chat template.");
    if (!cfg || !cfg->tmpl) return cv_api_fail(err, 400, NULL, "%s", NO_TEMPLATE);
    bool add_generation_prompt = true, continue_final = false;
    if (get_bool(o, "add_generation_prompt", &add_generation_prompt, err) ||
        get_bool(o, "continue_final_message", &continue_final, err))
        return -1;
    if (continue_final && add_generation_prompt)
        return cv_api_fail(err, 400, "continue_final_message",
                           "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    if (generation ? chat_tools(o, cfg, req, err) : check_tools(field(o, "tools"), err)) return -1;
    json_t *kwargs;
    if (chat_kwargs(o, generation, &kwargs, err)) return -1;
    cv_chat_request cr = {.messages = messages, .tools = field(o, "tools"), .documents = docs,
                          .default_kwargs = cfg->default_kwargs, .kwargs = kwargs,
                          .add_generation_prompt = add_generation_prompt, .continue_final_message = continue_final,
                          .content_format = cfg->content_format};
    cv_api_prompt p = {0};
    int rc = cv_chat_render(cfg->tmpl, &cr, &p.text, &p.text_len);
    json_decref(kwargs);
    if (rc) return cv_api_fail(err, 400, NULL, "%s", cvllm_last_error());
    add_prompt(req, p);
    if (!generation) return 0;
    req->parse_reasoning = cfg->reasoning_parser;
    req->starts_in_reasoning = cfg->reasoning_parser && cv_reasoning_prompt_opens(p.text, p.text_len);
    req->reasoning_content = cfg->reasoning_content;
    req->include_reasoning = true;
    return get_bool(o, "include_reasoning", &req->include_reasoning, err);
}

static int parse_chat_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    if (parse_common(o, lim, req, err) || parse_chat_prompt(o, lim, true, req, err)) return -1;
    bool logprobs = false, max_given = false;
    req->max_tokens = -1;
    if (get_int64(o, "max_tokens", &req->max_tokens, &max_given, err)) return -1;
    if (field(o, "max_completion_tokens") && get_int64(o, "max_completion_tokens", &req->max_tokens, &max_given, err)) return -1;
    if (max_given && req->max_tokens < 1)
        return cv_api_fail(err, 400, "max_tokens", "max_tokens must be at least 1, got %lld.", (long long)req->max_tokens);
    if (get_bool(o, "echo", &req->echo, err) || get_bool(o, "logprobs", &logprobs, err)) return -1;
    int32_t top = -1;
    if (get_int32(o, "top_logprobs", &top, err)) return -1;
    if (top < -1 || (top == -1 && field(o, "top_logprobs")))
        return cv_api_fail(err, 400, "top_logprobs", "top_logprobs must be non-negative, got %d.", top);
    if (top > 0 && !logprobs)
        return cv_api_fail(err, 400, "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.");
    req->top_logprobs = logprobs ? (top < 0 ? 0 : top) : -1;
    req->params.logprobs = req->top_logprobs;
    if (req->echo) chat_echo_text(json_object_get(o, "messages"), req);
    return 0;
}

int cv_api_parse_chat(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_CHAT;
    json_t *root = parse_body(body, len, err);
    if (!root) return -1;
    int rc = parse_chat_fields(root, lim, req, err);
    if (!rc) log_ignored_fields(root, GENERATE_FIELDS, CHAT_FIELDS);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* /tokenize and /detokenize                                                                         */

static int parse_tokenize_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    req->add_special_tokens = true;
    if (get_string(o, "model", &req->model, err) || get_bool(o, "add_special_tokens", &req->add_special_tokens, err) ||
        get_bool(o, "return_token_strs", &req->return_token_strs, err))
        return -1;
    if (json_object_get(o, "messages")) {
        req->kind = CV_API_CHAT;
        return parse_chat_prompt(o, lim, false, req, err);
    }
    json_t *v = field(o, "prompt");
    if (!v) return cv_api_fail(err, 400, "prompt", "'prompt' or 'messages' is required");
    if (!json_is_string(v)) return wrong_type(err, "prompt", "a string", v);
    add_prompt(req, text_prompt(v));
    return 0;
}

int cv_api_parse_tokenize(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                          cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_COMPLETION;
    json_t *root = parse_body(body, len, err);
    if (!root) return -1;
    int rc = parse_tokenize_fields(root, lim, req, err);
    if (!rc) log_ignored_fields(root, req->kind == CV_API_CHAT ? TOKENIZE_CHAT_FIELDS : TOKENIZE_PROMPT_FIELDS, NULL);
    json_decref(root);
    return rc;
}

int cv_api_parse_detokenize(const char *body, size_t len, cv_api_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    json_t *root = parse_body(body, len, err);
    if (!root) return -1;
    int rc = get_string(root, "model", &req->model, err);
    json_t *v = field(root, "tokens");
    cv_api_prompt p = {0};
    if (!rc && !v) rc = cv_api_fail(err, 400, "tokens", "'tokens' is required");
    if (!rc && !json_is_array(v)) rc = wrong_type(err, "tokens", "a list of integers", v);
    if (!rc) rc = id_list(v, "tokens", SIZE_MAX, &p.ids, &p.n_ids, err);
    if (!rc) add_prompt(req, p);
    if (!rc) log_ignored_fields(root, DETOKENIZE_FIELDS, NULL);
    json_decref(root);
    return rc;
}

void cv_api_request_free(cv_api_request *req) {
    for (size_t i = 0; i < req->n_prompts; i++) {
        free(req->prompts[i].text);
        free(req->prompts[i].ids);
    }
    free(req->prompts);
    for (size_t i = 0; i < req->params.n_stop; i++) free(req->stop[i]);
    free(req->stop);
    free(req->stop_token_ids);
    free(req->bias_ids);
    free(req->bias_values);
    free(req->model);
    free(req->echo_text);
    free(req->cache_salt);
    free(req->request_id);
    json_decref(req->tools);
    memset(req, 0, sizeof *req);
}

/* ------------------------------------------------------------------------------------------------ */
/* Tokenizing and the context-length rules                                                          */

static int tokenize_prompt(cv_api_prompt *p, const cvllm_tokenizer *tok, cv_api_error *err) {
    if (p->ids) return 0;
    if (cvllm_tokenize(tok, p->text, p->text_len, &p->ids, &p->n_ids) != CVLLM_OK)
        return cv_api_fail(err, 400, "prompt", "%s", cvllm_last_error());
    return 0;
}

static int check_prompt(const cv_api_request *req, cv_api_prompt *p, const cv_api_limits *lim, cv_api_error *err) {
    const char *param = req->kind == CV_API_CHAT ? "messages" : "prompt";
    int64_t L = lim->max_model_len, P = (int64_t)p->n_ids, M = req->max_tokens;
    if (P == 0) return cv_api_fail(err, 400, param, "The decoder prompt cannot be empty");
    for (size_t i = 0; i < p->n_ids; i++)
        if (p->ids[i] < 0 || p->ids[i] >= lim->vocab_size)
            return cv_api_fail(err, 400, param, "Token id %d is out of vocabulary", p->ids[i]);
    if (P >= L)
        return cv_api_fail(err, 400, param,
                           "This model's maximum context length is %lld tokens. However, your request has %lld input "
                           "tokens. Please reduce the length of the input messages.",
                           (long long)L, (long long)P);
    if (M == -1) {
        M = L - P;
    } else if (P + M > L) {
        return cv_api_fail(err, 400, "max_tokens",
                           "'max_tokens' or 'max_completion_tokens' is too large: %lld. This model's maximum context "
                           "length is %lld tokens and your request has %lld input tokens (%lld > %lld - %lld).",
                           (long long)M, (long long)L, (long long)P, (long long)M, (long long)L, (long long)P);
    }
    if (lim->gen_max_tokens > 0 && M > lim->gen_max_tokens) M = lim->gen_max_tokens;
    p->max_tokens = (int32_t)(M == 0 ? 1 : M); /* M == 0 only with echo: one token, then dropped */
    return 0;
}

int cv_api_prepare(cv_api_request *req, const cvllm_tokenizer *tok, const cv_api_limits *lim, cv_api_error *err) {
    req->echo_only = req->kind == CV_API_COMPLETION && req->echo && req->max_tokens == 0;
    for (size_t i = 0; i < req->n_prompts; i++)
        if (tokenize_prompt(&req->prompts[i], tok, err) || check_prompt(req, &req->prompts[i], lim, err)) return -1;
    return 0;
}

cvllm_sampling_params cv_api_prompt_params(const cv_api_request *req, size_t prompt_index) {
    cvllm_sampling_params p = req->params;
    p.max_tokens = req->prompts[prompt_index].max_tokens;
    p.prompt_logprobs = req->prompt_logprobs;
    if (req->echo_only) p.min_tokens = 0;
    return p;
}
