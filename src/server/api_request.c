/*
 * api_request.c — request JSON → cv_api_request (see api.h).
 *
 * Every field is read with vLLM's pydantic model semantics (api_fields.h): lax-mode conversions, null
 * as "not given" only where the model says `| None`, and refusals in vLLM's words. A request is
 * judged in vLLM's order:
 *   1. the model's `mode="before"` validators, which look at the raw body (stream_options without
 *      stream, the logprobs family, cache_salt, the prompt, tool usage); their VLLMValidationErrors
 *      arrive through the validation handler as a value_error on the whole body;
 *   2. field validation: types, Literals and Field constraints (ge/le, min/max length), reported as
 *      pydantic's error list. pydantic lists every failing field at once; cvllm stops at the first
 *      one in vLLM's field order, so a reply holds one error (or the several that one union field
 *      produces, one per member, as pydantic prints them);
 *   3. what vLLM's serving code checks once the model is valid (context length, vocabulary, features
 *      this backend lacks), as BadRequestError with vLLM's message where vLLM has one.
 * Unknown fields are ignored and logged as vLLM logs them (log_ignored_fields). Sizes that would make
 * the server allocate without bound (n, the number of prompts, stop and bad_words lists) are capped
 * before anything is allocated for them.
 *
 * Where vLLM's validation is lazy or spread over a union of message types (chat messages, content
 * parts, assistant tool_calls), the error reported is the one of the member the value's own `role` or
 * `type` names, located where the value sits (messages.0.content.1.text); vLLM would list the errors
 * of every member it tried.
 *
 * Fields that do change the output but have no effect here are not dropped: prompt_embeds, kv/ec
 * transfer params, mm_processor_kwargs (a text-only model), logprob_token_ids, repetition_detection,
 * thinking_token_budget and watermarking are refused. Fields that only label a request
 * (user, session_id, request_id) or only shape its delivery (stream_interval) are type-checked and
 * kept or ignored. vllm_xargs is validated as dict[str, str | int | float | list[str | int | float]]
 * and has no effect, as in vLLM without custom logits processors; nothing of it is kept.
 *
 * Chat requests are rendered here with the server's chat template (see api.h), or under
 * --trust-request-chat-template with the request's own, compiled for it; the template's own errors
 * (parse errors of a request's template too), raise_exception() messages included, are 400s
 * carrying its message.
 *
 * response_format, structured_outputs and a forced tool choice become the request's one constraint
 * (the "Structured outputs" section says in which steps vLLM reads them); cv_api_prepare decides from
 * which token it applies, the server compiles it.
 *
 * Context-length rules (cv_api_prepare) follow vLLM 0.10–0.11, whose two messages clients match on
 * ("maximum context length", "is too large"):
 *   - a prompt of P >= L tokens is rejected;
 *   - a max_tokens M that is given (completions always give one: 16 by default) must satisfy
 *     P + M <= L;
 *   - chat without max_tokens generates up to L - P tokens, capped by generation_config's
 *     max_new_tokens.
 * truncate_prompt_tokens applies first, as vLLM's TokenizeParams does: K (or, for -1, L minus the
 * requested max_tokens) prompt tokens are kept, the last ones unless truncation_side is "right".
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
#include "server/api_fields.h"
#include "server/api_internal.h"

/* MAX_STOP_STRINGS and MAX_BAD_WORDS: vLLM's VLLM_MAX_STOP_STRINGS now defaults to 4, which cvllm does
 * not follow (clients send more); VLLM_MAX_NUM_BAD_WORDS is 128. */
enum { MAX_STOP_STRINGS = 64, MAX_BAD_WORDS = 128, MAX_ID_LIST = 4096, MAX_LOGIT_BIAS = 4096, CACHE_SALT_CHARS = 128 };

static const char VVE[] = "VLLMValidationError";

/* The error type vLLM sends with a status: its serving code's names where it answers with them,
 * otherwise Python's HTTPStatus phrase, as its HTTPException handler sends (405 "Method Not Allowed",
 * 415 "Unsupported Media Type" from validate_json_request up to vLLM 0.11). */
static const char *error_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 404: return "NotFoundError";
    case 413: return "RequestEntityTooLarge"; /* vLLM has no body limit to compare with */
    case 500: return "InternalServerError";
    case 501: return "NotImplementedError";
    case 503: return "ServiceUnavailableError";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 414: return "Request-URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 505: return "HTTP Version Not Supported";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

int cv_api_fail(cv_api_error *err, int status, const char *param, const char *fmt, ...) {
    err->status = status;
    err->type = error_type(status);
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
/* Small helpers                                                                                     */

static json_t *field(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* Python's truth value of a JSON value, as vLLM's validators test `data.get(...)`. */
static bool truthy(const json_t *v) {
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return true;
    default: return false;
    }
}

/* isinstance(v, (int, float)): numbers and booleans. */
static bool is_number(const json_t *v) { return json_is_number(v) || json_is_boolean(v); }
static double number(const json_t *v) { return json_is_boolean(v) ? json_is_true(v) : json_number_value(v); }

static bool in_list(const char *s, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, list[i])) return true;
    return false;
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
/* EmbeddingCompletionRequest (vllm/entrypoints/pooling/embed/protocol.py and its base mixins). */
static const char *const EMBEDDING_FIELDS[] = {
    "model", "input", "user", "truncate_prompt_tokens", "truncation_side", "padding", "request_id", "priority",
    "mm_processor_kwargs", "cache_salt", "add_special_tokens", "encoding_format", "embed_dtype", "endianness",
    "dimensions", "use_activation", NULL};
/* ClassificationCompletionRequest (pooling/classify/protocol.py) and PoolingCompletionRequest
 * (pooling/pooling/protocol.py): the embeddings' base fields, and their own. */
static const char *const CLASSIFY_FIELDS[] = {
    "model", "input", "user", "truncate_prompt_tokens", "truncation_side", "padding", "request_id", "priority",
    "mm_processor_kwargs", "cache_salt", "add_special_tokens", "use_activation", NULL};
static const char *const POOLING_FIELDS[] = {
    "model", "input", "user", "truncate_prompt_tokens", "truncation_side", "padding", "request_id", "priority",
    "mm_processor_kwargs", "cache_salt", "add_special_tokens", "encoding_format", "embed_dtype", "endianness",
    "dimensions", "use_activation", "task", NULL};
/* CohereEmbedRequest (pooling/embed/cohere/protocol.py). */
static const char *const COHERE_FIELDS[] = {"model", "input_type", "texts", "images", "inputs", "output_dimension",
                                            "embedding_types", "truncate", "max_tokens", "priority", NULL};
/* ScoreRequest and RerankRequest (vllm/entrypoints/pooling/scoring/protocol.py and its mixins). */
static const char *const SCORE_FIELDS[] = {
    "model", "user", "truncate_prompt_tokens", "truncation_side", "request_id", "priority", "use_activation",
    "instruction", "chat_template_kwargs", "max_tokens_per_query", "max_tokens_per_doc", "mm_processor_kwargs",
    "queries", "documents", "items", "data_1", "data_2", "text_1", "text_2", NULL};
static const char *const RERANK_FIELDS[] = {"query", "documents", "top_n", "return_documents", NULL};
static const char *const EMBEDDING_CHAT_FIELDS[] = {
    "messages", "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
    "media_io_kwargs", NULL};

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
/* vLLM's before-validators: the raw body, before any field is validated                            */

/* validate_cache_salt: a non-empty string of at most 128 characters without '@', '/', '\' or NUL
 * (they would reach cache backends' keys). */
static int check_cache_salt(const json_t *o, cv_api_error *err) {
    const json_t *salt = field(o, "cache_salt");
    if (!salt) return 0;
    if (!json_is_string(salt) || json_string_length(salt) == 0)
        return cv_api_value_error(err, o, VVE, "cache_salt", NULL, "Parameter 'cache_salt' must be a non-empty string if provided.");
    const char *s = json_string_value(salt);
    size_t len = json_string_length(salt), chars = 0;
    bool forbidden = false;
    for (size_t i = 0; i < len; i++) {
        chars += ((unsigned char)s[i] & 0xC0) != 0x80;
        forbidden |= s[i] == '@' || s[i] == '/' || s[i] == '\\' || s[i] == '\0';
    }
    if (chars > CACHE_SALT_CHARS || forbidden)
        return cv_api_value_error(err, o, VVE, "cache_salt", NULL,
                                  "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', "
                                  "'/', '\\\\', or NUL.");
    return 0;
}

static int check_stream_options(const json_t *o, cv_api_error *err) {
    if (truthy(json_object_get(o, "stream_options")) && !truthy(json_object_get(o, "stream")))
        return cv_api_value_error(err, o, VVE, "stream_options", NULL, "Stream options can only be defined when `stream=True`.");
    return 0;
}

/* check_logprobs, on prompt_logprobs and the field holding the logprob count: "logprobs" for
 * completions, "top_logprobs" for chat (where "logprobs" is the boolean switch). */
static int check_logprobs(const json_t *o, bool chat, cv_api_error *err) {
    const json_t *ids = field(o, "logprob_token_ids"), *logprobs = field(o, "logprobs");
    if (json_is_array(ids)) {
        const json_t *max = json_object_get(o, "max_tokens");
        if (json_array_size(ids) == 0)
            return cv_api_value_error(err, o, VVE, "logprob_token_ids", NULL, "`logprob_token_ids` must not be an empty list.");
        if (truthy(json_object_get(o, "use_beam_search")))
            return cv_api_value_error(err, o, VVE, "logprob_token_ids", NULL,
                                      "`logprob_token_ids` is not supported with beam search.");
        if (!chat && truthy(json_object_get(o, "echo")) && is_number(max) && number(max) == 0)
            return cv_api_value_error(err, o, VVE, "logprob_token_ids", NULL,
                                      "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no "
                                      "output tokens are generated.");
        if (chat ? !truthy(logprobs) : !logprobs)
            return cv_api_value_error(err, o, VVE, "logprob_token_ids", NULL,
                                      "when using `logprob_token_ids`, `logprobs` must be set%s.", chat ? " to true" : "");
    }
    const char *names[] = {"prompt_logprobs", chat ? "top_logprobs" : "logprobs"};
    for (size_t i = 0; i < CV_ARRAY_LEN(names); i++) {
        const json_t *v = field(o, names[i]);
        if (v && !is_number(v)) return cv_api_value_error(err, o, VVE, names[i], v, "`%s` must be an integer.", names[i]);
    }
    const json_t *pl = field(o, "prompt_logprobs"), *top = field(o, names[1]);
    if (pl && truthy(json_object_get(o, "stream")) && (number(pl) > 0 || number(pl) == -1))
        return cv_api_value_error(err, o, VVE, "prompt_logprobs", NULL, "`prompt_logprobs` are not available when `stream=True`.");
    if (pl && number(pl) < 0 && number(pl) != -1)
        return cv_api_value_error(err, o, VVE, "prompt_logprobs", pl, "`prompt_logprobs` must be a positive value or -1.");
    if (top && number(top) < 0 && number(top) != -1)
        return cv_api_value_error(err, o, VVE, names[1], top, "`%s` must be a positive value or -1.", names[1]);
    if (chat && top && (number(top) == -1 || number(top) > 0) && !truthy(logprobs))
        return cv_api_value_error(err, o, VVE, "top_logprobs", NULL, "when using `top_logprobs`, `logprobs` must be set to true.");
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Fields shared by completions and chat                                                            */

/* stop: str | list[str] (at most MAX_STOP_STRINGS) | None. */
static int parse_stop(const json_t *o, cv_api_request *req, cv_api_error *err) {
    const json_t *v = field(o, "stop");
    if (!v) return 0;
    if (json_is_string(v)) {
        req->stop = cv_xcalloc(1, sizeof *req->stop);
        req->stop[0] = cv_xstrndup(json_string_value(v), json_string_length(v));
        req->params.n_stop = 1;
        return 0;
    }
    size_t n;
    char **strs = NULL;
    cv_loc at = {NULL, "stop", 0}, as_list = {&at, "list[str]", 0};
    bool list_ok = json_is_array(v) && json_array_size(v) <= MAX_STOP_STRINGS;
    for (size_t i = 0; list_ok && i < json_array_size(v); i++) list_ok = json_is_string(json_array_get(v, i));
    if (list_ok) {
        cv_api_error unused;
        cv_get_strs(o, NULL, "stop", 0, MAX_STOP_STRINGS, &strs, &n, &unused);
        req->stop = strs;
        req->params.n_stop = n;
        return 0;
    }
    /* Neither member of the union: pydantic lists what each one said. */
    cv_pyerrors l = {0};
    cv_loc as_str = {&at, "str", 0};
    cv_pyerrors_add(&l, &as_str, v, "string_type", CV_PY_STRING_TYPE, NULL);
    if (!json_is_array(v)) {
        cv_pyerrors_add(&l, &as_list, v, "list_type", CV_PY_LIST_TYPE, NULL);
        return cv_pyerrors_fail(&l, err);
    }
    size_t bad = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *item = json_array_get(v, i);
        cv_loc item_at = {&as_list, NULL, i};
        if (!json_is_string(item)) bad++, cv_pyerrors_add(&l, &item_at, item, "string_type", CV_PY_STRING_TYPE, NULL);
    }
    if (!bad) cv_pyerrors_too_long(&l, &as_list, v, MAX_STOP_STRINGS);
    return cv_pyerrors_fail(&l, err);
}

/* logit_bias: dict[str, float] | None, then vLLM's serving check that each key is a token id. */
static int parse_logit_bias(const json_t *o, cv_api_request *req, cv_api_error *err) {
    const json_t *v;
    if (cv_check_dict(o, NULL, "logit_bias", CV_OPTIONAL, &v, err)) return -1;
    if (!v) return 0;
    size_t n = json_object_size(v), i = 0;
    if (n > MAX_LOGIT_BIAS)
        return cv_api_fail(err, 400, "logit_bias", "'logit_bias' has %zu entries, at most %d are allowed", n, MAX_LOGIT_BIAS);
    req->bias_ids = cv_xmalloc((n ? n : 1) * sizeof *req->bias_ids);
    req->bias_values = cv_xmalloc((n ? n : 1) * sizeof *req->bias_values);
    cv_loc at = {NULL, "logit_bias", 0};
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        double b;
        cv_pyfailure f;
        cv_loc key_at = {&at, key, 0};
        if (!cv_py_float(val, &b, &f)) return cv_api_pyfail(err, &key_at, val, f.type, f.msg, NULL);
        /* OpenAI's documented range; vLLM clamps rather than rejects. */
        req->bias_values[i++] = (float)(b < -100 ? -100 : b > 100 ? 100 : b);
    }
    i = 0;
    json_object_foreach((json_t *)v, key, val) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (end == key || *end || id < INT32_MIN || id > INT32_MAX)
            return cv_api_fail(err, 400, "logit_bias",
                               "Found token_id `%.64s` in logit_bias but token_id must be an integer or string representing an integer", key);
        req->bias_ids[i++] = (int32_t)id;
    }
    req->params.n_logit_bias = n;
    return 0;
}

/* stream_options: StreamOptions | None (include_usage, continuous_usage_stats: bool | None). */
static int parse_stream_options(const json_t *o, cv_api_request *req, cv_api_error *err) {
    const json_t *so = field(o, "stream_options");
    if (!so) return 0;
    cv_loc at = {NULL, "stream_options", 0};
    if (!json_is_object(so)) {
        cv_pyerrors l = {0};
        cv_pyerrors_model_type(&l, &at, so, "StreamOptions");
        return cv_pyerrors_fail(&l, err);
    }
    return cv_get_bool(so, &at, "include_usage", CV_OPTIONAL, &req->include_usage, err) ||
           cv_get_bool(so, &at, "continuous_usage_stats", CV_OPTIONAL, &req->continuous_usage, err);
}

/* vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None. */
static bool xarg_scalar(const json_t *v) { return json_is_string(v) || is_number(v); }

static void xarg_scalar_errors(cv_pyerrors *l, const cv_loc *at, const json_t *v) {
    cv_loc as_str = {at, "str", 0}, as_int = {at, "int", 0}, as_float = {at, "float", 0};
    cv_pyerrors_add(l, &as_str, v, "string_type", CV_PY_STRING_TYPE, NULL);
    cv_pyerrors_add(l, &as_int, v, "int_type", CV_PY_INT_TYPE, NULL);
    cv_pyerrors_add(l, &as_float, v, "float_type", CV_PY_FLOAT_TYPE, NULL);
}

static int check_vllm_xargs(const json_t *o, cv_api_error *err) {
    const json_t *x;
    if (cv_check_dict(o, NULL, "vllm_xargs", CV_OPTIONAL, &x, err)) return -1;
    cv_loc at = {NULL, "vllm_xargs", 0};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)x, key, v) {
        bool ok = xarg_scalar(v) || json_is_array(v);
        for (size_t i = 0; ok && json_is_array(v) && i < json_array_size(v); i++) ok = xarg_scalar(json_array_get(v, i));
        if (ok) continue;
        cv_pyerrors l = {0};
        cv_loc key_at = {&at, key, 0}, as_list = {&key_at, "list[union[str,int,float]]", 0};
        xarg_scalar_errors(&l, &key_at, v);
        if (!json_is_array(v)) cv_pyerrors_add(&l, &as_list, v, "list_type", CV_PY_LIST_TYPE, NULL);
        for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) {
            cv_loc item_at = {&as_list, NULL, i};
            if (!xarg_scalar(json_array_get(v, i))) xarg_scalar_errors(&l, &item_at, json_array_get(v, i));
        }
        return cv_pyerrors_fail(&l, err);
    }
    return 0;
}

/* Fields whose effect this backend does not have: refused rather than silently dropped, once every
 * field has been validated. Their own values are type-checked first, as pydantic does. */
static int check_unsupported(const json_t *o, cv_api_request *req, cv_api_error *err) {
    bool watermarking = false;
    int64_t budget = -1;
    const json_t *kv, *ec, *ids = NULL;
    int32_t *unused_ids = NULL;
    size_t n_ids = 0;
    if (cv_get_bool(o, NULL, "use_beam_search", 0, &req->beam_search, err) ||
        cv_get_bool(o, NULL, "watermarking", CV_OPTIONAL, &watermarking, err) ||
        cv_get_ids(o, NULL, "logprob_token_ids", CV_OPTIONAL, SIZE_MAX, &unused_ids, &n_ids, err) ||
        cv_check_dict(o, NULL, "kv_transfer_params", CV_OPTIONAL, &kv, err) ||
        cv_check_dict(o, NULL, "ec_transfer_params", CV_OPTIONAL, &ec, err) ||
        cv_get_int(o, NULL, "thinking_token_budget", CV_OPTIONAL, &budget, NULL, err))
        return -1;
    ids = field(o, "logprob_token_ids");
    free(unused_ids);
    if (watermarking) return cv_api_fail(err, 400, "watermarking", "watermarking is not supported by this server");
    if (ids) return cv_api_fail(err, 400, "logprob_token_ids", "logprob_token_ids is not supported by this server");
    if (field(o, "repetition_detection"))
        return cv_api_fail(err, 400, "repetition_detection", "repetition_detection is not supported by this server");
    if (budget != -1)
        return cv_api_fail(err, 400, "thinking_token_budget", "thinking_token_budget is not supported by this server");
    /* vLLM hands non-empty transfer params to its KV / encoder-cache connector. */
    if (truthy(kv))
        return cv_api_fail(err, 400, "kv_transfer_params",
                           "kv_transfer_params needs a KV transfer connector (vLLM's --kv-transfer-config), which this "
                           "server does not have");
    if (truthy(ec))
        return cv_api_fail(err, 400, "ec_transfer_params",
                           "ec_transfer_params needs an encoder cache transfer connector (vLLM's --ec-transfer-config), "
                           "which this server does not have");
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Structured outputs                                                                                */

/* vLLM reads response_format, structured_outputs and a forced tool choice in three places, and
 * cvllm follows each:
 *   1. before-validators on the raw body: a json_schema format needs its json_schema; at most one of
 *      json / regex / choice in structured_outputs;
 *   2. field validation: response_format as the union ResponseFormat | StructuralTagResponseFormat |
 *      LegacyStructuralTagResponseFormat (every member's errors when none fits), structured_outputs
 *      as the StructuredOutputsParams dataclass, whose __post_init__ wants exactly one constraint;
 *   3. building the sampling params: a "required" or named tool choice replaces structured_outputs
 *      with a schema made from the tools (the tool parser's adjust_request), then response_format
 *      is merged over it (structured_outputs_from_response_format; a structural tag format becomes
 *      structural_tag, the JSON text of the format as validated), and the result must again hold
 *      exactly one constraint. Those failures are BadRequestErrors with the dataclass's words. */

static const char *const SO_CONSTRAINTS[] = {"json", "regex", "choice", "grammar", "json_object", "structural_tag"};

/* What a request asked for, from field validation until the tools are known. */
typedef struct structured_in {
    json_t *so;              /* structured_outputs as the dataclass holds it (see so_dict), or NULL */
    const char *rf;          /* response_format type when it constrains: "json_object", "json_schema" or
                              * "structural_tag" */
    json_t *rf_schema;       /* json_schema.schema (a reference), or NULL */
    json_t *rf_tag;          /* structural_tag: the format as its model dumps it, or NULL */
} structured_in;

static void structured_in_free(structured_in *in) {
    json_decref(in->so);
    json_decref(in->rf_schema);
    json_decref(in->rf_tag);
    *in = (structured_in){0};
}

/* StructuredOutputsParams' fields in declaration order, unset. Its repr (jinja_py_repr) is the dict
 * __post_init__ prints in its messages. */
static json_t *so_dict(void) {
    return json_pack("{s:n, s:n, s:n, s:n, s:n, s:b, s:b, s:n, s:n}", "json", "regex", "choice", "grammar",
                     "json_object", "disable_any_whitespace", 0, "disable_additional_properties", 0,
                     "whitespace_pattern", "structural_tag");
}

static size_t so_count(const json_t *so) {
    size_t n = 0;
    for (size_t i = 0; i < CV_ARRAY_LEN(SO_CONSTRAINTS); i++) n += !json_is_null(json_object_get(so, SO_CONSTRAINTS[i]));
    return n;
}

/* __post_init__'s message when `so` does not hold exactly one constraint; NULL when it does. */
static char *so_count_error(const json_t *so) {
    size_t n = so_count(so);
    if (n == 1) return NULL;
    char *shown = jinja_py_repr(so);
    char *msg = cv_xasprintf(n > 1 ? "You can only use one kind of structured outputs constraint but multiple are "
                                     "specified: %s"
                                   : "You must use one kind of structured outputs constraint but none are specified: %s",
                             shown);
    free(shown);
    return msg;
}

/* The before-validators: ChatCompletionRequest's and CompletionRequest's validate_response_format and
 * check_structured_outputs_count. */
static int check_structured(const json_t *o, cv_api_error *err) {
    const json_t *rf = field(o, "response_format"), *so = field(o, "structured_outputs");
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (type && !strcmp(type, "json_schema") && !field(rf, "json_schema"))
        return cv_api_value_error(err, o, VVE, "response_format", NULL,
                                  "When response_format type is 'json_schema', the 'json_schema' field must be provided.");
    if (!json_is_object(so)) return 0; /* field validation words the type error */
    int n = 0;
    for (size_t i = 0; i < 3; i++) n += field(so, SO_CONSTRAINTS[i]) != NULL;
    if (n > 1)
        return cv_api_value_error(err, o, VVE, "structured_outputs", NULL,
                                  "You can only use one kind of constraints for structured outputs ('json', 'regex' or "
                                  "'choice').");
    return 0;
}

/* One field of a union member, checked into the member's error list (pydantic lists them all). */
static void member_missing(cv_pyerrors *l, const json_t *o, const cv_loc *at, const char *key) {
    cv_loc key_at = {at, key, 0};
    if (!json_object_get(o, key)) cv_pyerrors_add(l, &key_at, o, "missing", CV_PY_MISSING, NULL);
}

static void member_str(cv_pyerrors *l, const json_t *o, const cv_loc *at, const char *key, bool required) {
    const json_t *v = json_object_get(o, key);
    cv_loc key_at = {at, key, 0};
    if (required) member_missing(l, o, at, key);
    if (v && !json_is_string(v) && (required || !json_is_null(v)))
        cv_pyerrors_add(l, &key_at, v, "string_type", CV_PY_STRING_TYPE, NULL);
}

static void member_literal(cv_pyerrors *l, const json_t *o, const cv_loc *at, const char *const *choices, size_t n,
                           const char *expected) {
    const json_t *v = json_object_get(o, "type");
    cv_loc type_at = {at, "type", 0};
    if (!v) {
        cv_pyerrors_add(l, &type_at, o, "missing", CV_PY_MISSING, NULL);
        return;
    }
    if (json_is_string(v) && in_list(json_string_value(v), choices, n)) return;
    char msg[96], ctx[96];
    snprintf(msg, sizeof msg, "Input should be %s", expected);
    snprintf(ctx, sizeof ctx, "{'expected': \"%s\"}", expected);
    cv_pyerrors_add(l, &type_at, v, "literal_error", msg, ctx);
}

/* list[str] / list[Model] fields of LegacyStructuralTagResponseFormat. */
static void member_list(cv_pyerrors *l, const json_t *o, const cv_loc *at, const char *key, bool of_tags) {
    const json_t *v = json_object_get(o, key);
    cv_loc key_at = {at, key, 0};
    if (!v) {
        cv_pyerrors_add(l, &key_at, o, "missing", CV_PY_MISSING, NULL);
        return;
    }
    if (!json_is_array(v)) {
        cv_pyerrors_add(l, &key_at, v, "list_type", CV_PY_LIST_TYPE, NULL);
        return;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *item = json_array_get(v, i);
        cv_loc item_at = {&key_at, NULL, i};
        if (!of_tags) {
            if (!json_is_string(item)) cv_pyerrors_add(l, &item_at, item, "string_type", CV_PY_STRING_TYPE, NULL);
        } else if (!json_is_object(item)) {
            cv_pyerrors_model_type(l, &item_at, item, "LegacyStructuralTag");
        } else {
            cv_loc schema_at = {&item_at, "schema", 0};
            const json_t *schema = json_object_get(item, "schema");
            member_str(l, item, &item_at, "begin", true);
            if (schema && !json_is_null(schema) && !json_is_object(schema))
                cv_pyerrors_add(l, &schema_at, schema, "dict_type", CV_PY_DICT_TYPE, NULL);
            member_str(l, item, &item_at, "end", true);
        }
    }
}

/* ResponseFormat's errors for `v` (an object) at `at`; none when it is a valid ResponseFormat. */
static void response_format_errors(cv_pyerrors *l, const json_t *v, const cv_loc *at) {
    static const char *const types[] = {"text", "json_object", "json_schema"};
    member_literal(l, v, at, types, CV_ARRAY_LEN(types), "'text', 'json_object' or 'json_schema'");
    const json_t *js = json_object_get(v, "json_schema");
    if (!js || json_is_null(js)) return;
    cv_loc js_at = {at, "json_schema", 0};
    if (!json_is_object(js)) {
        cv_pyerrors_model_type(l, &js_at, js, "JsonSchemaResponseFormat");
        return;
    }
    /* The schema travels under its alias "schema" (vLLM's field is json_schema, aliased). */
    const json_t *schema = json_object_get(js, "schema"), *strict = json_object_get(js, "strict");
    cv_loc schema_at = {&js_at, "schema", 0}, strict_at = {&js_at, "strict", 0};
    bool flag;
    cv_pyfailure f;
    member_str(l, js, &js_at, "name", true);
    member_str(l, js, &js_at, "description", false);
    if (schema && !json_is_null(schema) && !json_is_object(schema))
        cv_pyerrors_add(l, &schema_at, schema, "dict_type", CV_PY_DICT_TYPE, NULL);
    if (strict && !json_is_null(strict) && !cv_py_bool(strict, &flag, &f)) cv_pyerrors_add(l, &strict_at, strict, f.type, f.msg, NULL);
}

/* The dump of a valid legacy structural tag: its fields as LegacyStructuralTagResponseFormat holds
 * them (a structure without a schema has it null). */
static json_t *legacy_tag_dump(const json_t *v) {
    json_t *structures = json_array();
    size_t i;
    const json_t *s;
    json_array_foreach(json_object_get(v, "structures"), i, s) {
        const json_t *schema = json_object_get(s, "schema");
        json_array_append_new(structures, json_pack("{s:O, s:O, s:O}", "begin", json_object_get(s, "begin"), "schema",
                                                    schema ? schema : json_null(), "end", json_object_get(s, "end")));
    }
    return json_pack("{s:s, s:o, s:O}", "type", "structural_tag", "structures", structures, "triggers",
                     json_object_get(v, "triggers"));
}

/* response_format: AnyResponseFormat | None: a ResponseFormat, a StructuralTagResponseFormat
 * ({type, format}) or a LegacyStructuralTagResponseFormat ({type, structures, triggers}); when none
 * fits, pydantic lists what every member said. */
static int read_response_format(const json_t *o, structured_in *in, cv_api_error *err) {
    static const char *const members[] = {"ResponseFormat", "StructuralTagResponseFormat",
                                          "LegacyStructuralTagResponseFormat"};
    static const char *const tag[] = {"structural_tag"};
    const json_t *v = field(o, "response_format");
    if (!v) return 0;
    cv_loc at = {NULL, "response_format", 0}, m0 = {&at, members[0], 0}, m1 = {&at, members[1], 0},
           m2 = {&at, members[2], 0};
    cv_pyerrors l = {0};
    if (!json_is_object(v)) {
        for (size_t i = 0; i < CV_ARRAY_LEN(members); i++) {
            cv_loc m = {&at, members[i], 0};
            cv_pyerrors_model_type(&l, &m, v, members[i]);
        }
        return cv_pyerrors_fail(&l, err);
    }
    response_format_errors(&l, v, &m0);
    if (l.n == 0) {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (strcmp(type, "text") != 0) in->rf = !strcmp(type, "json_object") ? "json_object" : "json_schema";
        in->rf_schema = json_incref(field(field(v, "json_schema"), "schema"));
        return 0;
    }
    size_t before = l.n;
    member_literal(&l, v, &m1, tag, 1, "'structural_tag'");
    member_missing(&l, v, &m1, "format");
    if (l.n == before) {
        free(l.text);
        in->rf = "structural_tag";
        in->rf_tag = json_pack("{s:s, s:O}", "type", "structural_tag", "format", json_object_get(v, "format"));
        return 0;
    }
    before = l.n;
    member_literal(&l, v, &m2, tag, 1, "'structural_tag'");
    member_list(&l, v, &m2, "structures", true);
    member_list(&l, v, &m2, "triggers", false);
    if (l.n == before) {
        free(l.text);
        in->rf = "structural_tag";
        in->rf_tag = legacy_tag_dump(v);
        return 0;
    }
    return cv_pyerrors_fail(&l, err);
}

/* structured_outputs: StructuredOutputsParams | None, a dataclass: its fields' types, then
 * __post_init__'s one-constraint rule. disable_fallback, gone from vLLM's dataclass, is an unknown
 * key it ignores, as it ignores every other. */
static int read_structured_outputs(const json_t *o, structured_in *in, cv_api_error *err) {
    const json_t *v = field(o, "structured_outputs");
    if (!v) return 0;
    cv_loc at = {NULL, "structured_outputs", 0};
    if (!json_is_object(v))
        return cv_api_pyfail(err, &at, v, "dataclass_type", "Input should be a dictionary or an instance of StructuredOutputsParams",
                             "{'class_name': 'StructuredOutputsParams'}");
    const json_t *js = field(v, "json");
    if (js && !json_is_string(js) && !json_is_object(js)) {
        cv_pyerrors l = {0};
        cv_loc json_at = {&at, "json", 0}, as_str = {&json_at, "str", 0}, as_dict = {&json_at, "dict[any,any]", 0};
        cv_pyerrors_add(&l, &as_str, js, "string_type", CV_PY_STRING_TYPE, NULL);
        cv_pyerrors_add(&l, &as_dict, js, "dict_type", CV_PY_DICT_TYPE, NULL);
        return cv_pyerrors_fail(&l, err);
    }
    char **choices = NULL;
    size_t n_choices = 0;
    bool json_object = false, no_whitespace = false, no_additional = false;
    if (cv_check_str(v, &at, "regex", CV_OPTIONAL, NULL, err) ||
        cv_get_strs(v, &at, "choice", CV_OPTIONAL, SIZE_MAX, &choices, &n_choices, err) ||
        cv_check_str(v, &at, "grammar", CV_OPTIONAL, NULL, err) ||
        cv_get_bool(v, &at, "json_object", CV_OPTIONAL, &json_object, err) ||
        cv_get_bool(v, &at, "disable_any_whitespace", 0, &no_whitespace, err) ||
        cv_get_bool(v, &at, "disable_additional_properties", 0, &no_additional, err) ||
        cv_check_str(v, &at, "whitespace_pattern", CV_OPTIONAL, NULL, err) ||
        cv_check_str(v, &at, "structural_tag", CV_OPTIONAL, NULL, err))
        return -1;
    for (size_t i = 0; i < n_choices; i++) free(choices[i]);
    free(choices);
    json_t *so = so_dict();
    static const char *const copied[] = {"json", "regex", "choice", "grammar", "whitespace_pattern", "structural_tag"};
    for (size_t i = 0; i < CV_ARRAY_LEN(copied); i++)
        if (field(v, copied[i])) json_object_set(so, copied[i], field(v, copied[i]));
    if (field(v, "json_object")) json_object_set_new(so, "json_object", json_boolean(json_object));
    json_object_set_new(so, "disable_any_whitespace", json_boolean(no_whitespace));
    json_object_set_new(so, "disable_additional_properties", json_boolean(no_additional));
    char *msg = so_count_error(so);
    if (msg) {
        cv_api_value_error_at(err, &at, v, VVE, "%s", msg);
        free(msg);
        json_decref(so);
        return -1;
    }
    in->so = so;
    return 0;
}

static int read_structured(const json_t *o, structured_in *in, cv_api_error *err) {
    return read_response_format(o, in, err) || read_structured_outputs(o, in, err);
}

/* The schema a forced tool choice imposes (vLLM's get_json_schema_from_tools): a named tool's
 * parameters as they are (NULL when it has none: then nothing is forced); for "required", an array
 * of at least one {name, parameters} object, one anyOf branch per tool, each tool's $defs moved to
 * the top so that its "#/$defs/..." references still resolve there. */
static int tool_schema(const cv_api_request *req, json_t **out, cv_api_error *err) {
    *out = NULL;
    size_t i;
    const json_t *tool;
    if (req->tool_choice == CV_TOOL_CHOICE_NAMED) {
        json_array_foreach(req->tools, i, tool) {
            const json_t *fn = json_object_get(tool, "function");
            if (strcmp(json_string_value(json_object_get(fn, "name")), req->forced_tool) != 0) continue;
            *out = json_deep_copy(field(fn, "parameters"));
            return 0;
        }
        return 0;
    }
    if (req->tool_choice != CV_TOOL_CHOICE_REQUIRED) return 0;
    json_t *branches = json_array(), *defs = json_object();
    json_array_foreach(req->tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function"), *params = field(fn, "parameters");
        json_t *p = json_object_size(params) ? json_deep_copy(params) : json_pack("{s:s, s:{}}", "type", "object", "properties");
        const json_t *tool_defs = json_object_get(p, "$defs");
        const char *name;
        json_t *def;
        json_object_foreach((json_t *)tool_defs, name, def) {
            const json_t *seen = json_object_get(defs, name);
            if (seen && !json_equal(seen, def)) {
                cv_api_fail(err, 400, NULL, "Tool definition '%s' has multiple schemas, which is not supported.", name);
                json_decref(p);
                json_decref(branches);
                json_decref(defs);
                return -1;
            }
            json_object_set(defs, name, def);
        }
        if (json_is_object(tool_defs)) json_object_del(p, "$defs");
        json_array_append_new(branches, json_pack("{s:{s:{s:s, s:[O]}, s:o}, s:[s, s]}", "properties", "name", "type",
                                                  "string", "enum", json_object_get(fn, "name"), "parameters", p,
                                                  "required", "name", "parameters"));
    }
    *out = json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "array", "minItems", 1, "items", "type", "object", "anyOf",
                     branches);
    if (json_object_size(defs)) json_object_set(*out, "$defs", defs);
    json_decref(defs);
    return 0;
}

/* The request's constraint as vLLM builds it for the sampling params (see the top of this section),
 * then as cvllm_constraint with owned text; the server's defaults fill the options. */
static int settle_constraint(const cv_api_limits *lim, const structured_in *in, cv_api_request *req, cv_api_error *err) {
    json_t *schema, *so = json_incref(in->so);
    if (tool_schema(req, &schema, err)) {
        json_decref(so);
        return -1;
    }
    if (schema) {
        json_decref(so);
        so = so_dict();
        json_object_set_new(so, "json", schema);
    }
    if (in->rf) {
        if (!so) so = so_dict();
        if (!strcmp(in->rf, "json_object")) json_object_set_new(so, "json_object", json_true());
        else if (!strcmp(in->rf, "structural_tag")) {
            char *text = json_dumps(in->rf_tag, JSON_COMPACT);
            json_object_set_new(so, "structural_tag", json_string(text));
            free(text);
        } else json_object_set(so, "json", in->rf_schema ? in->rf_schema : json_null());
    }
    if (!so) return 0;
    char *msg = so_count_error(so);
    const json_t *js = json_object_get(so, "json"), *choices = json_object_get(so, "choice");
    cvllm_constraint *c = &req->constraint;
    if (msg) {
        cv_api_fail(err, 400, NULL, "%s", msg);
    } else if (!json_is_null(js)) {
        c->kind = CVLLM_CONSTRAINT_JSON;
        req->constraint_spec = json_is_string(js) ? cv_xstrdup(json_string_value(js)) : json_dumps(js, JSON_COMPACT);
    } else if (json_is_true(json_object_get(so, "json_object"))) {
        c->kind = CVLLM_CONSTRAINT_JSON_OBJECT;
    } else if (json_is_string(json_object_get(so, "regex"))) {
        c->kind = CVLLM_CONSTRAINT_REGEX;
        req->constraint_spec = cv_xstrdup(json_string_value(json_object_get(so, "regex")));
    } else if (json_is_array(choices)) {
        c->kind = CVLLM_CONSTRAINT_CHOICE;
        c->n_choices = json_array_size(choices);
        req->constraint_choices = cv_xcalloc(c->n_choices ? c->n_choices : 1, sizeof *req->constraint_choices);
        for (size_t i = 0; i < c->n_choices; i++)
            req->constraint_choices[i] = cv_xstrdup(json_string_value(json_array_get(choices, i)));
    } else if (json_is_string(json_object_get(so, "grammar"))) {
        c->kind = CVLLM_CONSTRAINT_GRAMMAR;
        req->constraint_spec = cv_xstrdup(json_string_value(json_object_get(so, "grammar")));
    } else if (json_is_string(json_object_get(so, "structural_tag"))) {
        c->kind = CVLLM_CONSTRAINT_STRUCTURAL_TAG;
        req->constraint_spec = cv_xstrdup(json_string_value(json_object_get(so, "structural_tag")));
    } else {
        /* json_object false, the one constraint named: vLLM's structured-output key finds none */
        msg = cv_xstrdup("No valid structured output parameter found");
        cv_api_fail(err, 400, NULL, "%s", msg);
    }
    if (!msg) {
        const json_t *ws = json_object_get(so, "whitespace_pattern");
        req->has_constraint = true;
        c->spec = req->constraint_spec;
        c->choices = (const char *const *)req->constraint_choices;
        c->disable_any_whitespace = json_is_true(json_object_get(so, "disable_any_whitespace")) ||
                                    lim->structured.disable_any_whitespace;
        c->disable_additional_properties = json_is_true(json_object_get(so, "disable_additional_properties")) ||
                                           lim->structured.disable_additional_properties;
        if (json_is_string(ws) || lim->structured.whitespace_pattern)
            req->whitespace_pattern = cv_xstrdup(json_is_string(ws) ? json_string_value(ws) : lim->structured.whitespace_pattern);
        c->whitespace_pattern = req->whitespace_pattern;
    }
    int rc = msg ? -1 : 0;
    free(msg);
    json_decref(so);
    return rc;
}

static int parse_truncation(const json_t *o, cv_api_request *req, cv_api_error *err) {
    static const char *const sides[] = {"left", "right"};
    bool given = false;
    int side = 0;
    req->truncate_prompt_tokens = -2;
    int64_t k = 0;
    if (cv_get_int(o, NULL, "truncate_prompt_tokens", CV_OPTIONAL, &k, &given, err) ||
        (given && cv_check_range(o, NULL, "truncate_prompt_tokens", k, -1, INT64_MAX, err)) ||
        cv_get_literal(o, NULL, "truncation_side", CV_OPTIONAL, sides, CV_ARRAY_LEN(sides), &side, err))
        return -1;
    if (given) req->truncate_prompt_tokens = k;
    req->truncate_right = side == 1;
    return 0;
}

/* The sampling fields both request models share, in their declaration order. */
static int parse_sampling(const json_t *o, const cv_api_limits *lim, bool chat, cv_api_request *req, cv_api_error *err) {
    cvllm_sampling_params *p = &req->params;
    int64_t seed = p->seed, priority = p->priority, experts_start = 0, interval = 1;
    bool seed_given = false, interval_given = false, prompt_logprobs_given = false, unused_bool = false;
    req->length_penalty = 1;
    req->tokens_as_ids = lim->tokens_as_ids;
    if (cv_get_str(o, NULL, "model", CV_OPTIONAL, &req->model, err) ||
        cv_get_float(o, NULL, "frequency_penalty", CV_OPTIONAL, &p->frequency_penalty, err) ||
        parse_logit_bias(o, req, err) || cv_get_int32(o, NULL, "n", chat ? CV_OPTIONAL : 0, &p->n, NULL, err) ||
        cv_get_float(o, NULL, "presence_penalty", CV_OPTIONAL, &p->presence_penalty, err) ||
        cv_get_int(o, NULL, "seed", CV_OPTIONAL, &seed, &seed_given, err) ||
        (seed_given && cv_check_range(o, NULL, "seed", seed, INT64_MIN, INT64_MAX, err)) || parse_stop(o, req, err) ||
        cv_get_bool(o, NULL, "stream", CV_OPTIONAL, &req->stream, err) || parse_stream_options(o, req, err) ||
        cv_get_float(o, NULL, "temperature", CV_OPTIONAL, &p->temperature, err) ||
        cv_get_float(o, NULL, "top_p", CV_OPTIONAL, &p->top_p, err) ||
        cv_get_str(o, NULL, "user", CV_OPTIONAL, &req->user, err) ||
        cv_get_int32(o, NULL, "top_k", CV_OPTIONAL, &p->top_k, NULL, err) ||
        cv_get_float(o, NULL, "min_p", CV_OPTIONAL, &p->min_p, err) ||
        cv_get_float(o, NULL, "repetition_penalty", CV_OPTIONAL, &p->repetition_penalty, err) ||
        /* beam search's alone, as vLLM uses it: accepted and unused without use_beam_search */
        cv_get_float(o, NULL, "length_penalty", 0, &req->length_penalty, err) ||
        cv_get_ids(o, NULL, "stop_token_ids", CV_OPTIONAL, MAX_ID_LIST, &req->stop_token_ids, &p->n_stop_token_ids, err) ||
        cv_get_bool(o, NULL, "include_stop_str_in_output", 0, &p->include_stop_str_in_output, err) ||
        cv_get_bool(o, NULL, "ignore_eos", 0, &p->ignore_eos, err) ||
        cv_get_int32(o, NULL, "min_tokens", 0, &p->min_tokens, NULL, err) ||
        cv_get_bool(o, NULL, "skip_special_tokens", 0, &p->skip_special_tokens, err) ||
        cv_get_bool(o, NULL, "spaces_between_special_tokens", 0, &p->spaces_between_special_tokens, err) ||
        parse_truncation(o, req, err) ||
        cv_get_ids(o, NULL, "allowed_token_ids", CV_OPTIONAL, SIZE_MAX, &req->allowed_token_ids, &p->n_allowed_token_ids, err) ||
        cv_get_int32(o, NULL, "prompt_logprobs", CV_OPTIONAL, &req->prompt_logprobs, &prompt_logprobs_given, err) ||
        cv_get_strs(o, NULL, "bad_words", 0, MAX_BAD_WORDS, &req->bad_words, &p->n_bad_words, err) ||
        cv_get_bool(o, NULL, "add_special_tokens", 0, &req->add_special_tokens, err) ||
        cv_get_int(o, NULL, "priority", 0, &priority, NULL, err) ||
        cv_check_range(o, NULL, "priority", priority, INT64_MIN, INT64_MAX, err) ||
        cv_get_str(o, NULL, "request_id", 0, &req->request_id, err) ||
        cv_check_str(o, NULL, "session_id", CV_OPTIONAL, NULL, err) ||
        cv_get_bool(o, NULL, "return_tokens_as_token_ids", CV_OPTIONAL, &req->tokens_as_ids, err) ||
        cv_get_bool(o, NULL, "return_token_ids", CV_OPTIONAL, &req->return_token_ids, err) ||
        cv_get_int(o, NULL, "routed_experts_prompt_start", 0, &experts_start, NULL, err) ||
        cv_check_range(o, NULL, "routed_experts_prompt_start", experts_start, 0, INT64_MAX, err) ||
        cv_get_bool(o, NULL, "return_token_offsets", CV_OPTIONAL, &unused_bool, err) ||
        cv_get_bool(o, NULL, "return_mm_kwargs", 0, &unused_bool, err) ||
        cv_get_str(o, NULL, "cache_salt", CV_OPTIONAL, &req->cache_salt, err) || check_vllm_xargs(o, err) ||
        cv_get_int(o, NULL, "stream_interval", CV_OPTIONAL, &interval, &interval_given, err) ||
        (interval_given && cv_check_range(o, NULL, "stream_interval", interval, 1, INT64_MAX, err)))
        return -1;
    if (priority < INT32_MIN || priority > INT32_MAX)
        return cv_api_fail(err, 400, "priority", "'priority' is out of range: %lld", (long long)priority);
    p->priority = (int32_t)priority;
    p->seed = seed;
    p->has_seed |= seed_given;
    if (p->n < 1) return cv_api_fail(err, 400, "n", "n must be at least 1, got %d.", p->n);
    if (p->n > lim->max_n) return cv_api_fail(err, 400, "n", "n must be at most %d, got %d.", lim->max_n, p->n);
    /* -1: the whole vocabulary, which the engine's max_logprobs check then words as vLLM does. */
    if (prompt_logprobs_given && req->prompt_logprobs == -1) req->prompt_logprobs = lim->vocab_size;
    if (req->request_id && strlen(req->request_id) > 64)
        return cv_api_fail(err, 400, "request_id", "'request_id' is longer than 64 bytes");
    p->stop = (const char *const *)req->stop;
    p->stop_token_ids = req->stop_token_ids;
    p->logit_bias_ids = req->bias_ids;
    p->logit_bias_values = req->bias_values;
    p->allowed_token_ids = req->allowed_token_ids;
    p->bad_words = (const char *const *)req->bad_words;
    return 0;
}

/* The before-validators both request models have. */
static int check_common(const json_t *o, bool chat, cv_api_error *err) {
    return check_cache_salt(o, err) || check_stream_options(o, err) || check_logprobs(o, chat, err) ||
           check_structured(o, err);
}

/* The fields both request models have, over the server's defaults. */
static int parse_common(const json_t *o, const cv_api_limits *lim, bool chat, cv_api_request *req, cv_api_error *err) {
    req->params = lim->defaults;
    req->params.logprobs = req->params.prompt_logprobs = -1;
    req->top_logprobs = req->prompt_logprobs = -1;
    req->add_special_tokens = !chat;
    return parse_sampling(o, lim, chat, req, err);
}

json_t *cv_api_parse_body(const char *body, size_t len, cv_api_error *err) {
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

/* The member tags pydantic puts in the locations of the prompt union's errors. */
static const char P_IDS[] = "list[constrained-int]", P_ID_LISTS[] = "list[list[constrained-int]]";

/* One token id of a prompt: an int >= 0 (Field(ge=0)) in lax mode. */
static bool prompt_id(const json_t *v, int32_t *id, cv_pyerrors *l, const cv_loc *at) {
    int64_t x;
    bool big;
    cv_pyfailure f;
    if (!cv_py_int(v, &x, &big, &f)) {
        if (l) cv_pyerrors_add(l, at, v, f.type, f.msg, NULL);
        return false;
    }
    if (x < 0) {
        if (l) cv_pyerrors_add(l, at, v, "greater_than_equal", "Input should be greater than or equal to 0", "{'ge': 0}");
        return false;
    }
    /* Ids beyond int32 are reported as outside the vocabulary. */
    *id = x > INT32_MAX ? INT32_MAX : (int32_t)x;
    return true;
}

/* list[int >= 0] at `at`: the ids (a fresh array) or, with `l`, every item's error. */
static bool prompt_ids(const json_t *a, cv_pyerrors *l, const cv_loc *at, int32_t **ids, size_t *n) {
    if (!json_is_array(a)) {
        if (l) cv_pyerrors_add(l, at, a, "list_type", CV_PY_LIST_TYPE, NULL);
        return false;
    }
    size_t count = json_array_size(a);
    int32_t *out = cv_xmalloc((count ? count : 1) * sizeof *out);
    bool ok = true;
    for (size_t i = 0; i < count; i++) {
        cv_loc item = {at, NULL, i};
        ok &= prompt_id(json_array_get(a, i), &out[i], l, &item);
    }
    if (!ok || !ids) {
        free(out);
        return ok;
    }
    *ids = out;
    *n = count;
    return true;
}

/* The errors of every member of the prompt union (field `name`: prompt, or an embedding's input) for a
 * value none of them takes. */
static int prompt_union_failure(const json_t *v, const char *name, cv_api_error *err) {
    cv_pyerrors l = {0};
    cv_loc at = {NULL, name, 0}, as_ids = {&at, P_IDS, 0}, as_lists = {&at, P_ID_LISTS, 0}, as_str = {&at, "str", 0},
           as_strs = {&at, "list[str]", 0};
    prompt_ids(v, &l, &as_ids, NULL, NULL);
    if (!json_is_array(v)) cv_pyerrors_add(&l, &as_lists, v, "list_type", CV_PY_LIST_TYPE, NULL);
    for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) {
        cv_loc item = {&as_lists, NULL, i};
        prompt_ids(json_array_get(v, i), &l, &item, NULL, NULL);
    }
    cv_pyerrors_add(&l, &as_str, v, "string_type", CV_PY_STRING_TYPE, NULL);
    if (!json_is_array(v)) cv_pyerrors_add(&l, &as_strs, v, "list_type", CV_PY_LIST_TYPE, NULL);
    for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) {
        cv_loc item = {&as_strs, NULL, i};
        if (!json_is_string(json_array_get(v, i)))
            cv_pyerrors_add(&l, &item, json_array_get(v, i), "string_type", CV_PY_STRING_TYPE, NULL);
    }
    return cv_pyerrors_fail(&l, err);
}

/* prompt: list[int >= 0] | list[list[int >= 0]] | str | list[str]. pydantic's smart union takes the
 * member the value fits exactly (all strings, all JSON integers, all lists), else the first one lax
 * mode accepts, in declaration order. */
/* No prompt embeds: none given, or an empty list of them. */
static bool no_embeds(const json_t *o) {
    const json_t *embeds = field(o, "prompt_embeds");
    return !embeds || (json_is_array(embeds) && json_array_size(embeds) == 0);
}

/* CompletionRequest's validate_prompt_and_prompt_embeds and validate_prompt_list_length (the list
 * of text prompts is capped; vLLM's hint about VLLM_MAX_COMPLETION_PROMPTS, which cvllm does not
 * read, is left out). */
static int check_prompt_field(const json_t *o, const cv_api_limits *lim, cv_api_error *err) {
    const json_t *v = field(o, "prompt");
    if ((!v || (json_is_string(v) && json_string_length(v) == 0)) && no_embeds(o))
        return cv_api_value_error(err, o, VVE, "prompt", NULL, "Either prompt or prompt_embeds must be provided and non-empty.");
    size_t n = json_array_size(v);
    if (n > (size_t)lim->max_prompts && !json_is_integer(json_array_get(v, 0)) && !json_is_boolean(json_array_get(v, 0)))
        return cv_api_value_error(err, o, VVE, "prompt", NULL, "prompt list length %zu exceeds the maximum allowed count of %d.",
                                  n, lim->max_prompts);
    return 0;
}

/* The prompt union in field `name` (prompt; an embedding's input) into req->prompts. */
static int parse_prompt_field(const json_t *o, const char *name, cv_api_request *req, cv_api_error *err) {
    const json_t *v = field(o, name), *embeds = field(o, "prompt_embeds");
    size_t n = json_array_size(v);
    /* prompt_embeds: bytes | list[bytes] | None; bytes take strings in lax mode. */
    cv_loc embeds_at = {NULL, "prompt_embeds", 0};
    if (embeds && !json_is_string(embeds)) {
        bool ok = json_is_array(embeds);
        for (size_t i = 0; ok && i < json_array_size(embeds); i++) ok = json_is_string(json_array_get(embeds, i));
        if (!ok) return cv_api_pyfail(err, &embeds_at, embeds, "bytes_type", "Input should be a valid bytes", NULL);
    }
    if (v && !json_is_string(v)) {
        bool strs = json_is_array(v), ints = json_is_array(v), lists = json_is_array(v);
        for (size_t i = 0; i < n; i++) {
            const json_t *item = json_array_get(v, i);
            strs &= json_is_string(item);
            ints &= json_is_integer(item) && json_integer_value(item) >= 0;
            lists &= json_is_array(item);
        }
        cv_loc at = {NULL, name, 0}, as_ids = {&at, P_IDS, 0}, as_lists = {&at, P_ID_LISTS, 0};
        cv_api_prompt p = {0};
        if (!strs && !lists && (ints || prompt_ids(v, NULL, &as_ids, NULL, NULL))) {
            prompt_ids(v, NULL, &as_ids, &p.ids, &p.n_ids);
            add_prompt(req, p);
        } else if (strs) {
            for (size_t i = 0; i < n; i++) add_prompt(req, text_prompt(json_array_get(v, i)));
        } else {
            bool ok = json_is_array(v);
            for (size_t i = 0; ok && i < n; i++) {
                cv_loc item = {&as_lists, NULL, i};
                ok = prompt_ids(json_array_get(v, i), NULL, &item, NULL, NULL);
            }
            if (!ok) return prompt_union_failure(v, name, err);
            for (size_t i = 0; i < n; i++) {
                cv_loc item = {&as_lists, NULL, i};
                p = (cv_api_prompt){0};
                prompt_ids(json_array_get(v, i), NULL, &item, &p.ids, &p.n_ids);
                add_prompt(req, p);
            }
        }
    }
    if (v && json_is_string(v)) add_prompt(req, text_prompt(v));
    return 0;
}

static int parse_completion_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    if (check_common(o, false, err) || check_prompt_field(o, lim, err) || parse_prompt_field(o, "prompt", req, err) ||
        parse_common(o, lim, false, req, err))
        return -1;
    req->max_tokens = 16; /* null is the default too (normalize_null_max_tokens) */
    const json_t *suffix;
    structured_in in = {0};
    int rc = cv_get_bool(o, NULL, "echo", CV_OPTIONAL, &req->echo, err) ||
             cv_get_int32(o, NULL, "logprobs", CV_OPTIONAL, &req->top_logprobs, NULL, err) ||
             cv_get_int(o, NULL, "max_tokens", CV_OPTIONAL, &req->max_tokens, NULL, err) ||
             cv_check_str(o, NULL, "suffix", CV_OPTIONAL, &suffix, err) || read_structured(o, &in, err) ||
             check_unsupported(o, req, err) || settle_constraint(lim, &in, req, err);
    structured_in_free(&in);
    if (rc) return -1;
    /* What vLLM's serving code says once the model validated. */
    if (suffix) return cv_api_fail(err, 400, "suffix", "suffix is not currently supported");
    if (req->n_prompts == 0 && no_embeds(o)) return cv_api_fail(err, 400, "prompt", "'prompt' must not be an empty list");
    if (!no_embeds(o)) return cv_api_fail(err, 400, NULL, "You must set `--enable-prompt-embeds` to input `prompt_embeds`.");
    if (req->max_tokens < (req->echo ? 0 : 1))
        return cv_api_fail(err, 400, "max_tokens", "max_tokens must be at least 1, got %lld.", (long long)req->max_tokens);
    if (req->top_logprobs == -1 && field(o, "logprobs")) req->top_logprobs = lim->vocab_size;
    /* With echo, the prompt's logprobs are part of the reply (vLLM: prompt_logprobs = logprobs). */
    if (req->echo && req->top_logprobs >= 0 && req->prompt_logprobs < 0) req->prompt_logprobs = req->top_logprobs;
    req->params.logprobs = req->top_logprobs;
    return 0;
}

int cv_api_parse_completion(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                            cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_COMPLETION;
    json_t *root = cv_api_parse_body(body, len, err);
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

/* A required str field of the TypedDict or model `o` at `at`: pydantic's missing, or string_type. */
static int required_str(const json_t *o, const cv_loc *at, const char *key, cv_api_error *err) {
    cv_loc key_at = {at, key, 0};
    if (!json_object_get(o, key)) return cv_api_pyfail(err, &key_at, o, "missing", CV_PY_MISSING, NULL);
    return cv_check_str(o, at, key, 0, NULL, err);
}

static int not_multimodal(const cv_api_limits *lim, cv_api_error *err) {
    return cv_api_fail(err, 400, NULL, "%s is not a multimodal model", lim->served_model ? lim->served_model : "model");
}

/* The content part types vLLM's chat parser knows (MM_PARSER_MAP), sorted as its error lists them;
 * the media ones, which a text-only model refuses; and the keys that type a part without "type". */
static const char PART_TYPES[] =
    "audio_embeds, audio_url, image_embeds, image_pil, image_url, input_audio, input_image, input_text, output_text, "
    "prompt_embeds, refusal, text, thinking, tool_reference, video_embeds, video_url";
static const char *const MEDIA_PARTS[] = {"audio_embeds", "audio_url", "image_embeds", "image_pil", "image_url",
                                          "input_audio", "input_image", "video_embeds", "video_url"};
static const char *const UNTYPED_PART_KEYS[] = {"image_url",   "image_pil",      "image_embeds", "audio_embeds",
                                                "video_embeds", "prompt_embeds", "audio_url",    "input_audio",
                                                "video_url",   "tool_reference"};

/* One content part, as vLLM's content parser judges it (parse_chat_message_content.py). */
static int check_part(const json_t *part, const cv_loc *at, const cv_api_limits *lim, cv_api_error *err) {
    if (json_is_string(part)) return 0;
    if (!json_is_object(part)) return cv_api_pyfail(err, at, part, "dict_type", CV_PY_DICT_TYPE, NULL);
    const json_t *type = json_object_get(part, "type");
    const char *t = NULL;
    for (size_t i = 0; (!type || json_is_null(type)) && i < CV_ARRAY_LEN(UNTYPED_PART_KEYS); i++)
        if (json_object_get(part, UNTYPED_PART_KEYS[i])) t = UNTYPED_PART_KEYS[i];
    if (!t && (!type || json_is_null(type)))
        return cv_api_fail(err, 400, "type", "Missing 'type' field in multimodal part. (parameter=type)");
    if (!t && !json_is_string(type))
        return cv_api_fail(err, 400, "type", "Invalid 'type' field in multimodal part. (parameter=type)");
    if (!t) t = json_string_value(type);
    const char *key = !strcmp(t, "text") || !strcmp(t, "input_text") || !strcmp(t, "output_text") ? "text"
                      : !strcmp(t, "refusal")                                                      ? "refusal"
                      : !strcmp(t, "thinking")                                                     ? "thinking"
                                                                                                   : NULL;
    if (key) return required_str(part, at, key, err);
    if (!strcmp(t, "tool_reference")) return 0; /* the chat library's to judge */
    if (!strcmp(t, "prompt_embeds"))
        return cv_api_fail(err, 400, NULL, "You must set `--enable-prompt-embeds` to input `prompt_embeds`.");
    if (in_list(t, MEDIA_PARTS, CV_ARRAY_LEN(MEDIA_PARTS))) return not_multimodal(lim, err);
    char *shown = jinja_py_repr(type);
    int rc = cv_api_fail(err, 400, "type",
                         "Unsupported chat content part type: %s. Supported types: %s. (parameter=type, value=%s)", shown,
                         PART_TYPES, t);
    free(shown);
    return rc;
}

/* An assistant's tool_calls: list[{id: str, function: {name: str, arguments: str}, type: 'function'}]. */
static int check_tool_calls(const json_t *m, const cv_loc *at, cv_api_error *err) {
    static const char *const function[] = {"function"};
    const json_t *calls;
    if (cv_check_list(m, at, "tool_calls", CV_OPTIONAL, &calls, err)) return -1;
    cv_loc calls_at = {at, "tool_calls", 0};
    for (size_t j = 0; calls && j < json_array_size(calls); j++) {
        const json_t *call = json_array_get(calls, j), *fn = json_object_get(call, "function");
        cv_loc call_at = {&calls_at, NULL, j}, fn_at = {&call_at, "function", 0};
        int type;
        if (!json_is_object(call)) return cv_api_pyfail(err, &call_at, call, "dict_type", CV_PY_DICT_TYPE, NULL);
        if (required_str(call, &call_at, "id", err)) return -1;
        if (!fn) return cv_api_pyfail(err, &fn_at, call, "missing", CV_PY_MISSING, NULL);
        if (!json_is_object(fn)) return cv_api_pyfail(err, &fn_at, fn, "dict_type", CV_PY_DICT_TYPE, NULL);
        if (required_str(fn, &fn_at, "name", err) || required_str(fn, &fn_at, "arguments", err)) return -1;
        cv_loc type_at = {&call_at, "type", 0};
        if (!json_object_get(call, "type")) return cv_api_pyfail(err, &type_at, call, "missing", CV_PY_MISSING, NULL);
        if (cv_get_literal(call, &call_at, "type", 0, function, 1, &type, err)) return -1;
    }
    return 0;
}

/* messages: the shape vLLM's message types accept (role a string; content a string, a list of parts,
 * or null for assistant and function messages; name, tool_call_id, reasoning strings; tool_calls). */
static int check_messages(const json_t *o, const cv_loc *up, const cv_api_limits *lim, cv_api_error *err) {
    const json_t *messages;
    cv_loc msgs_at = {up, "messages", 0};
    if (!json_object_get(o, "messages")) return cv_api_pyfail(err, &msgs_at, o, "missing", CV_PY_MISSING, NULL);
    if (cv_check_list(o, up, "messages", 0, &messages, err)) return -1;
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *m = json_array_get(messages, i), *content = json_object_get(m, "content");
        cv_loc at = {&msgs_at, NULL, i}, content_at = {&at, "content", 0};
        if (!json_is_object(m)) return cv_api_pyfail(err, &at, m, "dict_type", CV_PY_DICT_TYPE, NULL);
        if (required_str(m, &at, "role", err)) return -1;
        const char *role = json_string_value(json_object_get(m, "role"));
        bool null_ok = !strcmp(role, "assistant") || !strcmp(role, "function");
        if (content && !json_is_string(content) && !json_is_array(content) && !(json_is_null(content) && null_ok))
            return cv_api_pyfail(err, &content_at, content, "string_type", CV_PY_STRING_TYPE, NULL);
        for (size_t j = 0; json_is_array(content) && j < json_array_size(content); j++) {
            cv_loc part_at = {&content_at, NULL, j};
            if (check_part(json_array_get(content, j), &part_at, lim, err)) return -1;
        }
        if (cv_check_str(m, &at, "name", 0, NULL, err) || cv_check_str(m, &at, "tool_call_id", CV_OPTIONAL, NULL, err) ||
            cv_check_str(m, &at, "reasoning", CV_OPTIONAL, NULL, err) ||
            cv_check_str(m, &at, "reasoning_content", CV_OPTIONAL, NULL, err) || check_tool_calls(m, &at, err))
            return -1;
    }
    return 0;
}

/* tools: list[ChatCompletionToolsParam] | None (type 'function', function: FunctionDefinition). */
static int check_tools_shape(const json_t *o, const cv_loc *up, cv_api_error *err) {
    static const char *const function[] = {"function"};
    const json_t *tools;
    if (cv_check_list(o, up, "tools", CV_OPTIONAL, &tools, err)) return -1;
    cv_loc tools_at = {up, "tools", 0};
    for (size_t i = 0; tools && i < json_array_size(tools); i++) {
        const json_t *tool = json_array_get(tools, i), *fn = json_object_get(tool, "function");
        cv_loc at = {&tools_at, NULL, i}, fn_at = {&at, "function", 0};
        cv_pyerrors l = {0};
        int type;
        bool flag;
        if (!json_is_object(tool)) {
            cv_pyerrors_model_type(&l, &at, tool, "ChatCompletionToolsParam");
            return cv_pyerrors_fail(&l, err);
        }
        if (cv_get_literal(tool, &at, "type", 0, function, 1, &type, err)) return -1;
        if (!fn) return cv_api_pyfail(err, &fn_at, tool, "missing", CV_PY_MISSING, NULL);
        if (!json_is_object(fn)) {
            cv_pyerrors_model_type(&l, &fn_at, fn, "FunctionDefinition");
            return cv_pyerrors_fail(&l, err);
        }
        if (required_str(fn, &fn_at, "name", err) || cv_check_str(fn, &fn_at, "description", CV_OPTIONAL, NULL, err) ||
            cv_check_dict(fn, &fn_at, "parameters", CV_OPTIONAL, NULL, err) ||
            cv_get_bool(fn, &fn_at, "strict", CV_OPTIONAL, &flag, err) ||
            cv_get_bool(fn, &fn_at, "defer_loading", CV_OPTIONAL, &flag, err) ||
            cv_get_bool(tool, &at, "defer_loading", CV_OPTIONAL, &flag, err))
            return -1;
    }
    return 0;
}

/* A named tool_choice is ChatCompletionNamedToolChoiceParam, whose type is Literal['function']; vLLM's
 * check_tool_usage has vetted the rest of it. A wrong type fails every member of the union. */
static int check_tool_choice_type(const json_t *o, cv_api_error *err) {
    static const char *const literals[] = {"none", "auto", "required"};
    const json_t *choice = field(o, "tool_choice"), *type = json_object_get(choice, "type");
    if (!json_is_object(choice) || !type || (json_is_string(type) && !strcmp(json_string_value(type), "function")))
        return 0;
    cv_pyerrors l = {0};
    cv_loc at = {NULL, "tool_choice", 0}, named = {&at, "ChatCompletionNamedToolChoiceParam", 0}, type_at = {&named, "type", 0};
    for (size_t i = 0; i < CV_ARRAY_LEN(literals); i++) {
        char tag[32], msg[48], ctx[48];
        snprintf(tag, sizeof tag, "literal['%s']", literals[i]);
        snprintf(msg, sizeof msg, "Input should be '%s'", literals[i]);
        snprintf(ctx, sizeof ctx, "{'expected': \"'%s'\"}", literals[i]);
        cv_loc lit = {&at, tag, 0};
        cv_pyerrors_add(&l, &lit, choice, "literal_error", msg, ctx);
    }
    cv_pyerrors_add(&l, &type_at, type, "literal_error", "Input should be 'function'", "{'expected': \"'function'\"}");
    return cv_pyerrors_fail(&l, err);
}

/* documents: list[dict[str, str]] | None; the dict-valued kwargs fields. */
static int check_chat_dicts(const json_t *o, const cv_loc *up, bool generation, cv_api_error *err) {
    const json_t *docs = NULL, *media;
    cv_loc docs_at = {up, "documents", 0}, media_at = {up, "media_io_kwargs", 0};
    if ((generation && cv_check_list(o, up, "documents", CV_OPTIONAL, &docs, err)) ||
        cv_check_dict(o, up, "chat_template_kwargs", CV_OPTIONAL, NULL, err) ||
        cv_check_dict(o, up, "media_io_kwargs", CV_OPTIONAL, &media, err) ||
        cv_check_dict(o, up, "mm_processor_kwargs", CV_OPTIONAL, NULL, err) ||
        cv_check_str(o, up, "chat_template", CV_OPTIONAL, NULL, err))
        return -1;
    for (size_t i = 0; docs && i < json_array_size(docs); i++) {
        const json_t *doc = json_array_get(docs, i);
        cv_loc at = {&docs_at, NULL, i};
        if (!json_is_object(doc)) return cv_api_pyfail(err, &at, doc, "dict_type", CV_PY_DICT_TYPE, NULL);
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)doc, key, v)
            if (cv_check_str(doc, &at, key, 0, NULL, err)) return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)media, key, v)
        if (cv_check_dict(media, &media_at, key, 0, NULL, err)) return -1;
    return 0;
}

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
    json_t *kw = field(o, "chat_template_kwargs");
    int effort = -1;
    if (generation && cv_get_literal(o, NULL, "reasoning_effort", CV_OPTIONAL, efforts, CV_ARRAY_LEN(efforts), &effort, err))
        return -1;
    if (!kw && effort < 0) return 0;
    *out = kw ? json_copy(kw) : json_object();
    if (effort < 0) return 0;
    json_object_set_new(*out, "reasoning_effort", json_string(efforts[effort]));
    if (effort == 0 && !json_object_get(*out, "enable_thinking")) json_object_set_new(*out, "enable_thinking", json_false());
    return 0;
}

/* The failure of cv_tool_choice_resolve: check_tool_usage's VLLMValidationError (a before-validator),
 * or, without a parameter, vLLM's serving refusal. */
static int tool_usage_failure(const json_t *o, const char *param, cv_api_error *err) {
    if (!param) return cv_api_fail(err, 400, NULL, "%s", cvllm_last_error());
    return cv_api_value_error(err, o, VVE, param, NULL, "%s", cvllm_last_error());
}

/* tools and tool_choice (vLLM's validation and messages), and how the output is read: "auto" through
 * the tool-call parser; "required" and a named tool as the constrained output itself (settle_constraint
 * makes the constraint, api_chat_output.c reads it), which needs no tool-call parser. vLLM refuses
 * those two without --tool-call-parser although its parser plays no part in them (docs/structured-outputs.md). */
static int chat_tools(const json_t *o, const cv_api_chat_config *cfg, cv_api_request *req, cv_api_error *err) {
    json_t *tools = field(o, "tools");
    const char *named = NULL, *param;
    if (cv_tool_choice_resolve(tools, field(o, "tool_choice"), cfg->auto_tool_choice && cfg->has_tool_parser,
                               &req->tool_choice, &named, &param))
        return tool_usage_failure(o, param, err);
    if (check_tool_choice_type(o, err)) return -1;
    if (req->tool_choice == CV_TOOL_CHOICE_NONE) return 0;
    req->tools = json_incref(tools);
    if (named) req->forced_tool = cv_xstrdup(named);
    req->parse_tool_calls = req->tool_choice == CV_TOOL_CHOICE_AUTO;
    req->tool_parser = cfg->tool_parser;
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

/* What /v1/chat/completions and /tokenize's chat form share: the check_generation_prompt validator (a
 * VLLMValidationError without a parameter in ChatCompletionRequest, a plain ValueError in
 * TokenizeChatRequest), and the messages and template fields; `up` is the location of the model in
 * the body (TokenizeChatRequest's union member for /tokenize). */
static int check_generation_prompt(const json_t *o, bool generation, cv_api_error *err) {
    if (truthy(json_object_get(o, "continue_final_message")) && truthy(json_object_get(o, "add_generation_prompt")))
        return cv_api_value_error(err, o, generation ? VVE : "ValueError", NULL, NULL,
                                  "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    return 0;
}

static int check_chat_fields(const json_t *o, const cv_loc *up, const cv_api_limits *lim, bool generation,
                             cv_api_error *err) {
    return check_messages(o, up, lim, err) || check_tools_shape(o, up, err) || check_chat_dicts(o, up, generation, err);
}

/* Renders the conversation with the server's chat template into the request's one prompt, as vLLM
 * does for /v1/chat/completions (`generation`: tool_choice and the output parsers are settled too)
 * and for the chat form of /tokenize, whose TokenizeChatRequest has no documents or reasoning_effort.
 * The request has passed check_chat_request. */
static int parse_chat_prompt(const json_t *o, const cv_api_limits *lim, bool generation, cv_api_request *req,
                             cv_api_error *err) {
    const cv_api_chat_config *cfg = lim->chat;
    json_t *messages = json_object_get(o, "messages"), *docs = generation ? field(o, "documents") : NULL;
    /* the pooling chat requests' default is False: they read the conversation as it stands */
    bool add_generation_prompt = !cv_api_kind_pools(req->kind), continue_final = false;
    if (cv_get_bool(o, NULL, "add_generation_prompt", 0, &add_generation_prompt, err) ||
        cv_get_bool(o, NULL, "continue_final_message", 0, &continue_final, err))
        return -1;
    if (json_array_size(messages) == 0) return cv_api_fail(err, 400, "messages", "'messages' must not be empty");
    /* vLLM's _validate_chat_template: a template in either place is refused unless trusted; trusted,
     * the request's chat_template renders it, and one in chat_template_kwargs is the rendering's
     * "unexpected chat template kwargs" error, as in vLLM's resolve_chat_template_kwargs */
    const json_t *own = field(o, "chat_template"); /* a string: checked with the request's fields */
    if ((own || field(field(o, "chat_template_kwargs"), "chat_template")) && !(cfg && cfg->trust_request_template))
        return cv_api_fail(err, 400, "chat_template",
                           "Chat template is passed with request, but --trust-request-chat-template is not set. "
                           "Refused request with untrusted chat template.");
    if (!own && (!cfg || !cfg->tmpl)) return cv_api_fail(err, 400, NULL, "%s", NO_TEMPLATE);
    if (truthy(field(o, "mm_processor_kwargs"))) return not_multimodal(lim, err);
    /* add_generation_prompt left to its default: transformers' apply_chat_template refuses the pair. */
    if (continue_final && add_generation_prompt)
        return cv_api_fail(err, 400, NULL,
                           "continue_final_message and add_generation_prompt are not compatible. Use "
                           "continue_final_message when you want the model to continue the final message, and "
                           "add_generation_prompt when you want to add a header that will prompt it to start a new "
                           "assistant message instead.");
    if (generation ? chat_tools(o, cfg, req, err) : check_tools(field(o, "tools"), err)) return -1;
    json_t *kwargs;
    if (chat_kwargs(o, generation, &kwargs, err)) return -1;
    /* vLLM's --exclude-tools-when-tool-choice-none: the template sees no tools then */
    const bool no_tools = generation && req->tool_choice == CV_TOOL_CHOICE_NONE && cfg->exclude_tools_when_none;
    cv_chat_request cr = {.messages = messages, .tools = no_tools ? NULL : field(o, "tools"), .documents = docs,
                          .default_kwargs = cfg->default_kwargs, .kwargs = kwargs,
                          .add_generation_prompt = add_generation_prompt, .continue_final_message = continue_final,
                          .content_format = cfg->content_format};
    cv_api_prompt p = {0};
    cv_chat_template *tmpl = NULL;
    int rc = own ? cv_chat_template_with_text(cfg->tmpl, json_string_value(own), json_string_length(own), &tmpl) : 0;
    if (!rc) rc = cv_chat_render(tmpl ? tmpl : cfg->tmpl, &cr, &p.text, &p.text_len);
    cv_chat_template_free(tmpl);
    json_decref(kwargs);
    if (rc) return cv_api_fail(err, 400, NULL, "%s", cvllm_last_error());
    add_prompt(req, p);
    if (!generation) return 0;
    req->parse_reasoning = cfg->reasoning_parser;
    req->starts_in_reasoning = cfg->reasoning_parser && cv_reasoning_prompt_opens(p.text, p.text_len);
    req->reasoning_content = cfg->reasoning_content;
    return 0;
}

/* The chat request's validators and fields, in vLLM's order, up to what the prompt needs. */
static int check_chat_request(const json_t *o, const cv_api_limits *lim, cv_api_request *req, structured_in *in,
                              bool *logprobs, int32_t *top, bool *max_given, cv_api_error *err) {
    return check_common(o, true, err) || check_generation_prompt(o, true, err) ||
           check_chat_fields(o, NULL, lim, true, err) || parse_common(o, lim, true, req, err) ||
           cv_get_bool(o, NULL, "logprobs", CV_OPTIONAL, logprobs, err) ||
           cv_get_int32(o, NULL, "top_logprobs", CV_OPTIONAL, top, NULL, err) ||
           cv_get_int(o, NULL, "max_tokens", CV_OPTIONAL, &req->max_tokens, max_given, err) ||
           cv_get_int(o, NULL, "max_completion_tokens", CV_OPTIONAL, &req->max_tokens, max_given, err) ||
           cv_get_bool(o, NULL, "include_reasoning", 0, &req->include_reasoning, err) ||
           cv_get_bool(o, NULL, "parallel_tool_calls", CV_OPTIONAL, &req->parallel_tool_calls, err) ||
           cv_get_bool(o, NULL, "echo", 0, &req->echo, err) ||
           cv_get_bool(o, NULL, "return_prompt_text", CV_OPTIONAL, &req->return_prompt_text, err) ||
           read_structured(o, in, err) || check_unsupported(o, req, err);
}

static int parse_chat_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    bool logprobs = false, max_given = false;
    int32_t top = 0;
    structured_in in = {0};
    req->max_tokens = -1;
    req->include_reasoning = true;
    req->parallel_tool_calls = true;
    int rc = check_chat_request(o, lim, req, &in, &logprobs, &top, &max_given, err);
    if (!rc) {
        req->max_completion_tokens = field(o, "max_completion_tokens") != NULL;
        if (max_given && req->max_tokens < 1)
            rc = cv_api_fail(err, 400, "max_tokens", "max_tokens must be at least 1, got %lld.", (long long)req->max_tokens);
    }
    /* The tools are resolved with the prompt, and a forced tool choice decides the constraint. */
    if (!rc) rc = parse_chat_prompt(o, lim, true, req, err) || settle_constraint(lim, &in, req, err);
    structured_in_free(&in);
    if (rc) return -1;
    /* -1: the whole vocabulary, which the engine's max_logprobs check then words as vLLM does. */
    req->top_logprobs = logprobs ? (top == -1 ? lim->vocab_size : top) : -1;
    req->params.logprobs = req->top_logprobs;
    if (req->echo) chat_echo_text(json_object_get(o, "messages"), req);
    return 0;
}

int cv_api_parse_invocation(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                            cv_api_error *err) {
    memset(req, 0, sizeof *req);
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    req->kind = CV_API_CHAT;
    int rc = parse_chat_fields(root, lim, req, err);
    if (rc) {
        cv_api_request_free(req);
        memset(req, 0, sizeof *req);
        req->kind = CV_API_COMPLETION;
        rc = parse_completion_fields(root, lim, req, err);
    }
    if (!rc) log_ignored_fields(root, GENERATE_FIELDS, req->kind == CV_API_CHAT ? CHAT_FIELDS : COMPLETION_FIELDS);
    else cv_api_fail(err, 400, NULL, "Cannot find suitable handler for request. Expected one of: "
                     "['ChatCompletionRequest', 'CompletionRequest']");
    json_decref(root);
    return rc;
}

int cv_api_parse_chat_object(const json_t *root, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_CHAT;
    int rc = parse_chat_fields(root, lim, req, err);
    if (!rc) log_ignored_fields(root, GENERATE_FIELDS, CHAT_FIELDS);
    return rc;
}

int cv_api_parse_chat(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_CHAT;
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    int rc = cv_api_parse_chat_object(root, lim, req, err);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* /tokenize and /detokenize                                                                         */

/* /tokenize's body is TokenizeCompletionRequest | TokenizeChatRequest: a body with messages is read
 * as the chat form. Errors are located under the member read (as pydantic's union locations are);
 * pydantic would list the other member's errors too. A body with neither prompt nor messages fails
 * both members. The chat form's serving refusals (no template, empty messages, ...) are those of a
 * chat completion. */
static int parse_tokenize_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    bool chat = json_object_get(o, "messages") != NULL;
    cv_loc member = {NULL, chat ? "TokenizeChatRequest" : "TokenizeCompletionRequest", 0};
    if (!chat && !json_object_get(o, "prompt")) {
        cv_pyerrors l = {0};
        cv_loc prompt_member = {NULL, "TokenizeCompletionRequest", 0}, chat_member = {NULL, "TokenizeChatRequest", 0};
        cv_loc prompt_at = {&prompt_member, "prompt", 0}, messages_at = {&chat_member, "messages", 0};
        cv_pyerrors_add(&l, &prompt_at, o, "missing", CV_PY_MISSING, NULL);
        cv_pyerrors_add(&l, &messages_at, o, "missing", CV_PY_MISSING, NULL);
        return cv_pyerrors_fail(&l, err);
    }
    req->add_special_tokens = !chat;
    if (chat) req->kind = CV_API_CHAT;
    if (chat && check_generation_prompt(o, false, err)) return -1;
    if (cv_get_str(o, &member, "model", CV_OPTIONAL, &req->model, err) ||
        cv_get_bool(o, &member, "add_special_tokens", 0, &req->add_special_tokens, err) ||
        cv_get_bool(o, &member, "return_token_strs", CV_OPTIONAL, &req->return_token_strs, err))
        return -1;
    if (chat) return check_chat_fields(o, &member, lim, false, err) || parse_chat_prompt(o, lim, false, req, err);
    const json_t *prompt;
    if (cv_check_str(o, &member, "prompt", 0, &prompt, err)) return -1;
    add_prompt(req, text_prompt(prompt));
    return 0;
}

int cv_api_parse_tokenize(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                          cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_COMPLETION;
    req->truncate_prompt_tokens = -2;
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    int rc = parse_tokenize_fields(root, lim, req, err);
    if (!rc) log_ignored_fields(root, req->kind == CV_API_CHAT ? TOKENIZE_CHAT_FIELDS : TOKENIZE_PROMPT_FIELDS, NULL);
    json_decref(root);
    return rc;
}

int cv_api_parse_detokenize(const char *body, size_t len, cv_api_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->truncate_prompt_tokens = -2;
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    cv_api_prompt p = {0};
    cv_loc tokens_at = {NULL, "tokens", 0};
    int rc = cv_get_str(root, NULL, "model", CV_OPTIONAL, &req->model, err);
    if (!rc && !json_object_get(root, "tokens")) rc = cv_api_pyfail(err, &tokens_at, root, "missing", CV_PY_MISSING, NULL);
    if (!rc) rc = cv_get_ids(root, NULL, "tokens", 0, SIZE_MAX, &p.ids, &p.n_ids, err);
    if (!rc) add_prompt(req, p);
    if (!rc) log_ignored_fields(root, DETOKENIZE_FIELDS, NULL);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* /v1/load_lora_adapter, /v1/unload_lora_adapter                                                   */

/* A required str field into *out; pydantic's error into l otherwise. */
static void lora_str(const json_t *root, const char *key, cv_pyerrors *l, char **out) {
    const json_t *v = json_object_get(root, key);
    const cv_loc at = {NULL, key, 0};
    if (!v) cv_pyerrors_add(l, &at, root, "missing", CV_PY_MISSING, NULL);
    else if (!json_is_string(v)) cv_pyerrors_add(l, &at, v, "string_type", CV_PY_STRING_TYPE, NULL);
    else *out = cv_xstrndup(json_string_value(v), json_string_length(v));
}

int cv_api_parse_lora_adapter(const char *body, size_t len, bool load, cv_api_lora_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    cv_pyerrors l = {0};
    lora_str(root, "lora_name", &l, &req->lora_name);
    if (load) lora_str(root, "lora_path", &l, &req->lora_path);
    const char *flag = load ? "load_inplace" : "lora_int_id";
    const json_t *v = json_object_get(root, flag);
    cv_pyfailure f;
    int64_t id;
    bool big;
    const bool ok = !v || (load ? cv_py_bool(v, &req->load_inplace, &f) : json_is_null(v) || cv_py_int(v, &id, &big, &f));
    if (!ok) cv_pyerrors_add(&l, &(cv_loc){NULL, flag, 0}, v, f.type, f.msg, NULL);
    json_decref(root);
    return l.n ? cv_pyerrors_fail(&l, err) : 0;
}

void cv_api_lora_request_free(cv_api_lora_request *req) {
    free(req->lora_name);
    free(req->lora_path);
}

void cv_api_request_free(cv_api_request *req) {
    for (size_t i = 0; i < req->n_prompts; i++) {
        free(req->prompts[i].text);
        free(req->prompts[i].ids);
    }
    free(req->prompts);
    for (size_t i = 0; i < req->params.n_stop; i++) free(req->stop[i]);
    free(req->stop);
    for (size_t i = 0; i < req->params.n_bad_words; i++) free(req->bad_words[i]);
    free(req->bad_words);
    free(req->stop_token_ids);
    free(req->bias_ids);
    free(req->bias_values);
    free(req->allowed_token_ids);
    free(req->model);
    free(req->echo_text);
    free(req->cache_salt);
    free(req->request_id);
    free(req->user);
    free(req->forced_tool);
    json_decref(req->tools);
    json_decref(req->responses);
    json_decref(req->responses_messages);
    free(req->constraint_spec);
    for (size_t i = 0; i < req->constraint.n_choices; i++) free(req->constraint_choices[i]);
    free(req->constraint_choices);
    free(req->whitespace_pattern);
    for (size_t i = 0; i < req->n_texts_1; i++) free(req->texts_1[i]);
    for (size_t i = 0; i < req->n_texts_2; i++) free(req->texts_2[i]);
    free(req->texts_1);
    free(req->texts_2);
    free(req->task);
    memset(req, 0, sizeof *req);
}

/* ------------------------------------------------------------------------------------------------ */
/* Tokenizing and the context-length rules                                                          */

/* Text is tokenized as vLLM's renderer does: with the tokenizer's post-processor tokens when
 * add_special_tokens (a no-op for Qwen3's ByteLevel one, Qwen3-Embedding's trailing <|endoftext|>). */
static int tokenize_prompt(cv_api_prompt *p, const cvllm_tokenizer *tok, bool add_special_tokens, cv_api_error *err) {
    if (p->ids) return 0;
    if (cvllm_tokenize(tok, p->text, p->text_len, &p->ids, &p->n_ids) != CVLLM_OK ||
        (add_special_tokens && cvllm_tokenizer_add_special_tokens(tok, &p->ids, &p->n_ids) != CVLLM_OK))
        return cv_api_fail(err, 400, "prompt", "%s", cvllm_last_error());
    return 0;
}

/* The max_tokens vLLM's TokenizeParams subtracts from the context: the requested one, or 0. */
static int64_t requested_output(const cv_api_request *req) { return req->max_tokens > 0 ? req->max_tokens : 0; }

/* vLLM's TokenizeParams: K > max_model_len - max_tokens is refused; -1 keeps that many. The prompt
 * keeps its last K tokens (vLLM loads tokenizers with truncation_side "left"), or its first K with
 * truncation_side "right". The prompt's text stays as given: vLLM echoes the original text too. */
static int truncate_prompt(const cv_api_request *req, cv_api_prompt *p, const cv_api_limits *lim, cv_api_error *err) {
    int64_t k = req->truncate_prompt_tokens, max_input = (int64_t)lim->max_model_len - requested_output(req);
    if (k == -2) return 0;
    if (k > max_input) {
        return cv_api_fail(err, 400, "truncate_prompt_tokens",
                           "truncate_prompt_tokens=%lld cannot be greater than max_model_len - %s = %lld. Please request a "
                           "smaller truncation size. (parameter=truncate_prompt_tokens, value=%lld)",
                           (long long)k, req->max_completion_tokens ? "max_completion_tokens" : "max_tokens",
                           (long long)max_input, (long long)k);
    }
    if (k < 0) k = max_input;
    if ((size_t)k >= p->n_ids) return 0;
    if (!req->truncate_right) memmove(p->ids, p->ids + (p->n_ids - (size_t)k), (size_t)k * sizeof *p->ids);
    p->n_ids = (size_t)k;
    return 0;
}

static int check_prompt(const cv_api_request *req, cv_api_prompt *p, const cv_api_limits *lim, cv_api_error *err) {
    const bool embedding = cv_api_kind_pools(req->kind);
    const char *param = req->kind == CV_API_CHAT ? "messages" : embedding ? "input" : "prompt";
    int64_t L = lim->max_model_len, P = (int64_t)p->n_ids, M = req->max_tokens;
    if (P == 0) return cv_api_fail(err, 400, param, "The decoder prompt cannot be empty");
    for (size_t i = 0; i < p->n_ids; i++)
        if (p->ids[i] < 0 || p->ids[i] >= lim->vocab_size)
            return cv_api_fail(err, 400, param, "Token id %d is out of vocabulary", p->ids[i]);
    if (req->kind == CV_API_EMBEDDING && lim->max_embed_len && P > lim->max_embed_len) /* vLLM's words */
        return cv_api_fail(err, 400, NULL, "This model's maximum embedding input length is %lld tokens. However, you "
                           "requested %lld tokens in the input for embedding generation. Please reduce the length of "
                           "the input.", (long long)lim->max_embed_len, (long long)P);
    if (embedding) { /* nothing is generated: the prompt may fill the context (vLLM's renderer's message) */
        const bool embeddings = req->kind == CV_API_EMBEDDING; /* longer ones run in chunks (embed_chunks.h) */
        if (P > L && embeddings && lim->max_embed_len && !lim->embed_chunked)
            return cv_api_fail(err, 400, NULL, "This model's maximum position embeddings length is %lld tokens. However, "
                               "you requested %lld tokens in the input for embedding generation. Please reduce the "
                               "length of the input or enable chunked processing.", (long long)L, (long long)P);
        if (P > L && !(embeddings && lim->embed_chunked))
            return cv_api_fail(err, 400, "input_tokens",
                               "You passed %lld input tokens and requested 0 output tokens. However, the model's context "
                               "length is only %lld tokens, resulting in a maximum input length of %lld tokens. Please "
                               "reduce the length of the input prompt. (parameter=input_tokens, value=%lld)",
                               (long long)P, (long long)L, (long long)L, (long long)P);
        p->max_tokens = 0;
        return 0;
    }
    if (P >= L)
        return cv_api_fail(err, 400, param,
                           "This model's maximum context length is %lld tokens. However, your request has %lld input "
                           "tokens. Please reduce the length of the input messages.",
                           (long long)L, (long long)P);
    if (M == -1) {
        M = L - P;
    } else if (M > L - P) { /* not P + M > L: max_tokens may be as large as int64 goes (0 < P < L here) */
        return cv_api_fail(err, 400, "max_tokens",
                           "'max_tokens' or 'max_completion_tokens' is too large: %lld. This model's maximum context "
                           "length is %lld tokens and your request has %lld input tokens (%lld > %lld - %lld).",
                           (long long)M, (long long)L, (long long)P, (long long)M, (long long)L, (long long)P);
    }
    if (lim->gen_max_tokens > 0 && M > lim->gen_max_tokens) M = lim->gen_max_tokens;
    p->max_tokens = (int32_t)(M == 0 ? 1 : M); /* M == 0 only with echo: one token, then dropped */
    return 0;
}

/* The token after which the constraint applies (the params' grammar_after_token_id): with a reasoning
 * parser, and unless --structured-outputs-config enables it in reasoning, the end of the reasoning
 * section when the prompt leaves one to the output. As vLLM's reasoning parsers judge a prompt
 * (is_reasoning_end), the last think tag decides: "</think>" closed it (enable_thinking=false), and
 * "<think>" or no tag at all leaves it open. */
static int32_t grammar_after(const cv_api_request *req, const cv_api_prompt *p, const cv_api_limits *lim) {
    const cv_api_chat_config *chat = lim->chat;
    if (!req->has_constraint || !req->parse_reasoning || lim->structured.enable_in_reasoning || !chat ||
        chat->think_end_id < 0)
        return -1;
    for (size_t i = p->n_ids; i-- > 0;) {
        if (p->ids[i] == chat->think_end_id) return -1;
        if (p->ids[i] == chat->think_start_id) break;
    }
    return chat->think_end_id;
}

int cv_api_prepare(cv_api_request *req, const cvllm_tokenizer *tok, const cv_api_limits *lim, cv_api_error *err) {
    req->echo_only = req->kind == CV_API_COMPLETION && req->echo && req->max_tokens == 0;
    /* vLLM's beam search passes no constraint to its step requests and would return unconstrained
     * text; cvllm says so instead */
    if (req->beam_search && req->has_constraint)
        return cv_api_fail(err, 400, "use_beam_search",
                           "beam search does not support structured outputs or a required or named tool_choice");
    for (size_t i = 0; i < req->n_prompts; i++) {
        if (tokenize_prompt(&req->prompts[i], tok, req->add_special_tokens, err) || truncate_prompt(req, &req->prompts[i], lim, err) ||
            check_prompt(req, &req->prompts[i], lim, err))
            return -1;
        if (req->kind == CV_API_COHERE_EMBED && req->input_token_limit >= 0 &&
            (int64_t)req->prompts[i].n_ids > req->input_token_limit)
            return cv_api_fail(err, 400, NULL, "Input of %zu tokens exceeds max_tokens=%lld with truncate=NONE. Set "
                               "truncate to END or START to allow truncation.", req->prompts[i].n_ids,
                               (long long)req->input_token_limit);
        req->prompts[i].grammar_after_token_id = grammar_after(req, &req->prompts[i], lim);
    }
    return 0;
}

cvllm_sampling_params cv_api_prompt_params(const cv_api_request *req, size_t prompt_index) {
    cvllm_sampling_params p = req->params;
    p.max_tokens = req->prompts[prompt_index].max_tokens;
    p.prompt_logprobs = req->prompt_logprobs;
    p.grammar_after_token_id = req->prompts[prompt_index].grammar_after_token_id;
    if (req->echo_only) p.min_tokens = 0;
    return p;
}

/* ------------------------------------------------------------------------------------------------ */
/* /v1/embeddings, /classify and /pooling                                                            */

/* The fields the three share (input or the chat form, truncation, use_activation), and those of
 * req->kind: an encoding for embeddings and /pooling, dimensions for embeddings, task for /pooling. */
static int parse_embedding_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    static const char *const encodings[] = {"float", "base64", "bytes", "bytes_only"};
    static const char *const dtypes[] = {"float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"};
    static const char *const endians[] = {"native", "big", "little"};
    const bool chat = field(o, "messages") != NULL;
    if (field(o, "normalize"))
        return cv_api_fail(err, 400, "normalize", "Parameter `normalize` was removed; use `use_activation` instead. "
                           "(parameter=normalize)");
    if (!chat && !field(o, "input")) {
        cv_loc at = {NULL, "input", 0};
        return cv_api_pyfail(err, &at, o, "missing", "Field required", NULL);
    }
    const bool encodes = req->kind != CV_API_CLASSIFY;
    int encoding = 0, dtype = 0, endian = 0;
    int64_t priority = 0, dimensions = 0;
    bool dims_given = false, activation = false, activation_given = false;
    req->params = lim->defaults;
    req->params.n = 1;
    req->params.logprobs = req->params.prompt_logprobs = -1;
    req->top_logprobs = req->prompt_logprobs = -1;
    req->add_special_tokens = !chat; /* the chat form's default is false, as for chat completions */
    req->max_tokens = 0;
    cvllm_pooling_params_default(&req->pooling);
    if (chat && (check_generation_prompt(o, false, err) || check_chat_fields(o, NULL, lim, false, err) ||
                 parse_chat_prompt(o, lim, false, req, err)))
        return -1;
    if (check_cache_salt(o, err) || cv_get_str(o, NULL, "model", CV_OPTIONAL, &req->model, err) ||
        (!chat && parse_prompt_field(o, "input", req, err)) || cv_get_str(o, NULL, "user", CV_OPTIONAL, &req->user, err) ||
        parse_truncation(o, req, err) || cv_get_str(o, NULL, "request_id", 0, &req->request_id, err) ||
        cv_get_int(o, NULL, "priority", 0, &priority, NULL, err) ||
        cv_get_str(o, NULL, "cache_salt", CV_OPTIONAL, &req->cache_salt, err) ||
        cv_get_bool(o, NULL, "add_special_tokens", 0, &req->add_special_tokens, err) ||
        (encodes && (cv_get_literal(o, NULL, "encoding_format", 0, encodings, CV_ARRAY_LEN(encodings), &encoding, err) ||
                     cv_get_literal(o, NULL, "embed_dtype", 0, dtypes, CV_ARRAY_LEN(dtypes), &dtype, err) ||
                     cv_get_literal(o, NULL, "endianness", 0, endians, CV_ARRAY_LEN(endians), &endian, err) ||
                     cv_get_int(o, NULL, "dimensions", CV_OPTIONAL, &dimensions, &dims_given, err))) ||
        (req->kind == CV_API_POOLING && cv_get_str(o, NULL, "task", CV_OPTIONAL, &req->task, err)) ||
        cv_get_bool(o, NULL, "use_activation", CV_OPTIONAL, &activation, err))
        return -1;
    if (req->kind == CV_API_POOLING && dims_given)
        return cv_api_fail(err, 400, "dimensions", "dimensions is currently not supported");
    activation_given = field(o, "use_activation") && !json_is_null(field(o, "use_activation"));
    if (priority != 0)
        return cv_api_fail(err, 400, "priority", "priority applies only with --scheduling-policy priority, which "
                           "cvllm's pooling runner does not take");
    if (req->request_id && strlen(req->request_id) > 64)
        return cv_api_fail(err, 400, "request_id", "'request_id' is longer than 64 bytes");
    if (req->n_prompts == 0) return cv_api_fail(err, 400, "input", "please provide at least one prompt");
    if (req->n_prompts > (size_t)lim->max_prompts)
        return cv_api_fail(err, 400, "input", "input list length %zu exceeds the maximum allowed count of %d.",
                           req->n_prompts, lim->max_prompts);
    /* the engine judges dimensions against the model (matryoshka); 0 is its "not given" */
    if (dims_given) req->pooling.dimensions = dimensions < INT32_MIN ? INT32_MIN : dimensions > INT32_MAX ? INT32_MAX
                                              : dimensions == 0 ? -1 : (int32_t)dimensions;
    if (activation_given) req->pooling.normalize = activation ? 1 : 0;
    req->pooling.task = req->task; /* the engine checks it against the model's */
    req->class_labels = lim->class_labels;
    req->token_width = lim->token_width;
    req->encoding = (cv_api_encoding)encoding;
    req->embed_dtype = (cv_api_embed_dtype)dtype;
    req->endianness = (cv_api_endianness)endian;
    return 0;
}

static int parse_pooling_route(const char *body, size_t len, const cv_api_limits *lim, cv_api_kind kind,
                               cv_api_request *req, cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = kind;
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    int rc = parse_embedding_fields(root, lim, req, err);
    if (!rc)
        log_ignored_fields(root, kind == CV_API_CLASSIFY ? CLASSIFY_FIELDS : kind == CV_API_POOLING ? POOLING_FIELDS
                                                                                                   : EMBEDDING_FIELDS,
                           field(root, "messages") ? EMBEDDING_CHAT_FIELDS : NULL);
    json_decref(root);
    return rc;
}

int cv_api_parse_embedding(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                           cv_api_error *err) {
    return parse_pooling_route(body, len, lim, CV_API_EMBEDDING, req, err);
}

int cv_api_parse_classify(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                          cv_api_error *err) {
    return parse_pooling_route(body, len, lim, CV_API_CLASSIFY, req, err);
}

int cv_api_parse_pooling(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                         cv_api_error *err) {
    return parse_pooling_route(body, len, lim, CV_API_POOLING, req, err);
}

cv_api_kind cv_api_pooling_invocation(const char *body, size_t len, const cv_api_limits *lim) {
    const char *task = lim->pooling_task ? lim->pooling_task : "";
    const cv_api_kind own = !strcmp(task, "classify") ? CV_API_CLASSIFY
                            : !strcmp(task, "embed")  ? CV_API_EMBEDDING
                                                      : CV_API_POOLING; /* the token tasks have only /pooling */
    json_t *root = json_loadb(body, len, 0, NULL);
    cv_api_kind kind = own;
    if (json_is_object(root) && !field(root, "input") && !field(root, "messages") && lim->scores)
        kind = field(root, "query") && field(root, "documents") ? CV_API_RERANK : CV_API_SCORE;
    json_decref(root);
    return kind;
}

/* ------------------------------------------------------------------------------------------------ */
/* /v2/embed (Cohere)                                                                                */

/* The prompt prefix of input_type (NULL: none asked); an input type the model has none for is vLLM's
 * 400. */
static int input_type_prompt(const json_t *o, const cv_api_limits *lim, const char **prefix, cv_api_error *err) {
    const json_t *t;
    *prefix = NULL;
    if (cv_check_str(o, NULL, "input_type", CV_OPTIONAL, &t, err)) return -1;
    if (!t || json_is_null(t)) return 0;
    const char *name = json_string_value(t);
    if (!lim->n_input_types)
        return cv_api_fail(err, 400, "input_type", "Unsupported input_type '%.200s'. This model does not define any "
                           "input_type prompt prefixes.", name);
    for (int32_t i = 0; i < lim->n_input_types; i++)
        if (!strcmp(lim->input_types[i], name)) {
            *prefix = lim->input_prompts[i];
            return 0;
        }
    char *list = NULL; /* sorted, as vLLM lists them */
    size_t len = 0, cap = 0;
    const char *last = "";
    for (int32_t k = 0; k < lim->n_input_types; k++) {
        const char *next = NULL;
        for (int32_t i = 0; i < lim->n_input_types; i++)
            if (strcmp(lim->input_types[i], last) > 0 && (!next || strcmp(lim->input_types[i], next) < 0))
                next = lim->input_types[i];
        if (!next) break;
        if (len) cv_buf_append(&list, &len, &cap, ", ", 2);
        cv_buf_append(&list, &len, &cap, next, strlen(next));
        last = next;
    }
    cv_api_fail(err, 400, "input_type", "Unsupported input_type '%.200s'. Supported values: %.400s", name, list);
    free(list);
    return -1;
}

/* prefix + the JSON string `text` (NUL bytes included) as a fresh string of *len bytes. */
static char *prefixed(const char *prefix, const json_t *text, size_t *len) {
    const size_t pl = prefix ? strlen(prefix) : 0, tl = json_string_length(text);
    char *s = cv_xmalloc(pl + tl + 1);
    if (pl) memcpy(s, prefix, pl);
    memcpy(s + pl, json_string_value(text), tl);
    s[pl + tl] = '\0';
    *len = pl + tl;
    return s;
}

/* One entry of `inputs`: its text parts as one user message, rendered as the embeddings' chat form. */
static int cohere_input(const json_t *in, size_t index, const cv_api_limits *lim, const char *prefix,
                        cv_api_request *req, cv_api_error *err) {
    const json_t *content = json_object_get(in, "content");
    if (!json_is_object(in) || !json_is_array(content))
        return cv_api_fail(err, 400, "inputs", "inputs[%zu] must be an object with a list `content`", index);
    json_t *parts = json_array();
    size_t i;
    const json_t *part;
    int rc = 0;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (type && !strcmp(type, "image_url")) {
            rc = not_multimodal(lim, err);
            break;
        }
        if (!type || strcmp(type, "text") || (text && !json_is_string(text) && !json_is_null(text))) {
            rc = cv_api_fail(err, 400, "inputs", "inputs[%zu].content[%zu]: type must be \"text\" or \"image_url\" and "
                             "text a string", index, i);
            break;
        }
        if (!json_is_string(text)) continue; /* no text: nothing to add, as vLLM skips it */
        size_t len;
        char *s = prefixed(prefix, text, &len);
        json_array_append_new(parts, json_pack("{s:s, s:s%}", "type", "text", "text", s, len));
        free(s);
    }
    json_t *chat = json_pack("{s:[{s:s, s:o}]}", "messages", "role", "user", "content", parts);
    if (!rc) rc = parse_chat_prompt(chat, lim, false, req, err);
    json_decref(chat);
    return rc;
}

/* truncate and max_tokens as vLLM maps them: END keeps the first max_tokens tokens (all the context
 * fits without max_tokens), START the last, NONE cuts nothing and refuses an input over max_tokens. */
static int cohere_truncation(const json_t *o, cv_api_request *req, cv_api_error *err) {
    static const char *const modes[] = {"NONE", "START", "END"};
    int mode = 2;
    int64_t max_tokens = 0;
    bool given = false;
    if (cv_get_literal(o, NULL, "truncate", 0, modes, CV_ARRAY_LEN(modes), &mode, err) ||
        cv_get_int(o, NULL, "max_tokens", CV_OPTIONAL, &max_tokens, &given, err))
        return -1;
    if (given && max_tokens < 1) return cv_api_fail(err, 400, "max_tokens", "max_tokens must be at least 1");
    req->input_token_limit = mode == 0 && given ? max_tokens : -1;
    req->truncate_prompt_tokens = mode == 0 ? -2 : given ? max_tokens : -1;
    req->truncate_right = mode == 2;
    return 0;
}

static int parse_cohere_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    static const char *const types[] = {"float", "binary", "ubinary", "base64"};
    const json_t *texts = field(o, "texts"), *images = field(o, "images"), *inputs = field(o, "inputs"),
                 *wanted = field(o, "embedding_types");
    const char *prefix;
    int64_t dimensions = 0, priority = 0;
    bool dims_given = false;
    req->params = lim->defaults;
    req->params.n = 1;
    req->params.logprobs = req->params.prompt_logprobs = -1;
    req->top_logprobs = req->prompt_logprobs = -1;
    req->add_special_tokens = !inputs || json_is_null(inputs); /* inputs are the chat form, which adds none */
    req->max_tokens = 0;
    cvllm_pooling_params_default(&req->pooling);
    if (!field(o, "model")) {
        cv_loc at = {NULL, "model", 0};
        return cv_api_pyfail(err, &at, o, "missing", "Field required", NULL);
    }
    if (cv_get_str(o, NULL, "model", 0, &req->model, err) || input_type_prompt(o, lim, &prefix, err) ||
        cv_get_int(o, NULL, "output_dimension", CV_OPTIONAL, &dimensions, &dims_given, err) ||
        cv_get_int(o, NULL, "priority", 0, &priority, NULL, err) || cohere_truncation(o, req, err))
        return -1;
    if (priority != 0)
        return cv_api_fail(err, 400, "priority", "priority applies only with --scheduling-policy priority, which "
                           "cvllm's pooling runner does not take");
    if (wanted && !json_is_null(wanted) && !json_is_array(wanted))
        return cv_api_fail(err, 400, "embedding_types", "embedding_types must be a list");
    size_t i;
    const json_t *t;
    json_array_foreach(wanted, i, t) {
        int k = -1;
        for (int j = 0; j < (int)CV_ARRAY_LEN(types); j++)
            if (json_is_string(t) && !strcmp(json_string_value(t), types[j])) k = j;
        if (k < 0)
            return cv_api_fail(err, 400, "embedding_types", "embedding_types[%zu] must be one of 'float', 'binary', "
                               "'ubinary' or 'base64'", i);
        req->embedding_types |= 1u << k;
    }
    if (!req->embedding_types) req->embedding_types = CV_COHERE_FLOAT;
    if (dims_given) req->pooling.dimensions = dimensions < 1 || dimensions > INT32_MAX ? -1 : (int32_t)dimensions;
    if ((!texts || json_is_null(texts)) && (!images || json_is_null(images)) && (!inputs || json_is_null(inputs)))
        return cv_api_fail(err, 400, NULL, "One of texts, images, or inputs must be provided");
    if (images && !json_is_null(images)) return not_multimodal(lim, err);
    if (inputs && !json_is_null(inputs)) {
        if (!json_is_array(inputs)) return cv_api_fail(err, 400, "inputs", "inputs must be a list");
        json_array_foreach(inputs, i, t) if (cohere_input(t, i, lim, prefix, req, err)) return -1;
    } else {
        if (!json_is_array(texts)) return cv_api_fail(err, 400, "texts", "texts must be a list of strings");
        json_array_foreach(texts, i, t) if (!json_is_string(t)) return cv_api_fail(err, 400, "texts", "texts[%zu] must be a string", i);
        req->texts_1 = cv_xcalloc(json_array_size(texts) + 1, sizeof *req->texts_1);
        json_array_foreach(texts, i, t) {
            req->texts_1[req->n_texts_1++] = cv_xstrndup(json_string_value(t), json_string_length(t));
            size_t len;
            char *s = prefixed(prefix, t, &len);
            add_prompt(req, (cv_api_prompt){.text = s, .text_len = len});
        }
    }
    if (req->n_prompts > (size_t)lim->max_prompts)
        return cv_api_fail(err, 400, NULL, "%zu inputs exceed the maximum allowed count of %d.", req->n_prompts,
                           lim->max_prompts);
    return 0;
}

int cv_api_parse_cohere_embed(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                              cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = CV_API_COHERE_EMBED;
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    int rc = parse_cohere_fields(root, lim, req, err);
    if (!rc) log_ignored_fields(root, COHERE_FIELDS, NULL);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* /score and /rerank                                                                                */

/* One side of a pair: a string or a list of strings; *texts are fresh copies. Multimodal content is
 * for models with an encoder, which cvllm does not run. */
static int score_texts(const json_t *o, const char *key, const cv_api_limits *lim, char ***texts, size_t *n,
                       cv_api_error *err) {
    const json_t *v = field(o, key);
    if (!v) return 0;
    const size_t count = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < count; i++) {
        const json_t *t = json_is_array(v) ? json_array_get(v, i) : v;
        if (json_is_object(t)) return not_multimodal(lim, err);
        if (!json_is_string(t)) {
            cv_loc at = {NULL, key, 0};
            return cv_api_pyfail(err, &at, t, "string_type", CV_PY_STRING_TYPE, NULL);
        }
    }
    *texts = cv_xcalloc(count ? count : 1, sizeof **texts);
    for (size_t i = 0; i < count; i++) {
        const json_t *t = json_is_array(v) ? json_array_get(v, i) : v;
        (*texts)[i] = cv_xstrndup(json_string_value(t), json_string_length(t));
    }
    *n = count;
    return 0;
}

/* A reranker's prompt for one pair: --chat-template rendered over the messages vLLM gives it (roles
 * "query" and "document", the template kwargs with the request's instruction), else the two texts
 * one after the other, as vLLM tokenizes them without a template. */
static int pair_prompt(const json_t *o, const cv_api_limits *lim, const char *q, const char *d, cv_api_prompt *p,
                       cv_api_error *err) {
    *p = (cv_api_prompt){0};
    if (!lim->score_template) {
        char *text = cv_xasprintf("%s%s", q, d);
        *p = (cv_api_prompt){.text = text, .text_len = strlen(text)};
        return 0;
    }
    json_t *kwargs = json_deep_copy(field(o, "chat_template_kwargs"));
    if (!kwargs) kwargs = json_object();
    const json_t *instruction = field(o, "instruction");
    if (instruction && !json_object_get(kwargs, "instruction")) json_object_set(kwargs, "instruction", (json_t *)instruction);
    json_t *messages = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "query", "content", q, "role", "document",
                                 "content", d);
    cv_chat_request cr = {.messages = messages, .kwargs = kwargs, .default_kwargs = lim->chat ? lim->chat->default_kwargs : NULL,
                          .content_format = CV_CHAT_CONTENT_STRING};
    int rc = cv_chat_render(lim->score_template, &cr, &p->text, &p->text_len);
    json_decref(messages);
    json_decref(kwargs);
    return rc ? cv_api_fail(err, 400, NULL, "%s", cvllm_last_error()) : 0;
}

/* The prompts of the pairs (see cv_api_request.texts_1) and the fields both routes share. */
static int score_prompts(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    const size_t n1 = req->n_texts_1, n2 = req->n_texts_2;
    if (n1 > 1 && n1 != n2) return cv_api_fail(err, 400, NULL, "Input lengths must be either 1:1, 1:N or N:N");
    if (n1 == 0) return cv_api_fail(err, 400, NULL, "At least one text element must be given");
    if (n2 == 0) return cv_api_fail(err, 400, NULL, "At least one text_pair element must be given");
    if (n1 + n2 > (size_t)lim->max_prompts)
        return cv_api_fail(err, 400, NULL, "%zu texts exceed the maximum allowed count of %d.", n1 + n2, lim->max_prompts);
    const json_t *instruction, *kwargs;
    int64_t priority = 0;
    bool activation = false;
    req->params = lim->defaults;
    req->params.n = 1;
    req->params.logprobs = req->params.prompt_logprobs = -1;
    req->top_logprobs = req->prompt_logprobs = -1;
    req->add_special_tokens = true;
    cvllm_pooling_params_default(&req->pooling);
    if (cv_get_str(o, NULL, "model", CV_OPTIONAL, &req->model, err) ||
        cv_get_str(o, NULL, "user", CV_OPTIONAL, &req->user, err) || parse_truncation(o, req, err) ||
        cv_get_str(o, NULL, "request_id", 0, &req->request_id, err) ||
        cv_get_int(o, NULL, "priority", 0, &priority, NULL, err) ||
        cv_get_bool(o, NULL, "use_activation", CV_OPTIONAL, &activation, err) ||
        cv_check_str(o, NULL, "instruction", CV_OPTIONAL, &instruction, err) ||
        cv_check_dict(o, NULL, "chat_template_kwargs", CV_OPTIONAL, &kwargs, err))
        return -1;
    if (priority != 0)
        return cv_api_fail(err, 400, "priority", "priority applies only with --scheduling-policy priority, which "
                           "cvllm's pooling runner does not take");
    if (req->request_id && strlen(req->request_id) > 64)
        return cv_api_fail(err, 400, "request_id", "'request_id' is longer than 64 bytes");
    if (field(o, "use_activation")) req->pooling.normalize = activation ? 1 : 0;
    const bool bi_encoder = lim->pooling_task && strcmp(lim->pooling_task, "classify");
    if (!bi_encoder) req->pooling.task = "score"; /* a cross-encoder's scores take its score activation */
    req->token_width = lim->token_width;          /* token_embed: late interaction */
    if (bi_encoder) { /* each text embedded once */
        for (size_t i = 0; i < n1; i++) add_prompt(req, (cv_api_prompt){.text = cv_xstrdup(req->texts_1[i]),
                                                                        .text_len = strlen(req->texts_1[i])});
        for (size_t i = 0; i < n2; i++) add_prompt(req, (cv_api_prompt){.text = cv_xstrdup(req->texts_2[i]),
                                                                        .text_len = strlen(req->texts_2[i])});
        return 0;
    }
    for (size_t i = 0; i < n2; i++) { /* cross-encoder: one prompt a pair, the query repeated for 1:N */
        cv_api_prompt p;
        if (pair_prompt(o, lim, req->texts_1[n1 == 1 ? 0 : i], req->texts_2[i], &p, err)) return -1;
        add_prompt(req, p);
    }
    return 0;
}

static int parse_score_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    /* pydantic tries the union's members in this order and takes the first whose fields are there */
    static const char *const pairs[][2] = {{"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"},
                                           {"text_1", "text_2"}};
    for (size_t k = 0; k < CV_ARRAY_LEN(pairs); k++) {
        if (!field(o, pairs[k][0]) || !field(o, pairs[k][1])) continue;
        if (score_texts(o, pairs[k][0], lim, &req->texts_1, &req->n_texts_1, err) ||
            score_texts(o, pairs[k][1], lim, &req->texts_2, &req->n_texts_2, err))
            return -1;
        return score_prompts(o, lim, req, err);
    }
    cv_pyerrors l = {0};
    for (size_t k = 0; k < CV_ARRAY_LEN(pairs); k++)
        for (int side = 0; side < 2; side++)
            if (!field(o, pairs[k][side])) {
                cv_loc at = {NULL, pairs[k][side], 0};
                cv_pyerrors_add(&l, &at, o, "missing", CV_PY_MISSING, NULL);
            }
    return cv_pyerrors_fail(&l, err);
}

static int parse_rerank_fields(const json_t *o, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    cv_pyerrors l = {0};
    static const char *const required[] = {"query", "documents"};
    for (size_t k = 0; k < CV_ARRAY_LEN(required); k++)
        if (!json_object_get(o, required[k])) {
            cv_loc at = {NULL, required[k], 0};
            cv_pyerrors_add(&l, &at, o, "missing", CV_PY_MISSING, NULL);
        }
    if (l.n) return cv_pyerrors_fail(&l, err);
    if (json_is_array(json_object_get(o, "query"))) {
        cv_loc at = {NULL, "query", 0};
        return cv_api_pyfail(err, &at, json_object_get(o, "query"), "string_type", CV_PY_STRING_TYPE, NULL);
    }
    return score_texts(o, "query", lim, &req->texts_1, &req->n_texts_1, err) ||
           score_texts(o, "documents", lim, &req->texts_2, &req->n_texts_2, err) ||
           cv_get_int(o, NULL, "top_n", 0, &req->top_n, NULL, err) || score_prompts(o, lim, req, err);
}

static int parse_scoring(const char *body, size_t len, const cv_api_limits *lim, cv_api_kind kind, cv_api_request *req,
                         cv_api_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = kind;
    json_t *root = cv_api_parse_body(body, len, err);
    if (!root) return -1;
    int rc = kind == CV_API_SCORE ? parse_score_fields(root, lim, req, err) : parse_rerank_fields(root, lim, req, err);
    if (!rc) log_ignored_fields(root, SCORE_FIELDS, kind == CV_API_RERANK ? RERANK_FIELDS : NULL);
    json_decref(root);
    return rc;
}

int cv_api_parse_score(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    return parse_scoring(body, len, lim, CV_API_SCORE, req, err);
}

int cv_api_parse_rerank(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err) {
    return parse_scoring(body, len, lim, CV_API_RERANK, req, err);
}
