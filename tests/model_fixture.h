/*
 * model_fixture.h — driving a model against Hugging Face reference logits (tests/data/vectors), shared
 * by the model reference tests (test_qwen3_ref.c, test_moe_ref.c, test_hybrid_ref.c, test_quant_ref.c).
 *
 * For one reference folder and each reference prompt (short, long150) the model must reproduce the
 * reference logits within a metric's bound (mf_metric: for f32 activations max|Δ| / max|ref| ≤ 1e-4
 * at every row; for quantized checkpoints the log-prob bound of the folder, every row and the median
 * row of each scenario) when
 *   (a) the prompt followed by the reference's greedy ids (teacher forcing) is prefilled in one call,
 *   (b) the same is prefilled in chunks of the sizes the test lists (earlier chunks only in the
 *       caches; chunks of 1 are token-by-token decode),
 *   (c) the prompt is processed in the same forward calls as two other prompts, each on its own chunk
 *       schedule, so batches mix prefill chunks and single-token decodes of different sequences,
 *   (d) the prompt is prefilled asking for its last row only, then decoded for 7 steps fed the
 *       reference's greedy ids: logits vs its gen_logits, and each step's argmax vs its greedy id
 *       unless the reference's own margin at that step is too small for the metric to decide it,
 *   (d') both prompts are prefilled in one forward call, then decoded together, one token of each
 *       per call (a decode batch), fed the greedy ids as in (d),
 * and, for models with recurrent state, (e) prefilled part-way, its state slot copied byte for byte
 * to another slot, and finished from the copy (the engine's checkpoint/rollback contract),
 * (f) prefilled in one call next to another prompt, with state checkpoints at positions on and off
 * the 64-token chunk grid (first and last token included), each then continued from a fresh copy of
 * its checkpoint slot, and (g) decoded speculatively: 1+k-token verify calls with a checkpoint at
 * every position, the drafts after the accepted ones wrong, each call followed by a rollback to the
 * checkpoint of the last accepted token.
 * Every prefix of a reference prompt has reference logits (the first rows, by causality), so the
 * "other" prompts in (c) are the other reference prompt and a prefix of the long one. Past the
 * prompt, the reference's greedy ids are fed (teacher forcing) and checked against its gen_logits.
 *
 * The KV cache uses 16-token blocks handed out from a shuffled free list (non-contiguous, with
 * sequences interleaved) and starts filled with NaN, so a read of any slot that was not written
 * poisons the logits. The recurrent-state slots start as NaN too and are reused dirty from one
 * scenario to the next, so a model that fails to clear a slot at position 0, or reads another
 * sequence's slot, fails loudly. Header-only (static functions), like testutil.h.
 */
#ifndef CV_MODEL_FIXTURE_H
#define CV_MODEL_FIXTURE_H

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
#include "testutil.h"

#define MF_TOLERANCE 1e-4
#define MF_TOP_IDS 5
#define MF_BLOCK_SIZE 16
#define MF_NUM_BLOCKS 48
#define MF_MAX_TOKENS 160
#define MF_STATE_SLOTS 10

static double mf_worst_overall;

/* ---- reference files ------------------------------------------------------------------------ */

typedef struct mf_reference {
    const char *name;           /* the prompt's: "short", "long150" */
    int32_t prompt[MF_MAX_TOKENS];
    int32_t n_prompt;
    int32_t greedy[8];
    float *logits, *gen_logits; /* [n_prompt][vocab], [8][vocab] */
    int64_t vocab;
} mf_reference;

static int mf_read_ids(json_t *arr, int32_t *out, int cap) {
    if (!json_is_array(arr) || (int)json_array_size(arr) > cap) return -1;
    for (size_t i = 0; i < json_array_size(arr); i++) out[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return (int)json_array_size(arr);
}

static int mf_load_reference(const char *dir, const char *prompt, mf_reference *ref) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.%s.json", dir, prompt);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return -1;
    ref->name = prompt;
    ref->n_prompt = mf_read_ids(json_object_get(root, "prompt"), ref->prompt, MF_MAX_TOKENS);
    int n_greedy = mf_read_ids(json_object_get(root, "greedy"), ref->greedy, 8);
    json_decref(root);
    size_t rows, cols, gen_rows, gen_cols;
    snprintf(path, sizeof path, "%s/ref.%s.logits.npy", dir, prompt);
    ref->logits = tu_load_npy(path, &rows, &cols);
    snprintf(path, sizeof path, "%s/ref.%s.gen_logits.npy", dir, prompt);
    ref->gen_logits = tu_load_npy(path, &gen_rows, &gen_cols);
    ref->vocab = (int64_t)cols;
    bool ok = ref->n_prompt > 0 && n_greedy == 8 && rows == (size_t)ref->n_prompt && gen_rows == 8 && gen_cols == cols;
    return ok ? 0 : -1;
}

static void mf_free_reference(mf_reference *ref) {
    free(ref->logits);
    free(ref->gen_logits);
}

/* The reference logits at `position` of the prompt continued by the greedy ids (the row that
 * predicts the token after it): prompt rows, then the teacher-forced gen_logits. */
static const float *mf_expected_row(const mf_reference *ref, int32_t position) {
    if (position < ref->n_prompt) return ref->logits + (int64_t)position * ref->vocab;
    if (position - ref->n_prompt + 1 >= 8) abort(); /* past the reference: a test bug */
    return ref->gen_logits + (int64_t)(position - ref->n_prompt + 1) * ref->vocab;
}

/* The prompt followed by the greedy ids: every position has reference logits. Returns its length. */
static int32_t mf_full_stream(const mf_reference *ref, int32_t *stream) {
    memcpy(stream, ref->prompt, (size_t)ref->n_prompt * sizeof *stream);
    memcpy(stream + ref->n_prompt, ref->greedy, 7 * sizeof *stream);
    return ref->n_prompt + 7;
}

/* max|Δ| / max|ref| over one row of logits. */
static double mf_row_error(const float *got, const float *want, int64_t n) {
    double max_diff = 0, max_ref = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= max_diff)) max_diff = d; /* NaN propagates as failure */
        max_ref = fmax(max_ref, fabs(want[i]));
    }
    return max_diff / max_ref;
}

static int32_t mf_argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* log Σ exp(v), in double. */
static double mf_logsumexp(const float *v, int64_t n) {
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, v[i]);
    for (int64_t i = 0; i < n; i++) sum += exp(v[i] - mx);
    return mx + log(sum);
}

/* max |Δ log-prob| over the MF_TOP_IDS ids the reference row ranks highest (ties: lower id first),
 * log-probs in double: the quantized references' measure, blind to a shift of the whole row and to
 * the far tail whose logits int8 noise moves most but whose probabilities are negligible. */
__attribute__((unused)) static double mf_top_logprob_error(const float *got, const float *want, int64_t n) {
    int64_t top[MF_TOP_IDS];
    int n_top = 0;
    for (int64_t i = 0; i < n; i++) {
        int at = n_top < MF_TOP_IDS ? n_top++ : MF_TOP_IDS;
        while (at > 0 && want[i] > want[top[at - 1]]) {
            if (at < MF_TOP_IDS) top[at] = top[at - 1];
            at--;
        }
        if (at < MF_TOP_IDS) top[at] = i;
    }
    const double lse_got = mf_logsumexp(got, n), lse_want = mf_logsumexp(want, n);
    double worst = 0;
    for (int k = 0; k < n_top; k++) {
        double d = fabs((got[top[k]] - lse_got) - (want[top[k]] - lse_want));
        if (!(d <= worst)) worst = d; /* NaN propagates as failure */
    }
    return worst;
}

/* Top-1 minus top-2 of a row: how far a reference row is from changing its argmax. */
static double mf_margin(const float *v, int64_t n) {
    double first = -INFINITY, second = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (v[i] > first) second = first, first = v[i];
        else if (v[i] > second) second = v[i];
    return first - second;
}

/* How a row of logits is compared with its reference row, and what passes. */
typedef struct mf_metric {
    const char *what;           /* for messages: "rel error" */
    double (*row_error)(const float *got, const float *want, int64_t n);
    double max_bound;           /* every row */
    double median_bound;        /* the median row of each scenario (both prompts); < 0: not bounded */
    /* A greedy step whose reference margin is above this must pick the reference's id. The top-5
     * log-prob metric bounds a change of the margin between two top ids by twice its value, so a
     * bound B decides every step with a margin above 2B. */
    double greedy_margin;
} mf_metric;

/* f32 activations: the engine computes what the reference computes up to rounding, every greedy id
 * included. */
static const mf_metric MF_REL_ERROR = {"rel error", mf_row_error, MF_TOLERANCE, -1, 0};

/* ---- paged KV cache, state slots and batches ------------------------------------------------- */

typedef struct mf_cache {
    cv_kv_cache kv;
    int32_t n_layers;
    int32_t free_blocks[MF_NUM_BLOCKS];
    int32_t n_free;
    cv_state_cache state;   /* no slots when the model keeps no state */
} mf_cache;

/* Fresh KV blocks, all NaN, handed out from a fixed shuffle: block ids come out scattered and
 * sequences interleave. The state slots keep whatever the last scenario left in them. */
static void mf_cache_reset_blocks(mf_cache *c, const cv_kv_spec *spec) {
    size_t bytes = (size_t)MF_NUM_BLOCKS * MF_BLOCK_SIZE * (size_t)spec->num_kv_heads * (size_t)spec->head_dim *
                   cv_dtype_size(c->kv.dtype);
    for (int l = 0; l < spec->num_layers; l++) {
        memset(c->kv.k[l], 0xff, bytes); /* NaN in every element, f32 or bf16 */
        memset(c->kv.v[l], 0xff, bytes);
    }
    for (int i = 0; i < MF_NUM_BLOCKS; i++) c->free_blocks[i] = (i * 29 + 7) % MF_NUM_BLOCKS;
    c->n_free = MF_NUM_BLOCKS;
}

/* A cache of K/V elements of `dtype` (F32 or BF16) for m. */
static void mf_cache_init_as(mf_cache *c, const cv_model *m, cv_dtype dtype) {
    const cv_kv_spec *spec = &m->kv_spec;
    size_t kv_bytes = (size_t)MF_NUM_BLOCKS * MF_BLOCK_SIZE * (size_t)spec->num_kv_heads * (size_t)spec->head_dim *
                      cv_dtype_size(dtype);
    c->kv = (cv_kv_cache){.num_blocks = MF_NUM_BLOCKS, .block_size = MF_BLOCK_SIZE, .dtype = dtype};
    c->n_layers = spec->num_layers;
    c->kv.k = cv_xcalloc((size_t)spec->num_layers + 1, sizeof(void *));
    c->kv.v = cv_xcalloc((size_t)spec->num_layers + 1, sizeof(void *));
    for (int l = 0; l < spec->num_layers; l++) {
        c->kv.k[l] = cv_xmalloc(kv_bytes);
        c->kv.v[l] = cv_xmalloc(kv_bytes);
    }
    mf_cache_reset_blocks(c, spec);
    c->state = (cv_state_cache){0};
    if (m->state_bytes_per_seq) {
        size_t bytes = MF_STATE_SLOTS * m->state_bytes_per_seq;
        c->state = (cv_state_cache){.num_slots = MF_STATE_SLOTS, .slot_bytes = m->state_bytes_per_seq,
                                    .data = cv_aligned_alloc(bytes)};
        memset(c->state.data, 0xff, bytes); /* NaN in every float */
    }
}

__attribute__((unused)) static void mf_cache_init(mf_cache *c, const cv_model *m) { mf_cache_init_as(c, m, CV_DTYPE_F32); }

static void mf_cache_free(mf_cache *c) {
    for (int l = 0; l < c->n_layers; l++) {
        free(c->kv.k[l]);
        free(c->kv.v[l]);
    }
    free(c->kv.k);
    free(c->kv.v);
    free(c->state.data);
}

typedef struct mf_sequence {
    const int32_t *tokens;  /* the whole token stream this sequence will see */
    int32_t n_total;
    int32_t done;           /* tokens already in the caches */
    int32_t state_slot;
    int32_t block_table[MF_MAX_TOKENS / MF_BLOCK_SIZE + 2];
    int32_t n_blocks;
} mf_sequence;

static void mf_sequence_reserve(mf_cache *c, mf_sequence *s, int32_t len) {
    while (s->n_blocks * MF_BLOCK_SIZE < len) {
        if (c->n_free == 0) abort(); /* the test sizes its cache; running out is a test bug */
        s->block_table[s->n_blocks++] = c->free_blocks[--c->n_free];
    }
}

typedef struct mf_step {
    int32_t token_ids[3 * MF_MAX_TOKENS], positions[3 * MF_MAX_TOKENS], logit_rows[3 * MF_MAX_TOKENS];
    int64_t slots[3 * MF_MAX_TOKENS];
    int32_t seq_start[4], context_lens[3], state_slots[3];
    const int32_t *tables[3];
    cv_state_checkpoint checkpoints[MF_STATE_SLOTS];
    cv_batch batch;
} mf_step;

static void mf_step_begin(mf_step *st) {
    st->seq_start[0] = 0;
    st->batch = (cv_batch){.token_ids = st->token_ids, .positions = st->positions, .slot_mapping = st->slots,
                           .seq_start = st->seq_start, .context_lens = st->context_lens, .block_tables = st->tables,
                           .state_slots = st->state_slots, .checkpoints = st->checkpoints,
                           .logit_rows = st->logit_rows};
}

/* Asks for the state of batch sequence `seq` right after `position` in `slot`. */
static void mf_step_checkpoint(mf_step *st, int32_t seq, int32_t position, int32_t slot) {
    if (st->batch.n_checkpoints == MF_STATE_SLOTS) abort(); /* a test bug */
    st->checkpoints[st->batch.n_checkpoints++] = (cv_state_checkpoint){seq, position, slot};
}

/* Appends the next `n` tokens of s to the step as one sequence, all of them wanting logits. */
static void mf_step_add(mf_step *st, mf_cache *c, mf_sequence *s, int32_t n) {
    cv_batch *b = &st->batch;
    mf_sequence_reserve(c, s, s->done + n);
    for (int32_t i = 0; i < n; i++) {
        int32_t t = b->n_tokens++, pos = s->done + i;
        st->token_ids[t] = s->tokens[pos];
        st->positions[t] = pos;
        st->slots[t] = (int64_t)s->block_table[pos / MF_BLOCK_SIZE] * MF_BLOCK_SIZE + pos % MF_BLOCK_SIZE;
        st->logit_rows[b->n_logits++] = t;
    }
    s->done += n;
    st->context_lens[b->n_seqs] = s->done;
    st->tables[b->n_seqs] = s->block_table;
    st->state_slots[b->n_seqs] = s->state_slot;
    st->seq_start[++b->n_seqs] = b->n_tokens;
}

/* ---- the scenarios -------------------------------------------------------------------------- */

enum { MF_MAX_SCENARIOS = 16 };

typedef struct mf_fixture {
    const char *name;
    const char *path;       /* the kernel path in messages; NULL: the active ISA's name */
    const mf_metric *metric;
    cv_model *model;
    int32_t vocab;
    mf_cache cache;
    float *logits;  /* [3·MF_MAX_TOKENS][vocab] */
    double worst;   /* over every check of this fixture */
    /* Every row's error per scenario, over both prompts: the summary line's worst and median. */
    const char *scenario_names[MF_MAX_SCENARIOS];
    double scenario_worst[MF_MAX_SCENARIOS];
    double *scenario_rows[MF_MAX_SCENARIOS];
    int64_t scenario_n_rows[MF_MAX_SCENARIOS];
    int n_scenarios, scenario;
} mf_fixture;

static const char *mf_path(const mf_fixture *fx) { return fx->path ? fx->path : cv_isa_name(cv_isa_active()); }

/* Makes `name` the scenario that later errors are attributed to. */
static void mf_scenario(mf_fixture *fx, const char *name) {
    for (fx->scenario = 0; fx->scenario < fx->n_scenarios; fx->scenario++)
        if (!strcmp(fx->scenario_names[fx->scenario], name)) return;
    if (fx->n_scenarios == MF_MAX_SCENARIOS) abort(); /* a test bug */
    fx->scenario_names[fx->n_scenarios] = name;
    fx->scenario_worst[fx->n_scenarios] = 0;
    fx->scenario_rows[fx->n_scenarios] = NULL;
    fx->scenario_n_rows[fx->n_scenarios++] = 0;
}

static int mf_compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return isnan(x) || isnan(y) ? isnan(x) - isnan(y) : (x > y) - (x < y); /* NaN sorts last */
}

/* The median of scenario i's row errors (the mean of the middle two for an even count). */
static double mf_scenario_median(mf_fixture *fx, int i) {
    int64_t n = fx->scenario_n_rows[i];
    if (n == 0) return 0;
    double *v = fx->scenario_rows[i];
    qsort(v, (size_t)n, sizeof *v, mf_compare_doubles);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int mf_forward(mf_fixture *fx, mf_step *st) {
    cv_state_cache *state = fx->cache.state.num_slots ? &fx->cache.state : NULL;
    return fx->model->ops->forward(fx->model, &st->batch, &fx->cache.kv, state, fx->logits);
}

/* Records one row's error in the current scenario; returns it. */
static double mf_note_row(mf_fixture *fx, const float *got, const float *want) {
    double e = fx->metric->row_error(got, want, fx->vocab);
    if (e > fx->worst || isnan(e)) fx->worst = e;
    const int i = fx->scenario;
    if (e > fx->scenario_worst[i] || isnan(e)) fx->scenario_worst[i] = e;
    int64_t n = fx->scenario_n_rows[i];
    if (n == 0 || (n >= 64 && (n & (n - 1)) == 0)) /* 64 rows, then doubled whenever full */
        fx->scenario_rows[i] = cv_xrealloc(fx->scenario_rows[i], (size_t)(n ? 2 * n : 64) * sizeof(double));
    fx->scenario_rows[i][fx->scenario_n_rows[i]++] = e;
    return e;
}

/* Checks the logits of the rows just computed for a sequence (positions [first, first+n)). */
static void mf_check_rows(mf_fixture *fx, const char *what, const float *logits, const mf_reference *ref, int32_t first,
                          int32_t n) {
    double worst = 0;
    int32_t at = first;
    for (int32_t i = 0; i < n; i++) {
        double e = mf_note_row(fx, logits + (int64_t)i * fx->vocab, mf_expected_row(ref, first + i));
        if (e > worst || isnan(e)) worst = e, at = first + i;
    }
    CHECK_MSG(worst <= fx->metric->max_bound, "%s [%s] %s, %s positions %d..%d: %s %.3g at position %d (bound %.3g)",
              fx->name, mf_path(fx), what, ref->name, first, first + n - 1, fx->metric->what, worst, at,
              fx->metric->max_bound);
}

/* Feeds s in chunks of `chunk` tokens from where it stands, checking every row. */
static int mf_feed(mf_fixture *fx, const mf_reference *ref, mf_sequence *s, int32_t until, int32_t chunk,
                   const char *what) {
    mf_step st;
    while (s->done < until) {
        int32_t first = s->done, n = until - s->done < chunk ? until - s->done : chunk;
        mf_step_begin(&st);
        mf_step_add(&st, &fx->cache, s, n);
        int rc = mf_forward(fx, &st);
        CHECK_MSG(rc == 0, "%s: forward failed: %s", fx->name, cv_error_message());
        if (rc) return rc;
        mf_check_rows(fx, what, fx->logits, ref, first, n);
    }
    return 0;
}

static void mf_run_chunked(mf_fixture *fx, const mf_reference *ref, int32_t chunk, int32_t state_slot) {
    static const char *const names[] = {"one-shot", "chunks of 1", "chunks of 5", "chunks of 7", "chunks of 64",
                                        "chunks of 100"};
    static const int32_t sizes[] = {MF_MAX_TOKENS, 1, 5, 7, 64, 100};
    const char *what = NULL;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] == chunk) what = names[i];
    if (!what) abort(); /* a chunk size without a name: extend the table */
    mf_scenario(fx, what);
    mf_cache_reset_blocks(&fx->cache, &fx->model->kv_spec);
    int32_t stream[MF_MAX_TOKENS + 8];
    mf_sequence s = {.tokens = stream, .n_total = mf_full_stream(ref, stream), .state_slot = state_slot};
    mf_feed(fx, ref, &s, s.n_total, chunk, what);
}

/* Three sequences on different chunk schedules in shared forward calls; the first one's prompt is
 * `main`, the others are `other` and a 41-token prefix of `longest`. */
static void mf_run_batched(mf_fixture *fx, const mf_reference *main, const mf_reference *other,
                           const mf_reference *longest) {
    mf_scenario(fx, "batched");
    mf_cache_reset_blocks(&fx->cache, &fx->model->kv_spec);
    const mf_reference *refs[3] = {main, other, longest};
    mf_sequence seqs[3] = {{.tokens = main->prompt, .n_total = main->n_prompt, .state_slot = 2},
                           {.tokens = other->prompt, .n_total = other->n_prompt, .state_slot = 0},
                           {.tokens = longest->prompt, .n_total = 41, .state_slot = 3}};
    /* Per sequence: a first prefill chunk, then the chunk size of every later step (1 = decode). */
    const int32_t first_chunk[3] = {5, 20, 13}, later_chunk[3] = {9, 1, 13};
    mf_step st;
    for (int round = 0; seqs[0].done < seqs[0].n_total || seqs[1].done < seqs[1].n_total ||
                        seqs[2].done < seqs[2].n_total;
         round++) {
        mf_step_begin(&st);
        int32_t firsts[3], order[3], n_in = 0;
        for (int k = 0; k < 3; k++) {
            int i = (k + round) % 3; /* rotate which sequence comes first in the batch */
            mf_sequence *s = &seqs[i];
            if (s->done >= s->n_total) continue;
            int32_t want = s->done == 0 ? first_chunk[i] : later_chunk[i];
            int32_t n = s->n_total - s->done < want ? s->n_total - s->done : want;
            firsts[n_in] = s->done;
            order[n_in++] = i;
            mf_step_add(&st, &fx->cache, s, n);
        }
        int rc = mf_forward(fx, &st);
        CHECK_MSG(rc == 0, "%s: batched forward failed: %s", fx->name, cv_error_message());
        if (rc) return;
        for (int k = 0; k < n_in; k++) {
            int32_t n = st.seq_start[k + 1] - st.seq_start[k];
            mf_check_rows(fx, "batched", fx->logits + (int64_t)st.seq_start[k] * fx->vocab, refs[order[k]], firsts[k],
                          n);
        }
    }
}

/* Prefill asking for the last row only, then 7 single-token decode steps fed the reference's greedy
 * ids (teacher forcing), each step's logits compared with gen_logits and its argmax with the greedy
 * id wherever the reference's margin at that step lets the metric decide it. */
static void mf_run_greedy(mf_fixture *fx, const mf_reference *ref) {
    mf_scenario(fx, "greedy");
    mf_cache_reset_blocks(&fx->cache, &fx->model->kv_spec);
    int32_t stream[MF_MAX_TOKENS + 8];
    mf_sequence s = {.tokens = stream, .n_total = mf_full_stream(ref, stream), .state_slot = 1};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &fx->cache, &s, ref->n_prompt);
    st.batch.n_logits = 1; /* only the last position, as a real prefill asks */
    st.logit_rows[0] = ref->n_prompt - 1;
    for (int i = 0; i < 8; i++) {
        if (i > 0) {
            mf_step_begin(&st);
            mf_step_add(&st, &fx->cache, &s, 1);
        }
        int rc = mf_forward(fx, &st);
        CHECK_MSG(rc == 0, "%s: %s failed: %s", fx->name, i ? "decode" : "prefill", cv_error_message());
        if (rc) return;
        const float *want = ref->gen_logits + (int64_t)i * fx->vocab;
        double e = mf_note_row(fx, fx->logits, want);
        CHECK_MSG(e <= fx->metric->max_bound, "%s [%s] greedy, %s step %d: %s %.3g (bound %.3g)", fx->name, mf_path(fx),
                  ref->name, i, fx->metric->what, e, fx->metric->max_bound);
        const int32_t got = mf_argmax(fx->logits, fx->vocab);
        const double margin = mf_margin(want, fx->vocab);
        CHECK_MSG(got == ref->greedy[i] || margin <= fx->metric->greedy_margin,
                  "%s [%s] greedy, %s step %d: id %d where the reference picks %d by a margin of %.3g", fx->name,
                  mf_path(fx), ref->name, i, got, ref->greedy[i], margin);
    }
}

/* (d'): both prompts in one prefill call, then 7 calls that decode one token of each. */
static void mf_run_decode_batch(mf_fixture *fx, const mf_reference *a, const mf_reference *b) {
    mf_scenario(fx, "decode batch");
    mf_cache_reset_blocks(&fx->cache, &fx->model->kv_spec);
    const mf_reference *refs[2] = {a, b};
    int32_t streams[2][MF_MAX_TOKENS + 8];
    mf_sequence seqs[2];
    for (int k = 0; k < 2; k++)
        seqs[k] = (mf_sequence){.tokens = streams[k], .n_total = mf_full_stream(refs[k], streams[k]), .state_slot = 4 + k};
    mf_step st;
    for (int step = 0; step < 8; step++) {
        int32_t firsts[2];
        mf_step_begin(&st);
        for (int k = 0; k < 2; k++) {
            firsts[k] = seqs[k].done;
            mf_step_add(&st, &fx->cache, &seqs[k], step ? 1 : refs[k]->n_prompt);
        }
        int rc = mf_forward(fx, &st);
        CHECK_MSG(rc == 0, "%s: decode batch forward failed: %s", fx->name, cv_error_message());
        if (rc) return;
        for (int k = 0; k < 2; k++)
            mf_check_rows(fx, "decode batch", fx->logits + (int64_t)st.seq_start[k] * fx->vocab, refs[k], firsts[k],
                          st.seq_start[k + 1] - st.seq_start[k]);
    }
}

/* Prefill 37 tokens in slot 0, copy the slot's bytes to slot 2, poison slot 0, finish from slot 2. */
static void mf_run_state_copy(mf_fixture *fx, const mf_reference *ref) {
    cv_state_cache *st = &fx->cache.state;
    if (!st->num_slots || ref->n_prompt <= 37) return;
    mf_scenario(fx, "state copy");
    mf_cache_reset_blocks(&fx->cache, &fx->model->kv_spec);
    mf_sequence s = {.tokens = ref->prompt, .n_total = ref->n_prompt, .state_slot = 0};
    if (mf_feed(fx, ref, &s, 37, 37, "before a state copy")) return;
    memcpy(st->data + 2 * st->slot_bytes, st->data, st->slot_bytes);
    memset(st->data, 0xff, st->slot_bytes); /* NaN everywhere */
    s.state_slot = 2;
    mf_feed(fx, ref, &s, s.n_total, 50, "after a state copy");
}

static void mf_poison_slot(mf_fixture *fx, int32_t slot) {
    cv_state_cache *st = &fx->cache.state;
    memset(st->data + (size_t)slot * st->slot_bytes, 0xff, st->slot_bytes); /* NaN everywhere */
}

/* NaN into the KV entries of s at positions [from, to), so that a continuation from `from` cannot
 * read what an earlier call wrote there. */
static void mf_poison_kv(mf_fixture *fx, const mf_sequence *s, int32_t from, int32_t to) {
    const cv_kv_spec *spec = &fx->model->kv_spec;
    const cv_dtype dt = fx->cache.kv.dtype;
    const size_t esize = cv_dtype_size(dt);
    for (int32_t p = from; p < to && p < s->n_blocks * MF_BLOCK_SIZE; p++) {
        int64_t slot = (int64_t)s->block_table[p / MF_BLOCK_SIZE] * MF_BLOCK_SIZE + p % MF_BLOCK_SIZE;
        for (int g = 0; g < spec->num_kv_heads; g++)
            for (int d = 0; d < spec->head_dim; d++)
                for (int value = 0; value < 2; value++) {
                    const size_t at = (size_t)cv_kv_index(dt, value, slot, g, d, spec->num_kv_heads, spec->head_dim,
                                                          MF_BLOCK_SIZE) * esize;
                    for (int l = 0; l < spec->num_layers; l++)
                        memset((char *)(value ? fx->cache.kv.v[l] : fx->cache.kv.k[l]) + at, 0xff, esize); /* NaN */
                }
    }
}

/* Continues a copy of s from just after `position`, out of state slot `slot`, to `until`. */
static void mf_resume(mf_fixture *fx, const mf_reference *ref, const mf_sequence *s, int32_t position, int32_t slot,
                      int32_t until, const char *what) {
    mf_sequence c = *s;
    c.done = position + 1;
    c.state_slot = slot;
    mf_poison_kv(fx, &c, c.done, until);
    mf_feed(fx, ref, &c, until, 37, what);
}

/* (f): `ref` with checkpoints, batched behind 20 tokens of `other` with one checkpoint of its own. */
static void mf_run_checkpoints(mf_fixture *fx, const mf_reference *ref, const mf_reference *other) {
    if (!fx->cache.state.num_slots) return;
    mf_scenario(fx, "checkpoints");
    mf_cache_reset_blocks(&fx->cache, &fx->model->kv_spec);
    int32_t stream[MF_MAX_TOKENS + 8];
    const int32_t n = ref->n_prompt, n_other = other->n_prompt < 20 ? other->n_prompt : 20;
    mf_sequence s = {.tokens = stream, .n_total = mf_full_stream(ref, stream), .state_slot = 0};
    mf_sequence o = {.tokens = other->prompt, .n_total = other->n_prompt, .state_slot = 8};
    mf_sequence_reserve(&fx->cache, &s, s.n_total);
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &fx->cache, &o, n_other);
    mf_step_add(&st, &fx->cache, &s, n);
    const int32_t other_at = n_other / 2;
    mf_step_checkpoint(&st, 0, other_at, 9);
    static const int32_t wanted[] = {0, 3, 16, 63, 100};
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++)
        if (wanted[i] < n - 1) mf_step_checkpoint(&st, 1, wanted[i], st.batch.n_checkpoints);
    mf_step_checkpoint(&st, 1, n - 1, st.batch.n_checkpoints);
    int rc = mf_forward(fx, &st);
    CHECK_MSG(rc == 0, "%s: forward with checkpoints failed: %s", fx->name, cv_error_message());
    if (rc) return;
    mf_check_rows(fx, "checkpointed prefill", fx->logits, other, 0, n_other);
    mf_check_rows(fx, "checkpointed prefill", fx->logits + (int64_t)n_other * fx->vocab, ref, 0, n);
    mf_poison_slot(fx, 0);
    mf_poison_slot(fx, 8);
    cv_state_checkpoint ck[MF_STATE_SLOTS];
    const int32_t n_ck = st.batch.n_checkpoints;
    memcpy(ck, st.checkpoints, (size_t)n_ck * sizeof *ck);
    for (int32_t i = 0; i < n_ck; i++)
        if (ck[i].seq == 0) mf_resume(fx, other, &o, ck[i].position, ck[i].slot, o.n_total, "after a checkpoint");
        else mf_resume(fx, ref, &s, ck[i].position, ck[i].slot, s.n_total, "after a checkpoint");
}

/* (g): prefill, then verify calls of 1+k tokens whose accepted count cycles through 0..k, the
 * rejected drafts being wrong tokens; the state rolls back to the last accepted token's checkpoint. */
static void mf_run_verify(mf_fixture *fx, const mf_reference *ref) {
    enum { K = 3 };
    if (!fx->cache.state.num_slots) return;
    mf_scenario(fx, "verify");
    mf_cache_reset_blocks(&fx->cache, &fx->model->kv_spec);
    int32_t stream[MF_MAX_TOKENS + 8], input[MF_MAX_TOKENS + 8];
    mf_sequence s = {.tokens = input, .n_total = mf_full_stream(ref, stream), .state_slot = 0};
    memcpy(input, stream, (size_t)s.n_total * sizeof *input);
    const int32_t prefill = ref->n_prompt > 40 ? 40 : 2;
    if (mf_feed(fx, ref, &s, prefill, prefill, "before verifying")) return;
    static const int32_t accepted_cycle[] = {1, K, 0, 2};
    for (int round = 0; s.done < s.n_total; round++) {
        const int32_t pos = s.done, n = s.n_total - pos < 1 + K ? s.n_total - pos : 1 + K;
        int32_t accepted = accepted_cycle[round % 4] < n - 1 ? accepted_cycle[round % 4] : n - 1;
        for (int32_t j = accepted + 1; j < n; j++) input[pos + j] = (stream[pos + j] + 1 + j) % fx->vocab;
        mf_step st;
        mf_step_begin(&st);
        mf_step_add(&st, &fx->cache, &s, n);
        int32_t dest[1 + K];
        for (int32_t j = 0, slot = 0; j < n; j++, slot++) {
            if (slot == s.state_slot) slot++;
            dest[j] = slot;
            mf_step_checkpoint(&st, 0, pos + j, slot);
        }
        int rc = mf_forward(fx, &st);
        CHECK_MSG(rc == 0, "%s: verify forward failed: %s", fx->name, cv_error_message());
        if (rc) return;
        mf_check_rows(fx, "verify", fx->logits, ref, pos, accepted + 1);
        memcpy(input + pos, stream + pos, (size_t)n * sizeof *input);
        /* Only the kept checkpoint survives: a copy the next call fails to write reads as NaN. */
        mf_poison_slot(fx, s.state_slot);
        for (int32_t j = 0; j < n; j++)
            if (j != accepted) mf_poison_slot(fx, dest[j]);
        mf_poison_kv(fx, &s, pos + accepted + 1, pos + n);
        s.done = pos + accepted + 1;
        s.state_slot = dest[accepted];
    }
}

/* Loads the checkpoint in dir, computing in bf16 (cv_model_load_params.bf16_compute) or f32. */
static int mf_load_model_as(const char *dir, bool bf16_compute, cv_model_config *cfg, cv_weight_source **src,
                            cv_threadpool *pool, cv_model **model) {
    int rc = cv_model_config_load(dir, NULL, cfg);
    if (rc) return rc;
    rc = cv_weight_source_checkpoint(dir, src);
    if (rc) {
        cv_model_config_free(cfg);
        return rc;
    }
    cv_model_load_params p = {
        .config = cfg, .weights = *src, .pool = pool, .max_num_batched_tokens = 64, .bf16_compute = bf16_compute};
    rc = cv_model_load(&p, model);
    if (rc) {
        cv_weight_source_free(*src);
        cv_model_config_free(cfg);
    }
    return rc;
}

__attribute__((unused)) static int mf_load_model(const char *dir, cv_model_config *cfg, cv_weight_source **src, cv_threadpool *pool,
                         cv_model **model) {
    return mf_load_model_as(dir, false, cfg, src, pool, model);
}

/* Loads the checkpoint in dir with its config.json first changed by edit, and frees the model
 * again: the load's status (a failed load must leave the model NULL). edit gets the text model's
 * part of the config: its text_config where the file nests one (Qwen3.5), else the whole file. */
__attribute__((unused)) static int mf_load_edited(const char *dir, void (*edit)(json_t *text), cv_threadpool *pool) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return -1000;
    json_t *text = json_object_get(root, "text_config");
    edit(text ? text : root);
    char *dumped = json_dumps(root, 0);
    json_decref(root);
    cv_model_config cfg;
    int rc = cv_model_config_parse(dumped, strlen(dumped), "config.json", &cfg);
    free(dumped);
    if (rc) return rc;
    cv_weight_source *src;
    rc = cv_weight_source_checkpoint(dir, &src);
    if (rc) {
        cv_model_config_free(&cfg);
        return rc;
    }
    cv_model *m = (cv_model *)&cfg; /* must come back NULL on failure */
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 8};
    rc = cv_model_load(&p, &m);
    if (rc) CHECK(m == NULL);
    else cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
    return rc;
}

/* The step's forward must succeed with every logit finite (dummy weights: no reference to match). */
__attribute__((unused)) static void mf_expect_finite(cv_model *m, mf_cache *c, mf_step *st) {
    const size_t n = (size_t)st->batch.n_logits * (size_t)m->vocab_size;
    float *logits = cv_xmalloc(n * sizeof(float));
    CHECK_EQ_INT(m->ops->forward(m, &st->batch, &c->kv, m->state_bytes_per_seq ? &c->state : NULL, logits), 0);
    size_t finite = 0;
    for (size_t i = 0; i < n; i++) finite += isfinite(logits[i]) != 0;
    CHECK_EQ_INT(finite, n);
    free(logits);
}

/* The step's forward (with state, which may differ from the cache's own) must fail as an invalid
 * argument whose message says needle. The tests' malformed batches ask for at most 8 logit rows. */
__attribute__((unused)) static void mf_expect_forward_error(cv_model *m, mf_cache *c, mf_step *st,
                                                            cv_state_cache *state, const char *needle) {
    float *logits = cv_xmalloc(8 * (size_t)m->vocab_size * sizeof(float));
    CHECK_EQ_INT(m->ops->forward(m, &st->batch, &c->kv, state, logits), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), needle);
    free(logits);
}

static const char *const MF_PROMPTS[] = {"short", "long150"};

/* What one folder measured on one kernel path: the worst row and the worst scenario median. */
typedef struct mf_result {
    double max, median;
} mf_result;

/* Every scenario on one reference folder under `metric`, prefill chunked in each of
 * chunks[0..n_chunks), computed in bf16 (with a bf16 KV cache) or f32; `path` names the kernel path in messages (NULL: the
 * active ISA). The median row of every scenario is checked at the end. *out (when not NULL) gets
 * what was measured. */
static void mf_test_folder_with(const char *folder, const mf_metric *metric, const char *path, bool bf16_compute,
                                cv_threadpool *pool, const int32_t *chunks, int n_chunks, mf_result *out) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    mf_reference refs[2] = {0};
    for (int p = 0; p < 2; p++)
        if (mf_load_reference(dir, MF_PROMPTS[p], &refs[p])) {
            CHECK_MSG(0, "cannot read the %s reference in %s", MF_PROMPTS[p], dir);
            for (int q = 0; q <= p; q++) mf_free_reference(&refs[q]);
            return;
        }
    cv_model_config cfg;
    cv_weight_source *src;
    mf_fixture fx = {.name = folder, .path = path, .metric = metric};
    int rc = mf_load_model_as(dir, bf16_compute, &cfg, &src, pool, &fx.model);
    CHECK_MSG(rc == 0, "loading %s: %s", dir, cv_error_message());
    if (rc == 0) {
        fx.vocab = fx.model->vocab_size;
        CHECK_EQ_INT(fx.vocab, refs[0].vocab);
        CHECK_EQ_INT(fx.model->kv_spec.head_dim, cfg.head_dim);
        fx.logits = cv_xmalloc((size_t)3 * MF_MAX_TOKENS * (size_t)fx.vocab * sizeof(float));
        /* bf16 compute keeps K and V in bf16, as --kv-cache-dtype auto does */
        mf_cache_init_as(&fx.cache, fx.model, bf16_compute ? CV_DTYPE_BF16 : CV_DTYPE_F32);
        for (int p = 0; p < 2; p++) {
            mf_run_chunked(&fx, &refs[p], MF_MAX_TOKENS, 1);
            for (int c = 0; c < n_chunks; c++) mf_run_chunked(&fx, &refs[p], chunks[c], c % MF_STATE_SLOTS);
            mf_run_batched(&fx, &refs[p], &refs[1 - p], &refs[1]);
            mf_run_greedy(&fx, &refs[p]);
            mf_run_state_copy(&fx, &refs[p]);
            mf_run_checkpoints(&fx, &refs[p], &refs[1 - p]);
            mf_run_verify(&fx, &refs[p]);
        }
        mf_run_decode_batch(&fx, &refs[0], &refs[1]);
        mf_result r = {.max = fx.worst};
        printf("%-18s %-6s max %s %.3g:", folder, mf_path(&fx), metric->what, fx.worst);
        for (int i = 0; i < fx.n_scenarios; i++) {
            printf("%s %s %.2g", i ? "," : "", fx.scenario_names[i], fx.scenario_worst[i]);
            if (metric->median_bound < 0) continue;
            double median = mf_scenario_median(&fx, i);
            printf(" (median %.2g)", median);
            CHECK_MSG(median <= metric->median_bound, "%s [%s] %s: median row %s %.3g (bound %.3g)", folder,
                      mf_path(&fx), fx.scenario_names[i], metric->what, median, metric->median_bound);
            if (median > r.median || isnan(median)) r.median = median;
        }
        printf("\n");
        if (out) *out = r;
        if (fx.worst > mf_worst_overall || isnan(fx.worst)) mf_worst_overall = fx.worst;
        for (int i = 0; i < fx.n_scenarios; i++) free(fx.scenario_rows[i]);
        mf_cache_free(&fx.cache);
        free(fx.logits);
        cv_model_free(fx.model);
        cv_weight_source_free(src);
        cv_model_config_free(&cfg);
    }
    for (int p = 0; p < 2; p++) mf_free_reference(&refs[p]);
}

/* mf_test_folder_with for f32 activations on the active ISA. */
static void mf_test_folder(const char *folder, cv_threadpool *pool, const int32_t *chunks, int n_chunks) {
    mf_test_folder_with(folder, &MF_REL_ERROR, NULL, false, pool, chunks, n_chunks, NULL);
}

/* Runs mf_test_folder over `folders` on the AVX-512 and the AVX2 path (those the CPU has). */
__attribute__((unused)) static void mf_test_folders_on_each_isa(const char *test, const char *const *folders,
                                                                int n_folders, cv_threadpool *pool,
                                                                const int32_t *chunks, int n_chunks) {
    static const cv_isa isas[] = {CV_ISA_AVX512, CV_ISA_AVX2};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (cv_isa_force(isas[i])) {
            printf("%s: %s path not supported on this CPU, skipped\n", test, cv_isa_name(isas[i]));
            continue;
        }
        for (int f = 0; f < n_folders; f++) mf_test_folder(folders[f], pool, chunks, n_chunks);
    }
    printf("%s: max rel logit error over all checks %.3g (bound %.0e)\n", test, mf_worst_overall, MF_TOLERANCE);
}

#endif
