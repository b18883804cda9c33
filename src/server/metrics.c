/*
 * metrics.c — see metrics.h.
 *
 * Written by hand rather than through a client library: the format is a few line shapes, and each
 * engine's values come from one snapshot taken under its loop's stats lock, so a scrape is
 * consistent per engine. Under data parallelism every vllm:* family appears once, with one series
 * per engine (engine="0", "1", ...), as prometheus_client groups a labelled family. The text follows
 * prometheus_client's generate_latest, which vLLM serves: a counter's HELP and TYPE lines name it
 * with its `_total` suffix, labels are sorted by name (so `le` sits between `engine` and
 * `model_name`), histogram buckets are cumulative, and numbers are printed as its floatToGoString
 * does (Python's shortest repr, exponent form from 1e+06 up: 3.0, 0.25, 1e+06).
 * Not exposed: the python_* families (there is no Python here), the `_created` series, and the
 * instrumentator's request/response size summaries.
 */
#include "server/metrics.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timeutil.h"
#include "base/utf8.h"

/* ------------------------------------------------------------------------------------------------ */
/* Text                                                                                              */

typedef struct out {
    char *buf;
    size_t len, cap;
} out;

static void emit(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(out *o, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    cv_buf_append(&o->buf, &o->len, &o->cap, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* prometheus_client's floatToGoString: Python's repr of the float (shortest digits that read back
 * exactly; fixed notation for exponents -4..15, else d.ddde±XX), then, for positive numbers with
 * more than six digits before the point, Go's exponent form (1234567.0 -> 1.234567e+06). */
typedef struct num {
    char s[40];
} num;

static num fmt_num(double d) {
    num r;
    if (isnan(d)) return snprintf(r.s, sizeof r.s, "NaN"), r;
    if (isinf(d)) return snprintf(r.s, sizeof r.s, d > 0 ? "+Inf" : "-Inf"), r;
    char sci[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec, d);
        if (strtod(sci, NULL) == d) break;
    }
    /* sci = [-]D[.DDD]e±XX: gather the digits and the decimal exponent. */
    char digits[24];
    size_t nd = 0;
    const char *p = sci + (sci[0] == '-');
    for (; *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = '\0';
    char *w = r.s;
    if (d < 0) *w++ = '-';
    if (exp10 < -4 || exp10 >= 16) {
        *w++ = digits[0];
        if (nd > 1) w += sprintf(w, ".%s", digits + 1);
        sprintf(w, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        return r;
    }
    if (exp10 < 0) {
        w += sprintf(w, "0.");
        for (int i = -1; i > exp10; i--) *w++ = '0';
        sprintf(w, "%s", digits);
        return r;
    }
    size_t int_digits = (size_t)exp10 + 1;
    for (size_t i = 0; i < int_digits; i++) *w++ = i < nd ? digits[i] : '0';
    sprintf(w, ".%s", nd > int_digits ? digits + int_digits : "0");
    if (d > 0 && int_digits > 6) { /* Go switches to exponents sooner than Python */
        char mant[40];
        size_t m = 0;
        mant[m++] = r.s[0];
        mant[m++] = '.';
        for (const char *q = r.s + 1; *q; q++)
            if (*q != '.') mant[m++] = *q;
        while (m > 0 && (mant[m - 1] == '0' || mant[m - 1] == '.')) m--;
        mant[m] = '\0';
        snprintf(r.s, sizeof r.s, "%.24se+0%zu", mant, int_digits - 1);
    }
    return r;
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

/* One sample; `labels` is the inside of the braces, empty for none. */
static void sample(out *o, const char *name, const char *labels, double v) {
    if (*labels) emit(o, "%s{%s} %s\n", name, labels, fmt_num(v).s);
    else emit(o, "%s %s\n", name, fmt_num(v).s);
}

static void gauge(out *o, const char *name, const char *help, const char *labels, double v) {
    header(o, name, "gauge", help);
    sample(o, name, labels, v);
}

/* `name` includes the `_total` suffix. */
static void counter(out *o, const char *name, const char *help, const char *labels, double v) {
    header(o, name, "counter", help);
    sample(o, name, labels, v);
}

/* The series of one histogram; `before` and `after` are the labels that sort before and after
 * `le` (either may be empty). */
static void histogram_series(out *o, const char *name, const char *before, const char *after, const cv_histogram *h) {
    const char *sep1 = *before ? "," : "", *sep2 = *after ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->n_bounds; i++) {
        cum += h->counts[i];
        num le = i < h->n_bounds ? fmt_num(h->bounds[i]) : fmt_num(INFINITY);
        emit(o, "%s_bucket{%s%sle=\"%s\"%s%s} %s\n", name, before, sep1, le.s, sep2, after, fmt_num((double)cum).s);
    }
    char labels[1024];
    snprintf(labels, sizeof labels, "%s%s%s", before, *before && *after ? "," : "", after);
    char series[256];
    snprintf(series, sizeof series, "%s_count", name);
    sample(o, series, labels, (double)h->count);
    snprintf(series, sizeof series, "%s_sum", name);
    sample(o, series, labels, h->sum);
}

/* ------------------------------------------------------------------------------------------------ */
/* process_*: prometheus_client's ProcessCollector, from /proc                                      */

static double boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    char line[256];
    double btime = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "btime ", 6)) btime = strtod(line + 6, NULL);
    fclose(f);
    return btime;
}

static int count_open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void process_metrics(out *o) {
    double btime = boot_time();
    if (btime == 0) return; /* no /proc: prometheus_client collects nothing either */
    FILE *f = fopen("/proc/self/stat", "r");
    char stat[1024] = "";
    size_t n = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
    if (f) fclose(f);
    stat[n] = '\0';
    /* Fields after the command name (which may hold spaces and parentheses): state is [0]. */
    char *p = strrchr(stat, ')');
    double field[22] = {0};
    int k = 0;
    for (char *tok = p ? strtok(p + 1, " ") : NULL; tok && k < 22; tok = strtok(NULL, " ")) field[k++] = strtod(tok, NULL);
    if (k == 22) {
        double ticks = (double)sysconf(_SC_CLK_TCK), page = (double)sysconf(_SC_PAGESIZE);
        gauge(o, "process_virtual_memory_bytes", "Virtual memory size in bytes.", "", field[20]);
        gauge(o, "process_resident_memory_bytes", "Resident memory size in bytes.", "", field[21] * page);
        gauge(o, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "",
              field[19] / ticks + btime);
        counter(o, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "",
                (field[11] + field[12]) / ticks);
    }
    int fds = count_open_fds();
    struct rlimit lim;
    if (fds >= 0 && getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        gauge(o, "process_open_fds", "Number of open file descriptors.", "", fds);
        gauge(o, "process_max_fds", "Maximum number of open file descriptors.", "",
              lim.rlim_cur == RLIM_INFINITY ? INFINITY : (double)lim.rlim_cur);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* vllm:*                                                                                            */

/* The labels of one engine's series: all of them, and those that sort before and after a series'
 * own label (le, finished_reason). */
typedef struct engine_labels {
    char all[512], before[32], after[480];
} engine_labels;

typedef enum field_kind { FIELD_I32, FIELD_U64, FIELD_F64 } field_kind;

typedef struct scalar_family {
    const char *name, *type, *help; /* a counter's name includes `_total` */
    size_t offset;                  /* in cv_engine_stats */
    field_kind kind;
} scalar_family;

static double field(const cv_engine_stats *st, const scalar_family *f) {
    const char *p = (const char *)st + f->offset;
    return f->kind == FIELD_I32   ? *(const int32_t *)p
           : f->kind == FIELD_U64 ? (double)*(const uint64_t *)p
                                  : *(const double *)p;
}

/* Each family once, with one sample per engine, as prometheus_client groups a labelled family. */
static void scalar_families(out *o, const scalar_family *f, size_t n_families, const cv_engine_stats *st,
                            const engine_labels *l, size_t n) {
    for (size_t k = 0; k < n_families; k++) {
        header(o, f[k].name, f[k].type, f[k].help);
        for (size_t i = 0; i < n; i++) sample(o, f[k].name, l[i].all, field(&st[i], &f[k]));
    }
}

#define STAT(member) offsetof(cv_engine_stats, member)

static const scalar_family gauges[] = {
    {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", STAT(num_running), FIELD_I32},
    {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", STAT(num_waiting), FIELD_I32},
    {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", STAT(kv_cache_usage), FIELD_F64},
};

static const scalar_family counters[] = {
    {"vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
     STAT(prefix_cache_queries), FIELD_U64},
    {"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
     STAT(prefix_cache_hits), FIELD_U64},
    {"vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", STAT(num_preemptions),
     FIELD_U64},
    {"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", STAT(prompt_tokens), FIELD_U64},
    {"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", STAT(generation_tokens),
     FIELD_U64},
};

static const scalar_family spec_counters[] = {
    {"vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", STAT(spec_num_drafts), FIELD_U64},
    {"vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", STAT(spec_num_draft_tokens),
     FIELD_U64},
    {"vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
     STAT(spec_num_accepted_tokens), FIELD_U64},
};

/* vLLM's order and HELP texts (vllm/v1/metrics/loggers.py). */
static const struct {
    const char *name, *help;
    size_t offset;
} histograms[] = {
    {"vllm:request_prompt_tokens", "Number of prefill tokens processed.", STAT(request_prompt_tokens)},
    {"vllm:request_generation_tokens", "Number of generation tokens processed.", STAT(request_generation_tokens)},
    {"vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", STAT(iteration_tokens)},
    {"vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     STAT(request_max_num_generation_tokens)},
    {"vllm:request_params_n", "Histogram of the n request parameter.", STAT(request_params_n)},
    {"vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", STAT(request_params_max_tokens)},
    {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", STAT(time_to_first_token)},
    {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", STAT(inter_token_latency)},
    {"vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     STAT(request_time_per_output_token)},
    {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", STAT(e2e_request_latency)},
    {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     STAT(request_queue_time)},
    {"vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     STAT(request_inference_time)},
    {"vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     STAT(request_prefill_time)},
    {"vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     STAT(request_decode_time)},
};

/* Engine i's series carry engine="i", as vLLM labels each data-parallel engine (engine="0" alone). */
static void vllm_metrics(out *o, const cv_engine_stats *st, size_t n, const char *model_name) {
    char model[400];
    escape_label(model, sizeof model, model_name);
    engine_labels *l = cv_xmalloc(n * sizeof *l);
    for (size_t i = 0; i < n; i++) {
        snprintf(l[i].before, sizeof l[i].before, "engine=\"%zu\"", i);
        snprintf(l[i].after, sizeof l[i].after, "model_name=\"%s\"", model);
        snprintf(l[i].all, sizeof l[i].all, "%s,%s", l[i].before, l[i].after);
    }
    scalar_families(o, gauges, CV_ARRAY_LEN(gauges), st, l, n);
    header(o, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    for (size_t i = 0; i < n; i++)
        emit(o, "vllm:cache_config_info{block_size=\"%d\",%s,num_gpu_blocks=\"%" PRId64 "\"} 1.0\n", st[i].block_size,
             l[i].before, st[i].block_size > 0 ? st[i].kv_cache_tokens / st[i].block_size : 0);
    scalar_families(o, counters, CV_ARRAY_LEN(counters), st, l, n);
    header(o, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
    static const char *const reasons[CV_FINISHED_KINDS] = {"stop", "length", "abort", "error"};
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < CV_FINISHED_KINDS; k++) {
            char labels[600];
            snprintf(labels, sizeof labels, "%s,finished_reason=\"%s\",%s", l[i].before, reasons[k], l[i].after);
            sample(o, "vllm:request_success_total", labels, (double)st[i].request_success[k]);
        }
    if (st[0].spec_num_positions > 0) { /* the replicas share one speculative config */
        scalar_families(o, spec_counters, CV_ARRAY_LEN(spec_counters), st, l, n);
        header(o, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
        for (size_t i = 0; i < n; i++)
            for (int32_t p = 0; p < st[i].spec_num_positions; p++) {
                char labels[600];
                snprintf(labels, sizeof labels, "%s,position=\"%d\"", l[i].all, p);
                sample(o, "vllm:spec_decode_num_accepted_tokens_per_pos_total", labels,
                       (double)st[i].spec_accepted_per_pos[p]);
            }
    }
    for (size_t h = 0; h < CV_ARRAY_LEN(histograms); h++) {
        header(o, histograms[h].name, "histogram", histograms[h].help);
        for (size_t i = 0; i < n; i++)
            histogram_series(o, histograms[h].name, l[i].before, l[i].after,
                             (const cv_histogram *)((const char *)&st[i] + histograms[h].offset));
    }
    free(l);
}

/* ------------------------------------------------------------------------------------------------ */
/* http_*: prometheus-fastapi-instrumentator's default instrumentation                              */

/* Its default buckets: many for the unlabelled histogram, few for the one labelled by handler. */
static const double highr_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2,
                                       2.5,  3,     3.5,  4,     4.5, 5,    7.5, 10,   30, 60};
static const double lowr_buckets[] = {0.1, 0.5, 1};

typedef struct http_count {
    const char *handler;
    char method[16];
    char status[4];           /* "2xx" */
    uint64_t n;
} http_count;

typedef struct http_latency {
    const char *handler;
    char method[16];
    cv_histogram h;
} http_latency;

struct cv_http_metrics {
    pthread_mutex_t mu;
    http_count *counts;       /* in the order the series appeared, as prometheus_client keeps them */
    size_t n_counts, cap_counts;
    http_latency *latencies;
    size_t n_latencies, cap_latencies;
    cv_histogram highr;
};

cv_http_metrics *cv_http_metrics_create(void) {
    cv_http_metrics *m = cv_xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    cv_histogram_init(&m->highr, highr_buckets, CV_ARRAY_LEN(highr_buckets));
    return m;
}

void cv_http_metrics_free(cv_http_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->counts);
    free(m->latencies);
    free(m);
}

const char *cv_http_metrics_handler(const char *route_path, const char *path) {
    static const char *const excluded[] = {"/metrics", "/health", "/load", "/ping", "/version", "/server_info"};
    const char *seen = route_path ? route_path : path;
    for (size_t i = 0; i < CV_ARRAY_LEN(excluded); i++)
        if (strstr(seen, excluded[i])) return NULL;
    return route_path ? route_path : "none";
}

void cv_http_metrics_observe(cv_http_metrics *m, const char *handler, const char *method, unsigned status,
                             double seconds) {
    char meth[16], cls[4];
    snprintf(meth, sizeof meth, "%s", method);
    snprintf(cls, sizeof cls, "%uxx", (status ? status : 500) / 100 % 10);
    pthread_mutex_lock(&m->mu);
    size_t i = 0;
    while (i < m->n_counts && !(m->counts[i].handler == handler && !strcmp(m->counts[i].method, meth) &&
                                !strcmp(m->counts[i].status, cls)))
        i++;
    if (i == m->n_counts) {
        if (m->n_counts == m->cap_counts) {
            m->cap_counts = m->cap_counts ? 2 * m->cap_counts : 16;
            m->counts = cv_xrealloc(m->counts, m->cap_counts * sizeof *m->counts);
        }
        http_count *c = &m->counts[m->n_counts++];
        *c = (http_count){.handler = handler};
        memcpy(c->method, meth, sizeof meth);
        memcpy(c->status, cls, sizeof cls);
    }
    m->counts[i].n++;
    size_t j = 0;
    while (j < m->n_latencies && !(m->latencies[j].handler == handler && !strcmp(m->latencies[j].method, meth))) j++;
    if (j == m->n_latencies) {
        if (m->n_latencies == m->cap_latencies) {
            m->cap_latencies = m->cap_latencies ? 2 * m->cap_latencies : 16;
            m->latencies = cv_xrealloc(m->latencies, m->cap_latencies * sizeof *m->latencies);
        }
        http_latency *l = &m->latencies[m->n_latencies++];
        l->handler = handler;
        memcpy(l->method, meth, sizeof meth);
        cv_histogram_init(&l->h, lowr_buckets, CV_ARRAY_LEN(lowr_buckets));
    }
    cv_histogram_observe(&m->latencies[j].h, seconds);
    cv_histogram_observe(&m->highr, seconds);
    pthread_mutex_unlock(&m->mu);
}

static void http_metrics(out *o, cv_http_metrics *m) {
    pthread_mutex_lock(&m->mu);
    header(o, "http_requests_total", "counter", "Total number of requests by method, status and handler.");
    for (size_t i = 0; i < m->n_counts; i++) {
        char handler[300], method[40], labels[400];
        escape_label(handler, sizeof handler, m->counts[i].handler);
        escape_label(method, sizeof method, m->counts[i].method);
        snprintf(labels, sizeof labels, "handler=\"%s\",method=\"%s\",status=\"%s\"", handler, method,
                 m->counts[i].status);
        sample(o, "http_requests_total", labels, (double)m->counts[i].n);
    }
    header(o, "http_request_duration_highr_seconds", "histogram",
           "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ");
    histogram_series(o, "http_request_duration_highr_seconds", "", "", &m->highr);
    header(o, "http_request_duration_seconds", "histogram",
           "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ");
    for (size_t i = 0; i < m->n_latencies; i++) {
        char handler[300], method[40], before[320], after[60];
        escape_label(handler, sizeof handler, m->latencies[i].handler);
        escape_label(method, sizeof method, m->latencies[i].method);
        snprintf(before, sizeof before, "handler=\"%s\"", handler);
        snprintf(after, sizeof after, "method=\"%s\"", method);
        histogram_series(o, "http_request_duration_seconds", before, after, &m->latencies[i].h);
    }
    pthread_mutex_unlock(&m->mu);
}

/* The names of the adapters whose state has `bit` in any engine, comma-separated (escaped); a slot
 * without a name was freed since the engines' reading. */
static void lora_list(char *dst, size_t cap, const cv_engine_stats *st, size_t n, const char *const *names,
                      size_t n_names, int bit) {
    size_t at = 0;
    dst[0] = '\0';
    for (size_t a = 0; a < n_names && a < CV_MAX_LORA_MODULES; a++) {
        bool on = false;
        for (size_t i = 0; i < n; i++) on |= (st[i].lora_state[a] & bit) != 0;
        if (!on || !names[a] || at + 2 >= cap) continue;
        if (at) dst[at++] = ',';
        escape_label(dst + at, cap - at, names[a]);
        at += strlen(dst + at);
    }
}

/* vLLM's LoRA info gauge, only with LoRA on: the adapters with requests running and waiting across
 * the engines, its value the time of the reading (vLLM sets it to the time of its last update and
 * keeps every label set it saw; this shows the current one). */
static void lora_metrics(out *o, const cv_engine_stats *st, size_t n, const char *const *names, size_t n_names) {
    if (!st[0].max_loras) return;
    char running[4096], waiting[4096], labels[8300];
    lora_list(running, sizeof running, st, n, names, n_names, 1);
    lora_list(waiting, sizeof waiting, st, n, names, n_names, 2);
    snprintf(labels, sizeof labels, "max_lora=\"%d\",waiting_lora_adapters=\"%s\",running_lora_adapters=\"%s\"",
             st[0].max_loras, waiting, running);
    gauge(o, "vllm:lora_requests_info", "Running stats on lora requests.", labels, cv_wall_now());
}

char *cv_metrics_render(const cv_engine_stats *st, size_t n_engines, const char *model_name,
                        const char *const *lora_names, size_t n_loras, cv_http_metrics *http) {
    out o = {0};
    process_metrics(&o);
    vllm_metrics(&o, st, n_engines, model_name);
    lora_metrics(&o, st, n_engines, lora_names, n_loras);
    http_metrics(&o, http);
    return o.buf;
}
