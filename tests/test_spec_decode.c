/*
 * test_spec_decode.c — speculative decoding: config parsing, the n-gram proposer, the rejection
 * sampler's output distribution, and end to end: greedy output identical with and without
 * speculation (N = 1..4, batched, chunked), seeded sampling reproducible, drafts accepted.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cvllm.h"
#include "engine/engine.h"
#include "sample/sampler.h"
#include "engine/spec_decode.h"
#include "testutil.h"

static void expect_config_error(const char *json, const char *msg) {
    cv_spec_config c;
    CHECK(cv_spec_config_parse(json, &c) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), msg);
}

static void test_config(void) {
    cv_spec_config c;
    CHECK(cv_spec_config_parse(NULL, &c) == 0 && c.method == CV_SPEC_NONE);
    CHECK(cv_spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3}", &c) == 0);
    CHECK(c.method == CV_SPEC_NGRAM && c.num_speculative_tokens == 3);
    CHECK(c.prompt_lookup_min == 5 && c.prompt_lookup_max == 5);
    CHECK(cv_spec_config_parse("{\"method\":\"ngram\",\"num_speculative_tokens\":2,\"prompt_lookup_max\":4}", &c) == 0);
    CHECK(c.prompt_lookup_min == 4 && c.prompt_lookup_max == 4);
    CHECK(cv_spec_config_parse("{\"method\":\"qwen3_5_mtp\",\"num_speculative_tokens\":3}", &c) == 0);
    CHECK(c.method == CV_SPEC_MTP);
    expect_config_error("{bad", "not a JSON object");
    expect_config_error("[]", "not a JSON object");
    expect_config_error("{\"num_speculative_tokens\": 3}", "\"method\" (a string) is required");
    expect_config_error("{\"method\": \"eagle3\", \"num_speculative_tokens\": 3}", "unsupported method \"eagle3\"");
    expect_config_error("{\"method\": \"ngram\"}", "\"num_speculative_tokens\" is required");
    expect_config_error("{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "must be an integer in [1, 16]");
    expect_config_error("{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_min\": 4, "
                        "\"prompt_lookup_max\": 2}",
                        "prompt_lookup_min (4) > prompt_lookup_max (2)");
    /* vLLM's SpeculativeConfig forbids unknown keys; its own fields cvllm has no use for pass (the
     * Qwen3.6 tutorial's enforce_eager). */
    CHECK(cv_spec_config_parse("{\"method\": \"qwen3_5_mtp\", \"num_speculative_tokens\": 3, \"enforce_eager\": true}",
                               &c) == 0);
    expect_config_error("{\"method\": \"ngram\", \"num_speculative_token\": 3}",
                        "1 validation error for SpeculativeConfig: num_speculative_token: Unexpected keyword argument");
    expect_config_error("{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"lookup\": 1, \"x\": 2}",
                        "2 validation errors for SpeculativeConfig: lookup: Unexpected keyword argument; x: Unexpected "
                        "keyword argument");
}

static void test_ngram_proposer(void) {
    cv_spec_config c = {.method = CV_SPEC_NGRAM, .num_speculative_tokens = 4, .prompt_lookup_min = 2, .prompt_lookup_max = 3};
    int32_t d[8];
    /* "1 2 3 4 5 ... 1 2 3" → the 3-gram "1 2 3" occurred before, followed by 4 5 6 7. */
    static const int32_t a[] = {1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3};
    CHECK_EQ_INT(cv_ngram_propose(&c, a, 11, 4, d), 4);
    CHECK(d[0] == 4 && d[1] == 5 && d[2] == 6 && d[3] == 7);
    CHECK_EQ_INT(cv_ngram_propose(&c, a, 11, 2, d), 2);
    /* Only a 2-gram matches ("8 3" earlier), and the continuation stops at the end. */
    static const int32_t b[] = {8, 3, 5, 0, 8, 3};
    CHECK_EQ_INT(cv_ngram_propose(&c, b, 6, 4, d), 4);
    CHECK(d[0] == 5 && d[1] == 0 && d[2] == 8 && d[3] == 3);
    /* The most recent occurrence wins. */
    static const int32_t r[] = {7, 7, 1, 7, 7, 2, 7, 7};
    CHECK_EQ_INT(cv_ngram_propose(&c, r, 8, 1, d), 1);
    CHECK_EQ_INT(d[0], 2);
    /* Repetitive text: the latest match has one token after it, an earlier one has all four. */
    static const int32_t rep[] = {5, 9, 9, 9, 9, 9, 9};
    c.prompt_lookup_min = c.prompt_lookup_max = 1;
    CHECK_EQ_INT(cv_ngram_propose(&c, rep, 7, 4, d), 4);
    CHECK(d[0] == 9 && d[3] == 9);
    c.prompt_lookup_min = 2;
    c.prompt_lookup_max = 3;
    static const int32_t none[] = {1, 2, 3, 4};
    CHECK_EQ_INT(cv_ngram_propose(&c, none, 4, 4, d), 0);
    CHECK_EQ_INT(cv_ngram_propose(&c, a, 11, 0, d), 0);
}

/* The rejection sampler draws exactly from the target distribution whatever the draft. */
static void test_verify_distribution(void) {
    enum { V = 6, DRAWS = 60000 };
    const float base[V] = {1.0f, 0.5f, -0.2f, 2.0f, 0.0f, -1.0f};
    double p[V], z = 0;
    for (int i = 0; i < V; i++) z += exp(base[i]);
    for (int i = 0; i < V; i++) p[i] = exp(base[i]) / z;
    cv_sampler_params sp = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .logprobs = -1};
    for (int draft = 0; draft < V; draft += 3) {
        cv_sampler_state st;
        cv_sampler_state_init(&st, &sp, V, 99 + (uint64_t)draft, NULL, 0);
        int counts[V] = {0};
        void *scratch = malloc(2 * V * sizeof(float));
        for (int n = 0; n < DRAWS; n++) {
            float row[V];
            memcpy(row, base, sizeof row);
            counts[cv_sample_verify(&sp, &st, row, scratch, draft, NULL)]++;
        }
        double chi2 = 0;
        for (int i = 0; i < V; i++) chi2 += pow(counts[i] - DRAWS * p[i], 2) / (DRAWS * p[i]);
        CHECK_MSG(chi2 < 20.5, "draft %d: chi-square %.2f over 5 degrees of freedom", draft, chi2); /* p < 0.001 */
        free(scratch);
        cv_sampler_state_free(&st);
    }
}

typedef struct run {
    int32_t ids[16][64];
    size_t n[16];
} run;

static cvllm_engine *engine_with(const char *dir, const char *spec, int32_t budget) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.kv_cache_memory_bytes = 4 << 20;
    o.max_model_len = 256;
    o.max_num_batched_tokens = budget;
    o.speculative_config = spec;
    cvllm_engine *e = NULL;
    CHECK_MSG(cvllm_engine_create(&o, &e) == 0, "%s", cvllm_last_error());
    return e;
}

/* 8 prompts with repeated structure; greedy (or seeded sampling) to 40 tokens. */
static void generate(cvllm_engine *e, bool sample, run *out) {
    uint64_t ids[8];
    for (int i = 0; i < 8; i++) {
        int32_t prompt[30];
        for (int t = 0; t < 30; t++) prompt[t] = (t % (3 + i)) * 101 + i;
        cvllm_sampling_params p;
        cvllm_sampling_params_default(e, &p);
        p.temperature = sample ? 0.8f : 0.0f;
        p.top_k = sample ? 50 : 0;
        p.top_p = 1.0f;
        p.max_tokens = 40;
        p.has_seed = sample;
        p.seed = 1000 + i;
        cvllm_prompt pr = {.token_ids = prompt, .n_token_ids = 30};
        CHECK(cvllm_engine_add_request(e, &pr, &p, &ids[i]) == 0);
    }
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n;
        CHECK(cvllm_engine_step(e, &outs, &n) == 0);
        for (size_t k = 0; k < n; k++) {
            int i = 0;
            while (ids[i] != outs[k]->request_id) i++;
            out->n[i] = outs[k]->outputs[0].n_token_ids;
            memcpy(out->ids[i], outs[k]->outputs[0].token_ids, out->n[i] * sizeof(int32_t));
        }
    }
}

static void test_greedy_identical(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    run *plain = calloc(1, sizeof *plain), *spec = calloc(1, sizeof *spec);
    cvllm_engine *e = engine_with(dir, NULL, 512);
    generate(e, false, plain);
    cvllm_engine_destroy(e);
    uint64_t accepted = 0;
    for (int k = 1; k <= 4; k++) {
        char cfg[128];
        snprintf(cfg, sizeof cfg, "{\"method\": \"ngram\", \"num_speculative_tokens\": %d, \"prompt_lookup_min\": 1, "
                                  "\"prompt_lookup_max\": 3}", k);
        e = engine_with(dir, cfg, k == 3 ? 20 : 512); /* k = 3 also with a tight budget: drafts get cut */
        memset(spec, 0, sizeof *spec);
        generate(e, false, spec);
        for (int i = 0; i < 8; i++) {
            CHECK_EQ_INT(spec->n[i], 40);
            CHECK_MSG(memcmp(spec->ids[i], plain->ids[i], 40 * sizeof(int32_t)) == 0, "k=%d request %d differs", k, i);
        }
        accepted += e->spec_stats.num_accepted_tokens;
        CHECK(e->spec_stats.num_draft_tokens >= e->spec_stats.num_accepted_tokens);
        CHECK(cv_block_pool_usage(&e->blocks) == 0.0);
        cvllm_engine_destroy(e);
    }
    CHECK_MSG(accepted > 0, "no draft was ever accepted on repetitive prompts");
    free(plain);
    free(spec);
    tu_remove_tree(dir);
    free(dir);
}

static void test_seeded_reproducible(void) {
    char *dir = tu_model_dir("qwen3-dense-bf16");
    run *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    const char *cfg = "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_min\": 1}";
    cvllm_engine *e = engine_with(dir, cfg, 512);
    generate(e, true, a);
    cvllm_engine_destroy(e);
    e = engine_with(dir, cfg, 512);
    generate(e, true, b);
    cvllm_engine_destroy(e);
    CHECK(memcmp(a, b, sizeof *a) == 0);
    free(a);
    free(b);

    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.speculative_config = "{\"method\": \"mtp\", \"num_speculative_tokens\": 2}";
    CHECK(cvllm_engine_create(&o, &e) == CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cvllm_last_error(), "MTP");
    o.speculative_config = "{\"method\": \"ngram\"}";
    CHECK(cvllm_engine_create(&o, &e) == CVLLM_ERR_INVALID_ARGUMENT);
    tu_remove_tree(dir);
    free(dir);
}

int main(void) {
    test_config();
    test_ngram_proposer();
    test_verify_distribution();
    test_greedy_identical();
    test_seeded_reproducible();
    return cv_check_summary("test_spec_decode");
}
