/*
 * metrics.c — see metrics.h.
 *
 * Written by hand rather than through a client library: the format is a few line shapes, and the
 * values all come from one snapshot taken under the loop's stats lock, so a scrape is consistent.
 * Counters are declared by their base name and sampled with the `_total` suffix, as
 * prometheus_client (which vLLM uses) prints them; histogram buckets are cumulative.
 */
#include "server/metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"

typedef struct out {
    char *buf;
    size_t len, cap;
    char labels[512];          /* model_name="...",engine="0" */
} out;

static void emit(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(out *o, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    cv_buf_append(&o->buf, &o->len, &o->cap, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Label values escape backslash, double quote and newline. */
static void escape_label(char *dst, size_t cap, const char *s) {
    size_t j = 0;
    for (; *s && j + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') dst[j++] = '\\', dst[j++] = *s;
        else if (*s == '\n') dst[j++] = '\\', dst[j++] = 'n';
        else dst[j++] = *s;
    }
    dst[j] = '\0';
}

static void header(out *o, const char *name, const char *type, const char *help) {
    emit(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(out *o, const char *name, const char *help, double v) {
    header(o, name, "gauge", help);
    emit(o, "%s{%s} %.17g\n", name, o->labels, v);
}

static void counter(out *o, const char *name, const char *help, uint64_t v) {
    header(o, name, "counter", help);
    emit(o, "%s_total{%s} %" PRIu64 ".0\n", name, o->labels, v);
}

static void histogram(out *o, const char *name, const char *help, const cv_histogram *h) {
    header(o, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        emit(o, "%s_bucket{%s,le=\"%g\"} %" PRIu64 ".0\n", name, o->labels, h->bounds[i], cum);
    }
    cum += h->counts[h->n_bounds];
    emit(o, "%s_bucket{%s,le=\"+Inf\"} %" PRIu64 ".0\n", name, o->labels, cum);
    emit(o, "%s_count{%s} %" PRIu64 ".0\n", name, o->labels, h->count);
    emit(o, "%s_sum{%s} %.17g\n", name, o->labels, h->sum);
}

char *cv_metrics_render(const cv_engine_stats *st, const char *model_name) {
    out o = {0};
    char escaped[400];
    escape_label(escaped, sizeof escaped, model_name);
    snprintf(o.labels, sizeof o.labels, "engine=\"0\",model_name=\"%s\"", escaped);
    gauge(&o, "vllm:num_requests_running", "Number of requests in model execution batches.", st->num_running);
    gauge(&o, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", st->num_waiting);
    gauge(&o, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st->kv_cache_usage);
    header(&o, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    emit(&o, "vllm:cache_config_info{block_size=\"%d\",engine=\"0\",num_gpu_blocks=\"%" PRId64 "\"} 1.0\n",
         st->block_size, st->block_size > 0 ? st->kv_cache_tokens / st->block_size : 0);
    counter(&o, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            st->prefix_cache_queries);
    counter(&o, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", st->prefix_cache_hits);
    counter(&o, "vllm:num_preemptions", "Cumulative number of preemption from the engine.", st->num_preemptions);
    counter(&o, "vllm:prompt_tokens", "Number of prefill tokens processed.", st->prompt_tokens);
    counter(&o, "vllm:generation_tokens", "Number of generation tokens processed.", st->generation_tokens);
    header(&o, "vllm:request_success", "counter", "Count of successfully processed requests.");
    static const char *const reasons[CV_FINISHED_KINDS] = {"stop", "length", "abort", "error"};
    for (int k = 0; k < CV_FINISHED_KINDS; k++)
        emit(&o, "vllm:request_success_total{%s,finished_reason=\"%s\"} %" PRIu64 ".0\n", o.labels, reasons[k],
             st->request_success[k]);
    if (st->spec_num_positions > 0) {
        counter(&o, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", st->spec_num_drafts);
        counter(&o, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", st->spec_num_draft_tokens);
        counter(&o, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", st->spec_num_accepted_tokens);
        header(&o, "vllm:spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.");
        for (int32_t p = 0; p < st->spec_num_positions; p++)
            emit(&o, "vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %" PRIu64 ".0\n", o.labels,
                 p, st->spec_accepted_per_pos[p]);
    }
    histogram(&o, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              &st->time_to_first_token);
    histogram(&o, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              &st->inter_token_latency);
    histogram(&o, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
              &st->e2e_request_latency);
    return o.buf;
}
