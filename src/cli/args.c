/*
 * args.c — see args.h. The engine flags are a table so that every command accepts the same names
 * with the same checks; a few flags that mean nothing on this backend are accepted (so vLLM command
 * lines run unchanged), validated, and logged once as ignored.
 */
#include "cli/args.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

int cv_args_error(cv_args *a, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "cvllm %s: ", a->cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    a->failed = true;
    return 2;
}

bool cv_args_value(cv_args *a, const char *name, const char **value) {
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return false;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        a->i++;
        return true;
    }
    if (arg[n] != '\0') return false;
    if (a->i + 1 >= a->argc) {
        cv_args_error(a, "%s needs a value", name);
        *value = NULL;
        a->i++;
        return true;
    }
    *value = a->argv[a->i + 1];
    a->i += 2;
    return true;
}

bool cv_args_flag(cv_args *a, const char *name) {
    if (strcmp(a->argv[a->i], name) != 0) return false;
    a->i++;
    return true;
}

static int64_t suffix_multiplier(char c) {
    switch (c) {
    case 'k': return 1000;
    case 'K': return 1024;
    case 'm': return 1000000;
    case 'M': return 1024 * 1024;
    case 'g': return 1000000000;
    case 'G': return 1024LL * 1024 * 1024;
    default: return 0;
    }
}

bool cv_args_int(cv_args *a, const char *flag, const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    int64_t mult = 1;
    if (end != s && *end && !end[1] && suffix_multiplier(*end)) {
        mult = suffix_multiplier(*end);
        end++;
    }
    if (end == s || *end || errno == ERANGE) {
        cv_args_error(a, "%s expects an integer, got '%s'", flag, s);
        return false;
    }
    if ((v > 0 && v > max / mult) || v * mult < min || v * mult > max) {
        cv_args_error(a, "%s must be in [%lld, %lld], got '%s'", flag, (long long)min, (long long)max, s);
        return false;
    }
    *out = v * mult;
    return true;
}

bool cv_args_float(cv_args *a, const char *flag, const char *s, double min, double max, double *out) {
    if (!s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || isnan(v)) {
        cv_args_error(a, "%s expects a number, got '%s'", flag, s);
        return false;
    }
    if (v < min || v > max) {
        cv_args_error(a, "%s must be in [%g, %g], got '%s'", flag, min, max, s);
        return false;
    }
    *out = v;
    return true;
}

/* Flags of `vllm serve` that have no effect here: a value must still be well formed. */
static bool ignored_flag(cv_args *a) {
    static const char *json_flags[] = {"--compilation-config", "--additional-config", "-O"};
    static const char *value_flags[] = {"--distributed-executor-backend"};
    static const char *bool_flags[] = {"--trust-remote-code", "--enforce-eager", "--disable-custom-all-reduce",
                                       "--disable-log-requests"};
    const char *v;
    for (size_t k = 0; k < sizeof json_flags / sizeof *json_flags; k++)
        if (cv_args_value(a, json_flags[k], &v)) {
            if (!v) return true;
            json_error_t err;
            json_t *j = json_loads(v, JSON_DECODE_ANY, &err);
            if (!j) {
                cv_args_error(a, "%s is not valid JSON: %s", json_flags[k], err.text);
                return true;
            }
            json_decref(j);
            cv_info("args", "%s is accepted and ignored on the CPU backend", json_flags[k]);
            return true;
        }
    for (size_t k = 0; k < sizeof value_flags / sizeof *value_flags; k++)
        if (cv_args_value(a, value_flags[k], &v)) {
            if (v) cv_info("args", "%s %s is accepted and ignored on this backend", value_flags[k], v);
            return true;
        }
    for (size_t k = 0; k < sizeof bool_flags / sizeof *bool_flags; k++)
        if (cv_args_flag(a, bool_flags[k])) {
            cv_info("args", "%s is accepted and ignored on this backend", bool_flags[k]);
            return true;
        }
    return false;
}

static bool int_option(cv_args *a, const char *name, int64_t min, int64_t max, int64_t *out) {
    const char *v;
    if (!cv_args_value(a, name, &v)) return false;
    cv_args_int(a, name, v, min, max, out);
    return true;
}

bool cv_args_engine(cv_args *a, cvllm_engine_options *o) {
    const char *v;
    int64_t n = 0;
    double d;
    if (int_option(a, "--max-model-len", 2, INT32_MAX, &n)) o->max_model_len = (int32_t)n;
    else if (int_option(a, "--max-num-seqs", 1, 1 << 20, &n)) o->max_num_seqs = (int32_t)n;
    else if (int_option(a, "--max-num-batched-tokens", 1, 1 << 24, &n)) o->max_num_batched_tokens = (int32_t)n;
    else if (int_option(a, "--block-size", 1, 1 << 16, &n)) {
        o->block_size = (int32_t)n;
        if (n & (n - 1)) cv_args_error(a, "--block-size must be a power of two, got %lld", (long long)n);
    } else if (int_option(a, "--kv-cache-memory-bytes", 1, INT64_MAX, &n)) o->kv_cache_memory_bytes = (uint64_t)n;
    else if (int_option(a, "--max-logprobs", 0, 1 << 20, &n)) o->max_logprobs = (int32_t)n;
    else if (int_option(a, "--seed", 0, INT64_MAX, &n)) o->seed = (uint64_t)n;
    else if (int_option(a, "--num-threads", 0, 4096, &n)) o->num_threads = (int32_t)n;
    else if (cv_args_value(a, "--gpu-memory-utilization", &v)) {
        if (cv_args_float(a, "--gpu-memory-utilization", v, 1e-6, 1.0, &d)) o->gpu_memory_utilization = d;
    } else if (cv_args_value(a, "--dtype", &v)) o->dtype = v;
    else if (cv_args_value(a, "--load-format", &v)) o->load_format = v;
    else if (cv_args_value(a, "--generation-config", &v)) o->generation_config = v;
    else if (cv_args_value(a, "--tokenizer", &v)) o->tokenizer = v;
    else if (cv_args_value(a, "--revision", &v)) o->revision = v;
    else if (cv_args_value(a, "--model", &v)) o->model = v;
    else if (cv_args_value(a, "--speculative-config", &v)) o->speculative_config = v;
    else if (cv_args_flag(a, "--enable-prefix-caching")) o->enable_prefix_caching = true;
    else if (cv_args_flag(a, "--no-enable-prefix-caching")) o->enable_prefix_caching = false;
    else return ignored_flag(a);
    return true;
}

const char cv_args_engine_help[] =
    "engine options (vLLM's names):\n"
    "  --max-model-len N            context length (default: max_position_embeddings)\n"
    "  --max-num-seqs N             most sequences in one step (256)\n"
    "  --max-num-batched-tokens N   token budget of one step (serve: 2048, otherwise 4096, as vLLM on CPU)\n"
    "  --block-size N               KV cache block size in tokens (16)\n"
    "  --kv-cache-memory-bytes N    KV cache size (else --gpu-memory-utilization of RAM)\n"
    "  --gpu-memory-utilization F   fraction of RAM for weights + KV cache (0.9)\n"
    "  --dtype auto|bfloat16|float16|float32\n"
    "  --load-format auto|safetensors|dummy\n"
    "  --generation-config auto|vllm|FOLDER\n"
    "  --tokenizer MODEL  --revision REV  --seed N  --max-logprobs N\n"
    "  --num-threads N              kernel threads (default: all CPUs)\n"
    "  --speculative-config JSON    e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'\n"
    "  --trust-remote-code, --compilation-config JSON, --additional-config JSON,\n"
    "  --distributed-executor-backend X: accepted and ignored\n";

/* Rebuilds the command line with --load-format dummy, for the offline hint. */
static void print_dummy_command(const cv_args *a) {
    fputs("cvllm", stderr);
    for (int i = 0; i < a->argc; i++) {
        const char *s = a->argv[i];
        if (!strncmp(s, "--load-format", 13)) {
            if (!s[13] && i + 1 < a->argc) i++;
            continue;
        }
        bool plain = s[0] && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,") == strlen(s);
        fprintf(stderr, plain ? " %s" : " '%s'", s);
    }
    fputs(" --load-format dummy", stderr);
}

void cv_args_report_engine_error(const cv_args *a, int status) {
    fprintf(stderr, "cvllm %s: %s", a->cmd, cvllm_last_error());
    if (status == CVLLM_ERR_NETWORK) {
        fputs("; to run offline with random weights: ", stderr);
        print_dummy_command(a);
    }
    fputc('\n', stderr);
}
