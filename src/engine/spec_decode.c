/*
 * spec_decode.c — the speculative-decoding config and the n-gram (prompt lookup) proposer.
 * See spec_decode.h; the verification itself is in engine.c and the sampler.
 */
#include "engine/spec_decode.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static int bad(const char *fmt, const char *what) {
    return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, fmt, what);
}

static int read_int(json_t *cfg, const char *key, int32_t min, int32_t max, int32_t *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "speculative config: \"%s\" must be an integer in [%d, %d]", key,
                       min, max);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

/* SpeculativeConfig's fields in current vLLM (vllm/config/speculative.py). The config is a pydantic
 * dataclass that forbids extra keys, so a misspelt key is an error there, never silently ignored;
 * the fields that only steer GPU drafting or methods cvllm does not run are accepted as they are. */
static const char *const spec_fields[] = {
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len",
    "revision", "code_revision", "index_share_for_mtp_iteration", "disable_padded_drafter_batch",
    "disable_eagle_block_drop", "use_local_argmax_reduction", "use_heterogeneous_vocab", "prompt_lookup_max",
    "prompt_lookup_min", "parallel_drafting", "target_model_config", "target_parallel_config",
    "num_speculative_tokens_per_batch_size", "draft_model_config", "draft_parallel_config",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method", "synthetic_acceptance_rates",
    "synthetic_acceptance_length", "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk",
};

/* pydantic's report, on one line: "N validation error(s) for SpeculativeConfig: key: Unexpected ...". */
static int check_fields(json_t *cfg) {
    char keys[512] = "";
    size_t n_bad = 0, used = 0;
    const char *key;
    json_t *v;
    json_object_foreach(cfg, key, v) {
        bool known = false;
        for (size_t i = 0; i < sizeof spec_fields / sizeof *spec_fields && !known; i++)
            known = !strcmp(key, spec_fields[i]);
        if (known) continue;
        int w = snprintf(keys + used, sizeof keys - used, "%s%s: Unexpected keyword argument", n_bad ? "; " : "", key);
        if (w > 0) used = (size_t)w < sizeof keys - used ? used + (size_t)w : sizeof keys - 1;
        n_bad++;
    }
    if (!n_bad) return 0;
    return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%zu validation error%s for SpeculativeConfig: %s", n_bad,
                   n_bad > 1 ? "s" : "", keys);
}

static int parse_method(json_t *cfg, cv_spec_config *out) {
    json_t *m = json_object_get(cfg, "method");
    if (!json_is_string(m)) return bad("speculative config: %s", "\"method\" (a string) is required");
    const char *s = json_string_value(m);
    if (!strcmp(s, "ngram")) out->method = CV_SPEC_NGRAM;
    else if (!strcmp(s, "qwen3_5_mtp") || !strcmp(s, "mtp") || !strcmp(s, "qwen3_next_mtp")) out->method = CV_SPEC_MTP;
    else
        return bad("speculative config: unsupported method \"%s\" (supported: ngram, mtp, qwen3_5_mtp, qwen3_next_mtp)", s);
    return 0;
}

int cv_spec_config_parse(const char *text, cv_spec_config *out) {
    memset(out, 0, sizeof *out);
    if (!text || !*text) return 0;
    json_error_t err;
    json_t *cfg = json_loads(text, 0, &err);
    if (!cfg || !json_is_object(cfg)) {
        json_decref(cfg);
        return bad("speculative config is not a JSON object: %s", cfg ? "wrong type" : err.text);
    }
    int rc = check_fields(cfg);
    if (!rc) rc = parse_method(cfg, out);
    out->num_speculative_tokens = 1;
    if (!rc) {
        if (!json_object_get(cfg, "num_speculative_tokens"))
            rc = bad("speculative config: %s", "\"num_speculative_tokens\" is required");
        else
            rc = read_int(cfg, "num_speculative_tokens", 1, CV_MAX_SPEC_TOKENS, &out->num_speculative_tokens);
    }
    /* vLLM: both lookups default to 5 when neither is given, else one to the other. */
    int32_t lo = 0, hi = 0;
    if (!rc) rc = read_int(cfg, "prompt_lookup_min", 1, 1 << 16, &lo);
    if (!rc) rc = read_int(cfg, "prompt_lookup_max", 1, 1 << 16, &hi);
    json_decref(cfg);
    if (rc) return rc;
    if (!lo && !hi) lo = hi = 5;
    else if (!lo) lo = hi;
    else if (!hi) hi = lo;
    if (lo > hi)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "speculative config: prompt_lookup_min (%d) > prompt_lookup_max (%d)", lo, hi);
    out->prompt_lookup_min = lo;
    out->prompt_lookup_max = hi;
    return 0;
}

/* Where to copy the draft from: the most recent earlier occurrence of tokens[n-len..n) that is
 * followed by `want` tokens, else the occurrence followed by the most (in repetitive text the most
 * recent match sits right before the suffix and has almost nothing after it). -1 when none. */
static ptrdiff_t best_match(const int32_t *tokens, size_t n, size_t len, size_t want) {
    const int32_t *suffix = tokens + n - len;
    ptrdiff_t best = -1;
    for (ptrdiff_t start = (ptrdiff_t)(n - len) - 1; start >= 0; start--) {
        if (memcmp(tokens + start, suffix, len * sizeof *tokens) != 0) continue;
        if (n - ((size_t)start + len) >= want) return start;
        best = start; /* earlier occurrences have more tokens after them */
    }
    return best;
}

int32_t cv_ngram_propose(const cv_spec_config *cfg, const int32_t *tokens, size_t n, int32_t max_draft,
                         int32_t *draft) {
    if (max_draft <= 0) return 0;
    for (int32_t len = cfg->prompt_lookup_max; len >= cfg->prompt_lookup_min; len--) {
        if ((size_t)len >= n) continue;
        ptrdiff_t at = best_match(tokens, n, (size_t)len, (size_t)max_draft);
        if (at < 0) continue;
        size_t from = (size_t)at + (size_t)len;
        int32_t k = 0;
        while (k < max_draft && from + (size_t)k < n) {
            draft[k] = tokens[from + (size_t)k];
            k++;
        }
        return k;
    }
    return 0;
}
