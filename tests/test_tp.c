/*
 * test_tp.c — tensor parallelism over OpenMPI, against Hugging Face's f32 logits.
 *
 * Run as an MPI job of N ranks (tests/cmake/executor.cmake starts it with mpirun: 2 ranks, which
 * split the fixtures' 2 KV heads, and 4, which replicate each on 2 ranks): every rank creates a
 * runner over the same checkpoint with tp_size N; rank 0 runs the batches and checks the logits, the
 * others serve it (cv_runner_serve). Each dense and MoE reference folder (f32 and bf16 weights,
 * tied and untied; the model in f32 compute) runs one-shot, in 7-token chunks and as a batch of both
 * prompts with mixed prefill and decode steps, each within the 1e-4 bound the one-process model
 * meets. Failure paths, which every rank must reach together: a model tensor parallelism does not
 * run (the hybrid Qwen3-Next), and a job size that is not tp_size.
 */
#include <mpi.h>
#include <stdlib.h>

#include "executor/runner.h"
#include "model_fixture.h"

static const char *const FOLDERS[] = {"qwen3-dense-f32", "qwen3-dense-bf16", "qwen3-dense-tied-f32",
                                      "qwen3-dense-tied-bf16", "qwen3-moe-f32", "qwen3-moe-bf16"};

typedef struct tp_model {
    cv_model_config cfg;
    cv_weight_source *src;
    cv_runner *runner;
} tp_model;

static int open_model(const char *folder, int tp_size, tp_model *m) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    memset(m, 0, sizeof *m);
    CHECK_EQ_INT(cv_model_config_load(dir, &m->cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &m->src), 0);
    cv_runner_options o = {.config = &m->cfg, .weights = m->src, .num_threads = 1, .max_num_batched_tokens = 256,
                           .tp_size = tp_size};
    return cv_runner_create(&o, &m->runner);
}

static void close_model(tp_model *m) {
    cv_runner_free(m->runner);
    cv_weight_source_free(m->src);
    cv_model_config_free(&m->cfg);
}

/* One sequence's place in the cache: blocks 1.. of a table of its own (block 0 is reserved). */
typedef struct tp_seq {
    const mf_reference *ref;
    int32_t stream[MF_MAX_TOKENS + 8], len, done;
    int32_t table[MF_NUM_BLOCKS];
} tp_seq;

static void seq_init(tp_seq *s, const mf_reference *ref, int32_t first_block) {
    s->ref = ref;
    s->len = mf_full_stream(ref, s->stream);
    s->done = 0;
    for (int32_t i = 0; i < MF_NUM_BLOCKS; i++) s->table[i] = first_block + i;
}

/* One step: n[i] next tokens of seqs[i] (0: not in this step), logits of every row, each checked
 * against the reference. */
static void step(cv_runner *r, tp_seq **seqs, const int32_t *n, int n_seqs, float *logits, const char *what,
                 double *worst) {
    int32_t ids[512], pos[512], seq_start[5], ctx[4], rows[512];
    int64_t slots[512];
    const int32_t *tables[4];
    int32_t t = 0, k = 0;
    tp_seq *in[4];
    for (int i = 0; i < n_seqs; i++) {
        if (!n[i]) continue;
        tp_seq *s = seqs[i];
        seq_start[k] = t;
        for (int32_t j = 0; j < n[i]; j++, t++) {
            const int32_t p = s->done + j;
            ids[t] = s->stream[p], pos[t] = p, rows[t] = t;
            slots[t] = (int64_t)s->table[p / MF_BLOCK_SIZE] * MF_BLOCK_SIZE + p % MF_BLOCK_SIZE;
        }
        ctx[k] = s->done + n[i];
        tables[k] = s->table;
        in[k++] = s;
    }
    seq_start[k] = t;
    cv_batch b = {.n_tokens = t, .token_ids = ids, .positions = pos, .slot_mapping = slots, .n_seqs = k,
                  .seq_start = seq_start, .context_lens = ctx, .block_tables = tables, .n_logits = t,
                  .logit_rows = rows};
    CHECK_MSG(cv_runner_execute(r, &b, NULL, 0, logits) == 0, "%s: %s", what, cv_error_message());
    for (int32_t i = 0; i < k; i++) {
        for (int32_t row = seq_start[i]; row < seq_start[i + 1]; row++) {
            const int32_t p = pos[row];
            const double err = mf_row_error(logits + (int64_t)row * in[i]->ref->vocab, mf_expected_row(in[i]->ref, p),
                                            in[i]->ref->vocab);
            if (!(err <= *worst)) *worst = err;
            CHECK_MSG(err <= MF_TOLERANCE, "%s, %s position %d: relative error %.3g", what, in[i]->ref->name, p, err);
        }
        in[i]->done += n[i];
    }
}

static int job_size(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    return s ? atoi(s) : 1;
}

static void check_folder(const char *folder) {
    const int n = job_size();
    tp_model m;
    CHECK_MSG(open_model(folder, n, &m) == 0, "%s: %s", folder, cv_error_message());
    if (!m.runner) {
        close_model(&m);
        return;
    }
    const cv_runner_info *info = cv_runner_get_info(m.runner);
    const int rank = info->tp_rank;
    CHECK_EQ_INT(info->tp_size, n);
    const int32_t kv = m.cfg.num_key_value_heads; /* this rank's share: a split, or one replicated head */
    CHECK_EQ_INT(info->kv_spec.num_kv_heads, kv % n ? 1 : kv / n);
    CHECK_EQ_INT(cv_runner_alloc_cache(m.runner, 2 * MF_NUM_BLOCKS + 1, MF_BLOCK_SIZE, CV_DTYPE_F32, 0), 0);
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
        seq_init(&s, &refs[i], 1);
        tp_seq *one = &s;
        snprintf(what, sizeof what, "%s one-shot", folder);
        step(m.runner, &one, &s.len, 1, logits, what, &worst);
    }
    for (int i = 0; i < 2; i++) { /* chunks of 7 */
        tp_seq s;
        seq_init(&s, &refs[i], 1);
        tp_seq *one = &s;
        snprintf(what, sizeof what, "%s chunked", folder);
        while (s.done < s.len) {
            int32_t chunk = s.len - s.done < 7 ? s.len - s.done : 7;
            step(m.runner, &one, &chunk, 1, logits, what, &worst);
        }
    }
    /* both prompts in one cache: the short one decodes token by token while the long one prefills */
    tp_seq a, b;
    seq_init(&a, &refs[0], 1);
    seq_init(&b, &refs[1], 1 + MF_NUM_BLOCKS);
    tp_seq *both[] = {&a, &b};
    snprintf(what, sizeof what, "%s batched", folder);
    while (a.done < a.len || b.done < b.len) {
        int32_t counts[2] = {a.done == 0 ? refs[0].n_prompt : (a.done < a.len),
                             b.len - b.done < 40 ? b.len - b.done : 40};
        step(m.runner, both, counts, 2, logits, what, &worst);
    }
    printf("%s: tensor parallel %d, worst relative error %.3g\n", folder, n, worst);
    free(logits);
    mf_free_reference(&refs[0]);
    mf_free_reference(&refs[1]);
    close_model(&m);
}

static void check_refusals(void) {
    tp_model m;
    const int n = job_size();
    CHECK_EQ_INT(open_model("qwen3-next-f32", n, &m), CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cv_error_message(), "Qwen3NextForCausalLM");
    CHECK(m.runner == NULL);
    close_model(&m);
    CHECK_EQ_INT(open_model("qwen3-dense-f32", n + 1, &m), CVLLM_ERR_INVALID_ARGUMENT);
    char want[96];
    snprintf(want, sizeof want, "tensor_parallel_size=%d but the MPI job has %d ranks", n + 1, n);
    CHECK_CONTAINS(cv_error_message(), want);
    close_model(&m);
}

int main(void) {
    for (size_t i = 0; i < CV_ARRAY_LEN(FOLDERS); i++) check_folder(FOLDERS[i]);
    check_refusals();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char name[32];
    snprintf(name, sizeof name, "test_tp rank %d", rank);
    return cv_check_summary(name);
}
