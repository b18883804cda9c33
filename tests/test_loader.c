/*
 * test_loader.c — safetensors, config.json / generation_config.json and weight sources.
 *
 * Checkpoints are written by the test itself into a mkdtemp folder (removed at the end): a known
 * header and known bytes let every check compare against values computed here, and each corruption
 * the loader must reject (truncation, bad offsets, overlap, unknown dtype, missing shard or tensor,
 * wrong shape) is one small file. The reference configs are copies in tests/data/configs/.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "check.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"

static char tmp_root[256];

/* ------------------------------------------------------------------------------------------------ */
/* File helpers                                                                                      */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* A fresh empty folder under tmp_root named `name`. */
static char *new_dir(const char *name) {
    char *dir = cv_xasprintf("%s/%s", tmp_root, name);
    remove_tree(dir);
    CHECK(mkdir(dir, 0755) == 0);
    return dir;
}

static void write_bytes(const char *dir, const char *file, const void *data, size_t n) {
    char *path = cv_xasprintf("%s/%s", dir, file);
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (fp) {
        CHECK(fwrite(data, 1, n, fp) == n);
        fclose(fp);
    }
    free(path);
}

static void write_text(const char *dir, const char *file, const char *text) {
    write_bytes(dir, file, text, strlen(text));
}

/* A safetensors file: 8-byte little-endian header length, the header (space-padded to a multiple
 * of 8 when `pad`, as the safetensors library writes it), then `data`. */
static void write_safetensors_raw(const char *dir, const char *file, const char *header, int pad,
                                  const void *data, size_t data_len) {
    size_t len = strlen(header), hl = pad ? (len + 7) / 8 * 8 : len;
    unsigned char *buf = cv_xmalloc(8 + hl + data_len);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, len);
    memset(buf + 8 + len, ' ', hl - len);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    write_bytes(dir, file, buf, 8 + hl + data_len);
    free(buf);
}

static void write_safetensors(const char *dir, const char *file, const char *header, const void *data,
                              size_t data_len) {
    write_safetensors_raw(dir, file, header, 1, data, data_len);
}

/* ------------------------------------------------------------------------------------------------ */
/* Header parser                                                                                     */

static void test_parse_header_ok(void) {
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
                    "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                    "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]},"
                    "\"e\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[40,40]}}";
    cv_tensor *ts;
    size_t n;
    CHECK_EQ_INT(cv_safetensors_parse_header(h, strlen(h), 40, &ts, &n), 0);
    CHECK_EQ_INT(n, 4);
    for (size_t i = 0; i < n; i++) {
        const cv_tensor *t = &ts[i];
        if (!strcmp(t->name, "b")) {
            CHECK_EQ_INT(t->dtype, CV_DTYPE_F32);
            CHECK_EQ_INT(t->ndim, 2);
            CHECK_EQ_INT(t->shape[1], 3);
            CHECK_EQ_INT((uintptr_t)t->data, 8);
            CHECK_EQ_INT(t->nbytes, 24);
        } else if (!strcmp(t->name, "s")) {
            CHECK_EQ_INT(t->ndim, 0);
            CHECK_EQ_INT(cv_tensor_numel(t), 1);
        } else if (!strcmp(t->name, "e")) {
            CHECK_EQ_INT(t->nbytes, 0);
        } else {
            CHECK_STR_EQ(t->name, "a");
            CHECK_EQ_INT(t->dtype, CV_DTYPE_BF16);
        }
    }
    cv_safetensors_free_tensors(ts, n);
}

static void expect_header_error(const char *header, uint64_t data_len, const char *needle) {
    cv_tensor *ts = (cv_tensor *)1;
    size_t n = 7;
    cv_error_clear();
    CHECK_EQ_INT(cv_safetensors_parse_header(header, strlen(header), data_len, &ts, &n), CVLLM_ERR_FORMAT);
    CHECK(ts == NULL && n == 0);
    CHECK_CONTAINS(cv_error_message(), needle);
}

static void test_parse_header_errors(void) {
    expect_header_error("{\"a\":", 0, "not valid JSON");
    expect_header_error("[1,2]", 0, "not a JSON object");
    expect_header_error("{\"a\":3}", 0, "tensor 'a': entry is not an object");
    expect_header_error("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': missing \"dtype\"");
    expect_header_error("{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                        "tensor 'w': unknown dtype \"F8_E5M2\"");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4, "not an array");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                        "shape[0] is not a non-negative integer");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                        4, "9 dimensions");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                        "not a [begin, end] pair");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4,
                        "not non-negative integers");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                        "end before they begin");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
                        "tensor 'a': data_offsets [0, 16) out of range (data section is 12 bytes");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16,
                        "span 16 bytes but dtype F32 and its shape need 12");
    /* 2^62 × 2^62 elements overflow 64 bits: must be rejected, not wrapped. */
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],"
                        "\"data_offsets\":[0,0]}}",
                        0, "tensor 'a': shape is too large");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                        12, "tensors 'a' and 'b' overlap");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        8, "duplicate");
}

static void test_parse_buffer(void) {
    /* 8-byte length, a 56-byte header (space-padded), then 8 bytes of data holding two f32 values. */
    const char header[] = "{\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ";
    CHECK_EQ_INT(sizeof header - 1, 56);
    unsigned char buf[8 + 56 + 8] = {56};
    memcpy(buf + 8, header, 56);
    const float v[2] = {3.0f, -1.0f};
    memcpy(buf + 64, v, 8);
    cv_tensor *ts;
    size_t n;
    CHECK_EQ_INT(cv_safetensors_parse_buffer(buf, sizeof buf, &ts, &n), 0);
    CHECK(n == 1 && ts[0].data == buf + 64 && ts[0].nbytes == 8);
    cv_safetensors_free_tensors(ts, n);
    CHECK_EQ_INT(cv_safetensors_parse_buffer(buf, 7, &ts, &n), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "truncated safetensors file (7 bytes");
    CHECK_EQ_INT(cv_safetensors_parse_buffer(buf, 60, &ts, &n), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "header length 56 past the end of the file (60 bytes");
    CHECK_EQ_INT(cv_safetensors_parse_buffer(buf, 68, &ts, &n), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "data_offsets [0, 8) out of range (data section is 4 bytes");
    buf[6] = 1; /* 2^48 + 56 */
    CHECK_EQ_INT(cv_safetensors_parse_buffer(buf, sizeof buf, &ts, &n), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "past the end of the file");
}

/* ------------------------------------------------------------------------------------------------ */
/* Checkpoint files                                                                                  */

/* bf16 1.5 = 0x3fc0, f16 1.5 = 0x3e00, f32 -2.25. */
static const char *three_dtypes_header =
    "{\"x.bf16\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
    "\"x.f16\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]},"
    "\"x.f32\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[8,12]},"
    "\"x.i64\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[16,24]}}";

static void three_dtypes_data(unsigned char data[24]) {
    const uint16_t bf[2] = {0x3fc0, 0xbf80}, hf[2] = {0x3e00, 0xbc00};
    const float f = -2.25f;
    const int64_t i = 42;
    memset(data, 0, 24);
    memcpy(data, bf, 4);
    memcpy(data + 4, hf, 4);
    memcpy(data + 8, &f, 4);
    memcpy(data + 16, &i, 8);
}

static char *make_single_checkpoint(const char *name) {
    char *dir = new_dir(name);
    unsigned char data[24];
    three_dtypes_data(data);
    write_safetensors(dir, "model.safetensors", three_dtypes_header, data, sizeof data);
    return dir;
}

static void test_single_file(void) {
    char *dir = make_single_checkpoint("single");
    cv_checkpoint *ck;
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    CHECK_EQ_INT(cv_checkpoint_count(ck), 4);
    /* Sorted by name. */
    CHECK_STR_EQ(cv_checkpoint_tensor(ck, 0)->name, "x.bf16");
    CHECK_STR_EQ(cv_checkpoint_tensor(ck, 3)->name, "x.i64");
    CHECK(cv_checkpoint_tensor(ck, 4) == NULL);
    const cv_tensor *t = cv_checkpoint_find(ck, "x.f32");
    CHECK(t != NULL);
    if (t) {
        float f;
        memcpy(&f, t->data, 4);
        CHECK(f == -2.25f);
        CHECK_EQ_INT(t->ndim, 2);
    }
    t = cv_checkpoint_find(ck, "x.i64");
    CHECK(t && (uintptr_t)t->data % 8 == 0 && *(const int64_t *)t->data == 42);
    CHECK(cv_checkpoint_find(ck, "nope") == NULL);
    cv_checkpoint_close(ck);
    free(dir);
}

static void expect_open_error(const char *dir, int code, const char *needle) {
    cv_checkpoint *ck = (cv_checkpoint *)1;
    cv_error_clear();
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), code);
    CHECK(ck == NULL);
    CHECK_CONTAINS(cv_error_message(), needle);
}

static void test_bad_files(void) {
    char *dir = new_dir("bad");
    expect_open_error(dir, CVLLM_ERR_NOT_FOUND, "no model.safetensors or model.safetensors.index.json in");

    write_bytes(dir, "model.safetensors", "\x10\0\0", 3);
    expect_open_error(dir, CVLLM_ERR_FORMAT, "model.safetensors: truncated safetensors file (3 bytes");

    /* Header length claims 1 MiB but the file is 20 bytes. */
    write_bytes(dir, "model.safetensors", "\x00\x00\x10\x00\x00\x00\x00\x00{\"a\":{}}    ", 20);
    expect_open_error(dir, CVLLM_ERR_FORMAT, "header length 1048576 past the end of the file (20 bytes");

    /* 2^64-1: must not wrap around when added to 8. */
    write_bytes(dir, "model.safetensors", "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
    expect_open_error(dir, CVLLM_ERR_FORMAT, "past the end of the file");

    write_safetensors(dir, "model.safetensors", "{\"a\": nonsense}", NULL, 0);
    expect_open_error(dir, CVLLM_ERR_FORMAT, "model.safetensors: header is not valid JSON");

    /* A download cut short: the header promises 24 bytes of data, 10 are there. */
    unsigned char data[24];
    three_dtypes_data(data);
    write_safetensors(dir, "model.safetensors", three_dtypes_header, data, 10);
    expect_open_error(dir, CVLLM_ERR_FORMAT, "out of range (data section is 10 bytes; file truncated?)");
    expect_open_error(dir, CVLLM_ERR_FORMAT, "/bad/model.safetensors: tensor '");

    remove_tree(dir);
    free(dir);
    expect_open_error("/nonexistent-cvllm-dir", CVLLM_ERR_NOT_FOUND, "/nonexistent-cvllm-dir");
}

static char *make_sharded_checkpoint(const char *name) {
    char *dir = new_dir(name);
    const float a[2] = {1.0f, 2.0f}, b[3] = {3.0f, 4.0f, 5.0f};
    write_safetensors(dir, "model-00001-of-00002.safetensors",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", a, sizeof a);
    write_safetensors(dir, "model-00002-of-00002.safetensors",
                      "{\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", b, sizeof b);
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":20},\"weight_map\":{"
               "\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}");
    return dir;
}

static void test_sharded(void) {
    char *dir = make_sharded_checkpoint("sharded");
    cv_checkpoint *ck;
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    CHECK_EQ_INT(cv_checkpoint_count(ck), 2);
    const cv_tensor *a = cv_checkpoint_find(ck, "a"), *b = cv_checkpoint_find(ck, "b");
    CHECK(a && ((const float *)a->data)[1] == 2.0f);
    CHECK(b && ((const float *)b->data)[2] == 5.0f);
    cv_checkpoint_close(ck);

    /* The index names a tensor its shard lacks. */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
               "\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_error(dir, CVLLM_ERR_FORMAT, "lists tensor 'c' but");
    expect_open_error(dir, CVLLM_ERR_FORMAT, "model-00002-of-00002.safetensors does not contain it");

    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
               "\"b\":\"model-00003-of-00002.safetensors\"}}");
    expect_open_error(dir, CVLLM_ERR_NOT_FOUND, "model-00003-of-00002.safetensors: No such file");

    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../model.safetensors\"}}");
    expect_open_error(dir, CVLLM_ERR_FORMAT, "tensor 'a' maps to an invalid shard name");

    write_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    expect_open_error(dir, CVLLM_ERR_FORMAT, "missing \"weight_map\"");

    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":");
    expect_open_error(dir, CVLLM_ERR_FORMAT, "model.safetensors.index.json: invalid JSON");

    /* The same tensor in two shards. */
    const float a2[2] = {0};
    write_safetensors(dir, "model-00002-of-00002.safetensors",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", a2, sizeof a2);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
               "\"b\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_error(dir, CVLLM_ERR_FORMAT, "tensor 'a' appears in more than one shard");
    free(dir);
}

/* ------------------------------------------------------------------------------------------------ */
/* config.json                                                                                       */

static int load_config_copy(const char *name, cv_model_config *cfg) {
    char *path = cv_xasprintf("%s/configs/%s.json", CVLLM_TEST_DATA, name);
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    char buf[8192];
    size_t n = fp ? fread(buf, 1, sizeof buf, fp) : 0;
    if (fp) fclose(fp);
    int rc = cv_model_config_parse(buf, n, path, cfg);
    CHECK_MSG(rc == 0, "%s", cv_error_message());
    free(path);
    return rc;
}

static void test_reference_configs(void) {
    cv_model_config c;
    if (load_config_copy("qwen3-dense-bf16", &c) == 0) {
        CHECK_STR_EQ(c.architecture, "Qwen3ForCausalLM");
        CHECK_STR_EQ(c.model_type, "qwen3");
        CHECK_EQ_INT(c.hidden_size, 64);
        CHECK_EQ_INT(c.num_hidden_layers, 2);
        CHECK_EQ_INT(c.num_attention_heads, 4);
        CHECK_EQ_INT(c.num_key_value_heads, 2);
        CHECK_EQ_INT(c.head_dim, 32); /* explicit, not 64 / 4 */
        CHECK_EQ_INT(c.intermediate_size, 128);
        CHECK_EQ_INT(c.vocab_size, 4096);
        CHECK_EQ_INT(c.max_position_embeddings, 40960);
        CHECK(c.rms_norm_eps == 1e-6);
        CHECK(!c.tie_word_embeddings && !c.attention_bias);
        CHECK(c.rope.theta == 1e6 && c.rope.type == CV_ROPE_DEFAULT && c.rope.factor == 1.0);
        CHECK(c.rope.partial_rotary_factor == 1.0);
        CHECK_EQ_INT(c.torch_dtype, CV_DTYPE_BF16);
        CHECK_EQ_INT(c.bos_token_id, 151643);
        CHECK_EQ_INT(c.n_eos_token_ids, 1);
        CHECK_EQ_INT(c.eos_token_ids[0], 151645);
        CHECK(c.text == c.root);
        cv_model_config_free(&c);
    }
    if (load_config_copy("qwen3-dense-tied-f32", &c) == 0) {
        CHECK(c.tie_word_embeddings);
        CHECK_EQ_INT(c.torch_dtype, CV_DTYPE_F32);
        cv_model_config_free(&c);
    }
    if (load_config_copy("qwen3-moe-bf16", &c) == 0) {
        CHECK_STR_EQ(c.architecture, "Qwen3MoeForCausalLM");
        CHECK_EQ_INT(json_integer_value(json_object_get(c.text, "num_experts")), 8);
        cv_model_config_free(&c);
    }
    if (load_config_copy("qwen3-next-bf16", &c) == 0) {
        CHECK_STR_EQ(c.architecture, "Qwen3NextForCausalLM");
        CHECK_EQ_INT(c.head_dim, 64);
        CHECK(c.rope.theta == 1e7);
        CHECK(c.rope.partial_rotary_factor == 0.25);
        CHECK_EQ_INT(c.max_position_embeddings, 262144);
        cv_model_config_free(&c);
    }
    if (load_config_copy("qwen3.5-moe-bf16", &c) == 0) {
        CHECK_STR_EQ(c.architecture, "Qwen3_5MoeForConditionalGeneration");
        CHECK(c.text != c.root);
        CHECK_EQ_INT(c.hidden_size, 64);
        CHECK_EQ_INT(c.num_hidden_layers, 4);
        CHECK_EQ_INT(c.intermediate_size, 0); /* MoE only */
        CHECK(c.rope.theta == 1e7 && c.rope.partial_rotary_factor == 0.25);
        CHECK_EQ_INT(c.rope.type, CV_ROPE_DEFAULT);
        CHECK_EQ_INT(c.torch_dtype, CV_DTYPE_BF16); /* "dtype" inside text_config */
        CHECK_EQ_INT(c.eos_token_ids[0], 151645);
        CHECK_EQ_INT(json_integer_value(json_object_get(c.text, "linear_num_value_heads")), 4);
        cv_model_config_free(&c);
    }
}

#define BASE_FIELDS                                                                                \
    "\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"         \
    "\"num_attention_heads\":4,\"vocab_size\":100,\"max_position_embeddings\":4096"

static int parse_text(const char *json, cv_model_config *c) {
    cv_error_clear();
    return cv_model_config_parse(json, strlen(json), "test/config.json", c);
}

static void test_config_variants(void) {
    cv_model_config c;
    /* Minimal: defaults and derived head_dim. */
    CHECK_EQ_INT(parse_text("{" BASE_FIELDS "}", &c), 0);
    CHECK_EQ_INT(c.head_dim, 16);
    CHECK_EQ_INT(c.num_key_value_heads, 4);
    CHECK(c.rope.theta == 10000.0);
    CHECK_EQ_INT(c.torch_dtype, CV_DTYPE_BF16);
    CHECK_EQ_INT(c.bos_token_id, -1);
    CHECK_EQ_INT(c.n_eos_token_ids, 0);
    cv_model_config_free(&c);

    /* Newer spelling: rope_parameters, dtype, eos list. */
    CHECK_EQ_INT(parse_text("{" BASE_FIELDS ",\"rope_parameters\":{\"rope_theta\":5000000,\"rope_type\":"
                            "\"default\"},\"dtype\":\"float16\",\"eos_token_id\":[7,8,9],"
                            "\"tie_word_embeddings\":true}", &c), 0);
    CHECK(c.rope.theta == 5e6);
    CHECK_EQ_INT(c.torch_dtype, CV_DTYPE_F16);
    CHECK_EQ_INT(c.n_eos_token_ids, 3);
    CHECK_EQ_INT(c.eos_token_ids[2], 9);
    CHECK(c.tie_word_embeddings);
    cv_model_config_free(&c);

    /* YaRN through the old rope_scaling with the "type" key. */
    CHECK_EQ_INT(parse_text("{" BASE_FIELDS ",\"rope_theta\":1000000,\"rope_scaling\":{\"type\":\"yarn\","
                            "\"factor\":4.0,\"original_max_position_embeddings\":32768}}", &c), 0);
    CHECK_EQ_INT(c.rope.type, CV_ROPE_YARN);
    CHECK(c.rope.factor == 4.0 && c.rope.beta_fast == 32.0 && c.rope.beta_slow == 1.0);
    CHECK_EQ_INT(c.rope.original_max_position, 32768);
    cv_model_config_free(&c);

    /* ... and with rope_type inside rope_parameters, original length defaulted. */
    CHECK_EQ_INT(parse_text("{" BASE_FIELDS ",\"rope_parameters\":{\"rope_theta\":10000,"
                            "\"rope_type\":\"yarn\",\"factor\":2,\"beta_fast\":16}}", &c), 0);
    CHECK_EQ_INT(c.rope.type, CV_ROPE_YARN);
    CHECK(c.rope.beta_fast == 16.0);
    CHECK_EQ_INT(c.rope.original_max_position, 4096);
    cv_model_config_free(&c);

    CHECK_EQ_INT(parse_text("{" BASE_FIELDS ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2}}",
                            &c), 0);
    CHECK_EQ_INT(c.rope.type, CV_ROPE_LINEAR);
    cv_model_config_free(&c);
}

static void expect_config_error(const char *json, int code, const char *needle) {
    cv_model_config c;
    CHECK_EQ_INT(parse_text(json, &c), code);
    CHECK(c.root == NULL);
    CHECK_CONTAINS(cv_error_message(), needle);
}

static void test_config_errors(void) {
    expect_config_error("{\"hidden_size\":", CVLLM_ERR_FORMAT, "test/config.json: invalid JSON");
    expect_config_error("[]", CVLLM_ERR_FORMAT, "must be a JSON object");
    expect_config_error("{\"hidden_size\":64}", CVLLM_ERR_FORMAT,
                        "test/config.json: missing required field \"architectures\"");
    expect_config_error("{\"architectures\":[\"X\"],\"num_hidden_layers\":2}", CVLLM_ERR_FORMAT,
                        "test/config.json: missing required field \"hidden_size\"");
    expect_config_error("{\"architectures\":[\"X\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                        "\"num_attention_heads\":4,\"max_position_embeddings\":8}",
                        CVLLM_ERR_FORMAT, "missing required field \"vocab_size\"");
    expect_config_error("{\"architectures\":[],\"hidden_size\":64}", CVLLM_ERR_FORMAT,
                        "\"architectures\" must be a non-empty list");
    expect_config_error("{\"architectures\":[\"X\"],\"hidden_size\":\"64\"}", CVLLM_ERR_FORMAT,
                        "field \"hidden_size\" must be a positive integer");
    expect_config_error("{" BASE_FIELDS ",\"num_key_value_heads\":3}", CVLLM_ERR_FORMAT,
                        "num_attention_heads 4 is not a multiple of num_key_value_heads 3");
    expect_config_error("{" BASE_FIELDS ",\"head_dim\":0}", CVLLM_ERR_FORMAT, "\"head_dim\" must be");
    expect_config_error("{\"architectures\":[\"X\"],\"hidden_size\":2,\"num_hidden_layers\":2,"
                        "\"num_attention_heads\":4,\"vocab_size\":10,\"max_position_embeddings\":8}",
                        CVLLM_ERR_FORMAT, "hidden_size 2 is smaller than num_attention_heads 4");
    expect_config_error("{" BASE_FIELDS ",\"rope_scaling\":{\"rope_type\":\"longrope\"}}",
                        CVLLM_ERR_UNSUPPORTED, "rope_type \"longrope\" is not supported");
    expect_config_error("{" BASE_FIELDS ",\"rope_scaling\":5}", CVLLM_ERR_FORMAT,
                        "\"rope_scaling\" must be an object or null");
    expect_config_error("{" BASE_FIELDS ",\"rope_theta\":\"big\"}", CVLLM_ERR_FORMAT,
                        "\"rope_theta\" must be a number");
    expect_config_error("{" BASE_FIELDS ",\"rope_theta\":-1}", CVLLM_ERR_FORMAT,
                        "\"rope_theta\" must be positive");
    expect_config_error("{" BASE_FIELDS ",\"partial_rotary_factor\":2}", CVLLM_ERR_FORMAT,
                        "\"partial_rotary_factor\" must be in (0, 1]");
    expect_config_error("{" BASE_FIELDS ",\"torch_dtype\":\"int8\"}", CVLLM_ERR_UNSUPPORTED,
                        "field \"torch_dtype\" is \"int8\"");
    expect_config_error("{" BASE_FIELDS ",\"eos_token_id\":\"</s>\"}", CVLLM_ERR_FORMAT,
                        "\"eos_token_id\" must be an integer or a list");
    expect_config_error("{" BASE_FIELDS ",\"eos_token_id\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}",
                        CVLLM_ERR_FORMAT, "lists 17 ids (at most 16");
    expect_config_error("{" BASE_FIELDS ",\"tie_word_embeddings\":1}", CVLLM_ERR_FORMAT,
                        "\"tie_word_embeddings\" must be true or false");
    expect_config_error("{\"architectures\":[\"X\"],\"text_config\":[]}", CVLLM_ERR_FORMAT,
                        "\"text_config\" must be an object");
}

static void test_config_files(void) {
    char *dir = new_dir("cfg");
    cv_model_config c;
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &c), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "/cfg/config.json: No such file or directory");
    write_text(dir, "config.json", "{" BASE_FIELDS ",\"rms_norm_eps\":1e-5}");
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &c), 0);
    CHECK(c.rms_norm_eps == 1e-5);
    cv_model_config_free(&c);
    write_text(dir, "config.json", "{\"architectures\":[\"X\"]}");
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &c), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "/cfg/config.json: missing required field \"hidden_size\"");
    /* vLLM's --hf-overrides: a key replaces the config's (rope_scaling whole), text_config's keys one by one */
    write_text(dir, "config.json", "{\"architectures\":[\"X\"],\"text_config\":{" BASE_FIELDS ",\"rms_norm_eps\":1e-5,"
               "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2}}}");
    CHECK_EQ_INT(cv_model_config_load(dir, "{\"text_config\":{\"rms_norm_eps\":1e-3,\"rope_scaling\":{\"rope_type\":"
                                            "\"yarn\",\"factor\":4,\"original_max_position_embeddings\":512}}}", &c), 0);
    CHECK(c.rms_norm_eps == 1e-3 && c.hidden_size > 0 && c.rope.type == CV_ROPE_YARN && c.rope.factor == 4 &&
          c.rope.original_max_position == 512);
    cv_model_config_free(&c);
    CHECK_EQ_INT(cv_model_config_load(dir, "{\"text_config\":{\"hidden_size\":\"big\"}}", &c), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "/cfg/config.json with --hf-overrides");
    CHECK_EQ_INT(cv_model_config_load(dir, "3", &c), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "--hf-overrides must be a JSON object");

    cv_generation_config g;
    CHECK_EQ_INT(cv_generation_config_load(dir, &g), 0); /* absent is fine */
    CHECK(g.n_eos_token_ids == 0 && !g.has_temperature && !g.has_top_k);

    char *ref = cv_xasprintf("%s/configs/qwen3-generation_config.json", CVLLM_TEST_DATA);
    FILE *fp = fopen(ref, "rb");
    char buf[4096];
    size_t n = fp ? fread(buf, 1, sizeof buf, fp) : 0;
    if (fp) fclose(fp);
    write_bytes(dir, "generation_config.json", buf, n);
    CHECK_EQ_INT(cv_generation_config_load(dir, &g), 0);
    CHECK_EQ_INT(g.n_eos_token_ids, 2);
    CHECK_EQ_INT(g.eos_token_ids[0], 151645);
    CHECK_EQ_INT(g.eos_token_ids[1], 151643);
    CHECK(g.has_temperature && fabsf(g.temperature - 0.6f) < 1e-6f);
    CHECK(g.has_top_k && g.top_k == 20);
    CHECK(g.has_top_p && fabsf(g.top_p - 0.95f) < 1e-6f);
    CHECK(!g.has_min_p && !g.has_repetition_penalty && !g.has_max_new_tokens);
    free(ref);

    write_text(dir, "generation_config.json", "{\"eos_token_id\": 3, \"max_new_tokens\": 100, "
                                              "\"repetition_penalty\": 1.1, \"min_p\": 0}");
    CHECK_EQ_INT(cv_generation_config_load(dir, &g), 0);
    CHECK(g.n_eos_token_ids == 1 && g.eos_token_ids[0] == 3);
    CHECK(g.has_max_new_tokens && g.max_new_tokens == 100 && g.has_min_p && g.has_repetition_penalty);

    write_text(dir, "generation_config.json", "{\"temperature\": \"hot\"}");
    CHECK_EQ_INT(cv_generation_config_load(dir, &g), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "generation_config.json: field \"temperature\" must be a number");
    write_text(dir, "generation_config.json", "{\"top_k\": 2.5}");
    CHECK_EQ_INT(cv_generation_config_load(dir, &g), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "field \"top_k\" must be an integer");
    write_text(dir, "generation_config.json", "{oops");
    CHECK_EQ_INT(cv_generation_config_load(dir, &g), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "generation_config.json: invalid JSON");
    free(dir);
}

/* ------------------------------------------------------------------------------------------------ */
/* Weight sources                                                                                    */

static void test_checkpoint_weights(void) {
    char *dir = make_single_checkpoint("weights");
    cv_weight_source *src;
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &src), 0);
    CHECK(!cv_weight_source_is_dummy(src));
    cv_tensor t;
    const int64_t two[1] = {2}, one_one[2] = {1, 1}, three[1] = {3};
    CHECK_EQ_INT(cv_weights_get(src, "x.bf16", 1, two, NULL, &t), 0);
    CHECK(t.dtype == CV_DTYPE_BF16 && ((const uint16_t *)t.data)[0] == 0x3fc0);

    const float *f;
    CHECK_EQ_INT(cv_weights_get_f32(src, "x.bf16", 1, two, NULL, &f), 0);
    CHECK(f[0] == 1.5f && f[1] == -1.0f);
    CHECK_EQ_INT(cv_weights_get_f32(src, "x.f16", 1, two, NULL, &f), 0);
    CHECK(f[0] == 1.5f && f[1] == -1.0f);
    CHECK_EQ_INT(cv_weights_get_f32(src, "x.f32", 2, one_one, NULL, &f), 0);
    CHECK(f[0] == -2.25f);

    cv_error_clear();
    CHECK_EQ_INT(cv_weights_get(src, "x.bf16", 1, three, "hidden_size=3", &t), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "tensor x.bf16 in");
    CHECK_CONTAINS(cv_error_message(), "has shape [2] but config.json implies [3] (hidden_size=3)");
    CHECK_EQ_INT(cv_weights_get(src, "x.f32", 1, two, NULL, &t), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "has shape [1, 1] but config.json implies [2]");
    CHECK_EQ_INT(cv_weights_get_f32(src, "x.f32", 1, two, "intermediate_size=2", &f), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "(intermediate_size=2)");

    CHECK_EQ_INT(cv_weights_get(src, "x.i64", 1, (const int64_t[]){1}, NULL, &t), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "tensor x.i64");
    CHECK_CONTAINS(cv_error_message(), "has dtype I64; weights must be BF16, F16 or F32");

    CHECK_EQ_INT(cv_weights_get(src, "lm_head.weight", 1, two, NULL, &t), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "missing tensor lm_head.weight in ");
    CHECK_CONTAINS(cv_error_message(), "/weights");
    CHECK_EQ_INT(cv_weights_get_optional(src, "lm_head.weight", 1, two, NULL, &t), 0);
    CHECK_EQ_INT(cv_weights_get_optional(src, "x.bf16", 1, two, NULL, &t), 1);
    CHECK_EQ_INT(cv_weights_get_optional(src, "x.bf16", 1, three, NULL, &t), CVLLM_ERR_FORMAT);
    CHECK_EQ_INT(cv_weights_get(src, "x.bf16", -1, two, NULL, &t), CVLLM_ERR_INVALID_ARGUMENT);
    cv_weight_source_free(src);

    /* An unpadded header of odd length leaves the f32 data misaligned: the view is an aligned copy. */
    char *odd = new_dir("weights-odd");
    const float vals[2] = {0.5f, -4.0f};
    write_safetensors_raw(odd, "model.safetensors",
                          "{\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} ", 0, vals, 8);
    CHECK_EQ_INT(cv_weight_source_checkpoint(odd, &src), 0);
    CHECK_EQ_INT(cv_weights_get(src, "v", 1, two, NULL, &t), 0);
    CHECK((uintptr_t)t.data % 4 == 0 && ((const float *)t.data)[1] == -4.0f);
    CHECK_STR_EQ(t.name, "v");
    cv_weight_source_free(src);
    free(odd);

    cv_weight_source *none = (cv_weight_source *)1;
    char *empty = new_dir("weights-empty");
    CHECK_EQ_INT(cv_weight_source_checkpoint(empty, &none), CVLLM_ERR_NOT_FOUND);
    CHECK(none == NULL);
    CHECK_CONTAINS(cv_error_message(), "no model.safetensors");
    free(empty);
    free(dir);
}

static void test_dummy_weights(void) {
    cv_weight_source *a, *b, *c;
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_BF16, 1, &a), 0);
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_BF16, 1, &b), 0);
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_F32, 2, &c), 0);
    CHECK(cv_weight_source_is_dummy(a));
    const int64_t shape[2] = {300, 1000};
    cv_tensor ta, tb, tb2, tc;
    CHECK_EQ_INT(cv_weights_get(a, "w", 2, shape, NULL, &ta), 0);
    CHECK_EQ_INT(cv_weights_get(b, "other", 2, shape, NULL, &tb2), 0); /* order must not matter */
    CHECK_EQ_INT(cv_weights_get(b, "w", 2, shape, NULL, &tb), 0);
    CHECK_EQ_INT(cv_weights_get(c, "w", 2, shape, NULL, &tc), 0);
    CHECK(ta.dtype == CV_DTYPE_BF16 && ta.nbytes == 600000 && ta.shape[1] == 1000);
    CHECK_STR_EQ(ta.name, "w");
    CHECK(memcmp(ta.data, tb.data, ta.nbytes) == 0);
    CHECK(memcmp(ta.data, tb2.data, ta.nbytes) != 0);

    float *fa = cv_xmalloc(300000 * sizeof *fa);
    cv_convert_to_f32(fa, ta.data, ta.dtype, 300000);
    const float *fc = tc.data;
    double sum = 0, sum_c = 0;
    int out_of_range = 0, distinct = 0;
    for (int i = 0; i < 300000; i++) {
        out_of_range += !(fa[i] >= -1e-3f && fa[i] <= 1e-3f) + !(fc[i] >= -1e-3f && fc[i] <= 1e-3f);
        distinct += fc[i] != fa[i];
        sum += fa[i];
        sum_c += fc[i];
    }
    CHECK_EQ_INT(out_of_range, 0);
    CHECK(distinct > 290000); /* a different seed gives different values */
    /* Mean of 300k uniform(-1e-3, 1e-3) draws: sd of the mean ≈ 1.05e-6. */
    CHECK_MSG(fabs(sum / 300000) < 6e-6 && fabs(sum_c / 300000) < 6e-6, "means %g %g", sum / 3e5, sum_c / 3e5);
    free(fa);

    const float *f;
    CHECK_EQ_INT(cv_weights_get_f32(a, "norm", 1, (const int64_t[]){64}, NULL, &f), 0);
    CHECK(f[0] >= -1e-3f && f[0] <= 1e-3f && f[0] != f[1]);
    /* Optional tensors are absent in dummy mode. */
    CHECK_EQ_INT(cv_weights_get_optional(a, "lm_head.weight", 2, shape, NULL, &tc), 0);
    CHECK_EQ_INT(cv_weights_get(a, "w", 1, (const int64_t[]){-4}, NULL, &tc), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "tensor w: negative dimension");
    CHECK_EQ_INT(cv_weights_get(a, "huge", 2, (const int64_t[]){INT64_MAX / 2, 4}, NULL, &tc),
                 CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "tensor huge: shape too large");
    cv_weight_source_free(a);
    cv_weight_source_free(b);
    cv_weight_source_free(c);

    cv_weight_source *bad = (cv_weight_source *)1;
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_I32, 1, &bad), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    CHECK_CONTAINS(cv_error_message(), "dummy weights must be bf16, f16 or f32, not I32");

    /* f16 and a big tensor: report the fill rate (vLLM-sized models need ~1 s per 600M values). */
    cv_weight_source *h;
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_F16, 3, &h), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cv_tensor th;
    const int64_t big[2] = {4096, 8192};
    CHECK_EQ_INT(cv_weights_get(h, "big", 2, big, NULL, &th), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("dummy fill: %.0f M values/s\n", 4096.0 * 8192 / s / 1e6);
    float last = cv_f16_to_f32(((const uint16_t *)th.data)[4096 * 8192 - 1]);
    CHECK(last >= -1e-3f && last <= 1e-3f && last != 0.0f);
    cv_weight_source_free(h);
}

int main(void) {
    snprintf(tmp_root, sizeof tmp_root, "%s/cvllm-loader-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    test_parse_header_ok();
    test_parse_header_errors();
    test_parse_buffer();
    test_single_file();
    test_bad_files();
    test_sharded();
    test_reference_configs();
    test_config_variants();
    test_config_errors();
    test_config_files();
    test_checkpoint_weights();
    test_dummy_weights();
    remove_tree(tmp_root);
    return cv_check_summary("test_loader");
}
