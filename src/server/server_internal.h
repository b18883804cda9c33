/*
 * server_internal.h — what server.c (routing, auth, small endpoints) and generate.c (completions
 * and chat over the engine group) share. Both sit on http.h and never see sockets.
 *
 * Nothing here blocks a thread for the length of a generation: a handler parses, submits to the
 * engine group and returns; the engine's output thread finishes the reply (see generate.c).
 */
#ifndef CV_SERVER_INTERNAL_H
#define CV_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "server/api.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/server.h"

typedef struct gen_session gen_session;

struct cv_server {
    cv_http *http;
    cv_engine_group *group;
    const cvllm_tokenizer *tok;
    cv_api_limits limits;
    cv_api_chat_config chat;      /* limits.chat points here */
    json_t *default_kwargs;       /* owned; chat.default_kwargs */
    char *whitespace_pattern;     /* owned; limits.structured.whitespace_pattern */
    char **names;                 /* served model names (copies) */
    size_t n_names;
    char **lora_names, **lora_roots, **lora_parents; /* the LoRA adapters' cards (copies) */
    size_t n_loras;
    char *root;
    char **keys;
    size_t n_keys;
    bool cached_details, force_usage;
    bool request_id_headers;      /* --enable-request-id-headers */
    bool load_tracking;           /* --enable-server-load-tracking */
    atomic_long load;             /* generations in flight, with load_tracking (vLLM's server_load_metrics) */
    size_t max_body;
    int64_t started;              /* wall-clock seconds, for "created" of model cards */
    atomic_bool draining;         /* refuse new generations (503) */
    atomic_bool failed;           /* the engine failed for good (cv_server_fail): 503 everywhere */
    char failure[256];            /* why, set before `failed` */
    pthread_mutex_t sessions_mu;  /* guards the list below */
    pthread_cond_t sessions_cv;   /* signalled when a session is freed */
    gen_session *sessions;        /* generations in flight, to abort them at shutdown */
    bool stopping;                /* sessions created from now on abort at once */
    cv_http_metrics *http_metrics; /* the http_* families of /metrics */
};

/* Replies with vLLM's JSON error; finishes the request. */
void cv_server_reply_error(cv_http_req *r, const cv_api_error *err);

/* /v1/completions and /v1/chat/completions, once the body is complete (a worker thread). Always
 * finishes the request, now or from the engine's output thread. */
void cv_generate(cv_server *s, cv_http_req *r, cv_api_kind kind);

/* Aborts every generation in flight (server shutdown); their clients get finish_reason "abort". */
void cv_generate_abort_all(cv_server *s);
/* Answers every generation in flight with a 500 error saying `why` (a stream: an error chunk, then
 * [DONE]) without waiting for the engine, which has failed; generations that begin later abort. */
void cv_generate_fail_all(cv_server *s, const char *why);

/* The served name a request's "model" field selects — a served model name, or a LoRA adapter's,
 * which *lora then receives too (NULL for the base model; lora may be NULL) — or NULL with *err set
 * to vLLM's 404 when none does. The names live as long as the server. */
const char *cv_server_model_name(const cv_server *s, const char *requested, const char **lora, cv_api_error *err);

#endif
