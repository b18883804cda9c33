/*
 * response_store.h — the Responses API's stored responses (vLLM's VLLM_ENABLE_RESPONSES_API_STORE):
 * each finished response with store true is kept, with the chat messages it was generated from, so
 * that GET /v1/responses/{id} returns it and a later request's previous_response_id continues its
 * conversation. As in vLLM the store lives in memory and keeps everything until the server stops
 * (vLLM warns that it grows without bound; so does the server's log line at start).
 *
 * A conversation continued from response R is R's messages, then R's output as assistant turns
 * (its text, and its function calls as tool_calls; its reasoning is left out, as vLLM leaves it),
 * then the new request's input. Thread-safe.
 *
 * A background response is kept from the start with its status ("in_progress"), replaced by the
 * finished one unless it was cancelled meanwhile (vLLM keeps a cancelled response as it was then).
 * A streamed one also keeps its events, as vLLM's event store does: whoever follows them (the
 * request's own connection, then GET /v1/responses/{id}?stream=true&starting_after=N) gets those
 * after event N so far, then each as it comes, and the end of the stream when the generation ends
 * (a follower whose client left is let go at the next event).
 */
#ifndef CV_SERVER_RESPONSE_STORE_H
#define CV_SERVER_RESPONSE_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/http.h"

typedef struct cv_response_store cv_response_store;

cv_response_store *cv_response_store_new(void);
void cv_response_store_free(cv_response_store *st);

/* Keeps `response` (a response object with its "id") and the chat `messages` it answered (both
 * copied). */
void cv_response_store_put(cv_response_store *st, const json_t *response, const json_t *messages);
/* A finished background response: kept as cv_response_store_put keeps it, unless the one stored
 * under its id was cancelled. */
void cv_response_store_finish(cv_response_store *st, const json_t *response, const json_t *messages);
/* A background response that could not finish (the server stopped it, or the engine failed):
 * "failed", unless it was cancelled. */
void cv_response_store_fail(cv_response_store *st, const char *id);
/* vLLM's cancel: a stored response still "queued" or "in_progress" becomes "cancelled"; returns
 * it (a new reference) with *cancelled true. Otherwise the stored response, *cancelled false, or
 * NULL when there is none. */
json_t *cv_response_store_cancel(cv_response_store *st, const char *id, bool *cancelled);
/* A background stream's events (see the top). The generation opens its log, adds each SSE chunk it
 * makes (whole events: "event: ...\ndata: ...\n\n", numbered from 0 in order) and ends it. */
void cv_response_store_events_open(cv_response_store *st, const char *id);
void cv_response_store_events_add(cv_response_store *st, const char *id, const char *sse, size_t len);
void cv_response_store_events_end(cv_response_store *st, const char *id);
/* Streams id's events after number starting_after (-1: all) to r, a request not yet answered, and
 * the later ones as they come: r's stream is begun now and ended with the log. False (r untouched)
 * when id has no event log. */
bool cv_response_store_events_follow(cv_response_store *st, const char *id, cv_http_req *r, long starting_after);
/* The stored response object of `id` (a new reference), or NULL. */
json_t *cv_response_store_get(cv_response_store *st, const char *id);
/* The chat messages that continue the conversation of `id` (a new reference), or NULL. */
json_t *cv_response_store_history(cv_response_store *st, const char *id);

#endif
