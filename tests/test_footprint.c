/*
 * test_footprint.c — the memory arithmetic the engine does before it allocates anything.
 *
 * For every reference checkpoint in tests/data/vectors (dense, MoE, Qwen3-Next, Qwen3.5 dense and
 * MoE): the weight bytes estimated from config.json equal the bytes of the checkpoint's text-model
 * tensors, with and without the MTP module; the KV bytes per token (of an f32 and of a bf16 KV
 * cache) and the recurrent-state bytes equal those of the model the registry loads. The quantized
 * ones (msModelSlim W8A8 and W8A8_DYNAMIC, FP8) count as loaded: their bytes with every scale at
 * f32. Then the fit check at its boundary, through the public API, for an f32 and a bf16 KV cache:
 * a KV budget of exactly one max_model_len request (plus the state slots of a hybrid) is accepted,
 * one byte less is refused with vLLM's message and the estimated maximum length. Last the
 * tutorials' W8A8 checkpoints: the estimate of their shipped descriptions (and of the 4-layer
 * Qwen3.6 shape under the same recipe) against the shapes of the linears each description
 * quantizes, and the engine's refusal of the full-size ones quoting those numbers.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "check.h"
#include "cvllm.h"
#include "models/footprint.h"
#include "engine/state_pool.h"
#include "loader/config.h"
#include "loader/quant.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/model.h"
#include "testutil.h"

typedef struct fixture_sizes {
    uint64_t text_bytes, mtp_bytes; /* checkpoint tensors: the text model without mtp.*, and mtp.* */
    cv_dtype dtype;
} fixture_sizes;

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* A quantized linear's scale, offset or bias tensor, which loads as 4 bytes an element. */
static bool is_quant_side_tensor(const char *name) {
    static const char *const suffixes[] = {".deq_scale", ".input_scale", ".input_offset", ".weight_scale",
                                           ".weight_offset", ".weight_scale_inv"};
    for (size_t i = 0; i < CV_ARRAY_LEN(suffixes); i++)
        if (ends_with(name, suffixes[i])) return true;
    return false;
}

static fixture_sizes checkpoint_sizes(const char *dir, const cv_quant_config *q) {
    fixture_sizes z = {.dtype = CV_DTYPE_COUNT};
    cv_checkpoint *ck = NULL;
    int rc = cv_quant_config_method(q) == CV_QUANT_ASCEND ? cv_checkpoint_open_prefix(dir, "quant_model_weight", &ck)
                                                          : cv_checkpoint_open(dir, &ck);
    CHECK_EQ_INT(rc, 0);
    for (size_t i = 0; ck && i < cv_checkpoint_count(ck); i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        const bool side = is_quant_side_tensor(t->name);
        const bool is_float = t->dtype == CV_DTYPE_F32 || t->dtype == CV_DTYPE_BF16 || t->dtype == CV_DTYPE_F16;
        if (!side && is_float) z.dtype = t->dtype;
        if (starts_with(t->name, "model.visual.")) continue; /* the vision tower is never loaded */
        const uint64_t bytes = side ? (uint64_t)cv_tensor_numel(t) * sizeof(float) : t->nbytes;
        if (starts_with(t->name, "mtp.")) z.mtp_bytes += bytes;
        else z.text_bytes += bytes;
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

/* K and V of every KV layer of the loaded model, in a cache of `kv`. */
static uint64_t model_kv_bytes_per_token(const cv_model *m, cv_dtype kv) {
    return (uint64_t)m->kv_spec.num_layers * 2 * (uint64_t)m->kv_spec.num_kv_heads * (uint64_t)m->kv_spec.head_dim *
           cv_dtype_size(kv);
}

static void check_fixture(const char *name, cv_threadpool *pool) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, name);
    cv_model_config cfg;
    CHECK_MSG(cv_model_config_load(dir, NULL, &cfg) == 0, "%s: %s", name, cvllm_last_error());
    cv_quant_config *q = NULL;
    CHECK_MSG(cv_quant_config_load(dir, NULL, &q) == 0, "%s: %s", name, cvllm_last_error());
    fixture_sizes z = checkpoint_sizes(dir, q);
    for (int mtp = 0; mtp <= 1; mtp++) {
        cv_footprint_params p = {.weight_dtype = z.dtype, .quant = q, .with_mtp = mtp, .max_num_batched_tokens = 16,
                                 .max_num_seqs = 2};
        cv_footprint fp;
        CHECK_MSG(cv_model_footprint(&cfg, &p, &fp), "%s: architecture %s unknown", name, cfg.architecture);
        uint64_t want = z.text_bytes + (mtp ? z.mtp_bytes : 0);
        CHECK_MSG(fp.weight_bytes == want, "%s (mtp %d): estimated %llu weight bytes, the checkpoint has %llu", name, mtp,
                  (unsigned long long)fp.weight_bytes, (unsigned long long)want);
        CHECK_MSG(fp.activation_bytes >= 2 * (uint64_t)cfg.vocab_size * sizeof(float), "%s: activations leave out the logits",
                  name);
        if (q) continue; /* KV and state as the float fixtures of the same architectures */
        cv_weight_source *w = NULL;
        CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &w), 0);
        cv_model *m = w ? load_model(&cfg, w, pool, mtp) : NULL;
        for (int bf16 = 0; m && bf16 <= 1; bf16++) {
            p.kv_dtype = bf16 ? CV_DTYPE_BF16 : CV_DTYPE_F32;
            CHECK(cv_model_footprint(&cfg, &p, &fp));
            CHECK_MSG(fp.kv_bytes_per_token == model_kv_bytes_per_token(m, p.kv_dtype),
                      "%s (mtp %d): %s KV %llu bytes/token, model %llu", name, mtp, cv_dtype_name(p.kv_dtype),
                      (unsigned long long)fp.kv_bytes_per_token,
                      (unsigned long long)model_kv_bytes_per_token(m, p.kv_dtype));
        }
        if (m) {
            CHECK_MSG(fp.state_bytes_per_seq == m->state_bytes_per_seq, "%s: state %llu bytes/sequence, model %zu", name,
                      (unsigned long long)fp.state_bytes_per_seq, m->state_bytes_per_seq);
        }
        cv_model_free(m);
        cv_weight_source_free(w);
    }
    cv_quant_config_free(q);
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
    CHECK_MSG(n >= 15, "only %d reference checkpoints found", n); /* dense, MoE and hybrid, f32, bf16, quantized */
    cv_threadpool_free(pool);
}

/* ---- the fit check at its boundary --------------------------------------------------------------- */

#define MAX_MODEL_LEN 64
#define MAX_NUM_SEQS 2

static int create_with_budget(const char *dir, uint64_t kv_bytes, cv_dtype kv) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.kv_cache_dtype = kv == CV_DTYPE_BF16 ? "bfloat16" : "float32";
    o.max_model_len = MAX_MODEL_LEN;
    o.max_num_seqs = MAX_NUM_SEQS;
    o.max_num_batched_tokens = 64;
    o.kv_cache_memory_bytes = kv_bytes;
    cvllm_engine *e = NULL;
    int rc = cvllm_engine_create(&o, &e);
    cvllm_engine_destroy(e);
    return rc;
}

/* KV bytes per token (in a cache of `kv`) and state bytes per sequence of the fixture, from the model
 * the registry loads. */
static void model_sizes(const char *vector, cv_dtype kv, uint64_t *kv_per_token, size_t *state_per_seq) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, vector);
    cv_model_config cfg;
    cv_weight_source *w = NULL;
    cv_threadpool *pool = cv_threadpool_create(1);
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &w), 0);
    cv_model *m = load_model(&cfg, w, pool, false);
    *kv_per_token = m ? model_kv_bytes_per_token(m, kv) : 0;
    *state_per_seq = m ? m->state_bytes_per_seq : 0;
    cv_model_free(m);
    cv_weight_source_free(w);
    cv_threadpool_free(pool);
    cv_model_config_free(&cfg);
    free(dir);
}

static void check_boundary(const char *vector, cv_dtype kv) {
    uint64_t kv_per_token;
    size_t state;
    model_sizes(vector, kv, &kv_per_token, &state);
    const uint64_t blocks = (MAX_MODEL_LEN + 15) / 16; /* the default 16-token blocks */
    const uint64_t need = blocks * 16 * kv_per_token + (state ? cv_state_pool_bytes(state, MAX_NUM_SEQS, 0, 0) : 0);
    char *dir = tu_model_dir(vector);
    CHECK_MSG(create_with_budget(dir, need, kv) == CVLLM_OK, "%s, %s KV with %llu bytes: %s", vector, cv_dtype_name(kv),
              (unsigned long long)need, cvllm_last_error());
    CHECK_EQ_INT(create_with_budget(dir, need - 1, kv), CVLLM_ERR_CAPACITY);
    char want[160];
    snprintf(want, sizeof want, "To serve at least one request with the models's max seq len (%d), (", MAX_MODEL_LEN);
    CHECK_CONTAINS(cvllm_last_error(), want);
    /* One byte short of the last block: the estimate is the blocks that do fit. */
    snprintf(want, sizeof want, "the estimated maximum model length is %llu.", (unsigned long long)(blocks - 1) * 16);
    CHECK_CONTAINS(cvllm_last_error(), want);
    tu_remove_tree(dir);
    free(dir);
}

/* ---- the tutorials' W8A8 checkpoints ---------------------------------------------------------------- */

/* The shape of a linear weight by its name, from config.json (the attention and MLP projections). */
static bool linear_shape(const cv_model_config *cfg, const char *name, int64_t *rows, int64_t *cols) {
    const int64_t H = cfg->hidden_size, q = (int64_t)cfg->num_attention_heads * cfg->head_dim;
    const int64_t kv = (int64_t)cfg->num_key_value_heads * cfg->head_dim;
    const bool gated = json_is_true(json_object_get(cfg->text, "attn_output_gate"));
    const char *inter_key = strstr(name, ".experts.")        ? "moe_intermediate_size"
                            : strstr(name, ".shared_expert.") ? "shared_expert_intermediate_size"
                                                              : "intermediate_size";
    const int64_t inter = json_integer_value(json_object_get(cfg->text, inter_key));
    const struct {
        const char *suffix;
        int64_t rows, cols;
    } table[] = {{".q_proj.weight", gated ? 2 * q : q, H}, {".k_proj.weight", kv, H},      {".v_proj.weight", kv, H},
                 {".o_proj.weight", H, q},                 {".gate_proj.weight", inter, H}, {".up_proj.weight", inter, H},
                 {".down_proj.weight", H, inter}};
    for (size_t i = 0; i < CV_ARRAY_LEN(table); i++)
        if (ends_with(name, table[i].suffix)) {
            *rows = table[i].rows;
            *cols = table[i].cols;
            return true;
        }
    return false;
}

/* The estimate of the W8A8 folder `dir` (its text model): the bf16 estimate, less for every linear
 * its description quantizes 2 bytes a weight, plus 1 a weight and its f32/int32 side tensors per row
 * (W8A8: deq_scale and quant_bias, and the two activation scalars; W8A8_DYNAMIC: weight_scale and
 * weight_offset). Returns the estimate. */
static uint64_t check_w8a8_estimate(const char *dir) {
    cv_model_config cfg;
    cv_quant_config *q = NULL;
    CHECK_MSG(cv_model_config_load(dir, NULL, &cfg) == 0, "%s: %s", dir, cvllm_last_error());
    CHECK_MSG(cv_quant_config_load(dir, "ascend", &q) == 0 && q, "%s: %s", dir, cvllm_last_error());
    cv_footprint_params p = {.weight_dtype = CV_DTYPE_BF16, .max_num_batched_tokens = 16, .max_num_seqs = 1};
    cv_footprint bf16, w8a8;
    CHECK(cv_model_footprint(&cfg, &p, &bf16));
    p.quant = q;
    CHECK(cv_model_footprint(&cfg, &p, &w8a8));
    char *path = tu_strdupf("%s/%s", dir, "quant_model_description.json");
    json_t *desc = json_load_file(path, 0, NULL);
    CHECK(desc != NULL);
    uint64_t want = bf16.weight_bytes;
    int quantized = 0;
    const char *key;
    json_t *v;
    json_object_foreach(desc, key, v) {
        const char *type = json_string_value(v);
        if (!type || !ends_with(key, ".weight") || !strcmp(type, "FLOAT") || starts_with(key, "mtp.")) continue;
        int64_t r = 0, c = 0;
        CHECK_MSG(linear_shape(&cfg, key, &r, &c), "%s: no shape for %s", dir, key);
        const uint64_t side = !strcmp(type, "W8A8") ? (uint64_t)r * 8 + 8 : (uint64_t)r * 8;
        want = want - 2 * (uint64_t)(r * c) + (uint64_t)(r * c) + side;
        quantized++;
    }
    CHECK_MSG(quantized > 0 && w8a8.weight_bytes == want, "%s: %d quantized linears, estimate %llu, want %llu", dir,
              quantized, (unsigned long long)w8a8.weight_bytes, (unsigned long long)want);
    json_decref(desc);
    free(path);
    cv_quant_config_free(q);
    cv_model_config_free(&cfg);
    return w8a8.weight_bytes;
}

/* The dummy run of a full-size W8A8 id is refused before any weight, quoting its W8A8 bytes. */
static void check_refused(const char *dir, uint64_t weight_bytes) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.load_format = "dummy";
    o.quantization = "ascend";
    o.gpu_memory_utilization = 0.001;
    cvllm_engine *e = NULL;
    CHECK_EQ_INT(cvllm_engine_create(&o, &e), CVLLM_ERR_NO_MEMORY);
    cvllm_engine_destroy(e);
    char want[64];
    snprintf(want, sizeof want, "takes %.2f GiB of weights", (double)weight_bytes / (1 << 30));
    CHECK_CONTAINS(cvllm_last_error(), want);
}

static void test_tutorial_checkpoints(void) {
    const char *qwen36 = CVLLM_SOURCE_DIR "/models/Eco-Tech/Qwen3.6-35B-A3B-w8a8";
    const char *qwen3 = CVLLM_SOURCE_DIR "/models/vllm-ascend/Qwen3-32B-W8A8";
    check_refused(qwen36, check_w8a8_estimate(qwen36));
    check_refused(qwen3, check_w8a8_estimate(qwen3));
    /* The 4-layer Qwen3.6 shape under the shipped recipe: what the 35B checkpoint's layers cost. */
    char *tmp = tu_make_temp_dir();
    tu_link(CVLLM_SOURCE_DIR "/bench/configs/qwen3.6-35b-a3b-4layers/config.json", tmp, "config.json");
    char *cmd = tu_strdupf("python3 " CVLLM_SOURCE_DIR "/tools/gen_quant_description.py qwen3_5-moe-w8a8 %s/config.json "
                           "%s/quant_model_description.json",
                           tmp, tmp);
    CHECK_EQ_INT(system(cmd), 0);
    check_w8a8_estimate(tmp);
    free(cmd);
    tu_remove_tree(tmp);
    free(tmp);
}

int main(void) {
    test_every_fixture();
    test_tutorial_checkpoints();
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        const cv_dtype kv = bf16 ? CV_DTYPE_BF16 : CV_DTYPE_F32;
        check_boundary("qwen3-dense-f32", kv);
        check_boundary("qwen3-moe-bf16", kv);
        check_boundary("qwen3.5-moe-f32", kv); /* hybrid: the state slots of max_num_seqs come first */
    }
    return cv_check_summary("test_footprint");
}
