/*
 * test_bench.c — the pieces of `cvllm bench serve` that need no network: numpy-compatible statistics
 * and Python float formatting, Gamma/Poisson arrival schedules (deterministic per seed, moments),
 * the SSE parser fed at every split point and byte by byte, the per-request stream record for
 * completions and chat chunks (TTFT, ITL, latency, usage, failures), vLLM's metric definitions
 * (TPOT, pooled ITL, goodput, peaks, output counting without usage), --goodput parsing, and the
 * random and prefix_repetition datasets with the real Qwen3 tokenizer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bench/arrivals.h"
#include "bench/dataset.h"
#include "bench/metrics.h"
#include "bench/pyrandom.h"
#include "bench/sse.h"
#include "bench/stats.h"
#include "bench/stream.h"
#include "check.h"
#include "cvllm.h"
#include "tokenizer/tokenizer.h"

#define QWEN_TOKENIZER CVLLM_SOURCE_DIR "/models/qwen3-tokenizer"
#define NEAR(a, b, tol) (fabs((a) - (b)) <= (tol))

static void test_stats(void) {
    double a[] = {4, 1, 3, 2};
    cv_stats_sort(a, 4);
    CHECK(a[0] == 1 && a[3] == 4);
    CHECK(cv_stats_median(a, 4) == 2.5);
    CHECK(cv_stats_median(a, 3) == 2);
    CHECK(cv_stats_percentile(a, 4, 0) == 1);
    CHECK(cv_stats_percentile(a, 4, 100) == 4);
    CHECK(cv_stats_percentile(a, 4, 50) == 2.5);
    CHECK(NEAR(cv_stats_percentile(a, 4, 99), 3.97, 1e-12));
    CHECK(NEAR(cv_stats_percentile(a, 4, 10), 1.3, 1e-12));
    double one = 7;
    CHECK(cv_stats_percentile(&one, 1, 99) == 7 && cv_stats_median(&one, 1) == 7);
    double s[] = {2, 4, 4, 4, 5, 5, 7, 9};
    CHECK(cv_stats_mean(s, 8) == 5);
    CHECK(cv_stats_std(s, 8) == 2); /* population (ddof = 0), as numpy */
    /* vLLM reports `np.mean(values or 0)`: no values gives 0 */
    CHECK(cv_stats_mean(NULL, 0) == 0 && cv_stats_std(NULL, 0) == 0);
    CHECK(cv_stats_median(NULL, 0) == 0 && cv_stats_percentile(NULL, 0, 99) == 0);
    /* numpy's pairwise grouping: 1e16 + 1 + 1 ... added one by one never moves (each +1 is a tie
     * that rounds back), while the unrolled partial sums add 2s and 4s that do */
    double big[9] = {1e16, 1, 1, 1, 1, 1, 1, 1, 1};
    double naive = 0;
    for (int i = 0; i < 9; i++) naive += big[i];
    CHECK(naive == 1e16);
    CHECK(cv_stats_sum(big, 9) >= 1e16 + 6);
    double many[300];
    for (int i = 0; i < 300; i++) many[i] = i * 0.5;
    CHECK(cv_stats_sum(many, 300) == 0.5 * 299 * 300 / 2); /* exact in binary either way */
}

static void check_py(double v, const char *want) {
    char buf[40];
    cv_stats_py_float(v, buf, sizeof buf);
    CHECK_STR_EQ(buf, want);
}

static void test_py_float(void) {
    check_py(4.0, "4.0");
    check_py(INFINITY, "inf");
    check_py(99.9, "99.9");
    check_py(0.1, "0.1");
    check_py(1.0 / 3, "0.3333333333333333");
    check_py(123456.789, "123456.789");
    check_py(0.0001, "0.0001");
    check_py(1.5e-05, "1.5e-05");
    check_py(1e16, "1e+16");
    check_py(0.0, "0.0");
    check_py(-2.5, "-2.5");
}

static void test_arrivals(void) {
    cv_rng rng;
    double t[1000], u[1000];
    cv_rng_seed(&rng, 1);
    cv_arrival_times(&rng, 5, INFINITY, 1.0, t);
    for (int i = 0; i < 5; i++) CHECK(t[i] == 0);
    cv_arrival_times(&rng, 8, 4.0, INFINITY, t);
    for (int i = 0; i < 8; i++) CHECK_MSG(t[i] == (i + 1) / 4.0, "t[%d] = %g", i, t[i]);

    cv_rng_seed(&rng, 42);
    cv_arrival_times(&rng, 1000, 10.0, 1.0, t);
    cv_rng_seed(&rng, 42);
    cv_arrival_times(&rng, 1000, 10.0, 1.0, u);
    CHECK(memcmp(t, u, sizeof t) == 0);
    CHECK(NEAR(t[999], 100.0, 1e-9)); /* rescaled: the last request leaves at N / rate */
    bool sorted = t[0] > 0;
    for (int i = 1; i < 1000; i++) sorted = sorted && t[i] >= t[i - 1];
    CHECK(sorted);
    cv_rng_seed(&rng, 43);
    cv_arrival_times(&rng, 1000, 10.0, 1.0, u);
    CHECK(memcmp(t, u, sizeof t) != 0);

    /* gaps of a Poisson process: coefficient of variation 1; burstiness 4 gives 1/2 */
    double burst[] = {1.0, 4.0, 0.25};
    for (size_t b = 0; b < 3; b++) {
        cv_rng_seed(&rng, 7);
        cv_arrival_times(&rng, 1000, 10.0, burst[b], t);
        double gaps[1000];
        for (int i = 0; i < 1000; i++) gaps[i] = i ? t[i] - t[i - 1] : t[0];
        double cv = cv_stats_std(gaps, 1000) / cv_stats_mean(gaps, 1000), want = 1 / sqrt(burst[b]);
        CHECK_MSG(NEAR(cv, want, 0.15 * want), "burstiness %g: CV %g, expected %g", burst[b], cv, want);
    }
}

/* --ramp-up-strategy: each request at its own rate, nothing rescaled */
static void test_arrivals_ramp(void) {
    cv_rng rng;
    double t[5], rates[5];
    cv_rng_seed(&rng, 1);
    cv_arrival_times_ramp(&rng, 5, CV_RAMP_LINEAR, 2.0, 10.0, INFINITY, t, rates);
    double sum = 0;
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(rates[i] == 2.0 + 2.0 * i, "linear rate %d: %g", i, rates[i]);
        sum += 1.0 / rates[i];
        CHECK_MSG(NEAR(t[i], sum, 1e-12), "t[%d] = %g, expected %g", i, t[i], sum);
    }
    cv_arrival_times_ramp(&rng, 5, CV_RAMP_EXPONENTIAL, 1.0, 16.0, INFINITY, t, rates);
    for (int i = 0; i < 5; i++) CHECK_MSG(NEAR(rates[i], pow(2.0, i), 1e-12), "exponential rate %d: %g", i, rates[i]);
    cv_arrival_times_ramp(&rng, 1, CV_RAMP_LINEAR, 3.0, 9.0, 1.0, t, rates);
    CHECK(rates[0] == 3.0 && t[0] > 0);
}

/* Python's random module, values printed by CPython 3.11 */
static void test_pyrandom(void) {
    cv_pyrandom r;
    size_t x[10];
    static const size_t shuffled0[] = {7, 8, 1, 5, 3, 4, 2, 0, 9, 6}, shuffled_big[] = {1, 0, 6, 5, 3, 2, 4};
    cv_pyrandom_seed(&r, 0); /* random.seed(0); random.shuffle(list(range(10))) */
    for (size_t i = 0; i < 10; i++) x[i] = i;
    cv_pyrandom_shuffle(&r, x, 10);
    CHECK(memcmp(x, shuffled0, sizeof shuffled0) == 0);
    cv_pyrandom_seed(&r, 12345678901ull); /* a seed of two 32-bit words */
    for (size_t i = 0; i < 7; i++) x[i] = i;
    cv_pyrandom_shuffle(&r, x, 7);
    CHECK(memcmp(x, shuffled_big, sizeof shuffled_big) == 0);
    cv_pyrandom_seed(&r, 0); /* random.choices(range(5), k=6) */
    static const size_t choices[] = {4, 3, 2, 1, 2, 2};
    for (size_t i = 0; i < 6; i++) CHECK_EQ_INT(cv_pyrandom_choice(&r, 5), choices[i]);
    cv_pyrandom_seed(&r, 3);
    CHECK(cv_pyrandom_bits(&r, 1) == 0 && cv_pyrandom_bits(&r, 5) == 18 && cv_pyrandom_bits(&r, 31) == 1168723365u &&
          cv_pyrandom_bits(&r, 32) == 560161641u);
    cv_pyrandom_seed(&r, 0);
    CHECK(cv_pyrandom_double(&r) == 0.8444218515250481);
}

static void test_gamma_moments(void) {
    static const double cases[][2] = {{0.5, 2.0}, {1.0, 0.3}, {3.0, 0.5}};
    enum { N = 200000 };
    double *x = malloc(N * sizeof *x);
    cv_rng rng;
    cv_rng_seed(&rng, 5);
    for (size_t c = 0; c < 3; c++) {
        double k = cases[c][0], theta = cases[c][1];
        for (int i = 0; i < N; i++) x[i] = cv_gamma_sample(&rng, k, theta);
        double mean = cv_stats_mean(x, N), var = pow(cv_stats_std(x, N), 2);
        CHECK_MSG(NEAR(mean, k * theta, 0.02 * k * theta), "Gamma(%g, %g) mean %g", k, theta, mean);
        CHECK_MSG(NEAR(var, k * theta * theta, 0.05 * k * theta * theta), "Gamma(%g, %g) var %g", k, theta, var);
        double min = x[0];
        for (int i = 1; i < N; i++) min = x[i] < min ? x[i] : min;
        CHECK(min > 0);
    }
    free(x);
}

/* ---- SSE ---- */

typedef struct events {
    char got[8][64];
    int n, stop_after;
} events;

static bool collect(void *ctx, const char *data, size_t len) {
    events *e = ctx;
    if (e->n < 8) snprintf(e->got[e->n], sizeof e->got[0], "%.*s", (int)len, data);
    e->n++;
    return e->stop_after == 0 || e->n < e->stop_after;
}

static const char sse_text[] = "data: a\n\ndata: b\r\n\r\n: ping\n\nevent: x\ndata: c1\ndata:c2\n\nid: 3\n\n"
                               "data:d\rdata: e\r\r\r\ndata\n\ndata: [DONE]";
static const char *sse_want[] = {"a", "b", "c1\nc2", "d\ne", "", "[DONE]"};

static void check_events(const events *e, const char *how) {
    CHECK_MSG(e->n == 6, "%s: %d events", how, e->n);
    for (int i = 0; i < 6 && i < e->n; i++) CHECK_MSG(!strcmp(e->got[i], sse_want[i]), "%s: event %d = '%s'", how, i, e->got[i]);
}

static void test_sse(void) {
    size_t len = strlen(sse_text);
    for (size_t cut = 0; cut <= len; cut++) {
        cv_sse p;
        events e = {0};
        cv_sse_init(&p);
        cv_sse_feed(&p, sse_text, cut, collect, &e);
        cv_sse_feed(&p, sse_text + cut, len - cut, collect, &e);
        cv_sse_finish(&p, collect, &e);
        char how[32];
        snprintf(how, sizeof how, "cut at %zu", cut);
        check_events(&e, how);
        cv_sse_free(&p);
    }
    cv_sse p;
    events e = {0};
    cv_sse_init(&p);
    for (size_t i = 0; i < len; i++) cv_sse_feed(&p, sse_text + i, 1, collect, &e);
    cv_sse_finish(&p, collect, &e);
    check_events(&e, "byte by byte");
    cv_sse_free(&p);
    /* the callback can stop the parser */
    events s = {.stop_after = 2};
    cv_sse_init(&p);
    CHECK(!cv_sse_feed(&p, sse_text, len, collect, &s));
    CHECK(s.n == 2);
    CHECK(!cv_sse_finish(&p, collect, &s));
    cv_sse_free(&p);
}

/* ---- stream records ---- */

typedef struct timed {
    double at;
    const char *event;       /* without "data: " and the blank line */
} timed;

/* Feeds events (each at its time) split in two at every byte of the first event. */
static void feed_events(cv_stream *st, const timed *ev, size_t n, size_t split) {
    for (size_t i = 0; i < n; i++) {
        char *text = cv_xasprintf("data: %s\n\n", ev[i].event);
        size_t len = strlen(text), cut = split < len ? split : len;
        cv_stream_feed(st, text, cut, ev[i].at);
        cv_stream_feed(st, text + cut, len - cut, ev[i].at);
        free(text);
    }
}

static cv_request_result run_stream(cv_bench_api api, const timed *ev, size_t n, size_t split) {
    cv_request_result r;
    cv_request_result_init(&r, 11);
    r.start_time = 1.0;
    cv_stream st;
    cv_stream_init(&st, api, &r);
    feed_events(&st, ev, n, split);
    cv_stream_finish(&st);
    cv_stream_free(&st);
    return r;
}

static void test_stream_completions(void) {
    static const timed ev[] = {
        {1.5, "{\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"Hel\",\"finish_reason\":null}]}"},
        {1.6, "{\"choices\":[{\"index\":0,\"text\":\"\"}]}"},
        {1.75, "{\"choices\":[{\"index\":0,\"text\":\"lo\",\"finish_reason\":\"length\"}]}"},
        {1.8, "{\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}"},
        {1.9, "[DONE]"},
    };
    for (size_t split = 0; split < 40; split += 3) {
        cv_request_result r = run_stream(CV_API_COMPLETIONS, ev, 5, split);
        CHECK(r.success && !r.error);
        CHECK(NEAR(r.ttft, 0.5, 1e-12));
        CHECK(r.n_itl == 1 && NEAR(r.itl[0], 0.25, 1e-12));
        CHECK(NEAR(r.latency, 0.75, 1e-12)); /* ends at the last text, not at usage or [DONE] */
        CHECK_EQ_INT(r.output_tokens, 2);
        CHECK_EQ_INT(r.prompt_len, 9);
        CHECK_STR_EQ(r.text, "Hello");
        cv_request_result_free(&r);
    }
    /* no usage: the dataset's prompt length stays, output tokens are left to the metrics */
    cv_request_result r = run_stream(CV_API_COMPLETIONS, ev, 3, 0);
    CHECK(r.success && r.output_tokens == 0 && r.prompt_len == 11);
    cv_request_result_free(&r);
}

static void test_stream_chat(void) {
    static const timed ev[] = {
        {1.1, "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}"},
        {1.3, "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"}}]}"},
        {1.4, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}"},
        {1.45, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}],"
               "\"usage\":{\"completion_tokens\":3}}"},
    };
    cv_request_result r = run_stream(CV_API_CHAT, ev, 4, 7);
    CHECK(r.success);
    CHECK(NEAR(r.ttft, 0.3, 1e-12)); /* the role-only chunk is not output; reasoning is */
    CHECK(r.n_itl == 2 && NEAR(r.itl[0], 0.1, 1e-12) && NEAR(r.itl[1], 0.05, 1e-12));
    CHECK_EQ_INT(r.output_tokens, 3);
    CHECK_STR_EQ(r.text, "hmmHi!");
    cv_request_result_free(&r);
    /* a completions chunk read as chat carries no delta: nothing counts, the request fails */
    static const timed wrong[] = {{1.2, "{\"choices\":[{\"text\":\"x\"}]}"}};
    r = run_stream(CV_API_CHAT, wrong, 1, 0);
    CHECK(!r.success);
    CHECK_CONTAINS(r.error, "Never received a valid chunk");
    cv_request_result_free(&r);
}

static void test_stream_failures(void) {
    static const timed err[] = {
        {1.2, "{\"choices\":[{\"text\":\"a\"}]}"},
        {1.3, "{\"error\":{\"message\":\"out of KV cache\",\"type\":\"InternalServerError\",\"code\":500}}"},
        {1.4, "{\"choices\":[{\"text\":\"b\"}]}"},
    };
    cv_request_result r = run_stream(CV_API_COMPLETIONS, err, 3, 5);
    CHECK(!r.success);
    CHECK_CONTAINS(r.error, "out of KV cache");
    cv_request_result_free(&r);
    static const timed bad[] = {{1.2, "{\"choices\":[{\"text\":\"a\"}]}"}, {1.3, "{\"choices\": [oops"}};
    r = run_stream(CV_API_COMPLETIONS, bad, 2, 0);
    CHECK(!r.success);
    CHECK_CONTAINS(r.error, "invalid JSON");
    cv_request_result_free(&r);
    r = run_stream(CV_API_COMPLETIONS, NULL, 0, 0);
    CHECK(!r.success && r.error);
    cv_request_result_free(&r);
    /* the first reason wins */
    cv_request_result_init(&r, 1);
    cv_request_fail(&r, "HTTP %d", 503);
    cv_request_fail(&r, "later");
    CHECK_STR_EQ(r.error, "HTTP 503");
    cv_request_result_free(&r);
}

/* ---- metrics ---- */

static cv_request_result make_result(bool ok, double start, double ttft, const double *itl, size_t n_itl,
                                     int32_t out, int32_t prompt, const char *text) {
    cv_request_result r;
    cv_request_result_init(&r, prompt);
    r.success = ok;
    r.start_time = start;
    r.ttft = ttft;
    double t = ttft;
    for (size_t i = 0; i < n_itl; i++) {
        r.itl = cv_xrealloc(r.itl, (i + 1) * sizeof *r.itl);
        r.itl[r.n_itl++] = itl[i];
        t += itl[i];
    }
    r.latency = t;
    r.output_tokens = out;
    free(r.text);
    r.text = cv_xstrdup(text);
    r.n_text = strlen(text);
    if (!ok) cv_request_fail(&r, "boom");
    return r;
}

static void test_metrics(const cvllm_tokenizer *tok) {
    const double itl0[] = {0.05, 0.05}, itl1[] = {0.1};
    cv_request_result rs[3] = {
        make_result(true, 10.0, 0.1, itl0, 2, 3, 10, "abc"),
        make_result(true, 10.1, 0.2, itl1, 1, 0, 5, " hello hello"),
        make_result(false, 10.2, 0, NULL, 0, 0, 8, ""),
    };
    rs[0].queue_time = 0.5;
    rs[1].queue_time = 0.25;
    cv_goodput_slo slo;
    CHECK(cv_goodput_parse("ttft:150 tpot:60", &slo) == 0);
    cv_bench_metrics m;
    cv_bench_metrics_compute(rs, 3, 2.0, tok, &slo, &m);
    CHECK_EQ_INT(m.completed, 2);
    CHECK_EQ_INT(m.failed, 1);
    CHECK_EQ_INT(m.total_input, 15);
    CHECK_EQ_INT(m.total_output, 5); /* 3 from usage, 2 by re-tokenizing " hello hello" */
    CHECK(m.output_lens[0] == 3 && m.output_lens[1] == 2 && m.output_lens[2] == 0);
    CHECK(m.request_throughput == 1.0);
    CHECK(m.request_goodput == 0.5); /* request 1 has TPOT 100 ms > 60 */
    CHECK(m.output_throughput == 2.5);
    CHECK(m.total_token_throughput == 10.0);
    CHECK(m.n_values[CV_METRIC_TPOT] == 2);
    CHECK(NEAR(m.values[CV_METRIC_TPOT][0], 0.05, 1e-12) && NEAR(m.values[CV_METRIC_TPOT][1], 0.1, 1e-12));
    CHECK(m.n_values[CV_METRIC_ITL] == 3); /* pooled over requests */
    CHECK(m.n_values[CV_METRIC_TTFT] == 2 && m.n_values[CV_METRIC_E2EL] == 2);
    CHECK(NEAR(m.values[CV_METRIC_E2EL_QUEUE][0], 0.7, 1e-12));
    CHECK_EQ_INT(m.max_concurrent_requests, 2); /* [10, 10.2) and [10.1, 10.4) overlap */
    CHECK(m.max_output_tokens_per_s == 5);      /* five chunks, all within the first second */
    cv_metric_summary s;
    double pcts[] = {50, 100}, out[2];
    s.percentiles_ms = out;
    cv_metric_summarize(m.values[CV_METRIC_TPOT], 2, pcts, 2, &s);
    CHECK(NEAR(s.mean_ms, 75, 1e-9) && NEAR(s.median_ms, 75, 1e-9) && NEAR(s.std_ms, 25, 1e-9));
    CHECK(NEAR(out[0], 75, 1e-9) && NEAR(out[1], 100, 1e-9));
    cv_bench_metrics_free(&m);

    /* no tokenizer and no usage: one token (vLLM's fallback); touching intervals do not overlap */
    rs[1].start_time = 10.2;
    cv_bench_metrics_compute(rs, 3, 1.0, NULL, NULL, &m);
    CHECK(m.output_lens[1] == 1);
    CHECK(m.n_values[CV_METRIC_TPOT] == 1); /* output <= 1 has no TPOT */
    CHECK(m.request_goodput == 0);
    CHECK_EQ_INT(m.max_concurrent_requests, 1);
    cv_bench_metrics_free(&m);

    /* a request that never made it: everything is 0, nothing divides by zero */
    cv_bench_metrics_compute(rs + 2, 1, 1.0, tok, NULL, &m);
    CHECK(m.completed == 0 && m.failed == 1 && m.max_output_tokens_per_s == 0 && m.max_concurrent_requests == 0);
    cv_metric_summarize(m.values[CV_METRIC_TTFT], m.n_values[CV_METRIC_TTFT], pcts, 2, &s);
    CHECK(s.mean_ms == 0 && out[1] == 0);
    cv_bench_metrics_free(&m);
    for (int i = 0; i < 3; i++) cv_request_result_free(&rs[i]);
}

static void test_goodput_parse(void) {
    cv_goodput_slo slo;
    CHECK(cv_goodput_parse("ttft:100 tpot:50", &slo) == 0);
    CHECK(slo.ttft_ms == 100 && slo.tpot_ms == 50 && slo.e2el_ms < 0 && cv_goodput_any(&slo));
    CHECK(cv_goodput_parse(" e2el:1e3 ", &slo) == 0 && slo.e2el_ms == 1000 && slo.ttft_ms < 0);
    CHECK(cv_goodput_parse("", &slo) == 0 && !cv_goodput_any(&slo));
    CHECK(cv_goodput_parse("itl:5", &slo) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "unknown metric 'itl'");
    CHECK(cv_goodput_parse("ttft", &slo) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "KEY:VALUE");
    CHECK(cv_goodput_parse("ttft:-1", &slo) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK(cv_goodput_parse("tpot:5ms", &slo) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK(cv_goodput_parse("tpot:", &slo) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK(cv_metric_find("e2el_including_client_queue", 27) == CV_METRIC_E2EL_QUEUE);
    CHECK(cv_metric_find("ttf", 3) == -1);
}

/* ---- dataset ---- */

static bool same_samples(const cv_bench_sample *a, const cv_bench_sample *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(a[i].prompt, b[i].prompt) || a[i].output_len != b[i].output_len) return false;
    return true;
}

static void test_dataset(const cvllm_tokenizer *tok) {
    cv_random_dataset_options o = {.num_prompts = 20, .input_len = 32, .output_len = 8, .seed = 1};
    cv_bench_sample *s, *t;
    CHECK(cv_random_dataset(tok, &o, &s) == 0);
    int exact = 0;
    for (int i = 0; i < 20; i++) {
        CHECK(s[i].output_len == 8);
        int32_t *ids;
        size_t n;
        CHECK(cvllm_tokenize(tok, s[i].prompt, strlen(s[i].prompt), &ids, &n) == CVLLM_OK);
        CHECK_MSG((int32_t)n == s[i].prompt_len && !memcmp(ids, s[i].ids, n * sizeof *ids),
                  "sample %d: the text encodes to %zu tokens, prompt_len %d", i, n, s[i].prompt_len);
        cvllm_free(ids);
        exact += s[i].prompt_len == 32;
    }
    CHECK_MSG(exact >= 16, "only %d of 20 prompts have exactly 32 tokens", exact);
    CHECK(cv_random_dataset(tok, &o, &t) == 0);
    CHECK(same_samples(s, t, 20));
    cv_bench_samples_free(t, 20);
    o.seed = 2;
    CHECK(cv_random_dataset(tok, &o, &t) == 0);
    CHECK(!same_samples(s, t, 20));
    cv_bench_samples_free(t, 20);
    cv_bench_samples_free(s, 20);

    /* exact ids below a small vocabulary (the 4096-row test checkpoints), ranges, shared prefix */
    o = (cv_random_dataset_options){.num_prompts = 50, .input_len = 20, .output_len = 8, .prefix_len = 5,
                                    .range_ratio = 0.5, .seed = 3, .vocab_limit = 4096, .exact_ids = true};
    CHECK(cv_random_dataset(tok, &o, &s) == 0);
    bool in_range = true, below = true, prefix = true, lengths_vary = false;
    for (int i = 0; i < 50; i++) {
        int32_t input = s[i].prompt_len - 5;
        in_range = in_range && input >= 10 && input <= 30 && s[i].output_len >= 4 && s[i].output_len <= 12;
        for (int32_t k = 0; k < s[i].prompt_len; k++)
            below = below && s[i].ids[k] >= 0 && s[i].ids[k] < 4096 &&
                    !cv_tokenizer_is_special((const cv_tokenizer *)tok, s[i].ids[k]);
        prefix = prefix && !memcmp(s[i].ids, s[0].ids, 5 * sizeof *s[i].ids);
        lengths_vary = lengths_vary || s[i].prompt_len != s[0].prompt_len;
    }
    CHECK(in_range && below && prefix && lengths_vary);
    cv_bench_samples_free(s, 50);

    o.range_ratio = 1.0;
    CHECK(cv_random_dataset(tok, &o, &s) == CVLLM_ERR_INVALID_ARGUMENT && s == NULL);
    CHECK_CONTAINS(cvllm_last_error(), "--random-range-ratio");
    o = (cv_random_dataset_options){.num_prompts = 2, .input_len = 1, .output_len = 1, .range_ratio = 0.5};
    CHECK(cv_random_dataset(tok, &o, &s) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "too small");
}

/* random-rerank: one query of L/2 − 1 tokens, documents of L − query − 1, grouped batch_size a request,
 * each request's prompt_len counting the query and a separator once a document. */
static void test_rerank_dataset(const cvllm_tokenizer *tok) {
    cv_random_dataset_options o = {.num_prompts = 7, .input_len = 40, .output_len = 1, .seed = 4};
    cv_bench_sample *s;
    size_t n;
    CHECK(cv_random_rerank_dataset(tok, &o, 3, &s, &n) == 0);
    CHECK_EQ_INT((int)n, 3);
    static const int docs[] = {3, 3, 1};
    int exact = 0;
    for (size_t b = 0; b < n && n == 3; b++) {
        CHECK_EQ_INT(s[b].n_docs, docs[b]);
        CHECK(!strcmp(s[b].prompt, s[0].prompt));
        int32_t *ids;
        size_t query, total = 0;
        CHECK(cvllm_tokenize(tok, s[b].prompt, strlen(s[b].prompt), &ids, &query) == CVLLM_OK);
        cvllm_free(ids);
        for (int32_t k = 0; k < s[b].n_docs; k++) {
            size_t len;
            CHECK(cvllm_tokenize(tok, s[b].docs[k], strlen(s[b].docs[k]), &ids, &len) == CVLLM_OK);
            cvllm_free(ids);
            total += len;
            exact += len == 20;
            if (b == 0 && k > 0) CHECK(strcmp(s[b].docs[k], s[b].docs[0]) != 0);
        }
        CHECK_EQ_INT((int)query, 19);
        CHECK_EQ_INT(s[b].prompt_len, (int)((query + 1) * (size_t)s[b].n_docs + total));
    }
    CHECK_MSG(exact >= 6, "only %d of 7 documents have exactly 20 tokens", exact);
    cv_bench_samples_free(s, n);
    CHECK(cv_random_rerank_dataset(tok, &o, 0, &s, &n) == CVLLM_ERR_INVALID_ARGUMENT);
    o.input_len = 3;
    CHECK(cv_random_rerank_dataset(tok, &o, 1, &s, &n) == CVLLM_ERR_INVALID_ARGUMENT && s == NULL);
    CHECK_CONTAINS(cvllm_last_error(), "leaves no room for a query");
}

/* prefix_repetition: num_prefixes × ⌊num_prompts / num_prefixes⌋ samples of prefix + suffix ids, those
 * of one prefix adjacent in drawing order (disable_shuffle); shuffling permutes the same samples. */
static void test_prefix_repetition_dataset(const cvllm_tokenizer *tok) {
    cv_prefix_repetition_options o = {.num_prompts = 8, .prefix_len = 12, .suffix_len = 5, .num_prefixes = 3,
                                      .output_len = 4, .seed = 9, .disable_shuffle = true};
    cv_bench_sample *s, *t;
    size_t n, m;
    CHECK(cv_prefix_repetition_dataset(tok, &o, &s, &n) == 0);
    CHECK_EQ_INT((int)n, 6);
    for (size_t i = 0; i < n && n == 6; i++) {
        CHECK_EQ_INT(s[i].prompt_len, 17);
        CHECK_EQ_INT(s[i].output_len, 4);
        const bool shared = !memcmp(s[i].ids, s[i ^ 1].ids, 12 * sizeof *s[i].ids);
        const bool other = !memcmp(s[i].ids, s[(i + 2) % 6].ids, 12 * sizeof *s[i].ids);
        CHECK_MSG(shared && !other, "sample %zu: prefix shared with its pair %d, with the next pair %d", i, shared, other);
        CHECK(memcmp(s[i].ids + 12, s[i ^ 1].ids + 12, 5 * sizeof *s[i].ids) != 0);
    }
    o.disable_shuffle = false;
    CHECK(cv_prefix_repetition_dataset(tok, &o, &t, &m) == 0);
    CHECK_EQ_INT((int)m, 6);
    bool moved = false, all_found = true;
    for (size_t i = 0; i < m && m == n; i++) {
        moved = moved || strcmp(t[i].prompt, s[i].prompt) != 0;
        bool found = false;
        for (size_t j = 0; j < n; j++) found = found || !strcmp(t[i].prompt, s[j].prompt);
        all_found = all_found && found;
    }
    CHECK(moved && all_found);
    cv_bench_samples_free(t, m);
    cv_bench_samples_free(s, n);
    o.num_prompts = 2;
    CHECK(cv_prefix_repetition_dataset(tok, &o, &s, &n) == CVLLM_ERR_INVALID_ARGUMENT && s == NULL);
    CHECK_CONTAINS(cvllm_last_error(), "num_requests (2) must be greater than or equal to num_prefixes (3)");
}

int main(void) {
    test_stats();
    test_py_float();
    test_arrivals();
    test_arrivals_ramp();
    test_pyrandom();
    test_gamma_moments();
    test_sse();
    test_stream_completions();
    test_stream_chat();
    test_stream_failures();
    test_goodput_parse();
    cvllm_tokenizer *tok = NULL;
    CHECK(cvllm_tokenizer_create(QWEN_TOKENIZER, &tok) == CVLLM_OK);
    if (tok) {
        test_metrics(tok);
        test_dataset(tok);
        test_rerank_dataset(tok);
        test_prefix_repetition_dataset(tok);
    }
    cvllm_tokenizer_destroy(tok);
    return cv_check_summary("test_bench");
}
