/*
 * server.c — the HTTP side of `cvllm serve`: libmicrohttpd daemon, request bodies, API keys,
 * routing, and the small endpoints (/health, /ping, /version, /v1/models, /metrics, /tokenize,
 * /detokenize, /v1/chat/completions/render). Completions and chat live in generate.c.
 *
 * libmicrohttpd runs one thread per connection (see server_internal.h for why blocking is fine).
 * That costs a thread per open connection — acceptable for a CPU engine whose concurrency is bound
 * by max_num_seqs anyway — and buys straight-line handlers with no suspend/resume state machine.
 *
 * Checks run in vLLM's order: API key (paths under /v1 only), route, method, content type (415),
 * body size (413), then the endpoint's own validation (400/404). A body over the limit is read and
 * dropped rather than cut off mid-upload, so the client reliably sees the 413; with
 * "Expect: 100-continue" and a declared length the 413 goes out before the body is sent at all.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "server/metrics.h"
#include "server/server_internal.h"

enum { DEFAULT_MAX_BODY = 32 << 20, DEFAULT_MAX_N = 128, MAX_PROMPTS = 1024, IDLE_TIMEOUT_S = 60 };

/* ------------------------------------------------------------------------------------------------ */
/* Replies                                                                                           */

enum MHD_Result cv_http_send(struct MHD_Connection *c, unsigned status, const char *content_type, const char *body,
                             size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (content_type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result cv_http_send_error(struct MHD_Connection *c, const cv_api_error *err) {
    char *json = cv_api_error_json(err);
    enum MHD_Result rc = cv_http_send(c, (unsigned)err->status, "application/json", json, strlen(json));
    free(json);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    enum MHD_Result rc = cv_http_send(c, MHD_HTTP_OK, "application/json", s, strlen(s));
    free(s);
    return rc;
}

static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *message) {
    cv_api_error err;
    cv_api_fail(&err, status, NULL, "%s", message);
    return cv_http_send_error(c, &err);
}

bool cv_http_peer_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return true;
    struct pollfd p = {.fd = info->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

const char *cv_server_model_name(const cv_server *s, const char *requested, cv_api_error *err) {
    if (!requested) return s->names[0];
    for (size_t i = 0; i < s->n_names; i++)
        if (!strcmp(requested, s->names[i])) return s->names[i];
    cv_api_fail(err, 404, "model", "The model `%.200s` does not exist.", requested);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* Small endpoints                                                                                   */

static enum MHD_Result handle_models(cv_server *s, struct MHD_Connection *c) {
    json_t *data = json_array();
    for (size_t i = 0; i < s->n_names; i++) {
        char *perm = cv_xasprintf("modelperm-%s-%zu", s->names[0], i);
        json_t *permission = json_pack(
            "[{s:s, s:s, s:I, s:b, s:b, s:b, s:b, s:b, s:b, s:s, s:n, s:b}]", "id", perm, "object", "model_permission",
            "created", (json_int_t)s->started, "allow_create_engine", 0, "allow_sampling", 1, "allow_logprobs", 1,
            "allow_search_indices", 0, "allow_view", 1, "allow_fine_tuning", 0, "organization", "*", "group",
            "is_blocking", 0);
        free(perm);
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:o}", "id", s->names[i], "object",
                                              "model", "created", (json_int_t)s->started, "owned_by", "vllm", "root",
                                              s->root, "parent", "max_model_len", s->limits.max_model_len,
                                              "permission", permission));
    }
    return send_json(c, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static enum MHD_Result handle_metrics(cv_server *s, struct MHD_Connection *c) {
    cv_engine_stats st;
    cv_engine_loop_stats(s->loop, &st);
    char *text = cv_metrics_render(&st, s->names[0], s->http_metrics);
    enum MHD_Result rc = cv_http_send(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
    free(text);
    return rc;
}

static json_t *ids_array(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static enum MHD_Result handle_tokenize(cv_server *s, struct MHD_Connection *c, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    int rc = cv_api_parse_tokenize(body, len, &s->limits, &req, &err);
    if (!rc && !cv_server_model_name(s, req.model, &err)) rc = -1;
    cv_api_prompt *p = rc ? NULL : &req.prompts[0];
    if (p && cvllm_tokenize(s->tok, p->text, p->text_len, &p->ids, &p->n_ids) != CVLLM_OK)
        rc = cv_api_fail(&err, 400, "prompt", "%s", cvllm_last_error());
    if (rc) {
        cv_api_request_free(&req);
        return cv_http_send_error(c, &err);
    }
    json_t *strs = req.return_token_strs ? cv_api_token_strs(s->tok, p->ids, p->n_ids) : json_null();
    json_t *o = json_pack("{s:I, s:i, s:o, s:o}", "count", (json_int_t)p->n_ids, "max_model_len", s->limits.max_model_len,
                          "tokens", ids_array(p->ids, p->n_ids), "token_strs", strs);
    cv_api_request_free(&req);
    return send_json(c, o);
}

/* /v1/chat/completions/render: the request goes through every check of a chat completion (template,
 * tools, context length), and the prompt it would generate from comes back instead. */
static enum MHD_Result handle_render(cv_server *s, struct MHD_Connection *c, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    int rc = cv_api_parse_chat(body, len, &s->limits, &req, &err);
    const char *model = rc ? NULL : cv_server_model_name(s, req.model, &err);
    if (!model || cv_api_prepare(&req, s->tok, &s->limits, &err)) {
        cv_api_request_free(&req);
        return cv_http_send_error(c, &err);
    }
    const cv_api_prompt *p = &req.prompts[0];
    json_t *o = json_pack("{s:s, s:s%, s:o, s:I, s:i}", "model", model, "prompt", p->text, p->text_len, "token_ids",
                          ids_array(p->ids, p->n_ids), "count", (json_int_t)p->n_ids, "max_tokens", p->max_tokens);
    cv_api_request_free(&req);
    return send_json(c, o);
}

static enum MHD_Result handle_detokenize(cv_server *s, struct MHD_Connection *c, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    char *text = NULL;
    int rc = cv_api_parse_detokenize(body, len, &req, &err);
    if (!rc && !cv_server_model_name(s, req.model, &err)) rc = -1;
    for (size_t i = 0; !rc && i < req.prompts[0].n_ids; i++)
        if (req.prompts[0].ids[i] < 0 || req.prompts[0].ids[i] >= s->limits.vocab_size)
            rc = cv_api_fail(&err, 400, "tokens", "Token id %d is out of vocabulary", req.prompts[0].ids[i]);
    if (!rc && cvllm_detokenize(s->tok, req.prompts[0].ids, req.prompts[0].n_ids, false, &text) != CVLLM_OK)
        rc = cv_api_fail(&err, 400, "tokens", "%s", cvllm_last_error());
    cv_api_request_free(&req);
    if (rc) return cv_http_send_error(c, &err);
    enum MHD_Result r = send_json(c, json_pack("{s:s}", "prompt", text));
    cvllm_free(text);
    return r;
}

/* ------------------------------------------------------------------------------------------------ */
/* Routing                                                                                           */

typedef enum route_id {
    R_HEALTH, R_PING, R_VERSION, R_MODELS, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_COMPLETIONS, R_CHAT, R_CHAT_RENDER
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
    {"/v1/models", R_MODELS, "GET", false},
    {"/metrics", R_METRICS, NULL, false},
    {"/tokenize", R_TOKENIZE, "POST", true},
    {"/detokenize", R_DETOKENIZE, "POST", true},
    {"/v1/completions", R_COMPLETIONS, "POST", true},
    {"/v1/chat/completions", R_CHAT, "POST", true},
    {"/v1/chat/completions/render", R_CHAT_RENDER, "POST", true},
};

static bool method_allowed(const route *r, const char *method) {
    if (!r->methods) return true;
    if (!strcmp(method, "HEAD")) method = "GET"; /* libmicrohttpd sends the headers only */
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

static bool authorized(const cv_server *s, struct MHD_Connection *c) {
    if (s->n_keys == 0) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    bool ok = false;
    for (size_t i = 0; i < s->n_keys; i++) ok |= same_secret(h + 7, s->keys[i]);
    return ok;
}

static bool is_json_type(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ') ct++;
    size_t n = strlen("application/json");
    return !strncasecmp(ct, "application/json", n) && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

static enum MHD_Result too_large(const cv_server *s, struct MHD_Connection *c) {
    cv_api_error err;
    cv_api_fail(&err, 413, NULL, "Request body too large: the limit is %zu bytes", s->max_body);
    return cv_http_send_error(c, &err);
}

static const route *find_route(const char *url) {
    for (size_t i = 0; i < CV_ARRAY_LEN(routes); i++)
        if (!strcmp(url, routes[i].path)) return &routes[i];
    return NULL;
}

static enum MHD_Result dispatch(cv_server *s, struct MHD_Connection *c, const char *url, const char *method,
                                http_request *hr) {
    if (needs_key(url) && !authorized(s, c)) {
        /* vLLM's authentication middleware wraps the metrics one: a 401 never reaches the counts. */
        hr->handler = NULL;
        return fail(c, 401, "Unauthorized");
    }
    const route *r = find_route(url);
    if (!r) return fail(c, 404, "Not Found");
    if (!method_allowed(r, method)) return fail(c, 405, "Method Not Allowed");
    if (r->json_body && !hr->json) return fail(c, 415, "Unsupported Media Type: Only 'application/json' is allowed");
    if (hr->too_large) return too_large(s, c);
    const char *body = hr->body ? hr->body : "";
    switch (r->id) {
    case R_HEALTH:
    case R_PING: return cv_http_send(c, MHD_HTTP_OK, NULL, "", 0);
    case R_VERSION: return send_json(c, json_pack("{s:s}", "version", CVLLM_VERSION));
    case R_MODELS: return handle_models(s, c);
    case R_METRICS: return handle_metrics(s, c);
    case R_TOKENIZE: return handle_tokenize(s, c, body, hr->len);
    case R_DETOKENIZE: return handle_detokenize(s, c, body, hr->len);
    case R_COMPLETIONS: return cv_generate(s, c, CV_API_COMPLETION, body, hr->len);
    case R_CHAT: return cv_generate(s, c, CV_API_CHAT, body, hr->len);
    case R_CHAT_RENDER: return handle_render(s, c, body, hr->len);
    }
    return MHD_NO;
}

/* First call: headers only. An announced oversized body is refused before it is sent. The request's
 * HTTP metrics start here, as the instrumentator's middleware starts its clock when the request
 * reaches the app. */
static enum MHD_Result begin_request(cv_server *s, struct MHD_Connection *c, const char *url, const char *method,
                                     void **con_cls) {
    http_request *hr = cv_xcalloc(1, sizeof *hr);
    hr->s = s;
    hr->started = cv_now();
    const route *r = find_route(url);
    hr->handler = cv_http_metrics_handler(r ? r->path : NULL, url);
    snprintf(hr->method, sizeof hr->method, "%s", method);
    hr->json = is_json_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE));
    *con_cls = hr;
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (expect && length && strtoull(length, NULL, 10) > s->max_body) return too_large(s, c);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    cv_server *s = cls;
    (void)version;
    http_request *hr = *con_cls;
    if (!hr) return begin_request(s, c, url, method, con_cls);
    if (*upload_data_size) {
        if (hr->len + *upload_data_size > s->max_body) {
            hr->too_large = true;
        } else if (!hr->too_large) {
            if (hr->len + *upload_data_size + 1 > hr->cap) {
                hr->cap = (hr->len + *upload_data_size + 1) * 2;
                if (hr->cap > s->max_body + 1) hr->cap = s->max_body + 1;
                hr->body = cv_xrealloc(hr->body, hr->cap);
            }
            memcpy(hr->body + hr->len, upload_data, *upload_data_size);
            hr->len += *upload_data_size;
            hr->body[hr->len] = '\0';
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    return dispatch(s, c, url, method, hr);
}

/* The request is over (its response sent, or the connection gone): it counts now. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    cv_server *s = cls;
    (void)toe;
    http_request *hr = *con_cls;
    if (!hr) return;
    if (hr->handler) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
        cv_http_metrics_observe(s->http_metrics, hr->handler, hr->method, info ? info->http_status : 0,
                                cv_now() - hr->started);
    }
    free(hr->body);
    free(hr);
    *con_cls = NULL;
}

/* libmicrohttpd reports a connection closed on purpose (a client that left) as an "application
 * error"; generate.c logs those aborts itself, so they are only debug noise here. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    cv_log(strstr(line, "pplication") ? CV_LOG_DEBUG : CV_LOG_WARNING, "http", "%s", line);
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
    const cvllm_engine *e = cv_engine_loop_engine(s->loop);
    cv_api_limits *l = &s->limits;
    l->max_model_len = cvllm_engine_max_model_len(e);
    l->vocab_size = cvllm_engine_vocab_size(e);
    l->max_n = o->max_n > 0 ? o->max_n : DEFAULT_MAX_N;
    l->max_prompts = MAX_PROMPTS;
    cvllm_sampling_params_default(e, &l->defaults);
    /* generation_config's max_new_tokens caps every request, as in vLLM's get_max_tokens. */
    l->gen_max_tokens = cvllm_engine_generation_max_tokens(e);
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
    if (o->reasoning_parser) {
        if (strcmp(o->reasoning_parser, "qwen3") != 0)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "unknown reasoning parser '%s' (supported: qwen3)", o->reasoning_parser);
        chat->reasoning_parser = true;
    }
    if (o->tool_call_parser) {
        int rc = cv_tool_parser_from_name(o->tool_call_parser, &chat->tool_parser);
        if (rc) return rc;
        chat->has_tool_parser = true;
    }
    if (o->enable_auto_tool_choice && !chat->has_tool_parser)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--enable-auto-tool-choice requires --tool-call-parser");
    chat->auto_tool_choice = o->enable_auto_tool_choice;
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

static int bind_address(const cv_server_options *o, struct sockaddr_storage *addr, bool *ipv6) {
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res;
    int rc = getaddrinfo(o->host && *o->host ? o->host : "0.0.0.0", port, &hints, &res);
    if (rc) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cannot resolve host '%s': %s", o->host, gai_strerror(rc));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *ipv6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

static void free_server(cv_server *s) {
    cv_http_metrics_free(s->http_metrics);
    free_strings(s->names, s->n_names);
    free_strings(s->keys, s->n_keys);
    free(s->root);
    json_decref(s->default_kwargs);
    free(s);
}

int cv_server_start(cv_engine_loop *loop, const cv_server_options *o, cv_server **out) {
    if (o->port < 0 || o->port > 65535) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "port must be in [0, 65535], got %d", o->port);
    if (!o->model_root) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "no model name for the server");
    struct sockaddr_storage addr;
    bool ipv6 = false;
    int rc = bind_address(o, &addr, &ipv6);
    if (rc) return rc;
    cv_server *s = cv_xcalloc(1, sizeof *s);
    s->loop = loop;
    s->tok = cvllm_engine_tokenizer(cv_engine_loop_engine(loop));
    s->root = cv_xstrdup(o->model_root);
    s->n_names = o->n_served_model_names ? o->n_served_model_names : 1;
    s->names = o->n_served_model_names ? copy_strings(o->served_model_names, o->n_served_model_names)
                                       : copy_strings((const char *const *)&s->root, 1);
    s->keys = copy_strings(o->api_keys, o->n_api_keys);
    s->n_keys = o->n_api_keys;
    s->cached_details = o->enable_prompt_tokens_details;
    s->force_usage = o->enable_force_include_usage;
    s->max_body = o->max_body_bytes ? o->max_body_bytes : DEFAULT_MAX_BODY;
    s->started = (int64_t)time(NULL);
    s->http_metrics = cv_http_metrics_create();
    fill_limits(s, o);
    if ((rc = setup_chat(s, o))) {
        free_server(s);
        return rc;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0);
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED,
                                 on_completed, s, MHD_OPTION_END);
    if (!s->daemon) {
        free_server(s);
        return cv_fail(CVLLM_ERR_IO, "cannot listen on %s:%d (address in use or not available)",
                       o->host && *o->host ? o->host : "0.0.0.0", o->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : o->port;
    *out = s;
    return 0;
}

int cv_server_port(const cv_server *s) { return s->port; }

void cv_server_stop(cv_server *s, double drain_seconds) {
    if (!s) return;
    atomic_store(&s->draining, true);
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    if (drain_seconds > 0 && !cv_engine_loop_drain(s->loop, drain_seconds))
        cv_warn("server", "requests still running after --shutdown-timeout %g s are aborted", drain_seconds);
    atomic_store(&s->stopping, true);
    /* Sessions abort themselves within a wait slice; give their final chunks (finish_reason
     * "abort", [DONE]) time to reach the clients before the connections are closed. */
    for (int i = 0; i < 200 && atomic_load(&s->sessions) > 0; i++) usleep(10000);
    MHD_stop_daemon(s->daemon);
    free_server(s);
}
