/*
 * test_qwen3_ref.c — Qwen3ForCausalLM against Hugging Face's f32 logits.
 *
 * Every scenario of model_fixture.h (one-shot, chunked in 1/7/64-token pieces, batched with other
 * sequences in mixed prefill/decode steps, greedy with teacher-forced logits) on each dense
 * reference checkpoint in tests/data/vectors (untied/tied × f32/bf16 weights), once on the AVX-512
 * path and once on the AVX2 path.
 * Failure paths: unknown architecture, a config that disagrees with the checkpoint, missing
 * lm_head, and batches with bad ids, slots, positions (repeated, or increasing with a gap), block ids
 * and logit rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_fixture.h"

static const char *const FOLDERS[] = {"qwen3-dense-f32", "qwen3-dense-bf16", "qwen3-dense-tied-f32",
                                      "qwen3-dense-tied-bf16"};
static const int32_t CHUNKS[] = {1, 7, 64};

/* ---- failure paths -------------------------------------------------------------------------- */

static void test_load_errors(cv_threadpool *pool) {
    char dir[512], tied_dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-dense-f32", CVLLM_TEST_DATA);
    snprintf(tied_dir, sizeof tied_dir, "%s/vectors/qwen3-dense-tied-bf16", CVLLM_TEST_DATA);
    CHECK_CONTAINS(cv_model_supported_architectures(), "Qwen3ForCausalLM");

    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m = (cv_model *)&cfg; /* must be reset to NULL on failure */
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
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
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_BF16, 7, &src), 0);
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 0};
    CHECK_EQ_INT(cv_model_load(&p, &m), 0);
    /* per layer q,k,v,o (4·64·... ) + MLP, plus lm_head; bf16 = 2 bytes */
    const size_t H = 64, hd = 32, I = 128, V = 4096;
    size_t layer = (4 * hd * H + 2 * 2 * hd * H + H * 4 * hd + 3 * I * H) * 2;
    CHECK_EQ_INT(m->weight_bytes, 2 * layer + V * H * 2);

    /* max_num_batched_tokens 0: scratch grows on the first call. */
    mf_cache c;
    mf_cache_init(&c, m);
    static const int32_t ids[] = {1, 2, 3};
    mf_sequence s = {.tokens = ids, .n_total = 3};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &s, 3);
    mf_expect_finite(m, &c, &st);
    mf_cache_free(&c);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

static void test_bad_batches(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-dense-bf16", CVLLM_TEST_DATA);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    if (mf_load_model(dir, &cfg, &src, pool, &m)) {
        CHECK_MSG(0, "loading %s: %s", dir, cv_error_message());
        return;
    }
    mf_cache c;
    mf_cache_init(&c, m);
    static const int32_t ids[] = {1, 2, 3, 4};
    mf_sequence s = {.tokens = ids, .n_total = 4};
    mf_step st;
#define FRESH_STEP()           \
    do {                       \
        s.done = 0;            \
        mf_step_begin(&st);    \
        mf_step_add(&st, &c, &s, 4); \
    } while (0)
    FRESH_STEP();
    st.token_ids[2] = 4096;
    mf_expect_forward_error(m, &c, &st, NULL, "outside the vocabulary");
    FRESH_STEP();
    st.token_ids[0] = -1;
    mf_expect_forward_error(m, &c, &st, NULL, "outside the vocabulary");
    FRESH_STEP();
    st.slots[1] += 1;
    mf_expect_forward_error(m, &c, &st, NULL, "block table says");
    FRESH_STEP();
    st.positions[3] = 4; /* beyond context_lens = 4 */
    mf_expect_forward_error(m, &c, &st, NULL, "outside its context");
    FRESH_STEP();
    st.positions[1] = 0;
    st.slots[1] = st.slots[0];
    mf_expect_forward_error(m, &c, &st, NULL, "not consecutive");
    FRESH_STEP();
    st.positions[2] = 3; /* increasing, but position 2's K/V would never be written */
    st.slots[2] = st.slots[3];
    mf_expect_forward_error(m, &c, &st, NULL, "not consecutive");
    FRESH_STEP();
    s.block_table[0] = MF_NUM_BLOCKS;
    mf_expect_forward_error(m, &c, &st, NULL, "outside [0, 48)");
    s.block_table[0] = 1;
    FRESH_STEP();
    st.logit_rows[0] = 4;
    mf_expect_forward_error(m, &c, &st, NULL, "logit row 4");
    FRESH_STEP();
    st.seq_start[1] = 3;
    mf_expect_forward_error(m, &c, &st, NULL, "seq_start");
#undef FRESH_STEP
    mf_cache_free(&c);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    test_load_errors(pool);
    test_dummy_weights(pool);
    test_bad_batches(pool);
    mf_test_folders_on_each_isa("test_qwen3_ref", FOLDERS, (int)CV_ARRAY_LEN(FOLDERS), pool, CHUNKS,
                                (int)CV_ARRAY_LEN(CHUNKS));
    cv_threadpool_free(pool);
    return cv_check_summary("test_qwen3_ref");
}
