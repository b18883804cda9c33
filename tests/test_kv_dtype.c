/*
 * test_kv_dtype.c — the KV cache's dtype (cvllm_engine_options.kv_cache_dtype, --kv-cache-dtype)
 * through the C API and the CLI, computing in f32 so that the cache is the only thing rounded:
 *   - a bf16 cache holds twice the tokens of an f32 one in the same budget, in the log and in the
 *     fit check made from config.json before the weights load (a budget only bf16 fits is taken);
 *   - auto follows the compute dtype, and the cache is what was asked for; a model refuses a cache
 *     of any other dtype;
 *   - on a dense and a hybrid reference model, prompt + greedy ids teacher-forced through the
 *     engine (one-shot, chunked, two prompts batched) give the reference log-probs within BOUND
 *     over the reference's top-5 ids at every row, and free-running greedy ids equal the
 *     reference's at every step whose reference margin exceeds 2·BOUND (log-probs that move by at
 *     most BOUND cannot swap two ids further apart than that); the bf16 run does differ from the
 *     f32-cache one, so the cache really is bf16;
 *   - MTP speculative decoding (its own KV layer, drafts rejected and rolled back) over a bf16
 *     cache gives the greedy ids of plain decoding;
 *   - fp8 names are refused as unsupported, other names as invalid, each in one line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "check.h"
#include "cvllm.h"
#include "engine/engine.h"
#include "engine_drain.h"
#include "testutil.h"

/* A bf16 cache rounds K and V to 8 significant bits (relative error ≤ 2^-9), a small part of what a
 * whole-bf16 forward pass rounds; the bf16 compute mode is held to 5e-3 over the top-5 log-probs
 * on these models, and the KV rounding alone must stay well inside that. */
#define BOUND 2e-3

enum { TOP = 20, MAX_ROWS = 160, GREEDY = 8 };

typedef struct engine_spec {
    const char *kv, *dtype, *speculative;
    int32_t budget;
    uint64_t kv_bytes;
    int32_t max_model_len;
    int32_t block_size; /* 0: 16 */
} engine_spec;

static int make_engine(const char *dir, const engine_spec *s, cvllm_engine **e) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.kv_cache_dtype = s->kv;
    o.dtype = s->dtype;
    o.speculative_config = s->speculative;
    o.max_num_batched_tokens = s->budget;
    o.kv_cache_memory_bytes = s->kv_bytes;
    o.max_model_len = s->max_model_len;
    o.max_num_seqs = 8;
    o.num_threads = 2;
    o.block_size = s->block_size ? s->block_size : 16;
    *e = NULL;
    return cvllm_engine_create(&o, e);
}

static cvllm_engine *engine_or_fail(const char *dir, const engine_spec *s) {
    cvllm_engine *e;
    int rc = make_engine(dir, s, &e);
    CHECK_MSG(rc == 0, "%s, kv %s: %s", dir, s->kv, cvllm_last_error());
    return rc ? NULL : e;
}

/* ---- what a request gave --------------------------------------------------------------------- */

typedef struct row_logprobs {
    int32_t n;
    int32_t id[TOP];
    float lp[TOP];
} row_logprobs;

typedef struct outcome {
    uint64_t id;
    int32_t ids[64];
    float chosen[64];                /* log-prob of each generated id */
    size_t n_ids;
    row_logprobs rows[MAX_ROWS + 1]; /* rows[L]: the distribution after the first L tokens */
} outcome;

static void copy_row(row_logprobs *r, const cvllm_position_logprobs *p) {
    r->n = p->n_top < TOP ? p->n_top : TOP;
    for (int32_t i = 0; i < r->n; i++) r->id[i] = p->top[i].token_id, r->lp[i] = p->top[i].logprob;
}

static void copy_outcome(outcome *o, const cvllm_request_output *out) {
    const cvllm_completion_output *c = &out->outputs[0];
    o->n_ids = c->n_token_ids;
    memcpy(o->ids, c->token_ids, c->n_token_ids * sizeof *o->ids);
    for (size_t t = 0; c->logprobs && t < c->n_token_ids; t++) o->chosen[t] = c->logprobs[t].chosen.logprob;
    if (out->prompt_logprobs)
        for (size_t t = 1; t < out->n_prompt_token_ids && t <= MAX_ROWS; t++) copy_row(&o->rows[t], &out->prompt_logprobs[t]);
    if (c->logprobs && c->logprobs[0].n_top && c->n_token_ids == 1 && out->n_prompt_token_ids <= MAX_ROWS)
        copy_row(&o->rows[out->n_prompt_token_ids], &c->logprobs[0]);
}

typedef struct outcomes {
    outcome *at;
    size_t n;
} outcomes;

static void collect(void *ctx, const cvllm_request_output *o) {
    const outcomes *os = ctx;
    for (size_t i = 0; i < os->n; i++)
        if (os->at[i].id == o->request_id) copy_outcome(&os->at[i], o);
}

/* Runs the prompts together (greedy, max_tokens each, the log-probs of the generated ids; with `top`,
 * the TOP most likely at every prompt position and generated token) to completion. */
static void run(cvllm_engine *e, int32_t *const *prompts, const size_t *lens, size_t n, int32_t max_tokens, bool top,
                outcome *out) {
    for (size_t i = 0; i < n; i++) {
        cvllm_sampling_params p;
        cvllm_sampling_params_default(e, &p);
        p.temperature = 0;
        p.max_tokens = max_tokens;
        p.logprobs = top ? TOP : 0;
        p.prompt_logprobs = top ? TOP : -1;
        cvllm_prompt pr = {.token_ids = prompts[i], .n_token_ids = lens[i]};
        CHECK_MSG(cvllm_engine_add_request(e, &pr, &p, &out[i].id) == 0, "add_request: %s", cvllm_last_error());
    }
    outcomes os = {out, n};
    tu_engine_drain(e, collect, &os);
}

/* ---- the references --------------------------------------------------------------------------- */

static const char *const CASES[] = {"short", "long150"};

typedef struct reference {
    int32_t *prompt, *greedy;
    size_t n_prompt, n_greedy, vocab;
    float *logits, *gen; /* [n_prompt][vocab], [n_greedy][vocab] */
} reference;

static void load_reference(const char *vec, const char *name, reference *r) {
    json_t *j = tu_load_ref(vec, name);
    r->prompt = tu_json_ids(j, "prompt", &r->n_prompt);
    r->greedy = tu_json_ids(j, "greedy", &r->n_greedy);
    json_decref(j);
    char file[64];
    size_t rows, grows, gcols;
    snprintf(file, sizeof file, "ref.%s.logits.npy", name);
    r->logits = tu_load_ref_npy(vec, file, &rows, &r->vocab);
    snprintf(file, sizeof file, "ref.%s.gen_logits.npy", name);
    r->gen = tu_load_ref_npy(vec, file, &grows, &gcols);
    CHECK(rows == r->n_prompt && grows == r->n_greedy && gcols == r->vocab && r->n_greedy == GREEDY);
    CHECK(r->n_prompt + r->n_greedy <= MAX_ROWS);
}

static void free_reference(reference *r) {
    free(r->prompt), free(r->greedy), free(r->logits), free(r->gen);
}

/* The reference logits after the first L tokens of prompt + greedy ids (L ≥ 1). */
static const float *reference_row(const reference *r, size_t L) {
    return L <= r->n_prompt ? r->logits + (L - 1) * r->vocab : r->gen + (L - r->n_prompt) * r->vocab;
}

static void log_softmax(const float *x, size_t n, double *out) {
    double m = -INFINITY, s = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, x[i]);
    for (size_t i = 0; i < n; i++) s += exp(x[i] - m);
    for (size_t i = 0; i < n; i++) out[i] = x[i] - m - log(s);
}

/* max |Δ log-prob| over the reference's top-5 ids of row L; an id outside our top-TOP: infinite. */
static double row_error(const reference *r, size_t L, const row_logprobs *ours, double *lp) {
    log_softmax(reference_row(r, L), r->vocab, lp);
    double worst = 0;
    for (int k = 0; k < 5; k++) {
        size_t best = 0;
        for (size_t i = 1; i < r->vocab; i++)
            if (lp[i] > lp[best]) best = i;
        double mine = INFINITY;
        for (int32_t i = 0; i < ours->n; i++)
            if ((size_t)ours->id[i] == best) mine = ours->lp[i];
        worst = fmax(worst, fabs(mine - lp[best]));
        lp[best] = -INFINITY;
    }
    return worst;
}

/* top-1 minus top-2 of the reference logits before greedy step i. */
static double reference_margin(const reference *r, size_t i) {
    const float *x = r->gen + i * r->vocab;
    double a = -INFINITY, b = -INFINITY;
    for (size_t v = 0; v < r->vocab; v++) {
        if (x[v] > a) b = a, a = x[v];
        else if (x[v] > b) b = x[v];
    }
    return a - b;
}

/* ---- accuracy on the reference models ---------------------------------------------------------- */

/* Both prompts + their first 7 greedy ids, batched, max_tokens 1: every row of the references. */
static double teacher_forced_error(const char *dir, const engine_spec *s, const reference *refs, outcome *out) {
    int32_t *prompts[2];
    size_t lens[2];
    for (int c = 0; c < 2; c++) {
        lens[c] = refs[c].n_prompt + GREEDY - 1;
        prompts[c] = malloc(lens[c] * sizeof(int32_t));
        memcpy(prompts[c], refs[c].prompt, refs[c].n_prompt * sizeof(int32_t));
        memcpy(prompts[c] + refs[c].n_prompt, refs[c].greedy, (GREEDY - 1) * sizeof(int32_t));
    }
    double worst = INFINITY;
    cvllm_engine *e = engine_or_fail(dir, s);
    if (e) {
        memset(out, 0, 2 * sizeof *out);
        run(e, prompts, lens, 2, 1, true, out);
        worst = 0;
        double *lp = malloc(refs[0].vocab * sizeof *lp);
        for (int c = 0; c < 2; c++)
            for (size_t L = 1; L <= lens[c]; L++) worst = fmax(worst, row_error(&refs[c], L, &out[c].rows[L], lp));
        free(lp);
        cvllm_engine_destroy(e);
    }
    free(prompts[0]), free(prompts[1]);
    return worst;
}

static bool same_logprobs(const outcome *a, const outcome *b) {
    for (int c = 0; c < 2; c++)
        for (int L = 1; L <= MAX_ROWS; L++)
            if (memcmp(a[c].rows[L].lp, b[c].rows[L].lp, sizeof a[c].rows[L].lp)) return false;
    return true;
}

static void test_reference_model(const char *vec) {
    char *dir = tu_model_dir(vec);
    reference refs[2];
    for (int c = 0; c < 2; c++) load_reference(vec, CASES[c], &refs[c]);
    outcome *f32 = calloc(2, sizeof *f32), *bf16 = calloc(2, sizeof *bf16);
    static const int32_t budgets[] = {4096, 7}; /* one-shot; chunks of 7 */
    for (size_t b = 0; b < CV_ARRAY_LEN(budgets); b++) {
        engine_spec s = {.kv = "float32", .dtype = "float32", .budget = budgets[b], .kv_bytes = 8 << 20,
                         .max_model_len = 256};
        double exact = teacher_forced_error(dir, &s, refs, f32);
        s.kv = "bfloat16";
        double rounded = teacher_forced_error(dir, &s, refs, bf16);
        printf("%s budget %d: max |dlogprob| over the top-5: f32 KV %.2e, bf16 KV %.2e\n", vec, budgets[b], exact,
               rounded);
        CHECK_MSG(rounded <= BOUND, "%s budget %d: bf16 KV log-probs %g from the reference (bound %g)", vec,
                  budgets[b], rounded, BOUND);
        CHECK_MSG(!same_logprobs(f32, bf16), "%s: the bf16 KV run gave the f32 KV run's log-probs", vec);
        /* 128-slot blocks (the Qwen3 tutorial's --block-size) hold K in 16-row panels. Attention's bits do
         * not depend on the block size, so a dense model's are the same; a hybrid's linear-attention state
         * is checkpointed at block ends, which are chunk boundaries of its scan, so it is held to the bound. */
        s.block_size = 128;
        const double large_blocks = teacher_forced_error(dir, &s, refs, f32);
        if (strstr(vec, "dense"))
            CHECK_MSG(same_logprobs(f32, bf16), "%s budget %d: bf16 KV log-probs in 128-slot blocks differ from "
                      "16-slot ones", vec, budgets[b]);
        CHECK_MSG(large_blocks <= BOUND, "%s budget %d: bf16 KV log-probs in 128-slot blocks %g from the reference",
                  vec, budgets[b], large_blocks);
    }
    /* Free-running greedy, both prompts batched, token-by-token decode over the bf16 cache. */
    engine_spec s = {.kv = "bfloat16", .dtype = "float32", .budget = 4096, .kv_bytes = 8 << 20, .max_model_len = 256};
    cvllm_engine *e = engine_or_fail(dir, &s);
    if (e) {
        int32_t *prompts[2] = {refs[0].prompt, refs[1].prompt};
        size_t lens[2] = {refs[0].n_prompt, refs[1].n_prompt};
        memset(bf16, 0, 2 * sizeof *bf16);
        run(e, prompts, lens, 2, GREEDY, false, bf16);
        for (int c = 0; c < 2; c++) {
            CHECK_EQ_INT(bf16[c].n_ids, GREEDY);
            size_t decided = 0;
            while (decided < GREEDY && reference_margin(&refs[c], decided) > 2 * BOUND) decided++;
            for (size_t i = 0; i < decided; i++)
                CHECK_MSG(bf16[c].ids[i] == refs[c].greedy[i], "%s %s: greedy step %zu is %d, the reference's %d",
                          vec, CASES[c], i, bf16[c].ids[i], refs[c].greedy[i]);
            printf("%s %s: bf16 KV greedy ids checked at %zu of %d steps\n", vec, CASES[c], decided, GREEDY);
        }
        CHECK(cv_block_pool_usage(&e->blocks) == 0.0);
        cvllm_engine_destroy(e);
    }
    free(f32), free(bf16);
    for (int c = 0; c < 2; c++) free_reference(&refs[c]);
    tu_remove_tree(dir);
    free(dir);
}

/* MTP drafts read and write the bf16 cache too (their own layer); rejected drafts are rolled back.
 * Greedy output must be plain decoding's. */
static void test_mtp_over_bf16(const char *vec, const char *method) {
    char *dir = tu_model_dir(vec);
    int32_t p[3][40];
    int32_t *prompts[3] = {p[0], p[1], p[2]};
    size_t lens[3] = {40, 23, 9};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 40; t++) p[i][t] = (t * 389 + i * 11 + 1) % 4096;
    outcome *plain = calloc(3, sizeof *plain), *spec = calloc(3, sizeof *spec);
    engine_spec s = {.kv = "bfloat16", .dtype = "float32", .budget = 1024, .kv_bytes = 8 << 20, .max_model_len = 256};
    cvllm_engine *e = engine_or_fail(dir, &s);
    if (e) {
        run(e, prompts, lens, 3, 16, false, plain);
        cvllm_engine_destroy(e);
    }
    char cfg[128];
    snprintf(cfg, sizeof cfg, "{\"method\": \"%s\", \"num_speculative_tokens\": 3}", method);
    s.speculative = cfg;
    s.budget = 12; /* chunked prefill too */
    e = engine_or_fail(dir, &s);
    if (e) {
        CHECK_EQ_INT(cv_runner_kv(e->runner)->dtype, CV_DTYPE_BF16);
        run(e, prompts, lens, 3, 16, false, spec);
        float worst = 0;
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(spec[i].n_ids == 16 && memcmp(spec[i].ids, plain[i].ids, 16 * sizeof(int32_t)) == 0,
                      "%s: request %d differs with MTP over a bf16 KV cache", vec, i);
            for (int t = 0; t < 16; t++) worst = fmaxf(worst, fabsf(spec[i].chosen[t] - plain[i].chosen[t]));
        }
        /* Attention is batch-shape invariant over either cache; the recurrent layers' verify passes are
         * not bit for bit their token-by-token decode, which an f32 cache is held to 1e-4 for too. */
        CHECK_MSG(worst < 1e-4f, "%s: MTP log-probs %g from plain decoding over a bf16 KV cache", vec, worst);
        CHECK_MSG(e->spec_stats.num_drafts > 0, "%s: the MTP proposed nothing", vec);
        CHECK(cv_block_pool_usage(&e->blocks) == 0.0);
        cvllm_engine_destroy(e);
    }
    free(plain), free(spec);
    tu_remove_tree(dir);
    free(dir);
}

/* ---- sizes, auto and refusals ------------------------------------------------------------------ */

/* K and V bytes a token of the folder's model at `elem` bytes an element. */
static int64_t kv_bytes_per_token(const char *vec, int64_t elem) {
    char *path = tu_strdupf("%s/vectors/%s/config.json", CVLLM_TEST_DATA, vec);
    json_t *c = json_load_file(path, 0, NULL);
    free(path);
    int64_t n = 2 * elem * json_integer_value(json_object_get(c, "num_hidden_layers")) *
                json_integer_value(json_object_get(c, "num_key_value_heads")) *
                json_integer_value(json_object_get(c, "head_dim"));
    json_decref(c);
    return n;
}

static void test_auto_and_capacity(void) {
    const char *vec = "qwen3-dense-f32";
    char *dir = tu_model_dir(vec);
    static const struct {
        const char *dtype, *kv;
        cv_dtype want;
    } cases[] = {{"float32", NULL, CV_DTYPE_F32},        {"float32", "auto", CV_DTYPE_F32},
                 {"bfloat16", NULL, CV_DTYPE_BF16},      {"bfloat16", "auto", CV_DTYPE_BF16},
                 {"float16", "auto", CV_DTYPE_BF16},     {"float32", "bfloat16", CV_DTYPE_BF16},
                 {"bfloat16", "float32", CV_DTYPE_F32}};
    int64_t blocks[2] = {0};
    const int64_t f32_token = kv_bytes_per_token(vec, 4);
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        /* 64 blocks of f32: far below what max_num_seqs requests could use, so nothing caps it. */
        engine_spec s = {.kv = cases[i].kv, .dtype = cases[i].dtype, .budget = 64,
                         .kv_bytes = (uint64_t)(64 * 16 * f32_token), .max_model_len = 256};
        cvllm_engine *e = engine_or_fail(dir, &s);
        if (!e) continue;
        const cv_kv_cache *kv = cv_runner_kv(e->runner);
        CHECK_MSG(kv->dtype == cases[i].want, "dtype %s, kv %s: cache %s", cases[i].dtype, cases[i].kv ? cases[i].kv : "NULL",
                  cv_dtype_name(kv->dtype));
        blocks[kv->dtype == CV_DTYPE_BF16] = kv->num_blocks - 1; /* less the pool's reserved block */
        /* A model handed a cache of another dtype refuses the batch, naming it. */
        cv_kv_cache other = *kv;
        other.dtype = CV_DTYPE_F16;
        cv_batch none = {0};
        cv_model *m = cv_runner_model(e->runner);
        CHECK_EQ_INT(m->ops->forward(m, &none, &other, cv_runner_state(e->runner), NULL), CVLLM_ERR_INVALID_ARGUMENT);
        CHECK_CONTAINS(cv_error_message(), "KV cache dtype F16");
        cvllm_engine_destroy(e);
    }
    CHECK_MSG(blocks[0] == 64 && blocks[1] == 128, "f32 cache %lld blocks, bf16 %lld (want 64, 128)",
              (long long)blocks[0], (long long)blocks[1]);

    /* Half of what one max_model_len request needs in f32: refused from config.json in f32, taken in bf16. */
    engine_spec s = {.kv = "float32", .dtype = "float32", .budget = 64, .kv_bytes = (uint64_t)(32 * f32_token),
                     .max_model_len = 64};
    cvllm_engine *e;
    CHECK_EQ_INT(make_engine(dir, &s, &e), CVLLM_ERR_CAPACITY);
    CHECK_CONTAINS(cvllm_last_error(), "the estimated maximum model length is 32.");
    s.kv = "bfloat16";
    CHECK_MSG(make_engine(dir, &s, &e) == 0, "%s", cvllm_last_error());
    if (e) {
        CHECK_EQ_INT(cv_runner_kv(e->runner)->num_blocks - 1, 4);
        cvllm_engine_destroy(e);
    }
    tu_remove_tree(dir);
    free(dir);
}

static void test_refused_names(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    static const struct {
        const char *kv;
        int rc;
        const char *msg;
    } cases[] = {{"fp8", CVLLM_ERR_UNSUPPORTED, "kv_cache_dtype 'fp8' is not supported"},
                 {"fp8_e4m3", CVLLM_ERR_UNSUPPORTED, "kv_cache_dtype 'fp8_e4m3' is not supported"},
                 {"garbage", CVLLM_ERR_INVALID_ARGUMENT, "invalid kv_cache_dtype 'garbage'"},
                 {"", CVLLM_ERR_INVALID_ARGUMENT, "invalid kv_cache_dtype ''"}};
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        engine_spec s = {.kv = cases[i].kv, .dtype = "float32", .budget = 64, .kv_bytes = 1 << 20, .max_model_len = 64};
        cvllm_engine *e;
        CHECK_EQ_INT(make_engine(dir, &s, &e), cases[i].rc);
        CHECK(e == NULL);
        CHECK_CONTAINS(cvllm_last_error(), cases[i].msg);
        CHECK_CONTAINS(cvllm_last_error(), "auto, bfloat16, float32");
        CHECK_MSG(!strchr(cvllm_last_error(), '\n'), "not one line: %s", cvllm_last_error());
    }
    tu_remove_tree(dir);
    free(dir);
}

/* ---- the CLI ------------------------------------------------------------------------------------ */

static void test_cli(void) {
    const char *vec = "qwen3-dense-f32";
    char *dir = tu_model_dir(vec), *tmp = tu_make_temp_dir();
    const int64_t budget = 1 << 20, f32_token = kv_bytes_per_token(vec, 4);
    const int64_t f32_tokens = budget / (16 * f32_token) * 16, bf16_tokens = budget / (8 * f32_token) * 16;
    CHECK_EQ_INT(bf16_tokens, 2 * f32_tokens);
    static const char *const names[] = {"float32", "bfloat16"};
    for (int b = 0; b < 2; b++) {
        char args[1024];
        snprintf(args, sizeof args,
                 "generate %s --prompt-token-ids 1,2,3 --max-tokens 2 --max-model-len 64 --dtype float32 "
                 "--kv-cache-memory-bytes %lld --kv-cache-dtype %s",
                 dir, (long long)budget, names[b]);
        tu_run r = tu_run_cvllm(tmp, "CVLLM_LOG_LEVEL=info", args);
        CHECK_MSG(r.status == 0, "%s\n%s", args, r.err);
        char want[64];
        snprintf(want, sizeof want, "KV cache dtype: %s", names[b]);
        CHECK_CONTAINS(r.err, want);
        snprintf(want, sizeof want, "KV cache size: %lld tokens", (long long)(b ? bf16_tokens : f32_tokens));
        CHECK_CONTAINS(r.err, want);
        CHECK_CONTAINS(r.out, "Generated text: ");
        tu_run_free(&r);
    }
    static const struct {
        const char *name, *msg;
    } refused[] = {{"fp8_e4m3", "kv_cache_dtype 'fp8_e4m3' is not supported on the CPU backend"},
                   {"int4", "invalid kv_cache_dtype 'int4'"}};
    for (size_t i = 0; i < CV_ARRAY_LEN(refused); i++) {
        char *args = tu_strdupf("generate %s --prompt hi --kv-cache-dtype %s", dir, refused[i].name);
        tu_run r = tu_run_cvllm(tmp, "CVLLM_LOG_LEVEL=error", args);
        CHECK_MSG(r.status == 1, "exit %d for: %s", r.status, args);
        CHECK_MSG(strchr(r.err, '\n') == r.err + strlen(r.err) - 1, "not one line: %s", r.err);
        CHECK_CONTAINS(r.err, refused[i].msg);
        tu_run_free(&r);
        free(args);
    }
    tu_remove_tree(tmp);
    tu_remove_tree(dir);
    free(tmp);
    free(dir);
}

int main(void) {
    test_refused_names();
    test_auto_and_capacity();
    test_cli();
    test_reference_model("qwen3-dense-f32");
    test_reference_model("qwen3-dense-bf16");
    test_reference_model("qwen3.5-moe-f32");
    test_mtp_over_bf16("qwen3.5-moe-f32", "qwen3_5_mtp");
    test_mtp_over_bf16("qwen3-next-bf16", "mtp");
    return cv_check_summary("test_kv_dtype");
}
