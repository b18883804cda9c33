/*
 * http_server.c — the HTTP/1.1 backend behind http.h: one epoll loop thread owns every socket, a
 * small worker pool runs handlers, and http_parse.c decides what a request is.
 *
 * Why not a library: libmicrohttpd 0.9.75 (used before), libevent's evhttp and h2o were measured
 * against the same malformed-request cases (tools/http_cases.py; figures in the README): each
 * either hangs, garbles or accepts requests RFC 9112 says to refuse, in its own parser, where no
 * option reaches. The parser is the part that must be strict, and a loop over epoll is small once
 * the parser is separate, so both are ours; the library choice is confined to this file.
 *
 * Connections move through four states:
 *   C_HEAD   reading a head, or idle between requests. Idle connections are cut after the
 *            keep-alive timeout; once a head's first byte is in, the whole head must arrive within
 *            the header timeout (slow dribblers are cut with 408).
 *   C_BODY   reading the body; no progress for timeout_io: 408.
 *   C_BUSY   the request is with the application. Only hang-ups are watched (EPOLLRDHUP without
 *            EPOLLIN, so pipelined bytes wait in the kernel); output is written as it comes.
 *   C_LINGER after a reply that ends the connection: our side is shut down and input is read and
 *            dropped until the peer closes (or LINGER_S), so a client still uploading a refused
 *            body reads the reply instead of a reset.
 * A reply the HTTP layer makes itself (a malformed request, 413, 408, 503) always ends the
 * connection. A connection whose request is finished returns to C_HEAD once its reply is written.
 *
 * Threads and locks. The loop thread alone reads, accepts, parses, changes states and frees
 * connections. Replies come from any thread: under the connection's mutex they are appended to its
 * output and written at once as far as the socket takes (EPOLLOUT then finishes the job on the
 * loop), so a streamed token reaches the client without a hop through the loop. A finish call then
 * queues the connection on the done list and wakes the loop, which completes the request there.
 * A connection is freed only by the loop and only with no request attached, and a request is
 * detached only by the loop after its finish call, so a handler's pointer stays valid until then.
 * Lock order: connection mutex, then server mutex. The gone callback runs under the connection's
 * mutex, which is what keeps the application's state alive while it runs (its finish call waits).
 *
 * Limits: max_connections open at once (at the cap the longest-idle connection is closed to make
 * room; with none idle the newcomer gets 503), max_connections_per_client per peer address (503
 * beyond), MAX_PENDING_OUT bytes of unwritten output per connection (a client that stops reading a
 * stream is treated as gone).
 */
#define _GNU_SOURCE
#include "server/http.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "server/http_parse.h"
#include "server/tls.h"

enum {
    READ_CHUNK = 64 * 1024,
    MAX_EVENTS = 256,
    TICK_MS = 100,                        /* timeouts are checked this often */
    MAX_PENDING_OUT = 64 << 20,
    DEFAULT_WORKERS = 4,
    DEFAULT_MAX_CONNECTIONS = 4096,
};
static const double LINGER_S = 2.0;

typedef enum conn_state { C_HEAD, C_BODY, C_BUSY, C_LINGER } conn_state;

typedef struct conn conn;

struct cv_http_req {
    conn *c;
    char *head;                           /* a copy of the head bytes; `parsed` points into it */
    cv_http_head parsed;
    char method[16];
    char *path;
    char *query;                          /* after the '?', "" when none */
    char *body;
    size_t body_len, body_cap;
    void *data;
    int status;                           /* the status sent; 0 before */
    bool head_only;                       /* HEAD: the headers of the reply, not its body */
    bool chunked_out;                     /* a stream in chunked coding (HTTP/1.1) */
    bool finished;                        /* the application's finish call happened (conn->mu) */
    bool began;                           /* its stream has begun (conn->mu) */
    bool handed_back;                     /* ... and is over: it touches nothing more (server mutex) */
    void (*gone)(void *);
    void *gone_arg;
    char *extra_headers;                  /* "name: value\r\n" lines of cv_http_set_header, or NULL */
    cv_http_req *next;                    /* the worker queue */
};

struct conn {
    cv_http *h;
    int fd;
    struct sockaddr_storage peer;
    conn *prev, *next;
    /* loop thread only */
    conn_state st;
    char *in;
    size_t in_len, in_cap;
    double since;                         /* start of the current wait (see the states above) */
    bool in_head;                         /* C_HEAD with a head's first byte in */
    cv_http_req *req;
    uint64_t body_left;
    cv_http_chunked chunked;
    bool close_after;                     /* no further request on this connection */
    bool http10;                          /* the current request is HTTP/1.0 */
    bool dead;                            /* unlinked and closed; freed at the end of the loop turn */
    bool done_queued;                     /* on the done list (server mutex) */
    /* under mu */
    pthread_mutex_t mu;
    char *out;
    size_t out_len, out_off, out_cap;
    double out_progress;                  /* last time output moved while some was pending */
    bool closed;                          /* fd closed */
    bool gone;                            /* the peer left or broke the connection */
    uint32_t events;                      /* the epoll interest set */
    cv_tls_conn *tls;                     /* HTTPS: the session every byte goes through, else NULL */
    bool tls_want_write;                  /* a TLS read waits for the socket to take output */
};

struct cv_http {
    cv_http_options o;
    cv_http_callbacks cb;
    cv_tls *tls;                          /* HTTPS (o.tls), else NULL; loop thread */
    int lfd, ep, wake;
    int port;
    pthread_t loop;
    pthread_t *workers;
    int n_workers;
    conn *conns;                          /* loop thread only */
    int n_conns;
    conn *graveyard;                      /* dead connections, freed after the events of a turn */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, idle_cv;
    cv_http_req *q_head, *q_tail;
    conn **done;
    size_t n_done, cap_done;
    int live;                             /* requests given to the application, not yet finished */
    bool quiesce, closing, stop, workers_stop;
};

static char LISTEN_TAG, WAKE_TAG;         /* epoll data for the two non-connection fds */

/* ------------------------------------------------------------------------------------------------ */
/* Output                                                                                            */

static const char *reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

static void set_events(conn *c, uint32_t ev) {
    if (c->closed || ev == c->events) return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(c->h->ep, EPOLL_CTL_MOD, c->fd, &e) == 0) c->events = ev;
}

/* The interest set for the connection's state; caller holds c->mu. */
static void update_events(conn *c) {
    uint32_t ev = EPOLLRDHUP;
    if (c->st != C_BUSY) ev |= EPOLLIN;
    if (c->out_off < c->out_len || c->tls_want_write) ev |= EPOLLOUT;
    set_events(c, ev);
}

static void out_append(conn *c, const char *p, size_t n) {
    if (c->out_len + n > c->out_cap) {
        if (c->out_off > 0) { /* reclaim what was written before growing */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        if (c->out_len + n > c->out_cap) {
            c->out_cap = (c->out_len + n) * 2;
            c->out = cv_xrealloc(c->out, c->out_cap);
        }
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

/* Closes the socket; the struct stays until the loop frees it. Caller holds c->mu. */
static void close_fd(conn *c) {
    if (c->closed) return;
    epoll_ctl(c->h->ep, EPOLL_CTL_DEL, c->fd, NULL);
    cv_tls_free(c->tls);
    c->tls = NULL;
    close(c->fd);
    c->closed = true;
    c->out_off = c->out_len = 0;
}

/* Ends our side once the last reply is out (TLS says so first: close_notify); caller holds c->mu. */
static void end_output(conn *c) {
    if (c->tls) cv_tls_close_notify(c->tls);
    shutdown(c->fd, SHUT_WR);
}

/* Writes what the socket takes; caller holds c->mu. A broken pipe marks the peer gone. */
static void flush_locked(conn *c) {
    bool moved = false;
    while (!c->closed && c->out_off < c->out_len) {
        const char *p = c->out + c->out_off;
        const size_t len = c->out_len - c->out_off;
        ssize_t n = c->tls ? cv_tls_send(c->tls, p, len) : send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->out_off += (size_t)n;
            moved = true;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->gone = true; /* EPIPE, ECONNRESET: the loop sees the hang-up and tells the application */
        break;
    }
    if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (moved) c->out_progress = cv_now();
    if (c->out_len - c->out_off > MAX_PENDING_OUT) c->gone = true;
    update_events(c);
}

/* Appends a status line and headers; body_len < 0: none announced (a stream); `extra` is one more
 * "name: value" line or NULL. */
static void put_head(conn *c, int status, const char *content_type, long long body_len, bool chunked, bool close,
                     const char *extra) {
    char head[512];
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\n", status, reason(status));
    if (content_type) n += snprintf(head + n, sizeof head - (size_t)n, "content-type: %s\r\n", content_type);
    if (body_len >= 0) n += snprintf(head + n, sizeof head - (size_t)n, "content-length: %lld\r\n", body_len);
    else n += snprintf(head + n, sizeof head - (size_t)n, "cache-control: no-cache\r\n");
    if (chunked) n += snprintf(head + n, sizeof head - (size_t)n, "transfer-encoding: chunked\r\n");
    assert(n > 0 && (size_t)n < sizeof head);
    out_append(c, head, (size_t)n);
    if (extra) out_append(c, extra, strlen(extra)); /* its own append: a client's id can be longer than head[] */
    /* HTTP/1.0 closes by default: a kept connection must say so. */
    const char *end = close ? "connection: close\r\n\r\n" : c->http10 ? "connection: keep-alive\r\n\r\n" : "\r\n";
    out_append(c, end, strlen(end));
}

/* The last step of every finish call: hands the request back to the loop, which completes it.
 * Until this runs the loop must not complete the request (and free the connection), however
 * finished it looks; after it the caller touches nothing, so the wake-up is written under the
 * lock (cv_http_stop cannot free the server while a finish call holds it). */
static void queue_done(conn *c) {
    cv_http *h = c->h;
    pthread_mutex_lock(&h->mu);
    c->req->handed_back = true;
    if (!c->done_queued) {
        if (h->n_done == h->cap_done) {
            h->cap_done = h->cap_done ? h->cap_done * 2 : 64;
            h->done = cv_xrealloc(h->done, h->cap_done * sizeof *h->done);
        }
        h->done[h->n_done++] = c;
        c->done_queued = true;
    }
    uint64_t one = 1;
    ssize_t w = write(h->wake, &one, sizeof one);
    (void)w; /* a full eventfd counter still wakes the loop */
    pthread_mutex_unlock(&h->mu);
}

/* A reply the HTTP layer makes for a connection-level error (no request): ends the connection. */
static void reply_error(conn *c, int status, const char *message) {
    char *body = c->h->cb.error_body(c->h->cb.user, status, message);
    pthread_mutex_lock(&c->mu);
    if (!c->closed) {
        put_head(c, status, "application/json", (long long)strlen(body), false, true, NULL);
        out_append(c, body, strlen(body));
        c->out_progress = cv_now();
    }
    c->st = C_LINGER;
    c->since = cv_now();
    c->in_len = 0;
    flush_locked(c);
    if (c->out_off == c->out_len && !c->closed) end_output(c);
    pthread_mutex_unlock(&c->mu);
    free(body);
}

/* ------------------------------------------------------------------------------------------------ */
/* The application's side (any thread)                                                               */

const char *cv_http_method(const cv_http_req *r) { return r->method; }
const char *cv_http_path(const cv_http_req *r) { return r->path; }
const char *cv_http_query(const cv_http_req *r) { return r->query; }
const char *cv_http_body(const cv_http_req *r) { return r->body ? r->body : ""; }
size_t cv_http_body_len(const cv_http_req *r) { return r->body_len; }
void cv_http_set_data(cv_http_req *r, void *data) { r->data = data; }
void *cv_http_data(const cv_http_req *r) { return r->data; }

const char *cv_http_get_header(const cv_http_req *r, const char *name) {
    const cv_http_header *hd = cv_http_find_header(&r->parsed, name);
    if (!hd) return NULL;
    /* Values are NUL-terminated in the copy: each ends where its CR was (see start_request). */
    return hd->value;
}

void cv_http_set_header(cv_http_req *r, const char *name, const char *value) {
    if (strpbrk(name, "\r\n:") || strpbrk(value, "\r\n")) return; /* no header injection */
    const size_t n = strlen(name);
    char *kept = cv_xstrdup(""); /* the lines of other names */
    for (const char *line = r->extra_headers; line && *line;) {
        const char *end = strstr(line, "\r\n") + 2;
        if (strncasecmp(line, name, n) || line[n] != ':') {
            char *grown = cv_xasprintf("%s%.*s", kept, (int)(end - line), line);
            free(kept);
            kept = grown;
        }
        line = end;
    }
    free(r->extra_headers);
    r->extra_headers = cv_xasprintf("%s%s: %s\r\n", kept, name, value);
    free(kept);
}

void cv_http_respond(cv_http_req *r, int status, const char *content_type, const char *body, size_t len) {
    conn *c = r->c;
    pthread_mutex_lock(&c->mu);
    assert(!r->finished);
    r->status = status;
    r->finished = true;
    if (!c->closed) {
        put_head(c, status, content_type, (long long)len, false, c->close_after, r->extra_headers);
        if (!r->head_only) out_append(c, body, len);
        flush_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    queue_done(c);
}

void cv_http_stream_begin(cv_http_req *r, int status, const char *content_type) {
    conn *c = r->c;
    pthread_mutex_lock(&c->mu);
    r->status = status;
    r->began = true;
    /* HTTP/1.0 has no chunked coding: its stream ends when the connection does. */
    r->chunked_out = r->parsed.version_minor >= 1 && !r->head_only;
    if (!r->chunked_out) c->close_after = true;
    if (!c->closed) {
        put_head(c, status, content_type, -1, r->chunked_out, c->close_after, r->extra_headers);
        flush_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
}

void cv_http_stream_push(cv_http_req *r, const char *data, size_t len) {
    conn *c = r->c;
    if (len == 0 || r->head_only) return;
    pthread_mutex_lock(&c->mu);
    if (!c->closed && !c->gone) {
        if (r->chunked_out) {
            char size[24];
            int n = snprintf(size, sizeof size, "%zx\r\n", len);
            out_append(c, size, (size_t)n);
        }
        out_append(c, data, len);
        if (r->chunked_out) out_append(c, "\r\n", 2);
        flush_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
}

void cv_http_stream_end(cv_http_req *r) {
    conn *c = r->c;
    pthread_mutex_lock(&c->mu);
    assert(!r->finished);
    r->finished = true;
    if (!c->closed && !c->gone && r->chunked_out) {
        out_append(c, "0\r\n\r\n", 5);
        flush_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    queue_done(c);
}

void cv_http_on_gone(cv_http_req *r, void (*gone)(void *arg), void *arg) {
    conn *c = r->c;
    pthread_mutex_lock(&c->mu);
    bool now = c->gone || c->closed;
    if (!now) {
        r->gone = gone;
        r->gone_arg = arg;
    }
    pthread_mutex_unlock(&c->mu);
    if (now) gone(arg);
}

/* ------------------------------------------------------------------------------------------------ */
/* Workers                                                                                           */

static void *worker_main(void *arg) {
    cv_http *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->q_head && !h->workers_stop) pthread_cond_wait(&h->work_cv, &h->mu);
        if (!h->q_head) break;
        cv_http_req *r = h->q_head;
        h->q_head = r->next;
        if (!h->q_head) h->q_tail = NULL;
        pthread_mutex_unlock(&h->mu);
        h->cb.on_request(h->cb.user, r);
        pthread_mutex_lock(&h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void enqueue(cv_http *h, cv_http_req *r) {
    pthread_mutex_lock(&h->mu);
    r->next = NULL;
    if (h->q_tail) h->q_tail->next = r;
    else h->q_head = r;
    h->q_tail = r;
    pthread_cond_signal(&h->work_cv);
    pthread_mutex_unlock(&h->mu);
}

/* ------------------------------------------------------------------------------------------------ */
/* Connections (loop thread)                                                                         */

/* Unlinks and closes a connection. It is freed after the current turn of the loop, because an
 * event for it may still wait in the batch epoll_wait returned (eviction closes other sockets). */
static void destroy_conn(conn *c) {
    cv_http *h = c->h;
    assert(!c->req && !c->done_queued && !c->dead);
    pthread_mutex_lock(&c->mu);
    close_fd(c);
    pthread_mutex_unlock(&c->mu);
    if (c->prev) c->prev->next = c->next;
    else h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    h->n_conns--;
    c->dead = true;
    c->next = h->graveyard;
    h->graveyard = c;
}

static void bury(cv_http *h) {
    while (h->graveyard) {
        conn *c = h->graveyard;
        h->graveyard = c->next;
        pthread_mutex_destroy(&c->mu);
        free(c->in);
        free(c->out);
        free(c);
    }
}

static void free_req(cv_http_req *r) {
    free(r->extra_headers);
    free(r->head);
    free(r->path);
    free(r->query);
    free(r->body);
    free(r);
}

/* The peer left or the connection broke: tell the application once, while its request is open. */
static void peer_left(conn *c) {
    pthread_mutex_lock(&c->mu);
    c->gone = true;
    close_fd(c);
    cv_http_req *r = c->req;
    if (r && !r->finished && r->gone) {
        void (*gone)(void *) = r->gone;
        r->gone = NULL;
        gone(r->gone_arg);
    }
    pthread_mutex_unlock(&c->mu);
}

static void process(conn *c);
static void try_complete(conn *c);

/* The connection is over on the client's side (hang-up, error, stall). A request still reading its
 * body was never handed to the application: it ends here with no status. */
static void abandon(conn *c) {
    peer_left(c);
    if (c->req && c->st == C_BODY) { /* never given out: the loop finishes and hands it back itself */
        pthread_mutex_lock(&c->mu);
        c->req->finished = true;
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_lock(&c->h->mu);
        c->req->handed_back = true;
        pthread_mutex_unlock(&c->h->mu);
    }
    if (c->req) try_complete(c);
    else destroy_conn(c);
}

static void begin_linger(conn *c) {
    pthread_mutex_lock(&c->mu);
    c->st = C_LINGER;
    c->since = cv_now();
    c->in_len = 0;
    if (!c->closed && c->out_off == c->out_len) end_output(c);
    update_events(c);
    pthread_mutex_unlock(&c->mu);
}

/* After the finish call and once the reply is out (or the connection is gone): the request ends
 * here, and the connection serves its next one, lingers, or is freed. */
static void try_complete(conn *c) {
    cv_http *h = c->h;
    cv_http_req *r = c->req;
    if (!r) return;
    pthread_mutex_lock(&h->mu);
    bool wait = c->done_queued || !r->handed_back; /* the done list will bring it back */
    pthread_mutex_unlock(&h->mu);
    if (wait) return;
    pthread_mutex_lock(&c->mu);
    bool ready = r->finished && (c->closed || c->gone || c->out_off == c->out_len);
    pthread_mutex_unlock(&c->mu);
    if (!ready) return;
    c->req = NULL;
    if (h->cb.on_complete) h->cb.on_complete(h->cb.user, r, r->status);
    free_req(r);
    pthread_mutex_lock(&h->mu);
    if (--h->live == 0) pthread_cond_broadcast(&h->idle_cv);
    pthread_mutex_unlock(&h->mu);
    if (c->closed || c->gone) {
        destroy_conn(c);
    } else if (c->close_after) {
        begin_linger(c);
    } else {
        pthread_mutex_lock(&c->mu);
        c->st = C_HEAD;
        c->in_head = false;
        c->since = cv_now();
        update_events(c);
        pthread_mutex_unlock(&c->mu);
        process(c); /* a pipelined request may already be in the buffer */
    }
}

static void consume_in(conn *c, size_t n) {
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
}

static void set_state(conn *c, conn_state st) {
    pthread_mutex_lock(&c->mu);
    c->st = st;
    update_events(c);
    pthread_mutex_unlock(&c->mu);
}

static void dispatch(conn *c) {
    set_state(c, C_BUSY);
    enqueue(c->h, c->req);
}

/* A reply to a request the HTTP layer refuses after its head (413, a bad chunked body, a body
 * that stalls): the application never sees it. */
static void refuse(conn *c, int status, const char *message) {
    char *body = c->h->cb.error_body(c->h->cb.user, status, message);
    c->close_after = true;
    set_state(c, C_BUSY);
    cv_http_respond(c->req, status, "application/json", body, strlen(body));
    free(body);
}

static void start_request(conn *c, const cv_http_head *hd) {
    cv_http *h = c->h;
    cv_http_req *r = cv_xcalloc(1, sizeof *r);
    r->c = c;
    /* The copy gets each header value NUL-terminated in place of its CR, so cv_http_get_header can
     * hand out plain C strings; values hold no NUL (the parser refuses them). */
    r->head = cv_xcalloc(1, hd->head_len + 1);
    memcpy(r->head, c->in, hd->head_len);
    r->parsed = *hd;
    ptrdiff_t shift = r->head - c->in;
    r->parsed.method += shift;
    r->parsed.target += shift;
    for (size_t i = 0; i < r->parsed.n_headers; i++) {
        cv_http_header *x = &r->parsed.headers[i];
        x->name += shift;
        x->value += shift;
        ((char *)x->value)[x->value_len] = '\0';
    }
    snprintf(r->method, sizeof r->method, "%.*s", (int)hd->method_len, hd->method);
    r->path = cv_xcalloc(1, hd->target_len + 1);
    const char *query = NULL;
    if (cv_http_decode_path(r->parsed.target, hd->target_len, r->path, hd->target_len + 1, &query) < 0) r->path[0] = '\0';
    r->query = query ? cv_xstrndup(query, (size_t)(r->parsed.target + hd->target_len - query)) : cv_xstrdup("");
    r->head_only = !strcmp(r->method, "HEAD");
    consume_in(c, hd->head_len);
    c->req = r;
    c->close_after = !hd->keep_alive;
    c->http10 = hd->version_minor == 0;
    pthread_mutex_lock(&h->mu);
    h->live++;
    bool closing = h->closing;
    pthread_mutex_unlock(&h->mu);

    c->st = C_BODY;
    c->since = cv_now();
    if (closing) { /* the workers may be gone: nothing new reaches the application */
        refuse(c, 503, "The server is shutting down");
        return;
    }
    h->cb.on_head(h->cb.user, r);
    pthread_mutex_lock(&c->mu);
    bool answered = r->finished || r->began; /* a stream begun here is finished from elsewhere */
    pthread_mutex_unlock(&c->mu);
    if (answered) {
        /* An early answer leaves any body unread: the connection cannot carry another request. */
        if (hd->framing != CV_HTTP_NO_BODY) c->close_after = true;
        set_state(c, C_BUSY);
        return;
    }
    if (hd->framing == CV_HTTP_LENGTH) {
        if (hd->content_length > h->o.max_body) {
            char msg[96];
            snprintf(msg, sizeof msg, "Request body too large: the limit is %zu bytes", h->o.max_body);
            refuse(c, 413, msg);
            return;
        }
        r->body_cap = (size_t)hd->content_length + 1;
        r->body = cv_xcalloc(1, r->body_cap);
        c->body_left = hd->content_length;
    } else if (hd->framing == CV_HTTP_CHUNKED) {
        memset(&c->chunked, 0, sizeof c->chunked);
    }
    if (hd->expect_continue && hd->framing != CV_HTTP_NO_BODY && c->in_len == 0 && hd->version_minor >= 1) {
        pthread_mutex_lock(&c->mu);
        out_append(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        flush_locked(c);
        pthread_mutex_unlock(&c->mu);
    }
}

/* Reads the body out of the input buffer; dispatches the request once it is complete. */
static void read_body(conn *c) {
    cv_http_req *r = c->req;
    switch (r->parsed.framing) {
    case CV_HTTP_NO_BODY: dispatch(c); return;
    case CV_HTTP_LENGTH: {
        size_t take = c->in_len < c->body_left ? c->in_len : (size_t)c->body_left;
        memcpy(r->body + r->body_len, c->in, take);
        r->body_len += take;
        c->body_left -= take;
        consume_in(c, take);
        if (take) c->since = cv_now();
        if (c->body_left == 0) dispatch(c);
        return;
    }
    case CV_HTTP_CHUNKED: {
        size_t used = 0;
        cv_http_error err;
        int rc = cv_http_chunked_feed(&c->chunked, c->in, c->in_len, c->h->o.max_body, &r->body, &r->body_len,
                                      &r->body_cap, &used, &err);
        consume_in(c, used);
        if (used) c->since = cv_now();
        if (rc < 0) refuse(c, err.status, err.message);
        else if (rc > 0) dispatch(c);
        return;
    }
    }
}

/* Parses and dispatches whatever the input buffer holds, as far as the state allows. */
static void process(conn *c) {
    while (!c->closed) {
        if (c->st == C_HEAD) {
            if (c->in_len == 0) return;
            if (!c->in_head) {
                c->in_head = true;
                c->since = cv_now();
            }
            cv_http_head hd;
            cv_http_error err;
            int rc = cv_http_parse_head(c->in, c->in_len, &hd, &err);
            if (rc == 0) return;
            if (rc < 0) {
                reply_error(c, err.status, err.message);
                return;
            }
            c->in_head = false;
            start_request(c, &hd);
        } else if (c->st == C_BODY) {
            conn_state before = c->st;
            size_t had = c->in_len;
            read_body(c);
            if (c->st == before && c->in_len == had) return; /* needs more bytes */
        } else {
            return;
        }
    }
}

/* recv(2) from the connection, through its TLS session if it has one (whose calls must not overlap
 * the writers' under c->mu). */
static ssize_t conn_recv(conn *c, void *buf, size_t n) {
    if (!c->tls) return recv(c->fd, buf, n, MSG_DONTWAIT);
    pthread_mutex_lock(&c->mu);
    bool want_write = false;
    ssize_t got = c->closed ? 0 : cv_tls_recv(c->tls, buf, n, &want_write);
    const int e = errno;
    if (want_write) {
        c->tls_want_write = true;
        update_events(c);
    }
    pthread_mutex_unlock(&c->mu);
    errno = e;
    return got;
}

static void on_readable(conn *c) {
    for (int rounds = 0; rounds < 4; rounds++) { /* bounded, so one client cannot hog the loop */
        if (c->st == C_LINGER) {
            char sink[4096];
            ssize_t n = conn_recv(c, sink, sizeof sink);
            if (n > 0) continue;
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
            abandon(c);
            return;
        }
        size_t want = c->in_len + READ_CHUNK;
        if (want > c->in_cap) {
            c->in_cap = want;
            c->in = cv_xrealloc(c->in, c->in_cap);
        }
        ssize_t n = conn_recv(c, c->in + c->in_len, READ_CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) { /* EOF or error: nothing more will come */
            abandon(c);
            return;
        }
        c->in_len += (size_t)n;
        process(c);
        if (c->closed || c->st == C_BUSY) return;
        /* A head that cannot complete within the limit is refused by the parser, so in_len stays
         * bounded in C_HEAD; bodies move out of the buffer as they arrive. */
    }
}

static void on_event(conn *c, uint32_t ev) {
    if (c->dead) return;
    if (ev & EPOLLOUT) {
        pthread_mutex_lock(&c->mu);
        flush_locked(c);
        bool drained = c->out_off == c->out_len;
        if (drained && c->st == C_LINGER && !c->closed) end_output(c);
        pthread_mutex_unlock(&c->mu);
        if (drained && c->req) {
            try_complete(c);
            return; /* the connection may be gone now; a pending read is seen on the next wait */
        }
    }
    if (c->st == C_BUSY) {
        if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) abandon(c);
        return;
    }
    bool read_again = false; /* a TLS read that had to wait for the socket to take output */
    if ((ev & EPOLLOUT) && c->tls_want_write) {
        pthread_mutex_lock(&c->mu);
        c->tls_want_write = false;
        update_events(c);
        pthread_mutex_unlock(&c->mu);
        read_again = true;
    }
    if (read_again || (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) on_readable(c);
}

/* Clients are told apart by address; those of a Unix socket have none, so each is its own. */
static bool same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family || a->ss_family == AF_UNIX) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
    return true;
}

/* Answers a connection that is refused before it is registered, then closes it. Over HTTPS it is
 * closed unanswered: a reply would need the handshake the limit is there to spare. */
static void refuse_socket(cv_http *h, int fd, const char *message) {
    if (h->tls) {
        close(fd);
        return;
    }
    char *body = h->cb.error_body(h->cb.user, 503, message);
    char head[256];
    int n = snprintf(head, sizeof head, "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                     "content-length: %zu\r\nconnection: close\r\n\r\n", strlen(body));
    struct iovec iov[2] = {{head, (size_t)n}, {body, strlen(body)}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w; /* best effort: a fresh socket's buffer takes a few hundred bytes */
    close(fd);
    free(body);
}

/* At the connection cap: the idle connection waiting longest (no request, no head begun) makes
 * room. Returns false when every connection is in use. */
static bool evict_idle(cv_http *h) {
    conn *oldest = NULL;
    for (conn *c = h->conns; c; c = c->next)
        if (c->st == C_HEAD && !c->in_head && !c->req && (!oldest || c->since < oldest->since)) oldest = c;
    if (!oldest) return false;
    destroy_conn(oldest);
    return true;
}

static void accept_all(cv_http *h) {
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        int fd = accept4(h->lfd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE) cv_warn("http", "out of file descriptors: a connection waits");
            return;
        }
        if (h->n_conns >= h->o.max_connections && !evict_idle(h)) {
            refuse_socket(h, fd, "Too many open connections");
            continue;
        }
        int same = 0;
        for (conn *c = h->conns; c; c = c->next) same += same_peer(&c->peer, &peer);
        if (same >= h->o.max_connections_per_client) {
            refuse_socket(h, fd, "Too many open connections from this client");
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        cv_tls_conn *tls = h->tls ? cv_tls_accept(h->tls, fd) : NULL;
        if (h->tls && !tls) {
            close(fd);
            continue;
        }
        conn *c = cv_xcalloc(1, sizeof *c);
        c->tls = tls;
        c->h = h;
        c->fd = fd;
        c->peer = peer;
        c->st = C_HEAD;
        c->since = cv_now();
        pthread_mutex_init(&c->mu, NULL);
        struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
        if (epoll_ctl(h->ep, EPOLL_CTL_ADD, fd, &e) != 0) {
            pthread_mutex_destroy(&c->mu);
            cv_tls_free(c->tls);
            free(c);
            close(fd);
            continue;
        }
        c->events = e.events;
        c->next = h->conns;
        if (h->conns) h->conns->prev = c;
        h->conns = c;
        h->n_conns++;
    }
}

/* Timeouts, once per tick; when the server is closing, also the requests not yet begun. */
static void sweep(cv_http *h, double now, bool closing) {
    conn *next;
    for (conn *c = h->conns; c; c = next) {
        next = c->next;
        pthread_mutex_lock(&c->mu);
        /* gone without a hang-up seen: a failed write, or a client that stopped reading its reply */
        bool lost = (c->gone && !c->closed) || (c->out_off < c->out_len && now - c->out_progress > h->o.timeout_io);
        pthread_mutex_unlock(&c->mu);
        if (lost) {
            abandon(c);
            continue;
        }
        if (closing && c->st == C_HEAD && !c->req) {
            destroy_conn(c);
            continue;
        }
        if (closing && c->st == C_BODY) {
            refuse(c, 503, "The server is shutting down");
            continue;
        }
        switch (c->st) {
        case C_HEAD:
            if (c->in_head && now - c->since > h->o.timeout_request_header)
                reply_error(c, 408, "Timed out waiting for the request headers");
            else if (!c->in_head && now - c->since > h->o.timeout_keep_alive)
                destroy_conn(c);
            break;
        case C_BODY:
            if (now - c->since > h->o.timeout_io) refuse(c, 408, "Timed out waiting for the request body");
            break;
        case C_LINGER:
            if (now - c->since > LINGER_S) abandon(c);
            break;
        case C_BUSY: break;
        }
    }
}

static void process_done(cv_http *h) {
    for (;;) {
        pthread_mutex_lock(&h->mu);
        if (h->n_done == 0) {
            pthread_mutex_unlock(&h->mu);
            return;
        }
        conn *c = h->done[--h->n_done];
        c->done_queued = false;
        pthread_mutex_unlock(&h->mu);
        try_complete(c);
    }
}

static void close_listener(cv_http *h);

static void *loop_main(void *arg) {
    cv_http *h = arg;
    struct epoll_event evs[MAX_EVENTS];
    double next_tick = cv_now() + TICK_MS / 1e3;
    for (;;) {
        int n = epoll_wait(h->ep, evs, MAX_EVENTS, TICK_MS);
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &LISTEN_TAG) {
                accept_all(h);
            } else if (p == &WAKE_TAG) {
                uint64_t v;
                ssize_t r = read(h->wake, &v, sizeof v);
                (void)r;
            } else {
                on_event(p, evs[i].events);
            }
        }
        process_done(h);
        pthread_mutex_lock(&h->mu);
        bool quiesce = h->quiesce, closing = h->closing, stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (quiesce && h->lfd >= 0) {
            epoll_ctl(h->ep, EPOLL_CTL_DEL, h->lfd, NULL);
            close_listener(h);
        }
        if (stop) break;
        double now = cv_now();
        if (now >= next_tick || closing) {
            sweep(h, now, closing);
            if (h->tls) cv_tls_refresh(h->tls, now);
            next_tick = now + TICK_MS / 1e3;
        }
        bury(h);
    }
    /* cv_http_stop waited for every request the application held; one refused since (a head that
     * arrived while closing) may still wait for its completion here. */
    while (h->conns) {
        conn *c = h->conns;
        if (c->req) {
            if (h->cb.on_complete) h->cb.on_complete(h->cb.user, c->req, c->req->status);
            free_req(c->req);
            c->req = NULL;
        }
        c->done_queued = false;
        destroy_conn(c);
    }
    bury(h);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* Start and stop                                                                                    */

/* Each connection is a descriptor: make room for the cap if the hard limit allows. */
static void raise_fd_limit(int want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= (rlim_t)want) return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (rlim_t)want ? (rlim_t)want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < (rlim_t)want)
        cv_warn("http", "open-file limit %llu is below the %d connections allowed (ulimit -n)",
                (unsigned long long)rl.rlim_cur, want);
}

int cv_http_bind(const char *host, int port_number, int *fd_out) {
    char port[16];
    snprintf(port, sizeof port, "%d", port_number);
    if (!host || !*host) host = "0.0.0.0";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return cv_fail(CVLLM_ERR_IO, "cannot listen on %s:%d (address in use or not available)", host, port_number);
    }
    freeaddrinfo(res);
    *fd_out = fd;
    return 0;
}

/* Whether path is a Unix socket that nothing listens on (left by a server that is gone). */
static bool stale_socket(const char *path, const struct sockaddr_un *a) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool refused = fd >= 0 && connect(fd, (const struct sockaddr *)a, sizeof *a) != 0 && errno == ECONNREFUSED;
    if (fd >= 0) close(fd);
    return refused;
}

int cv_http_bind_unix(const char *path, int *fd_out) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (!*path || strlen(path) >= sizeof a.sun_path)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Unix socket path '%s': 1 to %zu bytes", path, sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path) + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = fd >= 0 ? bind(fd, (struct sockaddr *)&a, sizeof a) : -1;
    if (rc != 0 && errno == EADDRINUSE && stale_socket(path, &a) && unlink(path) == 0)
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    if (rc != 0) {
        const int e = errno;
        if (fd >= 0) close(fd);
        return cv_fail(CVLLM_ERR_IO, "cannot listen on Unix socket %s: %s", path,
                       e == EADDRINUSE ? "the path exists (a server listens there, or it is no socket)" : strerror(e));
    }
    *fd_out = fd;
    return 0;
}

/* Closes the listening socket; a Unix socket's path goes with it, so the next server can bind it. */
static void close_listener(cv_http *h) {
    struct sockaddr_un a;
    socklen_t alen = sizeof a;
    if (getsockname(h->lfd, (struct sockaddr *)&a, &alen) == 0 && a.sun_family == AF_UNIX && a.sun_path[0])
        unlink(a.sun_path);
    close(h->lfd);
    h->lfd = -1;
}

/* The port a socket is bound to (the one the kernel picked for port 0); 0 for a Unix socket. */
static int bound_port(int fd) {
    struct sockaddr_storage a;
    socklen_t alen = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &alen);
    if (a.ss_family == AF_UNIX) return 0;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
}

int cv_http_start(const cv_http_options *opts, const cv_http_callbacks *cb, cv_http **out) {
    cv_http *h = cv_xcalloc(1, sizeof *h);
    h->o = *opts;
    h->cb = *cb;
    if (h->o.workers <= 0) h->o.workers = DEFAULT_WORKERS;
    if (h->o.max_connections <= 0) h->o.max_connections = DEFAULT_MAX_CONNECTIONS;
    if (h->o.max_connections_per_client <= 0) h->o.max_connections_per_client = h->o.max_connections;
    h->lfd = h->ep = h->wake = -1;
    if (opts->tls && opts->tls->certfile) {
        int rc = cv_tls_create(opts->tls, &h->tls);
        if (rc) {
            if (opts->bound) close(opts->bound_fd);
            free(h);
            return rc;
        }
    }
    int rc = opts->bound ? (h->lfd = opts->bound_fd, 0) : cv_http_bind(opts->host, opts->port, &h->lfd);
    if (!rc && listen(h->lfd, 1024) != 0) {
        rc = cv_fail(CVLLM_ERR_IO, "cannot listen on port %d: %s", bound_port(h->lfd), strerror(errno));
        close(h->lfd);
    }
    if (rc) {
        cv_tls_destroy(h->tls);
        free(h);
        return rc;
    }
    h->port = bound_port(h->lfd);
    raise_fd_limit(h->o.max_connections + 64);
    h->ep = epoll_create1(EPOLL_CLOEXEC);
    h->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = &LISTEN_TAG}, we = {.events = EPOLLIN, .data.ptr = &WAKE_TAG};
    if (h->ep < 0 || h->wake < 0 || epoll_ctl(h->ep, EPOLL_CTL_ADD, h->lfd, &le) || epoll_ctl(h->ep, EPOLL_CTL_ADD, h->wake, &we)) {
        rc = cv_fail(CVLLM_ERR_IO, "cannot set up the HTTP event loop: %s", strerror(errno));
        if (h->ep >= 0) close(h->ep);
        if (h->wake >= 0) close(h->wake);
        close(h->lfd);
        cv_tls_destroy(h->tls);
        free(h);
        return rc;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->work_cv, NULL);
    pthread_cond_init(&h->idle_cv, NULL);
    h->workers = cv_xcalloc((size_t)h->o.workers, sizeof *h->workers);
    for (h->n_workers = 0; h->n_workers < h->o.workers; h->n_workers++)
        pthread_create(&h->workers[h->n_workers], NULL, worker_main, h);
    pthread_create(&h->loop, NULL, loop_main, h);
    *out = h;
    return 0;
}

int cv_http_port(const cv_http *h) { return h->port; }

static void wake_loop(cv_http *h) {
    uint64_t one = 1;
    ssize_t w = write(h->wake, &one, sizeof one);
    (void)w;
}

void cv_http_quiesce(cv_http *h) {
    pthread_mutex_lock(&h->mu);
    h->quiesce = true;
    pthread_mutex_unlock(&h->mu);
    wake_loop(h);
}

void cv_http_stop(cv_http *h) {
    if (!h) return;
    /* Requests not yet begun are refused; every request the application holds must come back
     * through its finish call, and its reply be written, before the loop stops. */
    pthread_mutex_lock(&h->mu);
    h->quiesce = h->closing = true;
    pthread_mutex_unlock(&h->mu);
    wake_loop(h);
    pthread_mutex_lock(&h->mu);
    while (h->live > 0) pthread_cond_wait(&h->idle_cv, &h->mu);
    h->workers_stop = true;
    pthread_cond_broadcast(&h->work_cv);
    h->stop = true;
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < h->n_workers; i++) pthread_join(h->workers[i], NULL);
    wake_loop(h);
    pthread_join(h->loop, NULL);
    if (h->lfd >= 0) close_listener(h);
    close(h->ep);
    close(h->wake);
    pthread_cond_destroy(&h->work_cv);
    pthread_cond_destroy(&h->idle_cv);
    pthread_mutex_destroy(&h->mu);
    cv_tls_destroy(h->tls);
    free(h->done);
    free(h->workers);
    free(h);
}
