/*
 * test_footprint.c — the memory arithmetic the engine does before it allocates anything.
 *
 * For every reference checkpoint in tests/data/vectors (dense, MoE, Qwen3-Next, Qwen3.5 dense and
 * MoE): the weight bytes estimated from config.json equal the bytes of the checkpoint's text-model
 * tensors, with and without the MTP module; the KV bytes per token and the recurrent-state bytes
 * equal those of the model the registry loads. Then the fit check at its boundary, through the public
 * API: a KV budget of exactly one max_model_len request (plus the state slots of a hybrid) is
 * accepted, one byte less is refused with vLLM's message and the estimated maximum length.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "check.h"
#include "cvllm.h"
#include "models/footprint.h"
#include "engine/state_pool.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/model.h"
#include "testutil.h"

typedef struct fixture_sizes {
    uint64_t text_bytes, mtp_bytes; /* checkpoint tensors: the text model without mtp.*, and mtp.* */
    cv_dtype dtype;
} fixture_sizes;

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static fixture_sizes checkpoint_sizes(const char *dir) {
    fixture_sizes z = {0};
    cv_checkpoint *ck = NULL;
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    for (size_t i = 0; ck && i < cv_checkpoint_count(ck); i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        z.dtype = t->dtype;
        if (starts_with(t->name, "model.visual.")) continue; /* the vision tower is never loaded */
        if (starts_with(t->name, "mtp.")) z.mtp_bytes += t->nbytes;
        else z.text_bytes += t->nbytes;
    }
    cv_checkpoint_close(ck);
    return z;
}

/* The model as the registry loads it from the checkpoint (with its MTP module when asked). */
static cv_model *load_model(const cv_model_config *cfg, cv_weight_source *w, cv_threadpool *pool, bool mtp) {
    cv_model_load_params p = {.config = cfg, .weights = w, .pool = pool, .max_num_batched_tokens = 16, .load_mtp = mtp};
    cv_model *m = NULL;
    CHECK_MSG(cv_model_load(&p, &m) == 0, "%s: %s", cfg->architecture, cvllm_last_error());
    return m;
}

static uint64_t model_kv_bytes_per_token(const cv_model *m) {
    return (uint64_t)m->kv_spec.num_layers * 2 * (uint64_t)m->kv_spec.num_kv_heads * (uint64_t)m->kv_spec.head_dim *
           sizeof(float);
}

static void check_fixture(const char *name, cv_threadpool *pool) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, name);
    cv_model_config cfg;
    CHECK_MSG(cv_model_config_load(dir, &cfg) == 0, "%s: %s", name, cvllm_last_error());
    fixture_sizes z = checkpoint_sizes(dir);
    for (int mtp = 0; mtp <= 1; mtp++) {
        cv_footprint_params p = {.weight_dtype = z.dtype, .with_mtp = mtp, .max_num_batched_tokens = 16, .max_num_seqs = 2};
        cv_footprint fp;
        CHECK_MSG(cv_model_footprint(&cfg, &p, &fp), "%s: architecture %s unknown", name, cfg.architecture);
        uint64_t want = z.text_bytes + (mtp ? z.mtp_bytes : 0);
        CHECK_MSG(fp.weight_bytes == want, "%s (mtp %d): estimated %llu weight bytes, the checkpoint has %llu", name, mtp,
                  (unsigned long long)fp.weight_bytes, (unsigned long long)want);
        CHECK_MSG(fp.activation_bytes >= 2 * (uint64_t)cfg.vocab_size * sizeof(float), "%s: activations leave out the logits",
                  name);
        cv_weight_source *w = NULL;
        CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &w), 0);
        cv_model *m = w ? load_model(&cfg, w, pool, mtp) : NULL;
        if (m) {
            CHECK_MSG(fp.kv_bytes_per_token == model_kv_bytes_per_token(m), "%s (mtp %d): KV %llu bytes/token, model %llu",
                      name, mtp, (unsigned long long)fp.kv_bytes_per_token,
                      (unsigned long long)model_kv_bytes_per_token(m));
            CHECK_MSG(fp.state_bytes_per_seq == m->state_bytes_per_seq, "%s: state %llu bytes/sequence, model %zu", name,
                      (unsigned long long)fp.state_bytes_per_seq, m->state_bytes_per_seq);
        }
        cv_model_free(m);
        cv_weight_source_free(w);
    }
    cv_model_config_free(&cfg);
    free(dir);
}

static void test_every_fixture(void) {
    cv_threadpool *pool = cv_threadpool_create(1);
    DIR *d = opendir(CVLLM_TEST_DATA "/vectors");
    CHECK(d != NULL);
    int n = 0;
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        check_fixture(ent->d_name, pool);
        n++;
    }
    if (d) closedir(d);
    CHECK_MSG(n >= 10, "only %d reference checkpoints found", n); /* dense, MoE and hybrid, f32 and bf16 */
    cv_threadpool_free(pool);
}

/* ---- the fit check at its boundary --------------------------------------------------------------- */

#define MAX_MODEL_LEN 64
#define MAX_NUM_SEQS 2

static int create_with_budget(const char *dir, uint64_t kv_bytes) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.max_model_len = MAX_MODEL_LEN;
    o.max_num_seqs = MAX_NUM_SEQS;
    o.max_num_batched_tokens = 64;
    o.kv_cache_memory_bytes = kv_bytes;
    cvllm_engine *e = NULL;
    int rc = cvllm_engine_create(&o, &e);
    cvllm_engine_destroy(e);
    return rc;
}

/* KV bytes per token and state bytes per sequence of the fixture, from the model the registry loads. */
static void model_sizes(const char *vector, uint64_t *kv_per_token, size_t *state_per_seq) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, vector);
    cv_model_config cfg;
    cv_weight_source *w = NULL;
    cv_threadpool *pool = cv_threadpool_create(1);
    CHECK_EQ_INT(cv_model_config_load(dir, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &w), 0);
    cv_model *m = load_model(&cfg, w, pool, false);
    *kv_per_token = m ? model_kv_bytes_per_token(m) : 0;
    *state_per_seq = m ? m->state_bytes_per_seq : 0;
    cv_model_free(m);
    cv_weight_source_free(w);
    cv_threadpool_free(pool);
    cv_model_config_free(&cfg);
    free(dir);
}

static void check_boundary(const char *vector) {
    uint64_t kv_per_token;
    size_t state;
    model_sizes(vector, &kv_per_token, &state);
    const uint64_t blocks = (MAX_MODEL_LEN + 15) / 16; /* the default 16-token blocks */
    const uint64_t need = blocks * 16 * kv_per_token + (state ? cv_state_pool_bytes(state, MAX_NUM_SEQS, 0, 0) : 0);
    char *dir = tu_model_dir(vector);
    CHECK_MSG(create_with_budget(dir, need) == CVLLM_OK, "%s with %llu bytes: %s", vector, (unsigned long long)need,
              cvllm_last_error());
    CHECK_EQ_INT(create_with_budget(dir, need - 1), CVLLM_ERR_CAPACITY);
    char want[160];
    snprintf(want, sizeof want, "To serve at least one request with the models's max seq len (%d), (", MAX_MODEL_LEN);
    CHECK_CONTAINS(cvllm_last_error(), want);
    /* One byte short of the last block: the estimate is the blocks that do fit. */
    snprintf(want, sizeof want, "the estimated maximum model length is %llu.", (unsigned long long)(blocks - 1) * 16);
    CHECK_CONTAINS(cvllm_last_error(), want);
    tu_remove_tree(dir);
    free(dir);
}

int main(void) {
    test_every_fixture();
    check_boundary("qwen3-dense-f32");
    check_boundary("qwen3-moe-bf16");
    check_boundary("qwen3.5-moe-f32"); /* hybrid: the state slots of max_num_seqs come first */
    return cv_check_summary("test_footprint");
}
