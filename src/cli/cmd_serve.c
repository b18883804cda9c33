/*
 * cmd_serve.c — `cvllm serve MODEL`: vLLM's OpenAI-compatible server (src/server/) on the engine
 * loop, with `vllm serve`'s flags so that vLLM command lines run with `cvllm` in place of `vllm`.
 *
 * Startup: parse every flag first (a malformed value is a usage error before any loading), create
 * the engine, start the loop and the HTTP server, then wait for SIGINT/SIGTERM in the main thread.
 * The signals are blocked before any thread exists, so every thread inherits the mask and only the
 * sigwait in main ever sees them. Shutdown follows --shutdown-timeout: stop accepting, let requests
 * in flight finish for up to that many seconds, abort the rest, stop the engine.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cvllm.h"
#include "engine/engine_loop.h"
#include "server/server.h"

typedef struct serve_args {
    cvllm_engine_options engine;
    cv_server_options server;
    const char **names;
    size_t n_names;
    const char **keys;
    size_t n_keys;
    double shutdown_timeout;
    bool disable_log_stats;
    bool async_scheduling;
} serve_args;

static const char usage[] =
    "usage: cvllm serve MODEL [server options] [engine options]\n"
    "server options (vLLM's names):\n"
    "  --host HOST                       address to listen on (default: all interfaces)\n"
    "  --port N                          port (8000; 0 = any free port)\n"
    "  --served-model-name NAME [NAME..] names clients use in \"model\" (default: MODEL)\n"
    "  --api-key KEY [KEY..]             require 'Authorization: Bearer KEY' on /v1 (also VLLM_API_KEY)\n"
    "  --enable-prompt-tokens-details    report usage.prompt_tokens_details.cached_tokens\n"
    "  --enable-force-include-usage      a usage chunk on every stream\n"
    "  --shutdown-timeout S              on SIGTERM, let requests finish for up to S seconds (0)\n"
    "  --disable-log-stats               no periodic throughput / KV-cache log line\n"
    "  --[no-]async-scheduling           overlap output processing with the next step (on)\n"
    "  --max-body-bytes N                larger request bodies get 413 (32M)\n"
    "Endpoints: /v1/completions /v1/chat/completions /v1/models /tokenize /detokenize /health /ping\n"
    "/version /metrics.\n";

/* Values following a flag up to the next option: vLLM's nargs="+" flags. */
static bool multi_value(cv_args *a, const char *name, const char ***list, size_t *n) {
    const char *v;
    if (!cv_args_value(a, name, &v)) return false;
    if (!v) return true;
    for (;;) {
        *list = cv_xrealloc(*list, (*n + 1) * sizeof **list);
        (*list)[(*n)++] = v;
        if (a->i >= a->argc || a->argv[a->i][0] == '-') break;
        v = a->argv[a->i++];
    }
    return true;
}

/* Flags of `vllm serve` that describe GPU/multi-process layouts or frontend details with no
 * counterpart here: accepted with their values checked, and logged once. */
static bool ignored_serve_flag(cv_args *a) {
    static const char *int_flags[] = {"--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
                                      "--data-parallel-size", "-dp", "--max-log-len", "--max-seq-len-to-capture",
                                      "--swap-space", "--api-server-count"};
    static const char *value_flags[] = {"--uvicorn-log-level", "--kv-cache-dtype", "--scheduling-policy",
                                        "--response-role"};
    /* --disable-log-requests is a switch in vllm serve; it is matched here before the shared engine
     * flags (args.c), which would take the next argument as its value. */
    static const char *bool_flags[] = {"--enable-chunked-prefill", "--no-enable-chunked-prefill", "--disable-fastapi-docs",
                                       "--enable-log-requests", "--disable-log-requests", "--disable-uvicorn-access-log"};
    const char *v;
    int64_t n;
    for (size_t k = 0; k < CV_ARRAY_LEN(int_flags); k++)
        if (cv_args_value(a, int_flags[k], &v)) {
            if (v && cv_args_int(a, int_flags[k], v, 0, INT32_MAX, &n))
                cv_info("serve", "%s %s is accepted and ignored on this backend", int_flags[k], v);
            return true;
        }
    for (size_t k = 0; k < CV_ARRAY_LEN(value_flags); k++)
        if (cv_args_value(a, value_flags[k], &v)) {
            if (v) cv_info("serve", "%s %s is accepted and ignored on this backend", value_flags[k], v);
            return true;
        }
    for (size_t k = 0; k < CV_ARRAY_LEN(bool_flags); k++)
        if (cv_args_flag(a, bool_flags[k])) {
            cv_info("serve", "%s is accepted and ignored on this backend", bool_flags[k]);
            return true;
        }
    return false;
}

static bool server_flag(cv_args *a, serve_args *g) {
    const char *v;
    int64_t n;
    if (cv_args_value(a, "--host", &v)) g->server.host = v;
    else if (cv_args_value(a, "--port", &v)) {
        if (cv_args_int(a, "--port", v, 0, 65535, &n)) g->server.port = (int)n;
    } else if (multi_value(a, "--served-model-name", &g->names, &g->n_names)) {
    } else if (multi_value(a, "--api-key", &g->keys, &g->n_keys)) {
    } else if (cv_args_flag(a, "--enable-prompt-tokens-details")) g->server.enable_prompt_tokens_details = true;
    else if (cv_args_flag(a, "--enable-force-include-usage")) g->server.enable_force_include_usage = true;
    else if (cv_args_value(a, "--shutdown-timeout", &v)) cv_args_float(a, "--shutdown-timeout", v, 0, 1e9, &g->shutdown_timeout);
    else if (cv_args_flag(a, "--disable-log-stats")) g->disable_log_stats = true;
    else if (cv_args_flag(a, "--async-scheduling")) g->async_scheduling = true;
    else if (cv_args_flag(a, "--no-async-scheduling")) g->async_scheduling = false;
    else if (cv_args_value(a, "--max-body-bytes", &v)) {
        if (cv_args_int(a, "--max-body-bytes", v, 1024, INT64_MAX, &n)) g->server.max_body_bytes = (size_t)n;
    } else return ignored_serve_flag(a);
    return true;
}

static int parse_serve_args(cv_args *a, serve_args *g) {
    cvllm_engine_options_default(&g->engine);
    g->server.port = 8000;
    g->async_scheduling = true;
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            fputs(usage, stdout);
            fputs(cv_args_engine_help, stdout);
            return -1;
        }
        if (server_flag(a, g) || cv_args_engine(a, &g->engine)) continue;
        if (arg[0] == '-' && arg[1]) return cv_args_error(a, "unknown option %s (see cvllm serve --help)", arg);
        if (g->engine.model) return cv_args_error(a, "unexpected argument '%s'", arg);
        g->engine.model = arg;
        a->i++;
    }
    if (a->failed) return 2;
    if (!g->engine.model) return cv_args_error(a, "no MODEL given (see cvllm serve --help)");
    const char *env_key = getenv("VLLM_API_KEY");
    if (g->n_keys == 0 && env_key && *env_key) {
        g->keys = cv_xrealloc(g->keys, sizeof *g->keys);
        g->keys[g->n_keys++] = env_key;
    }
    g->server.model_root = g->engine.model;
    g->server.served_model_names = g->names;
    g->server.n_served_model_names = g->n_names;
    g->server.api_keys = g->keys;
    g->server.n_api_keys = g->n_keys;
    return 0;
}

static int wait_for_signal(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    return sig;
}

static int run_server(cv_args *a, serve_args *g) {
    cvllm_engine *e = NULL;
    int rc = cvllm_engine_create(&g->engine, &e);
    if (rc) {
        cv_args_report_engine_error(a, rc);
        return 1;
    }
    cv_loop_options lo = {.async_scheduling = g->async_scheduling, .log_stats_interval = g->disable_log_stats ? 0 : 5};
    cv_engine_loop *loop = NULL;
    if ((rc = cv_engine_loop_start(e, &lo, &loop))) {
        fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
        cvllm_engine_destroy(e);
        return 1;
    }
    cv_server *s = NULL;
    if ((rc = cv_server_start(loop, &g->server, &s))) {
        fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
        cv_engine_loop_stop(loop);
        return 1;
    }
    cv_info("serve", "cvllm %s API server on http://%s:%d (model '%s')", CVLLM_VERSION,
            g->server.host ? g->server.host : "0.0.0.0", cv_server_port(s), g->n_names ? g->names[0] : g->engine.model);
    int sig = wait_for_signal();
    cv_info("serve", "%s received, shutting down (--shutdown-timeout %g s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
            g->shutdown_timeout);
    cv_server_stop(s, g->shutdown_timeout);
    cv_engine_loop_stop(loop);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    /* Before any thread exists, so that all of them inherit the mask (see the top). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    serve_args g = {0};
    cv_args a = {.cmd = "serve", .argc = argc, .argv = argv, .i = 1};
    int status = parse_serve_args(&a, &g);
    if (status == 0) status = run_server(&a, &g);
    free(g.names);
    free(g.keys);
    return status < 0 ? 0 : status;
}
