/*
 * cmd_serve.c — `cvllm serve MODEL`: vLLM's OpenAI-compatible server (src/server/) on the engine
 * loop, with `vllm serve`'s flags so that vLLM command lines run with `cvllm` in place of `vllm`.
 *
 * --structured-outputs-config takes vLLM's StructuredOutputsConfig (JSON, or dotted keys such as
 * --structured-outputs-config.backend xgrammar, which args.c merges into one object) with vLLM's
 * checks. Its backend names a library vLLM would run; here every backend is cvllm's own grammar
 * engine, which is said once. Its options become the server's defaults for every constraint.
 *
 * Startup: parse every flag first (a malformed value is a usage error before any loading), create
 * the engine and start its loop (with -dp N: N replicas, each with its loop, behind a router:
 * engine/engine_group.h), load the chat template (from --chat-template, else the folder the
 * tokenizer came from; one that does not parse stops startup with its line and column), start the
 * HTTP server, then wait for SIGINT/SIGTERM in the main thread.
 * The signals are blocked before any thread exists, so every thread inherits the mask and only the
 * sigwait in main ever sees them. Shutdown follows --shutdown-timeout: stop accepting, let requests
 * in flight finish for up to that many seconds, abort the rest, stop the engines.
 */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "chat/chat.h"
#include "chat/tool_parser.h"
#include "cvllm.h"
#include "engine/engine_group.h"
#include "loader/resolve.h"
#include "server/api_fields.h"
#include "server/server.h"

typedef struct serve_args {
    cvllm_engine_options engine;
    cv_server_options server;
    const char **names;
    size_t n_names;
    const char **keys;
    size_t n_keys;
    const char *chat_template_file;
    const char *config_reasoning_parser; /* --structured-outputs-config's reasoning_parser */
    const char *structured_backend;      /* its backend, NULL when not given */
    json_t *structured_json;             /* its value, which the strings above point into */
    const char **lora_items;             /* --lora-modules as given */
    size_t n_lora_items;
    cv_server_lora *loras;               /* parsed, into the items and lora_json */
    cvllm_lora_module *lora_modules;     /* the same, for the engine */
    json_t *lora_json;                   /* the JSON items' values */
    json_t *cors_json[3];                /* --allowed-origins, --allowed-methods, --allowed-headers */
    const char **cors[3];                /* their strings, for the server */
    double shutdown_timeout;
    bool disable_log_stats;
    bool async_scheduling;
} serve_args;

static const char usage[] =
    "usage: cvllm serve MODEL [server options] [engine options]\n"
    "server options (vLLM's names):\n"
    "  --host HOST                       address to listen on (default: all interfaces)\n"
    "  --port N                          port (8000; 0 = any free port)\n"
    "  --uds PATH                        listen on a Unix socket instead (host and port unused)\n"
    "  --served-model-name NAME [NAME..] names clients use in \"model\" (default: MODEL)\n"
    "  --lora-modules NAME=PATH [..]     LoRA adapters (PEFT folders) served as \"model\": NAME, with\n"
    "                                    --enable-lora; or '{\"name\": N, \"path\": P, \"base_model_name\": B}'\n"
    "                                    (VLLM_ALLOW_RUNTIME_LORA_UPDATING=1: also POST /v1/load_lora_adapter\n"
    "                                    and /v1/unload_lora_adapter while serving)\n"
    "  --api-key KEY [KEY..]             require 'Authorization: Bearer KEY' on /v1 (also VLLM_API_KEY)\n"
    "  --allowed-origins, --allowed-methods, --allowed-headers JSON-LIST   CORS for browsers (each '[\"*\"]')\n"
    "  --allow-credentials               CORS: Access-Control-Allow-Credentials: true\n"
    "  --enable-prompt-tokens-details    report usage.prompt_tokens_details.cached_tokens\n"
    "  --return-tokens-as-token-ids      logprobs name tokens \"token_id:ID\" (a request may say otherwise)\n"
    "  --enable-force-include-usage      a usage chunk on every stream\n"
    "  --enable-request-id-headers       replies carry X-Request-Id (the client's, else a new one)\n"
    "  --enable-server-load-tracking     /load counts the generations in flight\n"
    "  --enable-tokenizer-info-endpoint  GET /tokenizer_info: the tokenizer's configuration\n"
    "  --shutdown-timeout S              on SIGTERM, let requests finish for up to S seconds (0)\n"
    "  --disable-log-stats               no periodic throughput / KV-cache log line\n"
    "  --[no-]async-scheduling           overlap output processing with the next step (on)\n"
    "  --max-body-bytes N                larger request bodies get 413 (32M)\n"
    "HTTPS (vLLM's names):\n"
    "  --ssl-certfile FILE               serve HTTPS with this PEM certificate chain\n"
    "  --ssl-keyfile FILE                its PEM private key (default: in the certfile)\n"
    "  --ssl-ca-certs FILE               PEM CA certificates client certificates are checked against\n"
    "  --ssl-cert-reqs N                 client certificates: 0 not asked for, 1 optional, 2 required (0)\n"
    "  --ssl-ciphers LIST                OpenSSL cipher list for TLS 1.2 (TLS 1.3 keeps its own)\n"
    "  --enable-ssl-refresh              reload the key, certificate and CA files when they change\n"
    "connection limits (uvicorn's names, cvllm's own where uvicorn has none):\n"
    "  --timeout-keep-alive S            close a connection idle for S seconds between requests (5)\n"
    "  --limit-concurrency N             open connections at most; at the cap the longest-idle one is\n"
    "                                    closed, with none idle newcomers get 503 (4096)\n"
    "  --limit-concurrency-per-client N  (cvllm) open connections per client address; beyond: 503 (1024)\n"
    "  --timeout-request-header S        (cvllm) a request's headers must arrive within S seconds, else\n"
    "                                    408 and the connection is closed (10)\n"
    "chat options (vLLM's names):\n"
    "  --chat-template T                 Jinja chat template: a file, or the template itself (text with\n"
    "                                    '{', '}' or a newline that names no file); default: the model's\n"
    "                                    chat_template.jinja, else tokenizer_config.json's chat_template\n"
    "  --chat-template-content-format F  auto (detected from the template), string or openai\n"
    "  --default-chat-template-kwargs J  JSON object of template variables, under each request's\n"
    "                                    chat_template_kwargs (e.g. '{\"enable_thinking\": false}')\n"
    "  --trust-request-chat-template     a request's chat_template renders its messages; without\n"
    "                                    this flag a template in a request is refused (400)\n"
    "  --reasoning-parser qwen3          <think> blocks go to message.reasoning / delta.reasoning\n"
    "  --reasoning-content               (cvllm) also emit the pre-2026 field name reasoning_content\n"
    "  --enable-auto-tool-choice         tool_choice \"auto\" (needs --tool-call-parser)\n"
    "  --exclude-tools-when-tool-choice-none  tool_choice \"none\" renders no tools into the prompt\n"
    "  --tool-call-parser NAME           hermes (Qwen3) or qwen3_coder (Qwen3-Coder, Qwen3.5/3.6)\n"
    "  --structured-outputs-config JSON  vLLM's keys: backend (any: all run cvllm's grammar engine),\n"
    "                                    disable_any_whitespace, disable_additional_properties,\n"
    "                                    enable_in_reasoning, reasoning_parser; (cvllm) whitespace_pattern.\n"
    "                                    Dotted keys work too: --structured-outputs-config.backend xgrammar\n"
    "Endpoints: /v1/completions /v1/chat/completions /v1/chat/completions/render /v1/responses (OpenAI's\n"
    "Responses API) /v1/messages (Anthropic's Messages API) /v1/messages/count_tokens /v1/models /tokenize\n"
    "/detokenize /health /ping /version /load /metrics /invocations; a pooling model: /v1/embeddings\n"
    "/v2/embed /classify /pooling /score /rerank.\n";

/* Flags of `vllm serve`'s frontend with no counterpart here: accepted with their values checked,
 * and logged once (the engine's own such flags are in args_engine.c). */
static const char *const fingerprint_modes[] = {"full", "hash", "custom", "none", NULL};

static const cv_ignored_flag ignored_serve_flags[] = {
    /* logging and documentation cvllm does not have: no access log, no Python logging config, no
     * stack traces, no FastAPI docs */
    {"--disable-access-log-for-endpoints", CV_IGNORED_STRING, NULL},
    {"--log-config-file", CV_IGNORED_STRING, NULL},
    {"--log-error-stack", CV_IGNORED_BOOL, NULL},
    {"--enable-log-deltas", CV_IGNORED_BOOL, NULL},
    {"--enable-offline-docs", CV_IGNORED_BOOL, NULL},
    /* the path a proxy strips before forwarding; routing never sees it */
    {"--root-path", CV_IGNORED_STRING, NULL},
    /* h11's parser limits: cvllm's own parser has its own (docs/http.md) */
    {"--h11-max-header-count", CV_IGNORED_INT, NULL},
    {"--h11-max-incomplete-event-size", CV_IGNORED_INT, NULL},
    {"--fingerprint-mode", CV_IGNORED_CHOICE, fingerprint_modes},
    {"--fingerprint-value", CV_IGNORED_STRING, NULL},
    {"--enable-per-request-metrics", CV_IGNORED_BOOL, NULL},
    /* the Cohere /cohere/v2/chat frontend's, and a GPU kernel for late-interaction scores */
    {"--cohere-is-reasoning-model", CV_IGNORED_BOOL, NULL},
    {"--cohere-format", CV_IGNORED_STRING, NULL},
    {"--enable-flash-late-interaction", CV_IGNORED_BOOL, NULL},
    /* the refused --headless and --tokens-only, turned off: the default */
    {"--no-headless|--no-tokens-only", CV_IGNORED_SWITCH, NULL},
    /* multi-port external load balancing of data-parallel API servers: one server here */
    {"--data-parallel-supervisor-port", CV_IGNORED_INT, NULL},
    {"--dp-supervisor-probe-interval-s", CV_IGNORED_FLOAT, NULL},
    {"--dp-supervisor-probe-timeout-s", CV_IGNORED_FLOAT, NULL},
    {"--dp-supervisor-probe-failure-threshold", CV_IGNORED_INT, NULL},
    {"--api-server-count|-asc", CV_IGNORED_INT, NULL},
    {"--disable-frontend-multiprocessing", CV_IGNORED_BOOL, NULL},
    {"--uvicorn-log-level", CV_IGNORED_STRING, NULL},
    {"--response-role", CV_IGNORED_STRING, NULL},
    {"--disable-fastapi-docs", CV_IGNORED_BOOL, NULL},
    {"--disable-uvicorn-access-log", CV_IGNORED_BOOL, NULL},
    /* streamed chunks carry each step's tokens; the text is the same */
    {"--stream-interval", CV_IGNORED_INT, NULL},
    {"--show-hidden-metrics-for-version", CV_IGNORED_STRING, NULL},
};

/* One key of --structured-outputs-config into g; an error in pydantic's words, or NULL. */
static char *structured_key(const char *key, const json_t *v, serve_args *g) {
    static const char *const backends[] = {"auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"};
    cv_api_structured_config *so = &g->server.structured;
    cv_pyfailure f;
    bool flag = false;
    bool *target = !strcmp(key, "disable_any_whitespace")          ? &so->disable_any_whitespace
                   : !strcmp(key, "disable_additional_properties") ? &so->disable_additional_properties
                   : !strcmp(key, "enable_in_reasoning")           ? &so->enable_in_reasoning
                   : !strcmp(key, "disable_fallback")              ? &flag /* one engine: nothing to fall back to */
                                                                   : NULL;
    if (target) return cv_py_bool(v, target, &f) ? NULL : cv_xasprintf("%s: %s", key, f.msg);
    bool is_str = json_is_string(v);
    const char *text = json_string_value(v);
    if (!strcmp(key, "backend")) {
        for (size_t i = 0; is_str && i < CV_ARRAY_LEN(backends); i++)
            if (!strcmp(text, backends[i])) {
                g->structured_backend = backends[i];
                return NULL;
            }
        return cv_xstrdup("backend: Input should be 'auto', 'xgrammar', 'guidance', 'outlines' or 'lm-format-enforcer'");
    }
    if (strcmp(key, "reasoning_parser") && strcmp(key, "reasoning_parser_plugin") && strcmp(key, "whitespace_pattern"))
        return cv_xasprintf("%s: Unexpected keyword argument", key);
    if (!is_str) return cv_xasprintf("%s: Input should be a valid string", key);
    if (!strcmp(key, "reasoning_parser")) {
        if (*text && strcmp(text, "qwen3") != 0) return cv_xasprintf("invalid reasoning parser: %s (chose from { qwen3 })", text);
        g->config_reasoning_parser = *text ? text : NULL;
    } else if (!strcmp(key, "reasoning_parser_plugin")) {
        if (*text) return cv_xasprintf("reasoning_parser_plugin: cvllm loads no Python plugins ('%s')", text);
    } else {
        so->whitespace_pattern = text;
    }
    return NULL;
}

/* --structured-outputs-config: validated as vLLM validates StructuredOutputsConfig, every error
 * listed. The strings it hands out point into *j, which the caller keeps. */
static bool structured_config(cv_args *a, serve_args *g) {
    const char *v;
    if (!cv_args_value(a, "--structured-outputs-config", &v)) return false;
    if (!v) return true;
    json_error_t jerr;
    json_t *j = json_loads(v, JSON_DECODE_ANY, &jerr);
    if (!json_is_object(j)) {
        cv_args_error(a, "--structured-outputs-config must be a JSON object%s%s", j ? ", got " : ": ", j ? v : jerr.text);
        json_decref(j);
        return true;
    }
    /* argparse keeps the last value: a repeated flag starts over */
    json_decref(g->structured_json);
    g->structured_json = j;
    g->server.structured = (cv_api_structured_config){0};
    g->structured_backend = g->config_reasoning_parser = NULL;
    char *errors = NULL;
    int n = 0;
    const char *key;
    json_t *field;
    json_object_foreach(j, key, field) {
        char *e = structured_key(key, field, g);
        if (!e) continue;
        char *more = errors ? cv_xasprintf("%s; %s", errors, e) : cv_xstrdup(e);
        free(errors);
        free(e);
        errors = more;
        n++;
    }
    /* vLLM's own check: these options exist only in some of its backends. */
    const cv_api_structured_config *so = &g->server.structured;
    const char *backend = g->structured_backend ? g->structured_backend : "auto";
    const char *unsupported = NULL;
    if (so->disable_any_whitespace && strcmp(backend, "xgrammar") && strcmp(backend, "guidance"))
        unsupported = "disable_any_whitespace is only supported for xgrammar and guidance backends.";
    else if (so->disable_additional_properties && strcmp(backend, "guidance"))
        unsupported = "disable_additional_properties is only supported for the guidance backend.";
    if (!errors && unsupported) {
        errors = cv_xstrdup(unsupported);
        n = 1;
    }
    if (errors)
        cv_args_error(a, "argument --structured-outputs-config: %d validation error%s for StructuredOutputsConfig: %s", n,
                      n > 1 ? "s" : "", errors);
    free(errors);
    return true;
}

/* vLLM's filesystem LoRA resolver plugin: VLLM_LORA_RESOLVER_CACHE_DIR, when the plugin is loaded
 * (VLLM_PLUGINS unset loads every plugin; else it must name lora_filesystem_resolver). A directory
 * that is not there stops startup, as the plugin's registration does. Non-zero after an error. */
static int lora_resolver(cv_args *a, serve_args *g) {
    const char *dir = getenv("VLLM_LORA_RESOLVER_CACHE_DIR"), *plugins = getenv("VLLM_PLUGINS");
    if (!dir || !*dir) return 0;
    if (plugins) {
        bool listed = false;
        for (const char *p = plugins; *p;) {
            const size_t n = strcspn(p, ",");
            listed |= n == strlen("lora_filesystem_resolver") && !strncmp(p, "lora_filesystem_resolver", n);
            p += n + (p[n] == ',');
        }
        if (!listed) return 0;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return cv_args_error(a, "VLLM_LORA_RESOLVER_CACHE_DIR must be set to a valid directory for Filesystem "
                             "Resolver plugin to function");
    g->server.lora_resolver_dir = dir;
    return 0;
}

/* The --lora-modules items as vLLM's LoRAParserAction reads them: NAME=PATH, else a JSON object of
 * name, path and base_model_name. */
static int parse_lora_modules(cv_args *a, serve_args *g) {
    g->loras = cv_xcalloc(g->n_lora_items + 1, sizeof *g->loras);
    g->lora_modules = cv_xcalloc(g->n_lora_items + 1, sizeof *g->lora_modules);
    g->lora_json = json_array();
    size_t n = 0;
    for (size_t i = 0; i < g->n_lora_items; i++) {
        const char *item = g->lora_items[i], *eq = strchr(item, '=');
        cv_server_lora *l = &g->loras[n];
        if (!*item) continue;
        if (eq && !strchr(item, ',')) {
            if (strchr(eq + 1, '=') || eq == item || !eq[1])
                return cv_args_error(a, "Invalid format for --lora-modules: %s (expected NAME=PATH)", item);
            char *name = cv_xstrndup(item, (size_t)(eq - item));
            json_array_append_new(g->lora_json, json_string(name)); /* keeps the copy */
            free(name);
            l->name = json_string_value(json_array_get(g->lora_json, json_array_size(g->lora_json) - 1));
            l->path = eq + 1;
        } else {
            json_t *j = json_loads(item, 0, NULL);
            if (!json_is_object(j)) {
                json_decref(j);
                return cv_args_error(a, "Invalid JSON format for --lora-modules: %s", item);
            }
            json_array_append_new(g->lora_json, j);
            const char *key;
            json_t *v;
            json_object_foreach(j, key, v) {
                const char **field = !strcmp(key, "name") ? &l->name : !strcmp(key, "path") ? &l->path
                                     : !strcmp(key, "base_model_name")                    ? &l->base_model_name
                                                                                          : NULL;
                if (!field || !(json_is_string(v) || (field == &l->base_model_name && json_is_null(v))))
                    return cv_args_error(a, "Invalid fields for --lora-modules: %s - %s", item,
                                         field ? "name, path and base_model_name must be strings"
                                               : "unexpected keyword argument");
                *field = json_string_value(v);
            }
            if (!l->name || !l->path)
                return cv_args_error(a, "Invalid fields for --lora-modules: %s - missing the required name and path",
                                     item);
        }
        g->lora_modules[n] = (cvllm_lora_module){l->name, l->path};
        n++;
    }
    g->engine.lora_modules = g->lora_modules;
    g->engine.n_lora_modules = (int32_t)n;
    g->server.loras = g->loras;
    g->server.n_loras = n;
    return 0;
}

static bool chat_flag(cv_args *a, serve_args *g) {
    const char *v;
    if (cv_args_value(a, "--chat-template", &v)) g->chat_template_file = v;
    else if (cv_args_value(a, "--chat-template-content-format", &v)) {
        if (v && cv_chat_content_format_parse(v, &g->server.chat_template_content_format))
            cv_args_error(a, "argument --chat-template-content-format: %s", cvllm_last_error());
    } else if (cv_args_value(a, "--default-chat-template-kwargs", &v)) {
        json_t *j = v ? json_loads(v, 0, NULL) : NULL;
        if (v && !json_is_object(j)) cv_args_error(a, "--default-chat-template-kwargs must be a JSON object, got '%s'", v);
        json_decref(j);
        g->server.default_chat_template_kwargs = v;
    } else if (cv_args_value(a, "--reasoning-parser", &v)) {
        if (v && strcmp(v, "qwen3") != 0) cv_args_error(a, "unknown --reasoning-parser '%s' (supported: qwen3)", v);
        g->server.reasoning_parser = v;
    } else if (cv_args_value(a, "--tool-call-parser", &v)) {
        cv_tool_parser_kind kind;
        if (v && cv_tool_parser_from_name(v, &kind)) cv_args_error(a, "%s", cvllm_last_error());
        g->server.tool_call_parser = v;
    } else if (cv_args_flag(a, "--reasoning-content")) {
        g->server.reasoning_content = true;
    } else if (!cv_args_bool(a, "--enable-auto-tool-choice", &g->server.enable_auto_tool_choice) &&
               !cv_args_bool(a, "--exclude-tools-when-tool-choice-none", &g->server.exclude_tools_when_tool_choice_none) &&
               !cv_args_bool(a, "--trust-request-chat-template", &g->server.trust_request_chat_template)) {
        return structured_config(a, g);
    }
    return true;
}

/* vLLM's CORS lists (json.loads of the flag's value; a list of strings here, as Starlette reads them). */
static bool cors_flag(cv_args *a, serve_args *g) {
    static const char *const flags[3] = {"--allowed-origins", "--allowed-methods", "--allowed-headers"};
    const char *v;
    for (int k = 0; k < 3; k++) {
        if (!cv_args_value(a, flags[k], &v)) continue;
        json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
        size_t i, n = json_array_size(j);
        const json_t *item;
        bool strings = json_is_array(j);
        json_array_foreach(j, i, item) strings &= json_is_string(item);
        if (!j) cv_args_error(a, "argument %s: invalid loads value: '%s'", flags[k], v);
        else if (!strings) cv_args_error(a, "argument %s: expected a JSON list of strings, got '%s'", flags[k], v);
        if (!strings) {
            json_decref(j);
            return true;
        }
        json_decref(g->cors_json[k]);
        g->cors_json[k] = j;
        g->cors[k] = cv_xrealloc(g->cors[k], (n + 1) * sizeof *g->cors[k]);
        json_array_foreach(j, i, item) g->cors[k][i] = json_string_value(item);
        const char *const **list[3] = {&g->server.allowed_origins, &g->server.allowed_methods, &g->server.allowed_headers};
        size_t *count[3] = {&g->server.n_allowed_origins, &g->server.n_allowed_methods, &g->server.n_allowed_headers};
        *list[k] = g->cors[k];
        *count[k] = n;
        return true;
    }
    return cv_args_bool(a, "--allow-credentials", &g->server.allow_credentials);
}

static const cv_refused_flag refused_serve_flags[] = {
    {"--middleware|--tool-parser-plugin|--tool-server|--reasoning-parser-plugin", "cvllm cannot load Python plugins"},
    {"--headless|--tokens-only", "cvllm always serves the OpenAI API from this process"},
};

/* vLLM's request log (request_log.h): taken here, before the engine flags, which only accept them. */
static bool log_flag(cv_args *a, serve_args *g) {
    const char *v;
    int64_t n;
    if (cv_args_flag(a, "--disable-log-requests")) g->server.log_requests = false; /* vLLM's older name */
    else if (cv_args_bool(a, "--enable-log-requests", &g->server.log_requests) ||
             cv_args_bool(a, "--enable-log-outputs", &g->server.log_outputs)) {
    } else if (cv_args_value(a, "--max-log-len", &v)) {
        if (cv_args_int(a, "--max-log-len", v, 0, INT64_MAX, &n)) g->server.max_log_len = n;
    } else return false;
    return true;
}

/* vLLM's HTTPS flags (uvicorn's): server/tls.h. */
static bool tls_flag(cv_args *a, serve_args *g) {
    cv_tls_options *t = &g->server.tls;
    const char *v;
    int64_t n;
    if (cv_args_value(a, "--ssl-keyfile", &v)) t->keyfile = v;
    else if (cv_args_value(a, "--ssl-certfile", &v)) t->certfile = v;
    else if (cv_args_value(a, "--ssl-ca-certs", &v)) t->ca_certs = v;
    else if (cv_args_value(a, "--ssl-ciphers", &v)) t->ciphers = v;
    else if (cv_args_value(a, "--ssl-cert-reqs", &v)) {
        if (cv_args_int(a, "--ssl-cert-reqs", v, 0, 2, &n)) t->cert_reqs = (int)n;
    } else if (!cv_args_bool(a, "--enable-ssl-refresh", &t->refresh)) {
        return false;
    }
    return true;
}

static bool server_flag(cv_args *a, serve_args *g) {
    const char *v;
    int64_t n;
    if (cors_flag(a, g) || log_flag(a, g) || tls_flag(a, g) ||
        cv_args_refused(a, refused_serve_flags, CV_ARRAY_LEN(refused_serve_flags)))
        return true;
    if (cv_args_value(a, "--host", &v)) g->server.host = v;
    else if (cv_args_value(a, "--uds", &v)) g->server.uds = v;
    else if (cv_args_value(a, "--port", &v)) {
        if (cv_args_int(a, "--port", v, 0, 65535, &n)) g->server.port = (int)n;
    } else if (cv_args_list(a, "--served-model-name", &g->names, &g->n_names)) {
    } else if (cv_args_list(a, "--lora-modules", &g->lora_items, &g->n_lora_items)) {
    } else if (cv_args_list(a, "--api-key", &g->keys, &g->n_keys)) {
    } else if (cv_args_bool(a, "--enable-prompt-tokens-details", &g->server.enable_prompt_tokens_details) ||
               cv_args_bool(a, "--return-tokens-as-token-ids", &g->server.return_tokens_as_token_ids) ||
               cv_args_bool(a, "--enable-force-include-usage", &g->server.enable_force_include_usage) ||
               cv_args_bool(a, "--enable-request-id-headers", &g->server.enable_request_id_headers) ||
               cv_args_bool(a, "--enable-server-load-tracking", &g->server.enable_server_load_tracking) ||
               cv_args_bool(a, "--enable-tokenizer-info-endpoint", &g->server.enable_tokenizer_info) ||
               cv_args_bool(a, "--disable-log-stats", &g->disable_log_stats) ||
               cv_args_bool(a, "--async-scheduling", &g->async_scheduling)) {
    } else if (cv_args_value(a, "--shutdown-timeout", &v)) {
        cv_args_float(a, "--shutdown-timeout", v, 0, 1e9, &g->shutdown_timeout);
    } else if (cv_args_value(a, "--max-body-bytes", &v)) {
        if (cv_args_int(a, "--max-body-bytes", v, 1024, INT64_MAX, &n)) g->server.max_body_bytes = (size_t)n;
    } else if (cv_args_value(a, "--timeout-keep-alive", &v)) {
        cv_args_float(a, "--timeout-keep-alive", v, 0.001, 1e6, &g->server.timeout_keep_alive);
    } else if (cv_args_value(a, "--timeout-request-header", &v)) {
        cv_args_float(a, "--timeout-request-header", v, 0.001, 1e6, &g->server.timeout_request_header);
    } else if (cv_args_value(a, "--limit-concurrency", &v)) {
        if (cv_args_int(a, "--limit-concurrency", v, 1, 1 << 20, &n)) g->server.limit_concurrency = (int)n;
    } else if (cv_args_value(a, "--limit-concurrency-per-client", &v)) {
        if (cv_args_int(a, "--limit-concurrency-per-client", v, 1, 1 << 20, &n))
            g->server.limit_concurrency_per_client = (int)n;
    } else return chat_flag(a, g) || cv_args_ignored(a, ignored_serve_flags, CV_ARRAY_LEN(ignored_serve_flags));
    return true;
}

static int parse_serve_args(cv_args *a, serve_args *g) {
    cvllm_engine_options_default(&g->engine);
    /* vLLM's token budget for the API server on CPU is 2048 (its offline LLM class, like `cvllm
     * generate`, gets the engine default 4096); it also sizes the activation scratch. */
    g->engine.max_num_batched_tokens = 2048;
    g->server.port = 8000;
    g->async_scheduling = true;
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i];
        if (cv_args_flag(a, "--help|-h")) {
            fputs(usage, stdout);
            fputs(cv_args_engine_help, stdout);
            return -1;
        }
        if (server_flag(a, g) || cv_args_engine(a, &g->engine)) continue;
        if (arg[0] == '-' && arg[1]) {
            if (cv_args_unknown(a)) continue;
            return 2;
        }
        if (g->engine.model) return cv_args_error(a, "unexpected argument '%s'", arg);
        g->engine.model = arg;
        a->i++;
    }
    if (a->failed) return 2;
    if (!g->engine.model) return cv_args_error(a, "no MODEL given (see cvllm serve --help)");
    if (parse_lora_modules(a, g)) return 2;
    if (g->server.enable_auto_tool_choice && !g->server.tool_call_parser)
        return cv_args_error(a, "--enable-auto-tool-choice requires --tool-call-parser");
    /* vLLM's --reasoning-parser is the same setting as the config's reasoning_parser. */
    if (!g->server.reasoning_parser) g->server.reasoning_parser = g->config_reasoning_parser;
    if (g->structured_json)
        cv_info("serve", "structured outputs: backend '%s' is served by cvllm's own grammar engine (every backend is)",
                g->structured_backend ? g->structured_backend : "auto");
    const char *env_key = getenv("VLLM_API_KEY");
    if (g->n_keys == 0 && env_key && *env_key) {
        g->keys = cv_xrealloc(g->keys, sizeof *g->keys);
        g->keys[g->n_keys++] = env_key;
    }
    g->server.runtime_lora_updating = cv_vllm_env_true("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
    g->server.responses_store = cv_vllm_env_true("VLLM_ENABLE_RESPONSES_API_STORE");
    if (g->server.responses_store) /* vLLM's warning */
        cv_warn("serve", "VLLM_ENABLE_RESPONSES_API_STORE is enabled: /v1/responses keeps every response in memory "
                "until the server stops, so memory grows with each one");
    if (lora_resolver(a, g)) return 2;
    g->server.model_root = g->engine.model;
    g->server.served_model_names = g->names;
    g->server.n_served_model_names = g->n_names;
    g->server.api_keys = g->keys;
    g->server.n_api_keys = g->n_keys;
    return 0;
}

/* SIGINT, SIGTERM, and as a rank of a tensor-parallel job SIGUSR2: the launcher's SIGTERM, which
 * mpirun forwards (cli/launch.c). */
static void stop_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    if (getenv("OMPI_COMM_WORLD_SIZE")) sigaddset(set, SIGUSR2);
}

static int wait_for_signal(void) {
    sigset_t set;
    stop_signals(&set);
    int sig = 0;
    sigwait(&set, &sig);
    return sig;
}

/* Rank 0 of a tensor-parallel job got SIGTERM, which there means the job is ending: mpirun sends it
 * when a rank died (and SIGKILL 5 s later, cli/launch.c), rank 0's watchdog when a rank stopped
 * answering (executor/comm.h); a user's SIGTERM reaches rank 0 as SIGUSR2. The engine may never
 * return from its step, so nothing waits for it: requests in flight are answered with an error, new
 * ones with 503 for a moment, and the process ends with status 1 — skipping MPI's finalisation,
 * which would wait for the dead rank. */
static _Noreturn void fail_job(cv_server *s) {
    cv_error_log("serve", "a tensor-parallel rank died or stopped answering: failing the requests in flight, "
                          "exiting");
    cv_server_fail(s, "a tensor-parallel rank died or stopped answering");
    sleep(2); /* the error replies go out; new requests meanwhile get 503 */
    _exit(1);
}

/* The template of the folder the tokenizer comes from (vLLM takes it from the tokenizer), or
 * --chat-template. A model without any is served without chat, as vLLM does. */
static int load_chat_template(const serve_args *g, cv_chat_template **out) {
    *out = NULL;
    const char *source = g->engine.tokenizer ? g->engine.tokenizer : g->engine.model;
    char *dir = NULL;
    const cv_hub_options access = {.revision = g->engine.revision, .cache_dir = g->engine.download_dir,
                                   .token = g->engine.hf_token};
    int rc = cv_resolve_model(source, &access, false, &dir);
    if (rc && !g->chat_template_file) return rc;
    rc = cv_chat_template_load(dir, g->chat_template_file, out);
    free(dir);
    if (rc == CVLLM_ERR_NOT_FOUND && !g->chat_template_file) {
        cv_warn("serve", "%s; /v1/chat/completions will refuse requests", cvllm_last_error());
        return 0;
    }
    return rc;
}

/* A --chat-template that cannot be read or does not parse is said before the model loads (minutes
 * for a large one) and before any rank starts, as vLLM's startup checks its path at once; it is
 * loaded again, with the model folder's special tokens, once the engine is up. */
static int check_chat_template(const serve_args *g) {
    if (!g->chat_template_file) return 0;
    cv_chat_template *t = NULL;
    const int rc = cv_chat_template_load(NULL, g->chat_template_file, &t);
    cv_chat_template_free(t);
    if (!rc) return 0;
    fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
    return 1;
}

/* The HTTPS flags, checked before the model loads: a key without its certificate is refused (the
 * server would otherwise come up as plain HTTP), the files must load, and the flags that only
 * shape HTTPS are said to do nothing without it. */
static int check_tls(serve_args *g) {
    const cv_tls_options *t = &g->server.tls;
    if (!t->certfile) {
        if (t->keyfile) {
            fprintf(stderr, "cvllm serve: --ssl-keyfile needs --ssl-certfile (the certificate of that key)\n");
            return 2;
        }
        if (t->ca_certs || t->ciphers || t->cert_reqs || t->refresh)
            cv_warn("serve", "--ssl-ca-certs, --ssl-cert-reqs, --ssl-ciphers and --enable-ssl-refresh do nothing "
                    "without --ssl-certfile: serving plain HTTP");
        return 0;
    }
    if (cv_launch_job_rank() > 0) return 0; /* rank 0 serves HTTP */
    if (cv_server_check_tls(t)) {
        fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
        return 1;
    }
    return 0;
}

/* vLLM binds its address before it loads the model, so that one in use is said at once, not after
 * minutes of loading: so does this process, unless it is a worker rank of a tensor-parallel job
 * (world rank 0 serves HTTP). */
static int bind_early(serve_args *g) {
    if (cv_launch_job_rank() > 0) return 0;
    if (g->server.uds ? cv_server_bind_unix(g->server.uds, &g->server.bound_fd)
                      : cv_server_bind(g->server.host, g->server.port, &g->server.bound_fd)) {
        fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
        return 1;
    }
    g->server.bound = true;
    return 0;
}

static void unbind(serve_args *g) {
    if (g->server.bound) close(g->server.bound_fd);
    if (g->server.bound && g->server.uds) unlink(g->server.uds); /* the socket file this process made */
    g->server.bound = false;
}

static int run_server(cv_args *a, serve_args *g) {
    cv_loop_options lo = {.async_scheduling = g->async_scheduling, .log_stats_interval = g->disable_log_stats ? 0 : 5};
    cv_engine_group *group = NULL;
    int rc = cv_engine_group_start(&g->engine, &lo, &group);
    if (rc) {
        cv_args_report_engine_error(a, rc);
        unbind(g);
        return 1;
    }
    cv_chat_template *tmpl = NULL;
    if ((rc = load_chat_template(g, &tmpl))) {
        fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
        unbind(g);
        cv_engine_group_stop(group);
        return 1;
    }
    g->server.chat_template = tmpl;
    g->server.chat_template_given = g->chat_template_file != NULL;
    cv_server *s = NULL;
    if ((rc = cv_server_start(group, &g->server, &s))) {
        fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
        if (g->server.uds) unlink(g->server.uds); /* the socket bind_early made, closed by the failed start */
        cv_engine_group_stop(group);
        cv_chat_template_free(tmpl);
        return 1;
    }
    if (g->server.uds)
        cv_info("serve", "cvllm %s API server on unix:%s (model '%s')", CVLLM_VERSION, g->server.uds,
                g->n_names ? g->names[0] : g->engine.model);
    else
        cv_info("serve", "cvllm %s API server on %s://%s:%d (model '%s')", CVLLM_VERSION, g->server.tls.certfile ? "https" : "http",
                g->server.host ? g->server.host : "0.0.0.0", cv_server_port(s), g->n_names ? g->names[0] : g->engine.model);
    int sig = wait_for_signal();
    if (sig == SIGTERM && getenv("OMPI_COMM_WORLD_SIZE")) fail_job(s);
    cv_info("serve", "%s received, shutting down (--shutdown-timeout %g s)", sig == SIGINT ? "SIGINT" : "SIGTERM",
            g->shutdown_timeout);
    cv_server_stop(s, g->shutdown_timeout);
    cv_engine_group_stop(group);
    cv_chat_template_free(tmpl);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    /* Before any thread exists, so that all of them inherit the mask (see the top). */
    sigset_t set;
    stop_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    serve_args g = {0};
    cv_args a;
    int status = cv_args_init(&a, "serve", argc, argv);
    if (status == 0) status = parse_serve_args(&a, &g);
    if (status == 0) status = check_chat_template(&g);
    if (status == 0) status = check_tls(&g);
    if (status == 0) status = bind_early(&g);
    if (status == 0 && cv_launch_wanted(&a, &g.engine)) {
        unbind(&g); /* the address was free: rank 0 binds it again */
        cv_launch_ranks(&a, &g.engine, &status);
    } else if (status == 0) {
        status = run_server(&a, &g);
    }
    free(g.names);
    free(g.keys);
    json_decref(g.structured_json);
    free(g.lora_items);
    free(g.loras);
    free(g.lora_modules);
    json_decref(g.lora_json);
    for (int k = 0; k < 3; k++) {
        json_decref(g.cors_json[k]);
        free(g.cors[k]);
    }
    cv_args_free(&a);
    return status < 0 ? 0 : status;
}
