/*
 * test_cli_quantize.c — `cvllm quantize` end to end, through the binary.
 *
 * W8A8_DYNAMIC of the reference bf16 checkpoints is checked two ways: every tensor against codes and
 * scales recomputed here from the bf16 weights (max|w|/127, round half to even), every other tensor
 * byte for byte against the source; and the whole output against the quantized reference folders
 * (qwen3-dense-w8a8-dynamic, qwen3.5-moe-w8a8-dynamic: msModelSlim's layout of the same seed-0
 * weights), tensor for tensor and description for description, bit for bit. Sharding follows
 * Hugging Face's rule at a small --max-shard-size, with an index that covers every tensor and data
 * aligned to each dtype. W8A8 static is checked against activation ranges this test observes
 * itself: the same prompts through the model's linear observer, folded into min-max here (a routed
 * expert that no token reached: the union over its layer's experts), and the stored input_scale /
 * input_offset must map min to −128, max to 127 and 0 to the offset under the runtime's formula,
 * with input_scale (max − min) / 255 up to a few ulps; deq_scale and quant_bias follow from them and
 * the recomputed codes. The outputs load through the engine (`cvllm generate --quantization
 * ascend`): a W8A8_DYNAMIC one generates what its reference folder generates, and every one predicts
 * the reference's token after the long prompt. Each error path: one line on stderr, the exit
 * status, and no OUT left behind.
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "check.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/safetensors_write.h"
#include "loader/weights.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "testutil.h"

#define VEC CVLLM_TEST_DATA "/vectors/"

static char *tmp;

/* ---- reading an output folder ------------------------------------------------------------------- */

/* Every tensor of a folder's safetensors files (through the index when there is one), by name. */
typedef struct ckpt {
    json_t *by_name;     /* name → index into tensors */
    cv_tensor *tensors;
    size_t n;
    char **bufs;
    size_t n_bufs;
    json_t *index;       /* the index file, or NULL */
} ckpt;

static char *read_binary(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len ? *len : 1);
    if (fread(buf, 1, *len, f) != *len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static bool ckpt_add_file(ckpt *c, const char *path) {
    size_t len;
    char *buf = read_binary(path, &len);
    cv_tensor *ts;
    size_t n;
    if (!buf || cv_safetensors_parse_buffer(buf, len, &ts, &n) != 0) {
        fprintf(stderr, "%s: %s\n", path, buf ? cv_error_message() : "cannot read");
        free(buf);
        return false;
    }
    /* The layout the writer promises: header padded to 8, each tensor aligned to its element size. */
    uint64_t header;
    memcpy(&header, buf, 8);
    CHECK_MSG(header % 8 == 0, "%s: header of %llu bytes", path, (unsigned long long)header);
    for (size_t i = 0; i < n; i++)
        CHECK_MSG((size_t)((const char *)ts[i].data - buf) % cv_dtype_size(ts[i].dtype) == 0, "%s: %s unaligned", path,
                  ts[i].name);
    c->bufs = realloc(c->bufs, (c->n_bufs + 1) * sizeof *c->bufs);
    c->bufs[c->n_bufs++] = buf;
    c->tensors = realloc(c->tensors, (c->n + n) * sizeof *c->tensors);
    for (size_t i = 0; i < n; i++) {
        CHECK_MSG(!json_object_get(c->by_name, ts[i].name), "%s twice", ts[i].name);
        json_object_set_new(c->by_name, ts[i].name, json_integer((json_int_t)(c->n + i)));
        c->tensors[c->n + i] = ts[i];
    }
    c->n += n;
    free(ts); /* names moved */
    return true;
}

static bool ckpt_open(const char *dir, ckpt *c) {
    *c = (ckpt){.by_name = json_object()};
    char *index = cv_xasprintf("%s/quant_model_weights.safetensors.index.json", dir);
    c->index = json_load_file(index, 0, NULL);
    free(index);
    bool ok = true;
    if (!c->index) {
        char *single = cv_xasprintf("%s/quant_model_weights.safetensors", dir);
        ok = ckpt_add_file(c, single);
        free(single);
        return ok;
    }
    json_t *files = json_object(); /* shard → true */
    const char *name;
    json_t *file;
    json_object_foreach(json_object_get(c->index, "weight_map"), name, file) json_object_set(files, json_string_value(file), json_true());
    json_object_foreach(files, name, file) {
        char *path = cv_xasprintf("%s/%s", dir, name);
        ok = ok && ckpt_add_file(c, path);
        free(path);
    }
    json_decref(files);
    return ok;
}

static const cv_tensor *ckpt_find(const ckpt *c, const char *name) {
    json_t *i = json_object_get(c->by_name, name);
    return i ? &c->tensors[json_integer_value(i)] : NULL;
}

static void ckpt_close(ckpt *c) {
    for (size_t i = 0; i < c->n; i++) free((char *)c->tensors[i].name);
    free(c->tensors);
    for (size_t i = 0; i < c->n_bufs; i++) free(c->bufs[i]);
    free(c->bufs);
    json_decref(c->by_name);
    json_decref(c->index);
}

static bool same_shape(const cv_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return false;
    return true;
}

static bool same_tensor(const cv_tensor *a, const cv_tensor *b) {
    return a->dtype == b->dtype && same_shape(a, b->ndim, b->shape) && a->nbytes == b->nbytes &&
           memcmp(a->data, b->data, a->nbytes) == 0;
}

/* ---- running the command ------------------------------------------------------------------------ */

static tu_run quantize(const char *const *args) {
    const char *argv[16] = {"quantize"};
    size_t n = 1;
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    return tu_run_exec(tmp, NULL, NULL, CVLLM_BINARY, argv);
}

static char *tmp_path(const char *name) { return cv_xasprintf("%s/%s", tmp, name); }

/* A model folder: the reference checkpoint's files, and the Qwen3 tokenizer unless `tokenizer` is
 * false. */
static char *model_dir(const char *vector, bool tokenizer) {
    char *dir = tu_make_temp_dir();
    static const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (size_t i = 0; i < CV_ARRAY_LEN(files); i++) {
        char *t = cv_xasprintf(VEC "%s/%s", vector, files[i]);
        tu_link(t, dir, files[i]);
        free(t);
    }
    static const char *tok[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; tokenizer && i < CV_ARRAY_LEN(tok); i++) {
        char *t = cv_xasprintf("%s/models/qwen3-tokenizer/%s", CVLLM_SOURCE_DIR, tok[i]);
        tu_link(t, dir, tok[i]);
        free(t);
    }
    return dir;
}

static bool same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = read_binary(a, &la), *y = read_binary(b, &lb);
    bool same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

/* ---- what the output must hold ------------------------------------------------------------------ */

static float widen(const cv_tensor *t, int64_t i) {
    float v;
    cv_convert_to_f32(&v, (const char *)t->data + (size_t)i * cv_dtype_size(t->dtype), t->dtype, 1);
    return v;
}

/* The rows [row0, row0 + rows) of source tensor w (a 2-D weight or a fused expert block) against the
 * output linear `prefix`: codes and weight_scale recomputed here; W8A8_DYNAMIC's zero offsets, or
 * W8A8's deq_scale and quant_bias from the stored input_scale / input_offset. */
static void check_linear(const ckpt *out, const char *prefix, const cv_tensor *w, int64_t row0, int64_t rows,
                         int64_t cols, bool is_static) {
    char *name = cv_xasprintf("%s.weight", prefix);
    const cv_tensor *q = ckpt_find(out, name);
    CHECK_MSG(q && q->dtype == CV_DTYPE_I8 && same_shape(q, 2, (int64_t[]){rows, cols}), "%s", name);
    free(name);
    if (!q || q->dtype != CV_DTYPE_I8 || !same_shape(q, 2, (int64_t[]){rows, cols})) return;
    float *scale = malloc((size_t)rows * sizeof *scale);
    int32_t *sums = calloc((size_t)rows, sizeof *sums);
    int64_t bad = 0;
    for (int64_t n = 0; n < rows; n++) {
        float max = 0;
        for (int64_t k = 0; k < cols; k++) max = fmaxf(max, fabsf(widen(w, (row0 + n) * cols + k)));
        scale[n] = max / 127.0f;
        for (int64_t k = 0; k < cols; k++) {
            const float code = scale[n] == 0 ? 0 : nearbyintf(widen(w, (row0 + n) * cols + k) / scale[n]);
            bad += ((const int8_t *)q->data)[n * cols + k] != (int8_t)code;
            sums[n] += (int32_t)code;
        }
    }
    CHECK_MSG(bad == 0, "%s: %lld codes differ", prefix, (long long)bad);
    char *s = cv_xasprintf("%s.%s", prefix, is_static ? "deq_scale" : "weight_scale");
    const cv_tensor *st = ckpt_find(out, s);
    const int64_t shape2[2] = {rows, 1};
    /* deq_scale: F32, or for fp16 models I64 holding the f32 bits (check_static_f16 says which). */
    CHECK_MSG(st && (st->dtype == CV_DTYPE_F32 || (is_static && st->dtype == CV_DTYPE_I64)) &&
                  (is_static ? same_shape(st, 1, &rows) : same_shape(st, 2, shape2)),
              "%s", s);
    if (!is_static) {
        char *o = cv_xasprintf("%s.weight_offset", prefix);
        const cv_tensor *ot = ckpt_find(out, o);
        CHECK_MSG(ot && ot->dtype == CV_DTYPE_F32 && same_shape(ot, 2, shape2), "%s", o);
        for (int64_t n = 0; ot && st && n < rows; n++) {
            CHECK_MSG(((const float *)st->data)[n] == scale[n], "%s[%lld]", s, (long long)n);
            CHECK_MSG(((const uint32_t *)ot->data)[n] == 0, "%s[%lld] is not +0", o, (long long)n);
        }
        free(o);
    } else {
        char *is = cv_xasprintf("%s.input_scale", prefix), *io = cv_xasprintf("%s.input_offset", prefix);
        char *qb = cv_xasprintf("%s.quant_bias", prefix);
        const cv_tensor *ist = ckpt_find(out, is), *iot = ckpt_find(out, io), *qbt = ckpt_find(out, qb);
        const int64_t one = 1;
        CHECK_MSG(ist && iot && ist->dtype == CV_DTYPE_F32 && iot->dtype == CV_DTYPE_F32 && same_shape(ist, 1, &one) &&
                      same_shape(iot, 1, &one),
                  "%s, %s", is, io);
        CHECK_MSG(qbt && qbt->dtype == CV_DTYPE_I32 && same_shape(qbt, 1, &rows), "%s", qb);
        if (ist && iot && qbt && st) {
            const float x_scale = *(const float *)ist->data, x_offset = *(const float *)iot->data;
            for (int64_t n = 0; n < rows; n++) {
                float deq;
                if (st->dtype == CV_DTYPE_I64) {
                    const int32_t bits = (int32_t)((const int64_t *)st->data)[n];
                    CHECK(((const int64_t *)st->data)[n] == bits); /* sign-extended */
                    memcpy(&deq, &bits, sizeof deq);
                } else {
                    deq = ((const float *)st->data)[n];
                }
                CHECK_MSG(deq == x_scale * scale[n], "%s[%lld]", s, (long long)n);
                CHECK_MSG(((const int32_t *)qbt->data)[n] == (int32_t)(-x_offset * (float)sums[n]), "%s[%lld]", qb,
                          (long long)n);
            }
        }
        free(is);
        free(io);
        free(qb);
    }
    free(s);
    free(scale);
    free(sums);
}

static int by_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Hugging Face's split over the tensors in name order: the shard each must be in, and the count. */
static void check_shards(const ckpt *out, uint64_t max_bytes, int min_shards) {
    json_t *map = json_object_get(out->index, "weight_map");
    CHECK_EQ_INT(json_object_size(map), out->n);
    const char **names = calloc(out->n, sizeof *names);
    size_t k = 0, total = 0;
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) names[k++] = name;
    qsort(names, k, sizeof *names, by_str);
    int n_shards = 0;
    uint64_t filled = 0;
    bool open = false;
    int *want = calloc(k ? k : 1, sizeof *want);
    for (size_t i = 0; i < k; i++) {
        const cv_tensor *t = ckpt_find(out, names[i]);
        total += t->nbytes;
        if (t->nbytes > max_bytes) {
            want[i] = ++n_shards;
            open = false;
            continue;
        }
        if (!open || filled + t->nbytes > max_bytes) n_shards++, filled = 0, open = true;
        want[i] = n_shards;
        filled += t->nbytes;
    }
    CHECK_MSG(n_shards >= min_shards, "%d shards", n_shards);
    for (size_t i = 0; i < k; i++) {
        char expect[96];
        snprintf(expect, sizeof expect, "quant_model_weights-%05d-of-%05d.safetensors", want[i], n_shards);
        CHECK_STR_EQ(json_string_value(json_object_get(map, names[i])), expect);
    }
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(out->index, "metadata"), "total_size")), total);
    free(want);
    free(names);
}

/* The description: the metadata keys, and an entry per stored tensor — the scheme for int8
 * weights and their scales, FLOAT for the rest. */
static json_t *check_description(const char *out_dir, const ckpt *out, const char *scheme) {
    char *path = cv_xasprintf("%s/quant_model_description.json", out_dir);
    json_t *d = json_load_file(path, 0, NULL);
    free(path);
    CHECK(d != NULL);
    if (!d) return NULL;
    CHECK_STR_EQ(json_string_value(json_object_get(d, "model_quant_type")), scheme);
    CHECK_STR_EQ(json_string_value(json_object_get(d, "version")), "1.0.0");
    CHECK(json_integer_value(json_object_get(d, "group_size")) == 0 && json_is_integer(json_object_get(d, "group_size")));
    CHECK_EQ_INT(json_object_size(d), out->n + 5); /* + model_quant_type, version, group_size, metadata, optional */
    for (size_t i = 0; i < out->n; i++) {
        const cv_tensor *t = &out->tensors[i];
        const char *type = json_string_value(json_object_get(d, t->name));
        const char *dot = strrchr(t->name, '.');
        const bool quantized = t->dtype == CV_DTYPE_I8 || strstr(dot, "scale") || strstr(dot, "offset") ||
                               !strcmp(dot, ".quant_bias");
        CHECK_MSG(type && !strcmp(type, quantized ? scheme : "FLOAT"), "%s: %s", t->name, type ? type : "no entry");
    }
    return d;
}

/* ---- dynamic ------------------------------------------------------------------------------------ */

static bool dense_linear(const char *name) {
    static const char *const projs[] = {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                                        ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"};
    for (size_t i = 0; i < CV_ARRAY_LEN(projs); i++) {
        size_t n = strlen(name), m = strlen(projs[i]);
        if (n > m && !strcmp(name + n - m, projs[i])) return true;
    }
    return false;
}

/* Every source tensor is either a quantized linear (checked) or copied as it is. */
static void check_against_source(const ckpt *out, const char *dir, bool (*quantized)(const char *), bool is_static) {
    cv_checkpoint *src;
    CHECK_EQ_INT(cv_checkpoint_open(dir, &src), 0);
    size_t n_lin = 0;
    for (size_t i = 0; i < cv_checkpoint_count(src); i++) {
        const cv_tensor *t = cv_checkpoint_tensor(src, i);
        if (quantized(t->name)) {
            char *prefix = cv_xstrndup(t->name, strlen(t->name) - strlen(".weight"));
            check_linear(out, prefix, t, 0, t->shape[0], t->shape[1], is_static);
            free(prefix);
            n_lin++;
        } else {
            const cv_tensor *o = ckpt_find(out, t->name);
            CHECK_MSG(o && same_tensor(o, t), "%s is not copied as it is", t->name);
        }
    }
    CHECK_EQ_INT(out->n, cv_checkpoint_count(src) + n_lin * (is_static ? 4 : 2));
    cv_checkpoint_close(src);
}

/* Tensor for tensor and description for description against a quantized reference folder. */
static void check_against_reference(const char *out_dir, const ckpt *out, const json_t *desc, const char *vector) {
    char *dir = cv_xasprintf(VEC "%s", vector);
    ckpt ref;
    CHECK(ckpt_open(dir, &ref));
    CHECK_EQ_INT(out->n, ref.n);
    size_t same = 0;
    for (size_t i = 0; i < ref.n; i++) {
        const cv_tensor *o = ckpt_find(out, ref.tensors[i].name);
        CHECK_MSG(o && same_tensor(o, &ref.tensors[i]), "%s differs from %s", ref.tensors[i].name, vector);
        same += o && same_tensor(o, &ref.tensors[i]);
    }
    CHECK_EQ_INT(same, ref.n);
    char *ref_desc = cv_xasprintf("%s/quant_model_description.json", dir);
    json_t *rd = json_load_file(ref_desc, 0, NULL);
    CHECK(rd && desc && json_equal(rd, (json_t *)desc));
    json_decref(rd);
    free(ref_desc);
    char *a = cv_xasprintf("%s/config.json", out_dir), *b = cv_xasprintf("%s/config.json", dir);
    CHECK(same_file(a, b));
    free(a);
    free(b);
    ckpt_close(&ref);
    free(dir);
}

static void test_dynamic_dense(void) {
    char *model = model_dir("qwen3-dense-bf16", true), *out = tmp_path("dense-dynamic");
    tu_run r = quantize((const char *[]){model, out, "--scheme", "w8a8_dynamic", "--max-shard-size", "300KB", NULL});
    CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err);
    CHECK_CONTAINS(r.out, "14 linears quantized to W8A8_DYNAMIC (dense recipe)");
    tu_run_free(&r);
    ckpt c;
    CHECK(ckpt_open(out, &c));
    CHECK(c.index != NULL);
    if (c.index) check_shards(&c, 300000, 3);
    json_t *d = check_description(out, &c, "W8A8_DYNAMIC");
    check_against_source(&c, VEC "qwen3-dense-bf16", dense_linear, false);
    check_against_reference(out, &c, d, "qwen3-dense-w8a8-dynamic");
    static const char *const copied[] = {"config.json", "generation_config.json", "tokenizer.json",
                                         "tokenizer_config.json"};
    for (size_t i = 0; i < CV_ARRAY_LEN(copied); i++) {
        char *a = cv_xasprintf("%s/%s", model, copied[i]), *b = cv_xasprintf("%s/%s", out, copied[i]);
        CHECK_MSG(same_file(a, b), "%s", copied[i]);
        free(a);
        free(b);
    }
    json_decref(d);
    ckpt_close(&c);
    tu_remove_tree(model);
    free(model);
    free(out);
}

/* Qwen3.5-MoE: the default recipe is moe — attention q/k/v and the routed experts, split per expert
 * out of the fused tensors; o_proj, the Gated DeltaNet, router, shared expert, mtp.* (still fused)
 * and model.visual.* stay FLOAT. */
static void test_dynamic_moe(void) {
    char *model = model_dir("qwen3.5-moe-bf16", true), *out = tmp_path("moe-dynamic");
    tu_run r = quantize((const char *[]){model, out, "--scheme", "W8A8_DYNAMIC", "--max-shard-size", "1000000", NULL});
    CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err);
    CHECK_CONTAINS(r.out, "99 linears quantized to W8A8_DYNAMIC (moe recipe)"); /* 4 layers × 8 experts × 3 + q, k, v */
    tu_run_free(&r);
    ckpt c;
    CHECK(ckpt_open(out, &c));
    if (c.index) check_shards(&c, 1000000, 2);
    json_t *d = check_description(out, &c, "W8A8_DYNAMIC");
    cv_checkpoint *src;
    CHECK_EQ_INT(cv_checkpoint_open(VEC "qwen3.5-moe-bf16", &src), 0);
    for (int layer = 0; layer < 4; layer++) {
        char *gu = cv_xasprintf("model.language_model.layers.%d.mlp.experts.gate_up_proj", layer);
        char *dn = cv_xasprintf("model.language_model.layers.%d.mlp.experts.down_proj", layer);
        const cv_tensor *g = cv_checkpoint_find(src, gu), *w2 = cv_checkpoint_find(src, dn);
        CHECK(g && w2 && !ckpt_find(&c, gu) && !ckpt_find(&c, dn));
        for (int64_t e = 0; g && w2 && e < g->shape[0]; e++) {
            const int64_t inter = g->shape[1] / 2, hidden = g->shape[2];
            char *p = cv_xasprintf("model.language_model.layers.%d.mlp.experts.%lld", layer, (long long)e);
            char *gp = cv_xasprintf("%s.gate_proj", p), *up = cv_xasprintf("%s.up_proj", p);
            char *dp = cv_xasprintf("%s.down_proj", p);
            check_linear(&c, gp, g, e * 2 * inter, inter, hidden, false);
            check_linear(&c, up, g, e * 2 * inter + inter, inter, hidden, false);
            check_linear(&c, dp, w2, e * w2->shape[1], w2->shape[1], w2->shape[2], false);
            free(p), free(gp), free(up), free(dp);
        }
        free(gu);
        free(dn);
    }
    static const char *const floats[] = {
        "model.language_model.layers.3.self_attn.o_proj.weight", "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.language_model.layers.0.mlp.gate.weight", "model.language_model.layers.0.mlp.shared_expert.gate_proj.weight",
        "model.language_model.layers.0.mlp.shared_expert_gate.weight", "mtp.layers.0.mlp.experts.gate_up_proj",
        "mtp.layers.0.self_attn.q_proj.weight", "model.visual.blocks.0.attn.qkv.weight",
        "model.language_model.embed_tokens.weight", "lm_head.weight"};
    for (size_t i = 0; i < CV_ARRAY_LEN(floats); i++) {
        const cv_tensor *o = ckpt_find(&c, floats[i]), *s = cv_checkpoint_find(src, floats[i]);
        CHECK_MSG(o && s && same_tensor(o, s), "%s", floats[i]);
        CHECK_STR_EQ(json_string_value(json_object_get(d, floats[i])), "FLOAT");
    }
    cv_checkpoint_close(src);
    check_against_reference(out, &c, d, "qwen3.5-moe-w8a8-dynamic");
    json_decref(d);
    ckpt_close(&c);
    tu_remove_tree(model);
    free(model);
    free(out);
}

/* Qwen3-MoE keeps its per-expert tensors; --recipe picks which linears. */
static bool moe_linear(const char *name) {
    return dense_linear(name) && !strstr(name, ".o_proj.");
}

static void test_recipes_qwen3_moe(void) {
    char *model = model_dir("qwen3-moe-bf16", false);
    const struct { const char *recipe; bool (*quantized)(const char *); } cases[] = {
        {NULL, moe_linear}, {"dense", dense_linear}};
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        char *out = cv_xasprintf("%s/qwen3-moe-%zu", tmp, i);
        tu_run r = quantize(cases[i].recipe
                                ? (const char *[]){model, out, "--scheme", "w8a8_dynamic", "--recipe", cases[i].recipe, NULL}
                                : (const char *[]){model, out, "--scheme", "w8a8_dynamic", NULL});
        CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err);
        tu_run_free(&r);
        ckpt c;
        CHECK(ckpt_open(out, &c));
        CHECK(c.index != NULL);
        json_decref(check_description(out, &c, "W8A8_DYNAMIC"));
        check_against_source(&c, VEC "qwen3-moe-bf16", cases[i].quantized, false);
        ckpt_close(&c);
        free(out);
    }
    tu_remove_tree(model);
    free(model);
}

/* ---- static ------------------------------------------------------------------------------------ */

/* Prompts whose Qwen3 tokens all lie below the reference models' 4096-token vocabulary; one is a JSON
 * string line with a newline. */
static const char calibration[] = "3.14159 + 2.71828 = 5.85987\n"
                                  "int x = a[i] + b[j] * 2;\n"
                                  "\n"
                                  "\"a b c d e f g,\\n h i j k.\"\n"
                                  "It is the end of the day, and he is in the room.\n";
static const char *const calibration_prompts[] = {"3.14159 + 2.71828 = 5.85987", "int x = a[i] + b[j] * 2;",
                                                  "a b c d e f g,\n h i j k.",
                                                  "It is the end of the day, and he is in the room."};

/* Every observed linear's [min, max], and every routed expert's folded into "….experts.*.PROJ". */
static void record(void *ctx, const char *linear, const float *x, int64_t rows, int64_t cols) {
    char group[256] = "";
    const char *e = strstr(linear, ".experts.");
    if (e && e[9] >= '0' && e[9] <= '9') snprintf(group, sizeof group, "%.*s.experts.*%s", (int)(e - linear), linear,
                                                  strchr(e + 9, '.'));
    const char *names[2] = {linear, group};
    for (int n = 0; n < (group[0] ? 2 : 1); n++) {
        json_t *r = json_object_get(ctx, names[n]);
        double lo = r ? json_real_value(json_array_get(r, 0)) : INFINITY, hi = r ? json_real_value(json_array_get(r, 1)) : -INFINITY;
        for (int64_t i = 0; i < rows * cols; i++) lo = fmin(lo, x[i]), hi = fmax(hi, x[i]);
        json_object_set_new(ctx, names[n], json_pack("[f,f]", lo, hi));
    }
}

/* The model of `dir` over the prompts, each in one forward call, observed into a JSON
 * object linear → [min, max]. */
static json_t *observe_ranges(const char *dir, const char *const *prompts, size_t n_prompts) {
    cv_model_config cfg;
    cv_weight_source *src;
    cv_tokenizer *tok;
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &src), 0);
    CHECK_EQ_INT(cv_tokenizer_load(dir, &tok), 0);
    cv_threadpool *pool = cv_threadpool_create(1);
    json_t *ranges = json_object();
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 64,
                              .observe = record, .observe_ctx = ranges};
    cv_model *m = NULL;
    CHECK_EQ_INT(cv_model_load(&p, &m), 0);
    const int32_t blocks = 4, block = 16;
    const size_t floats = (size_t)blocks * block * (size_t)m->kv_spec.num_kv_heads * (size_t)m->kv_spec.head_dim;
    cv_kv_cache kv = {.num_blocks = blocks, .block_size = block, .k = calloc((size_t)m->kv_spec.num_layers + 1, sizeof(float *)),
                      .v = calloc((size_t)m->kv_spec.num_layers + 1, sizeof(float *))};
    for (int l = 0; l < m->kv_spec.num_layers; l++) kv.k[l] = malloc(floats * 4), kv.v[l] = malloc(floats * 4);
    cv_state_cache state = {0};
    if (m->state_bytes_per_seq)
        state = (cv_state_cache){.num_slots = 1, .slot_bytes = m->state_bytes_per_seq, .data = cv_aligned_alloc(m->state_bytes_per_seq)};
    float *logits = malloc((size_t)m->vocab_size * sizeof *logits);
    const int32_t table[4] = {0, 1, 2, 3}, *tables[1] = {table}, slot = 0;
    for (size_t i = 0; i < n_prompts; i++) {
        int32_t *ids;
        size_t n;
        CHECK_EQ_INT(cv_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), &ids, &n), 0);
        CHECK(n > 0 && n <= 64);
        int32_t pos[64], starts[2] = {0, (int32_t)n}, context = (int32_t)n, last = (int32_t)n - 1;
        int64_t slots[64];
        for (size_t t = 0; t < n; t++) pos[t] = (int32_t)t, slots[t] = (int64_t)t;
        cv_batch b = {.n_tokens = (int32_t)n, .token_ids = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                      .seq_start = starts, .context_lens = &context, .block_tables = tables,
                      .state_slots = state.data ? &slot : NULL, .n_logits = 1, .logit_rows = &last};
        CHECK_EQ_INT(m->ops->forward(m, &b, &kv, state.data ? &state : NULL, logits), 0);
        free(ids);
    }
    for (int l = 0; l < m->kv_spec.num_layers; l++) free(kv.k[l]), free(kv.v[l]);
    free(kv.k), free(kv.v), free(state.data), free(logits);
    cv_model_free(m);
    cv_threadpool_free(pool);
    cv_tokenizer_free(tok);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
    return ranges;
}

static float act_code(float x, float s, float o) { return fminf(fmaxf(nearbyintf(x / s + o), -128), 127); }

/* Each stored input_scale / input_offset against the observed range of its linear (or group). */
static void check_static_params(const ckpt *out, const json_t *ranges, size_t expect_group) {
    size_t n = 0, group = 0;
    for (size_t i = 0; i < out->n; i++) {
        const char *name = out->tensors[i].name, *suffix = strstr(name, ".input_scale");
        if (!suffix || suffix[12]) continue;
        char *linear = cv_xstrndup(name, (size_t)(suffix - name)), *offset = cv_xasprintf("%s.input_offset", linear);
        json_t *r = json_object_get(ranges, linear);
        if (!r) { /* a routed expert no token reached: its group */
            const char *e = strstr(linear, ".experts.");
            char *g = e ? cv_xasprintf("%.*s.experts.*%s", (int)(e - linear), linear, strchr(e + 9, '.')) : NULL;
            r = g ? json_object_get(ranges, g) : NULL;
            group += r != NULL;
            free(g);
        }
        const cv_tensor *ot = ckpt_find(out, offset);
        CHECK_MSG(r && ot, "%s: no observed range, or no input_offset", linear);
        if (r && ot) {
            const float s = *(const float *)out->tensors[i].data, o = *(const float *)ot->data;
            const float lo = fminf((float)json_real_value(json_array_get(r, 0)), 0);
            const float hi = fmaxf((float)json_real_value(json_array_get(r, 1)), 0);
            const float exact = (float)(((double)hi - lo) / 255.0);
            CHECK_MSG(s <= exact && s >= exact * (1 - 1e-5f), "%s: input_scale %a for %g..%g", linear, (double)s,
                      (double)lo, (double)hi);
            CHECK_MSG(o == nearbyintf(o) && act_code(lo, s, o) == -128 && act_code(hi, s, o) == 127 &&
                          act_code(0, s, o) == o,
                      "%s: input_offset %g", linear, (double)o);
            n++;
        }
        free(linear);
        free(offset);
    }
    CHECK_MSG(n > 0, "no input_scale checked");
    CHECK_EQ_INT(group, expect_group);
}

static void test_static_dense(void) {
    char *model = model_dir("qwen3-dense-bf16", true), *out = tmp_path("dense-static");
    char *cal = tmp_path("calibration.txt");
    tu_run r = quantize((const char *[]){model, out, "--scheme", "w8a8", "--calibration", cal, NULL});
    CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err);
    CHECK_CONTAINS(r.out, "14 linears quantized to W8A8 (dense recipe)");
    CHECK_CONTAINS(r.err, "calibrating on 4 prompts");
    tu_run_free(&r);
    ckpt c;
    CHECK(ckpt_open(out, &c));
    json_decref(check_description(out, &c, "W8A8"));
    check_against_source(&c, VEC "qwen3-dense-bf16", dense_linear, true);
    json_t *ranges = observe_ranges(model, calibration_prompts, CV_ARRAY_LEN(calibration_prompts));
    check_static_params(&c, ranges, 0);
    json_decref(ranges);
    ckpt_close(&c);
    tu_remove_tree(model);
    free(model), free(out), free(cal);
}

/* An fp16 model (the bf16 reference converted, config dtype float16): FLOAT tensors stay f16 and
 * deq_scale is int64-encoded, as msModelSlim writes it for fp16 models. */
static void test_static_f16(void) {
    char *model = tu_make_temp_dir();
    json_t *cfg = json_load_file(VEC "qwen3-dense-bf16/config.json", 0, NULL);
    json_object_set_new(cfg, "torch_dtype", json_string("float16"));
    char *text = json_dumps(cfg, JSON_INDENT(2));
    tu_write_file(model, "config.json", text, strlen(text));
    free(text);
    json_decref(cfg);
    static const char *tok[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < CV_ARRAY_LEN(tok); i++) {
        char *t = cv_xasprintf("%s/models/qwen3-tokenizer/%s", CVLLM_SOURCE_DIR, tok[i]);
        tu_link(t, model, tok[i]);
        free(t);
    }
    cv_checkpoint *src;
    CHECK_EQ_INT(cv_checkpoint_open(VEC "qwen3-dense-bf16", &src), 0);
    cv_st_writer *w = cv_st_writer_create();
    uint16_t **copies = calloc(cv_checkpoint_count(src), sizeof *copies);
    for (size_t i = 0; i < cv_checkpoint_count(src); i++) {
        const cv_tensor *t = cv_checkpoint_tensor(src, i);
        const size_t n = (size_t)cv_tensor_numel(t);
        copies[i] = malloc(n * 2);
        for (size_t k = 0; k < n; k++) copies[i][k] = cv_f32_to_f16(cv_bf16_to_f32(((const uint16_t *)t->data)[k]));
        cv_st_writer_add(w, t->name, CV_DTYPE_F16, t->ndim, t->shape, copies[i], NULL, NULL);
    }
    int shards;
    CHECK_EQ_INT(cv_st_writer_write(w, model, "model", 1u << 30, &shards), 0);
    cv_st_writer_free(w);
    for (size_t i = 0; i < cv_checkpoint_count(src); i++) free(copies[i]);
    free(copies);
    cv_checkpoint_close(src);

    char *out = tmp_path("f16-static"), *cal = tmp_path("calibration.txt");
    tu_run r = quantize((const char *[]){model, out, "--scheme", "w8a8", "--calibration", cal, NULL});
    CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err);
    tu_run_free(&r);
    ckpt c;
    CHECK(ckpt_open(out, &c));
    json_decref(check_description(out, &c, "W8A8"));
    check_against_source(&c, model, dense_linear, true);
    const cv_tensor *deq = ckpt_find(&c, "model.layers.0.mlp.down_proj.deq_scale");
    const cv_tensor *norm = ckpt_find(&c, "model.norm.weight");
    CHECK(deq && deq->dtype == CV_DTYPE_I64 && norm && norm->dtype == CV_DTYPE_F16);
    json_t *ranges = observe_ranges(model, calibration_prompts, CV_ARRAY_LEN(calibration_prompts));
    check_static_params(&c, ranges, 0);
    json_decref(ranges);
    ckpt_close(&c);
    tu_remove_tree(model);
    free(model), free(out), free(cal);
}

/* W8A8 with the moe recipe on Qwen3.5-MoE: per-expert static tensors; calibrated on three tokens,
 * so most experts see none and take their group's range. */
static void test_static_moe(void) {
    char *model = model_dir("qwen3.5-moe-bf16", true), *out = tmp_path("moe-static"), *cal = tmp_path("short.txt");
    static const char *const prompt[] = {"1+2"};
    tu_write_file(tmp, "short.txt", "1+2\n", 4);
    tu_run r = quantize((const char *[]){model, out, "--scheme", "w8a8", "--calibration", cal, NULL});
    CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err);
    CHECK_CONTAINS(r.out, "99 linears quantized to W8A8 (moe recipe)");
    CHECK_CONTAINS(r.err, "routed experts that no calibration token reached take the range of all experts");
    tu_run_free(&r);
    ckpt c;
    CHECK(ckpt_open(out, &c));
    json_decref(check_description(out, &c, "W8A8"));
    json_t *ranges = observe_ranges(model, prompt, 1);
    size_t unreached = 0;
    cv_checkpoint *src;
    CHECK_EQ_INT(cv_checkpoint_open(VEC "qwen3.5-moe-bf16", &src), 0);
    for (int layer = 0; layer < 4; layer++) {
        char *gu = cv_xasprintf("model.language_model.layers.%d.mlp.experts.gate_up_proj", layer);
        const cv_tensor *g = cv_checkpoint_find(src, gu);
        for (int64_t e = 0; g && e < g->shape[0]; e++) {
            const int64_t inter = g->shape[1] / 2, hidden = g->shape[2];
            char *up = cv_xasprintf("model.language_model.layers.%d.mlp.experts.%lld.up_proj", layer, (long long)e);
            check_linear(&c, up, g, e * 2 * inter + inter, inter, hidden, true);
            unreached += json_object_get(ranges, up) == NULL;
            free(up);
        }
        free(gu);
    }
    cv_checkpoint_close(src);
    CHECK(unreached > 0);
    check_static_params(&c, ranges, 3 * unreached); /* gate, up and down of each */
    json_decref(ranges);
    ckpt_close(&c);
    tu_remove_tree(model);
    free(model), free(out), free(cal);
}

/* ---- through the engine -------------------------------------------------------------------------- */

/* `cvllm generate DIR --quantization ascend` greedily from the prompt of VEC/REF/ref.long150.json:
 * the generated ids as JSON text ("" when it failed). */
static char *generate(const char *dir, const char *ref, int max_tokens) {
    char *path = cv_xasprintf(VEC "%s/ref.long150.json", ref);
    json_t *j = json_load_file(path, 0, NULL);
    free(path);
    char ids[4096] = "", max[16];
    size_t i, n = 0;
    json_t *v;
    json_array_foreach(json_object_get(j, "prompt"), i, v) n += (size_t)snprintf(ids + n, sizeof ids - n, "%s%lld", i ? "," : "",
                                                                                   (long long)json_integer_value(v));
    json_decref(j);
    snprintf(max, sizeof max, "%d", max_tokens);
    /* A small KV cache: the engine's default budget takes seconds to touch under the sanitizers. */
    const char *argv[] = {"generate", dir, "--prompt-token-ids", ids, "--max-tokens", max, "--temperature", "0",
                          "--quantization", "ascend", "--output", "json", "--max-model-len", "512",
                          "--kv-cache-memory-bytes", "16M", NULL};
    tu_run r = tu_run_exec(tmp, NULL, NULL, CVLLM_BINARY, argv);
    CHECK_MSG(r.status == 0, "generate %s: exit %d: %s", dir, r.status, tu_last_line(r.err));
    json_t *o = r.status == 0 ? json_loads(r.out, 0, NULL) : NULL;
    char *got = o ? json_dumps(json_object_get(json_array_get(json_object_get(o, "outputs"), 0), "token_ids"), JSON_COMPACT)
                  : NULL;
    json_decref(o);
    tu_run_free(&r);
    return got ? got : cv_xstrdup("");
}

/* The outputs load through the engine with --quantization ascend. A W8A8_DYNAMIC output generates
 * what its quantized reference folder generates (the same bytes in another file layout); every
 * output, W8A8 static included, predicts the reference's token after the long prompt, whose margin
 * (0.07 dense, 0.22 MoE) int8 quantization keeps. */
static void test_engine_loads(void) {
    const struct { const char *out, *reference; bool same_as_reference; } cases[] = {
        {"dense-dynamic", "qwen3-dense-w8a8-dynamic", true}, {"moe-dynamic", "qwen3.5-moe-w8a8-dynamic", true},
        {"dense-static", "qwen3-dense-bf16", false},         {"f16-static", "qwen3-dense-bf16", false},
        {"moe-static", "qwen3.5-moe-bf16", false},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        char *out = tmp_path(cases[i].out), *ref_path = cv_xasprintf(VEC "%s/ref.long150.json", cases[i].reference);
        json_t *ref = json_load_file(ref_path, 0, NULL);
        char want[32];
        snprintf(want, sizeof want, "[%lld", (long long)json_integer_value(json_object_get(ref, "prefill_last_argmax")));
        char *a = generate(out, cases[i].reference, cases[i].same_as_reference ? 8 : 1);
        CHECK_MSG(!strncmp(a, want, strlen(want)) && strchr(",]", a[strlen(want)]), "%s: generated %s, reference first %s]",
                  cases[i].out, a, want);
        if (cases[i].same_as_reference) {
            /* The reference folder with the tokenizer beside it. */
            char *ref_dir = tu_make_temp_dir(), *from = cv_xasprintf(VEC "%s", cases[i].reference);
            DIR *d = opendir(from);
            for (struct dirent *e; d && (e = readdir(d));) {
                if (e->d_name[0] == '.') continue;
                char *t = cv_xasprintf("%s/%s", from, e->d_name);
                tu_link(t, ref_dir, e->d_name);
                free(t);
            }
            if (d) closedir(d);
            tu_link(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer/tokenizer.json", ref_dir, "tokenizer.json");
            char *b = generate(ref_dir, cases[i].reference, 8);
            CHECK_MSG(a[0] && !strcmp(a, b), "%s generates %s, %s generates %s", cases[i].out, a, cases[i].reference, b);
            tu_remove_tree(ref_dir);
            free(b), free(ref_dir), free(from);
        }
        free(a), free(out), free(ref_path);
        json_decref(ref);
    }
}

/* ---- errors ------------------------------------------------------------------------------------- */

/* Exit status and the last stderr line; OUT must not have been created. */
static void expect_error(const char *const *args, int status, const char *line, const char *out) {
    tu_run r = quantize(args);
    CHECK_MSG(r.status == status, "exit %d, want %d: %s", r.status, status, r.err);
    char *last = cv_xstrdup(tu_last_line(r.err));
    last[strcspn(last, "\n")] = '\0';
    CHECK_STR_EQ(last, line);
    free(last);
    struct stat st;
    if (out) CHECK_MSG(stat(out, &st) != 0, "%s was left behind", out);
    tu_run_free(&r);
}

static void test_errors(void) {
    char *model = model_dir("qwen3-dense-bf16", true), *no_tok = model_dir("qwen3-dense-bf16", false);
    char *out = tmp_path("never"), *full = tmp_path("full"), *file = tmp_path("a-file");
    char *missing = tmp_path("no-such-model"), *empty_dir = tmp_path("empty-model");
    char *prompts_empty = tmp_path("empty.txt"), *prompts_big = tmp_path("big-ids.txt");
    CHECK(mkdir(full, 0755) == 0 && mkdir(empty_dir, 0755) == 0);
    tu_write_file(full, "x", "x", 1);
    tu_write_file(tmp, "a-file", "x", 1);
    tu_write_file(tmp, "empty.txt", "\n\n\r\n", 4);
    tu_write_file(tmp, "big-ids.txt", "12 34\nHello world\n", 18);
    /* A folder that already holds an msModelSlim description, and a config with a quantization_config. */
    char *described = model_dir("qwen3-dense-bf16", true), *configured = tu_make_temp_dir();
    tu_write_file(described, "quant_model_description.json", "{}", 2);
    char *cfg_path = cv_xasprintf(VEC "%s/config.json", "qwen3-dense-bf16");
    json_t *cfg = json_load_file(cfg_path, 0, NULL);
    json_object_set_new(cfg, "quantization_config", json_pack("{s:s, s:s, s:[i,i]}", "quant_method", "fp8", "fmt",
                                                              "e4m3", "weight_block_size", 128, 128));
    char *cfg_text = json_dumps(cfg, JSON_INDENT(2));
    tu_write_file(configured, "config.json", cfg_text, strlen(cfg_text));
    char *weights = cv_xasprintf(VEC "%s/model.safetensors", "qwen3-dense-bf16");
    tu_link(weights, configured, "model.safetensors");
    /* An architecture the registry does not know. */
    char *llama = tu_make_temp_dir();
    json_object_del(cfg, "quantization_config");
    json_object_set_new(cfg, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    char *llama_text = json_dumps(cfg, JSON_INDENT(2));
    tu_write_file(llama, "config.json", llama_text, strlen(llama_text));
    tu_link(weights, llama, "model.safetensors");
    char *m_llama = cv_xasprintf("cvllm quantize: architecture LlamaForCausalLM is not supported (supported: %s)",
                                 cv_model_supported_architectures());

    char *m_missing = cv_xasprintf("cvllm quantize: model %s: no such folder, and not a hub id (ORG/NAME)", missing);
    char *m_no_config = cv_xasprintf("cvllm quantize: %s/config.json: No such file or directory", empty_dir);
    char *m_full = cv_xasprintf("cvllm quantize: %s exists and is not empty; give a new or empty folder", full);
    char *m_file = cv_xasprintf("cvllm quantize: %s exists and is not a folder", file);
    char *m_described = cv_xasprintf("cvllm quantize: %s is already quantized (%s/quant_model_description.json "
                                     "declares it); give a float checkpoint", described, described);
    char *m_configured = cv_xasprintf("cvllm quantize: %s is already quantized (%s/config.json declares it); give a "
                                      "float checkpoint", configured, configured);
    char *m_unreadable = cv_xasprintf("cvllm quantize: cannot read %s: No such file or directory", missing);
    char *m_dir = cv_xasprintf("cvllm quantize: cannot read %s: Is a directory", full);
    char *m_empty = cv_xasprintf("cvllm quantize: calibration file %s holds no prompts", prompts_empty);
    char *m_no_tok = cv_xasprintf("cvllm quantize: %s/tokenizer.json is missing: W8A8 calibration tokenizes its "
                                  "prompts with the model's tokenizer", no_tok);
    const struct {
        const char *args[10];
        int status;
        const char *line;
    } cases[] = {
        {{model, NULL}, 2, "cvllm quantize: give MODEL and OUT (see cvllm quantize --help)"},
        {{model, out, NULL}, 2, "cvllm quantize: --scheme is required: w8a8 or w8a8_dynamic"},
        {{model, out, "x", "--scheme", "w8a8", NULL}, 2,
         NULL /* filled below */},
        {{model, out, "--scheme", "w4a8", NULL}, 2, "cvllm quantize: unknown --scheme 'w4a8' (choose w8a8 or w8a8_dynamic)"},
        {{model, out, "--scheme", "w8a8", "--recipe", "all", NULL}, 2,
         "cvllm quantize: unknown --recipe 'all' (choose dense or moe)"},
        {{model, out, "--scheme", "w8a8", "--max-shard-size", "5XB", NULL}, 2,
         "cvllm quantize: --max-shard-size '5XB' is not a size (5GB, 500MB, 2GiB or a number of bytes)"},
        {{model, out, "--scheme", "w8a8", "--max-shard-size", "0", NULL}, 2,
         "cvllm quantize: --max-shard-size '0' is not a size (5GB, 500MB, 2GiB or a number of bytes)"},
        {{model, out, "--scheme", "w8a8_dynamic", "--calibration", prompts_big, NULL}, 2,
         "cvllm quantize: --calibration only applies to --scheme w8a8 (w8a8_dynamic needs no calibration)"},
        {{model, out, "--scheme", "w8a8", "--bogus", NULL}, 2, "cvllm quantize: unknown option --bogus (see cvllm quantize --help)"},
        {{missing, out, "--scheme", "w8a8_dynamic", NULL}, 1, m_missing},
        {{missing, out, "--scheme", "int4", NULL}, 2, "cvllm quantize: unknown --scheme 'int4' (choose w8a8 or w8a8_dynamic)"},
        {{llama, out, "--scheme", "w8a8_dynamic", NULL}, 1, m_llama},
        {{empty_dir, out, "--scheme", "w8a8_dynamic", NULL}, 1, m_no_config},
        {{model, full, "--scheme", "w8a8_dynamic", NULL}, 1, m_full},
        {{model, file, "--scheme", "w8a8_dynamic", NULL}, 1, m_file},
        {{described, out, "--scheme", "w8a8_dynamic", NULL}, 1, m_described},
        {{configured, out, "--scheme", "w8a8_dynamic", NULL}, 1, m_configured},
        {{model, out, "--scheme", "w8a8", "--calibration", missing, NULL}, 1, m_unreadable},
        {{model, out, "--scheme", "w8a8", "--calibration", full, NULL}, 1, m_dir},
        {{model, out, "--scheme", "w8a8", "--calibration", prompts_empty, NULL}, 1, m_empty},
        {{no_tok, out, "--scheme", "w8a8", NULL}, 1, m_no_tok},
        {{model, out, "--scheme", "w8a8", "--calibration", prompts_big, NULL}, 1,
         "cvllm quantize: calibration prompt 2: token id 9707 is outside the model's vocabulary (vocab_size 4096)"},
    };
    char *m_extra = cv_xasprintf("cvllm quantize: unexpected argument 'x' (MODEL is '%s', OUT is '%s')", model, out);
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++)
        expect_error(cases[i].args, cases[i].status, cases[i].line ? cases[i].line : m_extra, out);
    /* A non-empty OUT is left as it was. */
    char *kept = cv_xasprintf("%s/x", full);
    CHECK(same_file(kept, file));
    free(kept);

    tu_run r = quantize((const char *[]){"--help", NULL});
    CHECK_EQ_INT(r.status, 0);
    CHECK_CONTAINS(r.out, "usage: cvllm quantize MODEL OUT --scheme w8a8|w8a8_dynamic");
    tu_run_free(&r);

    free(m_missing), free(m_no_config), free(m_full), free(m_file), free(m_described), free(m_configured);
    free(m_unreadable), free(m_dir), free(m_empty), free(m_no_tok), free(m_extra);
    free(cfg_text), free(cfg_path), free(weights), free(llama_text), free(m_llama);
    tu_remove_tree(llama);
    free(llama);
    json_decref(cfg);
    tu_remove_tree(described), tu_remove_tree(configured), tu_remove_tree(model), tu_remove_tree(no_tok);
    free(described), free(configured), free(model), free(no_tok);
    free(out), free(full), free(file), free(missing), free(empty_dir), free(prompts_empty), free(prompts_big);
}

/* A weight that cannot be quantized is found while the shards are written (after the first ones):
 * the run fails with one line and removes what it wrote — OUT itself when it made it, only its
 * contents when OUT was an empty folder already. */
static void test_failed_write(void) {
    char *model = tu_make_temp_dir();
    static const char *files[] = {"config.json", "generation_config.json"};
    for (size_t i = 0; i < CV_ARRAY_LEN(files); i++) {
        char *t = cv_xasprintf(VEC "qwen3-dense-bf16/%s", files[i]);
        tu_link(t, model, files[i]);
        free(t);
    }
    cv_checkpoint *src;
    CHECK_EQ_INT(cv_checkpoint_open(VEC "qwen3-dense-bf16", &src), 0);
    cv_st_writer *w = cv_st_writer_create();
    uint16_t *bad = NULL;
    for (size_t i = 0; i < cv_checkpoint_count(src); i++) {
        const cv_tensor *t = cv_checkpoint_tensor(src, i);
        const void *data = t->data;
        if (!strcmp(t->name, "model.layers.1.mlp.up_proj.weight")) {
            bad = malloc(t->nbytes);
            memcpy(bad, t->data, t->nbytes);
            bad[3 * t->shape[1] + 5] = 0x7f80; /* +inf */
            data = bad;
        }
        cv_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, data, NULL, NULL);
    }
    int shards;
    CHECK_EQ_INT(cv_st_writer_write(w, model, "model", 1u << 30, &shards), 0);
    cv_st_writer_free(w);
    free(bad);
    cv_checkpoint_close(src);
    char *out = tmp_path("failed"), *empty = tmp_path("failed-empty");
    const char *line = "cvllm quantize: model.layers.1.mlp.up_proj.weight: weight [3, 5] is inf; only finite weights "
                       "can be quantized";
    expect_error((const char *[]){model, out, "--scheme", "w8a8_dynamic", "--max-shard-size", "100KB", NULL}, 1, line, out);
    CHECK(mkdir(empty, 0755) == 0);
    expect_error((const char *[]){model, empty, "--scheme", "w8a8_dynamic", "--max-shard-size", "100KB", NULL}, 1, line, NULL);
    const int entries = tu_dir_entries(empty);
    CHECK_MSG(entries == 0, "%d files left in %s", entries, empty);
    tu_remove_tree(model);
    free(model), free(out), free(empty);
}

int main(void) {
    tmp = tu_make_temp_dir();
    tu_write_file(tmp, "calibration.txt", calibration, strlen(calibration));
    test_dynamic_dense();
    test_dynamic_moe();
    test_recipes_qwen3_moe();
    test_static_dense();
    test_static_f16();
    test_static_moe();
    test_engine_loads();
    test_errors();
    test_failed_write();
    tu_remove_tree(tmp);
    free(tmp);
    return cv_check_summary("test_cli_quantize");
}
