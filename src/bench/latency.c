/*
 * latency.c — `cvllm bench latency`: the time to run one batch end to end, as vLLM's
 * `vllm bench latency` measures it (same flags, same printed lines), plus the prefill and decode
 * throughput of that batch, which is what a CPU engine is judged by.
 *
 * Prompts are random token ids (as vLLM's dummy prompts are), every request decodes exactly
 * --output-len tokens (ignore_eos, greedy), and the clock covers submission to the last token.
 * Prefill time is from submission until every request has its first token; decode is the rest.
 * Mean, standard deviation and percentiles are numpy's (stats.h), as vLLM computes them.
 * --profile (cvllm's own) adds the time per op kind of the measured iterations (kernels/profile.h).
 * --use-beam-search times one cvllm_engine_beam_search of the batch instead, as vLLM times
 * LLM.beam_search (beam width --n, --output-len tokens, eos ignored); a step there is its own set of
 * requests, so the prefill and decode lines are not printed.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "bench/bench.h"
#include "bench/stats.h"
#include "cli/args.h"
#include "cli/launch.h"
#include "cvllm.h"
#include "kernels/profile.h"

typedef struct latency_args {
    cvllm_engine_options engine;
    int32_t input_len, output_len, batch_size, n, warmup, iters;
    const char *output_json;
    bool profile, beam_search;
} latency_args;

typedef struct batch_timing {
    double total, prefill, decode;
} batch_timing;

static const char latency_usage[] =
    "usage: cvllm bench latency --model MODEL [--input-len 32] [--output-len 128] [--batch-size 8]\n"
    "                           [--n 1] [--num-iters-warmup 10] [--num-iters 30] [--output-json FILE]\n"
    "                           [--use-beam-search] [--profile] [engine options]\n"
    "  --profile                    print the time per op kind (cvllm's own flag)\n";

static int parse_latency_args(cv_args *a, latency_args *l) {
    cvllm_engine_options_default(&l->engine);
    l->input_len = 32, l->output_len = 128, l->batch_size = 8, l->n = 1, l->warmup = 10, l->iters = 30;
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i], *v;
        if (cv_args_flag(a, "--help|-h")) {
            fputs(latency_usage, stdout);
            fputs(cv_args_engine_help, stdout);
            return -1;
        }
        if (cv_args_engine(a, &l->engine)) continue;
        if (cv_args_int32_option(a, "--input-len", 1, INT32_MAX, &l->input_len) ||
            cv_args_int32_option(a, "--output-len", 1, INT32_MAX, &l->output_len) ||
            cv_args_int32_option(a, "--batch-size", 1, 1 << 20, &l->batch_size) ||
            cv_args_int32_option(a, "--n", 1, 1 << 16, &l->n) ||
            cv_args_int32_option(a, "--num-iters-warmup", 0, 1 << 20, &l->warmup) ||
            cv_args_int32_option(a, "--num-iters", 1, 1 << 20, &l->iters))
            continue;
        if (cv_args_value(a, "--output-json", &v)) l->output_json = v;
        else if (cv_args_flag(a, "--profile")) l->profile = true;
        else if (cv_args_flag(a, "--use-beam-search")) l->beam_search = true;
        else if (arg[0] != '-' && !l->engine.model) { l->engine.model = arg; a->i++; }
        else if (arg[0] != '-') return cv_args_error(a, "unexpected argument '%s'", arg);
        else if (!cv_args_unknown(a)) return 2;
    }
    if (a->failed) return 2;
    if (!l->engine.model) return cv_args_error(a, "no model given (--model MODEL)");
    return 0;
}

/* The batch's random prompt ids, input_len each, into ids. */
static void random_prompts(const cvllm_engine *e, const latency_args *l, cv_rng *rng, int32_t *ids) {
    int32_t vocab = cvllm_engine_vocab_size(e), range = vocab < 10000 ? vocab : 10000;
    for (int64_t t = 0; t < (int64_t)l->batch_size * l->input_len; t++) ids[t] = (int32_t)(cv_rng_next(rng) % (uint64_t)range);
}

/* vLLM's latency.py with --use-beam-search: BeamSearchParams(beam_width=n, max_tokens=output_len,
 * ignore_eos=True), its temperature 0 and length_penalty 1. */
static int run_beam_batch(cvllm_engine *e, const latency_args *l, cv_rng *rng, int32_t *ids, batch_timing *t) {
    random_prompts(e, l, rng, ids);
    cvllm_prompt *prompts = cv_xcalloc((size_t)l->batch_size, sizeof *prompts);
    cvllm_beam_search_output *out = cv_xcalloc((size_t)l->batch_size, sizeof *out);
    for (int32_t b = 0; b < l->batch_size; b++)
        prompts[b] = (cvllm_prompt){.token_ids = ids + (int64_t)b * l->input_len, .n_token_ids = (size_t)l->input_len};
    const cvllm_beam_search_params bp = {.beam_width = l->n, .max_tokens = l->output_len, .ignore_eos = true,
                                         .length_penalty = 1.0f};
    double start = cv_now();
    int rc = cvllm_engine_beam_search(e, prompts, (size_t)l->batch_size, &bp, out);
    *t = (batch_timing){.total = cv_now() - start};
    cvllm_beam_search_output_free(out, (size_t)l->batch_size);
    free(out);
    free(prompts);
    return rc;
}

static int submit_batch(cvllm_engine *e, const latency_args *l, cv_rng *rng, int32_t *prompt) {
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    p.temperature = 0;
    p.ignore_eos = true;
    p.max_tokens = l->output_len;
    p.n = l->n;
    random_prompts(e, l, rng, prompt);
    for (int32_t b = 0; b < l->batch_size; b++) {
        cvllm_prompt pr = {.token_ids = prompt + (int64_t)b * l->input_len, .n_token_ids = (size_t)l->input_len};
        int rc = cvllm_engine_add_request(e, &pr, &p, NULL);
        if (rc) return rc;
    }
    return 0;
}

static int run_batch(cvllm_engine *e, const latency_args *l, cv_rng *rng, int32_t *prompt, batch_timing *t) {
    if (l->beam_search) return run_beam_batch(e, l, rng, prompt, t);
    double start = cv_now(), first_tokens_at = 0;
    int rc = submit_batch(e, l, rng, prompt);
    if (rc) return rc;
    int32_t started = 0, expected = l->batch_size * l->n;
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n;
        if ((rc = cvllm_engine_step(e, &outs, &n))) return rc;
        for (size_t k = 0; k < n; k++)
            for (int32_t c = 0; c < outs[k]->n_outputs; c++)
                if (outs[k]->outputs[c].n_token_ids == outs[k]->outputs[c].n_new_token_ids &&
                    outs[k]->outputs[c].n_new_token_ids > 0)
                    started++;
        if (started == expected && first_tokens_at == 0) first_tokens_at = cv_now();
    }
    double end = cv_now();
    t->total = end - start;
    t->prefill = first_tokens_at - start;
    t->decode = end - first_tokens_at;
    return 0;
}

/* With speculative decoding, how much of it paid: vLLM's acceptance rate and mean acceptance length. */
static void report_spec_decode(const cvllm_engine *e) {
    cvllm_spec_decode_stats st;
    cvllm_engine_spec_decode_stats(e, &st);
    if (st.num_drafts == 0) return;
    printf("Speculative decoding: %llu drafts, %llu draft tokens, %llu accepted (acceptance rate %.1f%%, "
           "mean acceptance length %.2f)\n",
           (unsigned long long)st.num_drafts, (unsigned long long)st.num_draft_tokens,
           (unsigned long long)st.num_accepted_tokens, 100.0 * (double)st.num_accepted_tokens / (double)st.num_draft_tokens,
           1.0 + (double)st.num_accepted_tokens / (double)st.num_drafts);
}

static void report(const latency_args *l, batch_timing *runs, int n) {
    double *lat = cv_xmalloc((size_t)n * sizeof *lat), *sorted = cv_xmalloc((size_t)n * sizeof *sorted);
    double prefill = 0, decode = 0;
    for (int i = 0; i < n; i++) {
        lat[i] = sorted[i] = runs[i].total;
        prefill += runs[i].prefill;
        decode += runs[i].decode;
    }
    cv_stats_sort(sorted, (size_t)n);
    double avg = cv_stats_mean(lat, (size_t)n);
    static const int pcts[] = {10, 25, 50, 75, 90, 99};
    printf("Avg latency: %.6f seconds\n", avg);
    for (size_t k = 0; k < sizeof pcts / sizeof *pcts; k++)
        printf("%d%% percentile latency: %.6f seconds\n", pcts[k], cv_stats_percentile(sorted, (size_t)n, pcts[k]));
    double prompt_tokens = (double)l->batch_size * l->n * l->input_len;
    double decode_tokens = (double)l->batch_size * l->n * (l->output_len - 1);
    if (!l->beam_search) printf("Prefill throughput: %.2f tokens/s (%d x %d prompt tokens in %.4f s)\n", prompt_tokens * n / prefill,
           l->batch_size * l->n, l->input_len, prefill / n);
    if (l->output_len > 1 && !l->beam_search)
        printf("Decode throughput: %.2f tokens/s (%.2f tokens/s per sequence)\n", decode_tokens * n / decode,
               (l->output_len - 1) * n / decode);
    if (l->output_json) {
        json_t *o = json_object(), *all = json_array(), *pj = json_object();
        for (int i = 0; i < n; i++) json_array_append_new(all, json_real(runs[i].total));
        for (size_t k = 0; k < sizeof pcts / sizeof *pcts; k++) {
            char key[8];
            snprintf(key, sizeof key, "%d", pcts[k]);
            json_object_set_new(pj, key, json_real(cv_stats_percentile(sorted, (size_t)n, pcts[k])));
        }
        json_object_set_new(o, "avg_latency", json_real(avg));
        json_object_set_new(o, "std_latency", json_real(cv_stats_std(lat, (size_t)n)));
        json_object_set_new(o, "latencies", all);
        json_object_set_new(o, "percentiles", pj);
        if (!l->beam_search) {
            json_object_set_new(o, "prefill_tokens_per_second", json_real(prompt_tokens * n / prefill));
            json_object_set_new(o, "decode_tokens_per_second", json_real(l->output_len > 1 ? decode_tokens * n / decode : 0));
        }
        if (json_dump_file(o, l->output_json, JSON_INDENT(4)))
            fprintf(stderr, "cvllm bench latency: cannot write %s\n", l->output_json);
        json_decref(o);
    }
    free(sorted);
    free(lat);
}

/* Time per op kind over the measured iterations, largest first. */
static void report_profile(void) {
    cv_profile_totals t;
    cv_profile_read(&t);
    uint64_t total = 0;
    int order[CV_OP_COUNT];
    for (int k = 0; k < CV_OP_COUNT; k++) total += t.ns[k], order[k] = k;
    for (int i = 1; i < CV_OP_COUNT; i++) /* insertion sort by time, descending */
        for (int j = i; j > 0 && t.ns[order[j]] > t.ns[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    printf("Profile (measured iterations, forward passes only):\n");
    printf("  %-18s %12s %7s %10s %12s\n", "op", "total ms", "share", "calls", "us/call");
    for (int i = 0; i < CV_OP_COUNT; i++) {
        int k = order[i];
        if (!t.calls[k]) continue;
        printf("  %-18s %12.2f %6.1f%% %10llu %12.2f\n", cv_op_kind_name((cv_op_kind)k), t.ns[k] * 1e-6,
               100.0 * (double)t.ns[k] / (double)(total ? total : 1), (unsigned long long)t.calls[k],
               t.ns[k] * 1e-3 / (double)t.calls[k]);
    }
    printf("  %-18s %12.2f\n", "total", total * 1e-6);
}

int cv_bench_latency_main(int argc, char **argv) {
    latency_args l = {0};
    cv_args a;
    int status = cv_args_init(&a, "bench latency", argc, argv);
    if (status == 0) status = parse_latency_args(&a, &l);
    cvllm_engine *e = status ? NULL : cv_launch_engine(&a, &l.engine, &status);
    if (!e) {
        cv_args_free(&a);
        return status < 0 ? 0 : status;
    }
    cv_rng rng;
    cv_rng_seed(&rng, l.engine.seed);
    int32_t *prompt = cv_xmalloc((size_t)l.batch_size * (size_t)l.input_len * sizeof *prompt);
    batch_timing *runs = cv_xcalloc((size_t)l.iters, sizeof *runs), scratch;
    int rc = 0;
    for (int i = 0; i < l.warmup && !rc; i++) rc = run_batch(e, &l, &rng, prompt, &scratch);
    cv_profile_reset();
    cv_profile_enable(l.profile);
    for (int i = 0; i < l.iters && !rc; i++) rc = run_batch(e, &l, &rng, prompt, &runs[i]);
    cv_profile_enable(false);
    if (rc) {
        fprintf(stderr, "cvllm bench latency: %s\n", cvllm_last_error());
        status = 1;
    } else {
        report(&l, runs, l.iters);
        report_spec_decode(e);
        if (l.profile) report_profile();
    }
    free(runs);
    free(prompt);
    cvllm_engine_destroy(e);
    cv_args_free(&a);
    return status;
}
