/*
 * test_bench_cli.c — `cvllm bench serve|throughput|latency` as a user runs them.
 *
 * serve runs against tests/tools/mock_openai_server.py on 127.0.0.1 (an ephemeral port), which
 * streams OpenAI-style SSE with a known TTFT and inter-token gap, splits every event across reads,
 * and logs the request bodies. Checked: vLLM's printed block line by line (labels, column widths,
 * which lines appear), the saved JSON's keys, order and values (counts from usage, goodput, timings
 * within bounds of the server's schedule, --save-detailed arrays, metadata, the default file name),
 * the request bodies (streaming with usage, ignore_eos, max_tokens, served model name, sampling
 * flags, headers), the chat endpoint without usage (output counted with the tokenizer), HTTP and
 * in-stream failures, and usage errors. throughput and latency run on the reference checkpoint
 * (vocabulary 4096). alarm() bounds the run; the mock servers die with the test.
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "check.h"
#include "cvllm.h"
#include "testutil.h"

#define QWEN_TOKENIZER CVLLM_SOURCE_DIR "/models/qwen3-tokenizer"
#define MOCK CVLLM_SOURCE_DIR "/tests/tools/mock_openai_server.py"

static char *tmp;

/* Runs `cvllm bench ARGS...` (NULL-terminated) in tmp, logging at warning, without OPENAI_API_KEY. */
static tu_run bench(const char *const *args) {
    static const char *const env[] = {"CVLLM_LOG_LEVEL=warning", "OPENAI_API_KEY", NULL};
    const char *argv[64] = {"bench"};
    size_t n = 1;
    for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    return tu_run_exec(tmp, NULL, env, CVLLM_BINARY, argv);
}

typedef struct server {
    pid_t pid;
    char port[16];
    char *log;
} server;

/* Starts the mock with extra arguments (NULL-terminated) and a request log of its own. */
static server start_mock(const char *name, const char *const *extra) {
    server s = {0};
    s.log = cv_xasprintf("%s/%s.log", tmp, name);
    int fds[2];
    if (pipe(fds) != 0) return s;
    const char *argv[32] = {"python3", MOCK, "--lifetime", "60", "--log", s.log, "--model-root", QWEN_TOKENIZER};
    int argc = 8;
    for (; extra && *extra && argc < 30; extra++) argv[argc++] = *extra;
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execvp("python3", (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    if (f && fgets(s.port, sizeof s.port, f)) s.port[strcspn(s.port, "\n")] = '\0';
    if (f) fclose(f);
    s.pid = pid;
    CHECK_MSG(s.port[0], "mock_openai_server.py did not start (is python3 installed?)");
    return s;
}

static void stop_mock(server *s) {
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        waitpid(s->pid, NULL, 0);
    }
    free(s->log);
    s->pid = 0;
}

/* The line of `out` that starts with `label`, or NULL. */
static const char *line_of(const char *out, const char *label) {
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, label, strlen(label))) return p;
    return NULL;
}

/* The same within vLLM's result block (the traffic lines before it reuse some labels). */
static const char *block_line(const char *out, const char *label) {
    const char *block = strstr(out, "============ Serving Benchmark Result");
    return block ? line_of(block, label) : NULL;
}

/* vLLM's "{:<40} {:<10}" row holding exactly `value`. */
static void check_row(const char *out, const char *label, const char *value) {
    char want[128];
    snprintf(want, sizeof want, "%-40s %-10s\n", label, value);
    const char *line = block_line(out, label);
    CHECK_MSG(line && !strncmp(line, want, strlen(want)), "row '%s': want '%s'", label, want);
}

/* The number in vLLM's row `label`. */
static double row_value(const char *out, const char *label) {
    const char *line = block_line(out, label);
    CHECK_MSG(line != NULL, "no row '%s'", label);
    return line ? atof(line + 41) : -1;
}

static json_t *load_json(const char *path) {
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    CHECK_MSG(j != NULL, "%s: %s", path, err.text);
    return j;
}

static double num(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    CHECK_MSG(json_is_number(v), "key %s is not a number", key);
    return json_number_value(v);
}

/* Request bodies the mock logged, one JSON object per line. */
static json_t *logged_requests(const char *log) {
    char *text = tu_read_text(log);
    json_t *all = json_array();
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) json_array_append_new(all, json_loads(line, 0, NULL));
    free(text);
    return all;
}

static void test_serve_completions(void) {
    server s = start_mock("completions", (const char *const[]){"--ttft-ms", "50", "--itl-ms", "10", "--prompt-tokens", "7", NULL});
    tu_run r = bench((const char *const[]){
        "serve", "--port", s.port, "--num-prompts", "6", "--random-input-len", "16", "--random-output-len", "5",
        "--max-concurrency", "3", "--request-rate", "50", "--seed", "3", "--goodput", "ttft:10000", "tpot:1",
        "--percentile-metrics", "ttft,tpot,itl,e2el,client_queue_time", "--metric-percentiles", "50,99.9",
        "--save-result", "--save-detailed", "--result-dir", tmp, "--result-filename", "serve.json",
        "--label", "mock", "--metadata", "run=ci", "--temperature", "0", "--header", "X-Test=yes", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "First model name: mock-model, first model id: " QWEN_TOKENIZER "\n");
    CHECK_CONTAINS(r.out, "Traffic request rate: 50.0\nBurstiness factor: 1.0 (Poisson process)\n"
                          "Maximum request concurrency: 3\n");
    CHECK(strstr(r.out, "WARNING: vllm bench serve no longer sets temperature") == NULL);
    CHECK_CONTAINS(r.out, "Starting initial single prompt test run...\nSkipping endpoint ready check.\n");
    CHECK(strstr(r.out, "Speculative Decoding") == NULL); /* the mock has no /metrics here */
    CHECK_CONTAINS(r.out, "\n============ Serving Benchmark Result ============\n");
    check_row(r.out, "Successful requests:", "6");
    check_row(r.out, "Failed requests:", "0");
    check_row(r.out, "Maximum request concurrency:", "3");
    check_row(r.out, "Request rate configured (RPS):", "50.00");
    check_row(r.out, "Total input tokens:", "42"); /* usage.prompt_tokens = 7 replaces the dataset's */
    check_row(r.out, "Total generated tokens:", "30");
    check_row(r.out, "Request goodput (req/s):", "0.00"); /* nothing meets TPOT <= 1 ms */
    CHECK(line_of(r.out, "Peak output token throughput (tok/s):") && line_of(r.out, "Peak concurrent requests:"));
    CHECK_CONTAINS(r.out, "\n---------------Time to First Token----------------\nMean TTFT (ms):");
    CHECK_CONTAINS(r.out, "\n-----Time per Output Token (excl. 1st token)------\n");
    CHECK_CONTAINS(r.out, "\n---------------Inter-token Latency----------------\n");
    CHECK_CONTAINS(r.out, "\n----------------End-to-end Latency----------------\n");
    CHECK_CONTAINS(r.out, "\n---------------Client-side Queueing---------------\n");
    CHECK(line_of(r.out, "P99.9 TTFT (ms):") && line_of(r.out, "P50 ITL (ms):"));
    CHECK(line_of(r.out, "P99 TTFT (ms):") == NULL);
    double ttft = row_value(r.out, "Mean TTFT (ms):"), itl = row_value(r.out, "Mean ITL (ms):");
    CHECK_MSG(ttft >= 49 && ttft < 1000, "mean TTFT %g ms for a 50 ms server", ttft);
    CHECK_MSG(itl >= 5 && itl < 200, "mean ITL %g ms for a 10 ms server", itl);
    CHECK(row_value(r.out, "Mean E2EL (ms):") >= 89);
    CHECK_CONTAINS(r.out, "\n==================================================\n");

    char *path = cv_xasprintf("%s/serve.json", tmp);
    json_t *j = load_json(path);
    static const char *order[] = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
                                  "num_prompts", "run", "request_rate", "burstiness", "max_concurrency",
                                  "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                                  "request_throughput", "request_goodput", "output_throughput",
                                  "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
                                  "latencies", "start_times", "queue_times", "generated_texts", "errors",
                                  "max_output_tokens_per_s", "max_concurrent_requests", "rtfx", "mean_ttft_ms",
                                  "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99.9_ttft_ms"};
    const char *key;
    json_t *value;
    size_t k = 0;
    json_object_foreach(j, key, value) {
        if (k < CV_ARRAY_LEN(order)) CHECK_MSG(!strcmp(key, order[k]), "key %zu is %s, expected %s", k, key, order[k]);
        k++;
    }
    CHECK_STR_EQ(json_string_value(json_object_get(j, "label")), "mock");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "run")), "ci");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "backend")), "openai");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "tokenizer_id")), QWEN_TOKENIZER);
    CHECK(num(j, "request_rate") == 50 && num(j, "burstiness") == 1 && num(j, "max_concurrency") == 3);
    CHECK(num(j, "completed") == 6 && num(j, "failed") == 0 && num(j, "num_prompts") == 6);
    CHECK(num(j, "total_input_tokens") == 42 && num(j, "total_output_tokens") == 30);
    CHECK(num(j, "request_goodput") == 0);
    CHECK(num(j, "rtfx") == 0);
    CHECK(num(j, "max_concurrent_requests") >= 1 && num(j, "max_concurrent_requests") <= 3);
    double duration = num(j, "duration");
    CHECK(duration > 0.09 && fabs(num(j, "request_throughput") - 6 / duration) < 1e-9);
    CHECK(fabs(num(j, "total_token_throughput") - 72 / duration) < 1e-9);
    CHECK(num(j, "mean_itl_ms") > 5 && num(j, "p99.9_itl_ms") >= num(j, "median_itl_ms"));
    CHECK(fabs(num(j, "mean_ttft_ms") - ttft) < 0.006);
    CHECK(json_object_get(j, "p99.9_e2el_ms") && json_object_get(j, "std_client_queue_time_ms"));
    CHECK(!json_object_get(j, "mean_e2el_including_client_queue_ms")); /* not selected */
    const json_t *itls = json_object_get(j, "itls"), *texts = json_object_get(j, "generated_texts");
    CHECK(json_array_size(itls) == 6 && json_array_size(json_array_get(itls, 0)) == 4);
    CHECK_STR_EQ(json_string_value(json_array_get(texts, 5)), " hello hello hello hello hello");
    CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(j, "errors"), 0)), "");
    CHECK(json_integer_value(json_array_get(json_object_get(j, "input_lens"), 2)) == 7);
    CHECK(json_integer_value(json_array_get(json_object_get(j, "output_lens"), 2)) == 5);
    json_decref(j);
    free(path);

    json_t *reqs = logged_requests(s.log);
    CHECK_EQ_INT(json_array_size(reqs), 6);
    const json_t *b = json_array_get(reqs, 0);
    CHECK_STR_EQ(json_string_value(json_object_get(b, "model")), "mock-model");
    CHECK(json_is_true(json_object_get(b, "stream")) && json_is_true(json_object_get(b, "ignore_eos")));
    CHECK(json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage")));
    CHECK(json_integer_value(json_object_get(b, "max_tokens")) == 5);
    CHECK(json_number_value(json_object_get(b, "temperature")) == 0);
    CHECK(json_is_string(json_object_get(b, "prompt")) && json_string_length(json_object_get(b, "prompt")) > 10);
    json_decref(reqs);
    tu_run_free(&r);
    stop_mock(&s);
}

/* --ready-check-timeout-sec sends the first request until it succeeds; the speculative-decoding
 * section comes from the server's counters read around the timed run only. */
static void test_serve_ready_check_and_spec_decode(void) {
    server s = start_mock("spec", (const char *const[]){"--ttft-ms", "5", "--itl-ms", "1", "--spec-metrics", NULL});
    tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--num-prompts", "4", "--random-input-len", "8",
                                           "--random-output-len", "3", "--num-warmups", "2", "--ready-check-timeout-sec",
                                           "10", "--save-result", "--result-dir", tmp, "--result-filename",
                                           "spec.json", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Starting initial single prompt test run...\nWaiting for endpoint to become up in 10 seconds\n"
                          "Initial test run completed.\nWarming up with 2 requests...\n");
    /* 4 timed requests of the 7: 8 drafts, 24 draft tokens, 12 accepted; per position 8, 4, 0 */
    CHECK_CONTAINS(r.out, "\n---------------Speculative Decoding---------------\n");
    check_row(r.out, "Acceptance rate (%):", "50.00");
    check_row(r.out, "Acceptance length:", "2.50");
    check_row(r.out, "Drafts:", "8");
    check_row(r.out, "Draft tokens:", "24");
    check_row(r.out, "Accepted tokens:", "12");
    CHECK_CONTAINS(r.out, "\nPer-position acceptance (%):\n");
    check_row(r.out, "  Position 0:", "100.00");
    check_row(r.out, "  Position 1:", "50.00");
    check_row(r.out, "  Position 2:", "0.00");
    char *last = cv_xasprintf("%-40s %-10s\n%s\n", "  Position 2:", "0.00", "==================================================");
    CHECK_CONTAINS(r.out, last); /* the section closes the block */
    free(last);
    char *path = cv_xasprintf("%s/spec.json", tmp);
    json_t *j = load_json(path);
    CHECK(num(j, "spec_decode_acceptance_rate") == 50 && num(j, "spec_decode_acceptance_length") == 2.5);
    CHECK(num(j, "spec_decode_num_drafts") == 8 && num(j, "spec_decode_draft_tokens") == 24 &&
          num(j, "spec_decode_accepted_tokens") == 12);
    const json_t *pos = json_object_get(j, "spec_decode_per_position_acceptance_rates");
    CHECK(json_array_size(pos) == 3 && json_number_value(json_array_get(pos, 1)) == 0.5);
    json_decref(j);
    free(path);
    tu_run_free(&r);
    stop_mock(&s);

    /* a server whose every request fails: the check gives up after the timeout with the error */
    server f = start_mock("failing", (const char *const[]){"--fail-every", "1", NULL});
    r = bench((const char *const[]){"serve", "--port", f.port, "--num-prompts", "2", "--random-input-len", "8",
                                    "--random-output-len", "3", "--ready-check-timeout-sec", "1", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "Initial test run failed - Please make sure benchmark arguments are correctly specified. "
                          "Error: HTTP 500");
    tu_run_free(&r);
    stop_mock(&f);
}

/* --ramp-up-strategy: vLLM's lines, settings, file name and rps_change_events. */
static void test_serve_ramp_up(void) {
    server s = start_mock("ramp", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
    tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--num-prompts", "5", "--random-input-len", "8",
                                           "--random-output-len", "2", "--ramp-up-strategy", "linear",
                                           "--ramp-up-start-rps", "20", "--ramp-up-end-rps", "60", "--save-result",
                                           "--result-dir", tmp, NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Starting main benchmark run...\nTraffic ramp-up strategy: linear.\n"
                          "Will increase RPS from 20 to 60 RPS over the duration of the benchmark.\n"
                          "Burstiness factor: 1.0 (Poisson process)\n");
    CHECK(line_of(r.out, "Request rate configured (RPS):") == NULL);
    char *cmd = cv_xasprintf("ls %s/openai-ramp-up-linear-20qps-60qps-qwen3-tokenizer-*.json > %s/ramp.list", tmp, tmp);
    CHECK_MSG(system(cmd) == 0, "no result file named openai-ramp-up-linear-20qps-60qps-<model>-<date>.json");
    free(cmd);
    char *list = cv_xasprintf("%s/ramp.list", tmp);
    FILE *f = fopen(list, "r");
    char path[1024] = "";
    if (f && fgets(path, sizeof path, f)) path[strcspn(path, "\n")] = '\0';
    if (f) fclose(f);
    json_t *j = load_json(path);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "ramp_up_strategy")), "linear");
    CHECK(num(j, "ramp_up_start_rps") == 20 && num(j, "ramp_up_end_rps") == 60);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "request_rate")), "inf");
    /* rates 20, 30, 40, 50, 60 by request: one event for 20, then one for each whole rate up to 60 */
    const json_t *ev = json_object_get(j, "rps_change_events");
    CHECK_EQ_INT(json_array_size(ev), 41);
    CHECK(num(json_array_get(ev, 0), "rps") == 20 && num(json_array_get(ev, 40), "rps") == 60);
    const char *ts = json_string_value(json_object_get(json_array_get(ev, 40), "timestamp"));
    CHECK_MSG(ts && strlen(ts) >= 19 && ts[10] == 'T', "timestamp %s", ts ? ts : "(none)");
    json_decref(j);
    free(list);
    tu_run_free(&r);
    stop_mock(&s);
}

/* --dataset-name sharegpt: the file's conversations in the order Python's random.shuffle gives for
 * the seed (worked out with CPython: seed 5 orders the kept entries b a e g d f; "Hi" is too short, the
 * one-turn entry was never kept), then random.choices fills up to --num-prompts (d, d). */
static void test_serve_sharegpt(void) {
    static const char data[] =
        "[{\"id\":\"a\",\"conversations\":[{\"from\":\"human\",\"value\":\"Tell me about the Roman Empire please.\"},"
        "{\"from\":\"gpt\",\"value\":\"It was large and long lived.\"}]},"
        "{\"id\":\"b\",\"conversations\":[{\"from\":\"human\",\"value\":\"Hi\"},{\"from\":\"gpt\",\"value\":\"Hello there, how can I help?\"}]},"
        "{\"id\":\"c\",\"conversations\":[{\"from\":\"human\",\"value\":\"Only one turn here, no answer.\"}]},"
        "{\"id\":\"d\",\"conversations\":[{\"from\":\"human\",\"value\":\"Why do cats like boxes so much?\"},"
        "{\"from\":\"gpt\",\"value\":\"Boxes feel safe and warm to them.\"}]},"
        "{\"id\":\"e\",\"conversations\":[{\"from\":\"human\",\"value\":\"Write a haiku about autumn leaves.\"},"
        "{\"from\":\"gpt\",\"value\":\"Red leaves drift and fall, quiet wind.\"}]},"
        "{\"id\":\"f\",\"conversations\":[{\"from\":\"human\",\"value\":\"How far away is the Moon from Earth?\"},"
        "{\"from\":\"gpt\",\"value\":\"About 384,400 kilometres on average.\"}]},"
        "{\"id\":\"g\",\"conversations\":[{\"from\":\"human\",\"value\":\"Name three primary colours for painting.\"},"
        "{\"from\":\"gpt\",\"value\":\"Red, yellow and blue are the usual three.\"},{\"from\":\"human\",\"value\":\"Thanks\"}]}]";
    static const char *const expect[] = {"Tell me about the Roman Empire please.", "Write a haiku about autumn leaves.",
                                         "Name three primary colours for painting.", "Why do cats like boxes so much?",
                                         "How far away is the Moon from Earth?", "Why do cats like boxes so much?",
                                         "Why do cats like boxes so much?"};
    tu_write_file(tmp, "sharegpt.json", data, sizeof data - 1);
    char *path = cv_xasprintf("%s/sharegpt.json", tmp);
    server s = start_mock("sharegpt", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
    tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--dataset-name", "sharegpt", "--dataset-path", path,
                                           "--num-prompts", "7", "--seed", "5", "--max-concurrency", "1", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    check_row(r.out, "Successful requests:", "7");
    json_t *reqs = logged_requests(s.log);
    CHECK_EQ_INT(json_array_size(reqs), 7);
    for (size_t i = 0; i < json_array_size(reqs) && i < 7; i++) {
        const json_t *b = json_array_get(reqs, i);
        CHECK_STR_EQ(json_string_value(json_object_get(b, "prompt")), expect[i]);
        CHECK(json_integer_value(json_object_get(b, "max_tokens")) >= 4); /* the answer's own length */
        CHECK(json_object_get(b, "ignore_eos") == NULL);                  /* forced for random data only */
    }
    json_decref(reqs);
    tu_run_free(&r);
    stop_mock(&s);
    r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                    "--dataset-name", "sharegpt", "--dataset-path", "/nonexistent.json", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "sharegpt dataset /nonexistent.json");
    tu_run_free(&r);
    free(path);
}

/* --dataset-name custom: the .jsonl file's prompts in the order Python's random.shuffle gives for
 * the seed (CPython: seed 7 orders a b c d as d b a c), random.choices filling up to --num-prompts
 * (b, d), each sent as the chat template's rendering of it as a user message; then as they are
 * (--skip-chat-template), in file order (--disable-shuffle), four only (--no-oversample); and
 * spec_bench, the same from Spec-Bench's lines. */
static void test_serve_custom(void) {
    static const char data[] = "{\"prompt\": \"alpha one\"}\n{\"prompt\": \"beta two\", \"id\": 2}\n\n"
                               "{\"prompt\": \"gamma three\"}\n{\"prompt\": \"delta four\"}\n";
    tu_write_file(tmp, "custom.jsonl", data, sizeof data - 1);
    char *path = cv_xasprintf("%s/custom.jsonl", tmp);
    server s = start_mock("custom", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
    tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--dataset-name", "custom", "--dataset-path", path,
                                           "--num-prompts", "6", "--seed", "7", "--custom-output-len", "5",
                                           "--max-concurrency", "1", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    static const char *const shuffled[] = {"delta four", "beta two", "alpha one", "gamma three", "beta two", "delta four"};
    json_t *reqs = logged_requests(s.log);
    CHECK_EQ_INT(json_array_size(reqs), 6);
    for (size_t i = 0; i < json_array_size(reqs) && i < 6; i++) {
        const json_t *b = json_array_get(reqs, i);
        char *want = cv_xasprintf("<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", shuffled[i]);
        CHECK_STR_EQ(json_string_value(json_object_get(b, "prompt")), want);
        free(want);
        CHECK_EQ_INT(json_integer_value(json_object_get(b, "max_tokens")), 5);
    }
    json_decref(reqs);
    tu_run_free(&r);
    stop_mock(&s);

    static const char *const in_order[] = {"alpha one", "beta two", "gamma three", "delta four"};
    s = start_mock("custom-raw", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
    r = bench((const char *const[]){"serve", "--port", s.port, "--dataset-name", "custom", "--dataset-path", path,
                                    "--num-prompts", "6", "--skip-chat-template", "--disable-shuffle", "--no-oversample",
                                    "--max-concurrency", "1", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    check_row(r.out, "Successful requests:", "4");
    reqs = logged_requests(s.log);
    CHECK_EQ_INT(json_array_size(reqs), 4);
    for (size_t i = 0; i < json_array_size(reqs) && i < 4; i++) {
        const json_t *b = json_array_get(reqs, i);
        CHECK_STR_EQ(json_string_value(json_object_get(b, "prompt")), in_order[i]);
        CHECK_EQ_INT(json_integer_value(json_object_get(b, "max_tokens")), 256); /* vLLM's default */
    }
    json_decref(reqs);
    tu_run_free(&r);
    stop_mock(&s);

    /* spec_bench: Spec-Bench's lines, the first turn of one category's */
    static const char spec[] = "{\"question_id\": 1, \"category\": \"coding\", \"turns\": [\"Write code A\", \"More\"]}\n"
                               "{\"question_id\": 2, \"category\": \"qa\", \"turns\": [\"What is B?\"]}\n"
                               "{\"question_id\": 3, \"category\": \"coding\", \"turns\": [\"Write code C\"]}\n";
    tu_write_file(tmp, "question.jsonl", spec, sizeof spec - 1);
    char *questions = cv_xasprintf("%s/question.jsonl", tmp);
    s = start_mock("spec-bench", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
    r = bench((const char *const[]){"serve", "--port", s.port, "--dataset-name", "spec_bench", "--dataset-path",
                                    questions, "--spec-bench-category", "coding", "--spec-bench-output-len", "9",
                                    "--num-prompts", "2", "--skip-chat-template", "--disable-shuffle",
                                    "--max-concurrency", "1", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    reqs = logged_requests(s.log);
    CHECK_EQ_INT(json_array_size(reqs), 2);
    static const char *const coding[] = {"Write code A", "Write code C"};
    for (size_t i = 0; i < json_array_size(reqs) && i < 2; i++) {
        const json_t *b = json_array_get(reqs, i);
        CHECK_STR_EQ(json_string_value(json_object_get(b, "prompt")), coding[i]);
        CHECK_EQ_INT(json_integer_value(json_object_get(b, "max_tokens")), 9);
    }
    json_decref(reqs);
    tu_run_free(&r);
    stop_mock(&s);
    free(questions);

    /* the file's problems, one line each */
    static const char no_prompt[] = "{\"prompt\": \"fine\"}\n{\"text\": \"no prompt key\"}\n";
    tu_write_file(tmp, "bad.jsonl", no_prompt, sizeof no_prompt - 1);
    char *bad = cv_xasprintf("%s/bad.jsonl", tmp);
    r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                    "--dataset-name", "custom", "--dataset-path", bad, NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "line 2: JSONL file must contain a 'prompt' column");
    tu_run_free(&r);
    r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                    "--dataset-name", "custom", "--dataset-path", "prompts.json", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "Only JSONL format is supported for CustomDataset.");
    tu_run_free(&r);
    r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                    "--dataset-name", "spec_bench", "--dataset-path", bad, NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "line 1: JSONL file must contain a 'turns' column");
    tu_run_free(&r);
    free(bad);
    free(path);
}

/* --dataset-name sonnet: the lines of a file after vLLM's instruction, the file's first lines shared by
 * every prompt, the rest drawn, each prompt within --sonnet-input-len tokens of the chat template's
 * rendering, which the completions API is sent (the chat API gets the bare prompt); the same seed
 * draws the same prompts; an input length below the instruction's own is vLLM's error. */
static void test_serve_sonnet(void) {
    char poem[2048] = "";
    for (int i = 0; i < 14; i++) {
        char line[96];
        snprintf(line, sizeof line, "Line %d of the sonnet, with words that rhyme %s\n", i, i % 2 ? "anew" : "in time");
        strcat(poem, line);
    }
    tu_write_file(tmp, "sonnet.txt", poem, strlen(poem));
    char *path = cv_xasprintf("%s/sonnet.txt", tmp);
    const char *args[] = {"serve", "--port", NULL, "--dataset-name", "sonnet", "--dataset-path", path, "--num-prompts", "3",
                          "--sonnet-input-len", "140", "--sonnet-prefix-len", "70", "--sonnet-output-len", "7",
                          "--seed", "3", "--max-concurrency", "1", NULL, NULL, NULL, NULL, NULL};
    json_t *runs[2];
    for (int k = 0; k < 2; k++) {
        server s = start_mock(k ? "sonnet-again" : "sonnet", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
        args[2] = s.port;
        tu_run r = bench(args);
        CHECK_MSG(r.status == 0, "%s", r.err);
        runs[k] = logged_requests(s.log);
        tu_run_free(&r);
        stop_mock(&s);
    }
    static const char head[] = "<|im_start|>user\nPick as many lines as you can from these poem lines:\nLine 0 of the sonnet";
    cvllm_tokenizer *tok = NULL;
    CHECK(cvllm_tokenizer_create(QWEN_TOKENIZER, &tok) == CVLLM_OK);
    CHECK_EQ_INT(json_array_size(runs[0]), 3);
    for (size_t i = 0; i < json_array_size(runs[0]); i++) {
        const json_t *b = json_array_get(runs[0], i);
        const char *prompt = json_string_value(json_object_get(b, "prompt"));
        CHECK_MSG(prompt && !strncmp(prompt, head, sizeof head - 1), "prompt %zu: %.120s", i, prompt ? prompt : "");
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tok && prompt && cvllm_tokenize(tok, prompt, strlen(prompt), &ids, &n) == CVLLM_OK);
        CHECK_MSG(n > 70 && n <= 140, "prompt %zu: %zu tokens", i, n);
        cvllm_free(ids);
        CHECK_EQ_INT(json_integer_value(json_object_get(b, "max_tokens")), 7);
    }
    CHECK(json_equal(runs[0], runs[1]));
    json_decref(runs[0]);
    json_decref(runs[1]);
    cvllm_tokenizer_destroy(tok);
    server s = start_mock("sonnet-chat", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
    args[2] = s.port;
    args[17] = "--backend";
    args[18] = "openai-chat";
    args[19] = "--endpoint";
    args[20] = "/v1/chat/completions";
    tu_run r = bench(args);
    CHECK_MSG(r.status == 0, "%s", r.err);
    json_t *chat = logged_requests(s.log);
    const json_t *msg = json_array_get(json_object_get(json_array_get(chat, 0), "messages"), 0);
    const char *content = json_string_value(json_object_get(msg, "content"));
    CHECK_MSG(content && !strncmp(content, "Pick as many lines", 18), "%.120s", content ? content : "(none)");
    json_decref(chat);
    tu_run_free(&r);
    stop_mock(&s);
    r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER, "--dataset-name",
                                    "sonnet", "--dataset-path", path, "--sonnet-input-len", "5", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "'input_len' must be higher than the base prompt length");
    tu_run_free(&r);
    free(path);
}

/* BurstGPT's trace: GPT-4's rows with a response (three here), request and response token counts. */
static const char burst_csv[] = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                "5,ChatGPT,40,30,70,Conversation log\n"
                                "6,GPT-4,12,5,17,Conversation log\n"
                                "9,GPT-4,20,0,20,Conversation log\n"
                                "12,GPT-4,7,9,16,API log\n"
                                "15,GPT-4,16,3,19,Conversation log\n";

/* --dataset-name burstgpt: the three rows drawn once each for three prompts (their response tokens as
 * max_tokens), with replacement for more; a file without the columns is refused. */
static void test_serve_burstgpt(void) {
    tu_write_file(tmp, "burst.csv", burst_csv, sizeof burst_csv - 1);
    char *path = cv_xasprintf("%s/burst.csv", tmp);
    for (int k = 0; k < 2; k++) {
        server s = start_mock(k ? "burst-more" : "burst", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
        tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--dataset-name", "burstgpt", "--dataset-path",
                                               path, "--num-prompts", k ? "8" : "3", "--max-concurrency", "2", NULL});
        CHECK_MSG(r.status == 0, "%s", r.err);
        json_t *reqs = logged_requests(s.log);
        CHECK_EQ_INT(json_array_size(reqs), k ? 8 : 3);
        int seen[10] = {0};
        for (size_t i = 0; i < json_array_size(reqs); i++) {
            const json_t *b = json_array_get(reqs, i);
            const json_int_t max = json_integer_value(json_object_get(b, "max_tokens"));
            CHECK_MSG(max == 5 || max == 9 || max == 3, "max_tokens %lld", (long long)max);
            if (max >= 0 && max < 10) seen[max]++;
            CHECK(json_string_length(json_object_get(b, "prompt")) > 0);
        }
        if (!k) CHECK(seen[5] == 1 && seen[9] == 1 && seen[3] == 1);
        json_decref(reqs);
        tu_run_free(&r);
        stop_mock(&s);
    }
    tu_write_file(tmp, "not-burst.csv", "a,b\n1,2\n", 8);
    char *bad = cv_xasprintf("%s/not-burst.csv", tmp);
    tu_run r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                           "--dataset-name", "burstgpt", "--dataset-path", bad, NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "the header lacks a Model, Request tokens or Response tokens column");
    tu_run_free(&r);
    free(bad);
    free(path);
}

/* --dataset-name prefix_repetition: 3 prefixes × ⌊7 / 3⌋ suffixes = 6 requests, each 12 + 5 tokens,
 * each prefix's text opening two of them; the output length as asked, ignore_eos not forced. */
static void test_serve_prefix_repetition(void) {
    server s = start_mock("repetition", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
    tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--dataset-name", "prefix_repetition",
                                           "--num-prompts", "7", "--prefix-repetition-prefix-len", "12",
                                           "--prefix-repetition-suffix-len", "5", "--prefix-repetition-num-prefixes", "3",
                                           "--prefix-repetition-output-len", "4", "--max-concurrency", "2", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    check_row(r.out, "Successful requests:", "6");
    json_t *reqs = logged_requests(s.log);
    CHECK_EQ_INT(json_array_size(reqs), 6);
    cvllm_tokenizer *tok = NULL;
    CHECK(cvllm_tokenizer_create(QWEN_TOKENIZER, &tok) == CVLLM_OK);
    int32_t prefixes[6][12];
    for (size_t i = 0; tok && i < json_array_size(reqs) && i < 6; i++) {
        const json_t *b = json_array_get(reqs, i);
        const char *prompt = json_string_value(json_object_get(b, "prompt"));
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(prompt && cvllm_tokenize(tok, prompt, strlen(prompt), &ids, &n) == CVLLM_OK);
        CHECK_MSG(n >= 15 && n <= 19, "request %zu: %zu tokens, about 17 expected", i, n);
        memcpy(prefixes[i], ids, sizeof prefixes[i]);
        cvllm_free(ids);
        CHECK_EQ_INT(json_integer_value(json_object_get(b, "max_tokens")), 4);
        CHECK(json_object_get(b, "ignore_eos") == NULL);
    }
    for (int i = 0; i < 6; i++) { /* each 12-token opening is another request's too, and one request's only */
        int same = 0;
        for (int j = 0; j < 6; j++) same += j != i && !memcmp(prefixes[i], prefixes[j], sizeof prefixes[i]);
        CHECK_MSG(same == 1, "request %d shares its prefix with %d others, 1 expected", i, same);
    }
    cvllm_tokenizer_destroy(tok);
    json_decref(reqs);
    tu_run_free(&r);
    stop_mock(&s);
    r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                    "--dataset-name", "prefix_repetition", "--num-prompts", "2", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "num_requests (2) must be greater than or equal to num_prefixes (10)");
    tu_run_free(&r);
}

/* --lora-modules: each request names an adapter, as vLLM assigns them: random.choice from Python's
 * generator seeded with --seed (the random dataset leaves that generator alone), or round-robin. */
static void test_serve_lora_modules(void) {
    /* CPython 3.11: random.seed(5); [random.choice(["a", "b", "c"]) for _ in range(7)] */
    static const char *const by_choice[] = {"c", "b", "c", "b", "c", "c", "c"};
    static const char *const modes[] = {"random", "round-robin"};
    for (int k = 0; k < 2; k++) {
        server s = start_mock(k ? "lora-rr" : "lora", (const char *const[]){"--ttft-ms", "2", "--itl-ms", "1", NULL});
        tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--num-prompts", "7", "--random-input-len", "8",
                                               "--random-output-len", "2", "--seed", "5", "--max-concurrency", "1",
                                               "--lora-modules", "a", "b", "c", "--lora-assignment", modes[k], NULL});
        CHECK_MSG(r.status == 0, "%s", r.err);
        json_t *reqs = logged_requests(s.log);
        CHECK_EQ_INT(json_array_size(reqs), 7);
        for (size_t i = 0; i < json_array_size(reqs) && i < 7; i++) {
            const char *want = k ? (const char *const[]){"a", "b", "c"}[i % 3] : by_choice[i];
            CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(reqs, i), "model")), want);
        }
        json_decref(reqs);
        tu_run_free(&r);
        stop_mock(&s);
    }
    tu_run r = bench((const char *const[]){"serve", "--port", "1", "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                           "--lora-modules", "a", "--lora-assignment", "sticky", NULL});
    CHECK_EQ_INT(r.status, 2);
    CHECK_CONTAINS(r.err, "argument --lora-assignment: invalid choice: 'sticky' (choose from 'random', 'round-robin')");
    tu_run_free(&r);
}

static void test_serve_chat_without_usage(void) {
    server s = start_mock("chat", (const char *const[]){"--ttft-ms", "20", "--itl-ms", "5", "--no-usage", "--ping",
                                                         "--fail-every", "3", NULL});
    char *url = cv_xasprintf("http://127.0.0.1:%s/", s.port);
    tu_run r = bench((const char *const[]){
        "serve", "--base-url", url, "--endpoint", "/v1/chat/completions", "--model", "/some/where/My-Model",
        "--served-model-name", "served", "--tokenizer", QWEN_TOKENIZER, "--num-prompts", "6",
        "--input-len", "12", "--output-len", "4", "--extra-body", "{\"top_k\": 5}", "--save-result",
        "--result-dir", tmp, NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "WARNING: vllm bench serve no longer sets temperature==0");
    CHECK_CONTAINS(r.out, "Failed requests during benchmark run detected (capping to 10):\nError 0: HTTP 500: ");
    check_row(r.out, "Successful requests:", "4");
    check_row(r.out, "Failed requests:", "2");
    check_row(r.out, "Total generated tokens:", "16"); /* " hello" x 4, re-tokenized: 4 tokens each */
    CHECK(block_line(r.out, "Maximum request concurrency:") == NULL);
    CHECK(line_of(r.out, "Request rate configured (RPS):") == NULL);
    CHECK(line_of(r.out, "Request goodput (req/s):") == NULL);
    CHECK(line_of(r.out, "Mean E2EL (ms):") == NULL); /* not in the default ttft,tpot,itl */
    double ttft = row_value(r.out, "Mean TTFT (ms):");
    CHECK_MSG(ttft >= 19 && ttft < 1000, "TTFT %g: the role-only chunk must not count", ttft);

    /* vLLM's default name: {label}-{rate}qps-{model basename}-{date}.json */
    char *cmd = cv_xasprintf("ls %s | grep -c '^openai-infqps-My-Model-[0-9]\\{8\\}-[0-9]\\{6\\}\\.json$' >/dev/null", tmp);
    CHECK_MSG(system(cmd) == 0, "no result file named openai-infqps-My-Model-<date>.json in %s", tmp);
    free(cmd);

    json_t *reqs = logged_requests(s.log);
    CHECK_EQ_INT(json_array_size(reqs), 6);
    const json_t *b = json_array_get(reqs, 1);
    CHECK_STR_EQ(json_string_value(json_object_get(b, "model")), "served");
    const json_t *msg = json_array_get(json_object_get(b, "messages"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(msg, "role")), "user");
    CHECK(json_is_string(json_object_get(msg, "content")));
    CHECK(json_integer_value(json_object_get(b, "max_completion_tokens")) == 4);
    CHECK(json_integer_value(json_object_get(b, "top_k")) == 5);
    json_decref(reqs);
    tu_run_free(&r);
    free(url);
    stop_mock(&s);
}

static void test_serve_failures(void) {
    server s = start_mock("errors", (const char *const[]){"--ttft-ms", "5", "--itl-ms", "1", "--stream-error-every", "2", NULL});
    tu_run r = bench((const char *const[]){"serve", "--port", s.port, "--num-prompts", "4", "--random-input-len", "8",
                                           "--random-output-len", "3", "--num-warmups", "1", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Warming up with 1 requests...\nWarmup run completed.\n");
    CHECK_CONTAINS(r.out, "server error in stream: mock stream error");
    CHECK(row_value(r.out, "Failed requests:") == 2);
    tu_run_free(&r);
    stop_mock(&s);

    /* nothing listens there: every request fails, the exit status says so */
    r = bench((const char *const[]){"serve", "--port", s.port, "--model", "m", "--tokenizer", QWEN_TOKENIZER,
                                    "--num-prompts", "2", "--random-input-len", "4", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "cvllm bench serve: all 2 requests failed");
    CHECK_CONTAINS(r.out, "Error 1: ");
    tu_run_free(&r);
    r = bench((const char *const[]){"serve", "--port", s.port, "--num-prompts", "2", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "/v1/models");
    tu_run_free(&r);

    static const struct {
        const char *args[12], *message;
    } usage[] = {
        {{"serve", "--bogus"}, "unknown option --bogus"},
        {{"serve", "--dataset-name", "hf"}, "--dataset-name hf is not supported"},
        {{"serve", "--dataset-name", "burstgpt"}, "the 'burstgpt' dataset needs --dataset-path"},
        {{"serve", "--dataset-name", "sharegpt"}, "the 'sharegpt' dataset needs --dataset-path"},
        {{"serve", "--dataset-name", "custom"}, "the 'custom' dataset needs --dataset-path"},
        {{"serve", "--dataset-name", "spec_bench"}, "the 'spec_bench' dataset needs --dataset-path"},
        {{"serve", "--dataset-name", "sonnet"}, "the 'sonnet' dataset needs --dataset-path"},
        {{"serve", "--dataset-name", "random", "--dataset-path", "x.jsonl"}, "cannot use the 'random' dataset with"},
        {{"serve", "--prefix-repetition-num-prefixes", "0"}, "--prefix-repetition-num-prefixes must be in"},
        {{"serve", "--profile"}, "--profile is not supported: it drives vLLM's torch profiler"},
        {{"serve", "--tokenizer-mode", "fast"}, "argument --tokenizer-mode: invalid choice: 'fast'"},
        {{"serve", "--endpoint", "/v1/embeddings"}, "--endpoint /v1/embeddings"},
        {{"serve", "--max-concurrency", "0"}, "--max-concurrency must be in"},
        {{"serve", "--request-rate", "fast"}, "--request-rate expects a number"},
        {{"serve", "--goodput", "latency:5"}, "unknown metric 'latency'"},
        {{"serve", "--percentile-metrics", "ttft,foo"}, "unknown metric 'foo'"},
        {{"serve", "--metric-percentiles", "101"}, "--metric-percentiles must be in"},
        {{"serve", "--header", "novalue"}, "--header 'novalue': use KEY=VALUE"},
        {{"serve", "--extra-body", "[1]"}, "--extra-body must be a JSON object"},
        {{"serve", "--backend", "tgi"}, "--backend tgi is not supported"},
        {{"serve", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4", "--request-rate",
          "2"},
         "When using ramp-up, do not specify --request-rate."},
        {{"serve", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"}, "both --ramp-up-start-rps and"},
        {{"serve", "--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "4"},
         "For exponential ramp-up, the start RPS cannot be 0."},
        {{"serve", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "4"},
         "Ramp-up start RPS must be less than end RPS"},
        {{"serve", "--ramp-up-strategy", "step", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4"}, "invalid choice: 'step'"},
        {{"throughput", "--model", "x"}, "--input-len must be provided"},
        {{"throughput", "--model", "x", "--input-len", "4", "--dataset-name", "hf"}, "not supported"},
        {{"throughput", "--model", "x", "--dataset-name", "sonnet"}, "the 'sonnet' dataset needs --dataset-path"},
        {{"nonsense"}, "unknown benchmark 'nonsense'"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(usage); i++) {
        r = bench(usage[i].args);
        CHECK_MSG(r.status == 2, "%s: status %d", usage[i].message, r.status);
        CHECK_CONTAINS(r.err, usage[i].message);
        tu_run_free(&r);
    }
    r = bench((const char *const[]){"serve", "--help", NULL});
    CHECK(r.status == 0);
    CHECK_CONTAINS(r.out, "usage: cvllm bench serve");
    tu_run_free(&r);
}

static void test_throughput(const char *model) {
    char *out = cv_xasprintf("%s/throughput.json", tmp);
    tu_run r = bench((const char *const[]){"throughput", "--model", model, "--input-len", "16", "--output-len", "4",
                                           "--num-prompts", "8", "--n", "2", "--max-model-len", "64",
                                           "--output-json", out, NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    double req_s = 0, total_s = 0, out_s = 0;
    const char *line = line_of(r.out, "Throughput: ");
    CHECK(line && sscanf(line, "Throughput: %lf requests/s, %lf total tokens/s, %lf output tokens/s", &req_s,
                         &total_s, &out_s) == 3);
    CHECK_CONTAINS(r.out, "\nTotal num prompt tokens:  128\nTotal num output tokens:  64\n");
    json_t *j = load_json(out);
    CHECK(num(j, "num_requests") == 8 && num(j, "total_num_tokens") == 192);
    double elapsed = num(j, "elapsed_time");
    CHECK(elapsed > 0 && fabs(num(j, "requests_per_second") - 8 / elapsed) < 1e-9);
    CHECK(fabs(num(j, "tokens_per_second") - 192 / elapsed) < 1e-9);
    CHECK(fabs(req_s - 8 / elapsed) < 0.01 * req_s + 0.01);
    json_decref(j);
    tu_run_free(&r);

    r = bench((const char *const[]){"throughput", "--model", model, "--input-len", "16", "--output-len", "4",
                                    "--num-prompts", "6", "--random-range-ratio", "0.5", "--prefix-len", "3",
                                    "--seed", "9", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    const char *p = line_of(r.out, "Total num prompt tokens:");
    long prompt_tokens = p ? atol(p + 24) : 0;
    CHECK_MSG(prompt_tokens >= 6 * 11 && prompt_tokens <= 6 * 27, "%ld prompt tokens", prompt_tokens);
    tu_run_free(&r);

    /* beam search: each prompt's tokens and its best sequence's */
    r = bench((const char *const[]){"throughput", "--model", model, "--input-len", "16", "--output-len", "4",
                                    "--num-prompts", "3", "--n", "2", "--use-beam-search", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "\nTotal num prompt tokens:  48\nTotal num output tokens:  12\n");
    tu_run_free(&r);
    r = bench((const char *const[]){"throughput", "--model", model, "--input-len", "16", "--output-len", "4",
                                    "--num-prompts", "6", "--random-range-ratio", "0.5", "--use-beam-search", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "beam search needs one output length for every request");
    tu_run_free(&r);

    /* a ShareGPT file (test_serve_sharegpt's) on the same shape with the whole vocabulary, dummy weights:
     * 7 prompts of 7-8 tokens, 6 output tokens each */
    char *full = tu_model_dir("qwen3-dense-f32"), *cfg = cv_xasprintf("%s/config.json", full);
    json_t *c = json_load_file(cfg, 0, NULL);
    json_object_set_new(c, "vocab_size", json_integer(151936));
    unlink(cfg);
    CHECK(json_dump_file(c, cfg, 0) == 0);
    json_decref(c);
    char *data = cv_xasprintf("%s/sharegpt.json", tmp);
    r = bench((const char *const[]){"throughput", "--model", full, "--load-format", "dummy", "--dataset-name", "sharegpt",
                                    "--dataset-path", data, "--num-prompts", "7", "--seed", "5", "--output-len", "6", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "\nTotal num output tokens:  42\n");
    const char *pt = line_of(r.out, "Total num prompt tokens:");
    CHECK_MSG(pt && atol(pt + 24) >= 7 * 6 && atol(pt + 24) <= 7 * 10, "%s", pt ? pt : "no prompt tokens line");
    tu_run_free(&r);
    r = bench((const char *const[]){"throughput", "--model", full, "--dataset-name", "sharegpt", NULL});
    CHECK_EQ_INT(r.status, 2);
    CHECK_CONTAINS(r.err, "the 'sharegpt' dataset needs --dataset-path");
    tu_run_free(&r);
    /* sonnet on the same model: the chat template's rendering, within --input-len, --output-len each */
    char poem[1024] = "";
    for (int i = 0; i < 10; i++) {
        char verse[80];
        snprintf(verse, sizeof verse, "Shall I compare thee, line %d, to a summer's day?\n", i);
        strcat(poem, verse);
    }
    tu_write_file(tmp, "poem.txt", poem, strlen(poem));
    char *poem_path = cv_xasprintf("%s/poem.txt", tmp);
    r = bench((const char *const[]){"throughput", "--model", full, "--load-format", "dummy", "--dataset-name", "sonnet",
                                    "--dataset-path", poem_path, "--num-prompts", "3", "--input-len", "90",
                                    "--output-len", "5", "--prefix-len", "40", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "\nTotal num output tokens:  15\n");
    pt = line_of(r.out, "Total num prompt tokens:");
    CHECK_MSG(pt && atol(pt + 24) > 3 * 40 && atol(pt + 24) <= 3 * 90, "%s", pt ? pt : "no prompt tokens line");
    tu_run_free(&r);
    free(poem_path);
    tu_remove_tree(full);
    free(full);
    free(cfg);
    free(data);

    /* burstgpt on the 4096-token model: its three rows, 12 + 7 + 16 prompt and 5 + 9 + 3 output tokens */
    tu_write_file(tmp, "burst.csv", burst_csv, sizeof burst_csv - 1);
    char *burst = cv_xasprintf("%s/burst.csv", tmp);
    r = bench((const char *const[]){"throughput", "--model", model, "--dataset-name", "burstgpt", "--dataset-path", burst,
                                    "--num-prompts", "3", "--max-model-len", "64", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "\nTotal num prompt tokens:  35\nTotal num output tokens:  17\n");
    tu_run_free(&r);
    free(burst);

    /* prefix_repetition on the 4096-token model: 2 prefixes × ⌊7 / 2⌋ = 6 requests of 16 + 8 ids */
    r = bench((const char *const[]){"throughput", "--model", model, "--dataset-name", "prefix_repetition", "--num-prompts",
                                    "7", "--prefix-repetition-prefix-len", "16", "--prefix-repetition-suffix-len", "8",
                                    "--prefix-repetition-num-prefixes", "2", "--prefix-repetition-output-len", "4",
                                    "--max-model-len", "64", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "\nTotal num prompt tokens:  144\nTotal num output tokens:  24\n");
    tu_run_free(&r);

    r = bench((const char *const[]){"throughput", "--model", model, "--input-len", "60", "--output-len", "8",
                                    "--num-prompts", "2", "--max-model-len", "64", NULL});
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(r.err, "max_model_len is 64");
    tu_run_free(&r);
    free(out);
}

static void test_latency(const char *model) {
    char *out = cv_xasprintf("%s/latency.json", tmp);
    tu_run r = bench((const char *const[]){"latency", "--model", model, "--input-len", "8", "--output-len", "4",
                                           "--batch-size", "2", "--num-iters-warmup", "1", "--num-iters", "3",
                                           "--output-json", out, NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Avg latency: ");
    CHECK_CONTAINS(r.out, "\n10% percentile latency: ");
    CHECK_CONTAINS(r.out, "\n99% percentile latency: ");
    json_t *j = load_json(out);
    const json_t *lat = json_object_get(j, "latencies"), *pct = json_object_get(j, "percentiles");
    CHECK(json_array_size(lat) == 3);
    double lo = 1e9, hi = 0, sum = 0;
    for (size_t i = 0; i < 3; i++) {
        double v = json_number_value(json_array_get(lat, i));
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        sum += v;
    }
    CHECK(fabs(num(j, "avg_latency") - sum / 3) < 1e-12);
    CHECK(num(j, "std_latency") >= 0 && num(j, "std_latency") <= hi - lo);
    CHECK(json_number_value(json_object_get(pct, "10")) >= lo && json_number_value(json_object_get(pct, "99")) <= hi);
    CHECK(json_number_value(json_object_get(pct, "50")) <= json_number_value(json_object_get(pct, "90")));
    json_decref(j);
    tu_run_free(&r);
    /* vLLM's latency --use-beam-search: the same lines, no prefill/decode split */
    r = bench((const char *const[]){"latency", "--model", model, "--input-len", "8", "--output-len", "4",
                                    "--batch-size", "2", "--n", "3", "--num-iters-warmup", "0", "--num-iters", "2",
                                    "--use-beam-search", NULL});
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Avg latency: ");
    CHECK(strstr(r.out, "Decode throughput") == NULL);
    tu_run_free(&r);
    free(out);
}

int main(void) {
    alarm(120);
    tmp = tu_make_temp_dir();
    test_serve_completions();
    test_serve_ready_check_and_spec_decode();
    test_serve_ramp_up();
    test_serve_sharegpt();
    test_serve_custom();
    test_serve_prefix_repetition();
    test_serve_sonnet();
    test_serve_burstgpt();
    test_serve_lora_modules();
    test_serve_chat_without_usage();
    test_serve_failures();
    char *model = tu_model_dir("qwen3-dense-f32");
    test_throughput(model);
    test_latency(model);
    tu_remove_tree(model);
    free(model);
    tu_remove_tree(tmp);
    free(tmp);
    return cv_check_summary("test_bench_cli");
}
