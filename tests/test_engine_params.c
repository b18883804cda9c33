/*
 * test_engine_params.c — the request parameters that constrain what the engine generates or when,
 * through the public API on the tiny f32 reference checkpoint: allowed_token_ids, bad_words (also
 * under n-gram speculative decoding, whose verification samples several positions in one step),
 * priority under the "priority" scheduling policy (queue order and the preemption victim, against
 * "fcfs" on the same load), and each of their validation errors in vLLM's words; the sampling
 * defaults --override-generation-config sets; and the refusals of the loader's extra config and the
 * recurrent-state checkpoint options.
 *
 * The bad words are taken from the model's own unconstrained greedy output, so what must change is
 * known exactly: the output stays the same up to the position that would complete the word and
 * differs there, and the word never appears.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "check.h"
#include "cvllm.h"
#include "engine/engine.h"
#include "testutil.h"

#define MAX_OUT 224

static const char *const vec = "qwen3-dense-f32";
static char *model_dir;

typedef struct engine_cfg {
    const char *policy;
    const char *spec;
    int32_t max_num_seqs;
    uint64_t kv_bytes;
} engine_cfg;

/* The tests' engine over `model`: an 8 MiB KV cache, 256 positions, 2 threads. */
static cvllm_engine_options small_options(const char *model) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = model;
    o.kv_cache_memory_bytes = 8 << 20;
    o.max_model_len = 256;
    o.num_threads = 2;
    return o;
}

static cvllm_engine *make_engine(engine_cfg c) {
    cvllm_engine_options o = small_options(model_dir);
    if (c.kv_bytes) o.kv_cache_memory_bytes = c.kv_bytes;
    o.block_size = 16;
    o.dtype = "float32";
    o.scheduling_policy = c.policy;
    o.speculative_config = c.spec;
    if (c.max_num_seqs) o.max_num_seqs = c.max_num_seqs;
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
    p.ignore_eos = true;
    return p;
}

typedef struct output {
    int32_t ids[MAX_OUT];
    size_t n;
} output;

/* Prompts are token ids: the checkpoint's vocabulary (4096) is much smaller than its tokenizer's. */
typedef struct prompt_ids {
    const int32_t *ids;
    size_t n;
} prompt_ids;

#define PROMPT(...) ((prompt_ids){(const int32_t[]){__VA_ARGS__}, sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)})

static uint64_t add_prompt(cvllm_engine *e, prompt_ids prompt, const cvllm_sampling_params *p) {
    cvllm_prompt pr = {.token_ids = prompt.ids, .n_token_ids = prompt.n};
    uint64_t id = 0;
    int rc = cvllm_engine_add_request(e, &pr, p, &id);
    CHECK_MSG(rc == 0, "add_request: %s", cvllm_last_error());
    return id;
}

/* Runs one request to the end; its token ids. */
static output run_one(cvllm_engine *e, prompt_ids prompt, const cvllm_sampling_params *p) {
    output out = {0};
    uint64_t id = add_prompt(e, prompt, p);
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n;
        if (cvllm_engine_step(e, &outs, &n) != 0) {
            CHECK_MSG(false, "step: %s", cvllm_last_error());
            break;
        }
        for (size_t k = 0; k < n; k++) {
            if (outs[k]->request_id != id) continue;
            out.n = outs[k]->outputs[0].n_token_ids;
            memcpy(out.ids, outs[k]->outputs[0].token_ids, out.n * sizeof(int32_t));
        }
    }
    return out;
}

/* Where `seq` first occurs in ids[0..n), or -1. */
static ptrdiff_t find_seq(const int32_t *ids, size_t n, const int32_t *seq, size_t len) {
    for (size_t at = 0; at + len <= n; at++)
        if (!memcmp(ids + at, seq, len * sizeof *seq)) return (ptrdiff_t)at;
    return -1;
}

/* "I am in the house and it is" */
#define PROMPT_HOUSE PROMPT(40, 1079, 304, 279, 3753, 323, 432, 374)
/* a prompt whose greedy output soon falls into cycles, which n-gram drafts predict */
#define PROMPT_CYCLE PROMPT(7, 108, 7, 108, 7, 108, 7, 108, 7, 108)

/* ---- allowed_token_ids ----------------------------------------------------------------------- */

static void test_allowed_token_ids(void) {
    cvllm_engine *e = make_engine((engine_cfg){0});
    cvllm_sampling_params p = greedy(e, 24);
    output base = run_one(e, PROMPT_HOUSE, &p);
    CHECK_EQ_INT(base.n, 24);

    /* a set without the unconstrained choices, repeats and disorder allowed */
    int32_t allowed[] = {3000, 17, 911, 17, 2048, 5};
    for (size_t i = 0; i < CV_ARRAY_LEN(allowed); i++) CHECK(find_seq(base.ids, base.n, &allowed[i], 1) < 0);
    p.allowed_token_ids = allowed;
    p.n_allowed_token_ids = CV_ARRAY_LEN(allowed);
    output got = run_one(e, PROMPT_HOUSE, &p);
    CHECK_EQ_INT(got.n, 24);
    for (size_t t = 0; t < got.n; t++) {
        bool in = false;
        for (size_t i = 0; i < CV_ARRAY_LEN(allowed); i++) in |= got.ids[t] == allowed[i];
        CHECK_MSG(in, "token %zu is %d, outside allowed_token_ids", t, got.ids[t]);
    }

    /* a set holding every unconstrained choice changes nothing */
    p.allowed_token_ids = base.ids;
    p.n_allowed_token_ids = base.n;
    got = run_one(e, PROMPT_HOUSE, &p);
    CHECK(got.n == base.n && !memcmp(got.ids, base.ids, base.n * sizeof(int32_t)));
    cvllm_engine_destroy(e);
}

/* ---- bad_words --------------------------------------------------------------------------------- */

/* A word from base.ids[at .. at+len) that bans exactly that sequence from position at + len - 1 on:
 * its first occurrence, text without leading whitespace that tokenizes back to the same ids, and a
 * spaced form (" " + text, the other sequence vLLM bans) that does not occur before that position.
 * The latest such window, so that a long stretch of the output comes before it. NULL when the
 * output has none of that length. */
static char *pick_bad_word(const cvllm_engine *e, const output *base, size_t len, size_t *at) {
    const cvllm_tokenizer *tok = cvllm_engine_tokenizer(e);
    for (size_t j = base->n - len + 1; j-- > 0;) {
        const int32_t *window = base->ids + j;
        if (find_seq(base->ids, base->n, window, len) != (ptrdiff_t)j) continue;
        char *text = NULL;
        if (cvllm_detokenize(tok, window, len, false, &text) != 0) continue;
        bool ok = text[0] && (unsigned char)text[0] < 0x80 && !isspace((unsigned char)text[0]);
        int32_t *ids = NULL, *spaced = NULL;
        size_t n = 0, n_spaced = 0;
        ok = ok && cvllm_tokenize(tok, text, strlen(text), &ids, &n) == 0 && n == len &&
             !memcmp(ids, window, len * sizeof *ids);
        char *with_space = tu_strdupf("%s%s", " ", text);
        ok = ok && cvllm_tokenize(tok, with_space, strlen(with_space), &spaced, &n_spaced) == 0 &&
             find_seq(base->ids, j + len, spaced, n_spaced) < 0;
        cvllm_free(ids);
        cvllm_free(spaced);
        free(with_space);
        if (ok) {
            *at = j;
            return text;
        }
        cvllm_free(text);
    }
    return NULL;
}

/* The word's last token is never generated where it would complete the word: the output is the
 * unconstrained one up to there and differs at that position; the word appears nowhere. The same
 * with n-gram speculative decoding, where drafts accepted earlier in a verification step are the
 * history of the positions after them. */
static void test_bad_words(void) {
    static const char *spec = "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_min\": 1, "
                              "\"prompt_lookup_max\": 3}";
    cvllm_engine *e = make_engine((engine_cfg){0}), *es = make_engine((engine_cfg){.spec = spec});
    cvllm_sampling_params p = greedy(e, 150);
    output base = run_one(e, PROMPT_CYCLE, &p);
    CHECK_EQ_INT(base.n, 150);
    output base_spec = run_one(es, PROMPT_CYCLE, &p);
    CHECK(!memcmp(base_spec.ids, base.ids, sizeof base.ids));
    for (size_t len = 1; len <= 3; len++) {
        size_t at = 0;
        char *word = pick_bad_word(e, &base, len, &at);
        CHECK_MSG(word, "no usable %zu-token word in the greedy output", len);
        if (!word) continue;
        const char *words[] = {"unused-word-xyz", word};
        p.bad_words = words;
        p.n_bad_words = 2;
        size_t stop = at + len - 1;
        output got = run_one(e, PROMPT_CYCLE, &p);
        CHECK_MSG(!memcmp(got.ids, base.ids, stop * sizeof(int32_t)) && got.ids[stop] != base.ids[stop],
                  "%zu-token word \"%s\" at %zu: the output must change exactly at %zu", len, word, at, stop);
        CHECK_MSG(find_seq(got.ids, got.n, base.ids + at, len) < 0, "\"%s\" was generated", word);
        uint64_t accepted = es->spec_stats.num_accepted_tokens;
        output got_spec = run_one(es, PROMPT_CYCLE, &p);
        CHECK_MSG(got_spec.n == got.n && !memcmp(got_spec.ids, got.ids, got.n * sizeof(int32_t)),
                  "\"%s\": speculative decoding gives another output", word);
        CHECK_MSG(es->spec_stats.num_accepted_tokens > accepted, "no draft accepted: the check proves nothing");
        cvllm_free(word);
    }
    p.bad_words = NULL;
    p.n_bad_words = 0;
    cvllm_engine_destroy(e);
    cvllm_engine_destroy(es);
}

/* ---- priority ---------------------------------------------------------------------------------- */

/* With one sequence at a time, requests added together run in priority order, not arrival order. */
static void test_priority_order(void) {
    cvllm_engine *e = make_engine((engine_cfg){.policy = "priority", .max_num_seqs = 1});
    static const int32_t priorities[3] = {2, 0, 1};
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) {
        cvllm_sampling_params p = greedy(e, 4);
        p.priority = priorities[i];
        ids[i] = add_prompt(e, PROMPT_HOUSE, &p);
    }
    int32_t order[3], n_done = 0;
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n;
        if (cvllm_engine_step(e, &outs, &n) != 0) break;
        for (size_t k = 0; k < n; k++)
            for (int i = 0; i < 3; i++)
                if (outs[k]->finished && outs[k]->request_id == ids[i] && n_done < 3) order[n_done++] = priorities[i];
    }
    CHECK_EQ_INT(n_done, 3);
    for (int i = 0; i < n_done; i++) CHECK_EQ_INT(order[i], i);
    cvllm_engine_destroy(e);
}

#define PROMPT_A PROMPT(32, 1293, 3364, 25, 220)
#define PROMPT_B PROMPT(17, 2001, 305, 911, 264, 3283, 323, 1181, 1251, 25, 220, 44)

/* Two requests that outgrow the KV cache together: A arrives first and runs, then B; under
 * "priority" A has priority 5 and B 0 (under "fcfs", which takes only 0, both 0). "fcfs" preempts
 * the newest (B), "priority" the worst (A), possibly after A was given its token in that step, and
 * both still produce what each produces alone. Returns the preemptions A and B went through. */
static void preemptions(const char *policy, const output want[2], int32_t got[2]) {
    /* 2 layers × 2 (K,V) × 2 heads × 32 dims × 4 B = 1 KiB a token: 20 blocks of 16 */
    cvllm_engine *e = make_engine((engine_cfg){.policy = policy, .kv_bytes = 320 * 1024});
    uint64_t ids[2];
    output out[2] = {0};
    got[0] = got[1] = 0;
    int32_t step = 0;
    for (;;) {
        if (step == 0 || step == 2) {
            cvllm_sampling_params p = greedy(e, 200);
            p.priority = !strcmp(policy, "priority") && step == 0 ? 5 : 0;
            ids[step / 2] = add_prompt(e, step == 0 ? PROMPT_A : PROMPT_B, &p);
        }
        if (!cvllm_engine_has_unfinished(e)) break;
        const cvllm_request_output *const *outs;
        size_t n;
        if (cvllm_engine_step(e, &outs, &n) != 0) break;
        step++;
        for (size_t k = 0; k < n; k++)
            for (int i = 0; i < 2; i++)
                if (outs[k]->request_id == ids[i]) {
                    out[i].n = outs[k]->outputs[0].n_token_ids;
                    memcpy(out[i].ids, outs[k]->outputs[0].token_ids, out[i].n * sizeof(int32_t));
                }
        for (size_t r = 0; r < e->n_requests; r++)
            for (int i = 0; i < 2; i++)
                if (e->requests[r]->id == ids[i] && e->requests[r]->seqs[0].num_preemptions > got[i])
                    got[i] = e->requests[r]->seqs[0].num_preemptions;
    }
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(out[i].n, 200);
        CHECK_MSG(!memcmp(out[i].ids, want[i].ids, sizeof out[i].ids), "%s: request %d differs from its lone run",
                  policy, i);
    }
    cvllm_engine_destroy(e);
}

static void test_priority_preemption(void) {
    cvllm_engine *e = make_engine((engine_cfg){0});
    cvllm_sampling_params p = greedy(e, 200);
    output alone[2] = {run_one(e, PROMPT_A, &p), run_one(e, PROMPT_B, &p)};
    cvllm_engine_destroy(e);
    int32_t n[2];
    preemptions("fcfs", alone, n);
    CHECK_MSG(n[0] == 0 && n[1] > 0, "fcfs: A preempted %d times, B %d (want B only)", n[0], n[1]);
    preemptions("priority", alone, n);
    CHECK_MSG(n[0] > 0 && n[1] == 0, "priority: A preempted %d times, B %d (want A only)", n[0], n[1]);
}

/* ---- validation -------------------------------------------------------------------------------- */

static void expect_rejected(cvllm_engine *e, const cvllm_sampling_params *p, const char *msg) {
    cvllm_prompt pr = {.token_ids = PROMPT_HOUSE.ids, .n_token_ids = PROMPT_HOUSE.n};
    uint64_t id;
    int rc = cvllm_engine_add_request(e, &pr, p, &id);
    CHECK_MSG(rc == CVLLM_ERR_INVALID_ARGUMENT, "expected INVALID_ARGUMENT, got %d for \"%s\"", rc, msg);
    CHECK_CONTAINS(cvllm_last_error(), msg);
}

static void test_validation(void) {
    cvllm_engine *e = make_engine((engine_cfg){0});
    int32_t ids[2] = {5, 4096};
    cvllm_sampling_params p = greedy(e, 4);
    p.allowed_token_ids = ids;
    expect_rejected(e, &p, "allowed_token_ids is not None and empty!");
    p.n_allowed_token_ids = 2;
    expect_rejected(e, &p, "allowed_token_ids contains out-of-vocab token id!");
    ids[1] = -1;
    expect_rejected(e, &p, "allowed_token_ids contains out-of-vocab token id!");

    p = greedy(e, 4);
    const char *blank[] = {"ok", " \t\u3000"};
    p.bad_words = blank;
    p.n_bad_words = 2;
    expect_rejected(e, &p, "bad_words entries must tokenize to at least one token.");
    /* "a" and " a" are two sequences a word: 65 words are one sequence too many */
    const char *many[65];
    for (int i = 0; i < 65; i++) many[i] = "a";
    p.bad_words = many;
    p.n_bad_words = 65;
    expect_rejected(e, &p, "Too many bad words after tokenization: 129. The max number is 128.");
    p.n_bad_words = 64;
    output out = run_one(e, PROMPT_HOUSE, &p);
    CHECK_EQ_INT(out.n, 4);

    p = greedy(e, 4);
    p.priority = 1;
    expect_rejected(e, &p, "Got priority 1 but Priority scheduling is not enabled.");
    p.priority = -3;
    expect_rejected(e, &p, "Got priority -3 but Priority scheduling is not enabled.");
    CHECK(!cvllm_engine_has_unfinished(e));
    cvllm_engine_destroy(e);

    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = model_dir;
    o.scheduling_policy = "lifo";
    cvllm_engine *none = (cvllm_engine *)1;
    CHECK(cvllm_engine_create(&o, &none) == CVLLM_ERR_INVALID_ARGUMENT && none == NULL);
    CHECK_CONTAINS(cvllm_last_error(), "invalid scheduling_policy 'lifo'; choose from fcfs, priority");
}

/* --override-generation-config: its sampling fields over generation_config.json (temperature 0.6,
 * top_k 20, top_p 0.95 here), or over vLLM's neutral defaults with generation_config "vllm". */
static cvllm_engine *engine_with(const char *generation_config, const char *override, int *rc) {
    cvllm_engine_options o = small_options(model_dir);
    o.generation_config = generation_config;
    o.override_generation_config = override;
    cvllm_engine *e = NULL;
    *rc = cvllm_engine_create(&o, &e);
    return e;
}

static void test_generation_override(void) {
    int rc;
    cvllm_engine *e = engine_with(NULL, "{\"temperature\": 0.25, \"top_k\": 3, \"max_new_tokens\": 5}", &rc);
    CHECK_MSG(rc == 0, "%s", cvllm_last_error());
    cvllm_sampling_params p;
    if (e) {
        cvllm_sampling_params_default(e, &p);
        CHECK(p.temperature == 0.25f && p.top_k == 3 && p.top_p == 0.95f);
        CHECK_EQ_INT(cvllm_engine_generation_max_tokens(e), 5);
        cvllm_engine_destroy(e);
    }
    e = engine_with("vllm", "{\"top_p\": 0.5}", &rc);
    CHECK_MSG(rc == 0, "%s", cvllm_last_error());
    if (e) {
        cvllm_sampling_params_default(e, &p);
        CHECK(p.temperature == 1.0f && p.top_p == 0.5f && (p.top_k == 0 || p.top_k == -1));
        CHECK_EQ_INT(cvllm_engine_generation_max_tokens(e), -1);
        cvllm_engine_destroy(e);
    }
    e = engine_with(NULL, "{\"temperature\": \"hot\"}", &rc);
    CHECK(rc == CVLLM_ERR_FORMAT && e == NULL);
    CHECK_CONTAINS(cvllm_last_error(), "--override-generation-config: field \"temperature\" must be a number");
    e = engine_with(NULL, "{\"temperature\": 0.3", &rc);
    CHECK(rc == CVLLM_ERR_FORMAT && e == NULL);
    CHECK_CONTAINS(cvllm_last_error(), "--override-generation-config: invalid JSON");
}

/* The chosen tokens' prompt logprobs of one request on an engine over `dir` with the given config
 * overrides (NULL: none; rope_theta 0: none), and the engine's max_model_len; false when the engine
 * could not be created (*rc says why). */
static bool prompt_logprobs(const char *dir, const char *hf_overrides, const char *rope_scaling, double rope_theta,
                            float *lp, int32_t *max_len, int *rc) {
    cvllm_engine_options o = small_options(dir);
    o.kv_cache_memory_bytes = 48 << 20; /* the plain model's whole 40960 positions */
    o.max_model_len = 0;                /* derived from the config, overrides and all */
    o.dtype = "float32";
    o.hf_overrides = hf_overrides;
    o.rope_scaling = rope_scaling;
    o.rope_theta = rope_theta;
    cvllm_engine *e = NULL;
    if ((*rc = cvllm_engine_create(&o, &e))) return false;
    *max_len = cvllm_engine_max_model_len(e);
    const prompt_ids pr = PROMPT(11, 420, 77, 3001, 15, 990, 2048, 5, 61, 333, 1000, 7, 123, 4000, 9, 88, 256, 17);
    cvllm_sampling_params p = greedy(e, 1);
    p.prompt_logprobs = 0;
    uint64_t id = add_prompt(e, pr, &p);
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n;
        CHECK(cvllm_engine_step(e, &outs, &n) == 0);
        for (size_t k = 0; k < n; k++)
            if (outs[k]->request_id == id && outs[k]->prompt_logprobs)
                for (size_t t = 1; t < pr.n; t++) lp[t] = outs[k]->prompt_logprobs[t].chosen.logprob;
    }
    cvllm_engine_destroy(e);
    return true;
}

/* vLLM's --hf-overrides (and its older --rope-scaling, --rope-theta, which it folds into them) lay keys
 * over config.json: YaRN given so runs bit for bit as a checkpoint whose config.json says it, its
 * max_model_len derived from it as vLLM derives it (original_max_position_embeddings × factor), and
 * changes what the model computes; rope_theta likewise. Bad overrides fail naming them. */
static void test_hf_overrides(void) {
    static const char yarn[] = "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":64}";
    char *edited = tu_model_dir(vec), *cfg = tu_strdupf("%s/%s", edited, "config.json");
    json_t *j = json_load_file(cfg, 0, NULL);
    json_object_set_new(j, "rope_scaling", json_loads(yarn, 0, NULL));
    json_object_set_new(j, "rope_theta", json_real(500000.0));
    unlink(cfg);
    CHECK(json_dump_file(j, cfg, 0) == 0);
    json_decref(j);
    enum { N = 18 };
    float plain[N] = {0}, want[N] = {0}, by_override[N] = {0}, by_flags[N] = {0};
    int32_t len_plain, len_want, len_override, len_flags;
    int rc;
    char *over = tu_strdupf("{\"rope_scaling\":%s,\"rope_theta\":500000%s}", yarn, "");
    CHECK_MSG(prompt_logprobs(model_dir, NULL, NULL, 0, plain, &len_plain, &rc), "%s", cvllm_last_error());
    CHECK_MSG(prompt_logprobs(edited, NULL, NULL, 0, want, &len_want, &rc), "%s", cvllm_last_error());
    CHECK_MSG(prompt_logprobs(model_dir, over, NULL, 0, by_override, &len_override, &rc), "%s", cvllm_last_error());
    CHECK_MSG(prompt_logprobs(model_dir, "{\"rope_theta\":1}", yarn, 500000, by_flags, &len_flags, &rc), "%s",
              cvllm_last_error());
    CHECK_MSG(!memcmp(want, by_override, sizeof want), "--hf-overrides: not the edited config.json's logprobs");
    CHECK_MSG(!memcmp(want, by_flags, sizeof want), "--rope-scaling/--rope-theta: not the edited config.json's logprobs");
    CHECK_MSG(memcmp(want, plain, sizeof want), "YaRN and rope_theta changed nothing");
    CHECK_EQ_INT(len_want, 256);
    CHECK_EQ_INT(len_override, 256);
    CHECK_EQ_INT(len_flags, 256);
    CHECK(len_plain != 256);
    float lp[N];
    int32_t len;
    CHECK(!prompt_logprobs(model_dir, "[1]", NULL, 0, lp, &len, &rc));
    CHECK_EQ_INT(rc, CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "hf_overrides must be a JSON object: [1]");
    CHECK(!prompt_logprobs(model_dir, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":-1}}", NULL, 0, lp, &len, &rc));
    CHECK_EQ_INT(rc, CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cvllm_last_error(), "config.json with --hf-overrides");
    free(over);
    tu_remove_tree(edited);
    free(edited);
    free(cfg);
}

/* --model-loader-extra-config, --mamba-block-size and --mamba-cache-mode, refused as vLLM refuses
 * them (the spacing's effect is test_engine_hybrid's). */
static void test_loader_and_state_options(void) {
    cvllm_engine_options o = small_options(model_dir);
    o.model_loader_extra_config = "{\"enable_multithread_load\": true, \"num_threads\": 4}";
    CHECK_MSG(cvllm_engine_check(&o) == 0, "%s", cvllm_last_error());
    o.model_loader_extra_config = "{\"num_threads\": 4, \"stream\": 1}";
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "Unexpected extra config keys for load format auto: {'stream'}");
    o.model_loader_extra_config = "[1]";
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "model_loader_extra_config must be a JSON object");
    o.load_format = "dummy";
    o.model_loader_extra_config = "{\"num_threads\": 4}";
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "Model loader extra config is not supported for load format dummy");
    o.model_loader_extra_config = "{}";
    CHECK_MSG(cvllm_engine_check(&o) == 0, "%s", cvllm_last_error());

    o = small_options(model_dir);
    o.mamba_block_size = 24;
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "mamba_block_size 24 is not a multiple of block_size 16");
    o.mamba_block_size = 32;
    o.enable_prefix_caching = false;
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "--mamba-block-size can only be set with --enable-prefix-caching");
    o.mamba_block_size = 256; /* = max_model_len: vLLM's own default without prefix caching */
    CHECK_MSG(cvllm_engine_check(&o) == 0, "%s", cvllm_last_error());
    o.mamba_block_size = -16;
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "mamba_block_size must be positive");
    o = small_options(model_dir);
    o.mamba_cache_mode = "some";
    CHECK_EQ_INT(cvllm_engine_check(&o), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "invalid mamba_cache_mode 'some'; choose from align, all, none");
    o.mamba_cache_mode = "align";
    CHECK_MSG(cvllm_engine_check(&o) == 0, "%s", cvllm_last_error());
}

/* vLLM's --download-dir: a hub id is looked up in that Hugging Face cache, not the environment's. */
static void test_download_dir(void) {
    static const char commit[] = "0123456789abcdef0123456789abcdef01234567";
    char *cache = tu_make_temp_dir();
    char *snap = tu_strdupf("%s/models--org--tiny/snapshots/%s", cache, commit);
    char *refs = tu_strdupf("%s/models--org--tiny/%s", cache, "refs");
    char *mk = tu_strdupf("mkdir -p %s %s", snap, refs);
    CHECK(system(mk) == 0);
    tu_write_file(refs, "main", commit, sizeof commit - 1);
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char *t = tu_strdupf("%s/%s", model_dir, files[i]);
        tu_link(t, snap, files[i]);
        free(t);
    }
    tu_link_tokenizer(snap);
    char *empty = tu_make_temp_dir();
    setenv("HF_HUB_CACHE", empty, 1);
    setenv("HF_HUB_OFFLINE", "1", 1);
    cvllm_engine_options o = small_options("org/tiny");
    cvllm_engine *e = NULL;
    CHECK(cvllm_engine_create(&o, &e) != 0 && !e);
    o.download_dir = cache;
    CHECK_MSG(cvllm_engine_create(&o, &e) == 0, "%s", cvllm_last_error());
    cvllm_engine_destroy(e);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_HUB_OFFLINE");
    tu_remove_tree(cache);
    tu_remove_tree(empty);
    free(cache);
    free(empty);
    free(snap);
    free(refs);
    free(mk);
}

/* One request with prompt logprobs and logprobs (top 3) under logprobs_mode `mode`: greedy, or
 * sampled at temperature 0.5 from the top 2 (seed 7). Fills each prompt position's entries and then
 * each generated one's (prompt positions from 1) and the tokens drawn. */
enum { LP_PROMPT = 6, LP_GEN = 4, LP_TOP = 3 };
typedef struct lp_run {
    cvllm_logprob top[LP_PROMPT + LP_GEN][LP_TOP];
    cvllm_logprob chosen[LP_PROMPT + LP_GEN];
    int32_t tokens[LP_GEN];
} lp_run;

static int logprob_run(const char *mode, bool sampled, lp_run *out) {
    cvllm_engine_options o = small_options(model_dir);
    o.dtype = "float32";
    o.logprobs_mode = mode;
    cvllm_engine *e = NULL;
    int rc = cvllm_engine_create(&o, &e);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    cvllm_sampling_params p = greedy(e, LP_GEN);
    p.prompt_logprobs = LP_TOP;
    p.logprobs = LP_TOP;
    if (sampled) p.temperature = 0.5f, p.top_k = 2, p.seed = 7;
    uint64_t id = add_prompt(e, PROMPT(11, 420, 77, 3001, 15, 990), &p);
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n;
        CHECK(cvllm_engine_step(e, &outs, &n) == 0);
        for (size_t k = 0; k < n; k++) {
            if (outs[k]->request_id != id) continue;
            for (int t = 1; outs[k]->prompt_logprobs && t < LP_PROMPT; t++) {
                memcpy(out->top[t], outs[k]->prompt_logprobs[t].top, sizeof out->top[t]);
                out->chosen[t] = outs[k]->prompt_logprobs[t].chosen;
            }
            const cvllm_completion_output *c = &outs[k]->outputs[0];
            for (size_t t = 0; outs[k]->finished && c->logprobs && t < c->n_token_ids && t < LP_GEN; t++) {
                memcpy(out->top[LP_PROMPT + t], c->logprobs[t].top, sizeof out->top[0]);
                out->chosen[LP_PROMPT + t] = c->logprobs[t].chosen;
                out->tokens[t] = c->token_ids[t];
            }
        }
    }
    cvllm_engine_destroy(e);
    return 0;
}

/* vLLM's logprobs_mode. raw_logits returns the logits whose log-softmax raw_logprobs returns: the
 * gaps between a position's values and the ranks are the same. The processed modes are of the row
 * the token was drawn from: greedy, of the logits as they are (no penalty here); sampled at
 * temperature T from the top 2, the two kept tokens' logprobs sum to 1 with their raw gap divided by
 * T, and the third is -inf. Prompt logprobs are raw logprobs in every mode, and the mode never
 * changes the tokens drawn. */
static void test_logprobs_mode(void) {
    static lp_run raw, logits, processed, sampled_raw, sampled_lp, sampled_logits;
    CHECK_EQ_INT(logprob_run(NULL, false, &raw), 0);
    CHECK_EQ_INT(logprob_run("raw_logits", false, &logits), 0);
    CHECK_EQ_INT(logprob_run("processed_logprobs", false, &processed), 0);
    for (int t = 1; t < LP_PROMPT; t++) /* prompt positions: the same raw logprobs */
        CHECK(!memcmp(raw.top[t], logits.top[t], sizeof raw.top[t]) && raw.chosen[t].logprob == logits.chosen[t].logprob);
    for (int t = LP_PROMPT; t < LP_PROMPT + LP_GEN; t++) {
        const float gap_lp = raw.chosen[t].logprob - raw.top[t][1].logprob;
        const float gap_logit = logits.chosen[t].logprob - logits.top[t][1].logprob;
        CHECK_MSG(fabsf(gap_lp - gap_logit) < 1e-4f, "position %d: gap %g as logprobs, %g as logits", t, gap_lp, gap_logit);
        CHECK_EQ_INT(raw.chosen[t].rank, logits.chosen[t].rank);
        CHECK_MSG(fabsf(raw.chosen[t].logprob - logits.chosen[t].logprob) > 1e-3f, "raw_logits gave the logprob %g",
                  logits.chosen[t].logprob);
        CHECK(fabsf(processed.chosen[t].logprob - raw.chosen[t].logprob) < 1e-5f);
    }
    CHECK(!memcmp(raw.tokens, logits.tokens, sizeof raw.tokens) && !memcmp(raw.tokens, processed.tokens, sizeof raw.tokens));

    CHECK_EQ_INT(logprob_run(NULL, true, &sampled_raw), 0);
    CHECK_EQ_INT(logprob_run("processed_logprobs", true, &sampled_lp), 0);
    CHECK_EQ_INT(logprob_run("processed_logits", true, &sampled_logits), 0);
    CHECK(!memcmp(sampled_raw.tokens, sampled_lp.tokens, sizeof sampled_raw.tokens));
    CHECK(!memcmp(sampled_raw.tokens, sampled_logits.tokens, sizeof sampled_raw.tokens));
    for (int t = LP_PROMPT; t < LP_PROMPT + LP_GEN; t++) {
        const cvllm_logprob *lp = sampled_lp.top[t], *lg = sampled_logits.top[t], *rw = sampled_raw.top[t];
        CHECK_MSG(fabs(exp(lp[0].logprob) + exp(lp[1].logprob) - 1) < 1e-5, "position %d: %g + %g", t, exp(lp[0].logprob),
                  exp(lp[1].logprob));
        CHECK(isinf(lp[2].logprob) && lp[2].logprob < 0 && isinf(lg[2].logprob));
        CHECK(lp[0].token_id == rw[0].token_id && lp[1].token_id == rw[1].token_id);
        const float raw_gap = rw[0].logprob - rw[1].logprob;
        CHECK_MSG(fabsf((lp[0].logprob - lp[1].logprob) - raw_gap / 0.5f) < 1e-4f, "position %d: processed gap %g, raw %g",
                  t, lp[0].logprob - lp[1].logprob, raw_gap);
        CHECK(fabsf((lg[0].logprob - lg[1].logprob) - (lp[0].logprob - lp[1].logprob)) < 1e-4f);
        CHECK(sampled_lp.chosen[t].rank <= 2 && sampled_lp.chosen[t].token_id == sampled_raw.tokens[t - LP_PROMPT]);
    }
    CHECK_EQ_INT(logprob_run("logits", false, &raw), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "choose from raw_logprobs, raw_logits, processed_logprobs, processed_logits");
}

int main(void) {
    model_dir = tu_model_dir(vec);
    test_logprobs_mode();
    test_download_dir();
    test_hf_overrides();
    test_generation_override();
    test_allowed_token_ids();
    test_bad_words();
    test_priority_order();
    test_priority_preemption();
    test_validation();
    test_loader_and_state_options();
    tu_remove_tree(model_dir);
    free(model_dir);
    return cv_check_summary("test_engine_params");
}
