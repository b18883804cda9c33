/*
 * args_engine.c — the engine flags (vLLM's EngineArgs) that serve, generate, bench throughput and
 * bench latency share, and the offline hint printed when the engine cannot be created.
 *
 * Flags with an effect go into cvllm_engine_options. Flags that describe GPU or multi-process
 * layouts (parallel sizes, executor backend, compilation and CUDA graphs, ...) are accepted so vLLM
 * command lines run unchanged; their values are validated as vLLM validates them and they are
 * logged once as ignored. -tp runs tensor parallelism; -dp runs data-parallel replicas under `serve`
 * (the only command with a router in front of its engines) and, like -pp, is said to run in one
 * process under the other commands. --quantization is validated against vLLM's method names and
 * passed on in cvllm_engine_options.quantization; what a checkpoint needs is the loader's to decide.
 * --scheduling-policy is checked against argparse's choices and passed on as scheduling_policy.
 *
 * Sources of the lists below (vLLM, 2026): QuantizationMethods in
 * vllm/model_executor/layers/quantization/__init__.py (plus "ascend", which the vllm-ascend plugin
 * registers and the Ascend tutorials pass); CompilationConfig's init fields and CUDAGraphMode in
 * vllm/config/compilation.py; DistributedExecutorBackend in vllm/config/parallel.py.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/args.h"
#include "cli/args_internal.h"

static const char *const quantization_methods[] = {
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "gguf", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming",
    "compressed-tensors", "bitsandbytes", "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4",
    "gpt_oss_mxfp4", "deepseek_v4_fp8", "cpu_awq", "online", "fp8_per_tensor", "fp8_per_block",
    "fp8_per_channel", "int8_per_channel_weight_only", "mxfp8", "ascend", NULL,
};

static const char *const compilation_keys[] = {
    "level", "mode", "debug_dump_path", "cache_dir", "compile_cache_save_format", "backend", "custom_ops",
    "splitting_ops", "compile_mm_encoder", "compile_sizes", "compile_ranges_split_points",
    "inductor_compile_config", "inductor_passes", "cudagraph_mode", "cudagraph_num_of_warmups",
    "cudagraph_capture_sizes", "cudagraph_copy_inputs", "cudagraph_specialize_lora",
    "use_inductor_graph_partition", "pass_config", "max_cudagraph_capture_size", "dynamic_shapes_config", NULL,
};

static const char *const cudagraph_modes[] = {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", NULL};
static const char *const compilation_modes[] = {"NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE", NULL};

/* Flags of vLLM's EngineArgs that change nothing on this backend. */
static const cv_ignored_flag ignored_engine_flags[] = {
    /* mp (the default) starts its own ranks under mpirun (cli/launch.c); mpi: this process is a rank
     * of an mpirun job already; the others run as mp */
    {"--distributed-executor-backend", CV_IGNORED_CHOICE,
     (const char *const[]){"ray", "mp", "uni", "external_launcher", "mpi", NULL}},
    {"--trust-remote-code", CV_IGNORED_BOOL, NULL},
    {"--enforce-eager", CV_IGNORED_BOOL, NULL},
    {"--disable-custom-all-reduce", CV_IGNORED_BOOL, NULL},
    {"--enable-chunked-prefill", CV_IGNORED_BOOL, NULL},
    {"--optimization-level", CV_IGNORED_CHOICE, (const char *const[]){"0", "1", "2", "3", NULL}},
    {"--swap-space", CV_IGNORED_FLOAT, NULL},
    {"--max-seq-len-to-capture", CV_IGNORED_INT, NULL},
    /* the weights are in CPU memory already */
    {"--cpu-offload-gb", CV_IGNORED_FLOAT, NULL},
    /* how vLLM's scheduler interleaves concurrent partial prefills; cvllm's schedules its own way and
     * the outputs do not depend on it */
    {"--max-num-partial-prefills", CV_IGNORED_INT, NULL},
    {"--max-long-partial-prefills", CV_IGNORED_INT, NULL},
    {"--long-prefill-token-threshold", CV_IGNORED_INT, NULL},
    /* the prefix cache's block keys are XXH3-128 (src/engine/block_pool.c) whatever is asked */
    {"--prefix-caching-hash-algo", CV_IGNORED_CHOICE, (const char *const[]){"sha256", "sha256_cbor", "xxhash",
                                                                             "xxhash_cbor", NULL}},
    /* LoRA: every adapter is kept in memory (no CPU cache to size), deltas are computed in f32 on one
     * rank whatever the dtype asked */
    {"--max-cpu-loras", CV_IGNORED_INT, NULL},
    {"--lora-extra-vocab-size", CV_IGNORED_INT, NULL},
    {"--lora-dtype", CV_IGNORED_CHOICE, (const char *const[]){"auto", "float16", "bfloat16", NULL}},
    {"--fully-sharded-loras", CV_IGNORED_BOOL, NULL},
    /* AsyncEngineArgs, which `vllm bench throughput` takes as well as `vllm serve` */
    {"--enable-log-requests", CV_IGNORED_BOOL, NULL},
    {"--disable-log-requests", CV_IGNORED_SWITCH, NULL},
    /* how vLLM finds and loads what cvllm reads its own way: one tokenizer (the fast one's rules),
     * config.json, safetensors mapped in place */
    {"--tokenizer-mode", CV_IGNORED_CHOICE, (const char *const[]){"auto", "hf", "slow", NULL}},
    {"--config-format", CV_IGNORED_CHOICE, (const char *const[]){"auto", "hf", NULL}},
    {"--model-impl", CV_IGNORED_CHOICE, (const char *const[]){"auto", "vllm", "transformers", NULL}},
    {"--device", CV_IGNORED_CHOICE, (const char *const[]){"auto", "cpu", NULL}},
    {"--worker-cls", CV_IGNORED_CHOICE, (const char *const[]){"auto", NULL}},
    {"--code-revision", CV_IGNORED_STRING, NULL},
    {"--max-parallel-loading-workers", CV_IGNORED_INT, NULL},
    {"--safetensors-load-strategy", CV_IGNORED_STRING, NULL},
    {"--pt-load-map-location", CV_IGNORED_STRING, NULL},
    {"--tokenizer-pool-size", CV_IGNORED_INT, NULL},
    /* GPU kernels, graphs and tracing */
    {"--attention-backend", CV_IGNORED_STRING, NULL},
    {"--cudagraph-capture-sizes|--cuda-graph-sizes", CV_IGNORED_SIZES, NULL},
    {"--num-lookahead-slots", CV_IGNORED_INT, NULL},
    /* which logits processors requests may name; cvllm refuses a request's logits_processors */
    {"--logits-processor-pattern", CV_IGNORED_STRING, NULL},
    {"--use-tqdm-on-load", CV_IGNORED_BOOL, NULL},
    {"--aggregate-engine-logging", CV_IGNORED_BOOL, NULL},
    {"--disable-cascade-attn", CV_IGNORED_BOOL, NULL},
    {"--kv-sharing-fast-prefill", CV_IGNORED_BOOL, NULL},
    {"--max-cudagraph-capture-size", CV_IGNORED_INT, NULL},
    {"--enable-dbo", CV_IGNORED_BOOL, NULL},
    {"--calculate-kv-scales", CV_IGNORED_BOOL, NULL},
    {"--enable-sleep-mode", CV_IGNORED_BOOL, NULL},
    {"--enable-mfu-metrics", CV_IGNORED_BOOL, NULL},
    {"--enable-layerwise-nvtx-tracing", CV_IGNORED_BOOL, NULL},
    {"--otlp-traces-endpoint", CV_IGNORED_STRING, NULL},
    {"--collect-detailed-traces", CV_IGNORED_STRING, NULL},
    {"--override-attention-dtype", CV_IGNORED_STRING, NULL},
    /* the recurrent state of Gated DeltaNet layers is kept in f32 */
    {"--mamba-ssm-cache-dtype", CV_IGNORED_CHOICE, (const char *const[]){"auto", "float32", "bfloat16", "float16", NULL}},
    {"--mamba-cache-dtype", CV_IGNORED_CHOICE, (const char *const[]){"auto", "float32", "bfloat16", "float16", NULL}},
    /* finer prefix-cache hits than a block (vLLM's hybrid models' large blocks want them): cvllm's hits
     * land on its --block-size blocks, its hybrid checkpoints on --mamba-block-size */
    {"--prefix-match-unit", CV_IGNORED_INT, NULL},
    {"--enable-mamba-fine-grained-prefix-cache", CV_IGNORED_BOOL, NULL},
    /* expert load balancing across GPUs: routed experts stay where they are loaded */
    {"--enable-eplb", CV_IGNORED_BOOL, NULL},
    {"--all2all-backend", CV_IGNORED_STRING, NULL},
    {"--dbo-decode-token-threshold", CV_IGNORED_INT, NULL},
    {"--dbo-prefill-token-threshold", CV_IGNORED_INT, NULL},
    {"--disable-nccl-for-dp-synchronization", CV_IGNORED_BOOL, NULL},
    {"--num-redundant-experts", CV_IGNORED_INT, NULL},
    {"--eplb-config", CV_IGNORED_STRING, NULL},
    {"--expert-placement-strategy", CV_IGNORED_CHOICE, (const char *const[]){"linear", "round_robin", NULL}},
    /* V1 recomputes preempted requests, as cvllm does */
    {"--preemption-mode", CV_IGNORED_CHOICE, (const char *const[]){"recompute", "swap", NULL}},
    /* the multimodal encoder, which cvllm does not run (image, audio and video parts get vLLM's 400) */
    {"--limit-mm-per-prompt", CV_IGNORED_STRING, NULL},
    {"--mm-processor-kwargs", CV_IGNORED_STRING, NULL},
    {"--mm-processor-cache-gb", CV_IGNORED_FLOAT, NULL},
    {"--mm-encoder-tp-mode", CV_IGNORED_CHOICE, (const char *const[]){"weights", "data", NULL}},
    {"--disable-chunked-mm-input", CV_IGNORED_BOOL, NULL},
    {"--enable-multimodal-encoder-data-parallel", CV_IGNORED_SWITCH, NULL},
    {"--enable-mm-embeds", CV_IGNORED_BOOL, NULL},
    {"--interleave-mm-strings", CV_IGNORED_BOOL, NULL},
    {"--media-io-kwargs", CV_IGNORED_JSON, NULL},
    {"--mm-processor-cache-type", CV_IGNORED_CHOICE, (const char *const[]){"lru", "shm", NULL}},
    {"--mm-shm-cache-max-object-size-mb", CV_IGNORED_INT, NULL},
    {"--mm-encoder-attn-backend", CV_IGNORED_STRING, NULL},
    {"--skip-mm-profiling", CV_IGNORED_BOOL, NULL},
    {"--video-pruning-rate", CV_IGNORED_FLOAT, NULL},
    {"--default-mm-loras", CV_IGNORED_JSON, NULL},
    {"--allowed-local-media-path", CV_IGNORED_STRING, NULL},
    {"--allowed-media-domains", CV_IGNORED_STRING, NULL},
    /* a Qwen3.5/3.6 checkpoint's vision tower is never loaded: cvllm runs its language model only */
    {"--language-model-only", CV_IGNORED_BOOL, NULL},
    /* sliding windows (Qwen3's configs turn them off), one KV-cache manager for every layer kind,
     * Ray's profiler */
    {"--disable-sliding-window", CV_IGNORED_BOOL, NULL},
    {"--disable-hybrid-kv-cache-manager", CV_IGNORED_BOOL, NULL},
    {"--ray-workers-use-nsight", CV_IGNORED_BOOL, NULL},
    /* the refused features below, turned off: the default */
    {"--no-skip-tokenizer-init|--no-enable-prompt-embeds|--no-enable-return-routed-experts", CV_IGNORED_SWITCH, NULL},
    /* -dp replicas run in this one process, whatever launches them */
    {"--data-parallel-size-local|-dpl", CV_IGNORED_INT, NULL},
    {"--data-parallel-backend|-dpb", CV_IGNORED_CHOICE, (const char *const[]){"mp", "ray", NULL}},
};

/* Flags of vLLM's EngineArgs whose function cvllm lacks: refused rather than ignored. */
static const cv_refused_flag refused_engine_flags[] = {
    {"--data-parallel-address|-dpa|--data-parallel-rpc-port|-dpp|--data-parallel-start-rank|-dpr|"
     "--data-parallel-rank|-dpn|"
     "--data-parallel-hybrid-lb|--data-parallel-external-lb",
     "data parallelism across machines; cvllm runs -dp replicas in one process"},
    {"--kv-transfer-config|--kv-events-config|--kv-offloading-size|--kv-offloading-backend",
     "KV-cache transfer, events and offloading are not implemented"},
    {"--logits-processors|--worker-extension-cls|--io-processor-plugin|--scheduler-cls",
     "cvllm cannot load Python plugins"},
    {"--skip-tokenizer-init", "cvllm detokenizes every output"},
    {"--enable-prompt-embeds", "prompts are text or token ids"},
    {"--enable-return-routed-experts", "routed expert ids are not returned"},
    {"--hf-config-path", "config.json is read from the model's folder (lay keys over it with --hf-overrides)"},
};

/* `s` upper-cased, as vLLM reads enum names (the caller frees it). */
static char *upper(const char *s) {
    char *up = cv_xstrdup(s);
    for (char *p = up; *p; p++)
        if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
    return up;
}

/* -tp / -pp / -dp: a size >= 1, into *size; without a `size` to set (-pp; -dp outside serve), a size
 * above 1 is said once to run in one process. -tp is tensor parallelism over OpenMPI ranks (cvllm.h
 * tensor_parallel_size, cli/launch.c), serve's -dp engine replicas (data_parallel_size). */
static bool parallel_size(cv_args *a, const char *names, const char *what, int32_t *size) {
    const char *v;
    int64_t n;
    if (!cv_args_value(a, names, &v)) return false;
    int len = (int)strcspn(names, "|");
    char *flag = cv_xstrndup(names, (size_t)len);
    if (cv_args_int(a, flag, v, 1, INT32_MAX, &n)) {
        if (size) *size = (int32_t)n;
        else if (n > 1)
            cv_warn("args", "%s %lld: running in one process (%s is not implemented yet)", flag, (long long)n, what);
    }
    free(flag);
    return true;
}

/* The value of a JSON flag as a JSON value; NULL after printing why. */
static json_t *json_value(cv_args *a, const char *flag, const char *v) {
    if (!v) return NULL;
    json_error_t err;
    json_t *j = json_loads(v, JSON_DECODE_ANY, &err);
    if (!j) cv_args_error(a, "%s is not valid JSON: %s", flag, err.text);
    return j;
}

static bool positive_int(const json_t *v) {
    if (json_is_integer(v)) return json_integer_value(v) > 0;
    /* a dotted `cudagraph_capture_sizes+ 1,8` gives strings, which pydantic reads as ints */
    const char *s = json_string_value(v);
    return s && s[0] >= '1' && s[0] <= '9' && strspn(s, "0123456789") == strlen(s) && strlen(s) < 10;
}

/* One problem of a CompilationConfig field, in pydantic's words; NULL when the value is fine. */
static char *compilation_field_error(const char *key, const json_t *v) {
    if (!cv_args_in_list(compilation_keys, key)) return cv_xasprintf("%s: Unexpected keyword argument", key);
    if (json_is_null(v)) return NULL;
    if (!strcmp(key, "cudagraph_mode")) {
        char *up = json_is_string(v) ? upper(json_string_value(v)) : NULL;
        bool ok = up && cv_args_in_list(cudagraph_modes, up);
        free(up);
        if (ok) return NULL;
        char *members = cv_args_quoted_list(cudagraph_modes, " or ");
        char *msg = cv_xasprintf("cudagraph_mode: Input should be %s", members);
        free(members);
        return msg;
    }
    if (!strcmp(key, "cudagraph_capture_sizes")) {
        bool ok = json_is_array(v);
        for (size_t i = 0; ok && i < json_array_size(v); i++) ok = positive_int(json_array_get(v, i));
        return ok ? NULL : cv_xstrdup("cudagraph_capture_sizes: Input should be a list of positive integers");
    }
    if (!strcmp(key, "mode") || !strcmp(key, "level")) {
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 3) return NULL;
        if (!strcmp(key, "mode") && json_is_string(v)) {
            char *up = upper(json_string_value(v));
            bool ok = cv_args_in_list(compilation_modes, up);
            free(up);
            if (ok) return NULL;
        }
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        char *msg = cv_xasprintf("%s: Invalid compilation mode: %s. Valid modes are: NONE, STOCK_TORCH_COMPILE, "
                                 "DYNAMO_TRACE_ONCE, VLLM_COMPILE (or 0-3)", key, text);
        free(text);
        return msg;
    }
    return NULL;
}

/* --compilation-config / -cc: a JSON object of CompilationConfig fields, or a bare level 0-3 (the
 * form vLLM accepted while -O was this flag's alias). Validated, then ignored. */
static bool compilation_config(cv_args *a) {
    const char *v;
    if (!cv_args_value(a, "--compilation-config|-cc", &v)) return false;
    json_t *j = json_value(a, "--compilation-config", v);
    if (!j) return true;
    if (json_is_integer(j) && json_integer_value(j) >= 0 && json_integer_value(j) <= 3) {
        json_decref(j);
        cv_args_note("--compilation-config is accepted and ignored on the CPU backend");
        return true;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        cv_args_error(a, "--compilation-config must be a JSON object (or a compilation level 0-3), got '%s'", v);
        return true;
    }
    char *errors = NULL;
    int n_errors = 0;
    const char *key;
    json_t *field;
    json_object_foreach(j, key, field) {
        char *e = compilation_field_error(key, field);
        if (!e) continue;
        char *more = errors ? cv_xasprintf("%s; %s", errors, e) : cv_xstrdup(e);
        free(errors);
        free(e);
        errors = more;
        n_errors++;
    }
    json_decref(j);
    if (errors)
        cv_args_error(a, "argument --compilation-config/-cc: %d validation error%s for CompilationConfig: %s", n_errors,
                      n_errors > 1 ? "s" : "", errors);
    else
        cv_args_note("--compilation-config is accepted and ignored on the CPU backend");
    free(errors);
    return true;
}

/* A flag whose value must be a JSON object; *value keeps the text. */
static bool json_object_flag(cv_args *a, const char *names, const char **value) {
    if (!cv_args_value(a, names, value)) return false;
    char *flag = cv_xstrndup(names, strcspn(names, "|"));
    json_t *j = json_value(a, flag, *value);
    if (j && !json_is_object(j)) cv_args_error(a, "%s must be a JSON object, got '%s'", flag, *value);
    json_decref(j);
    free(flag);
    return true;
}

/* vLLM's --hf-token [TOKEN]: with a value, that token; alone, the one `huggingface-cli login` stored,
 * which downloads use anyway when HF_TOKEN is unset (so the flag alone changes nothing). */
static bool hf_token(cv_args *a, cvllm_engine_options *o) {
    const char *v;
    if (!cv_args_optional_value(a, "--hf-token", &v)) return false;
    if (v) o->hf_token = v;
    return true;
}

static bool quantization(cv_args *a, cvllm_engine_options *o) {
    const char *v;
    if (!cv_args_value(a, "--quantization|-q", &v)) return false;
    if (!v) return true;
    if (!cv_args_in_list(quantization_methods, v)) {
        char *list = cv_args_quoted_list(quantization_methods, ", ");
        cv_args_error(a, "Unknown quantization method: %s. Must be one of [%s].", v, list);
        free(list);
        return true;
    }
    o->quantization = v;
    cv_args_note("--quantization %s is passed to the engine", v);
    return true;
}

/* --scheduling-policy: argparse's choices, then the engine's option. */
static bool scheduling_policy(cv_args *a, cvllm_engine_options *o) {
    static const char *const policies[] = {"fcfs", "priority", NULL};
    const char *v;
    if (!cv_args_value(a, "--scheduling-policy", &v)) return false;
    if (!v) return true;
    if (!cv_args_in_list(policies, v)) {
        char *list = cv_args_quoted_list(policies, ", ");
        cv_args_error(a, "argument --scheduling-policy: invalid choice: '%s' (choose from %s)", v, list);
        free(list);
        return true;
    }
    o->scheduling_policy = v;
    return true;
}

/* A choice among `choices`, vLLM's argparse message otherwise; *out untouched then. */
static bool choice_option(cv_args *a, const char *name, const char *const *choices, const char **out) {
    const char *v;
    if (!cv_args_value(a, name, &v)) return false;
    if (!v) return true;
    if (!cv_args_in_list(choices, v)) {
        char *list = cv_args_quoted_list(choices, ", ");
        cv_args_error(a, "argument %s: invalid choice: '%s' (choose from %s)", name, v, list);
        free(list);
        return true;
    }
    *out = v;
    return true;
}

/* --runner, --convert and the older --task: which runner serves the model. --convert embed (and
 * --task embed) and --convert classify (--task classify or score, as vLLM maps them) pick the pooling
 * runner's task; reward and mm_encoder_only are not run. */
static bool runner_option(cv_args *a, cvllm_engine_options *o) {
    static const char *const runners[] = {"auto", "draft", "generate", "pooling", NULL};
    static const char *const converts[] = {"auto", "classify", "embed", "mm_encoder_only", "none", "reward", NULL};
    static const char *const tasks[] = {"auto", "classify", "embed", "embedding", "generate", "reward", "score", NULL};
    const char *v = NULL;
    if (choice_option(a, "--runner", runners, &o->runner)) return true;
    if (choice_option(a, "--convert", converts, &v) || choice_option(a, "--task", tasks, &v)) {
        if (!v || !strcmp(v, "auto") || !strcmp(v, "none") || !strcmp(v, "generate")) return true;
        const bool embed = !strcmp(v, "embed") || !strcmp(v, "embedding");
        if (!embed && strcmp(v, "classify") && strcmp(v, "score"))
            cv_args_error(a, "%s is not supported: cvllm's pooling runner embeds (embed) or classifies (classify)", v);
        o->runner = "pooling";
        o->convert = embed ? "embed" : "classify";
        return true;
    }
    return false;
}

bool cv_args_engine(cv_args *a, cvllm_engine_options *o) {
    const char *v, *additional, **patterns = NULL;
    size_t n_patterns = 0;
    int64_t n = 0;
    double d;
    if (cv_args_int_option(a, "--max-model-len", 2, INT32_MAX, &n)) o->max_model_len = (int32_t)n;
    else if (cv_args_int_option(a, "--max-num-seqs", 1, 1 << 20, &n)) o->max_num_seqs = (int32_t)n;
    else if (cv_args_int_option(a, "--max-num-batched-tokens", 1, 1 << 24, &n)) o->max_num_batched_tokens = (int32_t)n;
    else if (cv_args_int_option(a, "--block-size", 1, 1 << 16, &n)) {
        o->block_size = (int32_t)n;
        if (n & (n - 1)) cv_args_error(a, "--block-size must be a power of two, got %lld", (long long)n);
    } else if (cv_args_int_option(a, "--kv-cache-memory-bytes", 1, INT64_MAX, &n)) o->kv_cache_memory_bytes = (uint64_t)n;
    else if (cv_args_int_option(a, "--max-logprobs", 0, 1 << 20, &n)) o->max_logprobs = (int32_t)n;
    else if (cv_args_int_option(a, "--num-gpu-blocks-override", 1, INT32_MAX - 1, &n)) o->num_gpu_blocks_override = (int32_t)n;
    else if (cv_args_int_option(a, "--seed", 0, INT64_MAX, &n)) o->seed = (uint64_t)n;
    else if (cv_args_int_option(a, "--num-threads", 0, 4096, &n)) o->num_threads = (int32_t)n;
    else if (cv_args_value(a, "--gpu-memory-utilization", &v)) {
        if (cv_args_float(a, "--gpu-memory-utilization", v, 1e-6, 1.0, &d)) o->gpu_memory_utilization = d;
    } else if (cv_args_value(a, "--dtype", &v)) o->dtype = v;
    else if (cv_args_value(a, "--kv-cache-dtype", &v)) o->kv_cache_dtype = v;
    else if (cv_args_value(a, "--load-format", &v)) o->load_format = v;
    else if (cv_args_value(a, "--generation-config", &v)) o->generation_config = v;
    else if (json_object_flag(a, "--override-generation-config", &v)) o->override_generation_config = v;
    else if (cv_args_value(a, "--tokenizer", &v)) o->tokenizer = v;
    else if (cv_args_value(a, "--revision", &v)) o->revision = v;
    else if (cv_args_value(a, "--tokenizer-revision", &v)) o->tokenizer_revision = v;
    else if (cv_args_value(a, "--logprobs-mode", &v)) o->logprobs_mode = v;
    else if (runner_option(a, o)) {
    }
    else if (json_object_flag(a, "--pooler-config|--override-pooler-config", &v)) o->pooler_config = v;
    else if (cv_args_value(a, "--download-dir", &v)) o->download_dir = v;
    else if (hf_token(a, o)) {
    }
    else if (cv_args_value(a, "--model", &v)) o->model = v;
    else if (json_object_flag(a, "--speculative-config|-sc", &v)) o->speculative_config = v;
    else if (json_object_flag(a, "--hf-overrides", &v)) o->hf_overrides = v;
    else if (json_object_flag(a, "--rope-scaling", &v)) o->rope_scaling = v;
    else if (cv_args_value(a, "--rope-theta", &v)) {
        if (cv_args_float(a, "--rope-theta", v, 1e-9, 1e300, &d)) o->rope_theta = d;
    }
    else if (cv_args_flag(a, "--enable-prefix-caching")) o->enable_prefix_caching = true;
    else if (cv_args_flag(a, "--no-enable-prefix-caching")) o->enable_prefix_caching = false;
    else if (choice_option(a, "--mamba-cache-mode", (const char *const[]){"align", "all", "none", NULL},
                           &o->mamba_cache_mode)) {
    } else if (cv_args_int_option(a, "--mamba-block-size", 1, INT32_MAX, &n)) o->mamba_block_size = (int32_t)n;
    else if (json_object_flag(a, "--model-loader-extra-config", &v)) o->model_loader_extra_config = v;
    else if (cv_args_list(a, "--ignore-patterns", &patterns, &n_patterns)) {
        free(patterns); /* the items are argv's */
        if (!a->failed)
            cv_args_note("--ignore-patterns is accepted and ignored: cvllm reads model.safetensors or the shards "
                         "its index names, nothing else");
    }
    else if (cv_args_flag(a, "--enable-lora")) o->enable_lora = true;
    else if (cv_args_flag(a, "--no-enable-lora")) o->enable_lora = false;
    else if (cv_args_int_option(a, "--max-loras", 1, 1 << 16, &n)) o->max_loras = (int32_t)n;
    else if (cv_args_int_option(a, "--max-lora-rank", 1, 512, &n)) o->max_lora_rank = (int32_t)n; /* the engine checks it */
    else if (cv_args_flag(a, "--enable-expert-parallel|-ep")) o->enable_expert_parallel = true;
    else if (cv_args_flag(a, "--no-enable-expert-parallel")) o->enable_expert_parallel = false;
    else if (quantization(a, o) || scheduling_policy(a, o) || compilation_config(a)) {
    } else if (parallel_size(a, "--tensor-parallel-size|-tp", "tensor parallelism", &o->tensor_parallel_size) ||
               parallel_size(a, "--pipeline-parallel-size|-pp", "pipeline parallelism", NULL) ||
               parallel_size(a, "--decode-context-parallel-size|-dcp", "decode context parallelism", NULL) ||
               parallel_size(a, "--data-parallel-size|-dp", "data parallelism outside `cvllm serve`",
                             strcmp(a->cmd, "serve") ? NULL : &o->data_parallel_size)) {
    } else if (json_object_flag(a, "--additional-config", &additional)) {
        if (!a->failed) cv_args_note("--additional-config is accepted and ignored on the CPU backend");
    } else return cv_args_ignored(a, ignored_engine_flags, CV_ARRAY_LEN(ignored_engine_flags)) ||
                  cv_args_refused(a, refused_engine_flags, CV_ARRAY_LEN(refused_engine_flags));
    return true;
}

const char cv_args_engine_help[] =
    "engine options (vLLM's names; --flag_name and unique prefixes work too):\n"
    "  --max-model-len N            context length (default: max_position_embeddings)\n"
    "  --max-num-seqs N             most sequences in one step (256)\n"
    "  --max-num-batched-tokens N   token budget of one step (serve: 2048, otherwise 4096, as vLLM on CPU)\n"
    "  --block-size N               KV cache block size in tokens (16)\n"
    "  --kv-cache-memory-bytes N    KV cache size (else --gpu-memory-utilization of RAM)\n"
    "  --num-gpu-blocks-override N  the KV cache's blocks whatever the budget (testing preemption)\n"
    "  --gpu-memory-utilization F   fraction of RAM for weights + KV cache (0.9)\n"
    "  --dtype auto|bfloat16|float16|float32  compute dtype (auto: the checkpoint's; float16 runs as bfloat16)\n"
    "  --kv-cache-dtype auto|bfloat16|float32  KV cache storage (auto: the compute dtype)\n"
    "  --load-format auto|safetensors|dummy\n"
    "  --generation-config auto|vllm|FOLDER\n"
    "  --override-generation-config JSON  e.g. '{\"temperature\": 0.5}' over generation_config\n"
    "  --download-dir DIR           the Hugging Face cache folder models are found and downloaded in\n"
    "  --hf-token [TOKEN]           bearer token for downloads (default: $HF_TOKEN, else the stored login)\n"
    "  --tokenizer-revision REV     the tokenizer's hub revision (default: --revision)\n"
    "  --hf-overrides JSON          keys laid over config.json, e.g. YaRN: '{\"rope_scaling\": {\"rope_type\":\n"
    "                               \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}}'\n"
    "  --rope-scaling JSON  --rope-theta F  the same for rope_scaling and rope_theta (vLLM's older flags)\n"
    "  --tokenizer MODEL  --revision REV  --seed N  --max-logprobs N\n"
    "  --num-threads N              kernel threads (default: all CPUs)\n"
    "  --speculative-config, -sc JSON  e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'\n"
    "  --[no-]enable-prefix-caching\n"
    "  --mamba-cache-mode all|align|none  hybrid models' prefix caching: the recurrent state kept at every\n"
    "                               block boundary a step completes (all; none means all when caching\n"
    "                               is on) or at its last one (align)\n"
    "  --mamba-block-size N         tokens between those boundaries, a multiple of --block-size\n"
    "  --model-loader-extra-config JSON  vLLM's default loader's keys (no effect: weights are mapped)\n"
    "  --enable-lora  --max-loras N (1)  --max-lora-rank R (16)  LoRA adapters (serve: --lora-modules)\n"
    "  --quantization, -q METHOD    vLLM's method names (checked; the checkpoint decides)\n"
    "  --scheduling-policy fcfs|priority  queue order: arrival, or the requests' priority (lower first)\n"
    "  --runner auto|generate|pooling  pooling: embedding, classifier and reranker models (serve:\n"
    "                               /v1/embeddings or /classify, /pooling, /score, /rerank); auto picks it\n"
    "                               for a sentence-transformers folder or a *ForSequenceClassification model\n"
    "  --convert embed|classify     the pooling runner's task whatever the architecture (--task too)\n"
    "  --pooler-config JSON         '{\"pooling_type\": \"LAST\"|\"CLS\"|\"MEAN\", \"use_activation\": true}'\n"
    "  --config FILE.yaml           flags from a YAML file (the command line wins)\n"
    "  JSON flags also take dotted keys: --compilation-config.cudagraph_mode FULL, -cc.mode=3\n"
    "  --tensor-parallel-size, -tp N  shard the model over N OpenMPI ranks: started by cvllm itself, or\n"
    "                               by your mpirun with --distributed-executor-backend mpi\n"
    "  --[no-]enable-expert-parallel, -ep  with -tp N: MoE experts whole, num_experts/N on each rank\n"
    "  --data-parallel-size, -dp N  serve: N engine replicas in this process behind one API server, each\n"
    "                               with 1/N of the memory budget and threads; a request goes to the\n"
    "                               replica holding its prompt prefix, else the least loaded; with -tp M\n"
    "                               each replica is sharded (1 + N(M-1) ranks; generate and bench run one)\n"
    "accepted, checked and ignored (no CUDA graphs): -pp N (one process),\n"
    "  --distributed-executor-backend ray|mp|uni|external_launcher,\n"
    "  --compilation-config/-cc JSON, -O0..-O3, --additional-config JSON, --[no-]trust-remote-code,\n"
    "  --[no-]enforce-eager, --[no-]enable-chunked-prefill, --swap-space,\n"
    "  --disable-custom-all-reduce, --max-seq-len-to-capture, --[no-]enable-log-requests,\n"
    "  --max-cpu-loras, --lora-dtype (adapters run in f32), --[no-]fully-sharded-loras\n";

/* ---- the offline hint ------------------------------------------------------------------------ */

/* True for an argument as typed that names --load-format: the full name or, as the parse
 * succeeded, an abbreviation of it, with dashes or underscores. */
static bool names_load_format(const char *arg) {
    static const char full[] = "--load-format";
    size_t len = strcspn(arg, "=");
    if (len <= 2 || len > sizeof full - 1 || arg[0] != '-' || arg[1] != '-') return false;
    for (size_t k = 2; k < len; k++)
        if (arg[k] != full[k] && !(arg[k] == '_' && full[k] == '-')) return false;
    return true;
}

/* " ARG" as the shell needs it: bare when only safe characters, else in single quotes. */
static void print_quoted(const char *s) {
    static const char safe[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%";
    if (s[0] && strspn(s, safe) == strlen(s)) {
        fprintf(stderr, " %s", s);
        return;
    }
    fputs(" '", stderr);
    for (; *s; s++) {
        if (*s == '\'') fputs("'\\''", stderr);
        else fputc(*s, stderr);
    }
    fputc('\'', stderr);
}

/* The command as typed (the path the binary was invoked by, the subcommand words, the arguments),
 * with the --load-format already there set to dummy, else --load-format dummy added. */
static void print_dummy_command(const cv_args *a) {
    print_quoted(cv_args_program());
    fprintf(stderr, " %s", a->cmd);
    bool replaced = false;
    for (int i = 1; i < a->orig_argc; i++) {
        const char *s = a->orig_argv[i];
        if (!names_load_format(s)) {
            print_quoted(s);
            continue;
        }
        replaced = true;
        const char *eq = strchr(s, '=');
        if (eq) {
            fprintf(stderr, " %.*sdummy", (int)(eq - s + 1), s);
        } else {
            fprintf(stderr, " %s dummy", s);
            i++;
        }
    }
    if (!replaced) fputs(" --load-format dummy", stderr);
}

void cv_args_report_engine_error(const cv_args *a, int status) {
    fprintf(stderr, "cvllm %s: %s", a->cmd, cvllm_last_error());
    if (status == CVLLM_ERR_NETWORK) {
        fputs("; to run offline with random weights:", stderr);
        print_dummy_command(a);
    }
    fputc('\n', stderr);
}
