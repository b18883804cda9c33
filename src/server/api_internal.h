/*
 * api_internal.h — what the protocol files share: api_response.c folds engine events into choices
 * and frames them; api_chat_output.c turns a chat choice's text into an OpenAI message or stream
 * delta through the reasoning and tool-call parsers the request asked for.
 */
#ifndef CV_SERVER_API_INTERNAL_H
#define CV_SERVER_API_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/api.h"

/* The request body as a JSON object, or NULL with vLLM's 400 in *err. */
json_t *cv_api_parse_body(const char *body, size_t len, cv_api_error *err);
/* A chat completion request already read as JSON (the Anthropic Messages API translates into one). */
int cv_api_parse_chat_object(const json_t *root, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err);

/* A completions or chat completion reply as its JSON object (cv_api_response_json prints it; the API
 * translations read it). */
json_t *cv_api_generation_object(const cv_api_response *r);

/* The API translations of a chat stream (api_anthropic.c, api_responses.c): the chat stream's bytes
 * in *sse (whole "data: PAYLOAD\n\n" records) are replaced by what fn(user, payload) writes to the
 * translation's buffer *out for each record's chunk or error object (NULL for "[DONE]"); and the
 * events fn writes, "event: NAME\ndata: JSON\n\n" of `data` (the reference taken), appended to *buf;
 * with no NAME, the bare "data: JSON\n\n" record of the OpenAI streams. */
void cv_api_sse_translate(char **sse, size_t *len, size_t *cap, void (*fn)(void *user, const json_t *payload), void *user,
                          char **out, size_t *out_len, size_t *out_cap);
void cv_api_sse_event(char **buf, size_t *len, size_t *cap, const char *name, json_t *data);

/* Parser states of one chat choice; only streaming keeps any (non-streaming parses at the end). */
void cv_api_chat_choice_init(const cv_api_request *req, cv_api_choice *c);
void cv_api_chat_choice_free(const cv_api_request *req, cv_api_choice *c);

/* Streaming: the delta object for `len` new bytes of output (`finished`: the last ones, the
 * parsers release what they held back). It may be empty: the parsers are holding text back. */
json_t *cv_api_chat_stream_delta(const cv_api_request *req, cv_api_choice *c, const char *text, size_t len,
                                 bool finished);

/* Non-streaming: the choice's message {role, content, reasoning, tool_calls}; *n_calls = calls in it. */
json_t *cv_api_chat_message(const cv_api_request *req, const cv_api_choice *c, size_t *n_calls);

/* finish_reason of a chat choice: "tool_calls" replaces stop/length when calls were made under auto
 * or required tool choice (vLLM); NULL while unfinished. */
const char *cv_api_chat_finish_reason(const cv_api_request *req, cvllm_finish_reason f, size_t n_calls);

#endif
