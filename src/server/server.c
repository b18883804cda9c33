/*
 * server.c — `cvllm serve`'s API on top of the HTTP layer (http.h): API keys, routing, request
 * metrics, and the small endpoints (/health, /ping, /version, /v1/models, /metrics, /tokenize,
 * /detokenize, /v1/chat/completions/render). Completions, chat and SageMaker's /invocations live in
 * generate.c, the LoRA adapters' routes in lora_adapters.c.
 *
 * Checks run in vLLM's order: API key (paths under /v1 only), route, method, content type (415) —
 * all on the head, before any body is read — then body size (413, by the HTTP layer, which also
 * answers an announced oversized body before it is sent), then the endpoint's own validation
 * (400/404). Every reply is vLLM's JSON error shape, the HTTP layer's own ones included.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "server/metrics.h"
#include "server/server_internal.h"
#include "tokenizer/tokenizer.h"

enum {
    DEFAULT_MAX_BODY = 32 << 20,
    DEFAULT_MAX_N = 128,
    MAX_PROMPTS = 1024,
    IO_TIMEOUT_S = 60,                  /* a body or a reply that makes no progress for this long */
    DEFAULT_LIMIT_CONCURRENCY = 4096,
    DEFAULT_LIMIT_PER_CLIENT = 1024,
};
static const double DEFAULT_KEEP_ALIVE_S = 5;      /* uvicorn's --timeout-keep-alive */
static const double DEFAULT_HEADER_TIMEOUT_S = 10;

/* ------------------------------------------------------------------------------------------------ */
/* Replies                                                                                           */

void cv_server_reply_error(cv_http_req *r, const cv_api_error *err) {
    char *json = cv_api_error_json(err);
    cv_http_respond(r, err->status, "application/json", json, strlen(json));
    free(json);
}

void cv_server_reply_anthropic_error(cv_http_req *r, const cv_api_error *err) {
    char *json = cv_api_anthropic_error_json(err);
    cv_http_respond(r, err->status, "application/json", json, strlen(json));
    free(json);
}

static void send_json(cv_http_req *r, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    cv_http_respond(r, 200, "application/json", s, strlen(s));
    free(s);
}

static void fail(cv_http_req *r, int status, const char *message) {
    cv_api_error err;
    cv_api_fail(&err, status, NULL, "%s", message);
    cv_server_reply_error(r, &err);
}

/* The HTTP layer's own refusals (malformed requests, 413, timeouts, connection limits). */
static char *error_body(void *user, int status, const char *message) {
    (void)user;
    cv_api_error err;
    cv_api_fail(&err, status, NULL, "%s", message);
    return cv_api_error_json(&err);
}

const char *cv_server_model_name(cv_server *s, const char *requested, const char **lora, cv_api_error *err) {
    if (lora) *lora = NULL;
    if (!requested) return s->names[0];
    for (size_t i = 0; i < s->n_names; i++)
        if (!strcmp(requested, s->names[i])) return s->names[i];
    const int resolved = cv_server_lora_listed(s, requested) ? 1 : cv_server_lora_resolve(s, requested, err);
    if (resolved > 0) {
        if (lora) *lora = requested;
        return requested;
    }
    if (resolved == 0) cv_api_fail(err, 404, "model", "The model `%.200s` does not exist.", requested);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* Small endpoints                                                                                   */

json_t *cv_server_model_card(const cv_server *s, const char *id, const char *root, const char *parent,
                             int32_t max_model_len, size_t index) {
    char *perm = cv_xasprintf("modelperm-%s-%zu", s->names[0], index);
    json_t *permission = json_pack(
        "[{s:s, s:s, s:I, s:b, s:b, s:b, s:b, s:b, s:b, s:s, s:n, s:b}]", "id", perm, "object", "model_permission",
        "created", (json_int_t)s->started, "allow_create_engine", 0, "allow_sampling", 1, "allow_logprobs", 1,
        "allow_search_indices", 0, "allow_view", 1, "allow_fine_tuning", 0, "organization", "*", "group",
        "is_blocking", 0);
    free(perm);
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o, s:o}", "id", id, "object", "model", "created",
                     (json_int_t)s->started, "owned_by", "vllm", "root", root, "parent",
                     parent ? json_string(parent) : json_null(), "max_model_len",
                     max_model_len ? json_integer(max_model_len) : json_null(), "permission", permission);
}

static void handle_models(cv_server *s, cv_http_req *c) {
    json_t *data = json_array();
    for (size_t i = 0; i < s->n_names; i++)
        json_array_append_new(data, cv_server_model_card(s, s->names[i], s->root, NULL, s->limits.max_model_len, i));
    cv_server_lora_cards(s, data);
    send_json(c, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static void handle_metrics(cv_server *s, cv_http_req *c) {
    const int n = cv_engine_group_size(s->group);
    cv_engine_stats *st = cv_xmalloc((size_t)n * sizeof *st);
    for (int i = 0; i < n; i++) cv_engine_group_stats(s->group, i, &st[i]);
    char *lora_names[CV_MAX_LORA_MODULES];
    cv_engine_group_lora_slot_names(s->group, lora_names);
    char *text = cv_metrics_render(st, (size_t)n, s->names[0], (const char *const *)lora_names, CV_MAX_LORA_MODULES,
                                   s->http_metrics);
    for (size_t i = 0; i < CV_MAX_LORA_MODULES; i++) free(lora_names[i]);
    free(st);
    cv_http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
    free(text);
}

static json_t *ids_array(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static void handle_tokenize(cv_server *s, cv_http_req *c, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    int rc = cv_api_parse_tokenize(body, len, &s->limits, &req, &err);
    if (!rc && !cv_server_model_name(s, req.model, NULL, &err)) rc = -1;
    cv_api_prompt *p = rc ? NULL : &req.prompts[0];
    if (p && (cvllm_tokenize(s->tok, p->text, p->text_len, &p->ids, &p->n_ids) != CVLLM_OK ||
              (req.add_special_tokens && cvllm_tokenizer_add_special_tokens(s->tok, &p->ids, &p->n_ids) != CVLLM_OK)))
        rc = cv_api_fail(&err, 400, "prompt", "%s", cvllm_last_error());
    if (rc) {
        cv_api_request_free(&req);
        cv_server_reply_error(c, &err);
        return;
    }
    json_t *strs = req.return_token_strs ? cv_api_token_strs(s->tok, p->ids, p->n_ids) : json_null();
    json_t *o = json_pack("{s:I, s:i, s:o, s:o}", "count", (json_int_t)p->n_ids, "max_model_len", s->limits.max_model_len,
                          "tokens", ids_array(p->ids, p->n_ids), "token_strs", strs);
    cv_api_request_free(&req);
    send_json(c, o);
}

/* /v1/chat/completions/render: the request goes through every check of a chat completion (template,
 * tools, context length), and the prompt it would generate from comes back instead. */
static void handle_render(cv_server *s, cv_http_req *c, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    int rc = cv_api_parse_chat(body, len, &s->limits, &req, &err);
    const char *model = rc ? NULL : cv_server_model_name(s, req.model, NULL, &err);
    if (!model || cv_api_prepare(&req, s->tok, &s->limits, &err)) {
        cv_api_request_free(&req);
        cv_server_reply_error(c, &err);
        return;
    }
    const cv_api_prompt *p = &req.prompts[0];
    json_t *o = json_pack("{s:s, s:s%, s:o, s:I, s:i}", "model", model, "prompt", p->text, p->text_len, "token_ids",
                          ids_array(p->ids, p->n_ids), "count", (json_int_t)p->n_ids, "max_tokens", p->max_tokens);
    cv_api_request_free(&req);
    send_json(c, o);
}

/* vLLM's /tokenizer_info: the tokenizer's configuration as transformers holds it (tokenizer_config.json
 * with its added tokens and special tokens as their strings, the file paths left out), its class,
 * and --chat-template's text when one was given. */
static void handle_tokenizer_info(cv_server *s, cv_http_req *c) {
    const char *text = cvllm_tokenizer_config(s->tok);
    json_t *o = text ? json_loads(text, 0, NULL) : json_object();
    json_object_del(o, "vocab_file");
    json_object_del(o, "merges_file");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) { /* AddedToken objects: their content */
        if (json_is_string(json_object_get(v, "content"))) json_object_set(o, key, json_object_get(v, "content"));
    }
    json_t *added = json_object_get(o, "added_tokens_decoder");
    json_object_foreach(added, key, v) {
        if (json_is_string(json_object_get(v, "content"))) json_object_set(added, key, json_object_get(v, "content"));
    }
    /* the class AutoTokenizer loads: the fast tokenizer of tokenizer.json */
    const char *cls = json_string_value(json_object_get(o, "tokenizer_class"));
    size_t n = cls ? strlen(cls) : 0;
    json_object_set_new(o, "tokenizer_class", cls && (n < 4 || strcmp(cls + n - 4, "Fast"))
                                                   ? json_sprintf("%sFast", cls)
                                                   : json_string(cls ? cls : "PreTrainedTokenizerFast"));
    if (s->chat_template_given && s->limits.chat && s->limits.chat->tmpl)
        json_object_set_new(o, "chat_template", json_string(cv_chat_template_source(s->limits.chat->tmpl)));
    send_json(c, o);
}

/* The stored responses' paths: /v1/responses/ID and /v1/responses/ID/cancel. */
static const char RESPONSE_ID_PREFIX[] = "/v1/responses/";

/* The query parameter `name` of the request ("" for a bare name), copied into out; false when
 * absent. */
static bool query_param(cv_http_req *c, const char *name, char *out, size_t cap) {
    const size_t n = strlen(name);
    for (const char *p = cv_http_query(c); p && *p;) {
        const size_t len = strcspn(p, "&");
        if (len >= n && !strncmp(p, name, n) && (len == n || p[n] == '=')) {
            const size_t v = len > n ? len - n - 1 : 0;
            snprintf(out, cap, "%.*s", (int)v, p + len - v);
            return true;
        }
        p += len + (p[len] == '&');
    }
    return false;
}

/* GET /v1/responses/{id}?stream=true&starting_after=N, vLLM's replay of a background stream: the
 * events after number N (all without it), then those still to come. Answers the request; false
 * (nothing sent) when the query does not ask for a stream. */
static bool follow_stored_events(cv_server *s, cv_http_req *c, const char *key) {
    char stream[16] = "", after[32] = "";
    query_param(c, "stream", stream, sizeof stream);
    if (strcasecmp(stream, "true") && strcmp(stream, "1") && strcasecmp(stream, "yes") && strcasecmp(stream, "on"))
        return false;
    char *end = NULL;
    const long n = query_param(c, "starting_after", after, sizeof after) ? strtol(after, &end, 10) : -1;
    cv_api_error err;
    if (end && (end == after || *end || n < 0)) {
        cv_api_fail(&err, 400, "starting_after", "starting_after: Input should be a valid integer, unable to parse "
                    "string as an integer");
        cv_server_reply_error(c, &err);
    } else if (!cv_response_store_events_follow(s->responses, key, c, n)) {
        cv_api_fail(&err, 400, "response_id", "Unknown response_id: %s", key);
        cv_server_reply_error(c, &err);
    }
    return true;
}

/* GET /v1/responses/{id}: a stored response, as it is now (or a background stream's events, see
 * follow_stored_events); POST /v1/responses/{id}/cancel: a background response still queued or in
 * progress becomes "cancelled" and its generation is aborted; any other is refused as synchronous,
 * in vLLM's words. Without the store nothing is found (vLLM's 404). */
static void handle_stored_response(cv_server *s, cv_http_req *c) {
    const char *id = cv_http_path(c) + strlen(RESPONSE_ID_PREFIX), *slash = strchr(id, '/');
    const bool cancel = slash && !strcmp(slash, "/cancel");
    const bool post = !strcmp(cv_http_method(c), "POST");
    if ((slash && !cancel) || post != cancel) {
        fail(c, slash && !cancel ? 404 : 405, slash && !cancel ? "Not Found" : "Method Not Allowed");
        return;
    }
    char *key = cv_xstrndup(id, slash ? (size_t)(slash - id) : strlen(id));
    bool cancelled = false;
    json_t *response = !s->responses ? NULL
                       : cancel      ? cv_response_store_cancel(s->responses, key, &cancelled)
                                     : cv_response_store_get(s->responses, key);
    cv_api_error err;
    if (!response) {
        cv_api_fail(&err, 404, NULL, "Response with id '%s' not found.", key);
        cv_server_reply_error(c, &err);
    } else if (cancel && !cancelled) {
        cv_api_fail(&err, 400, NULL, "Cannot cancel a synchronous response.");
        cv_server_reply_error(c, &err);
        json_decref(response);
    } else if (cancel || !follow_stored_events(s, c, key)) {
        if (cancelled) cv_generate_abort_response(s, key);
        send_json(c, response);
    } else {
        json_decref(response);
    }
    free(key);
}

/* /v1/messages/count_tokens, vLLM's: the prompt's tokens as /v1/messages would render them. */
static void handle_count_tokens(cv_server *s, cv_http_req *c, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    int rc = cv_api_parse_anthropic(body, len, &s->limits, true, &req, &err);
    if (!rc && !cv_server_model_name(s, req.model, NULL, &err)) rc = -1;
    if (!rc) rc = cv_api_prepare(&req, s->tok, &s->limits, &err);
    if (rc) {
        cv_api_request_free(&req);
        cv_server_reply_anthropic_error(c, &err);
        return;
    }
    const json_int_t n = (json_int_t)req.prompts[0].n_ids;
    cv_api_request_free(&req);
    send_json(c, json_pack("{s:I, s:{s:I}}", "input_tokens", n, "context_management", "original_input_tokens", n));
}

static void handle_detokenize(cv_server *s, cv_http_req *c, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    char *text = NULL;
    int rc = cv_api_parse_detokenize(body, len, &req, &err);
    if (!rc && !cv_server_model_name(s, req.model, NULL, &err)) rc = -1;
    for (size_t i = 0; !rc && i < req.prompts[0].n_ids; i++)
        if (req.prompts[0].ids[i] < 0 || req.prompts[0].ids[i] >= s->limits.vocab_size)
            rc = cv_api_fail(&err, 400, "tokens", "Token id %d is out of vocabulary", req.prompts[0].ids[i]);
    if (!rc && cvllm_detokenize(s->tok, req.prompts[0].ids, req.prompts[0].n_ids, false, &text) != CVLLM_OK)
        rc = cv_api_fail(&err, 400, "tokens", "%s", cvllm_last_error());
    cv_api_request_free(&req);
    if (rc) {
        cv_server_reply_error(c, &err);
        return;
    }
    send_json(c, json_pack("{s:s}", "prompt", text));
    cvllm_free(text);
}

/* ------------------------------------------------------------------------------------------------ */
/* Routing                                                                                           */

typedef enum route_id {
    R_HEALTH, R_PING, R_VERSION, R_LOAD, R_MODELS, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_COMPLETIONS, R_CHAT,
    R_CHAT_RENDER, R_INVOCATIONS, R_LOAD_LORA, R_UNLOAD_LORA, R_EMBEDDINGS, R_SCORE, R_RERANK, R_CLASSIFY, R_POOLING,
    R_COHERE_EMBED, R_MESSAGES, R_MESSAGES_COUNT, R_TOKENIZER_INFO, R_RESPONSES, R_RESPONSE_ID
} route_id;

typedef struct route {
    const char *path;
    route_id id;
    const char *methods;       /* space-separated; NULL = any */
    bool json_body;
} route;

static const route routes[] = {
    {"/health", R_HEALTH, "GET", false},
    {"/ping", R_PING, "GET POST", false},
    {"/version", R_VERSION, "GET", false},
    {"/load", R_LOAD, "GET", false},
    {"/tokenizer_info", R_TOKENIZER_INFO, "GET", false},       /* with --enable-tokenizer-info-endpoint */
    {"/v1/models", R_MODELS, "GET", false},
    {"/metrics", R_METRICS, NULL, false},
    {"/tokenize", R_TOKENIZE, "POST", true},
    {"/detokenize", R_DETOKENIZE, "POST", true},
    {"/v1/completions", R_COMPLETIONS, "POST", true},
    {"/v1/chat/completions", R_CHAT, "POST", true},
    {"/v1/chat/completions/render", R_CHAT_RENDER, "POST", true},
    {"/v1/messages", R_MESSAGES, "POST", true},                /* Anthropic's Messages API */
    {"/v1/responses", R_RESPONSES, "POST", true},              /* OpenAI's Responses API */
    {"/v1/messages/count_tokens", R_MESSAGES_COUNT, "POST", true},
    {"/invocations", R_INVOCATIONS, "POST", true},
    {"/v1/load_lora_adapter", R_LOAD_LORA, "POST", true},     /* with runtime_lora only */
    {"/v1/unload_lora_adapter", R_UNLOAD_LORA, "POST", true}, /* with runtime_lora only */
    {"/v1/embeddings", R_EMBEDDINGS, "POST", true},            /* embedding models only */
    {"/v2/embed", R_COHERE_EMBED, "POST", true},               /* embedding models only */
    {"/classify", R_CLASSIFY, "POST", true},                   /* classifiers only */
    {"/pooling", R_POOLING, "POST", true},                     /* pooling runner only */
    {"/score", R_SCORE, "POST", true},                         /* where limits.scores, and the next four */
    {"/v1/score", R_SCORE, "POST", true},
    {"/rerank", R_RERANK, "POST", true},
    {"/v1/rerank", R_RERANK, "POST", true},
    {"/v2/rerank", R_RERANK, "POST", true},
};

static bool method_allowed(const route *r, const char *method) {
    if (!r->methods) return true;
    if (!strcmp(method, "HEAD")) method = "GET"; /* the HTTP layer sends the headers only */
    size_t n = strlen(method);
    for (const char *m = r->methods; *m;) {
        size_t k = strcspn(m, " ");
        if (k == n && !strncmp(m, method, n)) return true;
        m += k + (m[k] == ' ');
    }
    return false;
}

static bool needs_key(const char *url) {
    return !strncmp(url, "/v1", 3) || !strncmp(url, "/v2", 3) || !strncmp(url, "/inference", 10);
}

/* Constant-time comparison, so response timing does not leak how much of a key matched. */
static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return diff == 0;
}

/* The key is the Bearer token, or without one an x-api-key header's value: Anthropic's clients send
 * theirs so (vLLM takes Bearer only; its issue 51572 and the pull requests for it take both). */
static bool authorized(const cv_server *s, const cv_http_req *r) {
    if (s->n_keys == 0) return true;
    const char *h = cv_http_get_header(r, "Authorization");
    const char *key = h && !strncasecmp(h, "Bearer ", 7) ? h + 7 : cv_http_get_header(r, "x-api-key");
    if (!key) return false;
    bool ok = false;
    for (size_t i = 0; i < s->n_keys; i++) ok |= same_secret(key, s->keys[i]);
    return ok;
}

static bool is_json_type(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ') ct++;
    size_t n = strlen("application/json");
    return !strncasecmp(ct, "application/json", n) && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

/* vLLM registers the routes of the tasks the model supports: a pooling model has no completions or
 * chat, a generating one no embeddings (Starlette's 404 either way). */
static bool route_served(const cv_server *s, route_id id) {
    switch (id) {
    case R_LOAD_LORA:
    case R_UNLOAD_LORA: return s->runtime_lora;
    case R_TOKENIZER_INFO: return s->tokenizer_info;
    case R_COMPLETIONS:
    case R_CHAT:
    case R_CHAT_RENDER:
    case R_MESSAGES:
    case R_MESSAGES_COUNT:
    case R_RESPONSES: return !s->pooling;
    case R_EMBEDDINGS:
    case R_COHERE_EMBED: return s->pooling && !strcmp(s->limits.pooling_task, "embed");
    case R_CLASSIFY: return s->pooling && !strcmp(s->limits.pooling_task, "classify");
    case R_POOLING: return s->pooling;
    case R_SCORE:
    case R_RERANK: return s->limits.scores;
    default: return true;
    }
}

/* GET /v1/responses/{response_id} and POST /v1/responses/{response_id}/cancel: a path with an id in
 * it, matched by its prefix (the metrics name it by its template, as vLLM's routes are named). */
static const route response_id_route = {"/v1/responses/{response_id}", R_RESPONSE_ID, "GET POST", false};

static const route *find_route(const cv_server *s, const char *url) {
    for (size_t i = 0; i < CV_ARRAY_LEN(routes); i++)
        if (!strcmp(url, routes[i].path)) return route_served(s, routes[i].id) ? &routes[i] : NULL;
    if (!strncmp(url, RESPONSE_ID_PREFIX, strlen(RESPONSE_ID_PREFIX)) && url[strlen(RESPONSE_ID_PREFIX)] &&
        route_served(s, R_RESPONSES))
        return &response_id_route;
    return NULL;
}

/* Per request: what its metrics need, and the route its head matched. */
typedef struct request_meta {
    const route *route;
    double started;               /* cv_now() when its head arrived */
    const char *handler;          /* its http_* metrics handler label; NULL: not recorded */
    char method[16];
} request_meta;

static void answer(cv_server *s, cv_http_req *r, const route *rt);

/* The head is in (HTTP loop thread): everything that can be refused without the body is. The
 * request's HTTP metrics start here, as the instrumentator's middleware starts its clock when the
 * request reaches the app. */
static void on_head(void *user, cv_http_req *r) {
    cv_server *s = user;
    const char *path = cv_http_path(r), *method = cv_http_method(r);
    request_meta *m = cv_xcalloc(1, sizeof *m);
    m->started = cv_now();
    m->route = find_route(s, path);
    m->handler = cv_http_metrics_handler(m->route ? m->route->path : NULL, path);
    snprintf(m->method, sizeof m->method, "%s", method);
    cv_http_set_data(r, m);
    if (cv_cors_preflight(&s->cors, r)) { /* before the key: vLLM's authentication lets OPTIONS through */
        m->handler = NULL;
        return;
    }
    if (s->request_id_headers) { /* vLLM's XRequestIdMiddleware: the client's id, else a uuid4 hex */
        const char *id = cv_http_get_header(r, "X-Request-Id");
        char hex[33];
        if (!id) cv_api_random_hex(hex, 16);
        cv_http_set_header(r, "X-Request-Id", id ? id : hex);
    }
    if (needs_key(path) && !authorized(s, r)) {
        /* vLLM's authentication middleware wraps the metrics one: a 401 never reaches the counts. */
        m->handler = NULL;
        fail(r, 401, "Unauthorized");
        return;
    }
    cv_cors_reply_headers(&s->cors, r);
    if (!m->route) {
        fail(r, 404, "Not Found");
    } else if (!method_allowed(m->route, method)) {
        fail(r, 405, "Method Not Allowed");
    } else if (m->route->json_body && !is_json_type(cv_http_get_header(r, "Content-Type"))) {
        fail(r, 415, "Unsupported Media Type: Only 'application/json' is allowed");
    } else if (!m->route->json_body && (!strcmp(method, "GET") || !strcmp(method, "HEAD"))) {
        /* Health checks and model lists need no body and never block: answered here, so they do
         * not queue behind workers busy tokenizing long prompts. */
        answer(s, r, m->route);
    }
}

static void answer(cv_server *s, cv_http_req *r, const route *rt) {
    const char *body = cv_http_body(r);
    size_t len = cv_http_body_len(r);
    switch (rt->id) {
    case R_HEALTH:
    case R_PING:
        if (atomic_load(&s->failed)) fail(r, 503, s->failure);
        else cv_http_respond(r, 200, NULL, "", 0);
        return;
    case R_VERSION: send_json(r, json_pack("{s:s}", "version", CVLLM_VERSION)); return;
    case R_LOAD: send_json(r, json_pack("{s:I}", "server_load", (json_int_t)atomic_load(&s->load))); return;
    case R_MODELS: handle_models(s, r); return;
    case R_METRICS: handle_metrics(s, r); return;
    case R_TOKENIZE: handle_tokenize(s, r, body, len); return;
    case R_DETOKENIZE: handle_detokenize(s, r, body, len); return;
    case R_COMPLETIONS: cv_generate(s, r, CV_API_COMPLETION); return;
    case R_CHAT: cv_generate(s, r, CV_API_CHAT); return;
    case R_INVOCATIONS:
        cv_generate(s, r, s->pooling ? cv_api_pooling_invocation(body, len, &s->limits) : CV_API_INVOCATION);
        return;
    case R_EMBEDDINGS: cv_generate(s, r, CV_API_EMBEDDING); return;
    case R_CLASSIFY: cv_generate(s, r, CV_API_CLASSIFY); return;
    case R_POOLING: cv_generate(s, r, CV_API_POOLING); return;
    case R_COHERE_EMBED: cv_generate(s, r, CV_API_COHERE_EMBED); return;
    case R_SCORE:
        /* vLLM moved the Score API off /v1, which it keeps for the OpenAI-compatible routes */
        if (!strcmp(cv_http_path(r), "/v1/score"))
            cv_warn("server", "To indicate that Score API is not part of standard OpenAI API, we have moved it to "
                              "`/score`. Note that `/v1/score` will be removed in a future release.");
        cv_generate(s, r, CV_API_SCORE);
        return;
    case R_RERANK: cv_generate(s, r, CV_API_RERANK); return;
    case R_CHAT_RENDER: handle_render(s, r, body, len); return;
    case R_MESSAGES: cv_generate(s, r, CV_API_MESSAGES); return;
    case R_RESPONSES: cv_generate(s, r, CV_API_RESPONSES); return;
    case R_RESPONSE_ID: handle_stored_response(s, r); return;
    case R_MESSAGES_COUNT: handle_count_tokens(s, r, body, len); return;
    case R_TOKENIZER_INFO: handle_tokenizer_info(s, r); return;
    case R_LOAD_LORA: cv_server_lora_route(s, r, body, len, true); return;
    case R_UNLOAD_LORA: cv_server_lora_route(s, r, body, len, false); return;
    }
}

/* The body is in (a worker thread). */
static void on_request(void *user, cv_http_req *r) {
    const request_meta *m = cv_http_data(r);
    answer(user, r, m->route);
}

/* The request is over (its reply written, or the connection gone): it counts now. */
static void on_complete(void *user, cv_http_req *r, int status) {
    cv_server *s = user;
    request_meta *m = cv_http_data(r);
    if (!m) return;
    if (m->handler) cv_http_metrics_observe(s->http_metrics, m->handler, m->method, (unsigned)status, cv_now() - m->started);
    free(m);
}

/* ------------------------------------------------------------------------------------------------ */
/* Start and stop                                                                                    */

static char **copy_strings(const char *const *v, size_t n) {
    char **out = cv_xcalloc(n ? n : 1, sizeof *out);
    for (size_t i = 0; i < n; i++) out[i] = cv_xstrdup(v[i]);
    return out;
}

static void free_strings(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static void fill_limits(cv_server *s, const cv_server_options *o) {
    const cvllm_engine *e = cv_engine_group_engine(s->group);
    cv_api_limits *l = &s->limits;
    l->max_model_len = cvllm_engine_max_model_len(e);
    l->vocab_size = cvllm_engine_vocab_size(e);
    l->score_template = o->chat_template_given ? o->chat_template : NULL;
    l->max_n = o->max_n > 0 ? o->max_n : DEFAULT_MAX_N;
    l->max_prompts = MAX_PROMPTS;
    l->served_model = s->names[0];
    cvllm_sampling_params_default(e, &l->defaults);
    /* generation_config's max_new_tokens caps every request, as in vLLM's get_max_tokens. */
    l->gen_max_tokens = cvllm_engine_generation_max_tokens(e);
    l->structured = o->structured;
    l->tokens_as_ids = o->return_tokens_as_token_ids;
    if (o->structured.whitespace_pattern) s->whitespace_pattern = cv_xstrdup(o->structured.whitespace_pattern);
    l->structured.whitespace_pattern = s->whitespace_pattern;
}

/* The chat flags, checked as vLLM checks them at startup. */
static int setup_chat(cv_server *s, const cv_server_options *o) {
    cv_api_chat_config *chat = &s->chat;
    chat->tmpl = o->chat_template;
    chat->content_format = o->chat_template_content_format;
    if (chat->tmpl && chat->content_format == CV_CHAT_CONTENT_AUTO) /* vLLM's words (renderers/hf.py) */
        cv_info("chat", "Detected the chat template content format to be '%s'. You can set "
                "`--chat-template-content-format` to override this.",
                cv_chat_content_format_name(cv_chat_template_content_format(chat->tmpl)));
    chat->reasoning_content = o->reasoning_content;
    chat->trust_request_template = o->trust_request_chat_template;
    if (o->reasoning_parser) {
        if (strcmp(o->reasoning_parser, "qwen3") != 0)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "unknown reasoning parser '%s' (supported: qwen3)", o->reasoning_parser);
        chat->reasoning_parser = true;
    }
    /* A constraint starts after the reasoning, which ends at "</think>" (see cv_api_prepare). */
    const cv_tokenizer *t = (const cv_tokenizer *)s->tok; /* the public handle is the internal object */
    chat->think_start_id = chat->reasoning_parser ? cv_tokenizer_token_to_id(t, "<think>") : -1;
    chat->think_end_id = chat->reasoning_parser ? cv_tokenizer_token_to_id(t, "</think>") : -1;
    if (o->tool_call_parser) {
        int rc = cv_tool_parser_from_name(o->tool_call_parser, &chat->tool_parser);
        if (rc) return rc;
        chat->has_tool_parser = true;
    }
    if (o->enable_auto_tool_choice && !chat->has_tool_parser)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--enable-auto-tool-choice requires --tool-call-parser");
    chat->auto_tool_choice = o->enable_auto_tool_choice;
    chat->exclude_tools_when_none = o->exclude_tools_when_tool_choice_none;
    if (o->default_chat_template_kwargs) {
        json_error_t jerr;
        s->default_kwargs = json_loads(o->default_chat_template_kwargs, 0, &jerr);
        if (!json_is_object(s->default_kwargs))
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--default-chat-template-kwargs must be a JSON object%s%s",
                           s->default_kwargs ? "" : ": ", s->default_kwargs ? "" : jerr.text);
        chat->default_kwargs = s->default_kwargs;
    }
    s->limits.chat = chat;
    return 0;
}

/* What the pooling routes need of the engine: its task, whether scores are served, label names. */
static void pooling_limits(cv_server *s, const cvllm_engine *e) {
    cv_api_limits *l = &s->limits;
    l->pooling_task = cvllm_engine_pooling_task(e);
    if (!s->pooling) return;
    const int32_t n = cvllm_engine_embedding_size(e);
    const bool classify = !strcmp(l->pooling_task, "classify"), embed = !strcmp(l->pooling_task, "embed");
    l->scores = embed || !strcmp(l->pooling_task, "token_embed") || (classify && n == 1);
    l->token_width = !strncmp(l->pooling_task, "token_", 6) ? n : 0;
    if (l->token_width) return;
    if (embed) {
        l->embed_chunked = cvllm_engine_embed_chunking(e, &l->max_embed_len);
        const char *prompt;
        while (cvllm_engine_input_type(e, l->n_input_types, &prompt)) l->n_input_types++;
        s->input_types = cv_xcalloc((size_t)l->n_input_types + 1, sizeof *s->input_types);
        s->input_prompts = cv_xcalloc((size_t)l->n_input_types + 1, sizeof *s->input_prompts);
        for (int32_t i = 0; i < l->n_input_types; i++) s->input_types[i] = cvllm_engine_input_type(e, i, &s->input_prompts[i]);
        l->input_types = s->input_types;
        l->input_prompts = s->input_prompts;
        return;
    }
    s->class_labels = cv_xcalloc((size_t)n, sizeof *s->class_labels);
    for (int32_t i = 0; i < n; i++) s->class_labels[i] = cvllm_engine_class_label(e, i);
    l->class_labels = s->class_labels;
}

static void free_server(cv_server *s) {
    cv_http_metrics_free(s->http_metrics);
    cv_response_store_free(s->responses);
    free_strings(s->names, s->n_names);
    cv_server_loras_free(s);
    cv_cors_free(&s->cors);
    free_strings(s->keys, s->n_keys);
    free(s->root);
    free(s->class_labels);
    free(s->input_types);
    free(s->input_prompts);
    json_decref(s->default_kwargs);
    free(s->whitespace_pattern);
    pthread_cond_destroy(&s->sessions_cv);
    pthread_mutex_destroy(&s->sessions_mu);
    free(s);
}

/* A start that failed before the HTTP server took the bound socket given: it is closed here. */
static int refuse(const cv_server_options *o, int rc) {
    if (o->bound) close(o->bound_fd);
    return rc;
}

int cv_server_start(cv_engine_group *group, const cv_server_options *o, cv_server **out) {
    if (o->port < 0 || o->port > 65535)
        return refuse(o, cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "port must be in [0, 65535], got %d", o->port));
    if (!o->model_root) return refuse(o, cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "no model name for the server"));
    cv_server *s = cv_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->sessions_mu, NULL);
    pthread_cond_init(&s->sessions_cv, NULL);
    s->group = group;
    s->tok = cvllm_engine_tokenizer(cv_engine_group_engine(group));
    s->pooling = cvllm_engine_is_pooling(cv_engine_group_engine(group));
    pooling_limits(s, cv_engine_group_engine(group));
    s->root = cv_xstrdup(o->model_root);
    s->n_names = o->n_served_model_names ? o->n_served_model_names : 1;
    s->names = o->n_served_model_names ? copy_strings(o->served_model_names, o->n_served_model_names)
                                       : copy_strings((const char *const *)&s->root, 1);
    s->keys = copy_strings(o->api_keys, o->n_api_keys);
    s->n_keys = o->n_api_keys;
    cv_server_loras_init(s, o);
    cv_cors_init(&s->cors, o->allowed_origins, o->n_allowed_origins, o->allowed_methods, o->n_allowed_methods,
                 o->allowed_headers, o->n_allowed_headers, o->allow_credentials);
    s->cached_details = o->enable_prompt_tokens_details;
    s->force_usage = o->enable_force_include_usage;
    s->request_id_headers = o->enable_request_id_headers;
    s->log_requests = o->log_requests;
    s->log_outputs = o->log_requests && o->log_outputs; /* vLLM: outputs need --enable-log-requests */
    s->max_log_len = o->max_log_len > 0 ? o->max_log_len : -1;
    s->load_tracking = o->enable_server_load_tracking;
    s->tokenizer_info = o->enable_tokenizer_info;
    if (o->responses_store) s->responses = cv_response_store_new();
    s->chat_template_given = o->chat_template_given;
    s->max_body = o->max_body_bytes ? o->max_body_bytes : DEFAULT_MAX_BODY;
    s->started = (int64_t)time(NULL);
    s->http_metrics = cv_http_metrics_create();
    fill_limits(s, o);
    int rc = setup_chat(s, o);
    if (rc) {
        free_server(s);
        return refuse(o, rc);
    }
    cv_http_options ho = {
        .host = o->host,
        .port = o->port,
        .bound = o->bound || o->uds,
        .bound_fd = o->bound_fd,
        .max_body = s->max_body,
        .max_connections = o->limit_concurrency > 0 ? o->limit_concurrency : DEFAULT_LIMIT_CONCURRENCY,
        .max_connections_per_client = o->limit_concurrency_per_client > 0 ? o->limit_concurrency_per_client
                                                                          : DEFAULT_LIMIT_PER_CLIENT,
        .timeout_keep_alive = o->timeout_keep_alive > 0 ? o->timeout_keep_alive : DEFAULT_KEEP_ALIVE_S,
        .timeout_request_header = o->timeout_request_header > 0 ? o->timeout_request_header : DEFAULT_HEADER_TIMEOUT_S,
        .timeout_io = IO_TIMEOUT_S,
        .tls = &o->tls,
    };
    if (!o->bound && o->uds && (rc = cv_http_bind_unix(o->uds, &ho.bound_fd))) {
        free_server(s);
        return rc;
    }
    cv_http_callbacks cb = {.user = s, .on_head = on_head, .on_request = on_request, .on_complete = on_complete,
                            .error_body = error_body};
    if ((rc = cv_http_start(&ho, &cb, &s->http))) {
        free_server(s);
        return rc;
    }
    *out = s;
    return 0;
}

int cv_server_bind(const char *host, int port, int *fd) { return cv_http_bind(host, port, fd); }

int cv_server_check_tls(const cv_tls_options *tls) {
    cv_tls *t;
    int rc = cv_tls_create(tls, &t);
    cv_tls_destroy(rc ? NULL : t);
    return rc;
}

int cv_server_bind_unix(const char *path, int *fd) { return cv_http_bind_unix(path, fd); }

int cv_server_port(const cv_server *s) { return cv_http_port(s->http); }

void cv_server_fail(cv_server *s, const char *why) {
    snprintf(s->failure, sizeof s->failure, "The engine failed: %s", why);
    atomic_store(&s->failed, true);
    cv_generate_fail_all(s, s->failure);
}

void cv_server_stop(cv_server *s, double drain_seconds) {
    if (!s) return;
    atomic_store(&s->draining, true);
    cv_http_quiesce(s->http);
    if (drain_seconds > 0 && !cv_engine_group_drain(s->group, drain_seconds))
        cv_warn("server", "requests still running after --shutdown-timeout %g s are aborted", drain_seconds);
    cv_generate_abort_all(s);
    /* Each aborted generation still gets its final event (finish_reason "abort", [DONE]), and the
     * HTTP layer writes those replies out before it closes the connections. */
    cv_http_stop(s->http);
    pthread_mutex_lock(&s->sessions_mu);
    while (s->sessions) pthread_cond_wait(&s->sessions_cv, &s->sessions_mu);
    pthread_mutex_unlock(&s->sessions_mu);
    free_server(s);
}
