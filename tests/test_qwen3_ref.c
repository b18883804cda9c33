/*
 * test_qwen3_ref.c — Qwen3ForCausalLM against Hugging Face's f32 logits.
 *
 * For each dense reference checkpoint in tests/data/vectors (untied/tied × f32/bf16 weights) and
 * each reference prompt (short, long150) the model must reproduce the reference logits to
 * max|Δ| / max|ref| ≤ 1e-4 at every position when the prompt is
 *   (a) prefilled in one call,
 *   (b) prefilled in chunks of 1, 7 and 64 tokens (earlier chunks only in the KV cache),
 *   (c) processed in the same forward calls as two other prompts, each on its own chunk schedule,
 *       so batches mix prefill chunks and single-token decodes of different sequences,
 *   (d) continued greedily for 8 steps: logits vs the reference's teacher-forced gen_logits, ids
 *       vs its greedy ids.
 * Every prefix of a reference prompt has reference logits (the first rows, by causality), so the
 * "other" prompts in (c) are the other reference prompt and a prefix of the long one.
 *
 * The KV cache uses 16-token blocks handed out from a shuffled free list (non-contiguous, with
 * sequences interleaved) and starts filled with NaN, so a read of any slot that was not written
 * poisons the logits. Everything runs once on the AVX-512 path and once on the AVX2 path.
 * Failure paths: unknown architecture, a config that disagrees with the checkpoint, missing
 * lm_head, and batches with bad ids, slots, positions, block ids and logit rows.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "check.h"
#include "kernels/kernels.h"
#include "loader/config.h"
#include "loader/weights.h"
#include "models/model.h"

#define TOLERANCE 1e-4
#define BLOCK_SIZE 16
#define NUM_BLOCKS 48
#define MAX_TOKENS 160

static const char *const FOLDERS[] = {"qwen3-dense-f32", "qwen3-dense-bf16", "qwen3-dense-tied-f32",
                                      "qwen3-dense-tied-bf16"};
static const char *const PROMPTS[] = {"short", "long150"};

static double worst_rel_overall;

/* ---- reference files ------------------------------------------------------------------------ */

typedef struct npy {
    int64_t rows, cols;
    float *data;
} npy;

/* A 2-D little-endian f32 C-order .npy file; NULL data on any deviation. */
static npy read_npy(const char *path) {
    npy out = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return out;
    unsigned char pre[10];
    char header[1024];
    if (fread(pre, 1, 10, f) == 10 && memcmp(pre, "\x93NUMPY", 6) == 0 && pre[6] == 1) {
        size_t hlen = pre[8] | (size_t)pre[9] << 8;
        if (hlen < sizeof header && fread(header, 1, hlen, f) == hlen) {
            header[hlen] = 0;
            long long r, c;
            const char *shape = strstr(header, "'shape': (");
            if (strstr(header, "'descr': '<f4'") && strstr(header, "'fortran_order': False") && shape &&
                sscanf(shape, "'shape': (%lld, %lld)", &r, &c) == 2 && r > 0 && c > 0) {
                out.rows = r;
                out.cols = c;
                out.data = cv_xmalloc((size_t)(r * c) * sizeof(float));
                if (fread(out.data, sizeof(float), (size_t)(r * c), f) != (size_t)(r * c)) {
                    free(out.data);
                    out.data = NULL;
                }
            }
        }
    }
    fclose(f);
    return out;
}

typedef struct reference {
    int32_t prompt[MAX_TOKENS];
    int32_t n_prompt;
    int32_t greedy[8];
    npy logits, gen_logits;
} reference;

static int read_ids(json_t *arr, int32_t *out, int cap) {
    if (!json_is_array(arr) || (int)json_array_size(arr) > cap) return -1;
    for (size_t i = 0; i < json_array_size(arr); i++) out[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return (int)json_array_size(arr);
}

static int load_reference(const char *dir, const char *prompt, reference *ref) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.%s.json", dir, prompt);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return -1;
    ref->n_prompt = read_ids(json_object_get(root, "prompt"), ref->prompt, MAX_TOKENS);
    int n_greedy = read_ids(json_object_get(root, "greedy"), ref->greedy, 8);
    json_decref(root);
    snprintf(path, sizeof path, "%s/ref.%s.logits.npy", dir, prompt);
    ref->logits = read_npy(path);
    snprintf(path, sizeof path, "%s/ref.%s.gen_logits.npy", dir, prompt);
    ref->gen_logits = read_npy(path);
    bool ok = ref->n_prompt > 0 && n_greedy == 8 && ref->logits.data && ref->gen_logits.data &&
              ref->logits.rows == ref->n_prompt && ref->gen_logits.rows == 8;
    return ok ? 0 : -1;
}

static void free_reference(reference *ref) {
    free(ref->logits.data);
    free(ref->gen_logits.data);
}

/* max|Δ| / max|ref| over one row of logits. */
static double row_error(const float *got, const float *want, int64_t n) {
    double max_diff = 0, max_ref = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= max_diff)) max_diff = d; /* NaN propagates as failure */
        max_ref = fmax(max_ref, fabs(want[i]));
    }
    return max_diff / max_ref;
}

/* ---- paged KV cache and batches ------------------------------------------------------------- */

typedef struct paged_cache {
    cv_kv_cache kv;
    int32_t free_blocks[NUM_BLOCKS];
    int32_t n_free;
} paged_cache;

static void cache_init(paged_cache *c, const cv_kv_spec *spec) {
    size_t floats = (size_t)NUM_BLOCKS * BLOCK_SIZE * (size_t)spec->num_kv_heads * (size_t)spec->head_dim;
    c->kv = (cv_kv_cache){.num_blocks = NUM_BLOCKS, .block_size = BLOCK_SIZE};
    c->kv.k = cv_xcalloc((size_t)spec->num_layers, sizeof(float *));
    c->kv.v = cv_xcalloc((size_t)spec->num_layers, sizeof(float *));
    for (int l = 0; l < spec->num_layers; l++) {
        c->kv.k[l] = cv_xmalloc(floats * sizeof(float));
        c->kv.v[l] = cv_xmalloc(floats * sizeof(float));
        for (size_t i = 0; i < floats; i++) c->kv.k[l][i] = c->kv.v[l][i] = NAN;
    }
    /* A fixed shuffle: block ids come out scattered and sequences interleave. */
    for (int i = 0; i < NUM_BLOCKS; i++) c->free_blocks[i] = (i * 29 + 7) % NUM_BLOCKS;
    c->n_free = NUM_BLOCKS;
}

static void cache_free(paged_cache *c, int n_layers) {
    for (int l = 0; l < n_layers; l++) {
        free(c->kv.k[l]);
        free(c->kv.v[l]);
    }
    free(c->kv.k);
    free(c->kv.v);
}

typedef struct sequence {
    const int32_t *tokens; /* the whole token stream this sequence will see */
    int32_t n_total;
    int32_t done;          /* tokens already in the cache */
    int32_t block_table[MAX_TOKENS / BLOCK_SIZE + 2];
    int32_t n_blocks;
} sequence;

static void sequence_reserve(paged_cache *c, sequence *s, int32_t len) {
    while (s->n_blocks * BLOCK_SIZE < len) {
        if (c->n_free == 0) abort(); /* the test sizes its cache; running out is a test bug */
        s->block_table[s->n_blocks++] = c->free_blocks[--c->n_free];
    }
}

typedef struct step {
    int32_t token_ids[3 * MAX_TOKENS], positions[3 * MAX_TOKENS], logit_rows[3 * MAX_TOKENS];
    int64_t slots[3 * MAX_TOKENS];
    int32_t seq_start[4], context_lens[3];
    const int32_t *tables[3];
    cv_batch batch;
} step;

/* Appends the next `n` tokens of s to the step as one sequence, all of them wanting logits. */
static void step_add(step *st, paged_cache *c, sequence *s, int32_t n) {
    cv_batch *b = &st->batch;
    sequence_reserve(c, s, s->done + n);
    for (int32_t i = 0; i < n; i++) {
        int32_t t = b->n_tokens++, pos = s->done + i;
        st->token_ids[t] = s->tokens[pos];
        st->positions[t] = pos;
        st->slots[t] = (int64_t)s->block_table[pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE;
        st->logit_rows[b->n_logits++] = t;
    }
    s->done += n;
    st->context_lens[b->n_seqs] = s->done;
    st->tables[b->n_seqs] = s->block_table;
    st->seq_start[++b->n_seqs] = b->n_tokens;
}

static void step_begin(step *st) {
    st->seq_start[0] = 0;
    st->batch = (cv_batch){.token_ids = st->token_ids, .positions = st->positions, .slot_mapping = st->slots,
                           .seq_start = st->seq_start, .context_lens = st->context_lens, .block_tables = st->tables,
                           .logit_rows = st->logit_rows};
}

/* ---- the scenarios -------------------------------------------------------------------------- */

typedef struct fixture {
    const char *name;
    cv_model *model;
    int32_t vocab;
    paged_cache cache;
    float *logits; /* [3·MAX_TOKENS][vocab] */
    double worst;  /* over every check of this fixture */
} fixture;

static void fixture_reset_cache(fixture *fx) {
    cache_free(&fx->cache, fx->model->kv_spec.num_layers);
    cache_init(&fx->cache, &fx->model->kv_spec);
}

/* Checks the logits of the rows just computed for s (positions [first, first+n)). */
static void check_rows(fixture *fx, const char *what, const float *logits, const reference *ref, int32_t first,
                       int32_t n) {
    double worst = 0;
    for (int32_t i = 0; i < n; i++) {
        double e = row_error(logits + (int64_t)i * fx->vocab, ref->logits.data + (int64_t)(first + i) * fx->vocab,
                             fx->vocab);
        worst = e > worst || isnan(e) ? e : worst;
    }
    CHECK_MSG(worst <= TOLERANCE, "%s [%s] %s positions %d..%d: rel error %.3g", fx->name,
              cv_isa_name(cv_isa_active()), what, first, first + n - 1, worst);
    if (worst > fx->worst || isnan(worst)) fx->worst = worst;
}

static void run_chunked(fixture *fx, const reference *ref, int32_t chunk, const char *what) {
    fixture_reset_cache(fx);
    sequence s = {.tokens = ref->prompt, .n_total = ref->n_prompt};
    step st;
    while (s.done < s.n_total) {
        int32_t first = s.done, n = s.n_total - s.done < chunk ? s.n_total - s.done : chunk;
        step_begin(&st);
        step_add(&st, &fx->cache, &s, n);
        int rc = fx->model->ops->forward(fx->model, &st.batch, &fx->cache.kv, NULL, fx->logits);
        CHECK_MSG(rc == 0, "%s: forward failed: %s", fx->name, cv_error_message());
        if (rc) return;
        check_rows(fx, what, fx->logits, ref, first, n);
    }
}

/* Three sequences on different chunk schedules in shared forward calls; the first one's prompt is
 * `main`, the others are `other` and a 41-token prefix of `longest`. */
static void run_batched(fixture *fx, const reference *main, const reference *other, const reference *longest) {
    fixture_reset_cache(fx);
    const reference *refs[3] = {main, other, longest};
    sequence seqs[3] = {{.tokens = main->prompt, .n_total = main->n_prompt},
                        {.tokens = other->prompt, .n_total = other->n_prompt},
                        {.tokens = longest->prompt, .n_total = 41}};
    /* Per sequence: a first prefill chunk, then the chunk size of every later step (1 = decode). */
    const int32_t first_chunk[3] = {5, 20, 13}, later_chunk[3] = {9, 1, 13};
    step st;
    for (int round = 0; seqs[0].done < seqs[0].n_total || seqs[1].done < seqs[1].n_total ||
                        seqs[2].done < seqs[2].n_total;
         round++) {
        step_begin(&st);
        int32_t firsts[3], order[3], n_in = 0;
        for (int k = 0; k < 3; k++) {
            int i = (k + round) % 3; /* rotate which sequence comes first in the batch */
            sequence *s = &seqs[i];
            if (s->done >= s->n_total) continue;
            int32_t want = s->done == 0 ? first_chunk[i] : later_chunk[i];
            int32_t n = s->n_total - s->done < want ? s->n_total - s->done : want;
            firsts[n_in] = s->done;
            order[n_in++] = i;
            step_add(&st, &fx->cache, s, n);
        }
        int rc = fx->model->ops->forward(fx->model, &st.batch, &fx->cache.kv, NULL, fx->logits);
        CHECK_MSG(rc == 0, "%s: batched forward failed: %s", fx->name, cv_error_message());
        if (rc) return;
        for (int k = 0; k < n_in; k++) {
            int32_t n = st.seq_start[k + 1] - st.seq_start[k];
            check_rows(fx, "batched", fx->logits + (int64_t)st.seq_start[k] * fx->vocab, refs[order[k]], firsts[k], n);
        }
    }
}

static int32_t argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Prefill, then 8 free-running greedy steps; while the ids agree this is the reference's teacher
 * forcing, so each step's logits are compared with gen_logits. */
static void run_greedy(fixture *fx, const reference *ref) {
    fixture_reset_cache(fx);
    int32_t stream[MAX_TOKENS + 8];
    memcpy(stream, ref->prompt, (size_t)ref->n_prompt * sizeof *stream);
    sequence s = {.tokens = stream, .n_total = ref->n_prompt + 8};
    step st;
    step_begin(&st);
    step_add(&st, &fx->cache, &s, ref->n_prompt);
    st.batch.n_logits = 1; /* only the last position, as a real prefill asks */
    st.logit_rows[0] = ref->n_prompt - 1;
    int rc = fx->model->ops->forward(fx->model, &st.batch, &fx->cache.kv, NULL, fx->logits);
    CHECK_MSG(rc == 0, "%s: prefill failed: %s", fx->name, cv_error_message());
    double worst = 0;
    int matched = 0;
    for (int i = 0; i < 8 && rc == 0; i++) {
        double e = row_error(fx->logits, ref->gen_logits.data + (int64_t)i * fx->vocab, fx->vocab);
        worst = e > worst || isnan(e) ? e : worst;
        int32_t next = argmax(fx->logits, fx->vocab);
        if (next != ref->greedy[i]) break;
        matched++;
        stream[ref->n_prompt + i] = next;
        if (i == 7) break;
        step_begin(&st);
        step_add(&st, &fx->cache, &s, 1);
        rc = fx->model->ops->forward(fx->model, &st.batch, &fx->cache.kv, NULL, fx->logits);
        CHECK_MSG(rc == 0, "%s: decode failed: %s", fx->name, cv_error_message());
    }
    CHECK_MSG(matched == 8, "%s [%s]: greedy ids diverge from the reference at step %d", fx->name,
              cv_isa_name(cv_isa_active()), matched);
    CHECK_MSG(worst <= TOLERANCE, "%s [%s]: greedy logits rel error %.3g", fx->name, cv_isa_name(cv_isa_active()),
              worst);
    if (worst > fx->worst || isnan(worst)) fx->worst = worst;
}

static int load_model(const char *dir, cv_model_config *cfg, cv_weight_source **src, cv_threadpool *pool,
                      cv_model **model) {
    int rc = cv_model_config_load(dir, cfg);
    if (rc) return rc;
    rc = cv_weight_source_checkpoint(dir, src);
    if (rc) {
        cv_model_config_free(cfg);
        return rc;
    }
    cv_model_load_params p = {.config = cfg, .weights = *src, .pool = pool, .max_num_batched_tokens = 64};
    rc = cv_model_load(&p, model);
    if (rc) {
        cv_weight_source_free(*src);
        cv_model_config_free(cfg);
    }
    return rc;
}

static void test_folder(const char *folder, cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    reference refs[2] = {0};
    for (int p = 0; p < 2; p++)
        if (load_reference(dir, PROMPTS[p], &refs[p])) {
            CHECK_MSG(0, "cannot read the %s reference in %s", PROMPTS[p], dir);
            for (int q = 0; q <= p; q++) free_reference(&refs[q]);
            return;
        }
    cv_model_config cfg;
    cv_weight_source *src;
    fixture fx = {.name = folder};
    int rc = load_model(dir, &cfg, &src, pool, &fx.model);
    CHECK_MSG(rc == 0, "loading %s: %s", dir, cv_error_message());
    if (rc == 0) {
        fx.vocab = fx.model->vocab_size;
        CHECK_EQ_INT(fx.vocab, refs[0].logits.cols);
        CHECK_EQ_INT(fx.model->kv_spec.head_dim, cfg.head_dim);
        fx.logits = cv_xmalloc((size_t)3 * MAX_TOKENS * (size_t)fx.vocab * sizeof(float));
        cache_init(&fx.cache, &fx.model->kv_spec);
        for (int p = 0; p < 2; p++) {
            run_chunked(&fx, &refs[p], MAX_TOKENS, "one-shot prefill");
            run_chunked(&fx, &refs[p], 1, "chunks of 1");
            run_chunked(&fx, &refs[p], 7, "chunks of 7");
            run_chunked(&fx, &refs[p], 64, "chunks of 64");
            run_batched(&fx, &refs[p], &refs[1 - p], &refs[1]);
            run_greedy(&fx, &refs[p]);
        }
        printf("%-22s %-7s max rel error %.3g\n", folder, cv_isa_name(cv_isa_active()), fx.worst);
        if (fx.worst > worst_rel_overall || isnan(fx.worst)) worst_rel_overall = fx.worst;
        cache_free(&fx.cache, fx.model->kv_spec.num_layers);
        free(fx.logits);
        cv_model_free(fx.model);
        cv_weight_source_free(src);
        cv_model_config_free(&cfg);
    }
    for (int p = 0; p < 2; p++) free_reference(&refs[p]);
}

/* ---- failure paths -------------------------------------------------------------------------- */

static void test_load_errors(cv_threadpool *pool) {
    char dir[512], tied_dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-dense-f32", CVLLM_TEST_DATA);
    snprintf(tied_dir, sizeof tied_dir, "%s/vectors/qwen3-dense-tied-bf16", CVLLM_TEST_DATA);
    CHECK_STR_EQ(cv_model_supported_architectures(), "Qwen3ForCausalLM");

    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m = (cv_model *)&cfg; /* must be reset to NULL on failure */
    CHECK_EQ_INT(cv_model_config_load(dir, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &src), 0);
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 16};

    snprintf(cfg.architecture, sizeof cfg.architecture, "LlamaForCausalLM");
    CHECK_EQ_INT(cv_model_load(&p, &m), CVLLM_ERR_UNSUPPORTED);
    CHECK(m == NULL);
    CHECK_CONTAINS(cv_error_message(), "unsupported architecture 'LlamaForCausalLM'; supported: Qwen3ForCausalLM");
    snprintf(cfg.architecture, sizeof cfg.architecture, "Qwen3ForCausalLM");

    cfg.intermediate_size = 100; /* the checkpoint says 128 */
    CHECK_EQ_INT(cv_model_load(&p, &m), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "mlp.gate_proj.weight");
    cfg.intermediate_size = 128;

    cfg.num_key_value_heads = 3; /* 4 heads cannot be grouped over 3 */
    CHECK_EQ_INT(cv_model_load(&p, &m), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "num_key_value_heads");
    cfg.num_key_value_heads = 2;

    /* The untied checkpoint, loaded as tied, still works (lm_head.weight is simply not used)... */
    cfg.tie_word_embeddings = true;
    CHECK_EQ_INT(cv_model_load(&p, &m), 0);
    cv_model_free(m);
    cfg.tie_word_embeddings = false;
    cv_weight_source_free(src);

    /* ...but a tied checkpoint loaded as untied lacks lm_head.weight. */
    CHECK_EQ_INT(cv_weight_source_checkpoint(tied_dir, &src), 0);
    p.weights = src;
    CHECK_EQ_INT(cv_model_load(&p, &m), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "lm_head.weight");
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

static void test_dummy_weights(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-dense-f32", CVLLM_TEST_DATA);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    CHECK_EQ_INT(cv_model_config_load(dir, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_BF16, 7, &src), 0);
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 0};
    CHECK_EQ_INT(cv_model_load(&p, &m), 0);
    /* per layer q,k,v,o (4·64·... ) + MLP, plus lm_head; bf16 = 2 bytes */
    const size_t H = 64, hd = 32, I = 128, V = 4096;
    size_t layer = (4 * hd * H + 2 * 2 * hd * H + H * 4 * hd + 3 * I * H) * 2;
    CHECK_EQ_INT(m->weight_bytes, 2 * layer + V * H * 2);

    /* max_num_batched_tokens 0: scratch grows on the first call. */
    paged_cache c;
    cache_init(&c, &m->kv_spec);
    static const int32_t ids[] = {1, 2, 3};
    sequence s = {.tokens = ids, .n_total = 3};
    step st;
    step_begin(&st);
    step_add(&st, &c, &s, 3);
    float *logits = cv_xmalloc(3 * V * sizeof(float));
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, NULL, logits), 0);
    int finite = 0;
    for (size_t i = 0; i < 3 * V; i++) finite += isfinite(logits[i]) != 0;
    CHECK_EQ_INT(finite, 3 * V);
    free(logits);
    cache_free(&c, m->kv_spec.num_layers);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

static void expect_batch_error(cv_model *m, paged_cache *c, step *st, const char *needle) {
    float *logits = cv_xmalloc(8 * (size_t)m->vocab_size * sizeof(float));
    CHECK_EQ_INT(m->ops->forward(m, &st->batch, &c->kv, NULL, logits), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), needle);
    free(logits);
}

static void test_bad_batches(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-dense-bf16", CVLLM_TEST_DATA);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    if (load_model(dir, &cfg, &src, pool, &m)) {
        CHECK_MSG(0, "loading %s: %s", dir, cv_error_message());
        return;
    }
    paged_cache c;
    cache_init(&c, &m->kv_spec);
    static const int32_t ids[] = {1, 2, 3, 4};
    sequence s = {.tokens = ids, .n_total = 4};
    step st;
#define FRESH_STEP()           \
    do {                       \
        s.done = 0;            \
        step_begin(&st);       \
        step_add(&st, &c, &s, 4); \
    } while (0)
    FRESH_STEP();
    st.token_ids[2] = 4096;
    expect_batch_error(m, &c, &st, "outside the vocabulary");
    FRESH_STEP();
    st.token_ids[0] = -1;
    expect_batch_error(m, &c, &st, "outside the vocabulary");
    FRESH_STEP();
    st.slots[1] += 1;
    expect_batch_error(m, &c, &st, "block table says");
    FRESH_STEP();
    st.positions[3] = 4; /* beyond context_lens = 4 */
    expect_batch_error(m, &c, &st, "outside its context");
    FRESH_STEP();
    st.positions[1] = 0;
    st.slots[1] = st.slots[0];
    expect_batch_error(m, &c, &st, "not increasing");
    FRESH_STEP();
    s.block_table[0] = NUM_BLOCKS;
    expect_batch_error(m, &c, &st, "outside [0, 48)");
    s.block_table[0] = 1;
    FRESH_STEP();
    st.logit_rows[0] = 4;
    expect_batch_error(m, &c, &st, "logit row 4");
    FRESH_STEP();
    st.seq_start[1] = 3;
    expect_batch_error(m, &c, &st, "seq_start");
#undef FRESH_STEP
    cache_free(&c, m->kv_spec.num_layers);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    test_load_errors(pool);
    test_dummy_weights(pool);
    test_bad_batches(pool);
    static const cv_isa isas[] = {CV_ISA_AVX512, CV_ISA_AVX2};
    for (size_t i = 0; i < CV_ARRAY_LEN(isas); i++) {
        if (cv_isa_force(isas[i])) {
            printf("test_qwen3_ref: %s path not supported on this CPU, skipped\n", cv_isa_name(isas[i]));
            continue;
        }
        for (size_t f = 0; f < CV_ARRAY_LEN(FOLDERS); f++) test_folder(FOLDERS[f], pool);
    }
    printf("test_qwen3_ref: max rel logit error over all checks %.3g (bound %.0e)\n", worst_rel_overall, TOLERANCE);
    cv_threadpool_free(pool);
    return cv_check_summary("test_qwen3_ref");
}
