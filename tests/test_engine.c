/*
 * test_engine.c — the offline engine through the public API (cvllm.h), on the reference checkpoints:
 * greedy output equal to Hugging Face's whatever the chunking, batching or preemption; logprobs equal
 * to the reference distribution; stop conditions; seeded sampling; and every validation error.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cvllm.h"
#include "engine/engine.h"
#include "engine_drain.h"
#include "testutil.h"

typedef struct result {
    uint64_t id;
    int32_t ids[64][256];
    size_t n_ids[64];
    char *text[64];
    cvllm_finish_reason finish[64];
    int32_t stop_token[64];
    char *stop_str[64];
    int32_t n_outputs;
    float chosen_logprob[64][256];
    float prompt_logprob[256];
    int32_t prompt_top1[256];
} result;

static int32_t blocks_override; /* num_gpu_blocks_override of make_engine's engines */

static cvllm_engine *make_engine(const char *dir, int32_t budget, uint64_t kv_bytes, int32_t max_model_len) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.max_num_batched_tokens = budget;
    o.kv_cache_memory_bytes = kv_bytes;
    o.num_gpu_blocks_override = blocks_override;
    o.max_model_len = max_model_len;
    o.num_threads = 2;
    o.block_size = 16;
    o.dtype = "float32"; /* the exact path: greedy ids and logprobs are held to the f32 reference */
    cvllm_engine *e = NULL;
    int rc = cvllm_engine_create(&o, &e);
    CHECK_MSG(rc == 0, "engine create: %s", cvllm_last_error());
    return e;
}

static cvllm_sampling_params greedy(const cvllm_engine *e, int32_t max_tokens) {
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    p.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
}

static void copy_output(result *r, const cvllm_request_output *o) {
    r->n_outputs = o->n_outputs;
    for (int32_t c = 0; c < o->n_outputs; c++) {
        const cvllm_completion_output *co = &o->outputs[c];
        r->n_ids[c] = co->n_token_ids;
        memcpy(r->ids[c], co->token_ids, co->n_token_ids * sizeof(int32_t));
        free(r->text[c]);
        r->text[c] = strndup(co->text, co->text_len);
        CHECK(strlen(co->text) == co->text_len);
        r->finish[c] = co->finish_reason;
        r->stop_token[c] = co->stop_token_id;
        free(r->stop_str[c]);
        r->stop_str[c] = co->stop_str ? strdup(co->stop_str) : NULL;
        if (co->logprobs)
            for (size_t t = 0; t < co->n_token_ids; t++) {
                r->chosen_logprob[c][t] = co->logprobs[t].chosen.logprob;
                CHECK(co->logprobs[t].chosen.token_id == co->token_ids[t]);
            }
    }
    if (o->prompt_logprobs)
        for (size_t t = 1; t < o->n_prompt_token_ids; t++) {
            r->prompt_logprob[t] = o->prompt_logprobs[t].chosen.logprob;
            r->prompt_top1[t] = o->prompt_logprobs[t].n_top ? o->prompt_logprobs[t].top[0].token_id : -1;
        }
}

typedef struct results {
    result *at;
    size_t n;
} results;

static void collect(void *ctx, const cvllm_request_output *o) {
    const results *rs = ctx;
    for (size_t i = 0; i < rs->n; i++)
        if (rs->at[i].id == o->request_id) copy_output(&rs->at[i], o);
}

/* Steps until all requests finish; results[i] collects request ids[i]. */
static void run_all(cvllm_engine *e, result *r, size_t n) {
    results rs = {r, n};
    tu_engine_drain(e, collect, &rs);
}

static void free_results(result *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < 64; c++) {
            free(r[i].text[c]);
            free(r[i].stop_str[c]);
        }
}

static uint64_t add_ids(cvllm_engine *e, const int32_t *ids, size_t n, const cvllm_sampling_params *p) {
    cvllm_prompt pr = {.token_ids = ids, .n_token_ids = n};
    uint64_t id = 0;
    int rc = cvllm_engine_add_request(e, &pr, p, &id);
    CHECK_MSG(rc == 0, "add_request: %s", cvllm_last_error());
    return id;
}

static bool all_blocks_free(const cvllm_engine *e) { return cv_block_pool_usage(&e->blocks) == 0.0; }

/* Greedy ids equal the reference for every budget: one-shot prefill, chunks of 1, 7 and 64. */
static void test_greedy_matches_reference(const char *vec) {
    static const char *cases[] = {"short", "long150"};
    static const int32_t budgets[] = {4096, 1, 7, 64};
    char *dir = tu_model_dir(vec);
    for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
        cvllm_engine *e = make_engine(dir, budgets[b], 8 << 20, 512);
        if (!e) continue;
        for (size_t c = 0; c < 2; c++) {
            json_t *ref = tu_load_ref(vec, cases[c]);
            size_t n_prompt, n_greedy;
            int32_t *prompt = tu_json_ids(ref, "prompt", &n_prompt);
            int32_t *want = tu_json_ids(ref, "greedy", &n_greedy);
            cvllm_sampling_params p = greedy(e, (int32_t)n_greedy);
            result *r = calloc(1, sizeof *r);
            r->id = add_ids(e, prompt, n_prompt, &p);
            run_all(e, r, 1);
            CHECK_EQ_INT(r->n_ids[0], n_greedy);
            CHECK_MSG(memcmp(r->ids[0], want, n_greedy * sizeof *want) == 0, "%s %s budget %d: greedy ids differ", vec,
                      cases[c], budgets[b]);
            CHECK_EQ_INT(r->finish[0], CVLLM_FINISH_LENGTH);
            free_results(r, 1);
            free(r);
            free(prompt);
            free(want);
            json_decref(ref);
        }
        CHECK(all_blocks_free(e));
        cvllm_engine_destroy(e);
    }
    tu_remove_tree(dir);
    free(dir);
}

/* 24 requests at once in a KV cache too small for all of them: preemption must happen, and every
 * reference prompt still yields the reference greedy ids. The cache is 320 tokens: a budget of
 * that size, or 20 blocks of 16 by num_gpu_blocks_override whatever the budget. */
static void test_batched_with_preemption(uint64_t kv_bytes, int32_t override) {
    const char *vec = "qwen3-dense-f32";
    char *dir = tu_model_dir(vec);
    /* 2 layers × 2 (K,V) × 2 heads × 32 dims × 4 B = 1 KiB a token */
    blocks_override = override;
    cvllm_engine *e = make_engine(dir, 96, kv_bytes, 200);
    blocks_override = 0;
    CHECK_EQ_INT(e->kv_blocks, 21); /* and the pool's reserved block */
    json_t *ref = tu_load_ref(vec, "long150");
    size_t n_prompt, n_greedy;
    int32_t *prompt = tu_json_ids(ref, "prompt", &n_prompt);
    int32_t *want = tu_json_ids(ref, "greedy", &n_greedy);
    enum { N = 24 };
    result *r = calloc(N, sizeof *r);
    int32_t other[40];
    for (int i = 0; i < N; i++) {
        cvllm_sampling_params p = greedy(e, (int32_t)n_greedy);
        if (i % 4 == 0) {
            r[i].id = add_ids(e, prompt, n_prompt, &p);
        } else {
            for (int t = 0; t < 40; t++) other[t] = (i * 131 + t * 17) % 4096;
            p.max_tokens = 5 + i;
            r[i].id = add_ids(e, other, 10 + i, &p);
        }
    }
    run_all(e, r, N);
    for (int i = 0; i < N; i += 4)
        CHECK_MSG(r[i].n_ids[0] == n_greedy && memcmp(r[i].ids[0], want, n_greedy * sizeof *want) == 0,
                  "request %d differs from the reference", i);
    for (int i = 1; i < N; i++)
        if (i % 4) CHECK_EQ_INT(r[i].n_ids[0], 5 + i);
    CHECK_MSG(e->sched.num_preemptions > 0, "expected preemptions with a 320-token cache");
    CHECK(all_blocks_free(e));
    free_results(r, N);
    free(r);
    free(prompt);
    free(want);
    json_decref(ref);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* An override that cannot hold one max_model_len request is refused, as a budget that small is. */
static void test_blocks_override_too_small(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.kv_cache_memory_bytes = 64 << 20;
    o.max_model_len = 200;
    o.num_gpu_blocks_override = 12;
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_CAPACITY);
    CHECK_CONTAINS(cvllm_last_error(), "num_gpu_blocks_override 12 holds 192 tokens, fewer than one request of "
                                       "max_model_len 200 needs (13 blocks of 16)");
    o.num_gpu_blocks_override = -1;
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    tu_remove_tree(dir);
    free(dir);
}

static void log_softmax(const float *x, size_t n, double *out) {
    double m = -INFINITY, s = 0;
    for (size_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (size_t i = 0; i < n; i++) s += exp(x[i] - m);
    for (size_t i = 0; i < n; i++) out[i] = x[i] - m - log(s);
}

static size_t argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* prompt_logprobs (chunked, budget 7) and sample logprobs equal the reference distribution. */
static void test_logprobs_match_reference(void) {
    const char *vec = "qwen3-dense-bf16";
    char *dir = tu_model_dir(vec);
    cvllm_engine *e = make_engine(dir, 7, 8 << 20, 512);
    json_t *ref = tu_load_ref(vec, "long150");
    size_t n_prompt, n_greedy, rows, cols, grows, gcols;
    int32_t *prompt = tu_json_ids(ref, "prompt", &n_prompt);
    int32_t *want = tu_json_ids(ref, "greedy", &n_greedy);
    float *logits = tu_load_ref_npy(vec, "ref.long150.logits.npy", &rows, &cols);
    float *gen = tu_load_ref_npy(vec, "ref.long150.gen_logits.npy", &grows, &gcols);
    cvllm_sampling_params p = greedy(e, (int32_t)n_greedy);
    p.logprobs = 3;
    p.prompt_logprobs = 2;
    result *r = calloc(1, sizeof *r);
    r->id = add_ids(e, prompt, n_prompt, &p);
    run_all(e, r, 1);
    double *lp = malloc(cols * sizeof *lp), worst = 0;
    for (size_t t = 1; t < n_prompt; t++) {
        log_softmax(logits + (t - 1) * cols, cols, lp);
        worst = fmax(worst, fabs(lp[prompt[t]] - r->prompt_logprob[t]));
        CHECK_EQ_INT(r->prompt_top1[t], argmax(logits + (t - 1) * cols, cols));
    }
    for (size_t t = 0; t < n_greedy; t++) {
        log_softmax(gen + t * gcols, gcols, lp);
        worst = fmax(worst, fabs(lp[want[t]] - r->chosen_logprob[0][t]));
    }
    CHECK_MSG(worst < 1e-3, "logprob differs from the reference by %g", worst);
    free(lp);
    free(logits);
    free(gen);
    free_results(r, 1);
    free(r);
    free(prompt);
    free(want);
    json_decref(ref);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* Greedy reference run of the short prompt, used by the stop-condition tests. */
static result *reference_run(cvllm_engine *e, const int32_t *prompt, size_t n, int32_t max_tokens) {
    result *r = calloc(1, sizeof *r);
    cvllm_sampling_params p = greedy(e, max_tokens);
    r->id = add_ids(e, prompt, n, &p);
    run_all(e, r, 1);
    return r;
}

static void test_stop_conditions(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    cvllm_engine *e = make_engine(dir, 4096, 8 << 20, 512);
    static const int32_t prompt[] = {40, 1079, 304, 279, 3753, 323, 432, 374};
    result *base = reference_run(e, prompt, 8, 12);
    CHECK_EQ_INT(base->n_ids[0], 12);

    /* stop_token_ids: ends at the first occurrence; the id is kept, its text is not. */
    cvllm_sampling_params p = greedy(e, 12);
    int32_t stop_id = base->ids[0][3];
    size_t first = 0;
    while (base->ids[0][first] != stop_id) first++;
    p.stop_token_ids = &stop_id;
    p.n_stop_token_ids = 1;
    result *r = calloc(1, sizeof *r);
    r->id = add_ids(e, prompt, 8, &p);
    run_all(e, r, 1);
    CHECK_EQ_INT(r->n_ids[0], first + 1);
    CHECK_EQ_INT(r->finish[0], CVLLM_FINISH_STOP);
    CHECK_EQ_INT(r->stop_token[0], stop_id);

    /* min_tokens hides the stop id until enough tokens exist. */
    p.min_tokens = (int32_t)first + 2;
    free_results(r, 1);
    memset(r, 0, sizeof *r);
    r->id = add_ids(e, prompt, 8, &p);
    run_all(e, r, 1);
    CHECK(r->n_ids[0] >= first + 2);
    CHECK(r->finish[0] == CVLLM_FINISH_STOP || r->n_ids[0] == 12);

    /* A stop string taken from the middle of the greedy text: the output ends right before it, or
     * right after it with include_stop_str_in_output. */
    size_t len = strlen(base->text[0]);
    if (len >= 6) {
        char stop[4] = {0};
        memcpy(stop, base->text[0] + len / 2, 3);
        const char *stops[] = {stop};
        char *at = strstr(base->text[0], stop);
        cvllm_sampling_params q = greedy(e, 12);
        q.stop = stops;
        q.n_stop = 1;
        for (int include = 0; include < 2; include++) {
            q.include_stop_str_in_output = include;
            free_results(r, 1);
            memset(r, 0, sizeof *r);
            r->id = add_ids(e, prompt, 8, &q);
            run_all(e, r, 1);
            size_t expect = (size_t)(at - base->text[0]) + (include ? 3 : 0);
            CHECK_EQ_INT(strlen(r->text[0]), expect);
            CHECK(strncmp(r->text[0], base->text[0], expect) == 0);
            CHECK_EQ_INT(r->finish[0], CVLLM_FINISH_STOP);
            CHECK_STR_EQ(r->stop_str[0], stop);
        }
    }
    free_results(base, 1);
    free_results(r, 1);
    free(base);
    free(r);
    CHECK(all_blocks_free(e));
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* A seeded request samples the same tokens alone and in a crowd; n=3 gives seed, seed+1, seed+2. */
static void test_seeded_sampling(void) {
    char *dir = tu_model_dir("qwen3-dense-bf16");
    cvllm_engine *e = make_engine(dir, 4096, 8 << 20, 512);
    static const int32_t prompt[] = {5, 6, 7, 8, 9};
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.max_tokens = 10;
    p.has_seed = true;
    p.seed = 1234;
    result *alone = calloc(3, sizeof *alone);
    for (int i = 0; i < 3; i++) {
        p.seed = 1234 + i;
        alone[i].id = add_ids(e, prompt, 5, &p);
    }
    run_all(e, alone, 3);
    CHECK(memcmp(alone[0].ids[0], alone[1].ids[0], 10 * sizeof(int32_t)) != 0);

    enum { CROWD = 6 };
    result *crowd = calloc(CROWD, sizeof *crowd);
    p.seed = 1234;
    p.n = 3;
    crowd[0].id = add_ids(e, prompt, 5, &p);
    cvllm_sampling_params noise = p;
    noise.n = 1;
    noise.has_seed = false;
    for (int i = 1; i < CROWD; i++) crowd[i].id = add_ids(e, prompt, 5, &noise);
    run_all(e, crowd, CROWD);
    CHECK_EQ_INT(crowd[0].n_outputs, 3);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(memcmp(crowd[0].ids[i], alone[i].ids[0], 10 * sizeof(int32_t)) == 0, "completion %d differs", i);
    free_results(alone, 3);
    free_results(crowd, CROWD);
    free(alone);
    free(crowd);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

static void test_abort(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    cvllm_engine *e = make_engine(dir, 4096, 8 << 20, 512);
    static const int32_t prompt[] = {1, 2, 3};
    cvllm_sampling_params p = greedy(e, 100);
    result *r = calloc(2, sizeof *r);
    r[0].id = add_ids(e, prompt, 3, &p);
    r[1].id = add_ids(e, prompt, 3, &p);
    const cvllm_request_output *const *outs;
    size_t n;
    CHECK(cvllm_engine_step(e, &outs, &n) == 0);
    CHECK(cvllm_engine_abort_request(e, r[0].id) == 0);
    CHECK(cvllm_engine_abort_request(e, 999999) == CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cvllm_last_error(), "999999");
    run_all(e, r, 2);
    CHECK_EQ_INT(r[0].finish[0], CVLLM_FINISH_ABORT);
    CHECK_EQ_INT(r[1].finish[0], CVLLM_FINISH_LENGTH);
    CHECK_EQ_INT(r[1].n_ids[0], 100);
    CHECK(all_blocks_free(e));
    free_results(r, 2);
    free(r);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

static void expect_rejected(cvllm_engine *e, const cvllm_prompt *pr, const cvllm_sampling_params *p, int code,
                            const char *msg) {
    uint64_t id;
    int rc = cvllm_engine_add_request(e, pr, p, &id);
    CHECK_MSG(rc == code, "expected %d, got %d for \"%s\"", code, rc, msg);
    CHECK_CONTAINS(cvllm_last_error(), msg);
}

static void test_request_validation(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    cvllm_engine *e = make_engine(dir, 4096, 8 << 20, 16);
    int32_t ids[20] = {1, 2, 3};
    cvllm_prompt ok = {.token_ids = ids, .n_token_ids = 3};
    const int bad = CVLLM_ERR_INVALID_ARGUMENT;
    cvllm_sampling_params p = greedy(e, 4);
    p.temperature = -1;
    expect_rejected(e, &ok, &p, bad, "temperature must be non-negative");
    p = greedy(e, 4), p.top_p = 0;
    expect_rejected(e, &ok, &p, bad, "top_p must be in (0, 1]");
    p = greedy(e, 4), p.top_k = -5;
    expect_rejected(e, &ok, &p, bad, "top_k must be 0 (disable), or at least 1");
    p = greedy(e, 4), p.n = 0;
    expect_rejected(e, &ok, &p, bad, "n must be at least 1");
    p = greedy(e, 4), p.min_p = 2;
    expect_rejected(e, &ok, &p, bad, "min_p must be in [0, 1]");
    p = greedy(e, 4), p.presence_penalty = 3;
    expect_rejected(e, &ok, &p, bad, "presence_penalty must be in [-2, 2]");
    p = greedy(e, 4), p.repetition_penalty = 0;
    expect_rejected(e, &ok, &p, bad, "repetition_penalty must be greater than zero");
    p = greedy(e, 0);
    expect_rejected(e, &ok, &p, bad, "max_tokens must be at least 1");
    p = greedy(e, 4), p.min_tokens = 5;
    expect_rejected(e, &ok, &p, bad, "min_tokens must be less than or equal to max_tokens");
    p = greedy(e, 4), p.logprobs = 21;
    expect_rejected(e, &ok, &p, bad, "Requested sample logprobs of 21, which is greater than max allowed: 20");
    p = greedy(e, 4), p.prompt_logprobs = 50;
    expect_rejected(e, &ok, &p, bad, "Requested prompt logprobs of 50");
    int32_t bias_id = 4096;
    float bias = 1;
    p = greedy(e, 4), p.logit_bias_ids = &bias_id, p.logit_bias_values = &bias, p.n_logit_bias = 1;
    expect_rejected(e, &ok, &p, bad, "out-of-vocab token ids. Vocabulary size: 4096");
    p = greedy(e, 4);
    ids[1] = 4096;
    expect_rejected(e, &ok, &p, bad, "Token id 4096 is out of vocabulary");
    ids[1] = 2;
    cvllm_prompt empty = {.token_ids = ids, .n_token_ids = 0};
    expect_rejected(e, &empty, &p, bad, "The decoder prompt cannot be empty");
    cvllm_prompt longp = {.token_ids = ids, .n_token_ids = 20};
    expect_rejected(e, &longp, &p, CVLLM_ERR_CAPACITY, "is longer than the maximum model length of 16");
    cvllm_prompt both = {.text = "hi", .token_ids = ids, .n_token_ids = 3};
    expect_rejected(e, &both, &p, bad, "either text or token ids");
    cvllm_prompt bad_utf8 = {.text = "a\xff" "b"};
    uint64_t id;
    CHECK(cvllm_engine_add_request(e, &bad_utf8, &p, &id) == bad);
    CHECK(!cvllm_engine_has_unfinished(e));

    /* max_tokens beyond the context is cut to what fits: 3 + 13 = max_model_len 16. */
    p = greedy(e, 1000);
    result *r = calloc(1, sizeof *r);
    r->id = add_ids(e, ids, 3, &p);
    run_all(e, r, 1);
    CHECK_EQ_INT(r->n_ids[0], 13);
    CHECK_EQ_INT(r->finish[0], CVLLM_FINISH_LENGTH);
    free_results(r, 1);
    free(r);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* Creation fails with `code` and `msg`, and cvllm_engine_check, which makes no engine, says the same. */
static void expect_create_fails(cvllm_engine_options *o, int code, const char *msg) {
    cvllm_engine *e = (cvllm_engine *)1;
    int rc = cvllm_engine_create(o, &e);
    CHECK_MSG(rc == code, "expected %d got %d (%s)", code, rc, cvllm_last_error());
    CHECK(e == NULL);
    CHECK_CONTAINS(cvllm_last_error(), msg);
    rc = cvllm_engine_check(o);
    CHECK_MSG(rc == code, "check: expected %d got %d (%s)", code, rc, cvllm_last_error());
    CHECK_CONTAINS(cvllm_last_error(), msg);
}

static void test_engine_creation_errors(void) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = "/nonexistent/cvllm-model";
    expect_create_fails(&o, CVLLM_ERR_NOT_FOUND, "/nonexistent/cvllm-model");

    char *dir = tu_model_dir("qwen3-dense-f32");
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.kv_cache_memory_bytes = 64 * 1024;
    o.max_model_len = 1024;
    /* vLLM's words, its typo included. */
    expect_create_fails(&o, CVLLM_ERR_CAPACITY, "To serve at least one request with the models's max seq len (1024)");
    o.kv_cache_memory_bytes = 0;
    o.max_model_len = 100000;
    expect_create_fails(&o, CVLLM_ERR_INVALID_ARGUMENT, "User-specified max_model_len (100000) is greater than");
    o.max_model_len = 0;
    o.load_format = "pt";
    expect_create_fails(&o, CVLLM_ERR_INVALID_ARGUMENT, "invalid load format 'pt'");
    o.load_format = NULL;
    o.dtype = "int4";
    expect_create_fails(&o, CVLLM_ERR_INVALID_ARGUMENT, "invalid dtype 'int4'");
    /* what passes the check: these options fixed, with a tensor-parallel size too (no MPI job needed) */
    o.dtype = NULL;
    CHECK_MSG(cvllm_engine_check(&o) == CVLLM_OK, "%s", cvllm_last_error());
    o.tensor_parallel_size = 2;
    CHECK_MSG(cvllm_engine_check(&o) == CVLLM_OK, "%s", cvllm_last_error());
    o.quantization = "ascend";
    expect_create_fails(&o, CVLLM_ERR_INVALID_ARGUMENT, "Cannot find the config file for ascend");
    o.quantization = NULL;
    o.tensor_parallel_size = 3; /* the loaders' split errors, before anything is loaded */
    expect_create_fails(&o, CVLLM_ERR_UNSUPPORTED,
                        "num_attention_heads=4 and num_key_value_heads=2 do not split over tensor_parallel_size=3");
    tu_remove_tree(dir);
    free(dir);
    dir = tu_model_dir("qwen3.5-moe-f32");
    o.model = dir;
    o.tensor_parallel_size = 4;
    expect_create_fails(&o, CVLLM_ERR_UNSUPPORTED, "linear_num_key_heads=2 does not split over tensor_parallel_size=4");
    tu_remove_tree(dir);
    free(dir);

    /* An architecture the registry does not know is named, with the supported ones. */
    dir = tu_make_temp_dir();
    char *cfg_path = tu_strdupf("%s/vectors/%s/config.json", CVLLM_TEST_DATA, "qwen3-dense-f32");
    json_t *cfg = json_load_file(cfg_path, 0, NULL);
    json_object_set_new(cfg, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    char *text = json_dumps(cfg, 0);
    tu_write_file(dir, "config.json", text, strlen(text));
    char *st = tu_strdupf("%s/vectors/%s/model.safetensors", CVLLM_TEST_DATA, "qwen3-dense-f32");
    tu_link(st, dir, "model.safetensors");
    char *tk = tu_strdupf("%s/models/qwen3-tokenizer/%s", CVLLM_SOURCE_DIR, "tokenizer.json");
    tu_link(tk, dir, "tokenizer.json");
    cvllm_engine_options_default(&o);
    o.model = dir;
    expect_create_fails(&o, CVLLM_ERR_UNSUPPORTED, "LlamaForCausalLM");
    CHECK_CONTAINS(cvllm_last_error(), "Qwen3ForCausalLM");
    free(text);
    free(st);
    free(tk);
    free(cfg_path);
    json_decref(cfg);
    tu_remove_tree(dir);
    free(dir);
}

/* Text prompts go through the tokenizer; the output text is the detokenized ids. */
static void test_text_prompt(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    cvllm_engine *e = make_engine(dir, 4096, 8 << 20, 512);
    cvllm_prompt pr = {.text = "I am in the house"};
    cvllm_sampling_params p = greedy(e, 6);
    result *r = calloc(1, sizeof *r);
    CHECK(cvllm_engine_add_request(e, &pr, &p, &r->id) == 0);
    const cvllm_request_output *const *outs;
    size_t n;
    CHECK(cvllm_engine_step(e, &outs, &n) == 0);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(outs[0]->n_prompt_token_ids, 5); /* [40, 1079, 304, 279, 3753] */
    CHECK_EQ_INT(outs[0]->prompt_token_ids[4], 3753);
    run_all(e, r, 1);
    char *text = NULL;
    CHECK(cvllm_detokenize(cvllm_engine_tokenizer(e), r->ids[0], r->n_ids[0], true, &text) == 0);
    CHECK_STR_EQ(r->text[0], text);
    cvllm_free(text);
    free_results(r, 1);
    free(r);
    cvllm_engine_destroy(e);
    tu_remove_tree(dir);
    free(dir);
}

/* A second request that shares a 3-block prefix takes it from the cache (and computes the same
 * tokens); another cache_salt, or caching switched off, gets no hit. */
static void test_prefix_caching(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    int32_t prompt[50];
    for (int t = 0; t < 50; t++) prompt[t] = (t * 37 + 11) % 4096;
    for (int enabled = 0; enabled < 2; enabled++) {
        cvllm_engine_options o;
        cvllm_engine_options_default(&o);
        o.model = dir;
        o.kv_cache_memory_bytes = 8 << 20;
        o.max_model_len = 512;
        o.enable_prefix_caching = enabled;
        cvllm_engine *e = NULL;
        CHECK(cvllm_engine_create(&o, &e) == 0);
        cvllm_sampling_params p = greedy(e, 6);
        result *r = calloc(4, sizeof *r);
        size_t cached[4];
        static const char *salts[] = {NULL, NULL, "tenant-a", NULL};
        for (int i = 0; i < 4; i++) {
            if (i == 3) prompt[5] ^= 1; /* differs inside the first block: nothing to share */
            cvllm_prompt pr = {.token_ids = prompt, .n_token_ids = 50, .cache_salt = salts[i]};
            CHECK(cvllm_engine_add_request(e, &pr, &p, &r[i].id) == 0);
            cached[i] = SIZE_MAX;
            while (cvllm_engine_has_unfinished(e)) {
                const cvllm_request_output *const *outs;
                size_t n;
                CHECK(cvllm_engine_step(e, &outs, &n) == 0);
                for (size_t k = 0; k < n; k++) {
                    cached[i] = outs[k]->n_cached_tokens;
                    copy_output(&r[i], outs[k]);
                }
            }
        }
        prompt[5] ^= 1;
        CHECK_EQ_INT(cached[0], 0);
        CHECK_EQ_INT(cached[1], enabled ? 48 : 0);
        CHECK_EQ_INT(cached[2], 0);
        CHECK_EQ_INT(cached[3], 0);
        for (int i = 1; i < 3; i++) CHECK(memcmp(r[i].ids[0], r[0].ids[0], 6 * sizeof(int32_t)) == 0);
        CHECK_EQ_INT(e->sched.prefix_hits, enabled ? 48 : 0);
        CHECK(all_blocks_free(e));
        free_results(r, 4);
        free(r);
        cvllm_engine_destroy(e);
    }
    tu_remove_tree(dir);
    free(dir);
}

/* One lm-eval loglikelihood request as the engine sees it (/v1/completions with echo, logprobs=1,
 * max_tokens=1): one sampled token, and the prompt logprobs with k top entries (k = -1: none). */
typedef struct loglikelihood {
    size_t cached;
    size_t n_prompt;
    cvllm_logprob chosen[80], top[80][4];
    int32_t n_top[80];
    cvllm_logprob sampled;
} loglikelihood;

static void run_loglikelihood(cvllm_engine *e, const int32_t *prompt, size_t n, int32_t k, loglikelihood *out) {
    cvllm_sampling_params p = greedy(e, 1);
    p.logprobs = 1;
    p.prompt_logprobs = k;
    memset(out, 0, sizeof *out);
    uint64_t id = add_ids(e, prompt, n, &p);
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n_outs;
        CHECK(cvllm_engine_step(e, &outs, &n_outs) == 0);
        for (size_t j = 0; j < n_outs; j++) {
            const cvllm_request_output *o = outs[j];
            if (o->request_id != id || !o->finished) continue;
            out->cached = o->n_cached_tokens;
            out->n_prompt = o->n_prompt_token_ids;
            out->sampled = o->outputs[0].logprobs[0].chosen;
            for (size_t t = 0; o->prompt_logprobs && t < n; t++) {
                out->chosen[t] = o->prompt_logprobs[t].chosen;
                out->n_top[t] = o->prompt_logprobs[t].n_top;
                if (out->n_top[t])
                    memcpy(out->top[t], o->prompt_logprobs[t].top, (size_t)out->n_top[t] * sizeof(cvllm_logprob));
            }
        }
    }
}

static bool same_logprob(cvllm_logprob a, cvllm_logprob b) {
    return a.token_id == b.token_id && a.rank == b.rank && a.logprob == b.logprob;
}

/* Every entry bit for bit: the cached positions' entries were computed by an earlier request, and
 * the kernels give each row the same values whatever was batched or cached beside it. */
static bool same_loglikelihood(const loglikelihood *a, const loglikelihood *b) {
    bool same = a->n_prompt == b->n_prompt && same_logprob(a->sampled, b->sampled);
    for (size_t t = 0; same && t < a->n_prompt; t++) {
        same = same_logprob(a->chosen[t], b->chosen[t]) && a->n_top[t] == b->n_top[t];
        for (int32_t i = 0; same && i < a->n_top[t]; i++) same = same_logprob(a->top[t][i], b->top[t][i]);
    }
    return same;
}

/* lm-eval's loglikelihood requests: the choices of a question share a context and each finishes in
 * the step that computes its prompt. The context's blocks are cached when computed, so the 2nd to
 * 4th choice skip it, and their prompt logprobs (kept with the blocks) equal a cold run's. */
static void test_prefix_caching_loglikelihood(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    enum { CONTEXT = 50, CONT = 5 };
    int32_t prompt[CONTEXT + CONT];
    for (int t = 0; t < CONTEXT; t++) prompt[t] = (t * 41 + 3) % 4096;
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.kv_cache_memory_bytes = 8 << 20;
    o.max_model_len = 512;
    o.enable_prefix_caching = false;
    cvllm_engine *cold = NULL, *warm = make_engine(dir, 4096, 8 << 20, 512);
    CHECK(cvllm_engine_create(&o, &cold) == 0);
    /* (context length, choice, prompt-logprob k, expected hit). The hit is the context's full blocks
     * (48 tokens), unless the kept logprobs are short of entries: a record with fewer top entries
     * than asked for, or a context that ends on a block boundary, whose last row's entry is for the
     * first token of another choice (then one block less). */
    static const struct { int ctx, choice, k, hit; } cases[] = {
        {50, 0, 1, 0}, {50, 1, 1, 48}, {50, 2, 1, 48}, {50, 3, 1, 48},
        {50, 0, -1, 48}, /* a plain max_tokens=1 request */
        {50, 1, 3, 0},   /* the records keep 1 top entry: recomputed, and kept again with 3 */
        {50, 2, 2, 48},
        {48, 0, 1, 0}, {48, 1, 1, 32},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int ctx = cases[c].ctx;
        if (ctx == 48) prompt[0] = 7; /* a new context */
        for (int t = 0; t < CONT; t++) prompt[ctx + t] = (cases[c].choice * 613 + t * 89 + 1) % 4096;
        loglikelihood want, got;
        run_loglikelihood(cold, prompt, (size_t)(ctx + CONT), cases[c].k, &want);
        run_loglikelihood(warm, prompt, (size_t)(ctx + CONT), cases[c].k, &got);
        CHECK_MSG(got.cached == (size_t)cases[c].hit, "case %zu: %zu tokens cached, expected %d", c, got.cached,
                  cases[c].hit);
        CHECK_EQ_INT(want.cached, 0);
        CHECK_MSG(same_loglikelihood(&got, &want), "case %zu: logprobs differ from a cold run", c);
    }
    CHECK(all_blocks_free(warm));
    cvllm_engine_destroy(cold);
    cvllm_engine_destroy(warm);
    tu_remove_tree(dir);
    free(dir);
}

/* Batch invariance: a request's logits do not depend on what runs beside it. The kernels compute
 * each output element in the same order whatever the batch, so the logprobs are bit-identical. */
static void test_batch_invariance(void) {
    char *dir = tu_model_dir("qwen3-dense-bf16");
    int32_t prompt[40];
    for (int t = 0; t < 40; t++) prompt[t] = (t * 53 + 7) % 4096;
    result *alone = calloc(1, sizeof *alone), *crowd = calloc(12, sizeof *crowd);
    for (int pass = 0; pass < 2; pass++) {
        cvllm_engine *e = make_engine(dir, pass ? 24 : 4096, 8 << 20, 512);
        cvllm_sampling_params p = greedy(e, 16);
        p.logprobs = 0;
        result *r = pass ? crowd : alone;
        int n = pass ? 12 : 1;
        for (int i = 0; i < n; i++) {
            int32_t other[60];
            for (int t = 0; t < 60; t++) other[t] = (i * 71 + t * 29) % 4096;
            if (i == 5 || !pass) r[i].id = add_ids(e, prompt, 40, &p);
            else r[i].id = add_ids(e, other, 10 + 4 * (size_t)i, &p);
        }
        run_all(e, r, (size_t)n);
        cvllm_engine_destroy(e);
    }
    CHECK(memcmp(crowd[5].ids[0], alone->ids[0], 16 * sizeof(int32_t)) == 0);
    CHECK_MSG(memcmp(crowd[5].chosen_logprob[0], alone->chosen_logprob[0], 16 * sizeof(float)) == 0,
              "logprobs differ between a lone and a batched run");
    free_results(alone, 1);
    free_results(crowd, 12);
    free(alone);
    free(crowd);
    tu_remove_tree(dir);
    free(dir);
}

int main(void) {
    static const char *dense[] = {"qwen3-dense-f32", "qwen3-dense-bf16", "qwen3-dense-tied-f32", "qwen3-dense-tied-bf16"};
    for (size_t i = 0; i < 4; i++) test_greedy_matches_reference(dense[i]);
    test_batched_with_preemption(320 * 1024, 0);
    test_batched_with_preemption(64 << 20, 20);
    test_blocks_override_too_small();
    test_logprobs_match_reference();
    test_stop_conditions();
    test_seeded_sampling();
    test_abort();
    test_request_validation();
    test_engine_creation_errors();
    test_text_prompt();
    test_prefix_caching();
    test_prefix_caching_loglikelihood();
    test_batch_invariance();
    return cv_check_summary("test_engine");
}
