/*
 * test_engine_hybrid.c — the engine on the MoE and hybrid (Gated DeltaNet) reference models,
 * Qwen3.5 dense among them: greedy ids equal Hugging Face's through the whole engine (chunked,
 * batched, preempted); prefix caching hits on the hybrid models, restores the checkpointed
 * recurrent state and gives the same logprobs as a cold run, at the boundaries --mamba-cache-mode and
 * --mamba-block-size choose; n-gram and MTP speculative decoding
 * (which roll the state back) leave greedy output unchanged.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cvllm.h"
#include "engine/engine.h"
#include "engine_drain.h"
#include "testutil.h"

static const char *const models[] = {"qwen3-moe-f32", "qwen3.5-moe-f32", "qwen3-next-bf16", "qwen3.5-dense-f32"};

typedef struct outcome {
    int32_t ids[64];
    float lp[64];
    size_t n;
    size_t cached;
    float prompt_lp[80];           /* with prompt_lp_k >= 0: the prompt's logprobs (entry 0 has none) */
    int32_t prompt_top[80];
} outcome;

static cvllm_engine *engine_for(const char *dir, int32_t budget, uint64_t kv_bytes, const char *spec) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.max_num_batched_tokens = budget;
    o.kv_cache_memory_bytes = kv_bytes; /* state slots come out of it too */
    o.max_model_len = 256;
    o.max_num_seqs = 8;
    o.speculative_config = spec;
    o.dtype = "float32"; /* the exact path: greedy ids are held to the f32 reference, speculation to 1e-4 */
    cvllm_engine *e = NULL;
    CHECK_MSG(cvllm_engine_create(&o, &e) == 0, "%s: %s", dir, cvllm_last_error());
    return e;
}

static const int32_t *bias_id; /* optional logit bias for run(), see test_spec_decode_rollback */
static float bias_value;
static int32_t prompt_lp_k = -1; /* prompt logprobs for run(), see test_loglikelihood_hits */

typedef struct run_outcomes {
    const uint64_t *ids; /* out[i] is request ids[i]'s */
    outcome *out;
} run_outcomes;

static void record(void *ctx, const cvllm_request_output *o) {
    const run_outcomes *ro = ctx;
    size_t i = 0;
    while (ro->ids[i] != o->request_id) i++;
    outcome *r = &ro->out[i];
    const cvllm_completion_output *c = &o->outputs[0];
    r->n = c->n_token_ids;
    r->cached = o->n_cached_tokens;
    memcpy(r->ids, c->token_ids, c->n_token_ids * sizeof(int32_t));
    for (size_t t = 0; t < c->n_token_ids; t++) r->lp[t] = c->logprobs[t].chosen.logprob;
    for (size_t t = 1; o->prompt_logprobs && t < o->n_prompt_token_ids && t < 80; t++) {
        r->prompt_lp[t] = o->prompt_logprobs[t].chosen.logprob;
        r->prompt_top[t] = o->prompt_logprobs[t].n_top ? o->prompt_logprobs[t].top[0].token_id : -1;
    }
}

/* Runs the prompts (greedy, logprobs of the chosen tokens) together to completion. */
static void run(cvllm_engine *e, int32_t *const *prompts, const size_t *lens, size_t n, int32_t max_tokens,
                outcome *out) {
    uint64_t *ids = calloc(n, sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        cvllm_sampling_params p;
        cvllm_sampling_params_default(e, &p);
        p.temperature = 0;
        p.max_tokens = max_tokens;
        p.logprobs = 0;
        p.prompt_logprobs = prompt_lp_k;
        if (bias_id) {
            p.logit_bias_ids = bias_id;
            p.logit_bias_values = &bias_value;
            p.n_logit_bias = 1;
        }
        cvllm_prompt pr = {.token_ids = prompts[i], .n_token_ids = lens[i]};
        CHECK(cvllm_engine_add_request(e, &pr, &p, &ids[i]) == 0);
    }
    run_outcomes ro = {ids, out};
    tu_engine_drain(e, record, &ro);
    free(ids);
}

/* Reference prompts alone and among others, one-shot and in chunks of 5: the reference greedy ids. */
static void test_reference_greedy(const char *vec) {
    char *dir = tu_model_dir(vec);
    json_t *ref = tu_load_ref(vec, "long150");
    size_t n_prompt, n_greedy;
    int32_t *prompt = tu_json_ids(ref, "prompt", &n_prompt);
    int32_t *want = tu_json_ids(ref, "greedy", &n_greedy);
    int32_t other[3][40];
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 40; t++) other[i][t] = (i * 211 + t * 31) % 4096;
    int32_t *prompts[4] = {other[0], prompt, other[1], other[2]};
    size_t lens[4] = {17, n_prompt, 40, 3};
    static const int32_t budgets[] = {1024, 5};
    for (size_t b = 0; b < 2; b++) {
        cvllm_engine *e = engine_for(dir, budgets[b], 8 << 20, NULL);
        if (!e) continue;
        outcome out[4] = {0};
        run(e, prompts, lens, 4, (int32_t)n_greedy, out);
        CHECK_MSG(out[1].n == n_greedy && memcmp(out[1].ids, want, n_greedy * sizeof *want) == 0,
                  "%s budget %d: greedy differs from the reference", vec, budgets[b]);
        CHECK(cv_block_pool_usage(&e->blocks) == 0.0);
        cvllm_engine_destroy(e);
    }
    free(prompt);
    free(want);
    json_decref(ref);
    tu_remove_tree(dir);
    free(dir);
}

/* A shared 48-token prefix: the second request starts from the checkpointed state (a hit of 48 or
 * 32 tokens, whatever the block boundaries allow) and produces exactly the cold run's logprobs. */
static void test_prefix_hit(const char *vec) {
    char *dir = tu_model_dir(vec);
    int32_t a[60], b[60];
    for (int t = 0; t < 60; t++) a[t] = b[t] = (t * 97 + 5) % 4096;
    for (int t = 50; t < 60; t++) b[t] = (t * 13 + 1) % 4096; /* diverges after 50 tokens */
    int32_t *pa[1] = {a}, *pb[1] = {b};
    size_t len[1] = {60};
    outcome cold = {0}, first = {0}, warm = {0};
    cvllm_engine *e = engine_for(dir, 1024, 8 << 20, NULL);
    run(e, pb, len, 1, 8, &cold);
    cvllm_engine_destroy(e);
    e = engine_for(dir, 1024, 8 << 20, NULL);
    run(e, pa, len, 1, 8, &first);
    run(e, pb, len, 1, 8, &warm);
    CHECK_EQ_INT(first.cached, 0);
    CHECK_MSG(warm.cached == 48, "%s: cached %zu tokens, expected 48", vec, warm.cached);
    CHECK(warm.n == 8 && memcmp(warm.ids, cold.ids, 8 * sizeof(int32_t)) == 0);
    float worst = 0;
    for (int t = 0; t < 8; t++) worst = fmaxf(worst, fabsf(warm.lp[t] - cold.lp[t]));
    CHECK_MSG(worst < 1e-4f, "%s: warm and cold logprobs differ by %g", vec, worst);
    CHECK(e->sched.prefix_hits == 48);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* B after A, which shares A's first 40 tokens, on an engine with the given step budget, cache mode
 * and checkpoint spacing: the tokens of B served from the cache, its output checked against `cold`
 * (B alone). */
static size_t shared_prefix_hit(const char *dir, int32_t budget, const char *mode, int32_t every,
                                const outcome *cold) {
    int32_t a[60], b[60];
    for (int t = 0; t < 60; t++) a[t] = b[t] = (t * 97 + 5) % 4096;
    for (int t = 40; t < 60; t++) b[t] = (t * 13 + 1) % 4096;
    int32_t *pa[1] = {a}, *pb[1] = {b};
    size_t len[1] = {60};
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.max_num_batched_tokens = budget;
    o.kv_cache_memory_bytes = 8 << 20;
    o.max_model_len = 256;
    o.max_num_seqs = 8;
    o.dtype = "float32";
    o.mamba_cache_mode = mode;
    o.mamba_block_size = every;
    cvllm_engine *e = NULL;
    CHECK_MSG(cvllm_engine_create(&o, &e) == 0, "%s: %s", dir, cvllm_last_error());
    if (!e) return SIZE_MAX;
    outcome first = {0}, warm = {0};
    run(e, pa, len, 1, 8, &first);
    run(e, pb, len, 1, 8, &warm);
    CHECK(warm.n == 8 && memcmp(warm.ids, cold->ids, 8 * sizeof(int32_t)) == 0);
    float worst = 0;
    for (int t = 0; t < 8; t++) worst = fmaxf(worst, fabsf(warm.lp[t] - cold->lp[t]));
    CHECK_MSG(worst < 1e-4f, "%s %s/%d: warm and cold logprobs differ by %g", dir, mode ? mode : "-", every, worst);
    cvllm_engine_destroy(e);
    return warm.cached;
}

/* --mamba-cache-mode and --mamba-block-size decide which boundaries keep the state, and so how much
 * of the 40 shared tokens a hit can skip (blocks of 16): all boundaries (16, 32), every 32 tokens
 * (32), or the last boundary of each step only (align: A in one step keeps 48 alone, which B does
 * not share; in steps of 20 tokens, 16, 32 and 48). */
static void test_checkpoint_spacing(const char *vec) {
    char *dir = tu_model_dir(vec);
    outcome cold = {0};
    /* B alone: the reference output */
    int32_t b[60];
    for (int t = 0; t < 60; t++) b[t] = t < 40 ? (t * 97 + 5) % 4096 : (t * 13 + 1) % 4096;
    int32_t *pb[1] = {b};
    size_t len[1] = {60};
    cvllm_engine *e = engine_for(dir, 1024, 8 << 20, NULL);
    run(e, pb, len, 1, 8, &cold);
    cvllm_engine_destroy(e);
    CHECK_EQ_INT(shared_prefix_hit(dir, 1024, "all", 0, &cold), 32);
    CHECK_EQ_INT(shared_prefix_hit(dir, 1024, "none", 0, &cold), 32);
    CHECK_EQ_INT(shared_prefix_hit(dir, 1024, NULL, 32, &cold), 32);
    CHECK_EQ_INT(shared_prefix_hit(dir, 1024, "all", 48, &cold), 0);
    CHECK_EQ_INT(shared_prefix_hit(dir, 1024, "align", 0, &cold), 0);
    CHECK_EQ_INT(shared_prefix_hit(dir, 20, "align", 0, &cold), 32);
    tu_remove_tree(dir);
    free(dir);
}

/* lm-eval's loglikelihood requests on a hybrid model: max_tokens=1 with prompt logprobs, four
 * choices after a shared 50-token context, one at a time. Each finishes in the step that computes
 * its prompt, yet the context's blocks and their state checkpoints are kept, so choices 2 to 4
 * restore the state after 48 tokens; their prompt and sampled logprobs are a cold run's. */
static void test_loglikelihood_hits(const char *vec) {
    char *dir = tu_model_dir(vec);
    enum { CONTEXT = 50, CHOICES = 4 };
    int32_t prompts[CHOICES][CONTEXT + 4];
    int32_t *ptrs[CHOICES];
    size_t lens[CHOICES];
    for (int c = 0; c < CHOICES; c++) {
        for (int t = 0; t < CONTEXT; t++) prompts[c][t] = (t * 173 + 29) % 4096;
        for (int t = 0; t < 4; t++) prompts[c][CONTEXT + t] = (c * 331 + t * 53 + 2) % 4096;
        ptrs[c] = prompts[c];
        lens[c] = CONTEXT + 1 + (size_t)c % 3;
    }
    prompt_lp_k = 1;
    outcome cold[CHOICES] = {0}, warm[CHOICES] = {0};
    cvllm_engine *e = engine_for(dir, 1024, 8 << 20, NULL);
    for (int c = 0; c < CHOICES; c++) {
        cvllm_engine *fresh = engine_for(dir, 1024, 8 << 20, NULL); /* nothing cached: a cold run */
        run(fresh, &ptrs[c], &lens[c], 1, 1, &cold[c]);
        cvllm_engine_destroy(fresh);
        run(e, &ptrs[c], &lens[c], 1, 1, &warm[c]);
        CHECK_MSG(warm[c].cached == (c ? 48u : 0u), "%s choice %d: %zu tokens cached", vec, c, warm[c].cached);
        float worst = fabsf(warm[c].lp[0] - cold[c].lp[0]);
        for (size_t t = 1; t < lens[c]; t++) {
            worst = fmaxf(worst, fabsf(warm[c].prompt_lp[t] - cold[c].prompt_lp[t]));
            CHECK(warm[c].prompt_top[t] == cold[c].prompt_top[t]);
        }
        CHECK(warm[c].ids[0] == cold[c].ids[0]);
        CHECK_MSG(worst < 1e-4f, "%s choice %d: logprobs differ from a cold run by %g", vec, c, worst);
    }
    prompt_lp_k = -1;
    CHECK(cv_block_pool_usage(&e->blocks) == 0.0);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* Speculation on a hybrid model. A logit bias makes the model repeat token A, and the prompt has A
 * followed by C, so the n-gram proposer first drafts C (rejected: the recurrent state must roll
 * back) and then A (accepted). The raw logprobs, which the bias does not touch, show whether the
 * state after every step is exactly the one of a run without speculation. */
static void test_spec_decode_rollback(const char *vec) {
    char *dir = tu_model_dir(vec);
    static const int32_t A = 1234, C = 77;
    int32_t p[2][30];
    int32_t *prompts[2] = {p[0], p[1]};
    size_t lens[2] = {30, 30};
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 30; t++) p[i][t] = (t * 131 + i * 7 + 3) % 4096;
    p[0][4] = A, p[0][5] = C, p[1][9] = A, p[1][10] = C, p[1][11] = C;
    bias_id = &A;
    bias_value = 60.0f;
    outcome plain[2] = {0}, spec[2] = {0};
    cvllm_engine *e = engine_for(dir, 1024, 8 << 20, NULL);
    run(e, prompts, lens, 2, 20, plain);
    cvllm_engine_destroy(e);
    e = engine_for(dir, 1024, 8 << 20, "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_min\": 1}");
    run(e, prompts, lens, 2, 20, spec);
    float worst = 0;
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(spec[i].n == 20 && memcmp(spec[i].ids, plain[i].ids, 20 * sizeof(int32_t)) == 0,
                  "%s: request %d differs with speculation", vec, i);
        for (int t = 0; t < 20; t++) worst = fmaxf(worst, fabsf(spec[i].lp[t] - plain[i].lp[t]));
    }
    CHECK_MSG(worst < 1e-4f, "%s: logprobs with speculation differ by %g", vec, worst);
    const cv_spec_stats *st = &e->spec_stats;
    CHECK_MSG(st->num_accepted_tokens > 0 && st->num_accepted_tokens < st->num_draft_tokens,
              "%s: %llu of %llu drafts accepted; the test needs both outcomes", vec,
              (unsigned long long)st->num_accepted_tokens, (unsigned long long)st->num_draft_tokens);
    bias_id = NULL;
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* MTP drafting through the engine: the MTP layer catches up over every computed position and
 * proposes from its own KV cache; output and logprobs are those of plain decoding. */
static void test_mtp_identical(const char *vec, const char *method) {
    char *dir = tu_model_dir(vec);
    int32_t p[3][40];
    int32_t *prompts[3] = {p[0], p[1], p[2]};
    size_t lens[3] = {40, 23, 9};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 40; t++) p[i][t] = (t * 389 + i * 11 + 1) % 4096;
    outcome plain[3] = {0}, spec[3] = {0};
    cvllm_engine *e = engine_for(dir, 1024, 8 << 20, NULL);
    run(e, prompts, lens, 3, 16, plain);
    cvllm_engine_destroy(e);
    char cfg[128];
    for (int k = 1; k <= 3; k += 2) {
        snprintf(cfg, sizeof cfg, "{\"method\": \"%s\", \"num_speculative_tokens\": %d}", method, k);
        e = engine_for(dir, k == 3 ? 12 : 1024, 8 << 20, cfg); /* k = 3 also with chunked prefill */
        memset(spec, 0, sizeof spec);
        run(e, prompts, lens, 3, 16, spec);
        float worst = 0;
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(spec[i].n == 16 && memcmp(spec[i].ids, plain[i].ids, 16 * sizeof(int32_t)) == 0,
                      "%s k=%d: request %d differs with MTP", vec, k, i);
            for (int t = 0; t < 16; t++) worst = fmaxf(worst, fabsf(spec[i].lp[t] - plain[i].lp[t]));
        }
        CHECK_MSG(worst < 1e-4f, "%s k=%d: logprobs differ by %g", vec, k, worst);
        CHECK_MSG(e->spec_stats.num_drafts > 0 && e->spec_stats.num_draft_tokens >= e->spec_stats.num_drafts,
                  "%s k=%d: the MTP proposed nothing", vec, k);
        CHECK(cv_block_pool_usage(&e->blocks) == 0.0);
        cvllm_engine_destroy(e);
    }
    tu_remove_tree(dir);
    free(dir);
}

int main(void) {
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) test_reference_greedy(models[i]);
    test_prefix_hit("qwen3.5-moe-f32");
    test_prefix_hit("qwen3-next-bf16");
    test_loglikelihood_hits("qwen3.5-moe-f32");
    test_loglikelihood_hits("qwen3-next-bf16");
    test_prefix_hit("qwen3.5-dense-bf16");
    test_checkpoint_spacing("qwen3.5-moe-f32");
    test_spec_decode_rollback("qwen3.5-moe-f32");
    test_spec_decode_rollback("qwen3-next-bf16");
    test_mtp_identical("qwen3.5-moe-f32", "qwen3_5_mtp");
    test_mtp_identical("qwen3-next-bf16", "qwen3_next_mtp");
    test_mtp_identical("qwen3.5-dense-f32", "mtp");
    return cv_check_summary("test_engine_hybrid");
}
