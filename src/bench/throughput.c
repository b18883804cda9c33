/*
 * throughput.c — `cvllm bench throughput`: vLLM's offline throughput benchmark
 * (vllm/benchmarks/throughput.py). The whole dataset (random or prefix_repetition, or from
 * --dataset-path sharegpt, sonnet or burstgpt, see dataset.h) goes into the engine at once and the clock covers
 * queueing to the last token; the scheduler's batching is what is being measured. vLLM's throughput
 * runs sonnet with the chat template's rendering and its prefix from --prefix-len, its lengths from
 * --input-len and --output-len (550 and 150 when not given).
 *
 * As vLLM's run_vllm(): every request samples with temperature 1.0 and top_p 1.0 (explicit
 * parameters, so generation_config.json plays no part), ignores EOS and stops at its dataset output
 * length; token totals are counted from what the engine returned. Prompts are submitted as token
 * ids — the same ids the engine would get by tokenizing the dataset's text, without timing the
 * tokenizer. When the model's embedding table is smaller than the tokenizer (test checkpoints),
 * prompt ids are drawn below it and not round-tripped through text.
 *
 * --use-beam-search runs the dataset through one cvllm_engine_beam_search instead, as vLLM's run_vllm
 * calls LLM.beam_search (beam width --n, the output length every request shares, eos ignored); the
 * tokens counted are each prompt's and its best sequence's.
 *
 * LoRA, as vLLM's: with --enable-lora, --lora-path's adapter is loaded --max-loras times, as "1" …
 * "N" (vLLM's LoRARequest names and ids), and each request runs with "k", k = random.randint(1, N)
 * from Python's generator seeded with --seed — in vLLM's order for the random dataset, which draws
 * nothing else from it (for sharegpt vLLM draws between its shuffle and its length checks, so the
 * names differ there). --lora-path without --enable-lora runs the base model, as vLLM's run_vllm
 * passes no adapters then.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timeutil.h"
#include "bench/bench.h"
#include "bench/dataset.h"
#include "bench/pyrandom.h"
#include "cli/args.h"
#include "cli/args_internal.h"
#include "cli/launch.h"
#include "cvllm.h"

typedef struct throughput_args {
    cvllm_engine_options engine;
    cv_random_dataset_options data;
    const char *dataset_name, *dataset_path; /* "random", "prefix_repetition"; "sharegpt", "sonnet" (from dataset_path) */
    cv_prefix_repetition_options repetition;
    bool has_input_len, has_output_len, beam_search;
    int32_t n;
    const char *output_json;
    const char *lora_path;     /* --lora-path */
} throughput_args;

typedef struct totals {
    int64_t prompt_tokens, output_tokens;
    double elapsed;
} totals;

static const char throughput_usage[] =
    "usage: cvllm bench throughput --model MODEL --input-len N [--output-len 128] [--num-prompts 1000]\n"
    "                              [--n 1] [--dataset-name random|prefix_repetition|sharegpt|sonnet|burstgpt]\n"
    "                              [--dataset-path FILE] [--prefix-repetition-prefix-len 256]\n"
    "                              [--prefix-repetition-suffix-len 256] [--prefix-repetition-num-prefixes 10]\n"
    "                              [--prefix-repetition-output-len 128]\n"
    "                              [--prefix-len 0] [--random-range-ratio 0]\n"
    "                              [--use-beam-search] [--output-json FILE] [--backend vllm]\n"
    "                              [--enable-lora --lora-path ADAPTER [--max-loras N]] [engine options]\n"
    "Runs --num-prompts random requests through the engine at once and prints vLLM's\n"
    "\"Throughput: X requests/s, Y total tokens/s, Z output tokens/s\".\n";

static bool dataset_option(cv_args *a, throughput_args *t) {
    const char *v;
    static const char *const datasets[] = {"random", "prefix_repetition", "sharegpt", "sonnet", "burstgpt", NULL};
    if (cv_args_value(a, "--dataset-name", &v)) {
        if (v && !cv_args_in_list(datasets, v))
            cv_args_error(a, "--dataset-name %s is not supported (random, prefix_repetition, sharegpt, sonnet, burstgpt)",
                          v);
        else if (v) t->dataset_name = v;
        return true;
    }
    if (cv_args_value(a, "--dataset-path", &v) || cv_args_value(a, "--dataset", &v)) {
        t->dataset_path = v;
        return true;
    }
    if (cv_args_value(a, "--backend", &v)) {
        if (v && strcmp(v, "vllm") != 0) cv_args_error(a, "--backend %s is not supported (only 'vllm')", v);
        return true;
    }
    if (cv_args_value(a, "--random-range-ratio", &v)) {
        cv_args_float(a, "--random-range-ratio", v, 0, 0.999999, &t->data.range_ratio);
        return true;
    }
    if (cv_args_int32_option(a, "--input-len", 1, INT32_MAX, &t->data.input_len)) {
        t->has_input_len = true;
        return true;
    }
    if (cv_args_int32_option(a, "--output-len", 1, INT32_MAX, &t->data.output_len)) {
        t->has_output_len = true;
        return true;
    }
    return cv_args_int32_option(a, "--num-prompts", 1, INT32_MAX, &t->data.num_prompts) ||
           cv_args_int32_option(a, "--prefix-len", 0, INT32_MAX, &t->data.prefix_len) ||
           cv_args_int32_option(a, "--n", 1, INT32_MAX, &t->n) ||
           cv_args_int32_option(a, "--prefix-repetition-prefix-len", 0, INT32_MAX, &t->repetition.prefix_len) ||
           cv_args_int32_option(a, "--prefix-repetition-suffix-len", 0, INT32_MAX, &t->repetition.suffix_len) ||
           cv_args_int32_option(a, "--prefix-repetition-num-prefixes", 1, INT32_MAX, &t->repetition.num_prefixes) ||
           cv_args_int32_option(a, "--prefix-repetition-output-len", 1, INT32_MAX, &t->repetition.output_len);
}

static int parse_throughput_args(cv_args *a, throughput_args *t) {
    cvllm_engine_options_default(&t->engine);
    t->data.num_prompts = 1000;
    t->data.output_len = 128;
    t->dataset_name = "random";
    t->n = 1;
    t->repetition = (cv_prefix_repetition_options){.prefix_len = 256, .suffix_len = 256, .num_prefixes = 10,
                                                   .output_len = 128};
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i], *v;
        if (cv_args_flag(a, "--help|-h")) {
            fputs(throughput_usage, stdout);
            fputs(cv_args_engine_help, stdout);
            return -1;
        }
        if (cv_args_engine(a, &t->engine) || dataset_option(a, t)) continue;
        /* detokenization is part of every engine step here; the flag changes nothing */
        if (cv_args_flag(a, "--disable-detokenize")) continue;
        if (cv_args_flag(a, "--use-beam-search")) {
            t->beam_search = true;
            continue;
        }
        if (cv_args_value(a, "--output-json", &v)) t->output_json = v;
        else if (cv_args_value(a, "--lora-path", &v)) t->lora_path = v;
        else if (arg[0] != '-' && !t->engine.model) t->engine.model = arg, a->i++;
        else if (arg[0] != '-') return cv_args_error(a, "unexpected argument '%s'", arg);
        else if (!cv_args_unknown(a)) return 2;
    }
    if (a->failed) return 2;
    if (!t->engine.model) return cv_args_error(a, "no model given (--model MODEL)");
    const bool random = !strcmp(t->dataset_name, "random");
    const bool from_file = !strcmp(t->dataset_name, "sharegpt") || !strcmp(t->dataset_name, "sonnet") ||
                           !strcmp(t->dataset_name, "burstgpt");
    if (!from_file && t->dataset_path)
        return cv_args_error(a, "the %s dataset needs no --dataset-path (use --dataset-name sharegpt for a file)",
                             t->dataset_name);
    if (from_file && !t->dataset_path) return cv_args_error(a, "the '%s' dataset needs --dataset-path", t->dataset_name);
    if (random && !t->has_input_len) return cv_args_error(a, "--input-len must be provided for a random dataset");
    if (t->engine.enable_lora && !t->lora_path) return cv_args_error(a, "LoRA path must be provided when enable_lora is True");
    if (t->engine.enable_lora && t->beam_search) return cv_args_error(a, "BeamSearch API does not support LoRA");
    if (t->lora_path && !t->engine.enable_lora)
        fprintf(stderr, "cvllm bench throughput: --lora-path without --enable-lora: the requests run the base model\n");
    t->data.seed = t->engine.seed;
    return 0;
}

static int check_fits(const cvllm_engine *e, const cv_bench_sample *s, size_t n) {
    int32_t max_len = cvllm_engine_max_model_len(e);
    for (size_t i = 0; i < n; i++)
        if ((int64_t)s[i].prompt_len + s[i].output_len > max_len)
            return cv_fail(CVLLM_ERR_CAPACITY,
                           "request %zu needs %d prompt + %d output tokens but max_model_len is %d: please "
                           "ensure that max_model_len is at least prompt_len + output_len for all requests",
                           i, s[i].prompt_len, s[i].output_len, max_len);
    return 0;
}

static void count_finished(const cvllm_request_output *o, totals *t) {
    t->prompt_tokens += (int64_t)o->n_prompt_token_ids;
    for (int32_t c = 0; c < o->n_outputs; c++) t->output_tokens += (int64_t)o->outputs[c].n_token_ids;
}

/* vLLM's run_vllm with use_beam_search: every request must share one output length. */
static int run_beam_search(cvllm_engine *e, const throughput_args *ta, const cv_bench_sample *s, size_t n, totals *t) {
    for (size_t i = 1; i < n; i++)
        if (s[i].output_len != s[0].output_len)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "beam search needs one output length for every request (--random-range-ratio 0, or "
                           "--output-len with a file); request %zu has %d, request 0 %d",
                           i, s[i].output_len, s[0].output_len);
    cvllm_prompt *prompts = cv_xcalloc(n, sizeof *prompts);
    cvllm_beam_search_output *out = cv_xcalloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++) prompts[i] = (cvllm_prompt){.token_ids = s[i].ids, .n_token_ids = (size_t)s[i].prompt_len};
    const cvllm_beam_search_params bp = {.beam_width = ta->n, .max_tokens = s[0].output_len, .ignore_eos = true,
                                         .length_penalty = 1.0f};
    double start = cv_now();
    int rc = cvllm_engine_beam_search(e, prompts, n, &bp, out);
    t->elapsed = cv_now() - start;
    for (size_t i = 0; i < n && !rc; i++) {
        t->prompt_tokens += s[i].prompt_len;
        if (out[i].n_sequences) t->output_tokens += (int64_t)out[i].sequences[0].n_token_ids;
    }
    cvllm_beam_search_output_free(out, n);
    free(out);
    free(prompts);
    return rc;
}

/* vLLM's LoRA requests: the adapter loaded as "1" … "max_loras", and each request's name drawn. */
static int lora_names(cvllm_engine *e, const throughput_args *ta, size_t n, char (**names)[16]) {
    *names = NULL;
    if (!ta->engine.enable_lora) return 0;
    const int32_t k = ta->engine.max_loras ? ta->engine.max_loras : 1;
    for (int32_t i = 1; i <= k; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        int rc = cvllm_engine_load_lora(e, &(cvllm_lora_module){name, ta->lora_path}, false);
        if (rc) return rc;
    }
    *names = cv_xmalloc(n * sizeof **names);
    cv_pyrandom r;
    cv_pyrandom_seed(&r, ta->data.seed);
    for (size_t i = 0; i < n; i++) snprintf((*names)[i], sizeof (*names)[i], "%zu", 1 + cv_pyrandom_below(&r, (size_t)k));
    return 0;
}

static int run_all(cvllm_engine *e, const throughput_args *ta, const cv_bench_sample *s, size_t n, totals *t) {
    if (ta->beam_search) return run_beam_search(e, ta, s, n, t);
    char (*loras)[16];
    int rc = lora_names(e, ta, n, &loras);
    if (rc) return rc;
    cvllm_sampling_params p;
    cvllm_sampling_params_default(NULL, &p); /* vLLM's neutral SamplingParams: temperature 1, top_p 1 */
    p.ignore_eos = true;
    p.n = ta->n;
    double start = cv_now();
    for (size_t i = 0; i < n && !rc; i++) {
        cvllm_prompt prompt = {.token_ids = s[i].ids, .n_token_ids = (size_t)s[i].prompt_len,
                               .lora_name = loras ? loras[i] : NULL};
        p.max_tokens = s[i].output_len;
        rc = cvllm_engine_add_request(e, &prompt, &p, NULL);
    }
    free(loras);
    while (!rc && cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t k;
        rc = cvllm_engine_step(e, &outs, &k);
        for (size_t j = 0; j < k && !rc; j++)
            if (outs[j]->finished) count_finished(outs[j], t);
    }
    t->elapsed = cv_now() - start;
    return rc;
}

static void report(const throughput_args *ta, size_t n, const totals *t) {
    int64_t total = t->prompt_tokens + t->output_tokens;
    printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", (double)n / t->elapsed,
           (double)total / t->elapsed, (double)t->output_tokens / t->elapsed);
    printf("Total num prompt tokens:  %lld\n", (long long)t->prompt_tokens);
    printf("Total num output tokens:  %lld\n", (long long)t->output_tokens);
    if (!ta->output_json) return;
    json_t *o = json_object();
    json_object_set_new(o, "elapsed_time", json_real(t->elapsed));
    json_object_set_new(o, "num_requests", json_integer((json_int_t)n));
    json_object_set_new(o, "total_num_tokens", json_integer(total));
    json_object_set_new(o, "requests_per_second", json_real((double)n / t->elapsed));
    json_object_set_new(o, "tokens_per_second", json_real((double)total / t->elapsed));
    if (json_dump_file(o, ta->output_json, JSON_INDENT(4)))
        fprintf(stderr, "cvllm bench throughput: cannot write %s\n", ta->output_json);
    json_decref(o);
}

int cv_bench_throughput_main(int argc, char **argv) {
    throughput_args t = {0};
    cv_args a;
    int status = cv_args_init(&a, "bench throughput", argc, argv);
    if (status == 0) status = parse_throughput_args(&a, &t);
    cvllm_engine *e = status ? NULL : cv_launch_engine(&a, &t.engine, &status);
    if (!e) {
        cv_args_free(&a);
        return status < 0 ? 0 : status;
    }
    const cvllm_tokenizer *tok = cvllm_engine_tokenizer(e);
    t.data.vocab_limit = cvllm_engine_vocab_size(e);
    t.data.exact_ids = t.data.vocab_limit < cvllm_tokenizer_vocab_size(tok);
    cv_bench_sample *samples = NULL;
    size_t n = (size_t)t.data.num_prompts;
    totals tot = {0};
    int rc;
    if (!strcmp(t.dataset_name, "random")) {
        rc = cv_random_dataset(tok, &t.data, &samples);
    } else if (!strcmp(t.dataset_name, "prefix_repetition")) {
        t.repetition.num_prompts = t.data.num_prompts;
        t.repetition.seed = t.data.seed;
        t.repetition.vocab_limit = t.data.vocab_limit;
        t.repetition.exact_ids = t.data.exact_ids;
        rc = cv_prefix_repetition_dataset(tok, &t.repetition, &samples, &n);
    } else if (!strcmp(t.dataset_name, "sonnet")) {
        const cv_sonnet_options so = {.path = t.dataset_path, .model = t.engine.tokenizer ? t.engine.tokenizer : t.engine.model,
                                      .num_prompts = t.data.num_prompts,
                                      .input_len = t.has_input_len ? t.data.input_len : 550,
                                      .output_len = t.has_output_len ? t.data.output_len : 150,
                                      .prefix_len = t.data.prefix_len, .seed = t.data.seed};
        rc = cv_sonnet_dataset(tok, &so, &samples);
    } else if (!strcmp(t.dataset_name, "burstgpt")) {
        const cv_burstgpt_options bo = {.path = t.dataset_path, .num_prompts = t.data.num_prompts, .seed = t.data.seed,
                                        .vocab_limit = t.data.vocab_limit};
        rc = cv_burstgpt_dataset(tok, &bo, &samples);
    } else { /* vLLM: the conversations' own output lengths unless --output-len */
        const cv_sharegpt_options so = {
            .from = {.path = t.dataset_path, .num_prompts = t.data.num_prompts, .seed = t.data.seed},
            .output_len = t.has_output_len ? t.data.output_len : -1};
        rc = cv_sharegpt_dataset(tok, &so, &samples, &n);
    }
    if (!rc) rc = check_fits(e, samples, n);
    if (!rc) rc = run_all(e, &t, samples, n, &tot);
    if (rc) fprintf(stderr, "cvllm bench throughput: %s\n", cvllm_last_error());
    else report(&t, n, &tot);
    cv_bench_samples_free(samples, samples ? n : 0);
    cvllm_engine_destroy(e);
    cv_args_free(&a);
    return rc ? 1 : 0;
}
