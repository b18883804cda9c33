/*
 * metrics.h — /metrics in Prometheus' text exposition format (version 0.0.4), as vLLM's server
 * exposes it through prometheus_client: the process_* families of its default registry, the vllm:*
 * families (labels model_name and engine) from a cv_engine_stats snapshot per engine, and the http_*
 * families of prometheus-fastapi-instrumentator's default instrumentation.
 */
#ifndef CV_SERVER_METRICS_H
#define CV_SERVER_METRICS_H

#include "engine/engine_loop.h"

/* HTTP requests by handler, method and status class, and their durations (thread-safe). */
typedef struct cv_http_metrics cv_http_metrics;

cv_http_metrics *cv_http_metrics_create(void);
void cv_http_metrics_free(cv_http_metrics *m);

/* The handler label of a request for `path` whose route is `route_path` (NULL: no route matches,
 * "none"), or NULL when the instrumentator vLLM configures would not record it: its excluded
 * handlers (/metrics, /health, /load, /ping, /version, /server_info) match anywhere in the route,
 * or in the raw path of an unrouted request. */
const char *cv_http_metrics_handler(const char *route_path, const char *path);

/* Records one finished request. `status` is the HTTP status sent, 0 when none was (it counts as
 * 500, as in the instrumentator, which sees the handler fail); `seconds` runs from the request's
 * arrival to its last byte. `handler` must be a string that outlives m (a route path or "none"). */
void cv_http_metrics_observe(cv_http_metrics *m, const char *handler, const char *method, unsigned status,
                             double seconds);

/* The whole exposition (free()): st[i] is data-parallel engine i's snapshot (its series labelled
 * engine="i"), n_engines >= 1. `model_name` is the first served model name; lora_names[i] names the
 * adapter in slot i of cv_engine_stats.lora_state (n_loras slots; NULL: none), for
 * vllm:lora_requests_info. */
char *cv_metrics_render(const cv_engine_stats *st, size_t n_engines, const char *model_name,
                        const char *const *lora_names, size_t n_loras, cv_http_metrics *http);

#endif
