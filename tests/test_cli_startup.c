/*
 * test_cli_startup.c — what `cvllm` does before the first token, as a user meets it on a machine
 * without network or weights: every shipped id finds its tokenizer (tokenize, bench serve's local
 * tokenizer, a folder config without tokenizer files of its own); an id that is neither cached nor
 * shipped fails in one line that lists the shipped ids and suggests nothing that cannot work; a
 * model that cannot fit is refused at once, from its config, with the numbers; --max-model-len above
 * the model's limit is vLLM's error, or its warning under VLLM_ALLOW_LONG_MAX_MODEL_LEN; a
 * quantized (msModelSlim) folder without its weights is refused by name and runs as a dummy in its format.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "testutil.h"

static char *tmp, *offline_env, *no_network_env;

/* Runs and checks the exit status; the caller checks the output and frees it. */
static tu_run run_expect(const char *env, const char *args, int status) {
    tu_run r = tu_run_cvllm(tmp, env, args);
    CHECK_MSG(r.status == status, "exit %d (want %d) for: %s\n%s", r.status, status, args, r.err);
    return r;
}

/* An error that is exactly one line on stderr (with logging off) and contains each of `parts`. */
static void expect_one_line(const char *env, const char *args, const char *const *parts, const char *absent) {
    char *quiet = tu_strdupf("CVLLM_LOG_LEVEL=error %s%s", env, "");
    tu_run r = run_expect(quiet, args, 1);
    CHECK_MSG(strchr(r.err, '\n') == r.err + strlen(r.err) - 1, "not one line: %s", r.err);
    for (; *parts; parts++) CHECK_CONTAINS(r.err, *parts);
    if (absent) CHECK_MSG(!strstr(r.err, absent), "\"%s\" suggests \"%s\"", r.err, absent);
    tu_run_free(&r);
    free(quiet);
}

/* ---- shipped ids ------------------------------------------------------------------------------ */

static int tokenize_shipped_org(const char *org) {
    char *path = tu_strdupf("%s/models/%s", CVLLM_SOURCE_DIR, org);
    DIR *d = opendir(path);
    struct dirent *ent;
    int n = 0;
    while (d && (ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        char *args = tu_strdupf("tokenize %s/%s --text 'Hello, world!'", org, ent->d_name);
        tu_run r = run_expect(offline_env, args, 0);
        CHECK_MSG(!strcmp(r.out, "[9707,11,1879,0]\n"), "%s: %s", args, r.out);
        tu_run_free(&r);
        free(args);
        n++;
    }
    if (d) closedir(d);
    free(path);
    return n;
}

static void test_shipped_tokenizers(void) {
    int n = 0;
    DIR *d = opendir(CVLLM_SOURCE_DIR "/models");
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        char *cfg = tu_strdupf("%s/models/%s", CVLLM_SOURCE_DIR, ent->d_name);
        struct stat st;
        /* ORG folders; models/qwen3-tokenizer is the tokenizer the shipped ids link. */
        if (ent->d_name[0] != '.' && strcmp(ent->d_name, "qwen3-tokenizer") && stat(cfg, &st) == 0 && S_ISDIR(st.st_mode))
            n += tokenize_shipped_org(ent->d_name);
        free(cfg);
    }
    if (d) closedir(d);
    CHECK_MSG(n >= 9, "%d shipped ids (Qwen3 sizes, Qwen3.6-35B-A3B and the two W8A8 checkpoints)", n);

    /* The 4-layer benchmark config links the same tokenizer. */
    tu_run r = run_expect(offline_env, "tokenize " CVLLM_SOURCE_DIR "/bench/configs/qwen3.6-35b-a3b-4layers --text 'Hello, world!'", 0);
    CHECK_STR_EQ(r.out, "[9707,11,1879,0]\n");
    tu_run_free(&r);

    /* bench serve builds its prompts with the model id's tokenizer, or --tokenizer's (no server
     * listens here: every request fails, after the prompts were made, and the run exits 1). */
    static const char *const serve[] = {
        "bench serve --model Eco-Tech/Qwen3.6-35B-A3B-w8a8 --base-url http://127.0.0.1:9 --num-prompts 1 "
        "--random-input-len 8 --random-output-len 2",
        "bench serve --model qwen3 --tokenizer vllm-ascend/Qwen3-32B-W8A8 --base-url http://127.0.0.1:9 "
        "--num-prompts 1 --random-input-len 8 --random-output-len 2",
    };
    for (size_t i = 0; i < 2; i++) {
        r = run_expect(offline_env, serve[i], 1);
        CHECK_CONTAINS(r.err, "cvllm bench serve: all 1 requests failed");
        CHECK_MSG(!strstr(r.err, "cannot load the tokenizer"), "%s", r.err);
        tu_run_free(&r);
    }
}

/* ---- ids that cannot be fetched --------------------------------------------------------------- */

static void test_not_fetchable(void) {
    static const char *const offline[] = {"cannot download Foo/Bar: HF_HUB_OFFLINE is set, and it is not in the "
                                          "Hugging Face cache (",
                                          "; cvllm ships configs (for --load-format dummy) only for: "
                                          "Eco-Tech/Qwen3.6-35B-A3B-w8a8, Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B, "
                                          "Qwen/Qwen3-4B, Qwen/Qwen3-8B, Qwen/Qwen3-14B, Qwen/Qwen3-32B, "
                                          "Qwen/Qwen3.6-35B-A3B, vllm-ascend/Qwen3-32B-W8A8\n",
                                          NULL};
    static const char *const no_network[] = {"cannot download Foo/Bar: no network (",
                                             "cvllm ships configs (for --load-format dummy) only for: ",
                                             "Qwen/Qwen3.6-35B-A3B", NULL};
    /* Neither cached nor shipped: nothing to suggest, not even a dummy run. */
    const char *none = "to run offline with random weights";
    expect_one_line(offline_env, "tokenize Foo/Bar --text hi", offline, none);
    expect_one_line(offline_env, "generate Foo/Bar --prompt hi", offline, none);
    expect_one_line(offline_env, "generate Foo/Bar --load-format dummy --prompt hi", offline, none);
    expect_one_line(no_network_env, "generate Foo/Bar --prompt hi", no_network, none);
    expect_one_line(no_network_env, "bench latency --model Foo/Bar --load-format dummy", no_network, none);
    /* Shipped: the weights cannot be fetched, but a dummy run of its config can. */
    static const char *const shipped[] = {"cannot download vllm-ascend/Qwen3-32B-W8A8: HF_HUB_OFFLINE is set",
                                          "vllm-ascend/Qwen3-32B-W8A8 --prompt hi --load-format dummy", NULL};
    expect_one_line(offline_env, "generate vllm-ascend/Qwen3-32B-W8A8 --prompt hi", shipped, NULL);
}

/* ---- the memory fit --------------------------------------------------------------------------- */

/* KV bytes per token of a shipped dense config: K and V of every layer in bf16, the KV cache dtype
 * of --kv-cache-dtype auto for these bfloat16 checkpoints (auto follows the compute dtype, theirs). */
static long long shipped_kv_bytes_per_token(const char *id) {
    char *path = tu_strdupf("%s/models/%s/config.json", CVLLM_SOURCE_DIR, id);
    json_t *c = json_load_file(path, 0, NULL);
    free(path);
    CHECK_STR_EQ(json_string_value(json_object_get(c, "torch_dtype")), "bfloat16");
    long long n = 2 * 2 * json_integer_value(json_object_get(c, "num_hidden_layers")) *
                  json_integer_value(json_object_get(c, "num_key_value_heads")) *
                  json_integer_value(json_object_get(c, "head_dim"));
    json_decref(c);
    return n;
}

/* A refusal "before any allocation" peaks far below the weights it refused (tens of GiB): under
 * 1 GiB, also with the sanitizers' overhead. Memory, not time, so a busy machine cannot fail it. */
#define REFUSED_RSS_KIB (1L << 20)

static void test_fit(const char *fixture) {
    /* Qwen3-32B (61 GiB of bf16 weights, 40960 positions) would take a minute to fill with random
     * weights: it is refused from its config before, with vLLM's message and the numbers. */
    const long long per_token = shipped_kv_bytes_per_token("Qwen/Qwen3-32B"), budget = 1LL << 30;
    char want[400];
    snprintf(want, sizeof want,
             "To serve at least one request with the models's max seq len (40960), (%.2f GiB KV cache is needed, which "
             "is larger than the available KV cache memory (1.00 GiB). Based on the available memory, the estimated "
             "maximum model length is %lld.",
             40960.0 * (double)per_token / (double)(1LL << 30), budget / per_token);
    tu_run r = run_expect(offline_env, "generate Qwen/Qwen3-32B --load-format dummy --kv-cache-memory-bytes 1G --prompt hi", 1);
    CHECK_CONTAINS(r.err, want);
    CHECK_CONTAINS(r.err, "(Budget: kv_cache_memory_bytes=1073741824.)");
    CHECK_MSG(r.max_rss_kib < REFUSED_RSS_KIB, "refused at a peak of %ld MiB", r.max_rss_kib >> 10);
    tu_run_free(&r);

    /* A fraction of RAM too small for the weights themselves. */
    r = run_expect(offline_env, "generate Qwen/Qwen3-32B --load-format dummy --gpu-memory-utilization 0.001 --prompt hi", 1);
    CHECK_CONTAINS(r.err, "No available memory for the cache blocks: Qwen/Qwen3-32B takes 61.02 GiB of weights");
    CHECK_MSG(r.max_rss_kib < REFUSED_RSS_KIB, "refused at a peak of %ld MiB", r.max_rss_kib >> 10);
    tu_run_free(&r);

    /* The same arithmetic accepts a budget of exactly one request: 64 tokens of the fixture, whose 2
     * layers keep K and V of 2 heads × 32 f32 each, are 64 × 1024 bytes. */
    char *args = tu_strdupf("generate %s --max-model-len 64 --max-num-seqs 1 --prompt-token-ids 1,2,3 --max-tokens 2 "
                            "--kv-cache-memory-bytes %s",
                            fixture, "65536");
    r = run_expect("CVLLM_LOG_LEVEL=warning", args, 0);
    CHECK_CONTAINS(r.out, "Generated text: ");
    tu_run_free(&r);
    free(args);
    args = tu_strdupf("generate %s --max-model-len 64 --max-num-seqs 1 --prompt-token-ids 1,2,3 --max-tokens 2 "
                      "--kv-cache-memory-bytes %s",
                      fixture, "65535");
    r = run_expect("CVLLM_LOG_LEVEL=warning", args, 1);
    CHECK_CONTAINS(r.err, "the estimated maximum model length is 48.");
    tu_run_free(&r);
    free(args);
}

/* ---- --max-model-len above the model's ---------------------------------------------------------- */

static void test_long_max_model_len(const char *fixture) {
    static const char msg[] =
        "User-specified max_model_len (50000) is greater than the derived max_model_len (max_position_embeddings=40960 "
        "or model_max_length=None in model's config.json).";
    static const char caution[] =
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position encoding "
        "(RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, "
        "positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.";
    char *args = tu_strdupf("generate %s --max-model-len 50000 --max-num-seqs 1 --prompt-token-ids 1,2,3 --max-tokens 2%s",
                            fixture, "");
    char want[1024];
    snprintf(want, sizeof want,
             "cvllm generate: %s To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. %s\n",
             msg, caution);
    static const char *const refused_env[] = {"", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=0", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=yes"};
    for (size_t i = 0; i < 3; i++) {
        tu_run r = run_expect(refused_env[i], args, 1);
        CHECK_STR_EQ(tu_last_line(r.err), want);
        tu_run_free(&r);
    }
    /* The escape hatch: vLLM's warning, then the run goes on with the longer context. */
    snprintf(want, sizeof want, "%s %s", msg, caution);
    static const char *const allowed_env[] = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=True"};
    for (size_t i = 0; i < 2; i++) {
        tu_run r = run_expect(allowed_env[i], args, 0);
        CHECK_CONTAINS(r.err, "WARNING");
        CHECK_CONTAINS(r.err, want);
        CHECK_CONTAINS(r.out, "Generated text: ");
        tu_run_free(&r);
    }
    free(args);
}

/* ---- msModelSlim checkpoints ---------------------------------------------------------------------- */

static void test_quantized(const char *fixture) {
    /* The fixture's weights beside a quant_model_description.json: an msModelSlim folder (detected,
     * with a log line) that lacks its quant_model_weights*.safetensors. */
    char *src = tu_strdupf("%s/models/vllm-ascend/Qwen3-32B-W8A8/quant_model_description.json%s", CVLLM_SOURCE_DIR, "");
    tu_link(src, fixture, "quant_model_description.json");
    free(src);
    char *args = tu_strdupf("generate %s --max-model-len 64 --prompt-token-ids 1,2,3 --max-tokens 2%s", fixture, "");
    char *want = tu_strdupf("cvllm generate: no quant_model_weight*.safetensors in %s%s", fixture, "\n");
    tu_run r = run_expect("", args, 1);
    CHECK_STR_EQ(tu_last_line(r.err), want);
    CHECK_CONTAINS(r.err, "quant_model_description.json found: loading an msModelSlim W8A8 checkpoint");
    tu_run_free(&r);
    free(args);
    free(want);
    /* Its shape runs on random W8A8 weights: the description's schemes, the fixture's shapes. */
    args = tu_strdupf("generate %s --load-format dummy --quantization ascend --max-model-len 64 --prompt-token-ids 1,2,3 "
                      "--max-tokens 2%s",
                      fixture, "");
    r = run_expect("", args, 0);
    CHECK_CONTAINS(r.out, "Generated text: ");
    tu_run_free(&r);
    free(args);
    /* The tutorial's Qwen3.6 W8A8 id: its shipped config, refused for memory before any weight. */
    r = run_expect(offline_env, "generate Eco-Tech/Qwen3.6-35B-A3B-w8a8 --load-format dummy --kv-cache-memory-bytes 1G "
                                "--max-num-seqs 1 --prompt hi", 1);
    CHECK_CONTAINS(r.err, "To serve at least one request with the models's max seq len (262144)");
    CHECK_MSG(r.max_rss_kib < REFUSED_RSS_KIB, "refused at a peak of %ld MiB", r.max_rss_kib >> 10);
    tu_run_free(&r);
}

int main(void) {
    tmp = tu_make_temp_dir();
    offline_env = tu_strdupf("HF_HUB_CACHE=%s/hub HF_HUB_OFFLINE=1%s", tmp, "");
    no_network_env = tu_strdupf("HF_HUB_CACHE=%s/hub HF_ENDPOINT=http://127.0.0.1:9%s", tmp, "");
    char *fixture = tu_model_dir("qwen3-dense-f32");
    test_shipped_tokenizers();
    test_not_fetchable();
    test_fit(fixture);
    test_long_max_model_len(fixture);
    test_quantized(fixture);
    tu_remove_tree(fixture);
    tu_remove_tree(tmp);
    free(fixture);
    free(offline_env);
    free(no_network_env);
    free(tmp);
    return cv_check_summary("test_cli_startup");
}
