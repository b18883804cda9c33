/*
 * metrics.h — turns the per-request results of `bench serve` into vLLM's BenchmarkMetrics
 * (vllm/benchmarks/serve.py, calculate_metrics): counts, throughputs, goodput, peak output rate and concurrency, and the
 * per-metric value arrays (seconds) whose mean/median/std/percentiles are reported in ms.
 *
 * Definitions, over successful requests only:
 *   output tokens  usage.completion_tokens, else the generated text re-tokenized with the local
 *                  tokenizer (else 1, vLLM's value without a tokenizer)
 *   TPOT           (latency − TTFT) / (output − 1), only for output > 1
 *   ITL            all gaps between output chunks of all requests, pooled
 *   goodput        requests meeting every given SLO (TPOT counts as 0 for output <= 1) / duration
 *   peak tok/s     output chunks binned into 1 s buckets from the first send
 *   peak conc.     sweep line over [start, start + latency), departures before arrivals on ties
 */
#ifndef CV_BENCH_METRICS_H
#define CV_BENCH_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/stream.h"
#include "cvllm.h"

typedef enum cv_metric_id {
    CV_METRIC_TTFT,
    CV_METRIC_TPOT,
    CV_METRIC_ITL,
    CV_METRIC_E2EL,
    CV_METRIC_QUEUE,         /* client_queue_time */
    CV_METRIC_E2EL_QUEUE,    /* e2el_including_client_queue */
    CV_METRIC_COUNT
} cv_metric_id;

typedef struct cv_metric_info {
    const char *key;         /* in --percentile-metrics and the JSON keys: "ttft" */
    const char *name;        /* in the printed lines: "TTFT" */
    const char *header;      /* the section title: "Time to First Token" */
} cv_metric_info;

extern const cv_metric_info cv_metric_infos[CV_METRIC_COUNT];
/* The metric named `key`, or -1. */
int cv_metric_find(const char *key, size_t len);

/* Service level objectives for goodput, in ms; a negative value means "not set". */
typedef struct cv_goodput_slo {
    double ttft_ms, tpot_ms, e2el_ms;
} cv_goodput_slo;

/* Parses vLLM's "ttft:100 tpot:50 e2el:1000" pairs (separated by spaces). */
int cv_goodput_parse(const char *spec, cv_goodput_slo *slo);
bool cv_goodput_any(const cv_goodput_slo *slo);

typedef struct cv_bench_metrics {
    int32_t completed, failed;
    int64_t total_input, total_output;
    double request_throughput, request_goodput, output_throughput, total_token_throughput;
    double max_output_tokens_per_s;
    int32_t max_concurrent_requests;
    int32_t *output_lens;    /* per request, 0 for a failed one */
    double *values[CV_METRIC_COUNT]; /* seconds, successful requests only */
    size_t n_values[CV_METRIC_COUNT];
} cv_bench_metrics;

/* `tok` (may be NULL) counts the output of requests whose server sent no usage. */
void cv_bench_metrics_compute(const cv_request_result *results, size_t n, double duration,
                              const cvllm_tokenizer *tok, const cv_goodput_slo *slo,
                              cv_bench_metrics *m);
void cv_bench_metrics_free(cv_bench_metrics *m);

typedef struct cv_metric_summary {
    double mean_ms, median_ms, std_ms;
    double *percentiles_ms;  /* one per requested percentile (caller's array) */
} cv_metric_summary;

/* numpy statistics of `seconds` reported in ms (each statistic × 1000, as vLLM does). */
void cv_metric_summarize(const double *seconds, size_t n, const double *pcts, size_t n_pcts,
                         cv_metric_summary *out);

#endif
