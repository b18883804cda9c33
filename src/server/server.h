/*
 * server.h — the OpenAI-compatible HTTP server of `cvllm serve` (vLLM's endpoints and wire format)
 * in front of an engine group (one engine loop, or the replicas of data parallelism).
 *
 * The server borrows the group: the caller starts the group, starts the server on it, and after
 * cv_server_stop stops the group. Tests run it in-process on an ephemeral port.
 */
#ifndef CV_SERVER_H
#define CV_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "chat/chat.h"
#include "engine/engine_group.h"
#include "server/api.h"
#include "server/tls.h"

typedef struct cv_server cv_server;

/* A LoRA adapter the engines serve (vLLM's --lora-modules): requests whose "model" is its name run
 * with it, and /v1/models lists it. */
typedef struct cv_server_lora {
    const char *name;                  /* as in the engines' lora_modules */
    const char *path;                  /* its card's "root" */
    const char *base_model_name;       /* its card's "parent"; NULL = the first served model name */
} cv_server_lora;

typedef struct cv_server_options {
    const char *host;                  /* address to bind; NULL = all interfaces (0.0.0.0) */
    int port;                          /* 0 = an ephemeral port (see cv_server_port) */
    const char *uds;                   /* vLLM's --uds: a Unix socket path, host and port then unused */
    const char *const *served_model_names; /* the first one is printed in replies and metrics */
    size_t n_served_model_names;       /* 0 = model_root */
    const char *model_root;            /* the MODEL argument, /v1/models "root" */
    const cv_server_lora *loras;       /* [n_loras], copied */
    size_t n_loras;
    bool runtime_lora_updating;        /* vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING: /v1/load_lora_adapter and
                                        * /v1/unload_lora_adapter exist */
    const char *lora_resolver_dir;     /* vLLM's VLLM_LORA_RESOLVER_CACHE_DIR: with runtime updating, an
                                        * unknown model name that is a LoRA folder there is loaded */
    /* CORS (cors.h), vLLM's --allowed-origins, --allowed-methods, --allowed-headers (NULL: ["*"]) and
     * --allow-credentials; copied */
    const char *const *allowed_origins, *const *allowed_methods, *const *allowed_headers;
    size_t n_allowed_origins, n_allowed_methods, n_allowed_headers;
    bool allow_credentials;
    const char *const *api_keys;       /* Bearer keys for /v1/...; none = open */
    size_t n_api_keys;
    bool enable_prompt_tokens_details; /* usage.prompt_tokens_details.cached_tokens */
    bool return_tokens_as_token_ids;   /* logprobs name tokens "token_id:ID" unless a request says otherwise */
    bool log_requests, log_outputs;    /* --enable-log-requests (with --enable-log-outputs): request_log.h */
    int64_t max_log_len;               /* --max-log-len: characters / ids of a logged output; 0 = whole */
    bool enable_force_include_usage;   /* usage chunk on every stream */
    bool enable_request_id_headers;    /* every reply carries X-Request-Id: the request's own, or a new one */
    bool enable_server_load_tracking;  /* /load counts the generations in flight (else it says 0) */
    bool enable_tokenizer_info;        /* GET /tokenizer_info (vLLM's --enable-tokenizer-info-endpoint) */
    bool responses_store;              /* vLLM's VLLM_ENABLE_RESPONSES_API_STORE: /v1/responses keeps what
                                        * it answers (response_store.h) */
    size_t max_body_bytes;             /* larger bodies get 413; 0 = 32 MiB */
    /* Connection limits (uvicorn's names where it has them). */
    double timeout_keep_alive;         /* idle seconds allowed between requests; 0 = 5 */
    double timeout_request_header;     /* a request head must arrive within this; 0 = 10 s */
    int limit_concurrency;             /* open connections; 0 = 4096 */
    int limit_concurrency_per_client;  /* open connections per client address; 0 = 1024 */
    int max_n;                         /* most choices per prompt; 0 = 128 */
    /* Chat (vLLM's flags). The template is borrowed and must outlive the server; NULL = the model
     * has none, and chat requests get vLLM's 400 for that. */
    const cv_chat_template *chat_template;
    bool chat_template_given;          /* it is --chat-template's: a reranker's pairs are rendered with it (vLLM
                                        * formats them with an explicit template only) */
    cv_chat_content_format chat_template_content_format; /* --chat-template-content-format; AUTO = detect */
    const char *default_chat_template_kwargs; /* JSON object text, or NULL */
    bool trust_request_chat_template;  /* a request's chat_template renders it (else refused) */
    const char *reasoning_parser;      /* "qwen3" or NULL */
    bool reasoning_content;            /* also emit the pre-2026 field name reasoning_content */
    bool enable_auto_tool_choice;      /* needs tool_call_parser */
    bool exclude_tools_when_tool_choice_none; /* the template gets no tools when tool_choice is "none" */
    const char *tool_call_parser;      /* "hermes", "qwen3_coder" or NULL */
    cv_api_structured_config structured; /* --structured-outputs-config's defaults (its string copied) */
    bool bound;                        /* bound_fd is from cv_server_bind: host and port are not used */
    int bound_fd;
    cv_tls_options tls;                /* HTTPS when tls.certfile is set (vLLM's --ssl-* flags) */
} cv_server_options;

/* A socket bound to host:port, for cv_server_options.bound_fd: `serve` binds before it loads the
 * model, as vLLM does, so that an address in use is reported at once; it listens from
 * cv_server_start on (until then a client is refused, not left waiting). */
int cv_server_bind(const char *host, int port, int *fd);
/* The same for a Unix socket (vLLM's --uds; see cv_http_bind_unix). */
int cv_server_bind_unix(const char *path, int *fd);

/* Loads the TLS files of `tls` and lets them go: `serve` checks them before it loads the model.
 * Fails with cvllm_last_error's one line naming the flag and file. */
int cv_server_check_tls(const cv_tls_options *tls);

/* Binds (unless given a bound socket, which it owns from then on, failing or not) and starts
 * serving. Fails (with cvllm_last_error) when the address cannot be bound, the TLS files do not
 * load, or a chat option is invalid (an unknown parser name, kwargs that are not a JSON object,
 * auto tool choice without a tool-call parser). */
int cv_server_start(cv_engine_group *group, const cv_server_options *opts, cv_server **out);

/* The bound port (useful with port 0). */
int cv_server_port(const cv_server *s);

/* Stops accepting connections, lets in-flight requests finish for up to drain_seconds (vLLM's
 * --shutdown-timeout), aborts what is left (clients see finish_reason "abort"), closes every
 * connection and frees the server. The group is left running for the caller to stop. */
void cv_server_stop(cv_server *s, double drain_seconds);

/* The engine failed for good (a tensor-parallel rank died or hung): from now on generations, /health
 * and /ping answer 503 with `why`, and every generation in flight is answered at once with a 500
 * error saying it (a stream: an error chunk, then [DONE]). The engine is not waited for — it may
 * never return — so the caller ends the process rather than stopping the server. */
void cv_server_fail(cv_server *s, const char *why);

#endif
