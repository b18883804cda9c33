/*
 * dataset.c — see dataset.h. Random numbers come from cv_rng seeded with --seed, so a seed gives the
 * same prompts on every run (not numpy's stream: the prompts differ from vLLM's for the same seed,
 * their distribution does not). The draw order is vLLM's: all input lengths, all output lengths,
 * all offsets, then the prefix, then padding ids while adjusting lengths.
 */
#include "bench/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "tokenizer/tokenizer.h"

enum { MAX_LENGTH_RETRIES = 10 };

/* Uniform integer in [lo, hi]. */
static int64_t uniform_int(cv_rng *rng, int64_t lo, int64_t hi) {
    return lo + (int64_t)(cv_rng_next(rng) % (uint64_t)(hi - lo + 1));
}

static int32_t *allowed_ids(const cvllm_tokenizer *tok, int32_t limit, int32_t *n) {
    const cv_tokenizer *t = (const cv_tokenizer *)tok; /* the public handle is the internal object */
    int32_t *ids = cv_xmalloc((size_t)limit * sizeof *ids), k = 0;
    for (int32_t id = 0; id < limit; id++)
        if (!cv_tokenizer_is_special(t, id)) ids[k++] = id;
    *n = k;
    return ids;
}

/* Decodes, re-encodes and trims/pads `*seq` until its text encodes to `target` tokens or the
 * retries run out; leaves the final text in *prompt and its encoding in *seq. */
static int fit_to_length(const cvllm_tokenizer *tok, cv_rng *rng, const int32_t *allowed, int32_t n_allowed,
                         int32_t target, int32_t **seq, size_t *n_seq, char **prompt) {
    for (int tries = MAX_LENGTH_RETRIES;; tries--) {
        char *text = NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int rc = cvllm_detokenize(tok, *seq, *n_seq, false, &text);
        if (!rc) rc = cvllm_tokenize(tok, text, strlen(text), &ids, &n_ids);
        if (rc) {
            cvllm_free(text);
            return rc;
        }
        free(*prompt);
        *prompt = cv_xstrdup(text);
        cvllm_free(text);
        free(*seq);
        *seq = cv_xmalloc((n_ids > (size_t)target ? n_ids : (size_t)target) * sizeof **seq + 1);
        if (n_ids) memcpy(*seq, ids, n_ids * sizeof *ids);
        cvllm_free(ids);
        *n_seq = n_ids;
        if (tries == 0 || n_ids == (size_t)target) return 0;
        if (n_ids < (size_t)target)
            for (; *n_seq < (size_t)target; (*n_seq)++) (*seq)[*n_seq] = allowed[uniform_int(rng, 0, n_allowed - 1)];
        else
            *n_seq = (size_t)target;
    }
}

static int check_options(const cvllm_tokenizer *tok, const cv_random_dataset_options *o, int32_t *limit) {
    if (!(o->range_ratio >= 0 && o->range_ratio < 1))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--random-range-ratio must be in [0, 1), got %g", o->range_ratio);
    if (o->num_prompts < 1 || o->input_len < 0 || o->output_len < 1 || o->prefix_len < 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "random dataset: lengths and --num-prompts must be positive");
    if (o->prefix_len + (int64_t)floor(o->input_len * (1.0 - o->range_ratio)) < 1)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "--random-input-len is too small: with --random-range-ratio %g the shortest prompt "
                       "(prefix + sampled) would have no token",
                       o->range_ratio);
    int32_t vocab = cvllm_tokenizer_vocab_size(tok);
    *limit = o->vocab_limit > 0 && o->vocab_limit < vocab ? o->vocab_limit : vocab;
    return 0;
}

int cv_random_dataset(const cvllm_tokenizer *tok, const cv_random_dataset_options *o, cv_bench_sample **out) {
    int32_t limit = 0;
    *out = NULL;
    int rc = check_options(tok, o, &limit);
    if (rc) return rc;
    int32_t n_allowed;
    int32_t *allowed = allowed_ids(tok, limit, &n_allowed);
    if (n_allowed == 0) {
        free(allowed);
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "random dataset: the vocabulary has no ordinary token");
    }
    cv_rng rng;
    cv_rng_seed(&rng, o->seed);
    size_t n = (size_t)o->num_prompts;
    int64_t in_lo = (int64_t)floor(o->input_len * (1 - o->range_ratio)), in_hi = (int64_t)ceil(o->input_len * (1 + o->range_ratio));
    int64_t out_lo = (int64_t)floor(o->output_len * (1 - o->range_ratio)), out_hi = (int64_t)ceil(o->output_len * (1 + o->range_ratio));
    if (out_lo < 1) out_lo = 1;
    int32_t *input_lens = cv_xmalloc(n * sizeof *input_lens), *offsets = cv_xmalloc(n * sizeof *offsets);
    cv_bench_sample *s = cv_xcalloc(n, sizeof *s);
    for (size_t i = 0; i < n; i++) input_lens[i] = (int32_t)uniform_int(&rng, in_lo, in_hi);
    for (size_t i = 0; i < n; i++) s[i].output_len = (int32_t)uniform_int(&rng, out_lo, out_hi);
    for (size_t i = 0; i < n; i++) offsets[i] = (int32_t)uniform_int(&rng, 0, limit - 1);
    int32_t *prefix = cv_xmalloc(((size_t)o->prefix_len + 1) * sizeof *prefix);
    for (int32_t k = 0; k < o->prefix_len; k++) prefix[k] = allowed[uniform_int(&rng, 0, n_allowed - 1)];
    for (size_t i = 0; i < n && !rc; i++) {
        size_t len = (size_t)o->prefix_len + (size_t)input_lens[i];
        int32_t *seq = cv_xmalloc(len * sizeof *seq + 1);
        memcpy(seq, prefix, (size_t)o->prefix_len * sizeof *seq);
        for (int32_t k = 0; k < input_lens[i]; k++)
            seq[o->prefix_len + k] = allowed[((int64_t)offsets[i] + (int64_t)i + k) % n_allowed];
        if (o->exact_ids) {
            char *text = NULL;
            rc = cvllm_detokenize(tok, seq, len, false, &text);
            if (!rc) s[i].prompt = cv_xstrdup(text);
            cvllm_free(text);
        } else {
            rc = fit_to_length(tok, &rng, allowed, n_allowed, (int32_t)len, &seq, &len, &s[i].prompt);
        }
        s[i].ids = seq;
        s[i].prompt_len = (int32_t)len;
    }
    free(prefix);
    free(offsets);
    free(input_lens);
    free(allowed);
    if (rc) {
        cv_bench_samples_free(s, n);
        return rc;
    }
    *out = s;
    return 0;
}

void cv_bench_samples_free(cv_bench_sample *s, size_t n) {
    if (!s) return;
    for (size_t i = 0; i < n; i++) {
        free(s[i].prompt);
        free(s[i].ids);
    }
    free(s);
}
