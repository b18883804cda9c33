/*
 * sharegpt.c — vLLM's ShareGPTDataset (vllm/benchmarks/datasets.py): the file is read whole (jansson;
 * ShareGPT_V3's 670 MB take a few GB while loading, as in Python), entries with at least two turns
 * kept and shuffled with Python's generator (pyrandom.h), so that the same --seed gives vLLM's
 * requests in vLLM's order. Each entry's first turn is the prompt and the second's token count the
 * output length (or --sharegpt-output-len); vLLM's is_valid_sequence drops prompts under 4 tokens or
 * over 1,024, outputs under 4 (unless the length is given) and pairs over 2,048 together. When fewer
 * than num_prompts pass, random.choices over the kept ones (re-seeded) fills up, as vLLM oversamples
 * (cv_bench_oversample).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bench/dataset.h"
#include "bench/pyrandom.h"

enum { MIN_LEN = 4, MAX_PROMPT_LEN = 1024, MAX_TOTAL_LEN = 2048 };

static bool valid_sequence(int32_t prompt_len, int32_t output_len, bool output_given) {
    return prompt_len >= MIN_LEN && (output_given || output_len >= MIN_LEN) && prompt_len <= MAX_PROMPT_LEN &&
           prompt_len + output_len <= MAX_TOTAL_LEN;
}

/* conversations[k]["value"], or NULL */
static const char *turn(const json_t *conv, size_t k, size_t *len) {
    const json_t *v = json_object_get(json_array_get(conv, k), "value");
    *len = json_string_length(v);
    return json_string_value(v);
}

int cv_sharegpt_dataset(const cvllm_tokenizer *tok, const cv_sharegpt_options *o, cv_bench_sample **out,
                        size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    const char *path = o->from.path;
    json_error_t err;
    json_t *data = json_load_file(path, 0, &err);
    if (!data) return cv_fail(CVLLM_ERR_IO, "sharegpt dataset %s: %s (line %d)", path, err.text, err.line);
    if (!json_is_array(data)) {
        json_decref(data);
        return cv_fail(CVLLM_ERR_FORMAT, "sharegpt dataset %s: expected a JSON list of conversations", path);
    }
    const size_t n_all = json_array_size(data);
    size_t *order = cv_xmalloc((n_all ? n_all : 1) * sizeof *order), n = 0;
    for (size_t i = 0; i < n_all; i++) {
        const json_t *conv = json_object_get(json_array_get(data, i), "conversations");
        if (json_array_size(conv) >= 2) order[n++] = i;
    }
    if (!o->from.disable_shuffle) {
        cv_pyrandom r;
        cv_pyrandom_seed(&r, o->from.seed);
        cv_pyrandom_shuffle(&r, order, n);
    }
    const size_t want = (size_t)o->from.num_prompts;
    cv_bench_sample *s = cv_xcalloc(want ? want : 1, sizeof *s);
    size_t got = 0;
    int rc = 0;
    for (size_t k = 0; k < n && got < want && !rc; k++) {
        const json_t *conv = json_object_get(json_array_get(data, order[k]), "conversations");
        size_t plen, clen;
        const char *prompt = turn(conv, 0, &plen), *completion = turn(conv, 1, &clen);
        if (!prompt || !completion) continue; /* not text: vLLM would stop on it */
        int32_t *ids = NULL, *cids = NULL;
        size_t n_ids = 0, n_cids = 0;
        rc = cvllm_tokenize(tok, prompt, plen, &ids, &n_ids);
        if (!rc && o->output_len < 0) rc = cvllm_tokenize(tok, completion, clen, &cids, &n_cids);
        cvllm_free(cids);
        const int32_t output_len = o->output_len >= 0 ? o->output_len : (int32_t)n_cids;
        if (!rc && valid_sequence((int32_t)n_ids, output_len, o->output_len >= 0)) {
            cv_bench_sample_take(&s[got++], cv_xstrndup(prompt, plen), ids, n_ids, output_len);
        }
        cvllm_free(ids);
    }
    free(order);
    json_decref(data);
    if (!rc && got == 0) rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "sharegpt dataset %s: no conversation passes the "
                                      "length checks (prompt 4-1024 tokens, output at least 4, both at most 2048)", path);
    if (rc) {
        cv_bench_samples_free(s, want);
        return rc;
    }
    *out = s;
    *n_out = cv_bench_oversample(&o->from, s, got);
    return 0;
}
