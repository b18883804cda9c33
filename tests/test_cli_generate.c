/*
 * test_cli_generate.c — `cvllm generate` and `cvllm bench latency` as a user runs them: output in
 * both formats, vLLM's RequestOutput JSON shape, the flags, and every error path with its message
 * and exit status.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

/* Runs and checks the exit status and the last line of stderr. */
static void expect_error(const char *tmp, const char *env, const char *args, int status, const char *msg) {
    tu_run r = tu_run_cvllm(tmp, env, args);
    CHECK_MSG(r.status == status, "exit %d (want %d) for: %s\n%s", r.status, status, args, r.err);
    CHECK_CONTAINS(tu_last_line(r.err), msg);
    tu_run_free(&r);
}

static void test_json_output(const char *tmp, const char *model) {
    char *args = tu_strdupf("generate %s --prompt-token-ids 1,2,3,4,5,6,7,8 --temperature 0 --max-tokens 8 "
                            "--logprobs 2 --prompt-logprobs 1 --output json --max-model-len 256%s",
                            model, "");
    tu_run r = tu_run_cvllm(tmp, "CVLLM_LOG_LEVEL=warning", args);
    free(args);
    CHECK_MSG(r.status == 0, "%s", r.err);
    json_error_t err;
    json_t *j = json_loads(r.out, 0, &err);
    CHECK_MSG(j != NULL, "not JSON: %s", r.out);
    if (j) {
        json_t *ref = tu_load_ref("qwen3-dense-f32", "short");
        CHECK(json_equal(json_object_get(j, "prompt_token_ids"), json_object_get(ref, "prompt")));
        json_t *out = json_array_get(json_object_get(j, "outputs"), 0);
        CHECK(json_equal(json_object_get(out, "token_ids"), json_object_get(ref, "greedy")));
        CHECK_STR_EQ(json_string_value(json_object_get(out, "finish_reason")), "length");
        CHECK_EQ_INT(json_integer_value(json_object_get(out, "index")), 0);
        CHECK(json_is_string(json_object_get(out, "text")));
        /* logprobs: one {"id": lp} object per token with the top-2 plus the chosen id. */
        json_t *lps = json_object_get(out, "logprobs");
        CHECK_EQ_INT(json_array_size(lps), 8);
        json_t *first = json_array_get(lps, 0);
        CHECK(json_object_size(first) >= 2 && json_object_size(first) <= 3);
        char key[16];
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(json_array_get(json_object_get(ref, "greedy"), 0)));
        CHECK(json_is_real(json_object_get(first, key)));
        /* prompt_logprobs: null first, then the top-1 plus the actual prompt token. */
        json_t *plp = json_object_get(j, "prompt_logprobs");
        CHECK_EQ_INT(json_array_size(plp), 8);
        CHECK(json_is_null(json_array_get(plp, 0)));
        CHECK(json_is_real(json_object_get(json_array_get(plp, 3), "4")));
        json_decref(ref);
        json_decref(j);
    }
    tu_run_free(&r);
}

/* The logprob of each generated token, from generate's JSON (the token's own entry). */
static void generated_logprobs(json_t *j, double *out, size_t n) {
    json_t *o = json_array_get(json_object_get(j, "outputs"), 0);
    json_t *ids = json_object_get(o, "token_ids"), *lps = json_object_get(o, "logprobs");
    for (size_t i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(json_array_get(ids, i)));
        out[i] = json_real_value(json_object_get(json_array_get(lps, i), key));
    }
}

/* How many times `needle` occurs in `s`. */
static int occurrences(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* A log line of `err` (INFO or WARNING, from its component on) said more than once, or NULL; the
 * result is malloc'ed. */
static char *repeated_log_line(const char *err) {
    for (const char *line = err, *end; *line; line = *end ? end + 1 : end) {
        end = line + strcspn(line, "\n");
        const char *from = memchr(line, '[', (size_t)(end - line));
        if (!from || (strncmp(line, "INFO ", 5) && strncmp(line, "WARNING ", 8))) continue;
        const size_t n = (size_t)(end - from);
        char *text = malloc(n + 1);
        memcpy(text, from, n);
        text[n] = '\0';
        if (occurrences(err, text) > 1) return text;
        free(text);
    }
    return NULL;
}

/* The environment of a -tp 2 run at the default log level (rank 0 logs info lines, the other ranks
 * warnings only); the test's own environment is OpenMPI's (tests/CMakeLists.txt CV_OPENMPI_TEST_ENV). */
#define TP_DEFAULT_LOG_ENV "env -u CVLLM_LOG_LEVEL"

/* Two ranks asked for by `two` (-tp 2, or a --config file's tensor_parallel_size), with `flags`:
 * cvllm starts them under mpirun itself; the f32 model of reference folder `folder` (its config.json
 * updated with the fields of `config`, when given) sharded over them gives the one-process run's
 * greedy tokens and logprobs, and the reference's greedy tokens unless the weights are made up
 * (--load-format dummy); at the default log level (TP_DEFAULT_LOG_ENV). */
static void test_tensor_parallel(const char *tmp, const char *folder, const char *config, const char *flags,
                                 const char *two) {
    char *model = tu_model_dir(folder);
    if (config) {
        char *path = tu_strdupf("%s/%s", model, "config.json");
        json_t *c = json_load_file(path, 0, NULL), *edit = json_loads(config, 0, NULL);
        json_object_update(c, edit);
        unlink(path); /* a link to the reference's */
        CHECK_EQ_INT(json_dump_file(c, path, 0), 0);
        json_decref(c);
        json_decref(edit);
        free(path);
    }
    double lp[2][8] = {{0}};
    json_t *ids[2] = {NULL, NULL};
    json_t *ref = strstr(flags, "dummy") ? NULL : tu_load_ref(folder, "short");
    for (int tp = 1; tp <= 2; tp++) {
        char *parallel = tu_strdupf("%s %s", tp == 1 ? "" : two, flags);
        char *args = tu_strdupf("generate %s --prompt-token-ids 1,2,3,4,5,6,7,8 --temperature 0 --max-tokens 8 "
                                "--logprobs 1 --output json --max-model-len 256 --dtype float32 --trust-remote-code %s",
                                model, parallel);
        tu_run r = tu_run_cvllm(tmp, TP_DEFAULT_LOG_ENV, args);
        free(args);
        free(parallel);
        CHECK_MSG(r.status == 0, "%s -tp %d %s: %s", folder, tp, flags, r.err);
        if (tp == 2) CHECK_CONTAINS(r.err, "tensor_parallel_size 2: starting 2 ranks under mpirun");
        /* the ranks parse the line again, but its notes are said once, by the process it was typed to */
        CHECK_MSG(occurrences(r.err, "--trust-remote-code is accepted and ignored") == 1, "-tp %d: %s", tp, r.err);
        /* and the launcher's own check of the options is silent but for its verdict: rank 0 logs it */
        char *again = repeated_log_line(r.err);
        CHECK_MSG(!again, "-tp %d: said more than once: %s", tp, again);
        free(again);
        json_t *j = json_loads(r.out, 0, NULL);
        CHECK_MSG(j != NULL, "-tp %d: not JSON: %s", tp, r.out);
        if (j) {
            json_t *out = json_array_get(json_object_get(j, "outputs"), 0);
            ids[tp - 1] = json_incref(json_object_get(out, "token_ids"));
            CHECK_MSG(!ref || json_equal(ids[tp - 1], json_object_get(ref, "greedy")), "%s -tp %d %s: %s", folder, tp,
                      flags, r.out);
            generated_logprobs(j, lp[tp - 1], 8);
            json_decref(j);
        }
        tu_run_free(&r);
    }
    CHECK_MSG(ids[0] && json_equal(ids[0], ids[1]), "%s: -tp 2 %s gave other tokens than one process", folder, flags);
    for (int i = 0; i < 8; i++)
        CHECK_MSG(fabs(lp[0][i] - lp[1][i]) <= 1e-4 * fmax(1.0, fabs(lp[0][i])), "%s token %d: logprob %.6f with "
                  "-tp 2 %s, %.6f without", folder, i, lp[1][i], flags, lp[0][i]);
    json_decref(ids[0]);
    json_decref(ids[1]);
    json_decref(ref);
    tu_remove_tree(model);
    free(model);
}

static void test_text_output_and_order(const char *tmp, const char *model) {
    /* Prompts of different lengths finish out of order; results still come in prompt order. */
    char *file = tu_strdupf("%s/%s", tmp, "prompts.txt");
    FILE *f = fopen(file, "w");
    fputs("I am in the house\n\n\"I am\\nin\"\n", f);
    fclose(f);
    char *args = tu_strdupf("generate %s --prompts-file %s --prompt 'I am' --max-tokens 3 --temperature 0 "
                            "--max-model-len 256",
                            model, file);
    tu_run r = tu_run_cvllm(tmp, "CVLLM_LOG_LEVEL=warning", args);
    CHECK_MSG(r.status == 0, "%s", r.err);
    const char *a = strstr(r.out, "Prompt: \"I am in the house\"");
    const char *b = strstr(r.out, "Prompt: \"I am\\nin\"");
    const char *c = strstr(r.out, "Prompt: \"I am\"\n");
    CHECK(a && b && c && a < b && b < c);
    CHECK_CONTAINS(r.out, "Generated text: \"");
    tu_run_free(&r);
    free(args);
    free(file);

    args = tu_strdupf("generate %s --prompt-token-ids 1,2,3 --n 2 --temperature 1 --seed 7 --max-tokens 4 "
                      "--max-model-len 64%s",
                      model, "");
    r = tu_run_cvllm(tmp, "CVLLM_LOG_LEVEL=warning", args);
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Generated text [0]: ");
    CHECK_CONTAINS(r.out, "Generated text [1]: ");
    /* --seed makes runs reproducible. */
    tu_run again = tu_run_cvllm(tmp, "CVLLM_LOG_LEVEL=warning", args);
    CHECK_STR_EQ(again.out, r.out);
    tu_run_free(&again);
    tu_run_free(&r);
    free(args);
}

static void test_errors(const char *tmp, const char *model) {
    char *a;
    expect_error(tmp, "", "generate", 2, "cvllm generate: no MODEL given");
    expect_error(tmp, "", "generate /nonexistent/model --prompt hi", 1, "/nonexistent/model");
    a = tu_strdupf("generate %s%s", model, "");
    expect_error(tmp, "", a, 2, "no prompt given");
    free(a);
    a = tu_strdupf("generate %s --prompt hi --bogus%s", model, "");
    expect_error(tmp, "", a, 2, "unknown option --bogus");
    free(a);
    a = tu_strdupf("generate %s --prompt hi --max-model-len abc%s", model, "");
    expect_error(tmp, "", a, 2, "--max-model-len expects an integer, got 'abc'");
    free(a);
    a = tu_strdupf("generate %s --prompt hi --temperature -1%s", model, "");
    expect_error(tmp, "CVLLM_LOG_LEVEL=warning", a, 1, "temperature must be non-negative");
    free(a);
    a = tu_strdupf("generate %s --prompt-token-ids 1,99999 %s", model, "--max-model-len 64");
    expect_error(tmp, "CVLLM_LOG_LEVEL=warning", a, 1, "Token id 99999 is out of vocabulary");
    free(a);
    a = tu_strdupf("generate %s --prompt-token-ids 1,x,3%s", model, "");
    expect_error(tmp, "", a, 2, "--prompt-token-ids expects an integer, got 'x'");
    free(a);
    a = tu_strdupf("generate %s --prompt hi --output yaml%s", model, "");
    expect_error(tmp, "", a, 2, "--output must be text or json");
    free(a);
    a = tu_strdupf("generate %s --prompt hi --logit-bias '[1]'%s", model, "");
    expect_error(tmp, "", a, 2, "--logit-bias expects a JSON object");
    free(a);
    a = tu_strdupf("generate %s --prompt hi --compilation-config '{bad'%s", model, "");
    expect_error(tmp, "", a, 2, "--compilation-config is not valid JSON");
    free(a);
    a = tu_strdupf("generate %s --prompt hi --load-format pt%s", model, "");
    expect_error(tmp, "", a, 1, "invalid load format 'pt'");
    free(a);
    a = tu_strdupf("generate %s --prompts-file /nonexistent/prompts%s", model, "");
    expect_error(tmp, "", a, 2, "--prompts-file: cannot read /nonexistent/prompts");
    free(a);
    /* A hub id that is not cached, with no reachable hub: one line that names the offline command. */
    char *env = tu_strdupf("HF_HUB_CACHE=%s/hub HF_ENDPOINT=http://127.0.0.1:9%s", tmp, "");
    tu_run r = tu_run_cvllm(tmp, env, "generate Qwen/Qwen3-0.6B --prompt 'Give me a short introduction.'");
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(tu_last_line(r.err), "cannot download Qwen/Qwen3-0.6B");
    CHECK_CONTAINS(tu_last_line(r.err), "cvllm generate Qwen/Qwen3-0.6B --prompt 'Give me a short introduction.' --load-format dummy");
    CHECK(strchr(r.err, '\n') == r.err + strlen(r.err) - 1); /* exactly one line */
    tu_run_free(&r);
    free(env);
}

/* A -tp N command that cannot run is refused by the process it was typed to, in one line and
 * before any rank starts: a bad flag, a quantization the checkpoint lacks, heads that do not split
 * over N, a max_model_len over the config's (the engine's checks, made before mpirun; bench latency
 * and serve share them). */
static void test_tp_refused(const char *tmp, const char *model) {
    static const struct {
        const char *args, *error;
        int status;
    } cases[] = {
        {"generate %s -tp 2 --prompt hi --bogus", "cvllm generate: unknown option --bogus", 2},
        {"generate %s -tp 2 --prompt hi --quantization ascend", "cvllm generate: Cannot find the config file for ascend",
         1},
        {"generate %s -tp 3 --prompt hi", "cvllm generate: num_attention_heads=4 and num_key_value_heads=2 do not split", 1},
        {"bench latency --model %s -tp 2 --max-model-len 99999", "cvllm bench latency: User-specified max_model_len", 1},
        {"serve %s -tp 2 --load-format dummy --max-model-len 99999", "cvllm serve: User-specified max_model_len", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *args = tu_strdupf(cases[i].args, model, "");
        tu_run r = tu_run_cvllm(tmp, "CVLLM_LOG_LEVEL=warning", args);
        CHECK_MSG(r.status == cases[i].status, "%s: status %d\n%s", args, r.status, r.err);
        CHECK_MSG(!strncmp(tu_last_line(r.err), cases[i].error, strlen(cases[i].error)), "%s: %s", args, r.err);
        CHECK_MSG(occurrences(r.err, cases[i].error) == 1 && !strstr(r.err, "mpirun"), "%s: %s", args, r.err);
        tu_run_free(&r);
        free(args);
    }
}

/* The launcher checks a -tp 2 command's options as the engine would, then rank 0 checks them again
 * and logs what it finds: a quantized checkpoint's "found" line is said once, by rank 0. */
static void test_tp_logs_once(const char *tmp) {
    char *model = tu_model_dir("qwen3-dense-w8a8-dynamic");
    static const char *files[] = {"quant_model_description.json", "quant_model_weights.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *from = tu_strdupf("%s/vectors/qwen3-dense-w8a8-dynamic/%s", CVLLM_TEST_DATA, files[i]);
        tu_link(from, model, files[i]);
        free(from);
    }
    char *args = tu_strdupf("generate %s -tp 2 --prompt-token-ids 1,2,3 --max-tokens 2%s", model, "");
    tu_run r = tu_run_cvllm(tmp, TP_DEFAULT_LOG_ENV, args);
    CHECK_MSG(r.status == 0, "%s: status %d\n%s", args, r.status, r.err);
    CHECK_MSG(occurrences(r.err, "quant_model_description.json found") == 1, "%s: %s", args, r.err);
    char *again = repeated_log_line(r.err);
    CHECK_MSG(!again, "%s: said more than once: %s", args, again);
    free(again);
    tu_run_free(&r);
    free(args);
    tu_remove_tree(model);
    free(model);
}

/* A -tp 2 job whose ranks fail to load the model (a dense config over MoE weights: the checks before
 * mpirun read no tensor) says why once, from rank 0, and exits 1: the workers end without a word.
 * Rank 0 hands its status to the launcher in a file (cli/launch.c), which is gone afterwards. A model
 * without a tokenizer is refused by the launcher's check, in one line, with no ranks started. */
static void test_tp_load_failure(const char *tmp) {
    char *model = tu_model_dir_over("qwen3-dense-f32", "qwen3-moe-f32");
    char *jobs = tu_strdupf("%s/%s", tmp, "jobs");
    CHECK(mkdir(jobs, 0700) == 0);
    char *env = tu_strdupf("TMPDIR=%s CVLLM_LOG_LEVEL=warning%s", jobs, "");
    static const char *const commands[] = {"generate %s -tp 2 --prompt hi --max-tokens 2 --dtype float32",
                                           "serve %s -tp 2 --host 127.0.0.1 --port 0 --dtype float32"};
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        char *args = tu_strdupf(commands[i], model, "");
        tu_run r = tu_run_cvllm(tmp, env, args);
        const char *cmd = i ? "serve" : "generate";
        char *error = tu_strdupf("cvllm %s: missing tensor model.layers.0.%s", cmd, "");
        CHECK_MSG(r.status == 1, "%s: status %d\n%s", args, r.status, r.err);
        CHECK_MSG(occurrences(r.err, error) == 1, "%s: %s", args, r.err); /* LeakSanitizer's lines may follow */
        CHECK_MSG(tu_dir_entries(jobs) == 0, "%s: the job's status file is left in %s", args, jobs);
        tu_run_free(&r);
        free(error);
        free(args);
    }
    char *tokenizer = tu_strdupf("%s/%s", model, "tokenizer.json");
    CHECK(unlink(tokenizer) == 0);
    char *args = tu_strdupf("serve %s -tp 2 --host 127.0.0.1 --port 0 --dtype float32%s", model, "");
    tu_run r = tu_run_cvllm(tmp, env, args);
    CHECK_MSG(r.status == 1, "%s: status %d\n%s", args, r.status, r.err);
    char *error = tu_strdupf("cvllm serve: cannot open %s: No such file or directory\n%s", tokenizer, "");
    CHECK_MSG(!strcmp(r.err, error), "%s: %s", args, r.err);
    tu_run_free(&r);
    free(error);
    free(args);
    free(tokenizer);
    free(env);
    tu_remove_tree(jobs);
    free(jobs);
    tu_remove_tree(model);
    free(model);
}

/* The offline fallback works: the shipped Qwen3-0.6B config with dummy weights. */
static void test_dummy_model(const char *tmp) {
    char *env = tu_strdupf("CVLLM_LOG_LEVEL=warning HF_HUB_CACHE=%s/hub HF_HUB_OFFLINE=1%s", tmp, "");
    tu_run r = tu_run_cvllm(tmp, env,
                            "generate Qwen/Qwen3-0.6B --load-format dummy --max-model-len 128 --max-tokens 2 "
                            "--prompt 'Give me a short introduction to large language models.'");
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Prompt: \"Give me a short introduction to large language models.\"");
    tu_run_free(&r);
    r = tu_run_cvllm(tmp, env,
                     "bench latency --model Qwen/Qwen3-0.6B --load-format dummy --max-model-len 128 --input-len 8 "
                     "--output-len 2 --batch-size 1 --num-iters-warmup 0 --num-iters 1");
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Avg latency: ");
    CHECK_CONTAINS(r.out, "Prefill throughput: ");
    CHECK_CONTAINS(r.out, "Decode throughput: ");
    tu_run_free(&r);
    free(env);
}

int main(void) {
    char *tmp = tu_make_temp_dir();
    char *model = tu_model_dir("qwen3-dense-f32");
    test_json_output(tmp, model);
    static const char yaml[] = "tensor_parallel_size: 2\n"; /* the launcher reads the parsed options */
    tu_write_file(tmp, "tp2.yaml", yaml, sizeof yaml - 1);
    char *from_yaml = tu_strdupf("--config %s/%s", tmp, "tp2.yaml");
    test_tensor_parallel(tmp, "qwen3-dense-f32", NULL, "", from_yaml);
    free(from_yaml);
    test_tensor_parallel(tmp, "qwen3-moe-f32", NULL, "--enable-expert-parallel", "-tp 2");
    test_tensor_parallel(tmp, "qwen3.5-moe-f32", NULL, "--enable-expert-parallel", "-tp 2");
    /* an FP8 model sharded end to end (made-up weights in the FP8 fixture's format, its shape widened
     * so that every shard starts on 16 rows and 128 columns): it launches, loads its scale blocks
     * per rank and generates; test_quant_model checks the split linears' numbers */
    test_tensor_parallel(tmp, "qwen3-dense-fp8",
                         "{\"intermediate_size\": 512, \"num_attention_heads\": 12, \"num_key_value_heads\": 6}",
                         "--load-format dummy", "-tp 2");
    test_tp_refused(tmp, model);
    test_tp_logs_once(tmp);
    test_tp_load_failure(tmp);
    test_text_output_and_order(tmp, model);
    test_errors(tmp, model);
    test_dummy_model(tmp);
    tu_remove_tree(model);
    tu_remove_tree(tmp);
    free(model);
    free(tmp);
    return cv_check_summary("test_cli_generate");
}
