/*
 * test_cli_args.c — vLLM's argument parsing (src/cli/args*.c) through the cvllm binary, for every
 * subcommand: `--flag_name` spellings, argparse abbreviations (unique, ambiguous, exact beats
 * prefix), `--flag=value`, the -O forms, dotted JSON arguments, `--config FILE.yaml`, the engine
 * flags every engine command shares and their validation, the offline hint, and the tutorials'
 * `vllm serve` / `vllm bench serve` lines.
 *
 * Most checks stop before any model is loaded: a usage error exits 2, while a command that parsed
 * fine and then fails on a model folder that does not exist exits 1 naming it. Where a value must be
 * seen to arrive, the tiny f32 reference checkpoint generates a few tokens (--output json), or the
 * engine's own validation of the value answers (the speculative config). The binary is started
 * without a shell, so arguments with spaces and JSON need no quoting.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "check.h"
#include "testutil.h"

static char *tmp_dir;   /* scratch folder, also the commands' working directory */
static char *model_dir; /* tiny f32 checkpoint with the shipped tokenizer */

/* Runs PROG (a path, or a name looked up in PATH) with `args` (NULL-terminated) in tmp_dir, with the
 * extra environment `env` ("K=V" strings, NULL-terminated, may be NULL). */
static tu_run run_prog(const char *prog, const char *const *env, const char *const *args) {
    return tu_run_exec(tmp_dir, NULL, env, prog, args);
}

/* Runs the binary with `args`, logging at info. */
static tu_run run(const char *const *args) {
    static const char *const env[] = {"CVLLM_LOG_LEVEL=info", NULL};
    return run_prog(CVLLM_BINARY, env, args);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A usage error: status 2 and `message` in the one line printed. */
static void expect_usage(const char *const *args, const char *message) {
    tu_run r = run(args);
    CHECK_MSG(r.status == 2, "status %d (want 2) for %s ... %s\n%s", r.status, args[0], message, r.err);
    CHECK_CONTAINS(tu_last_line(r.err), message);
    tu_run_free(&r);
}

/* Parsed fine: the command went on and failed on the missing model (or tokenizer) /nonexistent.
 * Returns stderr for more checks (the caller frees it). */
static char *expect_parsed(const char *const *args) {
    tu_run r = run(args);
    CHECK_MSG(r.status == 1, "status %d (want 1) for %s %s\n%s", r.status, args[0], args[1], r.err);
    CHECK_CONTAINS(tu_last_line(r.err), "/nonexistent");
    free(r.out);
    return r.err;
}

/* The token ids of the first completion of `cvllm generate ... --output json`. */
static size_t generated_tokens(const tu_run *r) {
    json_t *j = json_loads(r->out, JSON_DISABLE_EOF_CHECK, NULL);
    size_t n = json_array_size(json_object_get(json_array_get(json_object_get(j, "outputs"), 0), "token_ids"));
    json_decref(j);
    return n;
}

static void write_file(const char *name, const char *text) { tu_write_file(tmp_dir, name, text, strlen(text)); }

static void test_spellings(void) {
    /* --flag_name is --flag-name, with =value too; the value itself keeps its underscores */
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "--max_model_len", "abc"),
                 "--max-model-len expects an integer, got 'abc'");
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "--max_model_len=x_y"),
                 "--max-model-len expects an integer, got 'x_y'");
    tu_run r = run(ARGS("generate", model_dir, "--prompt_token_ids=1,2,3", "--max_tokens", "2", "--temperature=0",
                        "--output=json", "--max-model-len", "64"));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_EQ_INT(generated_tokens(&r), 2);
    tu_run_free(&r);
    /* a switch takes no =value (argparse: "ignored explicit argument") */
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "--ignore-eos=1"),
                 "argument --ignore-eos: ignored explicit argument '1'");
}

static void test_abbreviations(void) {
    /* unique prefixes, with a value after a space or '=' */
    tu_run r = run(ARGS("generate", model_dir, "--prompt-tok", "1,2,3", "--max-tok", "3", "--temp=0", "--out", "json",
                        "--max-model", "64"));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_EQ_INT(generated_tokens(&r), 3);
    tu_run_free(&r);
    /* exact beats prefix: --prompt is itself a prefix of --prompt-token-ids, --prompts-file, ... */
    r = run(ARGS("generate", model_dir, "--prompt", "I am", "--max-tokens", "1", "--output", "json", "--max-model-len", "64"));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_EQ_INT(generated_tokens(&r), 1);
    tu_run_free(&r);
    /* --n is exact, though --no-skip-special-tokens and --num-threads start with it */
    free(expect_parsed(ARGS("generate", "/nonexistent", "--prompt", "hi", "--n", "2")));
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "--n", "x"), "--n expects an integer");
    /* ambiguous: argparse's message names every candidate */
    expect_usage(ARGS("bench", "serve", "--num", "5"), "ambiguous option: --num could match --num-prompts, --num-warmups");
    expect_usage(ARGS("generate", "/nonexistent", "--prompt-", "x"),
                 "ambiguous option: --prompt- could match --prompt-token-ids, --prompt-logprobs");
    expect_usage(ARGS("serve", "/nonexistent", "--max-num=4"),
                 "ambiguous option: --max-num=4 could match --max-num-seqs, --max-num-batched-tokens");
    /* a prefix of nothing is still unknown; prefixes work in every command */
    expect_usage(ARGS("bench", "latency", "--model", "/nonexistent", "--zzz"), "unknown option --zzz");
    expect_usage(ARGS("bench", "throughput", "--model", "/nonexistent", "--input", "x"), "--input-len expects an integer");
    expect_usage(ARGS("bench", "latency", "--model", "/nonexistent", "--batch", "x"), "--batch-size expects an integer");
    expect_usage(ARGS("serve", "/nonexistent", "--por", "x"), "--port expects an integer");
    /* as in vLLM, whose serve has --pooler-config beside --port */
    expect_usage(ARGS("serve", "/nonexistent", "--po", "x"), "ambiguous option: --po could match --port, --pooler-config");
    r = run(ARGS("tokenize", model_dir, "--te", "Hello"));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_STR_EQ(r.out, "[9707]\n");
    tu_run_free(&r);
    /* the --no- forms of the ignored bool flags take part too */
    char *err = expect_parsed(ARGS("generate", "/nonexistent", "--prompt", "hi", "--no-enforce"));
    CHECK_CONTAINS(err, "--no-enforce-eager is accepted and ignored");
    free(err);
}

static void test_optimization_level(void) {
    char *err = expect_parsed(ARGS("generate", "/nonexistent", "--prompt", "hi", "-O3", "-O", "2", "-O=1", "-O0"));
    CHECK_CONTAINS(err, "--optimization-level 3 is accepted and ignored");
    CHECK_CONTAINS(err, "--optimization-level 2 is accepted and ignored");
    CHECK_CONTAINS(err, "--optimization-level 1 is accepted and ignored");
    CHECK_CONTAINS(err, "--optimization-level 0 is accepted and ignored");
    free(err);
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "-O5"),
                 "argument --optimization-level: invalid choice: '5' (choose from '0', '1', '2', '3')");
    expect_usage(ARGS("serve", "/nonexistent", "-O=x"), "invalid choice: 'x'");
    expect_usage(ARGS("bench", "latency", "--model", "/nonexistent", "-O", "9"), "invalid choice: '9'");
    expect_usage(ARGS("serve", "/nonexistent", "-O"), "--optimization-level needs a value");
}

static void test_dotted_json(void) {
    /* dotted keys merge into one object, and over the flag's whole JSON: the engine sees method from
     * the object and num_speculative_tokens from the dotted key (without the merge it would ask for
     * the method) */
    tu_run r = run(ARGS("generate", model_dir, "--prompt", "hi", "--speculative-config", "{\"method\": \"ngram\"}",
                        "--speculative_config.num_speculative_tokens", "0"));
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(tu_last_line(r.err), "\"num_speculative_tokens\" must be an integer");
    tu_run_free(&r);
    r = run(ARGS("generate", model_dir, "--prompt", "hi", "-sc.method=ngram", "--speculative-config.num_speculative_tokens",
                 "99"));
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(tu_last_line(r.err), "\"num_speculative_tokens\" must be an integer");
    tu_run_free(&r);
    /* a dotted key that runs: ngram speculation on the tiny model, greedy output of 4 tokens */
    r = run(ARGS("generate", model_dir, "--prompt-token-ids", "1,2,1,2,1,2", "--max-tokens", "4", "--temperature", "0",
                 "--output", "json", "--max-model-len", "64", "--speculative-config.method", "ngram",
                 "--speculative-config.num_speculative_tokens", "2"));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_EQ_INT(generated_tokens(&r), 4);
    tu_run_free(&r);
    /* compilation config: -cc and -O. are its short names; lists append with key+ */
    char *err = expect_parsed(ARGS("generate", "/nonexistent", "--prompt", "hi", "--compilation-config.cudagraph_mode",
                                   "full_decode_only", "-cc.cudagraph_capture_sizes+", "1,8", "-O.mode=3",
                                   "--compilation-config.cudagraph_capture_sizes+=16"));
    CHECK_CONTAINS(err, "--compilation-config is accepted and ignored");
    free(err);
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "--compilation-config.bogus", "1"),
                 "1 validation error for CompilationConfig: bogus: Unexpected keyword argument");
    expect_usage(ARGS("serve", "/nonexistent", "-cc.cudagraph_mode=SOMETIMES"),
                 "cudagraph_mode: Input should be 'NONE', 'PIECEWISE', 'FULL', 'FULL_DECODE_ONLY' or 'FULL_AND_PIECEWISE'");
    expect_usage(ARGS("serve", "/nonexistent", "-cc.cudagraph_capture_sizes+", "1,0"),
                 "cudagraph_capture_sizes: Input should be a list of positive integers");
    /* merged over the whole object: its keys are checked along with the dotted ones */
    expect_usage(ARGS("serve", "/nonexistent", "-cc", "{\"bogus\": 1}", "-cc.cudagraph_mode", "FULL"),
                 "bogus: Unexpected keyword argument");
    /* a negative number is a value, not a dotted option */
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "--max-tokens", "-1.5"),
                 "--max-tokens expects an integer, got '-1.5'");
    expect_usage(ARGS("serve", "/nonexistent", "--speculative-config.method"), "--speculative-config.method needs a value");
    expect_usage(ARGS("serve", "/nonexistent", "--override-generation-config", "[0.5]"),
                 "--override-generation-config must be a JSON object");
    expect_usage(ARGS("serve", "/nonexistent", "--prefix-caching-hash-algo", "md5"),
                 "argument --prefix-caching-hash-algo: invalid choice: 'md5'");
}

static void test_config_file(void) {
    char *path = tu_strdupf("%s/%s", tmp_dir, "flat.yaml");
    /* flat keys, a YAML int in hex, a bool false without a --no- form in generate (dropped) */
    write_file("flat.yaml", "prompt_token_ids: \"1,2,3\"\nmax-tokens: 0x3\ntemperature: 0\noutput: json\n"
                            "max-model-len: 64\nignore-eos: false\n");
    tu_run r = run(ARGS("generate", model_dir, "--config", path));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_EQ_INT(generated_tokens(&r), 3);
    tu_run_free(&r);
    /* the command line wins over the file, wherever it stands */
    r = run(ARGS("generate", "--max-tokens", "2", "--config", path, model_dir));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_EQ_INT(generated_tokens(&r), 2);
    tu_run_free(&r);
    free(path);
    /* a nested mapping is the flag's JSON; a merge key (<<) merges, the mapping's own keys win: the
     * engine sees the method from the merge and num_speculative_tokens 0, not 5 */
    path = tu_strdupf("%s/%s", tmp_dir, "nested.yml");
    write_file("nested.yml", "speculative-config:\n  <<: {method: ngram, num_speculative_tokens: 5}\n"
                             "  num_speculative_tokens: 0\n");
    r = run(ARGS("generate", model_dir, "--prompt", "hi", "--config", path));
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(tu_last_line(r.err), "\"num_speculative_tokens\" must be an integer");
    tu_run_free(&r);
    free(path);
    /* bools: true is the flag, false its --no- form; lists are the flag followed by the items */
    path = tu_strdupf("%s/%s", tmp_dir, "serve.yaml");
    write_file("serve.yaml", "enable-expert-parallel: false\ntrust_remote_code: yes\nserved-model-name: [a, b]\n"
                             "compilation-config: {cudagraph_mode: FULL_DECODE_ONLY, cudagraph_capture_sizes: [1, 8]}\n"
                             "tensor-parallel-size: 2\nport: 8000\n");
    char *err = expect_parsed(ARGS("serve", "/nonexistent", "--config", path));
    CHECK_MSG(!strstr(err, "expert-parallel is accepted"), "--no-enable-expert-parallel is an engine option: %s", err);
    CHECK_CONTAINS(err, "--trust-remote-code is accepted and ignored");
    CHECK_CONTAINS(err, "--compilation-config is accepted and ignored");
    free(err);
    free(path);
    /* every bool of vLLM's serve has its --no- form (argparse's BooleanOptionalAction) */
    err = expect_parsed(ARGS("serve", "/nonexistent", "--no-enable-auto-tool-choice", "--no-trust-request-chat-template",
                             "--no-enable-prompt-tokens-details", "--no-return-tokens-as-token-ids",
                             "--enable-tokenizer-info-endpoint", "--no-enable-log-requests", "--no-enable-log-outputs",
                             "--no-async-scheduling", "--no-disable-log-stats", "--no-allow-credentials",
                             "--no-enable-ssl-refresh", "--no-tokens-only", "--no-disable-fastapi-docs",
                             "--cohere-format", "cmd3", "--no-enable-flash-late-interaction"));
    CHECK_CONTAINS(err, "--cohere-format cmd3 is accepted and ignored");
    CHECK_MSG(!strstr(err, "unknown option"), "%s", err);
    free(err);
    path = tu_strdupf("%s/%s", tmp_dir, "bench.yaml");
    write_file("bench.yaml", "goodput: [ttft:5, latency:5]\n");
    expect_usage(ARGS("bench", "serve", "--config", path), "unknown metric 'latency'");
    write_file("bench.yaml", "metadata: [a=1, nokey]\n");
    expect_usage(ARGS("bench", "serve", "--config", path), "--metadata 'nokey': use KEY=VALUE");
    free(path);
    /* the file's errors, in vLLM's words where vLLM has them */
    path = tu_strdupf("%s/%s", tmp_dir, "flags.json");
    write_file("flags.json", "{}");
    expect_usage(ARGS("serve", "/nonexistent", "--config", path), "Config file must be of a yaml/yml type. json supplied");
    free(path);
    expect_usage(ARGS("serve", "/nonexistent", "--config", "/nonexistent/c.yaml"),
                 "Unable to read the config file at /nonexistent/c.yaml. Check path correctness");
    expect_usage(ARGS("serve", "/nonexistent", "--config"), "No config file specified!");
    expect_usage(ARGS("serve", "/nonexistent", "--config", "a.yaml", "--config", "b.yaml"), "More than one config file specified!");
    path = tu_strdupf("%s/%s", tmp_dir, "bad.yaml");
    write_file("bad.yaml", "port: [8000\n");
    expect_usage(ARGS("serve", "/nonexistent", "--config", path), "bad.yaml: did not find expected ',' or ']'");
    write_file("bad.yaml", "- port\n");
    expect_usage(ARGS("serve", "/nonexistent", "--config", path), "expected a mapping of flag names to values");
    write_file("bad.yaml", "port: eighty\n");
    expect_usage(ARGS("serve", "/nonexistent", "--config", path), "--port expects an integer, got 'eighty'");
    free(path);
}

/* The flags every engine command shares, on each of them. */
static void test_engine_flags(void) {
    static const char *const engine_flags[] = {
        "-tp", "1", "-pp", "2", "--data-parallel-size", "1", "--enable-expert-parallel", "--distributed-executor-backend",
        "mp", "--compilation-config", "{\"cudagraph_mode\": \"FULL_DECODE_ONLY\", \"cudagraph_capture_sizes\": [1,8]}",
        "--additional-config", "{\"enable_cpu_binding\": true}", "--trust-remote-code", "--enforce-eager", "-q", "fp8",
        "--kv-cache-dtype", "auto", "--no-enable-chunked-prefill", "--swap-space", "4", "--scheduling-policy", "fcfs",
    };
    static const char *const commands[][5] = {
        {"serve", "/nonexistent"},
        {"generate", "/nonexistent", "--prompt", "hi"},
        {"bench", "throughput", "--model", "/nonexistent", "--input-len"},
        {"bench", "latency", "--model", "/nonexistent"},
    };
    for (size_t c = 0; c < CV_ARRAY_LEN(commands); c++) {
        const char *args[64];
        size_t n = 0;
        for (size_t k = 0; k < 5 && commands[c][k]; k++) args[n++] = commands[c][k];
        if (!strcmp(args[n - 1], "--input-len")) args[n++] = "8";
        for (size_t k = 0; k < CV_ARRAY_LEN(engine_flags); k++) args[n++] = engine_flags[k];
        args[n] = NULL;
        char *err = expect_parsed(args);
        CHECK_CONTAINS(err, "--pipeline-parallel-size 2: running in one process");
        CHECK_MSG(!strstr(err, "expert-parallel is accepted"), "--enable-expert-parallel is an engine option: %s", err);
        CHECK_CONTAINS(err, "--distributed-executor-backend mp is accepted and ignored");
        CHECK_CONTAINS(err, "--compilation-config is accepted and ignored");
        CHECK_CONTAINS(err, "--additional-config is accepted and ignored");
        CHECK_CONTAINS(err, "--quantization fp8 is passed to the engine");
        CHECK_MSG(!strstr(err, "--data-parallel-size 1: running"), "a size of 1 is not worth a line: %s", err);
        free(err);
    }
    /* validation, in vLLM's words */
    expect_usage(ARGS("generate", "/nonexistent", "--prompt", "hi", "--distributed-executor-backend", "slurm"),
                 "argument --distributed-executor-backend: invalid choice: 'slurm' (choose from 'ray', 'mp', 'uni', "
                 "'external_launcher', 'mpi')");
    expect_usage(ARGS("bench", "latency", "--model", "/nonexistent", "--quantization", "int3"),
                 "Unknown quantization method: int3. Must be one of ['awq',");
    expect_usage(ARGS("serve", "/nonexistent", "-tp", "0"), "--tensor-parallel-size must be in [1,");
    expect_usage(ARGS("serve", "/nonexistent", "-dp", "two"), "--data-parallel-size expects an integer");
    expect_usage(ARGS("serve", "/nonexistent", "--limit-concurrency", "0"), "--limit-concurrency must be in [1, 1048576]");
    expect_usage(ARGS("serve", "/nonexistent", "--limit-concurrency-per-client", "-3"),
                 "--limit-concurrency-per-client must be in [1, 1048576]");
    expect_usage(ARGS("serve", "/nonexistent", "--timeout-keep-alive", "abc"), "--timeout-keep-alive expects a number");
    expect_usage(ARGS("serve", "/nonexistent", "--timeout-request-header", "0"), "--timeout-request-header must be in");
    expect_usage(ARGS("serve", "/nonexistent", "--additional-config", "[1]"), "--additional-config must be a JSON object");
    expect_usage(ARGS("serve", "/nonexistent", "--additional-config", "{nope"), "--additional-config is not valid JSON");
    expect_usage(ARGS("serve", "/nonexistent", "--speculative-config", "3"), "--speculative-config must be a JSON object");
    expect_usage(ARGS("serve", "/nonexistent", "--compilation-config", "{\"cudagraph_capture_sizes\": [1, -8]}"),
                 "cudagraph_capture_sizes: Input should be a list of positive integers");
    expect_usage(ARGS("serve", "/nonexistent", "--compilation-config", "{\"mode\": \"FAST\"}"),
                 "mode: Invalid compilation mode");
    expect_usage(ARGS("serve", "/nonexistent", "--compilation-config", "7"),
                 "--compilation-config must be a JSON object (or a compilation level 0-3)");
    char *err = expect_parsed(ARGS("serve", "/nonexistent", "--compilation-config", "3", "--scheduling-policy", "priority"));
    CHECK_CONTAINS(err, "--compilation-config is accepted and ignored");
    free(err);
    expect_usage(ARGS("serve", "/nonexistent", "--scheduling-policy", "lifo"),
                 "argument --scheduling-policy: invalid choice: 'lifo' (choose from 'fcfs', 'priority')");
    /* --scheduling-policy reaches the engine */
    tu_run r = run(ARGS("generate", model_dir, "--prompt-token-ids", "1,2,3", "--max-tokens", "2", "--output", "json",
                        "--max-model-len", "64", "--scheduling-policy", "priority"));
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.err, "scheduling policy priority");
    CHECK_EQ_INT(generated_tokens(&r), 2);
    tu_run_free(&r);
    expect_usage(ARGS("serve", "/nonexistent", "--swap-space", "lots"), "--swap-space expects a number");
    /* the loader's and the hybrid state's flags: parsed, then the engine's (test_engine_params) */
    err = expect_parsed(ARGS("serve", "/nonexistent", "--ignore-patterns", "original/**/*", "*.pth",
                             "--language-model-only", "--mamba-cache-mode", "align", "--mamba-block-size", "64",
                             "--model-loader-extra-config", "{\"num_threads\": 2}"));
    CHECK_CONTAINS(err, "--ignore-patterns is accepted and ignored");
    CHECK_CONTAINS(err, "--language-model-only is accepted and ignored");
    free(err);
    /* more of EngineArgs: GPU, multimodal and multi-node knobs */
    err = expect_parsed(ARGS("serve", "/nonexistent", "--num-gpu-blocks-override", "20", "--cudagraph-capture-sizes",
                             "1", "8", "--cuda-graph-sizes", "4", "-dcp", "1", "--all2all-backend", "naive",
                             "--media-io-kwargs", "{\"video\": {\"num_frames\": 8}}", "--mm-processor-cache-type",
                             "shm", "--no-aggregate-engine-logging", "--logits-processor-pattern", "x.*",
                             "--disable-frontend-multiprocessing", "--prefix-match-unit", "64",
                             "--enable-mamba-fine-grained-prefix-cache"));
    CHECK_CONTAINS(err, "--cudagraph-capture-sizes is accepted and ignored");
    CHECK_CONTAINS(err, "--media-io-kwargs is accepted and ignored");
    CHECK_CONTAINS(err, "--no-aggregate-engine-logging is accepted and ignored");
    CHECK_CONTAINS(err, "--disable-frontend-multiprocessing is accepted and ignored");
    CHECK_CONTAINS(err, "--prefix-match-unit 64 is accepted and ignored");
    free(err);
    expect_usage(ARGS("serve", "/nonexistent", "--cudagraph-capture-sizes", "1", "0"),
                 "--cudagraph-capture-sizes must be in [1, 2147483647], got '0'");
    expect_usage(ARGS("serve", "/nonexistent", "--media-io-kwargs", "3"), "--media-io-kwargs must be a JSON object");
    expect_usage(ARGS("serve", "/nonexistent", "--num-gpu-blocks-override", "0"), "--num-gpu-blocks-override must be in");
    expect_usage(ARGS("serve", "/nonexistent", "--data-parallel-rank", "0"),
                 "--data-parallel-rank is not supported: data parallelism across machines");
    expect_usage(ARGS("serve", "/nonexistent", "--scheduler-cls", "my.Scheduler"),
                 "--scheduler-cls is not supported: cvllm cannot load Python plugins");
    expect_usage(ARGS("serve", "/nonexistent", "--mamba-cache-mode", "some"),
                 "argument --mamba-cache-mode: invalid choice: 'some' (choose from 'align', 'all', 'none')");
    expect_usage(ARGS("serve", "/nonexistent", "--mamba-block-size", "0"), "--mamba-block-size must be in [1,");
    expect_usage(ARGS("serve", "/nonexistent", "--model-loader-extra-config", "[]"),
                 "--model-loader-extra-config must be a JSON object");
    expect_usage(ARGS("serve", "/nonexistent", "--ignore-patterns", "--language-model-only"),
                 "--ignore-patterns needs at least one value");
    /* the engine refuses what vLLM's config validation refuses */
    r = run(ARGS("generate", model_dir, "--prompt-token-ids", "1,2,3", "--max-tokens", "2", "--max-model-len", "64",
                 "--no-enable-prefix-caching", "--mamba-block-size", "32"));
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(tu_last_line(r.err), "--mamba-block-size can only be set with --enable-prefix-caching");
    tu_run_free(&r);
}

/* --structured-outputs-config: vLLM's StructuredOutputsConfig keys and checks, whole or dotted. */
static void test_structured_outputs_config(void) {
    const char *flag = "--structured-outputs-config";
    expect_usage(ARGS("serve", "/nonexistent", flag, "[1]"), "--structured-outputs-config must be a JSON object, got [1]");
    expect_usage(ARGS("serve", "/nonexistent", flag, "{nope"), "--structured-outputs-config must be a JSON object: ");
    expect_usage(ARGS("serve", "/nonexistent", flag, "{\"backend\": \"fast\", \"bogus\": 1}"),
                 "argument --structured-outputs-config: 2 validation errors for StructuredOutputsConfig: backend: Input "
                 "should be 'auto', 'xgrammar', 'guidance', 'outlines' or 'lm-format-enforcer'; bogus: Unexpected keyword "
                 "argument");
    expect_usage(ARGS("serve", "/nonexistent", flag, "{\"enable_in_reasoning\": \"maybe\"}"),
                 "enable_in_reasoning: Input should be a valid boolean, unable to interpret input");
    expect_usage(ARGS("serve", "/nonexistent", flag, "{\"disable_any_whitespace\": true}"),
                 "1 validation error for StructuredOutputsConfig: disable_any_whitespace is only supported for xgrammar "
                 "and guidance backends.");
    expect_usage(ARGS("serve", "/nonexistent", "--structured-outputs-config.backend", "xgrammar",
                      "--structured-outputs-config.disable_additional_properties=true"),
                 "disable_additional_properties is only supported for the guidance backend.");
    expect_usage(ARGS("serve", "/nonexistent", flag, "{\"reasoning_parser\": \"deepseek_r1\"}"),
                 "invalid reasoning parser: deepseek_r1 (chose from { qwen3 })");
    expect_usage(ARGS("serve", "/nonexistent", flag, "{\"reasoning_parser_plugin\": \"my_parser.py\"}"),
                 "reasoning_parser_plugin: cvllm loads no Python plugins");
    expect_usage(ARGS("serve", "/nonexistent", flag, "{\"whitespace_pattern\": 3}"),
                 "whitespace_pattern: Input should be a valid string");
    /* Accepted: dotted keys (values read as JSON, else as text, as args.c merges them), Python's
     * True, every backend; the one engine behind them all is said once. */
    char *err = expect_parsed(ARGS("serve", "/nonexistent", "--structured-outputs-config.backend", "guidance",
                                   "--structured_outputs_config.disable_any_whitespace", "true",
                                   "--structured-outputs-config.disable_additional_properties=True",
                                   "--structured-outputs-config.enable_in_reasoning", "1",
                                   "--structured-outputs-config.whitespace_pattern", "[ ]?"));
    CHECK_CONTAINS(err, "structured outputs: backend 'guidance' is served by cvllm's own grammar engine");
    free(err);
    err = expect_parsed(ARGS("serve", "/nonexistent", flag, "{\"backend\": \"lm-format-enforcer\", \"disable_fallback\": true, "
                             "\"reasoning_parser\": \"qwen3\", \"reasoning_parser_plugin\": \"\"}"));
    CHECK_CONTAINS(err, "backend 'lm-format-enforcer'");
    free(err);
}

/* `--load-format dummy` suggested as the command can be pasted: the binary's path as invoked, the
 * subcommand words, the arguments quoted for the shell, and a --load-format already there set to
 * dummy instead of added twice. */
static void test_offline_hint(void) {
    char *hub = tu_strdupf("HF_HUB_CACHE=%s/%s", tmp_dir, "hub");
    const char *env[] = {"CVLLM_LOG_LEVEL=info", hub, "HF_ENDPOINT=http://127.0.0.1:9", "HF_HUB_OFFLINE=0", NULL};
    tu_run r = run_prog(CVLLM_BINARY, env,
                        ARGS("generate", "Qwen/Qwen3-0.6B", "--prompt", "It's a test", "--compilation-config",
                             "{\"cudagraph_mode\": \"FULL\"}"));
    CHECK_EQ_INT(r.status, 1);
    char *want = tu_strdupf("to run offline with random weights: %s generate Qwen/Qwen3-0.6B --prompt 'It'\\''s a test' "
                            "--compilation-config '{\"cudagraph_mode\": \"FULL\"}' --load-format dummy%s",
                            CVLLM_BINARY, "");
    CHECK_CONTAINS(tu_last_line(r.err), want);
    free(want);
    tu_run_free(&r);
    /* a --load-format given (any spelling) becomes dummy in place */
    r = run_prog(CVLLM_BINARY, env, ARGS("bench", "latency", "--model", "Qwen/Qwen3-0.6B", "--load_format=auto", "-tp", "1"));
    CHECK_EQ_INT(r.status, 1);
    want = tu_strdupf("%s bench latency --model Qwen/Qwen3-0.6B --load_format=dummy -tp 1%s", CVLLM_BINARY, "");
    CHECK_CONTAINS(tu_last_line(r.err), want);
    CHECK(strstr(tu_last_line(r.err), "--load-format") == NULL);
    free(want);
    tu_run_free(&r);
    r = run_prog(CVLLM_BINARY, env, ARGS("bench", "throughput", "--model", "Qwen/Qwen3-0.6B", "--input-len", "8", "--load-f",
                                         "safetensors"));
    CHECK_EQ_INT(r.status, 1);
    CHECK_CONTAINS(tu_last_line(r.err), "bench throughput --model Qwen/Qwen3-0.6B --input-len 8 --load-f dummy");
    tu_run_free(&r);
    /* found through PATH: the bare name, as the user typed it */
    char *dir = strdup(CVLLM_BINARY);
    *strrchr(dir, '/') = '\0';
    char *path = tu_strdupf("PATH=%s:%s", dir, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    const char *path_env[] = {"CVLLM_LOG_LEVEL=info", hub, "HF_ENDPOINT=http://127.0.0.1:9", path, NULL};
    const char *name = strrchr(CVLLM_BINARY, '/') + 1;
    r = run_prog(name, path_env, ARGS("serve", "Qwen/Qwen3-0.6B", "--port", "0"));
    CHECK_EQ_INT(r.status, 1);
    want = tu_strdupf("to run offline with random weights: %s serve Qwen/Qwen3-0.6B --port 0 --load-format dummy%s", name, "");
    CHECK_CONTAINS(tu_last_line(r.err), want);
    free(want);
    tu_run_free(&r);
    free(path);
    free(dir);
    free(hub);
}

/* The vLLM tutorials' command lines (Qwen3.6-35B-A3B, Qwen3-32B-W8A8) as written. The checkpoints
 * cannot be fetched here, so each ends on the missing model (serve) or tokenizer (bench serve,
 * pointed at a tokenizer path that does not exist and a port nothing listens on): exit status 1,
 * after every flag was accepted. */
static void test_tutorial_lines(void) {
    char *hub = tu_strdupf("HF_HUB_CACHE=%s/%s", tmp_dir, "hub");
    const char *env[] = {"CVLLM_LOG_LEVEL=info", hub, "HF_HUB_OFFLINE=1", "VLLM_USE_MODELSCOPE=True",
                         "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True", "HCCL_OP_EXPANSION_MODE=AIV",
                         "HCCL_BUFFSIZE=1024", "OMP_NUM_THREADS=1", "TASK_QUEUE_ENABLE=1",
                         "ASCEND_RT_VISIBLE_DEVICES=0,1", "VLLM_ASCEND_ENABLE_FLASHCOMM1=1", NULL};
    static const char *const lines[][48] = {
        {"serve", "Eco-Tech/Qwen3.6-35B-A3B-w8a8", "--host", "0.0.0.0", "--port", "8000", "--data-parallel-size", "1",
         "--tensor-parallel-size", "2", "--enable-expert-parallel", "--seed", "1024", "--quantization", "ascend",
         "--served-model-name", "qwen3.6", "--max-num-seqs", "128", "--max-model-len", "262144",
         "--max-num-batched-tokens", "16384", "--trust-remote-code", "--gpu-memory-utilization", "0.90",
         "--enable-prefix-caching", "--compilation-config", "{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}",
         "--additional-config",
         "{\"enable_cpu_binding\":true, \"enable_flashcomm1\":true, \"multistream_overlap_shared_expert\": true}",
         "--async-scheduling"},
        {"serve", "Eco-Tech/Qwen3.6-35B-A3B-w8a8", "--host", "127.0.0.1", "--port", "8080", "--tensor-parallel-size", "2",
         "--gpu-memory-utilization", "0.90", "--max-num-seqs", "16", "--served-model-name", "qwen3.6", "--dtype",
         "float16", "--additional-config", "{\"ascend_compilation_config\": {\"enable_npugraph_ex\":false}}",
         "--compilation-config", "{\"cudagraph_mode\": \"FULL_DECODE_ONLY\", \"cudagraph_capture_sizes\": [1,8]}",
         "--quantization", "ascend", "--max-model-len", "20480", "--no-enable-prefix-caching", "--speculative_config",
         "{\"method\": \"mtp\", \"num_speculative_tokens\": 1}"},
        {"serve", "Eco-Tech/Qwen3.6-35B-A3B-w8a8", "--tensor-parallel-size", "2", "--quantization", "ascend",
         "--speculative-config", "{\"method\": \"qwen3_5_mtp\", \"num_speculative_tokens\": 3, \"enforce_eager\": true}"},
        {"serve", "vllm-ascend/Qwen3-32B-W8A8", "--served-model-name", "qwen3", "--trust-remote-code", "--quantization",
         "ascend", "--distributed-executor-backend", "mp", "--tensor-parallel-size", "4", "--max-model-len", "5500",
         "--max-num-batched-tokens", "40960", "--compilation-config", "{\"cudagraph_mode\": \"FULL_DECODE_ONLY\"}",
         "--additional-config", "{\"pa_shape_list\":[48,64,72,80], \"weight_prefetch_config\":{\"enabled\":true}}",
         "--port", "8113", "--block-size", "128", "--gpu-memory-utilization", "0.9"},
        {"serve", "vllm-ascend/Qwen3-32B-W8A8", "--compilation-config",
         "{\"cudagraph_mode\": \"FULL_DECODE_ONLY\", \"cudagraph_capture_sizes\":[1,8,24,48,60,64,72,76]}"},
        {"bench", "serve", "--model", "Eco-Tech/Qwen3.6-35B-A3B-w8a8", "--served-model-name", "qwen3.6", "--dataset-name",
         "random", "--random-input", "200", "--num-prompts", "200", "--request-rate", "1", "--save-result",
         "--result-dir", "./", "--tokenizer", "/nonexistent/tokenizer", "--base-url", "http://127.0.0.1:9"},
        {"bench", "serve", "--model", "vllm-ascend/Qwen3-32B-W8A8", "--served-model-name", "qwen3", "--port", "8113",
         "--dataset-name", "random", "--random-input", "200", "--num-prompts", "200", "--request-rate", "1",
         "--save-result", "--result-dir", "./", "--tokenizer", "/nonexistent/tokenizer", "--base-url",
         "http://127.0.0.1:9"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(lines); i++) {
        tu_run r = run_prog(CVLLM_BINARY, env, lines[i]);
        bool bench = !strcmp(lines[i][0], "bench");
        const char *tp = NULL;
        for (size_t k = 0; lines[i][k]; k++)
            if (!strcmp(lines[i][k], "--tensor-parallel-size")) tp = lines[i][k + 1];
        CHECK_MSG(r.status == 1, "tutorial line %zu: status %d\n%s", i, r.status, r.err);
        CHECK_MSG(strstr(tu_last_line(r.err), bench ? "/nonexistent/tokenizer" : lines[i][1]), "tutorial line %zu: %s", i,
                  tu_last_line(r.err));
        /* -tp starts no ranks for a model whose weights are not at hand: one process says so, once */
        if (tp) CHECK_MSG(!strstr(r.err, "under mpirun"), "tutorial line %zu: %s", i, r.err);
        tu_run_free(&r);
    }
    free(hub);
}

int main(void) {
    tmp_dir = tu_make_temp_dir();
    model_dir = tu_model_dir("qwen3-dense-f32");
    test_spellings();
    test_abbreviations();
    test_optimization_level();
    test_dotted_json();
    test_config_file();
    test_engine_flags();
    test_structured_outputs_config();
    test_offline_hint();
    test_tutorial_lines();
    tu_remove_tree(model_dir);
    tu_remove_tree(tmp_dir);
    free(model_dir);
    free(tmp_dir);
    return cv_check_summary("test_cli_args");
}
