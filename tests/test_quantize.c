/*
 * test_quantize.c — the loader pieces of `cvllm quantize`: the int8 arithmetic (weights per channel
 * with ties rounded to even, the static activation mapping's round trip min → −128, max → 127,
 * 0 → offset, deq_scale and quant_bias, the int64 deq_scale encoding), the safetensors writer
 * (Hugging Face's sharding, alignment, the index, refusals), the recipes' classification of tensor
 * names, and the export's refusals of what it cannot quantize. The end-to-end results are
 * test_cli_quantize's.
 */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "check.h"
#include "loader/quant_export.h"
#include "loader/quant_recipe.h"
#include "loader/quantize.h"
#include "loader/safetensors.h"
#include "loader/safetensors_write.h"
#include "testutil.h"

/* ---- weights ------------------------------------------------------------------------------------ */

static void test_weight_codes(cv_threadpool *pool) {
    /* Row 0: max 127 → scale 1, so the codes are the values rounded half to even. Row 1: zeros. Row 2:
     * a scale that is not a power of two. */
    const float w[3][8] = {{127, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, -127},
                           {0, 0, 0, 0, 0, 0, 0, 0},
                           {0.1f, -0.3f, 0.2f, 0.05f, 0, -0.15f, 0.25f, 0.3f}};
    const int8_t want0[8] = {127, 2, 4, -2, 0, 0, 2, -127};
    uint16_t bf[3][8], f16[3][8];
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 8; k++) bf[r][k] = cv_f32_to_bf16(w[r][k]), f16[r][k] = cv_f32_to_f16(w[r][k]);
    const cv_quant_matrix ms[] = {{w, CV_DTYPE_F32, 3, 8}, {bf, CV_DTYPE_BF16, 3, 8}, {f16, CV_DTYPE_F16, 3, 8}};
    for (size_t m = 0; m < CV_ARRAY_LEN(ms); m++) {
        float scale[3];
        int8_t codes[3][8], serial[3][8];
        int32_t sums[3];
        CHECK_EQ_INT(cv_quant_weight_scales(pool, &ms[m], scale), 0);
        cv_quant_weight_codes(pool, &ms[m], scale, &codes[0][0]);
        cv_quant_weight_codes(NULL, &ms[m], scale, &serial[0][0]);
        cv_quant_weight_code_sums(pool, &ms[m], scale, sums);
        CHECK(memcmp(codes, serial, sizeof codes) == 0);
        CHECK(scale[0] == 1.0f && scale[1] == 0.0f);
        CHECK(memcmp(codes[0], want0, 8) == 0);
        CHECK(memcmp(codes[1], (int8_t[8]){0}, 8) == 0);
        float max = 0;
        for (int k = 0; k < 8; k++) {
            float v;
            cv_convert_to_f32(&v, (const char *)ms[m].data + (16 + k) * cv_dtype_size(ms[m].dtype), ms[m].dtype, 1);
            max = fmaxf(max, fabsf(v));
        }
        CHECK(scale[2] == max / 127.0f && codes[2][7] == 127 && codes[2][1] == -127);
        for (int r = 0; r < 3; r++) {
            int32_t s = 0;
            for (int k = 0; k < 8; k++) s += codes[r][k];
            CHECK_EQ_INT(sums[r], s);
        }
    }
    float bad[2][3] = {{1, 2, 3}, {4, INFINITY, 6}}, scale[2];
    CHECK_EQ_INT(cv_quant_weight_scales(pool, &(cv_quant_matrix){bad, CV_DTYPE_F32, 2, 3}, scale), CVLLM_ERR_FORMAT);
    CHECK_STR_EQ(cv_error_message(), "weight [1, 1] is inf; only finite weights can be quantized");
    bad[1][1] = NAN;
    CHECK_EQ_INT(cv_quant_weight_scales(NULL, &(cv_quant_matrix){bad, CV_DTYPE_F32, 2, 3}, scale), CVLLM_ERR_FORMAT);
}

/* ---- activations -------------------------------------------------------------------------------- */

static float code_of(float x, float scale, float offset) {
    return fminf(fmaxf(nearbyintf(x / scale + offset), -128), 127);
}

static void check_round_trip(float lo, float hi) {
    cv_act_range r = {0};
    const float x[2] = {lo, hi};
    cv_act_range_update(&r, x, 2, 1, 1);
    float s, o;
    CHECK_EQ_INT(cv_act_static_params(&r, &s, &o), 0);
    const float l = fminf(lo, 0), h = fmaxf(hi, 0);
    const float exact = (float)(((double)h - l) / 255.0); /* lowered by a few ulps at most */
    CHECK_MSG(s <= exact && s >= exact * (1 - 1e-5f), "scale of %g..%g: %a, not %a", (double)lo, (double)hi,
              (double)s, (double)exact);
    CHECK_MSG(o == nearbyintf(o) && o >= -128 && o <= 127 && !(o == 0 && signbit(o)), "offset %g", (double)o);
    /* min and max within half a code of −128 and 127 (the offset's rounding), and on them after the
     * runtime's rounding and clamp; zero exactly on the offset. */
    CHECK_MSG(fabsf(l / s + o + 128) <= 0.5f + 1e-3f && code_of(l, s, o) == -128, "%g..%g: min → %g", (double)lo,
              (double)hi, (double)(l / s + o));
    CHECK_MSG(fabsf(h / s + o - 127) <= 0.5f + 1e-3f && code_of(h, s, o) == 127, "%g..%g: max → %g", (double)lo,
              (double)hi, (double)(h / s + o));
    CHECK(code_of(0, s, o) == o);
}

static void test_activation_params(void) {
    const float ranges[][2] = {{-3.75f, 3.72f}, {-0.13f, 0.0957f}, {-4.45f, 3.65f}, {-1, 1}, {0, 5}, {-5, 0},
                               {2, 7} /* widened to 0..7 */, {-9, -1}, {-1e-30f, 3e-30f}, {-3e38f, 3e38f}};
    for (size_t i = 0; i < CV_ARRAY_LEN(ranges); i++) check_round_trip(ranges[i][0], ranges[i][1]);
    uint64_t seed = 12345;
    for (int i = 0; i < 2000; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const float a = (float)((seed >> 40) % 100000) / 1000.0f;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const float b = (float)((seed >> 40) % 100000) / 1000.0f;
        check_round_trip(-a, b);
    }
    /* Every input zero: scale 1, offset 0. */
    cv_act_range r = {0};
    const float zeros[4] = {0};
    cv_act_range_update(&r, zeros, 2, 2, 2);
    float s, o;
    CHECK_EQ_INT(cv_act_static_params(&r, &s, &o), 0);
    CHECK(s == 1.0f && o == 0.0f && !signbit(o));
    /* Rows with a leading dimension: values past cols are not read. */
    const float strided[2][3] = {{1, -2, 100}, {3, -4, -100}};
    r = (cv_act_range){0};
    cv_act_range_update(&r, &strided[0][0], 2, 2, 3);
    CHECK(r.min == -4 && r.max == 3 && r.rows == 2);
    /* A NaN sticks; a non-finite range is refused. */
    const float nan_row[2] = {NAN, 1};
    cv_act_range_update(&r, nan_row, 1, 2, 2);
    cv_act_range_update(&r, strided[0], 1, 2, 2);
    CHECK(isnan(r.min) && r.rows == 4);
    CHECK_EQ_INT(cv_act_static_params(&r, &s, &o), CVLLM_ERR_FORMAT);
    r = (cv_act_range){.min = -INFINITY, .max = 1, .rows = 1};
    CHECK_EQ_INT(cv_act_static_params(&r, &s, &o), CVLLM_ERR_FORMAT);
}

static void test_static_tensors(void) {
    const float ws[3] = {0.5f, 0.01f, 3.0f};
    float deq[3];
    cv_quant_deq_scale(0.1f, ws, 3, deq);
    for (int i = 0; i < 3; i++) CHECK(deq[i] == 0.1f * ws[i]);
    const float f[3] = {1.0f, -1.0f, 0.1f};
    int64_t enc[3];
    cv_quant_deq_scale_i64(f, 3, enc);
    CHECK(enc[0] == 0x3f800000 && enc[1] == (int64_t)(int32_t)0xbf800000u && enc[2] == 0x3dcccccd);
    const int32_t sums[3] = {100, -37, 0};
    int32_t bias[3];
    CHECK_EQ_INT(cv_quant_bias(19.0f, sums, 3, bias), 0);
    CHECK(bias[0] == -1900 && bias[1] == 703 && bias[2] == 0);
    CHECK_EQ_INT(cv_quant_bias(-128.0f, (const int32_t[]){20000000}, 1, bias), CVLLM_ERR_UNSUPPORTED);
    CHECK_STR_EQ(cv_error_message(), "quant_bias of row 0 is 2560000000, outside int32");
}

static void test_ranges(void) {
    cv_act_ranges *r = cv_act_ranges_create();
    const float a[2] = {-1, 2}, b[3] = {5, -0.5f, 0};
    cv_act_ranges_observe(r, "model.layers.0.self_attn.q_proj", a, 1, 2);
    cv_act_ranges_observe(r, "model.layers.0.mlp.down_proj", b, 1, 3);
    cv_act_ranges_observe(r, "model.layers.0.self_attn.q_proj", b, 3, 1);
    const cv_act_range *q = cv_act_ranges_find(r, "model.layers.0.self_attn.q_proj");
    CHECK(q && q->min == -1 && q->max == 5 && q->rows == 4);
    const cv_act_range *d = cv_act_ranges_find(r, "model.layers.0.mlp.down_proj");
    CHECK(d && d->min == -0.5f && d->max == 5 && d->rows == 1);
    CHECK(cv_act_ranges_find(r, "model.layers.1.mlp.down_proj") == NULL);
    cv_act_ranges_free(r);
}

/* ---- the writer --------------------------------------------------------------------------------- */

static int fill_ramp(void *ctx, void *dst, size_t n) {
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)(i * 7 + (uintptr_t)ctx);
    return 0;
}

static int fill_fails(void *ctx, void *dst, size_t n) {
    return cv_fail(CVLLM_ERR_FORMAT, "no bytes today");
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*len);
    if (fread(b, 1, *len, f) != *len) *len = 0;
    fclose(f);
    return b;
}

static void test_writer(void) {
    char *dir = tu_make_temp_dir();
    static const float f32[6] = {1, 2, 3, 4, 5, 6};
    static const int64_t i64[2] = {-1, 1ll << 40};
    cv_st_writer *w = cv_st_writer_create();
    /* Sizes 3, 24, 16, 50, 8 with a 40-byte limit: [a b] would be 27 ≤ 40; c would take it to 43 →
     * new shard [c]; d (50) is larger than the limit → its own; e → a new shard. */
    cv_st_writer_add(w, "a.odd_i8", CV_DTYPE_I8, 1, (int64_t[]){3}, NULL, fill_ramp, (void *)1);
    cv_st_writer_add(w, "b.f32", CV_DTYPE_F32, 2, (int64_t[]){2, 3}, f32, NULL, NULL);
    cv_st_writer_add(w, "c.i64", CV_DTYPE_I64, 1, (int64_t[]){2}, i64, NULL, NULL);
    cv_st_writer_add(w, "d.big", CV_DTYPE_BF16, 2, (int64_t[]){5, 5}, NULL, fill_ramp, (void *)2);
    cv_st_writer_add(w, "e.scalar", CV_DTYPE_F32, 0, NULL, f32 + 5, NULL, NULL);
    CHECK_EQ_INT(cv_st_writer_count(w), 5);
    CHECK_EQ_INT(cv_st_writer_total_bytes(w), 3 + 24 + 16 + 50 + 4);
    int n = 0;
    CHECK_EQ_INT(cv_st_writer_write(w, dir, "out", 40, &n), 0);
    CHECK_EQ_INT(n, 4);
    cv_st_writer_free(w);
    char *index_path = cv_xasprintf("%s/out.safetensors.index.json", dir);
    json_t *index = json_load_file(index_path, 0, NULL);
    free(index_path);
    CHECK(index && json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")) == 97);
    const char *want_file[] = {"out-00001-of-00004.safetensors", "out-00001-of-00004.safetensors",
                               "out-00002-of-00004.safetensors", "out-00003-of-00004.safetensors",
                               "out-00004-of-00004.safetensors"};
    const char *names[] = {"a.odd_i8", "b.f32", "c.i64", "d.big", "e.scalar"};
    json_t *map = json_object_get(index, "weight_map");
    CHECK_EQ_INT(json_object_size(map), 5);
    for (int i = 0; i < 5; i++) CHECK_STR_EQ(json_string_value(json_object_get(map, names[i])), want_file[i]);
    /* The first shard: f32 first (aligned), then the odd int8 tensor; header padded to 8. */
    char *p = cv_xasprintf("%s/%s", dir, want_file[0]);
    size_t len = 0;
    char *buf = slurp(p, &len);
    cv_tensor *ts = NULL;
    size_t nt = 0;
    CHECK(buf && cv_safetensors_parse_buffer(buf, len, &ts, &nt) == 0 && nt == 2);
    uint64_t header;
    memcpy(&header, buf, 8);
    static const char meta[] = "\"__metadata__\":{\"format\":\"pt\"}";
    CHECK(header % 8 == 0 && memmem(buf + 8, header, meta, strlen(meta)));
    for (size_t i = 0; i < nt; i++) {
        const size_t off = (size_t)((const char *)ts[i].data - buf);
        CHECK(off % cv_dtype_size(ts[i].dtype) == 0);
        if (!strcmp(ts[i].name, "b.f32")) CHECK(off == 8 + header && memcmp(ts[i].data, f32, 24) == 0 && ts[i].ndim == 2);
        if (!strcmp(ts[i].name, "a.odd_i8")) CHECK(((const uint8_t *)ts[i].data)[2] == 15 && ts[i].nbytes == 3);
    }
    cv_safetensors_free_tensors(ts, nt);
    free(buf);
    free(p);
    json_decref(index);

    /* A name twice: refused before anything is written. A failing fill names the tensor. */
    char *dir2 = tu_make_temp_dir();
    w = cv_st_writer_create();
    cv_st_writer_add(w, "x", CV_DTYPE_F32, 1, (int64_t[]){1}, f32, NULL, NULL);
    cv_st_writer_add(w, "x", CV_DTYPE_F32, 1, (int64_t[]){1}, f32, NULL, NULL);
    CHECK_EQ_INT(cv_st_writer_write(w, dir2, "out", 1000, &n), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "tensor 'x' would be written twice");
    char *first = cv_xasprintf("%s/out-00001-of-00001.safetensors", dir2);
    CHECK(access(first, F_OK) != 0);
    cv_st_writer_free(w);
    w = cv_st_writer_create();
    cv_st_writer_add(w, "y", CV_DTYPE_I8, 1, (int64_t[]){4}, NULL, fill_fails, NULL);
    CHECK_EQ_INT(cv_st_writer_write(w, dir2, "out", 1000, &n), CVLLM_ERR_FORMAT);
    CHECK_STR_EQ(cv_error_message(), "no bytes today");
    cv_st_writer_free(w);
    w = cv_st_writer_create();
    cv_st_writer_add(w, "z", CV_DTYPE_I8, 1, (int64_t[]){4}, NULL, fill_ramp, NULL);
    char *missing = cv_xasprintf("%s/no/such/folder", dir2);
    CHECK_EQ_INT(cv_st_writer_write(w, missing, "out", 1000, &n), CVLLM_ERR_IO);
    CHECK_CONTAINS(cv_error_message(), "cannot create");
    cv_st_writer_free(w);
    free(missing);
    free(first);
    tu_remove_tree(dir);
    tu_remove_tree(dir2);
    free(dir);
    free(dir2);
}

/* ---- recipes ------------------------------------------------------------------------------------ */

static void test_recipes(void) {
    const struct {
        const char *name;
        cv_quant_action dense, moe;
    } cases[] = {
        {"model.layers.0.self_attn.q_proj.weight", CV_QACT_LINEAR, CV_QACT_LINEAR},
        {"model.language_model.layers.3.self_attn.v_proj.weight", CV_QACT_LINEAR, CV_QACT_LINEAR},
        {"model.layers.0.self_attn.o_proj.weight", CV_QACT_LINEAR, CV_QACT_FLOAT},
        {"model.layers.0.self_attn.q_norm.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"model.layers.0.mlp.gate_proj.weight", CV_QACT_LINEAR, CV_QACT_FLOAT},
        {"model.layers.0.mlp.down_proj.weight", CV_QACT_LINEAR, CV_QACT_FLOAT},
        {"model.layers.0.mlp.experts.17.up_proj.weight", CV_QACT_LINEAR, CV_QACT_LINEAR},
        {"model.layers.0.mlp.shared_expert.down_proj.weight", CV_QACT_LINEAR, CV_QACT_FLOAT},
        {"model.layers.0.mlp.shared_expert_gate.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"model.layers.0.mlp.gate.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"model.language_model.layers.0.mlp.experts.gate_up_proj", CV_QACT_FUSED_GATE_UP, CV_QACT_FUSED_GATE_UP},
        {"model.language_model.layers.0.mlp.experts.down_proj", CV_QACT_FUSED_DOWN, CV_QACT_FUSED_DOWN},
        {"model.language_model.layers.0.linear_attn.in_proj_qkv.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"model.language_model.layers.0.linear_attn.out_proj.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"mtp.layers.0.self_attn.q_proj.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"mtp.layers.0.mlp.experts.gate_up_proj", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"model.visual.blocks.0.mlp.linear_fc1.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"model.embed_tokens.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"lm_head.weight", CV_QACT_FLOAT, CV_QACT_FLOAT},
        {"model.layers.0.mlp.experts.gate_proj.weight", CV_QACT_LINEAR, CV_QACT_FLOAT}, /* no expert index */
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        CHECK_MSG(cv_quant_recipe_action(CV_RECIPE_DENSE, cases[i].name) == cases[i].dense, "dense: %s", cases[i].name);
        CHECK_MSG(cv_quant_recipe_action(CV_RECIPE_MOE, cases[i].name) == cases[i].moe, "moe: %s", cases[i].name);
    }
    char *g = cv_quant_recipe_expert_group("model.language_model.layers.3.mlp.experts.117.down_proj");
    CHECK_STR_EQ(g, "model.language_model.layers.3.mlp.experts.*.down_proj");
    free(g);
    CHECK(cv_quant_recipe_expert_group("model.layers.0.mlp.shared_expert.down_proj") == NULL);
    CHECK(cv_quant_recipe_expert_group("model.layers.0.mlp.experts.down_proj") == NULL);
    CHECK(cv_quant_recipe_expert_group("model.layers.0.self_attn.q_proj") == NULL);
}

/* ---- the export's refusals ---------------------------------------------------------------------- */

/* A checkpoint folder (model.safetensors.index.json + one shard) with the given tensors. */
typedef struct fake_tensor {
    const char *name;
    cv_dtype dtype;
    int ndim;
    int64_t shape[3];
} fake_tensor;

static char *fake_checkpoint(const fake_tensor *ts, size_t n) {
    char *dir = tu_make_temp_dir();
    cv_st_writer *w = cv_st_writer_create();
    for (size_t i = 0; i < n; i++) cv_st_writer_add(w, ts[i].name, ts[i].dtype, ts[i].ndim, ts[i].shape, NULL, fill_ramp, NULL);
    int shards;
    CHECK_EQ_INT(cv_st_writer_write(w, dir, "model", 1u << 30, &shards), 0);
    cv_st_writer_free(w);
    return dir;
}

static void expect_export_error(const fake_tensor *ts, size_t n, cv_linear_scheme scheme, int status, const char *msg) {
    char *dir = fake_checkpoint(ts, n), *out = tu_make_temp_dir();
    cv_checkpoint *ck;
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    cv_act_ranges *ranges = cv_act_ranges_create();
    const float x[2] = {-1, 1};
    cv_act_ranges_observe(ranges, "model.layers.0.self_attn.k_proj", x, 1, 2);
    cv_quant_export_options o = {.recipe = CV_RECIPE_DENSE, .scheme = scheme, .ranges = ranges, .max_shard_bytes = 1000};
    cv_quant_export_stats stats;
    CHECK_EQ_INT(cv_quant_export(dir, ck, &o, out, &stats), status);
    CHECK_STR_EQ(cv_error_message(), msg);
    /* Refused while planning: nothing was written. */
    char *index = cv_xasprintf("%s/quant_model_weights.safetensors.index.json", out);
    CHECK(access(index, F_OK) != 0);
    free(index);
    cv_act_ranges_free(ranges);
    cv_checkpoint_close(ck);
    tu_remove_tree(dir);
    tu_remove_tree(out);
    free(dir);
    free(out);
}

static void test_export_refusals(void) {
    const fake_tensor bias[] = {{"model.layers.0.self_attn.q_proj.weight", CV_DTYPE_BF16, 2, {4, 4}},
                                {"model.layers.0.self_attn.q_proj.bias", CV_DTYPE_BF16, 1, {4}}};
    expect_export_error(bias, 2, CV_SCHEME_W8A8_DYNAMIC, CVLLM_ERR_UNSUPPORTED,
                        "model.layers.0.self_attn.q_proj.bias: quantizing a linear with a bias is not supported");
    const fake_tensor int8[] = {{"model.layers.0.self_attn.q_proj.weight", CV_DTYPE_I8, 2, {4, 4}}};
    expect_export_error(int8, 1, CV_SCHEME_W8A8_DYNAMIC, CVLLM_ERR_UNSUPPORTED,
                        "model.layers.0.self_attn.q_proj.weight: dtype I8 cannot be quantized (F32, BF16 or F16 expected)");
    const fake_tensor flat[] = {{"model.layers.0.mlp.up_proj.weight", CV_DTYPE_BF16, 1, {16}}};
    expect_export_error(flat, 1, CV_SCHEME_W8A8_DYNAMIC, CVLLM_ERR_FORMAT,
                        "model.layers.0.mlp.up_proj.weight: 1 dimensions, expected 2");
    const fake_tensor odd[] = {{"model.layers.0.mlp.experts.gate_up_proj", CV_DTYPE_BF16, 3, {2, 5, 4}}};
    expect_export_error(odd, 1, CV_SCHEME_W8A8_DYNAMIC, CVLLM_ERR_FORMAT,
                        "model.layers.0.mlp.experts.gate_up_proj: 5 rows per expert, expected an even number (gate, then up)");
    const fake_tensor none[] = {{"model.embed_tokens.weight", CV_DTYPE_BF16, 2, {8, 4}}};
    expect_export_error(none, 1, CV_SCHEME_W8A8_DYNAMIC, CVLLM_ERR_INVALID_ARGUMENT,
                        "the dense recipe quantizes no tensor of this checkpoint");
    /* W8A8: k_proj was observed, q_proj not. */
    const fake_tensor qk[] = {{"model.layers.0.self_attn.k_proj.weight", CV_DTYPE_BF16, 2, {4, 4}},
                              {"model.layers.0.self_attn.q_proj.weight", CV_DTYPE_BF16, 2, {4, 4}}};
    expect_export_error(qk, 2, CV_SCHEME_W8A8, CVLLM_ERR_INVALID_ARGUMENT,
                        "model.layers.0.self_attn.q_proj: no calibration input reached this linear; W8A8 needs its "
                        "activation range (more or longer calibration prompts, or --scheme w8a8_dynamic)");
}

/* W8A8 with ranges for expert 0 (and its group) only: expert 1 takes the group's range; the static
 * tensors follow from the range (a checkpoint with fused experts, so the split is exercised too). */
static void test_export_static_groups(void) {
    const fake_tensor ts[] = {{"model.layers.0.mlp.experts.gate_up_proj", CV_DTYPE_F32, 3, {2, 4, 4}},
                              {"model.layers.0.mlp.experts.down_proj", CV_DTYPE_F32, 3, {2, 4, 2}}};
    char *dir = tu_make_temp_dir(), *out = tu_make_temp_dir();
    cv_st_writer *w = cv_st_writer_create();
    static float gate_up[2][4][4], down[2][4][2];
    for (int i = 0; i < 32; i++) (&gate_up[0][0][0])[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 16; i++) (&down[0][0][0])[i] = (float)(i % 5) * 0.5f;
    cv_st_writer_add(w, ts[0].name, ts[0].dtype, ts[0].ndim, ts[0].shape, gate_up, NULL, NULL);
    cv_st_writer_add(w, ts[1].name, ts[1].dtype, ts[1].ndim, ts[1].shape, down, NULL, NULL);
    int shards;
    CHECK_EQ_INT(cv_st_writer_write(w, dir, "model", 1u << 20, &shards), 0);
    cv_st_writer_free(w);
    cv_checkpoint *ck;
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    cv_act_ranges *ranges = cv_act_ranges_create();
    const float x[4] = {-2, 1, 0.5f, 3}, h[2] = {-1, 1};
    static const char *const seen[] = {"model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0.up_proj",
                                       "model.layers.0.mlp.experts.0.down_proj"};
    for (int i = 0; i < 3; i++) {
        cv_act_ranges_observe(ranges, seen[i], i < 2 ? x : h, 1, i < 2 ? 4 : 2);
        char *g = cv_quant_recipe_expert_group(seen[i]);
        cv_act_ranges_observe(ranges, g, i < 2 ? x : h, 1, i < 2 ? 4 : 2);
        free(g);
    }
    cv_quant_export_options o = {.recipe = CV_RECIPE_MOE, .scheme = CV_SCHEME_W8A8, .ranges = ranges, .max_shard_bytes = 1000};
    cv_quant_export_stats stats;
    CHECK_EQ_INT(cv_quant_export(dir, ck, &o, out, &stats), 0);
    CHECK_EQ_INT(stats.n_linears, 6);
    CHECK_EQ_INT(stats.n_group_ranges, 3);
    cv_checkpoint *q;
    CHECK_EQ_INT(cv_checkpoint_open_prefix(out, "quant_model_weights", &q), 0);
    for (int e = 0; e < 2; e++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.input_scale", e);
        const cv_tensor *s = cv_checkpoint_find(q, name);
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.input_offset", e);
        const cv_tensor *off = cv_checkpoint_find(q, name);
        float want_s, want_o;
        cv_act_static_params(cv_act_ranges_find(ranges, seen[1]), &want_s, &want_o);
        CHECK(s && off && *(const float *)s->data == want_s && *(const float *)off->data == want_o);
        /* The up rows of expert e are rows 2..3 of its gate_up block. */
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.weight", e);
        const cv_tensor *wq = cv_checkpoint_find(q, name);
        CHECK(wq && wq->dtype == CV_DTYPE_I8 && wq->shape[0] == 2 && wq->shape[1] == 4);
        for (int r = 0; wq && r < 2; r++) {
            const float *row = gate_up[e][2 + r];
            const float scale = fmaxf(fmaxf(fabsf(row[0]), fabsf(row[1])), fmaxf(fabsf(row[2]), fabsf(row[3]))) / 127.0f;
            for (int k = 0; k < 4; k++) CHECK(((const int8_t *)wq->data)[r * 4 + k] == (int8_t)nearbyintf(row[k] / scale));
        }
    }
    cv_checkpoint_close(q);
    cv_checkpoint_close(ck);
    cv_act_ranges_free(ranges);
    tu_remove_tree(dir);
    tu_remove_tree(out);
    free(dir);
    free(out);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    test_weight_codes(pool);
    test_activation_params();
    test_static_tensors();
    test_ranges();
    test_writer();
    test_recipes();
    test_export_refusals();
    test_export_static_groups();
    cv_threadpool_free(pool);
    return cv_check_summary("test_quantize");
}
