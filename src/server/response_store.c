/*
 * response_store.c — stored Responses API responses (see response_store.h): one JSON object keyed by
 * response id, and a list of the background streams' event logs, under one mutex. The HTTP pushes
 * to a log's followers happen under it too, which orders them (pushes to one request must not race);
 * the HTTP layer never calls back into the store while it holds a connection's lock (a follower's
 * departure only raises its flag).
 */
#include "server/response_store.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* A request following a log. Its client may leave at any time: the HTTP layer says so (under the
 * connection's lock, so only a flag is raised) and the log ends that request at its next event. */
typedef struct follower {
    cv_http_req *r;
    atomic_bool gone;
} follower;

static void follower_gone(void *arg) { atomic_store(&((follower *)arg)->gone, true); }

/* Ends f's stream: after that the HTTP layer calls follower_gone no more, so f can go. */
static void end_follower(follower *f) {
    cv_http_stream_end(f->r);
    free(f);
}

/* A background stream's events and who follows them. */
typedef struct event_log {
    char *id;
    char **events;               /* whole SSE events, numbered by their index */
    size_t *lens;
    size_t n, cap;
    char *partial;               /* bytes of an event not yet whole */
    size_t partial_len;
    bool done;
    follower **followers;        /* streams begun, to end with the log */
    size_t n_followers, cap_followers;
    struct event_log *next;
} event_log;

struct cv_response_store {
    pthread_mutex_t mu;
    json_t *by_id; /* id → {"response": ..., "messages": [...]} */
    event_log *logs;
};

static event_log *find_log(cv_response_store *st, const char *id) {
    event_log *l = st->logs;
    while (l && strcmp(l->id, id)) l = l->next;
    return l;
}

static void free_log(event_log *l) {
    for (size_t i = 0; i < l->n; i++) free(l->events[i]);
    free(l->events);
    free(l->lens);
    free(l->partial);
    free(l->followers);
    free(l->id);
    free(l);
}

cv_response_store *cv_response_store_new(void) {
    cv_response_store *st = cv_xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->by_id = json_object();
    return st;
}

void cv_response_store_free(cv_response_store *st) {
    if (!st) return;
    while (st->logs) {
        event_log *l = st->logs;
        st->logs = l->next;
        assert(l->n_followers == 0); /* every generation ends its log before the server stops */
        free_log(l);
    }
    json_decref(st->by_id);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

void cv_response_store_put(cv_response_store *st, const json_t *response, const json_t *messages) {
    const char *id = json_string_value(json_object_get(response, "id"));
    if (!id) return;
    json_t *entry = json_pack("{s:o, s:o}", "response", json_deep_copy(response), "messages", json_deep_copy(messages));
    pthread_mutex_lock(&st->mu);
    json_object_set_new(st->by_id, id, entry);
    pthread_mutex_unlock(&st->mu);
}

/* The stored status of id, under st->mu. */
static const char *status_locked(cv_response_store *st, const char *id) {
    return json_string_value(json_object_get(json_object_get(json_object_get(st->by_id, id), "response"), "status"));
}

/* Replaces the stored response of id by a copy with `status`, under st->mu. */
static void set_status_locked(cv_response_store *st, const char *id, const char *status) {
    json_t *entry = json_object_get(st->by_id, id);
    if (!entry) return;
    json_t *response = json_deep_copy(json_object_get(entry, "response"));
    json_object_set_new(response, "status", json_string(status));
    json_t *copy = json_pack("{s:o, s:O}", "response", response, "messages", json_object_get(entry, "messages"));
    json_object_set_new(st->by_id, id, copy); /* readers may hold the old objects: they are never changed */
}

void cv_response_store_finish(cv_response_store *st, const json_t *response, const json_t *messages) {
    const char *id = json_string_value(json_object_get(response, "id"));
    if (!id) return;
    json_t *entry = json_pack("{s:o, s:o}", "response", json_deep_copy(response), "messages", json_deep_copy(messages));
    pthread_mutex_lock(&st->mu);
    const char *status = status_locked(st, id);
    if (status && !strcmp(status, "cancelled")) json_decref(entry);
    else json_object_set_new(st->by_id, id, entry);
    pthread_mutex_unlock(&st->mu);
}

void cv_response_store_fail(cv_response_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    const char *status = status_locked(st, id);
    if (status && strcmp(status, "cancelled")) set_status_locked(st, id, "failed");
    pthread_mutex_unlock(&st->mu);
}

json_t *cv_response_store_cancel(cv_response_store *st, const char *id, bool *cancelled) {
    pthread_mutex_lock(&st->mu);
    const char *status = status_locked(st, id);
    *cancelled = status && (!strcmp(status, "queued") || !strcmp(status, "in_progress"));
    if (*cancelled) set_status_locked(st, id, "cancelled");
    json_t *response = json_incref(json_object_get(json_object_get(st->by_id, id), "response"));
    pthread_mutex_unlock(&st->mu);
    return response;
}

void cv_response_store_events_open(cv_response_store *st, const char *id) {
    event_log *l = cv_xcalloc(1, sizeof *l);
    l->id = cv_xstrdup(id);
    pthread_mutex_lock(&st->mu);
    l->next = st->logs;
    st->logs = l;
    pthread_mutex_unlock(&st->mu);
}

/* Appends the whole events of partial + sse to l's list, keeping an unfinished tail. */
static void split_events(event_log *l, const char *sse, size_t len) {
    l->partial = cv_xrealloc(l->partial, l->partial_len + len + 1);
    memcpy(l->partial + l->partial_len, sse, len);
    l->partial_len += len;
    l->partial[l->partial_len] = '\0';
    size_t start = 0;
    for (const char *end; (end = strstr(l->partial + start, "\n\n"));) {
        const size_t n = (size_t)(end + 2 - (l->partial + start));
        if (l->n == l->cap) {
            l->cap = l->cap ? 2 * l->cap : 64;
            l->events = cv_xrealloc(l->events, l->cap * sizeof *l->events);
            l->lens = cv_xrealloc(l->lens, l->cap * sizeof *l->lens);
        }
        l->events[l->n] = cv_xstrndup(l->partial + start, n);
        l->lens[l->n++] = n;
        start += n;
    }
    memmove(l->partial, l->partial + start, l->partial_len - start + 1);
    l->partial_len -= start;
}

void cv_response_store_events_add(cv_response_store *st, const char *id, const char *sse, size_t len) {
    pthread_mutex_lock(&st->mu);
    event_log *l = find_log(st, id);
    if (l && !l->done) {
        const size_t first = l->n;
        split_events(l, sse, len);
        size_t kept = 0;
        for (size_t f = 0; f < l->n_followers; f++) {
            follower *fw = l->followers[f];
            if (atomic_load(&fw->gone)) {
                end_follower(fw);
                continue;
            }
            for (size_t i = first; i < l->n; i++) cv_http_stream_push(fw->r, l->events[i], l->lens[i]);
            l->followers[kept++] = fw;
        }
        l->n_followers = kept;
    }
    pthread_mutex_unlock(&st->mu);
}

void cv_response_store_events_end(cv_response_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    event_log *l = find_log(st, id);
    if (l && !l->done) {
        l->done = true;
        for (size_t f = 0; f < l->n_followers; f++) end_follower(l->followers[f]);
        l->n_followers = 0;
    }
    pthread_mutex_unlock(&st->mu);
}

bool cv_response_store_events_follow(cv_response_store *st, const char *id, cv_http_req *r, long starting_after) {
    pthread_mutex_lock(&st->mu);
    event_log *l = find_log(st, id);
    if (l) {
        cv_http_stream_begin(r, 200, "text/event-stream; charset=utf-8");
        for (size_t i = starting_after < 0 ? 0 : (size_t)starting_after + 1; i < l->n; i++)
            cv_http_stream_push(r, l->events[i], l->lens[i]);
        if (l->done) {
            cv_http_stream_end(r);
        } else {
            if (l->n_followers == l->cap_followers) {
                l->cap_followers = l->cap_followers ? 2 * l->cap_followers : 4;
                l->followers = cv_xrealloc(l->followers, l->cap_followers * sizeof *l->followers);
            }
            follower *fw = cv_xcalloc(1, sizeof *fw);
            fw->r = r;
            cv_http_on_gone(r, follower_gone, fw); /* a client gone already raises the flag now */
            l->followers[l->n_followers++] = fw;
        }
    }
    pthread_mutex_unlock(&st->mu);
    return l != NULL;
}

/* A field of id's entry, a new reference, or NULL. */
static json_t *entry_field(cv_response_store *st, const char *id, const char *field) {
    pthread_mutex_lock(&st->mu);
    json_t *v = json_object_get(json_object_get(st->by_id, id), field);
    json_incref(v); /* the entry may be replaced once the lock is let go; the objects themselves never change */
    pthread_mutex_unlock(&st->mu);
    return v;
}

json_t *cv_response_store_get(cv_response_store *st, const char *id) { return entry_field(st, id, "response"); }

json_t *cv_response_store_history(cv_response_store *st, const char *id) {
    json_t *response = entry_field(st, id, "response"), *messages = entry_field(st, id, "messages");
    if (!response || !messages) {
        json_decref(response);
        json_decref(messages);
        return NULL;
    }
    json_t *history = json_deep_copy(messages);
    json_decref(messages);
    size_t i;
    const json_t *item;
    json_t *calls = NULL;
    json_array_foreach(json_object_get(response, "output"), i, item) {
        const char *type = json_string_value(json_object_get(item, "type"));
        if (type && !strcmp(type, "message")) {
            const json_t *part = json_array_get(json_object_get(item, "content"), 0);
            json_array_append_new(history, json_pack("{s:s, s:O}", "role", "assistant", "content", json_object_get(part, "text")));
        } else if (type && !strcmp(type, "function_call")) {
            if (!calls) calls = json_array();
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", json_object_get(item, "call_id"), "type",
                                                   "function", "function", "name", json_object_get(item, "name"),
                                                   "arguments", json_object_get(item, "arguments")));
        }
    }
    if (calls) json_array_append_new(history, json_pack("{s:s, s:s, s:o}", "role", "assistant", "content", "", "tool_calls", calls));
    json_decref(response);
    return history;
}
