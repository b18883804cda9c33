/*
 * serve.h — the configuration of one `cvllm bench serve` run, shared by its argument parser and
 * driver (serve.c) and its report (serve_report.c): vLLM's printed result block and result JSON.
 */
#ifndef CV_BENCH_SERVE_H
#define CV_BENCH_SERVE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "bench/metrics.h"
#include "bench/spec_stats.h"
#include "bench/stream.h"

typedef struct serve_config {
    const char *backend;               /* "openai" (also "vllm", "openai-chat") */
    const char *label;                 /* NULL = backend */
    char *model_id, *model_name;       /* --model / --served-model-name or from /v1/models */
    const char *tokenizer_id;
    cv_bench_api api;
    int32_t num_prompts;
    double request_rate, burstiness;   /* may be INFINITY */
    const char *ramp_up_strategy;      /* "linear", "exponential" or NULL */
    int64_t ramp_up_start_rps, ramp_up_end_rps;
    int32_t max_concurrency;           /* 0 = none */
    bool metric_selected[CV_METRIC_COUNT];
    double *percentiles;               /* --metric-percentiles */
    size_t n_percentiles;
    cv_goodput_slo slo;
    bool save_result, save_detailed, append_result;
    const char *result_dir, *result_filename;
    const char **metadata;             /* "KEY=VALUE" */
    size_t n_metadata;
} serve_config;

/* Prints the failure list and vLLM's "Serving Benchmark Result" block to stdout; `spec` (NULL: none)
 * adds the speculative-decoding section. */
void serve_print_report(const serve_config *c, const cv_bench_metrics *m, const cv_request_result *r,
                        size_t n, double duration, const cv_spec_stats *spec);
/* vLLM's result JSON (the run's settings first, then the benchmark results); `rps_change_events`
 * (a ramp-up's, or NULL) is taken over. */
json_t *serve_result_json(const serve_config *c, const cv_bench_metrics *m, const cv_request_result *r,
                          size_t n, double duration, const cv_spec_stats *spec, json_t *rps_change_events);
/* Writes the JSON where --result-dir/--result-filename (or vLLM's default name) say, appending
 * with --append-result. Returns 0 or a cv_fail code. */
int serve_save_result(const serve_config *c, json_t *result);

#endif
