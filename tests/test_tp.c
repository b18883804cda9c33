/*
 * test_tp.c — tensor parallelism over OpenMPI, against Hugging Face's f32 logits.
 *
 * Run as an MPI job of N ranks (tests/cmake/executor.cmake starts it with mpirun: 2 ranks, which
 * split the fixtures' 2 KV heads, and 4, which replicate each on 2 ranks): every rank creates a
 * runner over the same checkpoint with tp_size N; rank 0 runs the batches and checks the logits, the
 * others serve it (cv_runner_serve). Each reference folder — dense (f32 and bf16 weights, tied and
 * untied), MoE, and the hybrids (Qwen3-Next, Qwen3.5-MoE with fused experts, Qwen3.5 dense) — runs
 * in f32 compute one-shot, in 7-token chunks (a hybrid's recurrent state moved to another slot by a
 * state copy halfway) and as a batch of both prompts with mixed prefill and decode steps, each
 * within the 1e-4 bound the one-process model meets; the MoE folders again with expert parallelism
 * (whole experts on each rank). A hybrid's MTP step, which has no reference
 * logits, matches a one-process runner of the same checkpoint on rank 0. Failure paths, which every
 * rank must reach together: a job size that is not tp_size, (4 ranks) linear-attention key heads
 * that do not split over the ranks, and a load that fails on the workers only.
 */
#include <mpi.h>
#include <stdlib.h>

#include "executor/runner.h"
#include "model_fixture.h"

static const char *const FOLDERS[] = {"qwen3-dense-f32",      "qwen3-dense-bf16",  "qwen3-dense-tied-f32",
                                      "qwen3-dense-tied-bf16", "qwen3-moe-f32",     "qwen3-moe-bf16",
                                      "qwen3-next-f32",        "qwen3.5-moe-f32",   "qwen3.5-dense-bf16"};
/* With expert parallelism: per-expert tensors (Qwen3-MoE, Qwen3-Next) and fused ones (Qwen3.5-MoE). */
static const char *const EP_FOLDERS[] = {"qwen3-moe-f32", "qwen3-next-f32", "qwen3.5-moe-f32"};

typedef struct tp_model {
    cv_model_config cfg;
    cv_weight_source *src;
    cv_runner *runner;
} tp_model;

/* A runner with o's parallelism and MTP over the reference folder's checkpoint. */
static int open_model(const char *folder, cv_runner_options o, tp_model *m) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    memset(m, 0, sizeof *m);
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &m->cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &m->src), 0);
    o.config = &m->cfg;
    o.weights = m->src;
    o.num_threads = 1;
    o.max_num_batched_tokens = 256;
    return cv_runner_create(&o, &m->runner);
}

static void close_model(tp_model *m) {
    cv_runner_free(m->runner);
    cv_weight_source_free(m->src);
    cv_model_config_free(&m->cfg);
}

enum { STATE_SLOTS = 3 };

/* One sequence's place in the cache: blocks 1.. of a table of its own (block 0 is reserved), and
 * its recurrent-state slot (hybrids). */
typedef struct tp_seq {
    const mf_reference *ref;
    int32_t stream[MF_MAX_TOKENS + 8], len, done, slot;
    int32_t table[MF_NUM_BLOCKS];
} tp_seq;

static void seq_init(tp_seq *s, const mf_reference *ref, int32_t first_block, int32_t slot) {
    s->ref = ref;
    s->len = mf_full_stream(ref, s->stream);
    s->done = 0;
    s->slot = slot;
    for (int32_t i = 0; i < MF_NUM_BLOCKS; i++) s->table[i] = first_block + i;
}

/* The batch of one step: n[i] next tokens of seqs[i] (0: not in it), logits of every row. */
typedef struct tp_batch {
    int32_t ids[512], pos[512], seq_start[5], ctx[4], rows[512], slots_of[4];
    int64_t slots[512];
    const int32_t *tables[4];
    tp_seq *in[4];
    cv_batch b;
} tp_batch;

static void build(tp_batch *x, tp_seq **seqs, const int32_t *n, int n_seqs, bool state) {
    int32_t t = 0, k = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (!n[i]) continue;
        tp_seq *s = seqs[i];
        x->seq_start[k] = t;
        for (int32_t j = 0; j < n[i]; j++, t++) {
            const int32_t p = s->done + j;
            x->ids[t] = s->stream[p], x->pos[t] = p, x->rows[t] = t;
            x->slots[t] = (int64_t)s->table[p / MF_BLOCK_SIZE] * MF_BLOCK_SIZE + p % MF_BLOCK_SIZE;
        }
        x->ctx[k] = s->done + n[i];
        x->tables[k] = s->table;
        x->slots_of[k] = s->slot;
        x->in[k++] = s;
    }
    x->seq_start[k] = t;
    x->b = (cv_batch){.n_tokens = t, .token_ids = x->ids, .positions = x->pos, .slot_mapping = x->slots, .n_seqs = k,
                      .seq_start = x->seq_start, .context_lens = x->ctx, .block_tables = x->tables,
                      .state_slots = state ? x->slots_of : NULL, .n_logits = t, .logit_rows = x->rows};
}

/* One step: n[i] next tokens of seqs[i] (0: not in this step), logits of every row, each checked
 * against the reference; the state copies run first. */
static void step(cv_runner *r, tp_seq **seqs, const int32_t *n, int n_seqs, const cv_state_copy *copies,
                 int32_t n_copies, float *logits, const char *what, double *worst) {
    static tp_batch x;
    build(&x, seqs, n, n_seqs, cv_runner_get_info(r)->state_bytes_per_seq > 0);
    CHECK_MSG(cv_runner_execute(r, &x.b, copies, n_copies, logits) == 0, "%s: %s", what, cv_error_message());
    for (int32_t i = 0; i < x.b.n_seqs; i++) {
        for (int32_t row = x.seq_start[i]; row < x.seq_start[i + 1]; row++) {
            const int32_t p = x.pos[row];
            const double err = mf_row_error(logits + (int64_t)row * x.in[i]->ref->vocab,
                                            mf_expected_row(x.in[i]->ref, p), x.in[i]->ref->vocab);
            if (!(err <= *worst)) *worst = err;
            CHECK_MSG(err <= MF_TOLERANCE, "%s, %s position %d: relative error %.3g", what, x.in[i]->ref->name, p, err);
        }
        x.in[i]->done += n[i];
    }
}

static int job_size(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    return s ? atoi(s) : 1;
}

static void check_folder(const char *folder, bool ep) {
    const int n = job_size();
    tp_model m;
    CHECK_MSG(open_model(folder, (cv_runner_options){.tp_size = n, .expert_parallel = ep}, &m) == 0, "%s: %s", folder,
              cv_error_message());
    if (!m.runner) {
        close_model(&m);
        return;
    }
    const cv_runner_info *info = cv_runner_get_info(m.runner);
    const int rank = info->tp_rank;
    CHECK_EQ_INT(info->tp_size, n);
    const int32_t kv = m.cfg.num_key_value_heads; /* this rank's share: a split, or one replicated head */
    CHECK_EQ_INT(info->kv_spec.num_kv_heads, kv % n ? 1 : kv / n);
    const bool hybrid = info->state_bytes_per_seq > 0;
    CHECK_EQ_INT(cv_runner_alloc_cache(m.runner, 2 * MF_NUM_BLOCKS + 1, MF_BLOCK_SIZE, CV_DTYPE_F32,
                                       hybrid ? STATE_SLOTS : 0), 0);
    if (rank != 0) {
        CHECK_EQ_INT(cv_runner_serve(m.runner), 0);
        close_model(&m);
        return;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    mf_reference refs[2];
    CHECK_EQ_INT(mf_load_reference(dir, "short", &refs[0]), 0);
    CHECK_EQ_INT(mf_load_reference(dir, "long150", &refs[1]), 0);
    float *logits = malloc(sizeof(float) * 512 * (size_t)refs[0].vocab);
    double worst = 0;
    char what[128];
    for (int i = 0; i < 2; i++) { /* one-shot: the whole stream in one batch */
        tp_seq s;
        seq_init(&s, &refs[i], 1, 0);
        tp_seq *one = &s;
        snprintf(what, sizeof what, "%s one-shot%s", folder, ep ? ", expert parallel" : "");
        step(m.runner, &one, &s.len, 1, NULL, 0, logits, what, &worst);
    }
    for (int i = 0; i < 2; i++) { /* chunks of 7; a hybrid's state moves from slot 0 to 2 halfway */
        tp_seq s;
        seq_init(&s, &refs[i], 1, 0);
        tp_seq *one = &s;
        snprintf(what, sizeof what, "%s chunked%s", folder, ep ? ", expert parallel" : "");
        while (s.done < s.len) {
            int32_t chunk = s.len - s.done < 7 ? s.len - s.done : 7;
            const bool move = hybrid && s.slot == 0 && s.done >= s.len / 2;
            const cv_state_copy copy = {.dst = 2, .src = 0};
            if (move) s.slot = 2;
            step(m.runner, &one, &chunk, 1, move ? &copy : NULL, move, logits, what, &worst);
        }
    }
    /* both prompts in one cache: the short one decodes token by token while the long one prefills */
    tp_seq a, b;
    seq_init(&a, &refs[0], 1, 0);
    seq_init(&b, &refs[1], 1 + MF_NUM_BLOCKS, 1);
    tp_seq *both[] = {&a, &b};
    snprintf(what, sizeof what, "%s batched%s", folder, ep ? ", expert parallel" : "");
    while (a.done < a.len || b.done < b.len) {
        int32_t counts[2] = {a.done == 0 ? refs[0].n_prompt : (a.done < a.len),
                             b.len - b.done < 40 ? b.len - b.done : 40};
        step(m.runner, both, counts, 2, NULL, 0, logits, what, &worst);
    }
    printf("%s: tensor parallel %d%s, worst relative error %.3g\n", folder, n, ep ? " with expert parallelism" : "",
           worst);
    free(logits);
    mf_free_reference(&refs[0]);
    mf_free_reference(&refs[1]);
    close_model(&m);
}

/* The MTP step's logits on r (caches allocated): the main forward over the prompt hands out its
 * hidden states, then MTP row i reads prompt token i+1 with the hidden state of token i. */
static int32_t mtp_logits(cv_runner *r, const mf_reference *ref, float *hidden, float *logits) {
    static tp_batch x;
    tp_seq s;
    seq_init(&s, ref, 1, 0);
    tp_seq *one = &s;
    int32_t n = ref->n_prompt;
    build(&x, &one, &n, 1, true);
    x.b.hidden_out = hidden;
    CHECK_MSG(cv_runner_execute(r, &x.b, NULL, 0, logits) == 0, "main forward: %s", cv_error_message());
    n = ref->n_prompt - 1;
    memmove(s.stream, s.stream + 1, (size_t)n * sizeof *s.stream); /* token i+1 at position i */
    build(&x, &one, &n, 1, false);
    CHECK_MSG(cv_runner_execute_mtp(r, &x.b, hidden, logits) == 0, "MTP step: %s", cv_error_message());
    return n;
}

/* A hybrid's MTP module under tensor parallelism against the same checkpoint in one process. */
static void check_mtp(const char *folder) {
    const int n = job_size();
    tp_model m;
    CHECK_MSG(open_model(folder, (cv_runner_options){.tp_size = n, .load_mtp = true}, &m) == 0, "%s: %s", folder,
              cv_error_message());
    if (!m.runner) {
        close_model(&m);
        return;
    }
    CHECK(cv_runner_get_info(m.runner)->has_mtp);
    CHECK_EQ_INT(cv_runner_alloc_cache(m.runner, MF_NUM_BLOCKS + 1, MF_BLOCK_SIZE, CV_DTYPE_F32, 1), 0);
    if (cv_runner_get_info(m.runner)->tp_rank != 0) {
        CHECK_EQ_INT(cv_runner_serve(m.runner), 0);
        close_model(&m);
        return;
    }
    tp_model one;
    CHECK_MSG(open_model(folder, (cv_runner_options){.tp_size = 1, .load_mtp = true}, &one) == 0,
              "%s in one process: %s", folder, cv_error_message());
    CHECK_EQ_INT(cv_runner_alloc_cache(one.runner, MF_NUM_BLOCKS + 1, MF_BLOCK_SIZE, CV_DTYPE_F32, 1), 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    mf_reference ref;
    CHECK_EQ_INT(mf_load_reference(dir, "long150", &ref), 0);
    const size_t rows = 512, vocab = (size_t)ref.vocab;
    float *hidden = malloc(sizeof(float) * rows * (size_t)m.cfg.hidden_size);
    float *got = malloc(sizeof(float) * rows * vocab), *want = malloc(sizeof(float) * rows * vocab);
    const int32_t t = mtp_logits(m.runner, &ref, hidden, got);
    CHECK_EQ_INT(mtp_logits(one.runner, &ref, hidden, want), t);
    double worst = 0;
    for (int32_t i = 0; i < t; i++) {
        const double err = mf_row_error(got + (size_t)i * vocab, want + (size_t)i * vocab, (int64_t)vocab);
        if (!(err <= worst)) worst = err;
        CHECK_MSG(err <= MF_TOLERANCE, "%s MTP row %d: relative error %.3g against one process", folder, i, err);
    }
    printf("%s: MTP under tensor parallel %d, %d rows, worst relative error %.3g against one process\n", folder, n,
           t, worst);
    free(hidden);
    free(got);
    free(want);
    mf_free_reference(&ref);
    close_model(&one);
    close_model(&m);
}

static int world_rank(void) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

/* A step the group failed: rank 0 holds the error `code` with a message containing `want`, a worker
 * CV_RUNNER_GROUP_FAILED; no runner either way. */
static void expect_group_failure(const tp_model *m, int rc, int code, const char *want) {
    if (world_rank() == 0) {
        CHECK_EQ_INT(rc, code);
        CHECK_CONTAINS(cv_error_message(), want);
    } else {
        CHECK_EQ_INT(rc, CV_RUNNER_GROUP_FAILED);
    }
    CHECK(m->runner == NULL);
}

/* A load that fails on some ranks only (the workers' weights are another model's): rank 0 returns
 * the first failing rank's error and reason, for its caller to report once; a worker returns
 * CV_RUNNER_GROUP_FAILED and says nothing. */
static void check_worker_failure(void) {
    const int n = job_size(), rank = world_rank();
    char dir[512], other[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-dense-f32", CVLLM_TEST_DATA);
    snprintf(other, sizeof other, "%s/vectors/qwen3-moe-f32", CVLLM_TEST_DATA);
    tp_model m = {0};
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &m.cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(rank ? other : dir, &m.src), 0);
    const cv_runner_options o = {.config = &m.cfg, .weights = m.src, .num_threads = 1, .max_num_batched_tokens = 256,
                                 .tp_size = n};
    const int rc = cv_runner_create(&o, &m.runner);
    char want[96];
    snprintf(want, sizeof want, "tensor-parallel rank 1 of %d failed to load the model: missing tensor", n);
    expect_group_failure(&m, rc, CVLLM_ERR_NOT_FOUND, want);
    close_model(&m);
}

static void check_refusals(void) {
    tp_model m;
    const int n = job_size();
    CHECK_EQ_INT(open_model("qwen3-dense-f32", (cv_runner_options){.tp_size = n + 1}, &m), CVLLM_ERR_INVALID_ARGUMENT);
    char want[96];
    snprintf(want, sizeof want, "tensor_parallel_size=%d but the MPI job has %d ranks", n + 1, n);
    CHECK_CONTAINS(cv_error_message(), want);
    CHECK(m.runner == NULL);
    close_model(&m);
    if (n > 1) check_worker_failure();
}

/* Folders whose linear-attention key heads (2 in every hybrid fixture) do not split over n ranks
 * are refused on every rank: rank 0 with the error naming the field, the workers with
 * CV_RUNNER_GROUP_FAILED. */
static bool splits(const char *folder, int n) {
    if (n <= 2 || (!strstr(folder, "next") && !strstr(folder, "3.5"))) return true;
    tp_model m;
    const int rc = open_model(folder, (cv_runner_options){.tp_size = n}, &m);
    char want[96];
    snprintf(want, sizeof want, "linear_num_key_heads=2 does not split over tensor_parallel_size=%d", n);
    expect_group_failure(&m, rc, CVLLM_ERR_UNSUPPORTED, want);
    close_model(&m);
    return false;
}

int main(void) {
    for (size_t i = 0; i < CV_ARRAY_LEN(FOLDERS); i++)
        if (splits(FOLDERS[i], job_size())) check_folder(FOLDERS[i], false);
    for (size_t i = 0; i < CV_ARRAY_LEN(EP_FOLDERS); i++)
        if (splits(EP_FOLDERS[i], job_size())) check_folder(EP_FOLDERS[i], true);
    if (splits("qwen3.5-moe-f32", job_size())) check_mtp("qwen3.5-moe-f32");
    check_refusals();
    char name[32];
    snprintf(name, sizeof name, "test_tp rank %d", world_rank());
    return cv_check_summary(name);
}
