/*
 * test_bf16_ref.c — the bf16 compute mode (--dtype bfloat16, the default for bf16 checkpoints)
 * against Hugging Face's f32 logits, within what Hugging Face's own bf16 run gets.
 *
 * In bf16 compute the inputs of every GEMM on bf16 weights are rounded to bf16, and so are the query
 * and the softmax numerators of attention's two tile products over the bf16 KV cache (where the CPU
 * has a bf16 dot product that is faster than f32 FMA; elsewhere they stay f32), while accumulation,
 * norms, the softmax itself, RoPE, the router, the Gated DeltaNet state and the residual stream stay
 * f32. The bound
 * per folder is Hugging Face's model code run end to end in torch.bfloat16 against its f32
 * reference (max |Δ log-prob| over the reference's top-5 ids: every row, and the median row of
 * each scenario); an engine that rounds only the GEMM inputs must be no worse. Greedy ids are
 * checked where the reference margin exceeds twice the row bound.
 *
 * Every scenario of model_fixture.h (one-shot, chunks of 1/7/64, batched mixed prefill/decode, a
 * decode batch, teacher-forced greedy decode, and the hybrid models' state copy, checkpoints and
 * verify calls) on each bf16 reference folder and on Qwen's block-wise FP8 one (whose GEMMs read
 * bf16 inputs too where vdpbf16ps runs them, avx512/panels_fp8_dot.c): with the bf16 dot-product
 * kernels where the CPU has them — AMX tile products, and AVX512-BF16 vdpbf16ps with AMX switched
 * off — and with them switched off (bf16 compute on f32 GEMM inputs, what a CPU without them runs).
 * Batch invariance in bf16 compute: chunked, batched and token-by-token rows are held to the same
 * bound as one-shot ones, and a sequence's prefill and decode rows must be the same bits alone and
 * in forward calls shared with another sequence (test_batch_invariance).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/formats.h"
#include "model_fixture.h"

/* Hugging Face's bf16 run against the f32 reference, per folder: worst row / median row. The FP8
 * folder (weight-only: its reference runs f32 activations on the dequantized weights) has no bf16
 * run of its own; it is qwen3-dense-bf16's architecture and shape, so it is held to that bound. */
static const struct {
    const char *folder;
    double max, median;
} BOUNDS[] = {
    {"qwen3-dense-bf16", 5.2e-3, 2.1e-3},  {"qwen3-dense-tied-bf16", 5.4e-3, 2.4e-3},
    {"qwen3-moe-bf16", 2.0e-2, 2.1e-3},    {"qwen3.5-moe-bf16", 1.6e-2, 3.9e-3},
    {"qwen3-next-bf16", 2.3e-2, 3.7e-3},   {"qwen3.5-dense-bf16", 8.8e-3, 3.4e-3},
    {"qwen3-dense-fp8", 5.2e-3, 2.1e-3},
};
enum { N_FOLDERS = CV_ARRAY_LEN(BOUNDS) };
static const int32_t CHUNKS[] = {1, 7, 64};

static mf_metric folder_metric(int f) {
    return (mf_metric){"top-5 |Δ log-prob|", mf_top_logprob_error, BOUNDS[f].max, BOUNDS[f].median, 2 * BOUNDS[f].max};
}

/* Batch invariance in bf16 compute: a sequence's logits are the same bits whether its steps run
 * alone or in forward calls shared with other sequences (one accumulation order per output element
 * whatever the batch shape): an 11-token prefill and then a decode step, alone, and again each
 * next to another sequence's prefill or decode. */
static void test_batch_invariance(cv_threadpool *pool, const char *folder) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    if (mf_load_model_as(dir, true, &cfg, &src, pool, &m)) {
        CHECK_MSG(0, "loading %s: %s", dir, cv_error_message());
        return;
    }
    static const int32_t ids[] = {11, 302, 7, 4000, 95, 1, 2048, 33, 17, 600, 3, 42};
    static const int32_t other_ids[] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
    enum { N = CV_ARRAY_LEN(ids) };
    const size_t V = (size_t)m->vocab_size, row = V * sizeof(float);
    float *alone = cv_xmalloc(3 * MF_MAX_TOKENS * row), *shared = cv_xmalloc(3 * MF_MAX_TOKENS * row);
    mf_cache c;
    mf_cache_init_as(&c, m, CV_DTYPE_BF16);
    cv_state_cache *state = c.state.num_slots ? &c.state : NULL;
    mf_step st;
    /* alone: the prefill's rows at [0, N-1), the decode's at [N-1] */
    mf_sequence a = {.tokens = ids, .n_total = N, .state_slot = 0};
    mf_step_begin(&st);
    mf_step_add(&st, &c, &a, N - 1);
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, state, alone), 0);
    mf_step_begin(&st);
    mf_step_add(&st, &c, &a, 1);
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, state, alone + (N - 1) * V), 0);
    /* shared: the other sequence first in each call, so this one's rows come after its rows */
    mf_sequence b = {.tokens = ids, .n_total = N, .state_slot = 1};
    mf_sequence o = {.tokens = other_ids, .n_total = CV_ARRAY_LEN(other_ids), .state_slot = 2};
    mf_step_begin(&st);
    mf_step_add(&st, &c, &o, 16);
    mf_step_add(&st, &c, &b, N - 1);
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, state, shared), 0);
    CHECK_MSG(memcmp(alone, shared + 16 * V, (N - 1) * row) == 0,
              "%s: a prefill's logits change when another sequence shares its forward call (bf16 compute)", folder);
    mf_step_begin(&st);
    mf_step_add(&st, &c, &o, 1);
    mf_step_add(&st, &c, &b, 1);
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, state, shared), 0);
    CHECK_MSG(memcmp(alone + (N - 1) * V, shared + V, row) == 0,
              "%s: a decode step's logits change when it is batched with another sequence (bf16 compute)", folder);
    mf_cache_free(&c);
    free(alone);
    free(shared);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    /* The start-up choice is timed; the test switches the kernels on wherever the CPU has them, so
     * what it covers does not depend on how busy the machine was when it measured. */
    const bool dot = cv_isa_active() == CV_ISA_AVX512 && cv_cpu_bf16_dot_enable(true) == 0;
    if (!dot) printf("test_bf16_ref: the bf16 dot-product path is not tested here (%s): bf16 compute runs on f32 "
                     "GEMM inputs\n", cv_isa_active() == CV_ISA_AVX512 ? cv_error_message() : "not on AVX-512");
    const bool amx = dot && cv_cpu_amx_enable(true) == 0;
    if (dot && !amx) printf("test_bf16_ref: the AMX path is not tested here (%s)\n", cv_error_message());
    /* AMX tile products; vdpbf16ps (AMX off); f32 FMA on f32 inputs (both off) */
    static const char *const PATHS[] = {"amx", "bf16 dot", "f32 FMA"};
    const bool has[] = {amx, dot, true};
    enum { N_PATHS = CV_ARRAY_LEN(PATHS) };
    mf_result results[N_FOLDERS][N_PATHS];
    for (int p = 0; p < N_PATHS; p++) {
        if (!has[p]) continue;
        if (amx) CHECK_EQ_INT(cv_cpu_amx_enable(p == 0), 0);
        if (dot) CHECK_EQ_INT(cv_cpu_bf16_dot_enable(p < 2), 0);
        for (int f = 0; f < N_FOLDERS; f++) {
            const mf_metric metric = folder_metric(f);
            results[f][p] = (mf_result){NAN, NAN};
            mf_test_folder_with(BOUNDS[f].folder, &metric, PATHS[p], true, pool, CHUNKS, (int)CV_ARRAY_LEN(CHUNKS),
                                &results[f][p]);
            test_batch_invariance(pool, BOUNDS[f].folder);
        }
    }
    if (amx) CHECK_EQ_INT(cv_cpu_amx_enable(true), 0);
    if (dot) CHECK_EQ_INT(cv_cpu_bf16_dot_enable(true), 0);
    printf("test_bf16_ref: max |Δ log-prob| over the reference's top-5 ids, worst row / worst scenario median\n");
    for (int f = 0; f < N_FOLDERS; f++) {
        printf("  %-24s", BOUNDS[f].folder);
        for (int p = 0; p < N_PATHS; p++)
            if (has[p]) printf("  %s %8.2g / %-8.2g", PATHS[p], results[f][p].max, results[f][p].median);
        printf("  HF bf16 %8.2g / %-8.2g\n", BOUNDS[f].max, BOUNDS[f].median);
    }
    cv_threadpool_free(pool);
    return cv_check_summary("test_bf16_ref");
}
