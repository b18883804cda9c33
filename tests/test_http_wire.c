/*
 * test_http_wire.c — the HTTP layer as a client sees it on the wire: raw bytes over sockets against
 * an in-process server on the reference checkpoint, no HTTP library on the client side.
 *
 *   - Every malformed request of the hardening issue gets exactly one well-formed reply: one status
 *     line with the right 4xx/5xx, a content-length that matches, vLLM's JSON error body with that
 *     code, and the connection closed after it. A greedy completion before and after the battery
 *     gives the same text, so nothing was harmed.
 *   - The protocol features clients rely on: pipelining, Expect: 100-continue, chunked uploads,
 *     HEAD, keep-alive.
 *   - No lock-out: 2,000 idle connections and 20 slow dribblers open while normal requests are
 *     served; dribblers are cut at the header timeout, idle connections at the keep-alive timeout;
 *     the per-client and total connection caps answer 503, and at the total cap an idle connection
 *     makes room for a newcomer.
 * Idle and capped connections come from several loopback addresses (127.0.0.x), as distinct
 * clients would.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "check.h"
#include "cvllm.h"
#include "engine/engine_group.h"
#include "server/server.h"
#include "testutil.h"

enum { MAX_BODY = 64 * 1024, N_IDLE = 2000, N_DRIBBLERS = 20 };

typedef struct fixture {
    cv_engine_group *group;
    cv_server *srv;
    int port;
} fixture;

static fixture main_srv, tight_srv;
static char *model_dir;

static void start(fixture *f, const cv_server_options *extra) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = model_dir;
    o.max_model_len = 1024;
    o.kv_cache_memory_bytes = 16u << 20;
    o.num_threads = 2;
    o.dtype = "float32";
    cv_loop_options lo = {.async_scheduling = true};
    CHECK_MSG(cv_engine_group_start(&o, &lo, &f->group) == 0, "engine: %s", cvllm_last_error());
    cv_server_options so = *extra;
    so.host = "0.0.0.0"; /* reachable from every 127.0.0.x source address */
    so.model_root = model_dir;
    so.max_body_bytes = MAX_BODY;
    int rc = cv_server_start(f->group, &so, &f->srv);
    CHECK_MSG(rc == 0, "server: %s", cvllm_last_error());
    if (rc) exit(1);
    f->port = cv_server_port(f->srv);
}

static void stop(fixture *f) {
    cv_server_stop(f->srv, 0);
    cv_engine_group_stop(f->group);
}

/* ------------------------------------------------------------------------------------------------ */
/* A raw client                                                                                      */

/* A connected socket from source address `from` (NULL = 127.0.0.1 and an ephemeral port); -1 on
 * failure. With `from`, the source port comes from below the ephemeral range (20000-29999): the
 * thousands of connections this test holds must not take the ports other tests running beside it
 * pick as free and then bind. SO_REUSEADDR lets a port left in TIME_WAIT by an earlier run serve
 * again (the server's port, hence the whole address pair, differs between runs). */
static int dial(int port, const char *from) {
    static int next_source_port;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    if (from) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        a.sin_port = htons((uint16_t)(20000 + next_source_port++ % 10000));
        inet_pton(AF_INET, from, &a.sin_addr);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            return -1;
        }
    }
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* the server may close early on purpose; what it sent is still read */
        p += w;
        n -= (size_t)w;
    }
}

typedef struct wire {
    char *data;
    size_t len;
    bool closed;                 /* the server closed its side */
    double seconds;              /* until closed (or the guard) */
} wire;

/* Reads until the server closes, or `guard` seconds pass. */
static wire read_until_close(int fd, double guard) {
    wire w = {0};
    double t0 = cv_now();
    size_t cap = 0;
    for (;;) {
        double left = guard - (cv_now() - t0);
        if (left <= 0) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        if (w.len + 4096 + 1 > cap) {
            cap = (w.len + 4096 + 1) * 2;
            w.data = realloc(w.data, cap);
        }
        ssize_t n = recv(fd, w.data + w.len, 4096, 0);
        if (n <= 0) {
            w.closed = true;
            break;
        }
        w.len += (size_t)n;
    }
    if (!w.data) w.data = calloc(1, 1);
    w.data[w.len] = '\0';
    w.seconds = cv_now() - t0;
    return w;
}

/* Sends raw bytes on a fresh connection and reads everything until the server closes. */
static wire exchange(int port, const char *bytes, size_t len) {
    int fd = dial(port, NULL);
    CHECK(fd >= 0);
    send_all(fd, bytes, len);
    wire w = read_until_close(fd, 20);
    close(fd);
    return w;
}

static int count_status_lines(const char *s, size_t len) {
    int n = 0;
    for (size_t i = 0; i + 9 <= len; i++)
        if ((i == 0 || s[i - 1] == '\n') && !strncmp(s + i, "HTTP/1.", 7)) n++;
    return n;
}

/* The value of header `name` in the head at s (NULL-terminated copy in out), or false. */
static bool header_value(const char *s, const char *name, char *out, size_t cap) {
    const char *end = strstr(s, "\r\n\r\n");
    size_t n = strlen(name);
    for (const char *line = strstr(s, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n")) {
        const char *h = line + 2;
        if (!strncasecmp(h, name, n) && h[n] == ':') {
            h += n + 1;
            while (*h == ' ') h++;
            size_t k = strcspn(h, "\r");
            snprintf(out, cap, "%.*s", (int)k, h);
            return true;
        }
    }
    return false;
}

/* One reply, whole and alone: a single status line `status`, a content-length that matches its
 * body, vLLM's JSON error with that code, and then the connection closed. */
static void check_one_error(const char *name, const wire *w, int status) {
    CHECK_MSG(count_status_lines(w->data, w->len) == 1, "%s: %d status lines in '%.300s'", name,
              count_status_lines(w->data, w->len), w->data);
    int got = 0;
    sscanf(w->data, "HTTP/1.1 %d", &got);
    CHECK_MSG(got == status, "%s: status %d, want %d ('%.200s')", name, got, status, w->data);
    CHECK_MSG(w->closed, "%s: connection left open", name);
    const char *body = strstr(w->data, "\r\n\r\n");
    CHECK_MSG(body != NULL, "%s: no end of headers", name);
    if (!body) return;
    body += 4;
    char v[64];
    CHECK_MSG(header_value(w->data, "content-length", v, sizeof v) && strtoul(v, NULL, 10) == strlen(body),
              "%s: content-length does not match the body", name);
    CHECK_MSG(header_value(w->data, "content-type", v, sizeof v) && !strcmp(v, "application/json"), "%s: content-type",
              name);
    json_t *j = json_loads(body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    CHECK_MSG(json_integer_value(json_object_get(e, "code")) == status && json_is_string(json_object_get(e, "message")),
              "%s: body '%s'", name, body);
    json_decref(j);
}

/* ------------------------------------------------------------------------------------------------ */
/* A reference request                                                                               */

static char *greedy_text(int port) {
    const char *body = "{\"prompt\": \"I am in the house. We are\", \"max_tokens\": 12, \"temperature\": 0}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(body), body);
    wire w = exchange(port, req, (size_t)n);
    const char *b = strstr(w.data, "\r\n\r\n");
    json_t *j = b ? json_loads(b + 4, 0, NULL) : NULL;
    const char *text = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    CHECK_MSG(text != NULL, "reference request: '%.300s'", w.data);
    char *out = strdup(text ? text : "");
    json_decref(j);
    free(w.data);
    return out;
}

/* ------------------------------------------------------------------------------------------------ */
/* Malformed requests                                                                                */

typedef struct bad_case {
    const char *name;
    const char *head;            /* sent as is (NULL: built by the test) */
    int status;
} bad_case;

#define POST_TOKENIZE "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"

static const bad_case bad_cases[] = {
    {"no spaces", "GARBAGE\r\n\r\n", 400},
    {"method only", "GET\r\n\r\n", 400},
    {"TLS hello", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400},
    {"binary first byte", "\x01GET / HTTP/1.1\r\n", 400},
    {"TE gzip", POST_TOKENIZE "Transfer-Encoding: gzip\r\n\r\n", 501},
    {"TE chunked, gzip", POST_TOKENIZE "Transfer-Encoding: chunked, gzip\r\n\r\n", 400},
    {"TE identity", POST_TOKENIZE "Transfer-Encoding: identity\r\n\r\n", 501},
    {"TE bogus", POST_TOKENIZE "Transfer-Encoding: bogus\r\n\r\n", 501},
    {"TE empty", POST_TOKENIZE "Transfer-Encoding: \r\n\r\n", 400},
    {"CL abc", POST_TOKENIZE "Content-Length: abc\r\n\r\n", 400},
    {"CL -1", POST_TOKENIZE "Content-Length: -1\r\n\r\n", 400},
    {"CL 1.5", POST_TOKENIZE "Content-Length: 1.5\r\n\r\n", 400},
    {"CL 0x10", POST_TOKENIZE "Content-Length: 0x10\r\n\r\n", 400},
    {"CL empty", POST_TOKENIZE "Content-Length: \r\n\r\n", 400},
    {"CL overflow", POST_TOKENIZE "Content-Length: 99999999999999999999999\r\n\r\n", 400},
    {"CL twice", POST_TOKENIZE "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400},
    {"CL twice equal", POST_TOKENIZE "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400},
    {"CL and TE", POST_TOKENIZE "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
    {"space in header name", "GET /v1/models HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n", 400},
    {"space before colon", "GET /v1/models HTTP/1.1\r\nHost : t\r\n\r\n", 400},
    {"obs-fold", "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-A: a\r\n b\r\n\r\n", 400},
    {"control byte in value", "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-A: a\x01\r\n\r\n", 400},
    {"bare LF", "GET /v1/models HTTP/1.1\nHost: t\n\n", 400},
    {"no Host", "GET /v1/models HTTP/1.1\r\n\r\n", 400},
    {"two Hosts", "GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
    {"HTTP/2.0", "GET /v1/models HTTP/2.0\r\nHost: t\r\n\r\n", 505},
    {"HTTP/1.x garbage", "GET /v1/models HTTP/1.x\r\nHost: t\r\n\r\n", 400},
    {"unknown method", "FOO /v1/models HTTP/1.1\r\nHost: t\r\n\r\n", 501},
    {"%00 in path", "GET /v1/models%00 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 404},
    {"NUL in path", NULL, 400},
    {"100 KB chunk extension", NULL, 400},
    {"100 KB chunk-size line", NULL, 400},
    {"20 KB header", NULL, 431},
    {"10 KB request line", NULL, 414},
    {"body over the limit", NULL, 413},
    {"bad chunk size", POST_TOKENIZE "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
    {"chunk without CRLF", POST_TOKENIZE "Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n", 400},
};

/* The cases whose bytes are too long or too odd for a string literal. */
static char *build_case(const char *name, size_t *len) {
    size_t cap = 256 * 1024;
    char *b = calloc(1, cap);
    int n = 0;
    if (!strcmp(name, "NUL in path")) {
        memcpy(b, "GET /v1/models\0x HTTP/1.1\r\nHost: t\r\n\r\n", 39);
        *len = 39;
        return b;
    }
    if (!strcmp(name, "100 KB chunk extension")) {
        n = snprintf(b, cap, POST_TOKENIZE "Transfer-Encoding: chunked\r\n\r\n2;ext=");
        memset(b + n, 'a', 100000);
        n += 100000;
        n += snprintf(b + n, cap - (size_t)n, "\r\n{}\r\n0\r\n\r\n");
    } else if (!strcmp(name, "100 KB chunk-size line")) {
        n = snprintf(b, cap, POST_TOKENIZE "Transfer-Encoding: chunked\r\n\r\n");
        memset(b + n, '0', 100000);
        n += 100000;
        n += snprintf(b + n, cap - (size_t)n, "2\r\n{}\r\n0\r\n\r\n");
    } else if (!strcmp(name, "20 KB header")) {
        n = snprintf(b, cap, "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Big: ");
        memset(b + n, 'x', 20000);
        n += 20000;
        n += snprintf(b + n, cap - (size_t)n, "\r\n\r\n");
    } else if (!strcmp(name, "10 KB request line")) {
        n = snprintf(b, cap, "GET /");
        memset(b + n, 'p', 10000);
        n += 10000;
        n += snprintf(b + n, cap - (size_t)n, " HTTP/1.1\r\nHost: t\r\n\r\n");
    } else if (!strcmp(name, "body over the limit")) {
        n = snprintf(b, cap, POST_TOKENIZE "Content-Length: %d\r\n\r\n", MAX_BODY + 1);
        memset(b + n, ' ', MAX_BODY + 1);
        n += MAX_BODY + 1;
    }
    *len = (size_t)n;
    return b;
}

static void test_malformed(void) {
    char *before = greedy_text(main_srv.port);
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const bad_case *c = &bad_cases[i];
        size_t len;
        char *bytes = c->head ? strdup(c->head) : build_case(c->name, &len);
        if (c->head) len = strlen(c->head);
        wire w = exchange(main_srv.port, bytes, len);
        check_one_error(c->name, &w, c->status);
        free(w.data);
        free(bytes);
    }
    char *after = greedy_text(main_srv.port);
    CHECK_MSG(!strcmp(before, after), "greedy text changed: '%s' vs '%s'", before, after);
    free(before);
    free(after);
}

/* An announced oversized body is refused before it is sent (Expect: 100-continue). */
static void test_expect(void) {
    int fd = dial(main_srv.port, NULL);
    char head[256];
    int n = snprintf(head, sizeof head, POST_TOKENIZE "Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", MAX_BODY * 4);
    send_all(fd, head, (size_t)n);
    wire w = read_until_close(fd, 20);
    check_one_error("Expect + oversized", &w, 413);
    free(w.data);
    close(fd);

    const char *body = "{\"prompt\": \"I am\"}";
    fd = dial(main_srv.port, NULL);
    n = snprintf(head, sizeof head, POST_TOKENIZE "Content-Length: %zu\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
                 strlen(body));
    send_all(fd, head, (size_t)n);
    char got[64] = {0};
    ssize_t r = recv(fd, got, 25, MSG_WAITALL);
    CHECK_MSG(r == 25 && !strcmp(got, "HTTP/1.1 100 Continue\r\n\r\n"), "no 100 Continue: '%s'", got);
    send_all(fd, body, strlen(body));
    w = read_until_close(fd, 20);
    CHECK_MSG(!strncmp(w.data, "HTTP/1.1 200 ", 13) && strstr(w.data, "\"tokens\""), "after 100: '%.200s'", w.data);
    free(w.data);
    close(fd);
}

static void test_protocol_features(void) {
    /* Pipelining: two requests in one write, two replies in order, then the close asked for. */
    const char *two = "GET /health HTTP/1.1\r\nHost: t\r\n\r\nGET /version HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    wire w = exchange(main_srv.port, two, strlen(two));
    CHECK_MSG(count_status_lines(w.data, w.len) == 2 && w.closed, "pipelining: '%s'", w.data);
    const char *second = strstr(w.data + 1, "HTTP/1.1 200");
    CHECK(second && strstr(second, "\"version\""));
    free(w.data);

    /* A chunked upload with an extension and a trailer. */
    const char *chunked = POST_TOKENIZE "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                        "5;note=x\r\n{\"pro\r\nd\r\nmpt\": \"I am\"}\r\n0\r\nX-Trailer: y\r\n\r\n";
    w = exchange(main_srv.port, chunked, strlen(chunked));
    CHECK_MSG(!strncmp(w.data, "HTTP/1.1 200 ", 13) && strstr(w.data, "\"count\":2"), "chunked: '%.300s'", w.data);
    free(w.data);

    /* HEAD: the headers of GET, no body. */
    const char *head = "HEAD /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    w = exchange(main_srv.port, head, strlen(head));
    char v[32];
    const char *end = strstr(w.data, "\r\n\r\n");
    CHECK_MSG(!strncmp(w.data, "HTTP/1.1 200 ", 13) && end && end[4] == '\0' && header_value(w.data, "content-length", v, sizeof v) &&
                  atoi(v) > 0,
              "HEAD: '%s'", w.data);
    free(w.data);

    /* HTTP/1.0: closed after the reply unless kept alive, which the reply then says. */
    const char *old = "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /version HTTP/1.0\r\n\r\n";
    w = exchange(main_srv.port, old, strlen(old));
    CHECK_MSG(count_status_lines(w.data, w.len) == 2 && w.closed && header_value(w.data, "connection", v, sizeof v) &&
                  !strcasecmp(v, "keep-alive"),
              "HTTP/1.0: '%s'", w.data);
    free(w.data);
    /* An HTTP/1.0 stream has no chunked coding: the SSE bytes as they are, ended by the close. */
    const char *sbody = "{\"prompt\": \"I am\", \"max_tokens\": 3, \"stream\": true}";
    char sreq[256];
    int sn = snprintf(sreq, sizeof sreq, "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n%s", strlen(sbody), sbody);
    w = exchange(main_srv.port, sreq, (size_t)sn);
    const char *sse = strstr(w.data, "\r\n\r\n");
    CHECK_MSG(w.closed && !header_value(w.data, "transfer-encoding", v, sizeof v) && sse && !strncmp(sse + 4, "data: {", 7) &&
                  strstr(sse, "data: [DONE]\n\n"),
              "HTTP/1.0 stream: '%.300s'", w.data);
    free(w.data);

    /* An application-level 404 keeps the connection for the next request. */
    int fd = dial(main_srv.port, NULL);
    const char *nf = "GET /nope HTTP/1.1\r\nHost: t\r\n\r\nGET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    send_all(fd, nf, strlen(nf));
    w = read_until_close(fd, 20);
    CHECK_MSG(!strncmp(w.data, "HTTP/1.1 404 ", 13) && strstr(w.data, "}HTTP/1.1 200 OK\r\n"), "404 keep-alive: '%s'", w.data);
    free(w.data);
    close(fd);
}

/* ------------------------------------------------------------------------------------------------ */
/* Lock-out                                                                                          */

typedef struct dribble_args {
    int port;
    int fds[N_DRIBBLERS];
    atomic_bool stop;
} dribble_args;

/* One byte of a never-ending head per dribbler every 50 ms. */
static void *dribble(void *arg) {
    dribble_args *d = arg;
    const char *head = "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    size_t i = 0;
    while (!d->stop) {
        for (int k = 0; k < N_DRIBBLERS; k++) {
            char c = i < strlen(head) ? head[i] : 'z';
            if (d->fds[k] >= 0) send(d->fds[k], &c, 1, MSG_NOSIGNAL);
        }
        i++;
        usleep(50000);
    }
    return NULL;
}

static double timed_get(int port, const char *path, int *status) {
    char req[128];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
    double t0 = cv_now();
    wire w = exchange(port, req, (size_t)n);
    double dt = cv_now() - t0;
    *status = 0;
    sscanf(w.data, "HTTP/1.1 %d", status);
    free(w.data);
    return dt;
}

static void test_no_lockout(void) {
    static int idle[N_IDLE];
    int opened = 0;
    for (int i = 0; i < N_IDLE; i++) {
        char from[32];
        snprintf(from, sizeof from, "127.0.0.%d", 2 + i / 500); /* 500 per client address */
        idle[i] = dial(main_srv.port, from);
        opened += idle[i] >= 0;
    }
    CHECK_MSG(opened == N_IDLE, "opened %d idle connections", opened);
    dribble_args d = {.port = main_srv.port};
    for (int k = 0; k < N_DRIBBLERS; k++) d.fds[k] = dial(main_srv.port, "127.0.0.9");
    pthread_t t;
    pthread_create(&t, NULL, dribble, &d);
    /* A bound generous enough for a sanitized build on a busy machine, tight enough to show that
     * nobody waits behind the idle and slow connections. */
    double bound = getenv("CVLLM_SANITIZED") ? 5.0 : 1.0;
    for (int k = 0; k < 5; k++) {
        int status;
        double dt = timed_get(main_srv.port, k % 2 ? "/health" : "/v1/models", &status);
        CHECK_MSG(status == 200 && dt < bound, "request %d with %d idle connections: status %d in %.3f s", k, opened,
                  status, dt);
    }
    char *text = greedy_text(main_srv.port);
    CHECK(text[0] != '\0');
    free(text);
    /* The idle connections were accepted and still work. */
    for (int i = 0; i < N_IDLE; i += N_IDLE - 1) {
        const char *req = "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
        send_all(idle[i], req, strlen(req));
        wire w = read_until_close(idle[i], 20);
        CHECK_MSG(!strncmp(w.data, "HTTP/1.1 200 ", 13), "idle connection %d: '%.100s'", i, w.data);
        free(w.data);
    }
    d.stop = true;
    pthread_join(t, NULL);
    for (int k = 0; k < N_DRIBBLERS; k++) close(d.fds[k]);
    for (int i = 0; i < N_IDLE; i++) close(idle[i]);
}

/* The tight server: header timeout 1 s, keep-alive 1 s, 16 connections per client, 64 in all. */
static void test_timeouts(void) {
    int fd = dial(tight_srv.port, NULL);
    const char *head = "GET /v1/models HTTP/1.1\r\nHost: t\r\n";
    double t0 = cv_now();
    wire w = {0};
    bool cut = false;
    for (size_t i = 0; !cut && cv_now() - t0 < 20; i++) { /* one byte per 100 ms, never ending */
        char c = i < strlen(head) ? head[i] : 'x';
        if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) cut = true;
    }
    w = read_until_close(fd, 20);
    double took = cv_now() - t0;
    check_one_error("dribbler", &w, 408);
    CHECK_MSG(took >= 0.9, "dribbler cut after %.2f s, before the 1 s header timeout", took);
    free(w.data);
    close(fd);

    /* Idle after a request: closed at the keep-alive timeout, without a reply. */
    fd = dial(tight_srv.port, NULL);
    const char *req = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    send_all(fd, req, strlen(req));
    w = read_until_close(fd, 20);
    CHECK_MSG(w.closed && count_status_lines(w.data, w.len) == 1 && w.seconds >= 0.9,
              "keep-alive timeout: closed %d after %.2f s: '%s'", w.closed, w.seconds, w.data);
    free(w.data);
    close(fd);
}

static void test_connection_caps(void) {
    enum { PER_CLIENT = 16, TOTAL = 64 };
    int fds[TOTAL];
    for (int i = 0; i < PER_CLIENT; i++) fds[i] = dial(tight_srv.port, "127.0.1.1");
    /* Wait until the server has accepted them all: a request on the last one is answered. */
    const char *req = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    send_all(fds[PER_CLIENT - 1], req, strlen(req));
    char buf[256];
    CHECK(recv(fds[PER_CLIENT - 1], buf, sizeof buf, 0) > 0);
    int extra = dial(tight_srv.port, "127.0.1.1");
    wire w = read_until_close(extra, 20);
    check_one_error("per-client cap", &w, 503);
    free(w.data);
    close(extra);
    int status;
    timed_get(tight_srv.port, "/health", &status);
    CHECK_MSG(status == 200, "another client after one hit its cap: %d", status);

    /* Fill the server with idle connections from three more clients; the oldest idle one makes
     * room for a newcomer. */
    for (int i = PER_CLIENT; i < TOTAL; i++) {
        char from[32];
        snprintf(from, sizeof from, "127.0.1.%d", 1 + i / PER_CLIENT);
        fds[i] = dial(tight_srv.port, from);
    }
    send_all(fds[TOTAL - 1], req, strlen(req));
    CHECK(recv(fds[TOTAL - 1], buf, sizeof buf, 0) > 0);
    timed_get(tight_srv.port, "/health", &status);
    CHECK_MSG(status == 200, "newcomer at the cap with idle connections: %d", status);
    int evicted = 0;
    for (int i = 0; i < TOTAL; i++) {
        struct pollfd p = {.fd = fds[i], .events = POLLIN};
        if (poll(&p, 1, 0) > 0 && recv(fds[i], buf, sizeof buf, MSG_DONTWAIT) == 0) evicted++;
        close(fds[i]);
    }
    CHECK_MSG(evicted >= 1, "no idle connection was closed to make room");
    /* Once a later request is answered the server has seen those closes: they were ready first. */
    timed_get(tight_srv.port, "/health", &status);

    /* With every connection in the middle of a head, nobody can be evicted: 503. */
    for (int i = 0; i < TOTAL; i++) {
        char from[32];
        snprintf(from, sizeof from, "127.0.2.%d", 1 + i / PER_CLIENT);
        fds[i] = dial(tight_srv.port, from);
        send_all(fds[i], "GET /he", 7);
    }
    /* The last one completes its request (so the server has read every head) and begins another. */
    const char *more = "alth HTTP/1.1\r\nHost: t\r\n\r\nGET /he";
    send_all(fds[TOTAL - 1], more, strlen(more));
    CHECK(recv(fds[TOTAL - 1], buf, sizeof buf, 0) > 0);
    int newcomer = dial(tight_srv.port, "127.0.3.1");
    w = read_until_close(newcomer, 20);
    CHECK_MSG(!strncmp(w.data, "HTTP/1.1 503 ", 13), "full server: '%.200s'", w.data);
    free(w.data);
    close(newcomer);
    for (int i = 0; i < TOTAL; i++) close(fds[i]);
}

int main(void) {
    /* Each idle connection is a descriptor on both ends, in this one process. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 2 * N_IDLE + 512) {
        printf("SKIP test_http_wire: the open-file hard limit %llu is below %d\n", (unsigned long long)rl.rlim_max,
               2 * N_IDLE + 512);
        return 77;
    }
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    model_dir = tu_model_dir("qwen3-dense-f32");
    cv_server_options o = {.timeout_keep_alive = 60};
    start(&main_srv, &o);
    cv_server_options tight = {.timeout_keep_alive = 1, .timeout_request_header = 1, .limit_concurrency = 64,
                               .limit_concurrency_per_client = 16};
    start(&tight_srv, &tight);
    test_malformed();
    test_expect();
    test_protocol_features();
    test_no_lockout();
    test_timeouts();
    test_connection_caps();
    stop(&main_srv);
    stop(&tight_srv);
    tu_remove_tree(model_dir);
    free(model_dir);
    return cv_check_summary("test_http_wire");
}
