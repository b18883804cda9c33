/*
 * client.h — sends the requests of `bench serve` to an OpenAI-compatible server and times them.
 *
 * One thread drives every request through libcurl's multi interface: request i is released at
 * arrivals[i] seconds after the start, waits (FIFO) while --max-concurrency requests are in flight —
 * that wait is its client_queue_time — and is then sent, which is its start_time. Response bytes
 * are timestamped as they arrive and parsed incrementally (stream.h). Connections are kept alive
 * and reused between requests, as aiohttp does for vLLM's client.
 */
#ifndef CV_BENCH_CLIENT_H
#define CV_BENCH_CLIENT_H

#include <stddef.h>

#include "bench/stream.h"

typedef struct cv_bench_http_options {
    const char *url;             /* the full endpoint URL */
    cv_bench_api api;
    const char *const *headers;  /* extra "Name: value" lines, n_headers of them */
    size_t n_headers;
    int32_t max_concurrency;     /* 0 = unlimited */
} cv_bench_http_options;

/* Sends bodies[i] (JSON) with header "x-request-id: request_ids[i]" (when request_ids is not NULL)
 * at arrivals[i]; results[i] must be initialised (cv_request_result_init). *duration gets the wall
 * time from the start until the last request finished. Fails only when libcurl cannot be set up;
 * a request that fails is recorded in its result. */
int cv_bench_http_run(const cv_bench_http_options *o, char *const *bodies, char *const *request_ids,
                const double *arrivals, size_t n, cv_request_result *results, double *duration);

/* GET url; *body (NUL-terminated, free()) on HTTP 200. Errors name the URL. */
int cv_bench_http_get(const char *url, const char *const *headers, size_t n_headers, char **body);

#endif
