/*
 * serve_report.c — `bench serve` output in vLLM's exact shape, so that scripts written for
 * `vllm bench serve` read ours unchanged.
 *
 * The printed block reproduces Python's "{:<40} {:<10}" / "{:<10.2f}" columns (trailing padding
 * included) and "{:=^50}" / "{:-^50}" centred titles. The JSON keeps vLLM's key order (jansson
 * preserves insertion order) and its one-line json.dump layout; the per-request arrays other than
 * `latencies` and `queue_times` appear only with --save-detailed, as in vLLM.
 */
#include "bench/serve.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/error.h"
#include "bench/stats.h"

/* Python's format(s, f"{fill}^{width}"): the extra fill goes to the right. */
static void print_title(const char *s, char fill, int width) {
    int len = (int)strlen(s), pad = width > len ? width - len : 0;
    for (int i = 0; i < pad / 2; i++) putchar(fill);
    fputs(s, stdout);
    for (int i = 0; i < pad - pad / 2; i++) putchar(fill);
    putchar('\n');
}

static void row_int(const char *label, long long v) { printf("%-40s %-10lld\n", label, v); }
static void row_f2(const char *label, double v) { printf("%-40s %-10.2f\n", label, v); }

/* "99" for 99.0, "99.9" otherwise (vLLM's p_word). */
static void percentile_word(double p, char *buf, size_t size) {
    if (p == floor(p)) snprintf(buf, size, "%lld", (long long)p);
    else cv_stats_py_float(p, buf, size);
}

/* The metrics vLLM reports for this run, in its order: the queue metrics exist only with
 * --max-concurrency, and the queue-inclusive latency only with a finite rate as well. */
static bool metric_reported(const serve_config *c, int k) {
    if (!c->metric_selected[k]) return false;
    if (k == CV_METRIC_QUEUE) return c->max_concurrency > 0;
    if (k == CV_METRIC_E2EL_QUEUE) return c->max_concurrency > 0 && !isinf(c->request_rate);
    return true;
}

static void print_failures(const cv_request_result *r, size_t n) {
    size_t shown = 0;
    for (size_t i = 0; i < n && shown < 10; i++) {
        if (r[i].success) continue;
        if (!shown) puts("Failed requests during benchmark run detected (capping to 10):");
        printf("Error %zu: %s\n", shown++, r[i].error ? r[i].error : "");
    }
}

void serve_print_report(const serve_config *c, const cv_bench_metrics *m, const cv_request_result *r, size_t n,
                        double duration, const cv_spec_stats *spec) {
    const bool generation = !cv_bench_api_pools(c->api); /* vLLM's pooling task prints no output rows */
    print_failures(r, n);
    print_title(" Serving Benchmark Result ", '=', 50);
    row_int("Successful requests:", m->completed);
    row_int("Failed requests:", m->failed);
    if (c->max_concurrency > 0) row_int("Maximum request concurrency:", c->max_concurrency);
    if (!isinf(c->request_rate)) row_f2("Request rate configured (RPS):", c->request_rate);
    row_f2("Benchmark duration (s):", duration);
    row_int("Total input tokens:", m->total_input);
    if (generation) row_int("Total generated tokens:", m->total_output);
    row_f2("Request throughput (req/s):", m->request_throughput);
    if (cv_goodput_any(&c->slo)) row_f2("Request goodput (req/s):", m->request_goodput);
    if (generation) {
        row_f2("Output token throughput (tok/s):", m->output_throughput);
        row_f2("Peak output token throughput (tok/s):", m->max_output_tokens_per_s);
        row_f2("Peak concurrent requests:", m->max_concurrent_requests);
    }
    row_f2("Total token throughput (tok/s):", m->total_token_throughput);
    double *pct = cv_xmalloc((c->n_percentiles + 1) * sizeof *pct);
    for (int k = 0; k < CV_METRIC_COUNT; k++) {
        if (!metric_reported(c, k)) continue;
        const cv_metric_info *info = &cv_metric_infos[k];
        cv_metric_summary s = {.percentiles_ms = pct};
        cv_metric_summarize(m->values[k], m->n_values[k], c->percentiles, c->n_percentiles, &s);
        print_title(info->header, '-', 50);
        char label[96], word[32];
        snprintf(label, sizeof label, "Mean %s (ms):", info->name);
        row_f2(label, s.mean_ms);
        snprintf(label, sizeof label, "Median %s (ms):", info->name);
        row_f2(label, s.median_ms);
        for (size_t p = 0; p < c->n_percentiles; p++) {
            percentile_word(c->percentiles[p], word, sizeof word);
            snprintf(label, sizeof label, "P%s %s (ms):", word, info->name);
            row_f2(label, pct[p]);
        }
    }
    free(pct);
    if (spec) cv_spec_stats_print(spec);
    print_title("", '=', 50);
    fflush(stdout);
}

/* vLLM writes float("inf") settings as the string "inf" (JSON has no infinity). */
static json_t *rate_json(double v) { return isinf(v) ? json_string("inf") : json_real(v); }

static json_t *per_request_array(const cv_request_result *r, size_t n, const cv_bench_metrics *m, const char *key) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *v;
        if (!strcmp(key, "input_lens")) v = json_integer(r[i].prompt_len);
        else if (!strcmp(key, "output_lens")) v = json_integer(m->output_lens[i]);
        else if (!strcmp(key, "ttfts")) v = json_real(r[i].success ? r[i].ttft : 0.0);
        else if (!strcmp(key, "latencies")) v = json_real(r[i].success ? r[i].latency : 0.0);
        else if (!strcmp(key, "start_times")) v = json_real(r[i].start_time);
        else if (!strcmp(key, "queue_times")) v = json_real(r[i].queue_time);
        else if (!strcmp(key, "generated_texts")) v = json_stringn_nocheck(r[i].text, r[i].n_text);
        else if (!strcmp(key, "errors")) v = json_string(r[i].error ? r[i].error : "");
        else {
            v = json_array();
            for (size_t j = 0; j < r[i].n_itl; j++) json_array_append_new(v, json_real(r[i].itl[j]));
        }
        json_array_append_new(a, v ? v : json_string(""));
    }
    return a;
}

static void add_run_settings(json_t *o, const serve_config *c) {
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime(&now));
    json_object_set_new(o, "date", json_string(date));
    json_object_set_new(o, "endpoint_type", json_string(c->backend));
    json_object_set_new(o, "backend", json_string(c->backend));
    json_object_set_new(o, "label", c->label ? json_string(c->label) : json_null());
    json_object_set_new(o, "model_id", json_string(c->model_id));
    json_object_set_new(o, "tokenizer_id", json_string(c->tokenizer_id));
    json_object_set_new(o, "num_prompts", json_integer(c->num_prompts));
    for (size_t i = 0; i < c->n_metadata; i++) {
        const char *eq = strchr(c->metadata[i], '=');
        char *key = cv_xstrndup(c->metadata[i], (size_t)(eq - c->metadata[i]));
        json_object_set_new(o, key, json_string(eq + 1));
        free(key);
    }
    json_object_set_new(o, "request_rate", rate_json(c->request_rate));
    json_object_set_new(o, "burstiness", rate_json(c->burstiness));
    json_object_set_new(o, "max_concurrency", c->max_concurrency ? json_integer(c->max_concurrency) : json_null());
    if (c->ramp_up_strategy) {
        json_object_set_new(o, "ramp_up_strategy", json_string(c->ramp_up_strategy));
        json_object_set_new(o, "ramp_up_start_rps", json_integer(c->ramp_up_start_rps));
        json_object_set_new(o, "ramp_up_end_rps", json_integer(c->ramp_up_end_rps));
    }
}

static void add_percentiles(json_t *o, const serve_config *c, const cv_bench_metrics *m);

json_t *serve_result_json(const serve_config *c, const cv_bench_metrics *m, const cv_request_result *r, size_t n,
                          double duration, const cv_spec_stats *spec, json_t *rps_change_events) {
    json_t *o = json_object();
    add_run_settings(o, c);
    json_object_set_new(o, "duration", json_real(duration));
    json_object_set_new(o, "completed", json_integer(m->completed));
    if (cv_bench_api_pools(c->api)) { /* vLLM's result of a pooling run */
        json_object_set_new(o, "total_input_tokens", json_integer(m->total_input));
        json_object_set_new(o, "request_throughput", json_real(m->request_throughput));
        json_object_set_new(o, "total_token_throughput", json_real(m->total_token_throughput));
        json_object_set_new(o, "input_lens", per_request_array(r, n, m, "input_lens"));
        json_object_set_new(o, "errors", per_request_array(r, n, m, "errors"));
        if (rps_change_events) json_object_set_new(o, "rps_change_events", rps_change_events);
        add_percentiles(o, c, m);
        return o;
    }
    json_object_set_new(o, "failed", json_integer(m->failed));
    json_object_set_new(o, "total_input_tokens", json_integer(m->total_input));
    json_object_set_new(o, "total_output_tokens", json_integer(m->total_output));
    json_object_set_new(o, "request_throughput", json_real(m->request_throughput));
    json_object_set_new(o, "request_goodput", cv_goodput_any(&c->slo) ? json_real(m->request_goodput) : json_null());
    json_object_set_new(o, "output_throughput", json_real(m->output_throughput));
    json_object_set_new(o, "total_token_throughput", json_real(m->total_token_throughput));
    static const char *arrays[] = {"input_lens", "output_lens", "ttfts", "itls", "latencies",
                                   "start_times", "queue_times", "generated_texts", "errors"};
    for (size_t k = 0; k < CV_ARRAY_LEN(arrays); k++) {
        bool always = !strcmp(arrays[k], "latencies") || !strcmp(arrays[k], "queue_times");
        if (always || c->save_detailed) json_object_set_new(o, arrays[k], per_request_array(r, n, m, arrays[k]));
    }
    json_object_set_new(o, "max_output_tokens_per_s", json_real(m->max_output_tokens_per_s));
    json_object_set_new(o, "max_concurrent_requests", json_integer(m->max_concurrent_requests));
    json_object_set_new(o, "rtfx", json_real(0.0));
    if (rps_change_events) json_object_set_new(o, "rps_change_events", rps_change_events);
    if (spec) cv_spec_stats_json(spec, o);
    add_percentiles(o, c, m);
    return o;
}

/* mean/median/std and the percentiles of each reported metric, as vLLM adds them to its result. */
static void add_percentiles(json_t *o, const serve_config *c, const cv_bench_metrics *m) {
    double *pct = cv_xmalloc((c->n_percentiles + 1) * sizeof *pct);
    for (int k = 0; k < CV_METRIC_COUNT; k++) {
        if (!metric_reported(c, k)) continue;
        const char *key = cv_metric_infos[k].key;
        cv_metric_summary s = {.percentiles_ms = pct};
        cv_metric_summarize(m->values[k], m->n_values[k], c->percentiles, c->n_percentiles, &s);
        char name[96], word[32];
        snprintf(name, sizeof name, "mean_%s_ms", key);
        json_object_set_new(o, name, json_real(s.mean_ms));
        snprintf(name, sizeof name, "median_%s_ms", key);
        json_object_set_new(o, name, json_real(s.median_ms));
        snprintf(name, sizeof name, "std_%s_ms", key);
        json_object_set_new(o, name, json_real(s.std_ms));
        for (size_t p = 0; p < c->n_percentiles; p++) {
            percentile_word(c->percentiles[p], word, sizeof word);
            snprintf(name, sizeof name, "p%s_%s_ms", word, key);
            json_object_set_new(o, name, json_real(pct[p]));
        }
    }
    free(pct);
}

/* mkdir -p */
static int make_dirs(const char *path) {
    char *p = cv_xstrdup(path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s == '/' || end) {
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                rc = cv_fail(CVLLM_ERR_IO, "cannot create the result folder %s: %s", p, strerror(errno));
                break;
            }
            if (end) break;
            *s = '/';
        }
    }
    free(p);
    return rc;
}

static char *default_file_name(const serve_config *c) {
    char rate[32], date[32];
    cv_stats_py_float(c->request_rate, rate, sizeof rate);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime(&now));
    const char *base_model = strrchr(c->model_id, '/') ? strrchr(c->model_id, '/') + 1 : c->model_id;
    char conc[32] = "";
    if (c->max_concurrency) snprintf(conc, sizeof conc, "-concurrency%d", c->max_concurrency);
    const char *label = c->label ? c->label : c->backend;
    if (c->ramp_up_strategy)
        return cv_xasprintf("%s-ramp-up-%s-%lldqps-%lldqps%s-%s-%s.json", label, c->ramp_up_strategy,
                            (long long)c->ramp_up_start_rps, (long long)c->ramp_up_end_rps, conc, base_model, date);
    return cv_xasprintf("%s-%sqps%s-%s-%s.json", label, rate, conc, base_model, date);
}

int serve_save_result(const serve_config *c, json_t *result) {
    char *name = c->result_filename ? cv_xstrdup(c->result_filename) : default_file_name(c);
    if (c->result_dir) {
        int rc = make_dirs(c->result_dir);
        if (rc) {
            free(name);
            return rc;
        }
        char *joined = cv_xasprintf("%s/%s", c->result_dir, name);
        free(name);
        name = joined;
    }
    FILE *f = fopen(name, c->append_result ? "a+" : "w");
    int rc = 0;
    if (!f) {
        rc = cv_fail(CVLLM_ERR_IO, "cannot write %s: %s", name, strerror(errno));
    } else {
        fseek(f, 0, SEEK_END);
        if (c->append_result && ftell(f) > 0) fputc('\n', f);
        int failed = json_dumpf(result, f, JSON_ENSURE_ASCII) != 0;
        if (fclose(f) != 0 || failed) rc = cv_fail(CVLLM_ERR_IO, "cannot write %s", name);
    }
    free(name);
    return rc;
}
