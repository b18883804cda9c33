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
 */
#ifndef CV_SERVER_RESPONSE_STORE_H
#define CV_SERVER_RESPONSE_STORE_H

#include <jansson.h>
#include <stdbool.h>

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
/* The stored response object of `id` (a new reference), or NULL. */
json_t *cv_response_store_get(cv_response_store *st, const char *id);
/* The chat messages that continue the conversation of `id` (a new reference), or NULL. */
json_t *cv_response_store_history(cv_response_store *st, const char *id);

#endif
