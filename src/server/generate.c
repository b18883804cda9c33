/*
 * generate.c — /v1/completions and /v1/chat/completions over the engine loop.
 *
 * One HTTP request becomes a session: one engine request per prompt (n choices each), all feeding
 * one cv_api_response under the session's mutex. Engine events arrive on the loop's output thread;
 * the HTTP side waits on the session's condition variable, in its own connection thread.
 *
 * Lifetime is a reference count: one reference for the HTTP side (dropped when the reply is sent,
 * or when libmicrohttpd frees a stream's response) and one per engine request that has not had its
 * final event yet. The engine loop guarantees that final event for every submitted request, also
 * after an abort, so the session is freed exactly once, by whichever side lets go last.
 *
 * Disconnects: while a client waits, every 50 ms its socket is polled for hang-up; a streaming
 * client is also caught when a write fails (libmicrohttpd then frees the response). Either way
 * every engine request of the session is aborted at once, which frees its KV blocks in the next
 * engine step.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/timeutil.h"
#include "base/log.h"
#include "server/server_internal.h"

enum { WAIT_SLICE_MS = 50, STREAM_BLOCK = 16 * 1024 };

typedef struct gen_session gen_session;

typedef struct gen_slot {
    gen_session *g;
    size_t prompt;
} gen_slot;

struct gen_session {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    cv_server *s;
    struct MHD_Connection *conn;
    cv_api_request req;
    cv_api_response resp;
    gen_slot *slots;
    uint64_t *ids;              /* engine request ids of the submitted prompts */
    size_t n_submitted;
    size_t n_open;              /* prompts without their final event (or never submitted) */
    double arrival;             /* when the body was complete, before tokenization (TTFT start) */
    bool aborted, client_gone;
    char *sse;                  /* stream bytes not yet handed to libmicrohttpd */
    size_t sse_len, sse_cap, sse_sent;
};

static gen_session *session_new(cv_server *s, struct MHD_Connection *c, cv_api_request *req, double arrival) {
    gen_session *g = cv_xcalloc(1, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &attr);
    pthread_condattr_destroy(&attr);
    g->s = s;
    g->conn = c;
    g->arrival = arrival;
    g->req = *req;
    memset(req, 0, sizeof *req);
    g->refs = 1 + (int)g->req.n_prompts;
    g->n_open = g->req.n_prompts;
    g->slots = cv_xcalloc(g->req.n_prompts, sizeof *g->slots);
    g->ids = cv_xcalloc(g->req.n_prompts, sizeof *g->ids);
    cv_api_response_init(&g->resp, &g->req, s->tok, s->names[0], s->cached_details);
    atomic_fetch_add(&s->sessions, 1);
    return g;
}

static void release(gen_session *g, int n) {
    pthread_mutex_lock(&g->mu);
    g->refs -= n;
    int left = g->refs;
    pthread_mutex_unlock(&g->mu);
    assert(left >= 0);
    if (left > 0) return;
    atomic_fetch_sub(&g->s->sessions, 1);
    cv_api_response_free(&g->resp);
    cv_api_request_free(&g->req);
    free(g->slots);
    free(g->ids);
    free(g->sse);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void abort_all(gen_session *g) {
    for (size_t i = 0; i < g->n_submitted; i++) cv_engine_loop_abort(g->s->loop, g->ids[i]);
}

/* The loop's callback, on its output thread. */
static void on_event(void *user, cv_request_event *ev) {
    gen_slot *slot = user;
    gen_session *g = slot->g;
    bool finished = ev->finished;
    pthread_mutex_lock(&g->mu);
    bool stream = g->req.stream;
    cv_api_response_apply(&g->resp, slot->prompt, ev, stream ? &g->sse : NULL, &g->sse_len, &g->sse_cap);
    if (finished && --g->n_open == 0 && stream) cv_api_response_stream_end(&g->resp, &g->sse, &g->sse_len, &g->sse_cap);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    cv_request_event_free(ev);
    if (finished) release(g, 1);
}

/* A timed wait on the session; the caller holds g->mu. */
static void wait_slice(gen_session *g) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int rc = pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    assert(rc == 0 || rc == ETIMEDOUT);
    (void)rc;
}

/* Called with g->mu held while waiting: aborts the session once when the client left or the server
 * is stopping. Returns with g->mu held. */
static void check_abandoned(gen_session *g) {
    if (g->aborted || g->n_open == 0) return;
    bool gone = cv_http_peer_gone(g->conn);
    if (!gone && !atomic_load(&g->s->stopping)) return;
    g->aborted = true;
    g->client_gone = gone;
    pthread_mutex_unlock(&g->mu);
    cv_info("server", "aborted request %s (%s)", g->resp.id, gone ? "client disconnected" : "server shutting down");
    abort_all(g);
    pthread_mutex_lock(&g->mu);
}

/* Submits one engine request per prompt. On failure the ones already in are aborted, the rest are
 * written off, and *err says why. */
static int submit_all(gen_session *g, cv_api_error *err) {
    const cv_api_request *req = &g->req;
    for (size_t i = 0; i < req->n_prompts; i++) {
        const cv_api_prompt *p = &req->prompts[i];
        cvllm_prompt prompt = {.token_ids = p->ids, .n_token_ids = p->n_ids, .cache_salt = req->cache_salt};
        cvllm_sampling_params params = cv_api_prompt_params(req, i);
        g->slots[i] = (gen_slot){g, i};
        cv_submit sub = {.prompt = &prompt,
                         .params = &params,
                         .on_event = on_event,
                         .user = &g->slots[i],
                         .arrival_time = g->arrival};
        int rc = cv_engine_loop_submit(g->s->loop, &sub, &g->ids[i]);
        if (rc == 0) {
            g->n_submitted++;
            continue;
        }
        int status = rc == CVLLM_ERR_INVALID_ARGUMENT || rc == CVLLM_ERR_CAPACITY ? 400
                     : rc == CVLLM_ERR_UNAVAILABLE                                ? 503
                                                                                  : 500;
        cv_api_fail(err, status, NULL, "%s", cvllm_last_error());
        size_t unsent = req->n_prompts - i;
        pthread_mutex_lock(&g->mu);
        g->n_open -= unsent;
        g->aborted = true;
        pthread_mutex_unlock(&g->mu);
        release(g, (int)unsent);
        abort_all(g);
        return -1;
    }
    return 0;
}

static void wait_until_finished(gen_session *g) {
    pthread_mutex_lock(&g->mu);
    while (g->n_open > 0) {
        wait_slice(g);
        check_abandoned(g);
    }
    pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------------------------------------------ */
/* Streaming                                                                                         */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    gen_session *g = cls;
    (void)pos;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (g->sse_sent < g->sse_len) {
            size_t n = g->sse_len - g->sse_sent < max ? g->sse_len - g->sse_sent : max;
            memcpy(buf, g->sse + g->sse_sent, n);
            g->sse_sent += n;
            if (g->sse_sent == g->sse_len) g->sse_sent = g->sse_len = 0;
            pthread_mutex_unlock(&g->mu);
            return (ssize_t)n;
        }
        if (g->n_open == 0) break;
        wait_slice(g);
        check_abandoned(g);
        if (g->client_gone) {
            pthread_mutex_unlock(&g->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* libmicrohttpd is done with the stream: finished, or the connection broke mid-way. */
static void stream_free(void *cls) {
    gen_session *g = cls;
    pthread_mutex_lock(&g->mu);
    bool abort_now = g->n_open > 0 && !g->aborted;
    g->aborted = true;
    pthread_mutex_unlock(&g->mu);
    if (abort_now) {
        cv_info("server", "aborted request %s (client disconnected)", g->resp.id);
        abort_all(g);
    }
    release(g, 1);
}

static enum MHD_Result start_stream(gen_session *g, struct MHD_Connection *c) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, g, stream_free);
    if (!resp) {
        stream_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* The endpoint                                                                                      */

static int parse_and_prepare(cv_server *s, cv_api_kind kind, const char *body, size_t len, cv_api_request *req,
                             cv_api_error *err) {
    int rc = kind == CV_API_CHAT ? cv_api_parse_chat(body, len, &s->limits, req, err)
                                 : cv_api_parse_completion(body, len, &s->limits, req, err);
    if (rc) return rc;
    if (!cv_server_model_name(s, req->model, err)) return -1;
    if (atomic_load(&s->draining)) return cv_api_fail(err, 503, NULL, "The server is shutting down");
    if (req->stream && s->force_usage) req->include_usage = true;
    return cv_api_prepare(req, s->tok, &s->limits, err);
}

enum MHD_Result cv_generate(cv_server *s, struct MHD_Connection *c, cv_api_kind kind, const char *body, size_t len) {
    cv_api_request req;
    cv_api_error err;
    double arrival = cv_now();
    if (parse_and_prepare(s, kind, body, len, &req, &err)) {
        cv_api_request_free(&req);
        return cv_http_send_error(c, &err);
    }
    gen_session *g = session_new(s, c, &req, arrival);
    if (submit_all(g, &err)) {
        wait_until_finished(g); /* the aborted ones still report, and may touch g until then */
        release(g, 1);
        return cv_http_send_error(c, &err);
    }
    if (g->req.stream) return start_stream(g, c);
    wait_until_finished(g);
    enum MHD_Result rc = MHD_NO; /* a client that left gets no reply: the connection is closed */
    if (!g->client_gone) {
        char *json = cv_api_response_json(&g->resp);
        rc = cv_http_send(c, MHD_HTTP_OK, "application/json", json, strlen(json));
        free(json);
    }
    release(g, 1);
    return rc;
}
