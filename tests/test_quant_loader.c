/*
 * test_quant_loader.c — quantized checkpoints (loader/quant.h): which scheme each linear uses, its
 * tensors, and everything refused.
 *
 * The reference checkpoints in tests/data/vectors (msModelSlim W8A8 static with fp32 deq_scale,
 * the float16 model's int64 deq_scale in two shards with an index, W8A8_DYNAMIC, the Qwen3.5-MoE
 * recipe with per-expert tensors, Qwen's block-wise FP8 with partial blocks) bind linear by linear:
 * every scheme as the description or quantization_config says, every tensor compared with the
 * file's bytes read here without the loader. msModelSlim's other file names are the same files
 * linked under those names in a scratch folder. Each malformed case is one edit — of the
 * description, of config.json, or of one tensor in a rewritten safetensors file — and must fail
 * with one line naming the tensor or field. Dummy weights of a quantized folder come in the
 * folder's format, with the dummy's magnitude.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "check.h"
#include "loader/quant.h"
#include "loader/safetensors.h"
#include "testutil.h"

static char *tmp;

static char *vector_dir(const char *name) { return tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, name); }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static json_t *load_json(const char *dir, const char *file) {
    char *path = tu_strdupf("%s/%s", dir, file);
    json_t *j = json_load_file(path, 0, NULL);
    CHECK_MSG(j != NULL, "%s", path);
    free(path);
    return j;
}

static void save_json(const char *dir, const char *file, const json_t *j) {
    char *path = tu_strdupf("%s/%s", dir, file);
    CHECK(json_dump_file(j, path, JSON_INDENT(1)) == 0);
    free(path);
}

/* A fresh scratch folder tmp/NAME. */
static char *scratch(const char *name) {
    char *dir = tu_strdupf("%s/%s", tmp, name);
    tu_remove_tree(dir);
    CHECK(mkdir(dir, 0755) == 0);
    return dir;
}

/* Links the files of vector `from` (NULL-ended list of "target=link name" or plain names). */
static void link_files(const char *from, const char *dir, const char *const *files) {
    char *src = vector_dir(from);
    for (; *files; files++) {
        const char *eq = strchr(*files, '=');
        char *target_name = eq ? strndup(*files, (size_t)(eq - *files)) : strdup(*files);
        char *target = tu_strdupf("%s/%s", src, target_name);
        tu_link(target, dir, eq ? eq + 1 : *files);
        free(target);
        free(target_name);
    }
    free(src);
}

/* The message of a failure is one line. */
static void check_one_line(const char *what) {
    const char *msg = cvllm_last_error();
    CHECK_MSG(msg && *msg && !strchr(msg, '\n'), "%s: \"%s\" is not one line", what, msg ? msg : "(null)");
}

/* rc must be `want` with a message containing each of the NULL-ended needles. */
static void check_error(int rc, int want, const char *what, const char *const *needles) {
    CHECK_MSG(rc == want, "%s: rc %d, want %d (%s)", what, rc, want, cvllm_last_error());
    for (; *needles; needles++) CHECK_CONTAINS(cvllm_last_error(), *needles);
    check_one_line(what);
}
#define EXPECT_ERROR(rc, want, what, ...) check_error((rc), (want), (what), (const char *const[]){__VA_ARGS__, NULL})

/* The file's own value of element i of a scale tensor, read without the loader. */
static float stored_f32(const cv_tensor *t, int64_t i) {
    switch (t->dtype) {
    case CV_DTYPE_F32: return ((const float *)t->data)[i];
    case CV_DTYPE_BF16: return cv_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case CV_DTYPE_F16: return cv_f16_to_f32(((const uint16_t *)t->data)[i]);
    case CV_DTYPE_I64: { /* the fp32 bit pattern, sign-extended */
        int64_t v = ((const int64_t *)t->data)[i];
        CHECK_MSG(v == (int64_t)(int32_t)v, "%s[%lld] is not a sign-extended int32", t->name, (long long)i);
        uint32_t bits = (uint32_t)v;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    default: CHECK_MSG(0, "%s: dtype %s is no scale", t->name, cv_dtype_name(t->dtype)); return NAN;
    }
}

static const cv_tensor *stored(const cv_checkpoint *ck, const char *prefix, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    const cv_tensor *t = cv_checkpoint_find(ck, name);
    CHECK_MSG(t != NULL, "the fixture lacks %s", name);
    return t;
}

static bool same_bytes(const cv_tensor *a, const cv_tensor *b) {
    return a->nbytes == b->nbytes && a->dtype == b->dtype && !memcmp(a->data, b->data, a->nbytes);
}

static void check_scales(const float *got, const cv_tensor *want, int64_t n, const char *what) {
    CHECK_MSG(got != NULL && cv_tensor_numel(want) == n, "%s", what);
    for (int64_t i = 0; got && i < n; i++)
        if (got[i] != stored_f32(want, i)) {
            CHECK_MSG(0, "%s[%lld] = %g, the file holds %g", what, (long long)i, got[i], stored_f32(want, i));
            return;
        }
}

/* ---- the reference checkpoints ------------------------------------------------------------------- */

/* The raw tensors of vector `name`, opened without a weight source. */
static cv_checkpoint *open_raw(const char *dir, bool msmodelslim) {
    cv_checkpoint *ck = NULL;
    int rc = msmodelslim ? cv_checkpoint_open_prefix(dir, "quant_model_weight", &ck) : cv_checkpoint_open(dir, &ck);
    CHECK_MSG(rc == 0, "%s: %s", dir, cvllm_last_error());
    return ck;
}

static int32_t config_int(json_t *cfg, const char *key) {
    json_t *text = json_object_get(cfg, "text_config");
    json_t *v = json_object_get(text ? text : cfg, key);
    CHECK_MSG(json_is_integer(v), "config.json: %s", key);
    return (int32_t)json_integer_value(v);
}

/* The quantized linears a recipe leaves in the fixture: every attention and MLP linear of the dense
 * models; q, k, v of the full-attention layers and every routed expert's three of the MoE recipe. */
static int expected_quantized_linears(json_t *cfg) {
    const int layers = config_int(cfg, "num_hidden_layers");
    json_t *text = json_object_get(cfg, "text_config");
    if (!text) return 7 * layers;
    json_t *types = json_object_get(text, "layer_types");
    int full = 0;
    for (int l = 0; l < layers; l++) full += !strcmp(json_string_value(json_array_get(types, (size_t)l)), "full_attention");
    return 3 * full + 3 * layers * config_int(cfg, "num_experts");
}

static cv_linear_scheme scheme_of(const char *type) {
    if (!strcmp(type, "W8A8")) return CV_SCHEME_W8A8;
    if (!strcmp(type, "W8A8_DYNAMIC")) return CV_SCHEME_W8A8_DYNAMIC;
    CHECK_STR_EQ(type, "FLOAT");
    return CV_SCHEME_FLOAT;
}

/* One linear of an msModelSlim fixture, bound and compared with the file. */
static void check_ascend_linear(cv_weight_source *src, const cv_checkpoint *raw, const char *prefix, const cv_tensor *w,
                                const char *type) {
    cv_linear_scheme s;
    CHECK_MSG(cv_weights_linear_scheme(src, prefix, &s) == 0 && s == scheme_of(type), "%s: scheme %s", prefix,
              cv_linear_scheme_name(s));
    cv_qlinear q;
    int rc = cv_weights_get_qlinear(src, prefix, w->shape[0], w->shape[1], "test", &q);
    CHECK_MSG(rc == 0, "%s: %s", prefix, cvllm_last_error());
    if (rc) return;
    CHECK_MSG(q.scheme == s && same_bytes(&q.weight, w), "%s: weight", prefix);
    CHECK(q.weight.ndim == 2 && q.weight.shape[0] == w->shape[0] && q.weight.shape[1] == w->shape[1]);
    CHECK(q.block == 0 && q.block_scale == NULL);
    const int64_t rows = w->shape[0];
    if (s == CV_SCHEME_FLOAT) {
        CHECK(q.row_scale == NULL && q.row_bias == NULL);
    } else if (s == CV_SCHEME_W8A8) {
        check_scales(q.row_scale, stored(raw, prefix, "deq_scale"), rows, prefix);
        const cv_tensor *bias = stored(raw, prefix, "quant_bias");
        CHECK_MSG(q.row_bias && !memcmp(q.row_bias, bias->data, bias->nbytes), "%s: quant_bias", prefix);
        CHECK(q.input_scale == stored_f32(stored(raw, prefix, "input_scale"), 0));
        CHECK(q.input_offset == stored_f32(stored(raw, prefix, "input_offset"), 0));
    } else {
        check_scales(q.row_scale, stored(raw, prefix, "weight_scale"), rows, prefix);
        CHECK(q.row_bias == NULL);
    }
}

static void check_ascend_vector(const char *name, cv_dtype deq_dtype) {
    char *dir = vector_dir(name);
    cv_weight_source *src = NULL;
    int rc = cv_weight_source_checkpoint(dir, &src);
    CHECK_MSG(rc == 0, "%s: %s", name, cvllm_last_error());
    cv_checkpoint *raw = open_raw(dir, true);
    json_t *desc = load_json(dir, "quant_model_description.json"), *cfg = load_json(dir, "config.json");
    if (!src || !raw || !desc || !cfg) goto out;
    CHECK_EQ_INT(cv_weight_source_quant_method(src), CV_QUANT_ASCEND);
    int quantized = 0, float_linears = 0;
    const char *key;
    json_t *v;
    json_object_foreach(desc, key, v) {
        const cv_tensor *w = cv_checkpoint_find(raw, key);
        if (!ends_with(key, ".weight") || !w || w->ndim != 2) continue;
        char *prefix = strndup(key, strlen(key) - strlen(".weight"));
        check_ascend_linear(src, raw, prefix, w, json_string_value(v));
        if (scheme_of(json_string_value(v)) == CV_SCHEME_W8A8)
            CHECK_MSG(stored(raw, prefix, "deq_scale")->dtype == deq_dtype, "%s: deq_scale dtype", prefix);
        if (scheme_of(json_string_value(v)) == CV_SCHEME_FLOAT) float_linears++;
        else quantized++;
        free(prefix);
    }
    CHECK_MSG(quantized == expected_quantized_linears(cfg), "%s: %d quantized linears bound, the recipe has %d", name,
              quantized, expected_quantized_linears(cfg));
    CHECK_MSG(float_linears > 0, "%s: no FLOAT linear (lm_head at least)", name);
out:
    json_decref(desc);
    json_decref(cfg);
    cv_checkpoint_close(raw);
    cv_weight_source_free(src);
    free(dir);
}

static void test_ascend_vectors(void) {
    check_ascend_vector("qwen3-dense-w8a8", CV_DTYPE_F32);
    check_ascend_vector("qwen3-dense-w8a8-fp16", CV_DTYPE_I64);
    check_ascend_vector("qwen3-dense-w8a8-dynamic", CV_DTYPE_F32);
    check_ascend_vector("qwen3.5-moe-w8a8-dynamic", CV_DTYPE_F32);
}

static bool in_list(json_t *list, const char *s) {
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        if (!strcmp(json_string_value(v), s)) return true;
    }
    return false;
}

static void test_fp8_vector(void) {
    char *dir = vector_dir("qwen3-dense-fp8");
    cv_weight_source *src = NULL;
    CHECK_MSG(cv_weight_source_checkpoint(dir, &src) == 0, "%s", cvllm_last_error());
    cv_checkpoint *raw = open_raw(dir, false);
    json_t *cfg = load_json(dir, "config.json");
    json_t *qc = json_object_get(cfg, "quantization_config"), *skip = json_object_get(qc, "modules_to_not_convert");
    const int64_t block = json_integer_value(json_array_get(json_object_get(qc, "weight_block_size"), 0));
    int fp8 = 0, partial = 0, skipped = 0;
    for (size_t i = 0; src && raw && i < cv_checkpoint_count(raw); i++) {
        const cv_tensor *w = cv_checkpoint_tensor(raw, i);
        if (!ends_with(w->name, ".weight") || w->ndim != 2) continue;
        char *prefix = strndup(w->name, strlen(w->name) - strlen(".weight"));
        cv_qlinear q;
        int rc = cv_weights_get_qlinear(src, prefix, w->shape[0], w->shape[1], "test", &q);
        CHECK_MSG(rc == 0, "%s: %s", prefix, cvllm_last_error());
        const bool listed = in_list(skip, prefix);
        CHECK_MSG(q.scheme == (listed ? CV_SCHEME_FLOAT : CV_SCHEME_FP8_BLOCK), "%s: %s", prefix,
                  cv_linear_scheme_name(q.scheme));
        CHECK_MSG(rc || same_bytes(&q.weight, w), "%s: weight", prefix);
        if (!rc && !listed) {
            fp8++;
            CHECK(w->dtype == CV_DTYPE_F8_E4M3 && q.block == block && !q.row_scale && !q.row_bias);
            const cv_tensor *s = stored(raw, prefix, "weight_scale_inv");
            const int64_t br = (w->shape[0] + block - 1) / block, bc = (w->shape[1] + block - 1) / block;
            CHECK(s->shape[0] == br && s->shape[1] == bc);
            check_scales(q.block_scale, s, br * bc, prefix);
            partial += w->shape[0] % block || w->shape[1] % block;
        }
        skipped += listed;
        free(prefix);
    }
    CHECK_MSG(fp8 == 7 * config_int(cfg, "num_hidden_layers"), "%d FP8 linears", fp8);
    CHECK_MSG(partial > 0 && skipped == 2, "%d linears with partial blocks, %d not converted (lm_head, embed_tokens)",
              partial, skipped);
    CHECK_EQ_INT(cv_weight_source_quant_method(src), CV_QUANT_FP8);
    /* A listed name covers the modules under it, at dot boundaries only. */
    json_array_append_new(skip, json_string("model.layers.1"));
    char *parent = scratch("fp8-parent");
    save_json(parent, "config.json", cfg);
    cv_quant_config *qcfg = NULL;
    CHECK(cv_quant_config_load(parent, NULL, &qcfg) == 0 && qcfg);
    cv_linear_scheme s;
    CHECK(cv_quant_config_scheme(qcfg, "model.layers.1.mlp.up_proj", &s) == 0 && s == CV_SCHEME_FLOAT);
    CHECK(cv_quant_config_scheme(qcfg, "model.layers.10.mlp.up_proj", &s) == 0 && s == CV_SCHEME_FP8_BLOCK);
    CHECK(cv_quant_config_scheme(qcfg, "model.layers.0.mlp.up_proj", &s) == 0 && s == CV_SCHEME_FP8_BLOCK);
    cv_quant_config_free(qcfg);
    free(parent);
    json_decref(cfg);
    cv_checkpoint_close(raw);
    cv_weight_source_free(src);
    free(dir);
}

/* ---- msModelSlim's file names --------------------------------------------------------------------- */

/* Opens a weight source on dir and binds one W8A8 linear of the qwen3-dense-w8a8 layout. */
static int open_and_bind(const char *dir, const char *prefix, int64_t rows, int64_t cols) {
    cv_weight_source *src = NULL;
    int rc = cv_weight_source_checkpoint(dir, &src);
    cv_qlinear q;
    if (!rc) rc = cv_weights_get_qlinear(src, prefix, rows, cols, "test", &q);
    if (!rc) CHECK(q.scheme != CV_SCHEME_FLOAT && q.weight.dtype == CV_DTYPE_I8);
    cv_weight_source_free(src);
    return rc;
}

static void test_file_names(void) {
    const char *q = "model.layers.1.self_attn.q_proj";
    /* msModelSlim's V1 saver: one shard named as one of one, no index. */
    char *dir = scratch("v1-one-shard");
    link_files("qwen3-dense-w8a8", dir,
               (const char *const[]){"config.json", "quant_model_description.json",
                                     "quant_model_weights.safetensors=quant_model_weights-00001-of-00001.safetensors",
                                     NULL});
    CHECK_MSG(open_and_bind(dir, q, 128, 64) == 0, "%s", cvllm_last_error());
    free(dir);
    /* The older saver: quant_model_weight_w8a8.safetensors and quant_model_description_w8a8.json. */
    dir = scratch("v0-names");
    link_files("qwen3-dense-w8a8", dir,
               (const char *const[]){"config.json", "quant_model_description.json=quant_model_description_w8a8.json",
                                     "quant_model_weights.safetensors=quant_model_weight_w8a8.safetensors", NULL});
    CHECK_MSG(open_and_bind(dir, q, 128, 64) == 0, "%s", cvllm_last_error());
    free(dir);
    /* Shards without their index: every quant_model_weights* file. */
    dir = scratch("shards-no-index");
    link_files("qwen3-dense-w8a8-fp16", dir,
               (const char *const[]){"config.json", "quant_model_description.json",
                                     "quant_model_weights-00001-of-00002.safetensors",
                                     "quant_model_weights-00002-of-00002.safetensors", NULL});
    CHECK_MSG(open_and_bind(dir, q, 128, 64) == 0, "%s", cvllm_last_error());
    /* ... and with a second index of another name. */
    link_files("qwen3-dense-w8a8-fp16", dir,
               (const char *const[]){"quant_model_weights.safetensors.index.json",
                                     "quant_model_weights.safetensors.index.json=quant_model_weights_copy.safetensors.index.json",
                                     NULL});
    EXPECT_ERROR(open_and_bind(dir, q, 128, 64), CVLLM_ERR_FORMAT, "two indexes", "two indexes",
                 "quant_model_weights.safetensors.index.json", "quant_model_weights_copy.safetensors.index.json");
    free(dir);
    /* Two descriptions: vLLM's "Found multiple config files". */
    dir = scratch("two-descriptions");
    link_files("qwen3-dense-w8a8", dir,
               (const char *const[]){"config.json", "quant_model_description.json",
                                     "quant_model_description.json=quant_model_description_w8a8.json",
                                     "quant_model_weights.safetensors", NULL});
    EXPECT_ERROR(open_and_bind(dir, q, 128, 64), CVLLM_ERR_INVALID_ARGUMENT, "two descriptions",
                 "Found multiple config files for ascend", "quant_model_description_w8a8.json");
    free(dir);
    /* A quantization_config without quant_method beside the description: vllm-ascend's marker. */
    dir = scratch("ascend-marker");
    link_files("qwen3-dense-w8a8", dir,
               (const char *const[]){"quant_model_description.json", "quant_model_weights.safetensors", NULL});
    char *src_dir = vector_dir("qwen3-dense-w8a8");
    json_t *cfg = load_json(src_dir, "config.json");
    json_object_set_new(cfg, "quantization_config", json_pack("{s:s}", "format", "ascend"));
    save_json(dir, "config.json", cfg);
    CHECK_MSG(open_and_bind(dir, q, 128, 64) == 0, "%s", cvllm_last_error());
    json_decref(cfg);
    free(src_dir);
    free(dir);
    /* A description without weights, beside an unquantized model.safetensors (which is not read). */
    dir = scratch("no-quant-weights");
    link_files("qwen3-dense-w8a8", dir, (const char *const[]){"config.json", "quant_model_description.json", NULL});
    link_files("qwen3-dense-bf16", dir, (const char *const[]){"model.safetensors", NULL});
    EXPECT_ERROR(open_and_bind(dir, q, 128, 64), CVLLM_ERR_NOT_FOUND, "no weights", "no quant_model_weight*.safetensors",
                 dir);
    free(dir);
}

/* ---- the choice of method and --quantization ----------------------------------------------------- */

/* Runs cv_quant_config_load on dir with stderr captured into *log (cv_xmalloc'd). */
static int load_logged(const char *dir, const char *flag, cv_quant_config **q, char **log) {
    char *path = tu_strdupf("%s/%s", tmp, "stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w");
    dup2(fileno(f), 2);
    int rc = cv_quant_config_load(dir, flag, q);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    *log = tu_read_text(path);
    free(path);
    return rc;
}

static void test_selection(void) {
    char *w8a8 = vector_dir("qwen3-dense-w8a8"), *fp8 = vector_dir("qwen3-dense-fp8"), *plain = vector_dir("qwen3-dense-bf16");
    cv_quant_config *q = NULL;
    char *log = NULL;
    /* Detected with a log line; the same with the flag, silently. */
    CHECK(load_logged(w8a8, NULL, &q, &log) == 0 && cv_quant_config_method(q) == CV_QUANT_ASCEND);
    CHECK_CONTAINS(log, "quant_model_description.json found: loading an msModelSlim W8A8 checkpoint (as --quantization ascend)");
    free(log);
    cv_quant_config_free(q);
    CHECK(load_logged(w8a8, "ascend", &q, &log) == 0 && cv_quant_config_method(q) == CV_QUANT_ASCEND);
    CHECK_MSG(!strstr(log, "msModelSlim"), "%s", log);
    free(log);
    cv_quant_config_free(q);
    /* FP8 from config.json alone, or named. */
    CHECK(cv_quant_config_load(fp8, NULL, &q) == 0 && cv_quant_config_method(q) == CV_QUANT_FP8 &&
          cv_quant_config_block(q) == 128);
    cv_quant_config_free(q);
    CHECK(cv_quant_config_load(fp8, "fp8", &q) == 0 && cv_quant_config_method(q) == CV_QUANT_FP8);
    cv_quant_config_free(q);
    /* Unquantized: no config at all. */
    CHECK(cv_quant_config_load(plain, NULL, &q) == 0 && q == NULL && cv_quant_config_method(q) == CV_QUANT_NONE);
    /* Mismatches. */
    EXPECT_ERROR(cv_quant_config_load(w8a8, "fp8", &q), CVLLM_ERR_INVALID_ARGUMENT, "fp8 on msModelSlim",
                 "--quantization fp8 does not match", "msModelSlim", "use --quantization ascend");
    CHECK(q == NULL);
    EXPECT_ERROR(cv_quant_config_load(w8a8, "awq", &q), CVLLM_ERR_INVALID_ARGUMENT, "awq on msModelSlim",
                 "--quantization awq does not match");
    EXPECT_ERROR(cv_quant_config_load(fp8, "ascend", &q), CVLLM_ERR_INVALID_ARGUMENT, "ascend on fp8",
                 "Quantization method specified in the model config (fp8) does not match the quantization method "
                 "specified in the `quantization` argument (ascend).");
    EXPECT_ERROR(cv_quant_config_load(plain, "ascend", &q), CVLLM_ERR_INVALID_ARGUMENT, "ascend on bf16",
                 "Cannot find the config file for ascend");
    CHECK_STR_EQ(cvllm_last_error(), "Cannot find the config file for ascend");
    EXPECT_ERROR(cv_quant_config_load(plain, "fp8", &q), CVLLM_ERR_UNSUPPORTED, "fp8 on bf16",
                 "--quantization fp8 on an unquantized checkpoint", "online quantization", "cvllm does not do");
    EXPECT_ERROR(cv_quant_config_load(plain, "gptq", &q), CVLLM_ERR_UNSUPPORTED, "gptq on bf16",
                 "--quantization gptq is not supported by cvllm");
    /* Other methods in config.json, with or without the flag. */
    json_t *cfg = load_json(plain, "config.json");
    json_object_set_new(cfg, "quantization_config", json_pack("{s:s, s:i}", "quant_method", "awq", "bits", 4));
    char *dir = scratch("awq");
    save_json(dir, "config.json", cfg);
    EXPECT_ERROR(cv_quant_config_load(dir, NULL, &q), CVLLM_ERR_UNSUPPORTED, "awq config",
                 "quantization method 'awq' is not supported by cvllm", "config.json");
    EXPECT_ERROR(cv_quant_config_load(dir, "awq", &q), CVLLM_ERR_UNSUPPORTED, "awq config and flag", "'awq'");
    EXPECT_ERROR(cv_quant_config_load(dir, "fp8", &q), CVLLM_ERR_INVALID_ARGUMENT, "awq config, fp8 flag",
                 "model config (awq) does not match", "argument (fp8)");
    json_decref(cfg);
    free(dir);
    free(w8a8);
    free(fp8);
    free(plain);
}

/* ---- the description and quantization_config, edited ---------------------------------------------- */

typedef void (*json_edit)(json_t *j);

/* A folder with the weights and config of vector `from` and its description (or config.json,
 * `file`) edited; returns the folder. */
static char *edited_folder(const char *from, const char *name, const char *file, json_edit edit) {
    char *src = vector_dir(from), *dir = scratch(name);
    const bool desc = !strcmp(file, "quant_model_description.json");
    if (desc) link_files(from, dir, (const char *const[]){"config.json", "quant_model_weights.safetensors", NULL});
    else link_files(from, dir, (const char *const[]){"model.safetensors", NULL});
    json_t *j = load_json(src, file);
    edit(j);
    save_json(dir, file, j);
    json_decref(j);
    free(src);
    return dir;
}

static void set_w4a8(json_t *d) { json_object_set_new(d, "model.layers.1.mlp.down_proj.weight", json_string("W4A8_DYNAMIC")); }
static void set_w8a16(json_t *d) { json_object_set_new(d, "model.layers.0.self_attn.v_proj.weight", json_string("W8A16")); }
static void set_not_string(json_t *d) { json_object_set_new(d, "model.layers.0.self_attn.v_proj.weight", json_integer(8)); }
static void set_quarot_optional(json_t *d) {
    json_object_set_new(d, "optional", json_pack("{s:{s:{s:s}}}", "quarot", "rotation_map", "global_rotation",
                                                 "optional/quarot.safetensors"));
}
static void set_quarot_metadata(json_t *d) { json_object_set_new(d, "metadata", json_pack("{s:b}", "quarot", 1)); }
static void set_kv_cache(json_t *d) { json_object_set_new(d, "kv_cache_type", json_string("C8")); }
static void set_fa_quant(json_t *d) { json_object_set_new(d, "fa_quant_type", json_string("FAQuant")); }
static void set_group_size(json_t *d) { json_object_set_new(d, "group_size", json_integer(128)); }
static void drop_q_entry(json_t *d) { json_object_del(d, "model.layers.0.self_attn.q_proj.weight"); }
static void quantize_lm_head(json_t *d) { json_object_set_new(d, "lm_head.weight", json_string("W8A8")); }

static json_t *fp8_config(json_t *cfg) { return json_object_get(cfg, "quantization_config"); }
static void set_e5m2(json_t *c) { json_object_set_new(fp8_config(c), "fmt", json_string("e5m2")); }
static void drop_block(json_t *c) { json_object_del(fp8_config(c), "weight_block_size"); }
static void set_block_rect(json_t *c) { json_object_set_new(fp8_config(c), "weight_block_size", json_pack("[i,i]", 128, 64)); }
static void set_block_one(json_t *c) { json_object_set_new(fp8_config(c), "weight_block_size", json_pack("[i]", 128)); }
static void set_static(json_t *c) { json_object_set_new(fp8_config(c), "activation_scheme", json_string("static")); }
static void set_skip_string(json_t *c) { json_object_set_new(fp8_config(c), "modules_to_not_convert", json_string("lm_head")); }
static void drop_method(json_t *c) { json_object_del(fp8_config(c), "quant_method"); }
static void skip_q_proj(json_t *c) {
    json_array_append_new(json_object_get(fp8_config(c), "modules_to_not_convert"),
                          json_string("model.layers.0.self_attn.q_proj"));
}
static void convert_lm_head(json_t *c) {
    json_t *skip = json_object_get(fp8_config(c), "modules_to_not_convert");
    size_t i;
    json_t *v;
    json_array_foreach(skip, i, v) {
        if (!strcmp(json_string_value(v), "lm_head")) break;
    }
    json_array_remove(skip, i);
}

static int open_source(const char *dir, cv_weight_source **src) {
    *src = NULL;
    return cv_weight_source_checkpoint(dir, src);
}

/* Opening the folder fails as wanted. */
static void expect_open_error(const char *from, const char *file, json_edit edit, int want, const char *const *needles) {
    static int n;
    char name[32];
    snprintf(name, sizeof name, "edit-%d", n++);
    char *dir = edited_folder(from, name, file, edit);
    cv_weight_source *src;
    check_error(open_source(dir, &src), want, name, needles);
    cv_weight_source_free(src);
    free(dir);
}
#define EXPECT_OPEN_ERROR(from, file, edit, want, ...) \
    expect_open_error((from), (file), (edit), (want), (const char *const[]){__VA_ARGS__, NULL})

static void test_description_refusals(void) {
    const char *w = "qwen3-dense-w8a8", *d = "quant_model_description.json";
    EXPECT_OPEN_ERROR(w, d, set_w4a8, CVLLM_ERR_UNSUPPORTED, "model.layers.1.mlp.down_proj.weight is W4A8_DYNAMIC",
                      "a scheme cvllm does not run");
    EXPECT_OPEN_ERROR(w, d, set_w8a16, CVLLM_ERR_UNSUPPORTED, "model.layers.0.self_attn.v_proj.weight is W8A16");
    EXPECT_OPEN_ERROR(w, d, set_not_string, CVLLM_ERR_FORMAT, "the entry of tensor model.layers.0.self_attn.v_proj.weight");
    EXPECT_OPEN_ERROR(w, d, set_quarot_optional, CVLLM_ERR_UNSUPPORTED, "QuaRot rotations (optional.quarot)");
    EXPECT_OPEN_ERROR(w, d, set_quarot_metadata, CVLLM_ERR_UNSUPPORTED, "QuaRot rotations (metadata.quarot)");
    EXPECT_OPEN_ERROR(w, d, set_kv_cache, CVLLM_ERR_UNSUPPORTED, "kv_cache_type \"C8\"", "quantized KV cache");
    EXPECT_OPEN_ERROR(w, d, set_fa_quant, CVLLM_ERR_UNSUPPORTED, "fa_quant_type \"FAQuant\"");
    EXPECT_OPEN_ERROR(w, d, set_group_size, CVLLM_ERR_UNSUPPORTED, "group_size 128 (per-group weights)");
    const char *c = "config.json", *f = "qwen3-dense-fp8";
    EXPECT_OPEN_ERROR(f, c, set_e5m2, CVLLM_ERR_UNSUPPORTED, "quantization_config.fmt \"e5m2\"");
    EXPECT_OPEN_ERROR(f, c, drop_block, CVLLM_ERR_UNSUPPORTED, "no weight_block_size", "per-tensor FP8");
    EXPECT_OPEN_ERROR(f, c, set_block_rect, CVLLM_ERR_UNSUPPORTED, "weight_block_size [128, 64]");
    EXPECT_OPEN_ERROR(f, c, set_block_one, CVLLM_ERR_FORMAT, "weight_block_size is not a pair");
    EXPECT_OPEN_ERROR(f, c, set_static, CVLLM_ERR_UNSUPPORTED, "activation_scheme \"static\"");
    EXPECT_OPEN_ERROR(f, c, set_skip_string, CVLLM_ERR_FORMAT, "modules_to_not_convert is not a list");
    EXPECT_OPEN_ERROR(f, c, drop_method, CVLLM_ERR_FORMAT, "quantization_config has no quant_method");

    /* Both declarations in one folder. */
    char *dir = edited_folder(f, "both", c, skip_q_proj);
    link_files(w, dir, (const char *const[]){d, NULL});
    cv_weight_source *src;
    EXPECT_ERROR(open_source(dir, &src), CVLLM_ERR_FORMAT, "both", "declares two quantizations");
    free(dir);

    /* Accepted at open, refused when the linear binds. */
    cv_qlinear q;
    cv_linear_scheme s;
    cv_tensor t;
    dir = edited_folder(w, "no-entry", d, drop_q_entry);
    CHECK(open_source(dir, &src) == 0);
    EXPECT_ERROR(cv_weights_linear_scheme(src, "model.layers.0.self_attn.q_proj", &s), CVLLM_ERR_FORMAT, "no entry",
                 "has no entry for tensor model.layers.0.self_attn.q_proj.weight");
    EXPECT_ERROR(cv_weights_get_qlinear(src, "model.layers.0.self_attn.q_proj", 128, 64, "h", &q), CVLLM_ERR_FORMAT,
                 "no entry", "model.layers.0.self_attn.q_proj.weight");
    cv_weight_source_free(src);
    free(dir);
    dir = edited_folder(w, "lm-head-w8a8", d, quantize_lm_head);
    CHECK(open_source(dir, &src) == 0);
    EXPECT_ERROR(cv_weights_get(src, "lm_head.weight", 2, (const int64_t[]){4096, 64}, "h", &t), CVLLM_ERR_UNSUPPORTED,
                 "float read of a W8A8 tensor", "tensor lm_head.weight is W8A8", "only unquantized");
    EXPECT_ERROR(cv_weights_get_qlinear(src, "lm_head", 4096, 64, "h", &q), CVLLM_ERR_FORMAT, "BF16 codes",
                 "lm_head.weight", "has dtype BF16", "must be I8");
    cv_weight_source_free(src);
    free(dir);
    dir = edited_folder(f, "fp8-skip-q", c, skip_q_proj);
    CHECK(open_source(dir, &src) == 0);
    EXPECT_ERROR(cv_weights_get_qlinear(src, "model.layers.0.self_attn.q_proj", 256, 192, "h", &q), CVLLM_ERR_UNSUPPORTED,
                 "listed module stored fp8", "model.layers.0.self_attn.q_proj.weight", "quantized (F8_E4M3)");
    cv_weight_source_free(src);
    free(dir);
    dir = edited_folder(f, "fp8-convert-lm-head", c, convert_lm_head);
    CHECK(open_source(dir, &src) == 0);
    EXPECT_ERROR(cv_weights_get_qlinear(src, "lm_head", 4096, 192, "h", &q), CVLLM_ERR_FORMAT, "unlisted bf16 module",
                 "lm_head.weight", "must be F8_E4M3");
    cv_weight_source_free(src);
    free(dir);
}

/* ---- tensors, edited ------------------------------------------------------------------------------ */

/* What an edit does to one tensor: drop it, replace it (dtype, shape and bytes), or add it. */
typedef struct tensor_edit {
    const char *name;
    enum { EDIT_DROP, EDIT_REPLACE, EDIT_ADD } op;
    cv_dtype dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
} tensor_edit;

static void write_safetensors(const char *path, const cv_checkpoint *ck, const tensor_edit *e) {
    json_t *header = json_object();
    size_t offset = 0;
    const size_t n = cv_checkpoint_count(ck) + (e->op == EDIT_ADD);
    const cv_tensor **out = calloc(n, sizeof *out);
    cv_tensor *replaced = calloc(n, sizeof *replaced);
    for (size_t i = 0; i < n; i++) {
        const cv_tensor *t = i < cv_checkpoint_count(ck) ? cv_checkpoint_tensor(ck, i) : &(cv_tensor){.name = e->name};
        if (!strcmp(t->name, e->name)) {
            if (e->op == EDIT_DROP) continue;
            replaced[i] = (cv_tensor){.name = t->name, .dtype = e->dtype, .ndim = e->ndim, .data = e->data,
                                      .nbytes = e->nbytes};
            memcpy(replaced[i].shape, e->shape, sizeof e->shape);
            t = &replaced[i];
        }
        out[i] = t;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(header, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", cv_dtype_name(t->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)offset, (json_int_t)(offset + t->nbytes)));
        offset += t->nbytes;
    }
    char *text = json_dumps(header, JSON_COMPACT);
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    uint64_t len = strlen(text);
    fwrite(&len, sizeof len, 1, fp);
    fwrite(text, 1, len, fp);
    for (size_t i = 0; i < n; i++)
        if (out[i]) fwrite(out[i]->data, 1, out[i]->nbytes, fp);
    fclose(fp);
    free(text);
    free(out);
    free(replaced);
    json_decref(header);
}

/* A folder with vector `from`'s weights rewritten with one edit, as one file; returns the folder. */
static char *edited_weights(const char *from, const char *name, const tensor_edit *e) {
    char *src = vector_dir(from), *dir = scratch(name);
    const bool fp8 = !strcmp(from, "qwen3-dense-fp8");
    cv_checkpoint *ck = open_raw(src, !fp8);
    link_files(from, dir, fp8 ? (const char *const[]){"config.json", NULL}
                              : (const char *const[]){"config.json", "quant_model_description.json", NULL});
    char *path = tu_strdupf("%s/%s", dir, fp8 ? "model.safetensors" : "quant_model_weights.safetensors");
    if (ck) write_safetensors(path, ck, e);
    cv_checkpoint_close(ck);
    free(path);
    free(src);
    return dir;
}

/* Binds prefix [rows][cols] of the edited copy: the error wanted (0: success, *q filled). */
static void expect_bind(const char *from, const tensor_edit *e, const char *prefix, int64_t rows, int64_t cols, int want,
                        const char *const *needles, void (*check)(const cv_qlinear *q, const tensor_edit *e)) {
    static int n;
    char name[32];
    snprintf(name, sizeof name, "tensor-edit-%d", n++);
    char *dir = edited_weights(from, name, e);
    cv_weight_source *src = NULL;
    int rc = open_source(dir, &src);
    CHECK_MSG(rc == 0, "%s: %s", name, cvllm_last_error());
    cv_qlinear q;
    if (!rc) rc = cv_weights_get_qlinear(src, prefix, rows, cols, "rows, cols", &q);
    if (want) check_error(rc, want, e->name, needles);
    else CHECK_MSG(rc == 0, "%s: %s", e->name, cvllm_last_error());
    if (!rc && check) check(&q, e);
    cv_weight_source_free(src);
    free(dir);
}
#define EXPECT_BIND_ERROR(from, edit, prefix, rows, cols, want, ...) \
    expect_bind((from), (edit), (prefix), (rows), (cols), (want), (const char *const[]){__VA_ARGS__, NULL}, NULL)

/* The edit replaced a scale with these values in another dtype: the loader widened them exactly. */
static void check_row_scale(const cv_qlinear *q, const tensor_edit *e) {
    const cv_tensor t = {.name = e->name, .dtype = e->dtype, .ndim = e->ndim, .data = e->data};
    for (int64_t i = 0; i < e->shape[0]; i++) CHECK(q->row_scale[i] == stored_f32(&t, i));
}

static void check_block_scale(const cv_qlinear *q, const tensor_edit *e) {
    const cv_tensor t = {.name = e->name, .dtype = e->dtype, .ndim = e->ndim, .data = e->data};
    for (int64_t i = 0; i < e->shape[0] * e->shape[1]; i++) CHECK(q->block_scale[i] == stored_f32(&t, i));
}

static void test_tensor_refusals(void) {
    const char *st = "qwen3-dense-w8a8", *dy = "qwen3-dense-w8a8-dynamic", *f8 = "qwen3-dense-fp8";
    const char *p = "model.layers.0.self_attn.q_proj";
    static const char *const static_parts[] = {"deq_scale", "quant_bias", "input_scale", "input_offset", "weight"};
    char name[128];
    for (size_t i = 0; i < CV_ARRAY_LEN(static_parts); i++) {
        snprintf(name, sizeof name, "%s.%s", p, static_parts[i]);
        EXPECT_BIND_ERROR(st, &((tensor_edit){.name = name, .op = EDIT_DROP}), p, 128, 64, CVLLM_ERR_NOT_FOUND, name, "missing tensor");
    }
    uint16_t h[128];
    float f[128];
    int32_t i32[128];
    for (int i = 0; i < 128; i++) {
        h[i] = cv_f32_to_f16(1e-5f * (float)(i + 1));
        f[i] = 1e-5f;
        i32[i] = i;
    }
    snprintf(name, sizeof name, "%s.deq_scale", p);
    EXPECT_BIND_ERROR(st, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 1, {64}, f, 64 * 4}), p, 128, 64,
                      CVLLM_ERR_FORMAT, name, "has shape [64] but config.json implies [128] (rows, cols)");
    expect_bind(st, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F16, 1, {128}, h, sizeof h}), p, 128, 64, 0, NULL,
                check_row_scale);
    f[5] = NAN;
    EXPECT_BIND_ERROR(st, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 1, {128}, f, sizeof f}), p, 128, 64,
                      CVLLM_ERR_FORMAT, name, "non-finite scale", "element 5");
    f[5] = 1e-5f;
    snprintf(name, sizeof name, "%s.quant_bias", p);
    EXPECT_BIND_ERROR(st, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 1, {128}, f, sizeof f}), p, 128, 64,
                      CVLLM_ERR_FORMAT, name, "has dtype F32", "quant_bias must be I32");
    snprintf(name, sizeof name, "%s.input_scale", p);
    EXPECT_BIND_ERROR(st, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 1, {2}, f, 8}), p, 128, 64, CVLLM_ERR_FORMAT,
                      name, "has shape [2]");
    snprintf(name, sizeof name, "%s.weight", p);
    EXPECT_BIND_ERROR(st, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_I32, 2, {128, 1}, i32, sizeof i32}), p, 128, 64,
                      CVLLM_ERR_FORMAT, name, "has dtype I32", "weight must be I8");
    EXPECT_BIND_ERROR(st, &((tensor_edit){.name = "none", .op = EDIT_DROP}), p, 64, 64, CVLLM_ERR_FORMAT, name,
                      "has shape [128, 64] but config.json implies [64, 64] (rows, cols)");
    /* A static layer may carry a weight_offset too (vllm-ascend declares one): zero, else refused. */
    snprintf(name, sizeof name, "%s.weight_offset", p);
    float zeros[128] = {0};
    expect_bind(st, &((tensor_edit){name, EDIT_ADD, CV_DTYPE_F32, 2, {128, 1}, zeros, sizeof zeros}), p, 128, 64, 0,
                NULL, NULL);
    zeros[3] = -2.0f;
    EXPECT_BIND_ERROR(st, &((tensor_edit){name, EDIT_ADD, CV_DTYPE_F32, 1, {128}, zeros, sizeof zeros}), p, 128, 64,
                      CVLLM_ERR_UNSUPPORTED, name, "not all zeros", "row 3");
    zeros[3] = 0.0f;

    /* int64 deq_scale: the float16 model's encoding, refused for a bfloat16 model. */
    char *dir = scratch("i64-bf16");
    link_files("qwen3-dense-w8a8-fp16", dir,
               (const char *const[]){"quant_model_description.json", "quant_model_weights.safetensors.index.json",
                                     "quant_model_weights-00001-of-00002.safetensors",
                                     "quant_model_weights-00002-of-00002.safetensors", NULL});
    char *fp16 = vector_dir("qwen3-dense-w8a8-fp16");
    json_t *cfg = load_json(fp16, "config.json");
    json_object_set_new(cfg, "torch_dtype", json_string("bfloat16"));
    save_json(dir, "config.json", cfg);
    json_decref(cfg);
    free(fp16);
    cv_weight_source *src = NULL;
    cv_qlinear q;
    CHECK(open_source(dir, &src) == 0);
    EXPECT_ERROR(cv_weights_get_qlinear(src, p, 128, 64, "h", &q), CVLLM_ERR_FORMAT, "int64 deq_scale, bf16 model",
                 "model.layers.0.self_attn.q_proj.deq_scale", "is I64", "not float16", "expected F32");
    cv_weight_source_free(src);
    free(dir);

    /* W8A8_DYNAMIC. */
    snprintf(name, sizeof name, "%s.weight_scale", p);
    EXPECT_BIND_ERROR(dy, &((tensor_edit){.name = name, .op = EDIT_DROP}), p, 128, 64, CVLLM_ERR_NOT_FOUND, name, "W8A8_DYNAMIC");
    expect_bind(dy, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F16, 1, {128}, h, sizeof h}), p, 128, 64, 0, NULL,
                check_row_scale);
    EXPECT_BIND_ERROR(dy, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F16, 2, {64, 2}, h, sizeof h}), p, 128, 64,
                      CVLLM_ERR_FORMAT, name, "has shape [64, 2] but config.json implies [128, 1]");
    snprintf(name, sizeof name, "%s.weight_offset", p);
    EXPECT_BIND_ERROR(dy, &((tensor_edit){.name = name, .op = EDIT_DROP}), p, 128, 64, CVLLM_ERR_NOT_FOUND, name);
    expect_bind(dy, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 2, {128, 1}, zeros, sizeof zeros}), p, 128, 64, 0,
                NULL, NULL);
    zeros[77] = 1.0f;
    EXPECT_BIND_ERROR(dy, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 2, {128, 1}, zeros, sizeof zeros}), p, 128,
                      64, CVLLM_ERR_UNSUPPORTED, name, "not all zeros", "row 77", "asymmetric");

    /* FP8: 256×192 has 2×2 blocks of 128. */
    snprintf(name, sizeof name, "%s.weight_scale_inv", p);
    EXPECT_BIND_ERROR(f8, &((tensor_edit){.name = name, .op = EDIT_DROP}), p, 256, 192, CVLLM_ERR_NOT_FOUND, name, "FP8_BLOCK");
    EXPECT_BIND_ERROR(f8, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 2, {1, 2}, f, 8}), p, 256, 192,
                      CVLLM_ERR_FORMAT, name, "has shape [1, 2] but config.json implies [2, 2]");
    expect_bind(f8, &((tensor_edit){name, EDIT_REPLACE, CV_DTYPE_F32, 2, {2, 2}, f, 16}), p, 256, 192, 0, NULL,
                check_block_scale);
}

/* ---- dummy weights --------------------------------------------------------------------------------- */

static cv_weight_source *dummy_of(const char *dir, uint64_t seed) {
    cv_weight_source *src = NULL;
    cv_weight_source_params p = {.dir = dir, .dummy = true, .dtype = CV_DTYPE_BF16, .seed = seed};
    CHECK_MSG(cv_weight_source_create(&p, &src) == 0, "%s: %s", dir, cvllm_last_error());
    return src;
}

/* Checks a dummy linear: the format of its scheme, the float dummy's magnitude once dequantized. */
static void check_dummy_linear(const cv_qlinear *q, int64_t rows, int64_t cols, cv_linear_scheme want) {
    CHECK_MSG(q->scheme == want, "%s: %s", q->weight.name, cv_linear_scheme_name(q->scheme));
    CHECK(q->weight.ndim == 2 && q->weight.shape[0] == rows && q->weight.shape[1] == cols);
    const int8_t *codes = q->weight.data;
    float max_w = 0;
    bool varied = false, codes_ok = true;
    for (int64_t n = 0; n < rows; n++)
        for (int64_t k = 0; k < cols; k++) {
            const int8_t c = codes[n * cols + k];
            float w;
            if (want == CV_SCHEME_FP8_BLOCK) {
                float v = cv_fp8_e4m3_to_f32((uint8_t)c);
                codes_ok = codes_ok && isfinite(v);
                w = v * q->block_scale[(n / q->block) * ((cols + q->block - 1) / q->block) + k / q->block];
            } else {
                codes_ok = codes_ok && c >= -127;
                w = (float)c * (want == CV_SCHEME_W8A8 ? q->row_scale[n] / q->input_scale : q->row_scale[n]);
            }
            max_w = fmaxf(max_w, fabsf(w));
            varied = varied || c != codes[0];
        }
    CHECK_MSG(codes_ok, "%s: a code out of the scheme's range", q->weight.name);
    CHECK_MSG(max_w <= 1e-3f && max_w > 2e-4f && varied, "%s: dequantized weights up to %g", q->weight.name, max_w);
    if (want == CV_SCHEME_FP8_BLOCK) {
        CHECK(q->weight.dtype == CV_DTYPE_F8_E4M3 && q->block == 128 && !q->row_scale);
    } else {
        CHECK(q->weight.dtype == CV_DTYPE_I8 && q->row_scale && !q->block_scale);
    }
    if (want == CV_SCHEME_W8A8) {
        CHECK(q->row_bias && q->input_scale > 0 && q->input_scale * 127 <= 1e-3f);
        CHECK(q->input_offset == nearbyintf(q->input_offset) && fabsf(q->input_offset) <= 8);
    } else {
        CHECK(!q->row_bias);
    }
}

static void check_dummy_vector(const char *vector, const char *prefix, int64_t rows, int64_t cols, cv_linear_scheme want) {
    char *dir = vector_dir(vector);
    cv_weight_source *a = dummy_of(dir, 7), *b = dummy_of(dir, 7), *c = dummy_of(dir, 8);
    cv_qlinear qa, qb, qc;
    int rc = a && b && c ? cv_weights_get_qlinear(a, prefix, rows, cols, "h", &qa) : -1;
    CHECK_MSG(rc == 0, "%s %s: %s", vector, prefix, cvllm_last_error());
    if (!rc) {
        CHECK(cv_weight_source_is_dummy(a) && cv_weight_source_quant_method(a) != CV_QUANT_NONE);
        check_dummy_linear(&qa, rows, cols, want);
        CHECK(cv_weights_get_qlinear(b, prefix, rows, cols, "h", &qb) == 0 && same_bytes(&qa.weight, &qb.weight));
        CHECK(cv_weights_get_qlinear(c, prefix, rows, cols, "h", &qc) == 0 && !same_bytes(&qa.weight, &qc.weight));
        /* Float reads of a quantized weight are refused, FLOAT ones made at the dummy dtype. */
        char name[256];
        snprintf(name, sizeof name, "%s.weight", prefix);
        cv_tensor t;
        if (want != CV_SCHEME_FP8_BLOCK)
            EXPECT_ERROR(cv_weights_get(a, name, 2, (const int64_t[]){rows, cols}, "h", &t), CVLLM_ERR_UNSUPPORTED,
                         "dummy float read", name, "only unquantized");
        CHECK(cv_weights_get_qlinear(a, "lm_head", 4096, cols, "h", &qa) == 0 && qa.scheme == CV_SCHEME_FLOAT &&
              qa.weight.dtype == CV_DTYPE_BF16);
    }
    cv_weight_source_free(a);
    cv_weight_source_free(b);
    cv_weight_source_free(c);
    free(dir);
}

static void test_dummy(void) {
    check_dummy_vector("qwen3-dense-w8a8", "model.layers.1.mlp.down_proj", 64, 128, CV_SCHEME_W8A8);
    check_dummy_vector("qwen3-dense-w8a8-dynamic", "model.layers.0.mlp.gate_proj", 128, 64, CV_SCHEME_W8A8_DYNAMIC);
    check_dummy_vector("qwen3-dense-fp8", "model.layers.0.mlp.down_proj", 192, 384, CV_SCHEME_FP8_BLOCK);
    /* The tutorials' shipped descriptions: one expert and one attention projection of each. */
    cv_weight_source *src = dummy_of(CVLLM_SOURCE_DIR "/models/Eco-Tech/Qwen3.6-35B-A3B-w8a8", 0);
    cv_qlinear q;
    cv_linear_scheme s;
    CHECK(src && cv_weights_get_qlinear(src, "model.language_model.layers.5.mlp.experts.200.up_proj", 512, 2048, "h", &q) == 0);
    if (src) check_dummy_linear(&q, 512, 2048, CV_SCHEME_W8A8_DYNAMIC);
    CHECK(src && cv_weights_linear_scheme(src, "model.language_model.layers.3.self_attn.k_proj", &s) == 0 &&
          s == CV_SCHEME_W8A8_DYNAMIC);
    CHECK(src && cv_weights_linear_scheme(src, "model.language_model.layers.3.self_attn.o_proj", &s) == 0 &&
          s == CV_SCHEME_FLOAT);
    CHECK(src && cv_weights_linear_scheme(src, "model.language_model.layers.0.linear_attn.in_proj_qkv", &s) == 0 &&
          s == CV_SCHEME_FLOAT);
    cv_weight_source_free(src);
    src = dummy_of(CVLLM_SOURCE_DIR "/models/vllm-ascend/Qwen3-32B-W8A8", 0);
    CHECK(src && cv_weights_get_qlinear(src, "model.layers.63.self_attn.k_proj", 1024, 5120, "h", &q) == 0);
    if (src) check_dummy_linear(&q, 1024, 5120, CV_SCHEME_W8A8);
    cv_weight_source_free(src);
    /* Without a folder: unquantized. */
    src = dummy_of(NULL, 0);
    CHECK(src && cv_weight_source_quant_method(src) == CV_QUANT_NONE && cv_weight_source_quant(src) == NULL);
    CHECK(src && cv_weights_get_qlinear(src, "model.layers.0.mlp.up_proj", 16, 8, "h", &q) == 0 &&
          q.scheme == CV_SCHEME_FLOAT && q.weight.dtype == CV_DTYPE_BF16);
    cv_weight_source_free(src);
    /* The flag is checked for dummy weights too. */
    char *plain = vector_dir("qwen3-dense-bf16");
    cv_weight_source_params p = {.dir = plain, .quantization = "ascend", .dummy = true, .dtype = CV_DTYPE_BF16};
    EXPECT_ERROR(cv_weight_source_create(&p, &src), CVLLM_ERR_INVALID_ARGUMENT, "dummy, ascend on bf16",
                 "Cannot find the config file for ascend");
    free(plain);
}

/* ---- bytes ------------------------------------------------------------------------------------------ */

static void test_scheme_bytes(void) {
    /* Codes, then per row: W8A8 an f32 deq_scale and an int32 quant_bias (and the two f32 scalars);
     * W8A8_DYNAMIC an f32 weight_scale and weight_offset; FP8 an f32 per 128-block (2 × 3 here). */
    CHECK_EQ_INT(cv_linear_scheme_bytes(CV_SCHEME_W8A8, 10, 7, 0), 70 + 10 * 8 + 8);
    CHECK_EQ_INT(cv_linear_scheme_bytes(CV_SCHEME_W8A8_DYNAMIC, 10, 7, 0), 70 + 10 * 8);
    CHECK_EQ_INT(cv_linear_scheme_bytes(CV_SCHEME_FP8_BLOCK, 129, 300, 128), 129 * 300 + 2 * 3 * 4);
    CHECK_EQ_INT(cv_linear_scheme_bytes(CV_SCHEME_FLOAT, 10, 7, 0), 0);
}

int main(void) {
    tmp = tu_make_temp_dir();
    test_ascend_vectors();
    test_fp8_vector();
    test_file_names();
    test_selection();
    test_description_refusals();
    test_tensor_refusals();
    test_dummy();
    test_scheme_bytes();
    tu_remove_tree(tmp);
    free(tmp);
    return cv_check_summary("test_quant_loader");
}
