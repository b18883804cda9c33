/*
 * http.h — the HTTP/1.1 server the API is served through, as a small interface: a request arrives
 * (head, then the complete body), the application answers it once (a whole response, or a stream of
 * chunks), and hears when the client has gone. Nothing above this file knows which library or
 * event loop moves the bytes; http_server.c is the one backend (its design comment says why), with
 * tls.c beneath it for HTTPS.
 *
 * Threads. Socket I/O runs on one event-loop thread. on_head runs there too and must not block (it
 * checks auth, route, method and content type). on_request runs on a small worker pool, so a
 * handler may tokenize a long prompt without stalling other connections, but it should not wait for
 * the engine: it submits and returns, and the response is finished later from any thread
 * (the engine's output thread, typically). on_gone and on_complete run on the loop thread.
 *
 * Ownership. A cv_http_req is valid from on_head until the application has finished it: exactly one
 * of cv_http_respond, cv_http_stream_end, or (when on_head answered) nothing more. on_head answered
 * when it finished the request or began its stream (which it then ends later, from any thread);
 * on_request is not called then. After the finish call the application must not touch it. A client that leaves does not end the request early: the
 * application is told (on_gone) so it can stop work, and its finish call then only releases.
 */
#ifndef CV_HTTP_H
#define CV_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_http cv_http;
typedef struct cv_http_req cv_http_req;

typedef struct cv_http_callbacks {
    void *user;
    /* Headers are in. Answer now (cv_http_respond: the body is then not read, and the connection
     * closes after the reply) or return without answering to have the body read and on_request run. */
    void (*on_head)(void *user, cv_http_req *r);
    /* The complete body is in (worker thread). */
    void (*on_request)(void *user, cv_http_req *r);
    /* The request is over: its response was written out (status = the status sent) or the
     * connection broke first (status = the status that was being sent, or 0 when none). For
     * metrics; runs once per request that reached on_head, after the application's finish call. */
    void (*on_complete)(void *user, cv_http_req *r, int status);
    /* Builds the body for an error the HTTP layer answers itself (malformed request, 413, 503 over
     * the connection limits): vLLM's JSON error shape. Returns malloc'ed text. */
    char *(*error_body)(void *user, int status, const char *message);
} cv_http_callbacks;

typedef struct cv_http_options {
    const char *host;                 /* numeric or resolvable address; NULL or "" = 0.0.0.0 */
    int port;                         /* 0 = ephemeral */
    size_t max_body;                  /* larger bodies: 413 */
    int workers;                      /* on_request threads; 0 = 4 */
    int max_connections;              /* open connections; at the limit the longest-idle one is closed
                                       * to make room, and with none idle the newcomer gets 503 */
    int max_connections_per_client;   /* per peer address; over it: 503 and close */
    double timeout_keep_alive;        /* idle time allowed between requests (uvicorn's name), s */
    double timeout_request_header;    /* the whole request head must arrive within this, s */
    double timeout_io;                /* no progress reading a body or writing a reply for this long
                                       * closes the connection, s */
    const struct cv_tls_options *tls; /* HTTPS when it names a certfile (tls.h); NULL: plain HTTP */
    bool bound;                       /* bound_fd is a socket from cv_http_bind(_unix), which the server
                                       * takes over (host and port are then not used) */
    int bound_fd;
} cv_http_options;

/* A socket bound to host:port (NULL or "" = 0.0.0.0, port 0 = ephemeral), not yet listening (a
 * client is refused until the server starts), into *fd for cv_http_options.bound_fd; fails with
 * cvllm_last_error when the address cannot be bound. */
int cv_http_bind(const char *host, int port, int *fd);

/* The same for a Unix socket at `path` (vLLM's --uds). A socket file that nothing listens on (a server
 * that died) is replaced; any other file there fails the bind. The path is removed when the server
 * stops. */
int cv_http_bind_unix(const char *path, int *fd);

/* Binds (unless given a bound socket, which it owns from then on, failing or not), listens, starts
 * the loop and the workers. Fails with cvllm_last_error when the address cannot be bound. */
int cv_http_start(const cv_http_options *opts, const cv_http_callbacks *cb, cv_http **out);
int cv_http_port(const cv_http *h);
/* Stops accepting new connections; open ones are served on. */
void cv_http_quiesce(cv_http *h);
/* Closes every connection (requests not yet finished by the application are still released by
 * their finish calls, which must all have happened before this returns: it waits for them), joins
 * the threads and frees the server. */
void cv_http_stop(cv_http *h);

/* The request. Strings stay valid until the finish call. */
const char *cv_http_method(const cv_http_req *r);
const char *cv_http_path(const cv_http_req *r);      /* percent-decoded, without the query */
const char *cv_http_query(const cv_http_req *r);     /* as sent, after the '?'; "" when none */
const char *cv_http_get_header(const cv_http_req *r, const char *name); /* case-insensitive; NULL if absent */
const char *cv_http_body(const cv_http_req *r);      /* NUL-terminated; "" before on_request */
size_t cv_http_body_len(const cv_http_req *r);
/* One pointer of application state per request. */
void cv_http_set_data(cv_http_req *r, void *data);
void *cv_http_data(const cv_http_req *r);

/* One more header on the reply still to come (an earlier one of the same name replaced); a name or
 * value holding a CR or LF is ignored. Before the response starts. */
void cv_http_set_header(cv_http_req *r, const char *name, const char *value);

/* A whole response (body copied); finishes the request. Any thread. */
void cv_http_respond(cv_http_req *r, int status, const char *content_type, const char *body, size_t len);

/* A streamed response: status and headers now, then the body as chunks (Transfer-Encoding:
 * chunked), then the end, which finishes the request. Pushes after the client left are dropped.
 * Any thread; pushes of one request must not race each other. */
void cv_http_stream_begin(cv_http_req *r, int status, const char *content_type);
void cv_http_stream_push(cv_http_req *r, const char *data, size_t len);
void cv_http_stream_end(cv_http_req *r);

/* Calls gone(arg) once, on the loop thread, when the client closes or breaks the connection before
 * the request is finished; at once (on the calling thread) if it already has. */
void cv_http_on_gone(cv_http_req *r, void (*gone)(void *arg), void *arg);

#endif
