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
#include "server/response_store.h"
#include "server/cors.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/server.h"

typedef struct gen_session gen_session;
typedef struct cv_lora_card cv_lora_card; /* lora_adapters.c */

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
    pthread_mutex_t lora_mu;      /* guards the LoRA adapters' cards (lora_adapters.c) */
    pthread_mutex_t lora_admin_mu; /* one adapter load or unload at a time */
    cv_lora_card *loras;
    size_t n_loras, cap_loras;
    bool runtime_lora;            /* VLLM_ALLOW_RUNTIME_LORA_UPDATING: the load and unload routes exist */
    bool pooling;                 /* the engine pools (runner pooling): /v1/embeddings instead of generation */
    char *lora_resolver_dir;      /* VLLM_LORA_RESOLVER_CACHE_DIR (with runtime_lora), or NULL */
    char *root;
    const char **class_labels;    /* limits.class_labels: the engine's strings, in an array owned here */
    const char **input_types, **input_prompts; /* the same for limits.input_types and input_prompts */
    char **keys;
    size_t n_keys;
    cv_cors cors;
    bool cached_details, force_usage;
    bool request_id_headers;      /* --enable-request-id-headers */
    bool log_requests, log_outputs; /* request_log.h */
    int64_t max_log_len;          /* -1: whole */
    bool load_tracking;           /* --enable-server-load-tracking */
    bool tokenizer_info;          /* --enable-tokenizer-info-endpoint: GET /tokenizer_info */
    cv_response_store *responses; /* VLLM_ENABLE_RESPONSES_API_STORE: the stored responses, else NULL */
    bool chat_template_given;     /* the template is --chat-template's (/tokenizer_info shows it) */
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
/* The same in the Anthropic Messages API's error shape (vLLM's AnthropicErrorResponse). */
void cv_server_reply_anthropic_error(cv_http_req *r, const cv_api_error *err);

/* /v1/completions and /v1/chat/completions, once the body is complete (a worker thread). Always
 * finishes the request, now or from the engine's output thread. */
void cv_generate(cv_server *s, cv_http_req *r, cv_api_kind kind);

/* Aborts every generation in flight (server shutdown); their clients get finish_reason "abort". */
void cv_generate_abort_all(cv_server *s);
/* Aborts the background Responses API request of that response id, if one still runs. */
void cv_generate_abort_response(cv_server *s, const char *response_id);
/* Answers every generation in flight with a 500 error saying `why` (a stream: an error chunk, then
 * [DONE]) without waiting for the engine, which has failed; generations that begin later abort. */
void cv_generate_fail_all(cv_server *s, const char *why);

/* The served name a request's "model" field selects — a served model name (which lives as long as
 * the server), or a LoRA adapter's (then `requested` itself, which *lora receives too; NULL for the
 * base model; lora may be NULL) — or NULL with *err set to vLLM's 404 when none does. */
const char *cv_server_model_name(cv_server *s, const char *requested, const char **lora, cv_api_error *err);
/* A card of /v1/models; parent NULL is null, max_model_len 0 null (vLLM's LoRA cards have none). */
json_t *cv_server_model_card(const cv_server *s, const char *id, const char *root, const char *parent,
                             int32_t max_model_len, size_t index);

/* LoRA adapters (lora_adapters.c): the cards of o->loras, and the runtime routes when allowed. */
void cv_server_loras_init(cv_server *s, const cv_server_options *o);
void cv_server_loras_free(cv_server *s);
bool cv_server_lora_listed(cv_server *s, const char *name);
/* vLLM's filesystem LoRA resolver: a model name the server does not know, naming a folder of the
 * resolver's directory that holds a LoRA adapter of the served model (adapter_config.json's
 * peft_type and base_model_name_or_path), is loaded under that name. 1: it is served now; 0: no such
 * adapter (or no resolver); -1: found but not loadable, *err vLLM's 400. */
int cv_server_lora_resolve(cv_server *s, const char *name, cv_api_error *err);
/* Appends the adapters' cards to /v1/models' data. */
void cv_server_lora_cards(cv_server *s, json_t *data);
/* /v1/load_lora_adapter (load_it) or /v1/unload_lora_adapter; finishes the request. */
void cv_server_lora_route(cv_server *s, cv_http_req *r, const char *body, size_t len, bool load_it);

#endif
