/*
 * stream.h — what `bench serve` measures for one streamed request: the response body goes in as it
 * arrives (any piece sizes, each with its arrival time) and comes out as vLLM's RequestFuncOutput
 * fields: TTFT, the inter-chunk gaps, end-to-end latency, the generated text and the usage the
 * server reported.
 *
 * An "output chunk" is an SSE event whose choices[0] carries non-empty text: `text` for
 * /v1/completions, `delta.content` (or a reasoning delta: `reasoning_content`, `reasoning`) for
 * /v1/chat/completions. The role-only first chunk of chat streams, empty deltas and the trailing
 * usage chunk are not output, so TTFT is the time to the first real text on every server. The
 * request's latency ends at its last output chunk (as vLLM's client measures it). A `usage` object
 * (stream_options.include_usage) gives completion_tokens and prompt_tokens; an `error` object in
 * the stream, invalid JSON, or a stream without any output chunk fails the request.
 */
#ifndef CV_BENCH_STREAM_H
#define CV_BENCH_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/sse.h"

typedef enum cv_bench_api {
    CV_API_COMPLETIONS,      /* POST /v1/completions, choices[0].text */
    CV_API_CHAT,             /* POST /v1/chat/completions, choices[0].delta.content */
    CV_API_EMBEDDINGS,       /* POST /v1/embeddings: one JSON reply, not a stream (see cv_stream_finish) */
    CV_API_RERANK,           /* POST /rerank (vLLM's vllm-rerank backend): one JSON reply too */
} cv_bench_api;

/* The pooling APIs: one JSON reply a request, nothing generated. */
static inline bool cv_bench_api_pools(cv_bench_api api) { return api >= CV_API_EMBEDDINGS; }

typedef struct cv_request_result {
    bool success;
    double start_time;       /* monotonic seconds at which the request was sent */
    double queue_time;       /* waiting for --max-concurrency before that (client_queue_time) */
    double ttft, latency;    /* seconds; valid when success */
    double *itl;             /* gaps between consecutive output chunks, seconds */
    size_t n_itl, cap_itl;
    int32_t output_tokens;   /* usage.completion_tokens; 0 when the server sent no usage */
    int32_t prompt_len;      /* the dataset's count, replaced by usage.prompt_tokens when sent */
    char *text;              /* generated text (NUL-terminated), never NULL after init */
    size_t n_text, cap_text;
    char *error;             /* why it failed; NULL on success */
} cv_request_result;

void cv_request_result_init(cv_request_result *r, int32_t prompt_len);
void cv_request_result_free(cv_request_result *r);
/* Marks the request failed with a formatted reason (the first reason wins). */
void cv_request_fail(cv_request_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct cv_stream {
    cv_bench_api api;
    cv_sse sse;
    cv_request_result *r;
    double now;              /* arrival time of the bytes being parsed */
    double last_output;      /* time of the latest output chunk */
    bool got_output;
    bool done;               /* "data: [DONE]" was seen */
    char *body;              /* a pooling API's reply so far */
    size_t n_body, cap_body;
} cv_stream;

/* r->start_time must be set before the first feed. */
void cv_stream_init(cv_stream *s, cv_bench_api api, cv_request_result *r);
void cv_stream_feed(cv_stream *s, const char *bytes, size_t len, double now);
/* End of the response body: settles success, error and latency. A pooling reply succeeds when
 * it is a JSON object without "error"; its latency (and TTFT, as vLLM's client sets both) runs to
 * its last byte, and usage.prompt_tokens is its prompt length. */
void cv_stream_finish(cv_stream *s);
void cv_stream_free(cv_stream *s);

#endif
