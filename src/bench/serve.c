/*
 * serve.c — `cvllm bench serve`: vLLM's online serving benchmark against any OpenAI-compatible
 * server (vllm/benchmarks/serve.py).
 *
 * The run follows vLLM's main(): resolve the model (the first one from /v1/models when --model is
 * not given), load the tokenizer locally (--tokenizer, else the model id), build the dataset with it
 * (random, random-rerank, prefix_repetition, or from --dataset-path sharegpt, custom, spec_bench,
 * sonnet or burstgpt), turn each
 * sample into a streaming /v1/completions or /v1/chat/completions body, release
 * the requests on a Poisson/Gamma schedule through the client (client.h), and report. The API is
 * chosen by the endpoint (…/chat/completions means chat) or by --backend openai-chat. As in vLLM,
 * the random dataset turns --ignore-eos on so every request runs to its output length.
 *
 * Flags that take several values (--goodput, --header, --metadata) accept them as separate
 * arguments, as vLLM's nargs="+" does, or space-separated in one quoted argument.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "bench/arrivals.h"
#include "bench/bench.h"
#include "bench/client.h"
#include "bench/dataset.h"
#include "bench/pyrandom.h"
#include "bench/serve.h"
#include "bench/stats.h"
#include "cli/args.h"
#include "cli/args_internal.h"

typedef struct serve_args {
    serve_config c;
    const char *base_url, *host, *endpoint, *model, *served_model_name, *tokenizer;
    int64_t port;
    const char *dataset_name, *dataset_path;
    cv_random_dataset_options data;
    bool ignore_eos;
    const char **goodput, **header_args;
    size_t n_goodput, n_header_args;
    char **headers;                  /* "Name: value", n_headers of them */
    size_t n_headers;
    json_t *sampling;                /* sampling flags, then --extra-body on top */
    const char *extra_body;
    const char *request_id_prefix;
    int32_t num_warmups, logprobs, ready_check_timeout;
    bool ramp_start_given, ramp_end_given, metrics_given;
    int32_t sharegpt_output_len;     /* -1: each conversation's own */
    int32_t custom_output_len, spec_bench_output_len;
    int32_t sonnet_input_len, sonnet_output_len, sonnet_prefix_len;
    const char *spec_bench_category;
    bool skip_chat_template, disable_shuffle, no_oversample;
    cv_prefix_repetition_options repetition;
    const char **lora_modules;       /* --lora-modules: adapter names the requests are spread over */
    size_t n_lora_modules;
    const char *lora_assignment;     /* "random" (vLLM's default) or "round-robin" */
    int32_t random_batch_size;       /* random-rerank: documents a request */
    size_t n_samples;                /* the dataset's requests (random-rerank groups the prompts) */
} serve_args;

static const char serve_usage[] =
    "usage: cvllm bench serve [--base-url URL | --host 127.0.0.1 --port 8000] [--endpoint /v1/completions]\n"
    "                         [--backend openai|openai-chat|openai-embeddings|vllm|vllm-rerank] [--model NAME]\n"
    "                         [--served-model-name NAME] [--tokenizer MODEL]\n"
    "                         [--dataset-name random|random-rerank|prefix_repetition|sharegpt|custom|spec_bench|\n"
    "                         sonnet|burstgpt]\n"
    "                         [--dataset-path FILE] [--disable-shuffle] [--no-oversample]\n"
    "                         [--random-batch-size 1]\n"
    "                         [--sharegpt-output-len N] [--custom-output-len 256] [--skip-chat-template]\n"
    "                         [--spec-bench-output-len 256] [--spec-bench-category C]\n"
    "                         [--sonnet-input-len 550] [--sonnet-output-len 150] [--sonnet-prefix-len 200]\n"
    "                         [--prefix-repetition-prefix-len 256] [--prefix-repetition-suffix-len 256]\n"
    "                         [--prefix-repetition-num-prefixes 10] [--prefix-repetition-output-len 128]\n"
    "                         [--num-prompts 1000]\n"
    "                         [--random-input-len 1024] [--random-output-len 128] [--random-range-ratio 0]\n"
    "                         [--random-prefix-len 0] [--input-len N] [--output-len N] [--seed 0]\n"
    "                         [--request-rate inf] [--burstiness 1.0] [--max-concurrency N] [--ignore-eos]\n"
    "                         [--ramp-up-strategy linear|exponential --ramp-up-start-rps N --ramp-up-end-rps N]\n"
    "                         [--percentile-metrics ttft,tpot,itl] [--metric-percentiles 99]\n"
    "                         [--goodput ttft:MS tpot:MS e2el:MS] [--num-warmups 0] [--ready-check-timeout-sec 0]\n"
    "                         [--header K=V ...] [--temperature F] [--top-p F] [--top-k N] [--min-p F]\n"
    "                         [--frequency-penalty F] [--presence-penalty F] [--repetition-penalty F]\n"
    "                         [--logprobs N] [--extra-body JSON]\n"
    "                         [--lora-modules NAME ...] [--lora-assignment random|round-robin]\n"
    "                         [--request-id-prefix P] [--save-result] [--save-detailed] [--append-result]\n"
    "                         [--result-dir DIR] [--result-filename NAME] [--label L] [--metadata K=V ...]\n"
    "Sends --num-prompts streaming requests to an OpenAI-compatible server and prints vLLM's\n"
    "\"Serving Benchmark Result\" block; --save-result writes vLLM's result JSON.\n";

static bool sampling_option(cv_args *a, serve_args *s) {
    static const char *float_flags[][2] = {
        {"--temperature", "temperature"}, {"--top-p", "top_p"}, {"--min-p", "min_p"},
        {"--frequency-penalty", "frequency_penalty"}, {"--presence-penalty", "presence_penalty"},
        {"--repetition-penalty", "repetition_penalty"},
    };
    const char *v;
    double d;
    int64_t x;
    for (size_t k = 0; k < CV_ARRAY_LEN(float_flags); k++)
        if (cv_args_value(a, float_flags[k][0], &v)) {
            if (cv_args_float(a, float_flags[k][0], v, -1e9, 1e9, &d))
                json_object_set_new(s->sampling, float_flags[k][1], json_real(d));
            return true;
        }
    if (cv_args_value(a, "--top-k", &v)) {
        if (cv_args_int(a, "--top-k", v, -1, INT32_MAX, &x)) json_object_set_new(s->sampling, "top_k", json_integer(x));
        return true;
    }
    return false;
}

static bool parse_metric_list(cv_args *a, const char *list, serve_config *c) {
    memset(c->metric_selected, 0, sizeof c->metric_selected);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        int k = cv_metric_find(p, len);
        if (k < 0) {
            cv_args_error(a, "--percentile-metrics: unknown metric '%.*s' (ttft, tpot, itl, e2el, "
                             "client_queue_time, e2el_including_client_queue)", (int)len, p);
            return false;
        }
        c->metric_selected[k] = true;
        p += len + (p[len] == ',');
    }
    return true;
}

static bool parse_percentiles(cv_args *a, const char *list, serve_config *c) {
    free(c->percentiles);
    c->percentiles = NULL;
    c->n_percentiles = 0;
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        char *item = cv_xstrndup(p, len);
        double v;
        bool ok = cv_args_float(a, "--metric-percentiles", item, 0, 100, &v);
        free(item);
        if (!ok) return false;
        c->percentiles = cv_xrealloc(c->percentiles, (c->n_percentiles + 1) * sizeof *c->percentiles);
        c->percentiles[c->n_percentiles++] = v;
        p += len + (p[len] == ',');
    }
    if (!c->n_percentiles) cv_args_error(a, "--metric-percentiles needs at least one number");
    return c->n_percentiles > 0;
}

static bool string_option(cv_args *a, const char *name, const char **out) {
    const char *v;
    if (!cv_args_value(a, name, &v)) return false;
    if (v) *out = v;
    return true;
}

static bool rate_option(cv_args *a, const char *name, double *out) {
    const char *v;
    if (!cv_args_value(a, name, &v)) return false;
    double d;
    if (cv_args_float(a, name, v, 1e-12, INFINITY, &d)) *out = d;
    return true;
}

static bool flag_option(cv_args *a, const char *name, bool *out) {
    if (!cv_args_flag(a, name)) return false;
    *out = true;
    return true;
}

/* Flags vLLM has that change nothing here: a progress bar we do not draw, remote code we never run,
 * one tokenizer implementation. */
static const cv_ignored_flag ignored_flags[] = {
    {"--disable-tqdm", CV_IGNORED_SWITCH, NULL},
    {"--trust-remote-code", CV_IGNORED_SWITCH, NULL},
    {"--tokenizer-mode", CV_IGNORED_CHOICE, (const char *const[]){"auto", "hf", "slow", "mistral", "custom", NULL}},
};

/* Flags whose function this client lacks. */
static const cv_refused_flag refused_flags[] = {
    {"--profile", "it drives vLLM's torch profiler (/start_profile, /stop_profile), which cvllm serve does not have"},
};

static bool parse_option(cv_args *a, serve_args *s) {
    serve_config *c = &s->c;
    const char *v = NULL;
    int64_t x;
    if (string_option(a, "--backend", &c->backend) || string_option(a, "--base-url", &s->base_url) ||
        string_option(a, "--host", &s->host) || string_option(a, "--endpoint", &s->endpoint) ||
        string_option(a, "--model", &s->model) || string_option(a, "--served-model-name", &s->served_model_name) ||
        string_option(a, "--tokenizer", &s->tokenizer) || string_option(a, "--dataset-name", &s->dataset_name) ||
        string_option(a, "--dataset-path", &s->dataset_path) || string_option(a, "--label", &c->label) ||
        string_option(a, "--result-dir", &c->result_dir) || string_option(a, "--result-filename", &c->result_filename) ||
        string_option(a, "--extra-body", &s->extra_body) || string_option(a, "--request-id-prefix", &s->request_id_prefix) ||
        string_option(a, "--ramp-up-strategy", &c->ramp_up_strategy) ||
        string_option(a, "--lora-assignment", &s->lora_assignment) ||
        string_option(a, "--spec-bench-category", &s->spec_bench_category))
        return true;
    if (cv_args_int32_option(a, "--num-prompts", 1, INT32_MAX, &c->num_prompts) ||
        cv_args_int32_option(a, "--max-concurrency", 1, INT32_MAX, &c->max_concurrency) ||
        cv_args_int32_option(a, "--random-input-len", 0, INT32_MAX, &s->data.input_len) ||
        cv_args_int32_option(a, "--input-len", 0, INT32_MAX, &s->data.input_len) ||
        cv_args_int32_option(a, "--random-output-len", 1, INT32_MAX, &s->data.output_len) ||
        cv_args_int32_option(a, "--sharegpt-output-len", 1, INT32_MAX, &s->sharegpt_output_len) ||
        cv_args_int32_option(a, "--custom-output-len", 1, INT32_MAX, &s->custom_output_len) ||
        cv_args_int32_option(a, "--spec-bench-output-len", 1, INT32_MAX, &s->spec_bench_output_len) ||
        cv_args_int32_option(a, "--sonnet-input-len", 1, INT32_MAX, &s->sonnet_input_len) ||
        cv_args_int32_option(a, "--sonnet-output-len", 1, INT32_MAX, &s->sonnet_output_len) ||
        cv_args_int32_option(a, "--sonnet-prefix-len", 0, INT32_MAX, &s->sonnet_prefix_len) ||
        cv_args_int32_option(a, "--prefix-repetition-prefix-len", 0, INT32_MAX, &s->repetition.prefix_len) ||
        cv_args_int32_option(a, "--prefix-repetition-suffix-len", 0, INT32_MAX, &s->repetition.suffix_len) ||
        cv_args_int32_option(a, "--prefix-repetition-num-prefixes", 1, INT32_MAX, &s->repetition.num_prefixes) ||
        cv_args_int32_option(a, "--prefix-repetition-output-len", 1, INT32_MAX, &s->repetition.output_len) ||
        cv_args_int32_option(a, "--random-prefix-len", 0, INT32_MAX, &s->data.prefix_len) ||
        cv_args_int32_option(a, "--random-batch-size", 1, INT32_MAX, &s->random_batch_size) ||
        cv_args_int32_option(a, "--num-warmups", 0, INT32_MAX, &s->num_warmups) ||
        cv_args_int32_option(a, "--logprobs", 0, INT32_MAX, &s->logprobs) ||
        cv_args_int32_option(a, "--ready-check-timeout-sec", 0, INT32_MAX, &s->ready_check_timeout))
        return true;
    if (rate_option(a, "--request-rate", &c->request_rate) || rate_option(a, "--burstiness", &c->burstiness)) return true;
    if (flag_option(a, "--ignore-eos", &s->ignore_eos) || flag_option(a, "--save-result", &c->save_result) ||
        flag_option(a, "--save-detailed", &c->save_detailed) || flag_option(a, "--append-result", &c->append_result) ||
        flag_option(a, "--skip-chat-template|--custom-skip-chat-template", &s->skip_chat_template) ||
        flag_option(a, "--disable-shuffle", &s->disable_shuffle) || flag_option(a, "--no-oversample", &s->no_oversample) ||
        cv_args_ignored(a, ignored_flags, CV_ARRAY_LEN(ignored_flags)) ||
        cv_args_refused(a, refused_flags, CV_ARRAY_LEN(refused_flags)))
        return true;
    if (cv_args_list(a, "--goodput", &s->goodput, &s->n_goodput) ||
        cv_args_list(a, "--header", &s->header_args, &s->n_header_args) ||
        cv_args_list(a, "--metadata", &c->metadata, &c->n_metadata) ||
        cv_args_list(a, "--lora-modules", &s->lora_modules, &s->n_lora_modules) || sampling_option(a, s))
        return true;
    if (cv_args_value(a, "--port", &v)) {
        if (cv_args_int(a, "--port", v, 1, 65535, &x)) s->port = x;
    } else if (cv_args_value(a, "--output-len", &v)) { /* vLLM: the random and the sharegpt output length */
        if (cv_args_int(a, "--output-len", v, 1, INT32_MAX, &x)) s->data.output_len = s->sharegpt_output_len = (int32_t)x;
    } else if (cv_args_value(a, "--ramp-up-start-rps", &v)) {
        if (cv_args_int(a, "--ramp-up-start-rps", v, INT32_MIN, INT32_MAX, &x)) c->ramp_up_start_rps = x, s->ramp_start_given = true;
    } else if (cv_args_value(a, "--ramp-up-end-rps", &v)) {
        if (cv_args_int(a, "--ramp-up-end-rps", v, INT32_MIN, INT32_MAX, &x)) c->ramp_up_end_rps = x, s->ramp_end_given = true;
    } else if (cv_args_value(a, "--seed", &v)) {
        if (cv_args_int(a, "--seed", v, 0, INT64_MAX, &x)) s->data.seed = (uint64_t)x;
    } else if (cv_args_value(a, "--random-range-ratio", &v)) {
        cv_args_float(a, "--random-range-ratio", v, 0, 0.999999, &s->data.range_ratio);
    } else if (cv_args_value(a, "--percentile-metrics", &v)) {
        if (v) s->metrics_given = parse_metric_list(a, v, c);
    } else if (cv_args_value(a, "--metric-percentiles", &v)) {
        if (v) parse_percentiles(a, v, c);
    } else {
        return false;
    }
    return true;
}

/* Checks what single flags cannot: KEY=VALUE lists, the dataset, the API. */
static int validate(cv_args *a, serve_args *s) {
    serve_config *c = &s->c;
    for (size_t i = 0; i < c->n_metadata; i++)
        if (!strchr(c->metadata[i], '=') || c->metadata[i][0] == '=')
            return cv_args_error(a, "--metadata '%s': use KEY=VALUE", c->metadata[i]);
    for (size_t i = 0; i < s->n_header_args; i++) {
        const char *h = s->header_args[i], *eq = strchr(h, '=');
        if (!eq || eq == h) return cv_args_error(a, "--header '%s': use KEY=VALUE", h);
        s->headers = cv_xrealloc(s->headers, (s->n_headers + 1) * sizeof *s->headers);
        s->headers[s->n_headers++] = cv_xasprintf("%.*s: %s", (int)(eq - h), h, eq + 1);
    }
    static const char *const datasets[] = {"random", "random-rerank", "prefix_repetition", "sharegpt", "custom",
                                           "spec_bench", "sonnet", "burstgpt", NULL};
    const bool rerank_data = !strcmp(s->dataset_name, "random-rerank");
    if (!cv_args_in_list(datasets, s->dataset_name))
        return cv_args_error(a, "--dataset-name %s is not supported (random, random-rerank, prefix_repetition, "
                             "sharegpt, custom, spec_bench, sonnet, burstgpt)", s->dataset_name);
    if (strncmp(s->dataset_name, "random", 6) == 0 && s->dataset_path)
        return cv_args_error(a, "cannot use the '%s' dataset with --dataset-path %s", s->dataset_name, s->dataset_path);
    if (!strcmp(s->dataset_name, "sharegpt") && !s->dataset_path)
        return cv_args_error(a, "the 'sharegpt' dataset needs --dataset-path (e.g. ShareGPT_V3_unfiltered_cleaned_split.json)");
    if (!strcmp(s->dataset_name, "custom") && !s->dataset_path)
        return cv_args_error(a, "the 'custom' dataset needs --dataset-path (a .jsonl file of {\"prompt\": ...} lines)");
    if (!strcmp(s->dataset_name, "spec_bench") && !s->dataset_path)
        return cv_args_error(a, "the 'spec_bench' dataset needs --dataset-path (Spec-Bench's question.jsonl)");
    if (!strcmp(s->dataset_name, "sonnet") && !s->dataset_path)
        return cv_args_error(a, "the 'sonnet' dataset needs --dataset-path (vLLM's benchmarks/sonnet.txt)");
    if (!strcmp(s->dataset_name, "burstgpt") && !s->dataset_path)
        return cv_args_error(a, "the 'burstgpt' dataset needs --dataset-path (BurstGPT_without_fails_2.csv)");
    if (strcmp(s->lora_assignment, "random") && strcmp(s->lora_assignment, "round-robin"))
        return cv_args_error(a, "argument --lora-assignment: invalid choice: '%s' (choose from 'random', 'round-robin')",
                             s->lora_assignment);
    size_t n = strlen(s->endpoint);
    if (!strcmp(c->backend, "openai-chat")) c->api = CV_API_CHAT;
    else if (!strcmp(c->backend, "openai-embeddings")) c->api = CV_API_EMBEDDINGS;
    else if (!strcmp(c->backend, "vllm-rerank")) c->api = CV_API_RERANK;
    else if (!strcmp(c->backend, "openai") || !strcmp(c->backend, "vllm")) {
        c->api = n >= 16 && !strcmp(s->endpoint + n - 16, "chat/completions") ? CV_API_CHAT : CV_API_COMPLETIONS;
    } else {
        return cv_args_error(a, "--backend %s is not supported (openai, openai-chat, openai-embeddings, vllm, "
                             "vllm-rerank)", c->backend);
    }
    if ((c->api == CV_API_RERANK) != rerank_data) /* a rerank request is a query and its documents */
        return cv_args_error(a, "--backend vllm-rerank goes with --dataset-name random-rerank, and only with it");
    if (cv_bench_api_pools(c->api)) {
        const char *suffix = c->api == CV_API_RERANK ? "rerank" : "embeddings";
        const size_t k = strlen(suffix);
        if (n < k || strcmp(s->endpoint + n - k, suffix) != 0)
            return cv_args_error(a, "--endpoint %s: the %s API's URL must end with '%s' (--endpoint /v1/%s)", s->endpoint,
                                 c->api == CV_API_RERANK ? "vLLM score" : "OpenAI Embeddings", suffix, suffix);
        /* vLLM's pooling task reports end-to-end latency only: there are no tokens to time */
        if (!s->metrics_given) {
            memset(c->metric_selected, 0, sizeof c->metric_selected);
            c->metric_selected[CV_METRIC_E2EL] = true;
        }
    } else if (n < 11 || strcmp(s->endpoint + n - 11, "completions") != 0) {
        return cv_args_error(a, "--endpoint %s: expected a /v1/completions or /v1/chat/completions endpoint",
                             s->endpoint);
    }
    if (c->ramp_up_strategy) { /* vLLM's checks and words */
        if (strcmp(c->ramp_up_strategy, "linear") && strcmp(c->ramp_up_strategy, "exponential"))
            return cv_args_error(a, "argument --ramp-up-strategy: invalid choice: '%s' (choose from 'linear', 'exponential')",
                                 c->ramp_up_strategy);
        if (!isinf(c->request_rate))
            return cv_args_error(a, "When using ramp-up, do not specify --request-rate. The request rate will be "
                                    "controlled by ramp-up parameters. Please remove the --request-rate argument.");
        if (!s->ramp_start_given || !s->ramp_end_given)
            return cv_args_error(a, "When using --ramp-up-strategy, both --ramp-up-start-rps and --ramp-up-end-rps "
                                    "must be specified");
        if (c->ramp_up_start_rps < 0 || c->ramp_up_end_rps < 0)
            return cv_args_error(a, "Ramp-up start and end RPS must be non-negative");
        if (c->ramp_up_start_rps > c->ramp_up_end_rps) return cv_args_error(a, "Ramp-up start RPS must be less than end RPS");
        if (!strcmp(c->ramp_up_strategy, "exponential") && c->ramp_up_start_rps == 0)
            return cv_args_error(a, "For exponential ramp-up, the start RPS cannot be 0.");
        if (c->ramp_up_start_rps == 0) /* the first request's rate (vLLM asserts it) */
            return cv_args_error(a, "Obtained non-positive request rate 0.0.");
    }
    if (s->n_goodput) {
        size_t len = 1;
        for (size_t i = 0; i < s->n_goodput; i++) len += strlen(s->goodput[i]) + 1;
        char *spec = cv_xcalloc(1, len);
        for (size_t i = 0; i < s->n_goodput; i++) strcat(strcat(spec, s->goodput[i]), " ");
        int rc = cv_goodput_parse(spec, &c->slo);
        free(spec);
        if (rc) return cv_args_error(a, "%s", cvllm_last_error());
    }
    if (s->extra_body) {
        json_error_t err;
        json_t *extra = json_loads(s->extra_body, 0, &err);
        if (!json_is_object(extra)) {
            json_decref(extra);
            return cv_args_error(a, "--extra-body must be a JSON object%s%s", extra ? "" : ": ", extra ? "" : err.text);
        }
        json_object_update(s->sampling, extra);
        json_decref(extra);
    }
    return 0;
}

static void set_defaults(serve_args *s) {
    serve_config *c = &s->c;
    c->backend = "openai";
    c->num_prompts = 1000;
    c->request_rate = INFINITY;
    c->burstiness = 1.0;
    c->metric_selected[CV_METRIC_TTFT] = c->metric_selected[CV_METRIC_TPOT] = c->metric_selected[CV_METRIC_ITL] = true;
    c->percentiles = cv_xmalloc(sizeof *c->percentiles);
    c->percentiles[0] = 99;
    c->n_percentiles = 1;
    c->slo = (cv_goodput_slo){-1, -1, -1};
    s->host = "127.0.0.1";
    s->port = 8000;
    s->endpoint = "/v1/completions";
    s->dataset_name = "random";
    s->lora_assignment = "random";
    s->random_batch_size = 1;
    s->data.input_len = 1024;
    s->data.output_len = 128;
    s->sharegpt_output_len = -1;
    s->custom_output_len = s->spec_bench_output_len = 256;
    s->sonnet_input_len = 550;
    s->sonnet_output_len = 150;
    s->sonnet_prefix_len = 200;
    s->repetition = (cv_prefix_repetition_options){.prefix_len = 256, .suffix_len = 256, .num_prefixes = 10,
                                                   .output_len = 128};
    s->logprobs = -1;
    s->sampling = json_object();
}

static int parse_serve_args(cv_args *a, serve_args *s) {
    set_defaults(s);
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i];
        if (cv_args_flag(a, "--help|-h")) {
            fputs(serve_usage, stdout);
            return -1;
        }
        if (parse_option(a, s)) continue;
        if (arg[0] != '-' || !arg[1]) return cv_args_error(a, "unexpected argument '%s'", arg);
        if (!cv_args_unknown(a)) return 2;
    }
    if (a->failed) return 2;
    s->data.num_prompts = s->c.num_prompts;
    return validate(a, s);
}

static void free_serve_args(serve_args *s) {
    for (size_t i = 0; i < s->n_headers; i++) free(s->headers[i]);
    free(s->headers);
    free(s->goodput);
    free(s->header_args);
    free(s->lora_modules);
    free(s->c.metadata);
    free(s->c.percentiles);
    free(s->c.model_id);
    free(s->c.model_name);
    json_decref(s->sampling);
}

/* vLLM's get_first_model_from_server: data[0].id is the served name, data[0].root the model. */
static int first_model_from_server(serve_args *s, const char *base_url) {
    char *url = cv_xasprintf("%s/v1/models", base_url), *body;
    int rc = cv_bench_http_get(url, (const char *const *)s->headers, s->n_headers, &body);
    free(url);
    if (rc) return rc;
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    const json_t *first = json_array_get(json_object_get(j, "data"), 0);
    const char *id = json_string_value(json_object_get(first, "id"));
    const char *root = json_string_value(json_object_get(first, "root"));
    if (!id) rc = cv_fail(CVLLM_ERR_FORMAT, "no models found on the server at %s (/v1/models)", base_url);
    else {
        s->c.model_name = cv_xstrdup(id);
        s->c.model_id = cv_xstrdup(root ? root : id);
        printf("First model name: %s, first model id: %s\n", s->c.model_name, s->c.model_id);
    }
    json_decref(j);
    return rc;
}

/* A request for sample smp to `model` (NULL: the model benchmarked). */
static char *request_body(const serve_args *s, const cv_bench_sample *smp, const char *model) {
    json_t *p = json_object();
    json_object_set_new(p, "model", json_string(model ? model : s->c.model_name ? s->c.model_name : s->c.model_id));
    if (cv_bench_api_pools(s->c.api)) { /* vLLM's: the whole prompt, cut to the model's context by the server */
        if (s->c.api == CV_API_RERANK) {
            json_object_set_new(p, "query", json_string(smp->prompt));
            json_t *docs = json_array();
            for (int32_t k = 0; k < smp->n_docs; k++) json_array_append_new(docs, json_string(smp->docs[k]));
            json_object_set_new(p, "documents", docs);
        } else {
            json_object_set_new(p, "input", json_string(smp->prompt));
        }
        json_object_set_new(p, "truncate_prompt_tokens", json_integer(-1));
        json_object_update(p, s->sampling);
        char *text = json_dumps(p, JSON_COMPACT);
        json_decref(p);
        return text;
    }
    if (s->c.api == CV_API_COMPLETIONS) {
        json_object_set_new(p, "prompt", json_string(smp->prompt));
        json_object_set_new(p, "repetition_penalty", json_real(1.0));
        json_object_set_new(p, "max_tokens", json_integer(smp->output_len));
    } else {
        json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content", smp->prompt);
        json_object_set_new(p, "messages", json_pack("[o]", msg));
        /* both names: vLLM reads max_completion_tokens, older servers only max_tokens */
        json_object_set_new(p, "max_completion_tokens", json_integer(smp->output_len));
        json_object_set_new(p, "max_tokens", json_integer(smp->output_len));
    }
    if (s->logprobs >= 0) json_object_set_new(p, "logprobs", json_integer(s->logprobs));
    json_object_set_new(p, "stream", json_true());
    json_object_set_new(p, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (s->ignore_eos) json_object_set_new(p, "ignore_eos", json_true());
    json_object_update(p, s->sampling);
    char *text = json_dumps(p, JSON_COMPACT);
    json_decref(p);
    return text;
}

static char *random_prefix(void) {
    cv_rng rng;
    cv_rng_seed(&rng, (uint64_t)(cv_wall_now() * 1e9) ^ ((uint64_t)getpid() << 32));
    return cv_xasprintf("bench-%08llx-", (unsigned long long)(cv_rng_next(&rng) & 0xffffffffULL));
}

typedef struct workload {
    size_t n;
    char **bodies, **ids;
    double *arrivals;
    cv_request_result *results;
} workload;

static void workload_free(workload *w) {
    for (size_t i = 0; i < w->n; i++) {
        free(w->bodies[i]);
        free(w->ids[i]);
        cv_request_result_free(&w->results[i]);
    }
    free(w->bodies);
    free(w->ids);
    free(w->arrivals);
    free(w->results);
}

/* `n` requests; sample i % n_samples each (warmups repeat the first one), request i to models[i]
 * (models NULL: all to the model benchmarked). */
static void workload_init(workload *w, const serve_args *s, const cv_bench_sample *smp, size_t n_samples, size_t n,
                          const char *const *models, const char *id_prefix) {
    w->n = n;
    w->bodies = cv_xcalloc(n, sizeof *w->bodies);
    w->ids = cv_xcalloc(n, sizeof *w->ids);
    w->arrivals = cv_xcalloc(n, sizeof *w->arrivals);
    w->results = cv_xcalloc(n, sizeof *w->results);
    for (size_t i = 0; i < n; i++) {
        const cv_bench_sample *one = &smp[i % n_samples];
        w->bodies[i] = request_body(s, one, models ? models[i] : NULL);
        w->ids[i] = cv_xasprintf("%s%zu", id_prefix, i);
        cv_request_result_init(&w->results[i], one->prompt_len);
    }
}

static int run_workload(const serve_args *s, const char *url, workload *w, double *duration) {
    cv_bench_http_options o = {.url = url, .api = s->c.api, .headers = (const char *const *)s->headers,
                         .n_headers = s->n_headers, .max_concurrency = s->c.max_concurrency};
    return cv_bench_http_run(&o, w->bodies, w->ids, w->arrivals, w->n, w->results, duration);
}

static void print_traffic(const serve_config *c) {
    char rate[32], burst[32];
    cv_stats_py_float(c->request_rate, rate, sizeof rate);
    cv_stats_py_float(c->burstiness, burst, sizeof burst);
    puts("Starting main benchmark run...");
    if (c->ramp_up_strategy) {
        printf("Traffic ramp-up strategy: %s.\n", c->ramp_up_strategy);
        printf("Will increase RPS from %lld to %lld RPS over the duration of the benchmark.\n",
               (long long)c->ramp_up_start_rps, (long long)c->ramp_up_end_rps);
    } else {
        printf("Traffic request rate: %s\n", rate);
    }
    printf("Burstiness factor: %s (%s)\n", burst, c->burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
    if (c->max_concurrency) printf("Maximum request concurrency: %d\n", c->max_concurrency);
    else puts("Maximum request concurrency: None");
    fflush(stdout);
}

/* vLLM's initial test run: with --ready-check-timeout-sec N > 0 the first sample's request is sent
 * until it succeeds, every 5 s for up to N s (a server still loading refuses connections), and the
 * run stops with its error if it never does; 0 (the default) skips it. */
static int ready_check(const serve_args *s, const char *url, const cv_bench_sample *first) {
    puts("Starting initial single prompt test run...");
    if (s->ready_check_timeout <= 0) {
        puts("Skipping endpoint ready check.");
        return 0;
    }
    printf("Waiting for endpoint to become up in %d seconds\n", s->ready_check_timeout);
    fflush(stdout);
    const double deadline = cv_now() + s->ready_check_timeout;
    char *error = NULL;
    for (double remaining; (remaining = deadline - cv_now()) > 0;) {
        workload w = {0};
        workload_init(&w, s, first, 1, 1, NULL, "ready-check-");
        double duration;
        int rc = run_workload(s, url, &w, &duration);
        const bool ok = rc == 0 && w.results[0].success;
        free(error);
        error = cv_xstrdup(rc ? cvllm_last_error() : w.results[0].error ? w.results[0].error : "");
        workload_free(&w);
        if (ok) {
            free(error);
            puts("Initial test run completed.");
            return 0;
        }
        remaining = deadline - cv_now();
        if (remaining > 0) usleep((useconds_t)((remaining < 5 ? remaining : 5) * 1e6));
    }
    int rc = cv_fail(CVLLM_ERR_NETWORK, "Initial test run failed - Please make sure benchmark arguments are correctly "
                                        "specified. Error: %s", error ? error : "no request was sent");
    free(error);
    return rc;
}

static int warm_up(const serve_args *s, const char *url, const cv_bench_sample *first) {
    if (s->num_warmups <= 0) return 0;
    printf("Warming up with %d requests...\n", s->num_warmups);
    workload w = {0};
    workload_init(&w, s, first, 1, (size_t)s->num_warmups, NULL, "warmup-");
    double duration;
    int rc = run_workload(s, url, &w, &duration);
    workload_free(&w);
    if (!rc) puts("Warmup run completed.");
    return rc;
}

/* datetime.now().isoformat() of wall-clock second `t`. */
static json_t *iso_time(double t) {
    const time_t sec = (time_t)t;
    const long us = (long)((t - (double)sec) * 1e6);
    struct tm tm;
    localtime_r(&sec, &tm);
    char date[32], text[48];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
    if (us) snprintf(text, sizeof text, "%s.%06ld", date, us);
    else snprintf(text, sizeof text, "%s", date);
    return json_string(text);
}

/* vLLM's rps_change_events of a ramp-up: the start rate when the run begins, then each whole rate
 * as the first request sent at or above it goes out (sent at its scheduled time). */
static json_t *rps_change_events(const serve_config *c, const double *rates, const double *arrivals, size_t n,
                                 double wall_start) {
    json_t *events = json_array();
    long long last = c->ramp_up_start_rps;
    json_array_append_new(events, json_pack("{s:I, s:o}", "rps", (json_int_t)last, "timestamp", iso_time(wall_start)));
    for (size_t i = 0; i < n; i++) {
        const long long now = (long long)rates[i];
        for (long long r = last + 1; r <= now; r++)
            json_array_append_new(events, json_pack("{s:I, s:o}", "rps", (json_int_t)r, "timestamp",
                                                    iso_time(wall_start + arrivals[i])));
        if (now > last) last = now;
    }
    return events;
}

/* Benchmark proper: schedule, send, measure, report, save. The server's speculative-decoding
 * counters are read around the timed run (spec_stats.h). */
/* Each of the n requests' adapter as vLLM assigns them: round-robin, or random.choice from Python's
 * generator seeded with --seed (vLLM's global one, which its dataset sampling may have drawn from
 * first: the random dataset does not, so there the names come in vLLM's order); NULL without
 * --lora-modules. */
static const char **lora_models(const serve_args *s, size_t n) {
    if (!s->n_lora_modules) return NULL;
    const char **models = cv_xmalloc(n * sizeof *models);
    cv_pyrandom r;
    cv_pyrandom_seed(&r, s->data.seed);
    const bool round_robin = !strcmp(s->lora_assignment, "round-robin");
    for (size_t i = 0; i < n; i++)
        models[i] = s->lora_modules[round_robin ? i % s->n_lora_modules : cv_pyrandom_below(&r, s->n_lora_modules)];
    return models;
}

static int benchmark(serve_args *s, const char *base, const char *url, const cvllm_tokenizer *tok,
                     const cv_bench_sample *samples) {
    serve_config *c = &s->c;
    char *prefix = s->request_id_prefix ? cv_xstrdup(s->request_id_prefix) : random_prefix();
    const size_t n = s->n_samples;
    const char **models = lora_models(s, n);
    workload w = {0};
    workload_init(&w, s, samples, n, n, models, prefix);
    free(models);
    free(prefix);
    cv_rng rng;
    cv_rng_seed(&rng, s->data.seed ^ 0x9e3779b97f4a7c15ULL); /* a stream apart from the dataset's */
    double *rates = NULL;
    if (c->ramp_up_strategy) {
        rates = cv_xmalloc(w.n * sizeof *rates);
        cv_arrival_times_ramp(&rng, w.n, !strcmp(c->ramp_up_strategy, "linear") ? CV_RAMP_LINEAR : CV_RAMP_EXPONENTIAL,
                              (double)c->ramp_up_start_rps, (double)c->ramp_up_end_rps, c->burstiness, w.arrivals, rates);
    } else {
        cv_arrival_times(&rng, w.n, c->request_rate, c->burstiness, w.arrivals);
    }
    print_traffic(c);
    cv_spec_counters before, after;
    cv_spec_counters_read(base, (const char *const *)s->headers, s->n_headers, &before);
    const double wall_start = cv_wall_now();
    double duration = 0;
    int rc = run_workload(s, url, &w, &duration);
    json_t *rps_events = rates ? rps_change_events(c, rates, w.arrivals, w.n, wall_start) : NULL;
    free(rates);
    if (!rc) {
        cv_spec_counters_read(base, (const char *const *)s->headers, s->n_headers, &after);
        cv_spec_stats spec;
        const cv_spec_stats *sp = cv_spec_stats_between(&before, &after, &spec) ? &spec : NULL;
        cv_bench_metrics m;
        cv_bench_metrics_compute(w.results, w.n, duration, tok, &c->slo, &m);
        serve_print_report(c, &m, w.results, w.n, duration, sp);
        if (c->save_result || c->append_result) {
            json_t *result = serve_result_json(c, &m, w.results, w.n, duration, sp, rps_events);
            rps_events = NULL;
            rc = serve_save_result(c, result);
            json_decref(result);
        }
        if (!rc && m.completed == 0) rc = cv_fail(CVLLM_ERR_NETWORK, "all %zu requests failed", w.n);
        cv_bench_metrics_free(&m);
    }
    json_decref(rps_events);
    workload_free(&w);
    return rc;
}

static int run_serve(serve_args *s) {
    serve_config *c = &s->c;
    char *base = s->base_url ? cv_xstrdup(s->base_url) : cv_xasprintf("http://%s:%lld", s->host, (long long)s->port);
    size_t bl = strlen(base);
    if (bl && base[bl - 1] == '/') base[bl - 1] = '\0';
    char *url = cv_xasprintf("%s%s", base, s->endpoint);
    int rc = 0;
    if (s->model) {
        c->model_id = cv_xstrdup(s->model);
        c->model_name = s->served_model_name ? cv_xstrdup(s->served_model_name) : NULL;
    } else {
        puts("Model not specified, fetching first model from server...");
        rc = first_model_from_server(s, base);
    }
    cvllm_tokenizer *tok = NULL;
    cv_bench_sample *samples = NULL;
    if (!rc) {
        c->tokenizer_id = s->tokenizer ? s->tokenizer : c->model_id;
        rc = cvllm_tokenizer_create(c->tokenizer_id, &tok);
        if (rc) cv_fail_prefix(rc, "cannot load the tokenizer '%s' (give --tokenizer)", c->tokenizer_id);
    }
    const char *name = s->dataset_name;
    const bool random = !strcmp(name, "random");
    const cv_file_sampling from = {.path = s->dataset_path, .num_prompts = c->num_prompts, .seed = s->data.seed,
                                   .disable_shuffle = s->disable_shuffle, .no_oversample = s->no_oversample};
    s->n_samples = (size_t)c->num_prompts;
    if (rc) {
    } else if (random) {
        rc = cv_random_dataset(tok, &s->data, &samples);
    } else if (!strcmp(name, "random-rerank")) {
        rc = cv_random_rerank_dataset(tok, &s->data, s->random_batch_size, &samples, &s->n_samples);
    } else if (!strcmp(name, "prefix_repetition")) {
        s->repetition.num_prompts = c->num_prompts;
        s->repetition.seed = s->data.seed;
        s->repetition.disable_shuffle = s->disable_shuffle;
        rc = cv_prefix_repetition_dataset(tok, &s->repetition, &samples, &s->n_samples);
    } else if (!strcmp(name, "sonnet")) {
        /* vLLM sends the template's rendering, except to a chat API, which renders the prompt itself */
        const cv_sonnet_options so = {.path = s->dataset_path, .model = c->tokenizer_id, .num_prompts = c->num_prompts,
                                      .input_len = s->sonnet_input_len, .output_len = s->sonnet_output_len,
                                      .prefix_len = s->sonnet_prefix_len, .seed = s->data.seed,
                                      .chat_endpoint = c->api == CV_API_CHAT};
        rc = cv_sonnet_dataset(tok, &so, &samples);
    } else if (!strcmp(name, "burstgpt")) {
        const cv_burstgpt_options bo = {.path = s->dataset_path, .num_prompts = c->num_prompts, .seed = s->data.seed};
        rc = cv_burstgpt_dataset(tok, &bo, &samples);
    } else if (!strcmp(name, "sharegpt")) {
        const cv_sharegpt_options so = {.from = from, .output_len = s->sharegpt_output_len};
        rc = cv_sharegpt_dataset(tok, &so, &samples, &s->n_samples);
    } else {
        const bool spec_bench = !strcmp(name, "spec_bench");
        const cv_custom_options co = {
            .from = from, .model = c->tokenizer_id, .skip_chat_template = s->skip_chat_template,
            .output_len = spec_bench ? s->spec_bench_output_len : s->custom_output_len, .spec_bench = spec_bench,
            .category = s->spec_bench_category};
        rc = cv_custom_dataset(tok, &co, &samples, &s->n_samples);
    }
    if (!rc) {
        if (random) s->ignore_eos = true; /* vLLM: random datasets run every request to its output length */
        if (!json_object_get(s->sampling, "temperature"))
            puts("WARNING: vllm bench serve no longer sets temperature==0 (greedy) in requests by default. "
                 "The default will be determined on the server side and can be model/API specific. "
                 "For the old behavior, include --temperature=0.");
        rc = ready_check(s, url, samples);
    }
    if (!rc) rc = warm_up(s, url, samples);
    if (!rc) rc = benchmark(s, base, url, tok, samples);
    cv_bench_samples_free(samples, samples ? s->n_samples : 0);
    cvllm_tokenizer_destroy(tok);
    free(url);
    free(base);
    return rc;
}

int cv_bench_serve_main(int argc, char **argv) {
    serve_args s = {0};
    cv_args a;
    int status = cv_args_init(&a, "bench serve", argc, argv);
    if (status == 0) status = parse_serve_args(&a, &s);
    if (status) {
        free_serve_args(&s);
        cv_args_free(&a);
        return status < 0 ? 0 : status;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = run_serve(&s);
    if (rc) fprintf(stderr, "cvllm bench serve: %s\n", cvllm_last_error());
    curl_global_cleanup();
    free_serve_args(&s);
    cv_args_free(&a);
    return rc ? 1 : 0;
}
