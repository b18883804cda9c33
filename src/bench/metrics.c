/*
 * metrics.c — see metrics.h. Every formula follows vLLM's calculate_metrics() line for line, down to
 * the order of operations, so that the same per-request timings give the same printed numbers.
 */
#include "bench/metrics.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bench/stats.h"

const cv_metric_info cv_metric_infos[CV_METRIC_COUNT] = {
    [CV_METRIC_TTFT] = {"ttft", "TTFT", "Time to First Token"},
    [CV_METRIC_TPOT] = {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    [CV_METRIC_ITL] = {"itl", "ITL", "Inter-token Latency"},
    [CV_METRIC_E2EL] = {"e2el", "E2EL", "End-to-end Latency"},
    [CV_METRIC_QUEUE] = {"client_queue_time", "Client Queue Time", "Client-side Queueing"},
    [CV_METRIC_E2EL_QUEUE] = {"e2el_including_client_queue", "E2EL incl. Client Queue",
                              "Queue-inclusive End-to-end Latency"},
};

int cv_metric_find(const char *key, size_t len) {
    for (int i = 0; i < CV_METRIC_COUNT; i++)
        if (strlen(cv_metric_infos[i].key) == len && !memcmp(cv_metric_infos[i].key, key, len)) return i;
    return -1;
}

int cv_goodput_parse(const char *spec, cv_goodput_slo *slo) {
    slo->ttft_ms = slo->tpot_ms = slo->e2el_ms = -1;
    const char *p = spec;
    for (;;) {
        p += strspn(p, " ");
        if (!*p) break;
        size_t len = strcspn(p, " ");
        const char *colon = memchr(p, ':', len);
        if (!colon)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "--goodput: '%.*s' is not KEY:VALUE (a metric name and milliseconds)", (int)len, p);
        char *end;
        double v = strtod(colon + 1, &end);
        if (end != p + len || end == colon + 1 || isnan(v))
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--goodput: '%.*s' does not end in a number of ms",
                           (int)len, p);
        if (v < 0)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--goodput: '%.*s': the SLO must be non-negative",
                           (int)len, p);
        size_t name_len = (size_t)(colon - p);
        if (name_len == 4 && !memcmp(p, "ttft", 4)) slo->ttft_ms = v;
        else if (name_len == 4 && !memcmp(p, "tpot", 4)) slo->tpot_ms = v;
        else if (name_len == 4 && !memcmp(p, "e2el", 4)) slo->e2el_ms = v;
        else
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "--goodput: unknown metric '%.*s' (one of ttft, tpot, e2el)", (int)name_len, p);
        p += len;
    }
    return 0;
}

bool cv_goodput_any(const cv_goodput_slo *slo) {
    return slo && (slo->ttft_ms >= 0 || slo->tpot_ms >= 0 || slo->e2el_ms >= 0);
}

typedef struct value_list {
    double *v;
    size_t n, cap;
} value_list;

static void push(value_list *l, double x) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = cv_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = x;
}

static int32_t output_len_of(const cv_request_result *r, const cvllm_tokenizer *tok) {
    if (r->output_tokens) return r->output_tokens;
    if (!tok) return 1;
    int32_t *ids = NULL;
    size_t n = 0;
    if (cvllm_tokenize(tok, r->text, r->n_text, &ids, &n) != CVLLM_OK) return 1;
    cvllm_free(ids);
    return (int32_t)n;
}

/* An SLO is met when slo_s >= the request's value (vLLM compares the same way round). */
static bool meets(double slo_ms, double value_s) { return slo_ms < 0 || slo_ms / 1000 >= value_s; }

typedef struct event {
    double t;
    int delta;
} event;

static int compare_event(const void *x, const void *y) {
    const event *a = x, *b = y;
    if (a->t != b->t) return (a->t > b->t) - (a->t < b->t);
    return a->delta - b->delta;
}

static int32_t peak_concurrency(const cv_request_result *results, size_t n) {
    event *ev = cv_xmalloc(2 * n * sizeof *ev + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!results[i].success) continue;
        ev[k++] = (event){results[i].start_time, +1};
        ev[k++] = (event){results[i].start_time + results[i].latency, -1};
    }
    qsort(ev, k, sizeof *ev, compare_event);
    int32_t cur = 0, peak = 0;
    for (size_t i = 0; i < k; i++) {
        cur += ev[i].delta;
        if (cur > peak) peak = cur;
    }
    free(ev);
    return peak;
}

static double peak_output_rate(const cv_request_result *results, size_t n) {
    double min_start = INFINITY, max_end = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!results[i].success) continue;
        if (results[i].start_time < min_start) min_start = results[i].start_time;
        if (results[i].start_time + results[i].latency > max_end) max_end = results[i].start_time + results[i].latency;
    }
    if (isinf(min_start)) return 0;
    size_t seconds = (size_t)ceil(max_end - min_start) + 1;
    double *bucket = cv_xcalloc(seconds, sizeof *bucket);
    for (size_t i = 0; i < n; i++) {
        const cv_request_result *r = &results[i];
        if (!r->success) continue;
        double t = r->start_time + r->ttft;
        for (size_t j = 0;; j++) {
            double offset = t - min_start;
            if (offset >= 0 && offset < (double)seconds) bucket[(size_t)offset] += 1;
            if (j == r->n_itl) break;
            t += r->itl[j];
        }
    }
    double peak = 0;
    for (size_t s = 0; s < seconds; s++)
        if (bucket[s] > peak) peak = bucket[s];
    free(bucket);
    return peak;
}

void cv_bench_metrics_compute(const cv_request_result *results, size_t n, double duration,
                              const cvllm_tokenizer *tok, const cv_goodput_slo *slo, cv_bench_metrics *m) {
    assert(duration > 0);
    memset(m, 0, sizeof *m);
    m->output_lens = cv_xcalloc(n ? n : 1, sizeof *m->output_lens);
    value_list lists[CV_METRIC_COUNT] = {{0}};
    int32_t good = 0;
    for (size_t i = 0; i < n; i++) {
        const cv_request_result *r = &results[i];
        if (!r->success) {
            m->failed++;
            continue;
        }
        int32_t out = output_len_of(r, tok);
        m->output_lens[i] = out;
        m->total_output += out;
        m->total_input += r->prompt_len;
        double tpot = 0;
        if (out > 1) {
            tpot = (r->latency - r->ttft) / (out - 1);
            push(&lists[CV_METRIC_TPOT], tpot);
        }
        for (size_t j = 0; j < r->n_itl; j++) push(&lists[CV_METRIC_ITL], r->itl[j]);
        push(&lists[CV_METRIC_TTFT], r->ttft);
        push(&lists[CV_METRIC_E2EL], r->latency);
        push(&lists[CV_METRIC_QUEUE], r->queue_time);
        push(&lists[CV_METRIC_E2EL_QUEUE], r->latency + r->queue_time);
        if (cv_goodput_any(slo) && meets(slo->ttft_ms, r->ttft) && meets(slo->tpot_ms, tpot) &&
            meets(slo->e2el_ms, r->latency))
            good++;
        m->completed++;
    }
    for (int k = 0; k < CV_METRIC_COUNT; k++) {
        m->values[k] = lists[k].v;
        m->n_values[k] = lists[k].n;
    }
    m->request_throughput = m->completed / duration;
    m->request_goodput = good / duration;
    m->output_throughput = (double)m->total_output / duration;
    m->total_token_throughput = (double)(m->total_input + m->total_output) / duration;
    m->max_output_tokens_per_s = peak_output_rate(results, n);
    m->max_concurrent_requests = peak_concurrency(results, n);
}

void cv_bench_metrics_free(cv_bench_metrics *m) {
    free(m->output_lens);
    for (int k = 0; k < CV_METRIC_COUNT; k++) free(m->values[k]);
    memset(m, 0, sizeof *m);
}

void cv_metric_summarize(const double *seconds, size_t n, const double *pcts, size_t n_pcts,
                         cv_metric_summary *out) {
    double *sorted = cv_xmalloc((n ? n : 1) * sizeof *sorted);
    if (n) memcpy(sorted, seconds, n * sizeof *sorted);
    cv_stats_sort(sorted, n);
    out->mean_ms = cv_stats_mean(seconds, n) * 1000;
    out->median_ms = cv_stats_median(sorted, n) * 1000;
    out->std_ms = cv_stats_std(seconds, n) * 1000;
    for (size_t k = 0; k < n_pcts; k++) out->percentiles_ms[k] = cv_stats_percentile(sorted, n, pcts[k]) * 1000;
    free(sorted);
}
