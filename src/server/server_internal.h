/*
 * server_internal.h — what server.c (HTTP plumbing, routing, small endpoints) and generate.c
 * (completions and chat over the engine loop) share.
 *
 * Threading: libmicrohttpd runs one thread per connection, so a handler may block: a non-streaming
 * generation waits in its handler and a stream's content reader waits for the next chunk. Every
 * wait is a short timed wait that also polls the client socket, so a client that hangs up has its
 * request aborted within ~50 ms even while nothing is being written to it.
 */
#ifndef CV_SERVER_INTERNAL_H
#define CV_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "server/api.h"
#include "server/metrics.h"
#include "server/server.h"

struct cv_server {
    struct MHD_Daemon *daemon;
    cv_engine_loop *loop;
    const cvllm_tokenizer *tok;
    cv_api_limits limits;
    cv_api_chat_config chat;      /* limits.chat points here */
    json_t *default_kwargs;       /* owned; chat.default_kwargs */
    char **names;                 /* served model names (copies) */
    size_t n_names;
    char *root;
    char **keys;
    size_t n_keys;
    bool cached_details, force_usage;
    size_t max_body;
    int port;
    int64_t started;              /* wall-clock seconds, for "created" of model cards */
    atomic_bool draining;         /* refuse new generations (503) */
    atomic_bool stopping;         /* abort what is still running */
    atomic_int sessions;          /* generation sessions not yet freed */
    cv_http_metrics *http_metrics; /* the http_* families of /metrics */
};

/* Per-HTTP-request state (MHD's con_cls). */
typedef struct http_request {
    cv_server *s;
    char *body;
    size_t len, cap;
    bool too_large;
    bool json;                    /* Content-Type is application/json */
    double started;               /* cv_now() when its headers arrived */
    const char *handler;          /* its http_* metrics handler label; NULL: not recorded */
    char method[16];
} http_request;

/* Queues a response with `body` (copied) and content type; returns MHD's result. */
enum MHD_Result cv_http_send(struct MHD_Connection *c, unsigned status, const char *content_type, const char *body,
                             size_t len);
enum MHD_Result cv_http_send_error(struct MHD_Connection *c, const cv_api_error *err);

/* True when the peer closed its side of the connection (or it broke). */
bool cv_http_peer_gone(struct MHD_Connection *c);

/* /v1/completions and /v1/chat/completions, once the body is complete. */
enum MHD_Result cv_generate(cv_server *s, struct MHD_Connection *c, cv_api_kind kind, const char *body, size_t len);

/* The served name a request's "model" field selects; NULL (with *err set to 404) when none does. */
const char *cv_server_model_name(const cv_server *s, const char *requested, cv_api_error *err);

#endif
