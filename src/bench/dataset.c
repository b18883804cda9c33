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
#include "base/log.h"
#include "base/rng.h"
#include "bench/pyrandom.h"
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

/* Sample `index` of a dataset: the prefix, then input_len ids walking `allowed` from offset + index,
 * as text (fitted to its length unless exact). */
static int make_sequence(const cvllm_tokenizer *tok, cv_rng *rng, const int32_t *allowed, int32_t n_allowed,
                         const int32_t *prefix, int32_t prefix_len, int32_t input_len, int64_t offset, size_t index,
                         bool exact, cv_bench_sample *out) {
    size_t len = (size_t)prefix_len + (size_t)input_len;
    int32_t *seq = cv_xmalloc(len * sizeof *seq + 1);
    if (prefix_len) memcpy(seq, prefix, (size_t)prefix_len * sizeof *seq);
    for (int32_t k = 0; k < input_len; k++) seq[prefix_len + k] = allowed[(offset + (int64_t)index + k) % n_allowed];
    int rc;
    if (exact) {
        char *text = NULL;
        rc = cvllm_detokenize(tok, seq, len, false, &text);
        if (!rc) out->prompt = cv_xstrdup(text);
        cvllm_free(text);
    } else {
        rc = fit_to_length(tok, rng, allowed, n_allowed, (int32_t)len, &seq, &len, &out->prompt);
    }
    out->ids = seq;
    out->prompt_len = (int32_t)len;
    return rc;
}

/* n lengths drawn uniformly from [⌊L·(1−r)⌋, ⌈L·(1+r)⌉], none below `floor_at`. */
static void draw_lengths(cv_rng *rng, size_t n, int32_t L, double r, int64_t floor_at, int32_t *out) {
    int64_t lo = (int64_t)floor(L * (1 - r)), hi = (int64_t)ceil(L * (1 + r));
    if (lo < floor_at) lo = floor_at;
    if (hi < lo) hi = lo;
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)uniform_int(rng, lo, hi);
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
    int32_t *input_lens = cv_xmalloc(n * sizeof *input_lens), *offsets = cv_xmalloc(n * sizeof *offsets);
    int32_t *output_lens = cv_xmalloc(n * sizeof *output_lens);
    cv_bench_sample *s = cv_xcalloc(n, sizeof *s);
    draw_lengths(&rng, n, o->input_len, o->range_ratio, 0, input_lens);
    draw_lengths(&rng, n, o->output_len, o->range_ratio, 1, output_lens);
    for (size_t i = 0; i < n; i++) offsets[i] = (int32_t)uniform_int(&rng, 0, limit - 1);
    int32_t *prefix = cv_xmalloc(((size_t)o->prefix_len + 1) * sizeof *prefix);
    for (int32_t k = 0; k < o->prefix_len; k++) prefix[k] = allowed[uniform_int(&rng, 0, n_allowed - 1)];
    for (size_t i = 0; i < n && !rc; i++) {
        s[i].output_len = output_lens[i];
        rc = make_sequence(tok, &rng, allowed, n_allowed, prefix, o->prefix_len, input_lens[i], offsets[i], i,
                           o->exact_ids, &s[i]);
    }
    free(prefix);
    free(offsets);
    free(output_lens);
    free(input_lens);
    free(allowed);
    if (rc) {
        cv_bench_samples_free(s, n);
        return rc;
    }
    *out = s;
    return 0;
}

int cv_random_rerank_dataset(const cvllm_tokenizer *tok, const cv_random_dataset_options *o, int32_t batch_size,
                             cv_bench_sample **out, size_t *n_out) {
    int32_t limit = 0;
    *out = NULL;
    *n_out = 0;
    int rc = check_options(tok, o, &limit);
    if (rc) return rc;
    if (batch_size < 1) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--random-batch-size must be at least 1");
    int32_t n_allowed;
    int32_t *allowed = allowed_ids(tok, limit, &n_allowed);
    cv_rng rng;
    cv_rng_seed(&rng, o->seed);
    int32_t query_len, query_offset;
    draw_lengths(&rng, 1, o->input_len / 2 - 1, o->range_ratio, 0, &query_len); /* one separator a pair */
    query_offset = (int32_t)uniform_int(&rng, 0, limit - 1);
    const size_t n_docs = (size_t)o->num_prompts;
    int32_t *doc_lens = cv_xmalloc(n_docs * sizeof *doc_lens), *offsets = cv_xmalloc(n_docs * sizeof *offsets);
    draw_lengths(&rng, n_docs, o->input_len - query_len - 1, o->range_ratio, 0, doc_lens);
    for (size_t i = 0; i < n_docs; i++) offsets[i] = (int32_t)uniform_int(&rng, 0, limit - 1);
    if (n_allowed == 0 || query_len < 1 || doc_lens[0] < 0)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "random-rerank: --random-input-len %d leaves no room for a query and "
                     "a document", o->input_len);
    cv_bench_sample query = {0}, *docs = cv_xcalloc(n_docs, sizeof *docs);
    if (!rc) rc = make_sequence(tok, &rng, allowed, n_allowed, NULL, 0, query_len, query_offset, 0, o->exact_ids, &query);
    for (size_t i = 0; i < n_docs && !rc; i++)
        rc = make_sequence(tok, &rng, allowed, n_allowed, NULL, 0, doc_lens[i], offsets[i], i + 1, o->exact_ids, &docs[i]);
    const size_t n = (n_docs + (size_t)batch_size - 1) / (size_t)batch_size;
    cv_bench_sample *s = rc ? NULL : cv_xcalloc(n, sizeof *s);
    for (size_t b = 0; s && b < n; b++) {
        const size_t first = b * (size_t)batch_size, count = n_docs - first < (size_t)batch_size ? n_docs - first
                                                                                                  : (size_t)batch_size;
        s[b].prompt = cv_xstrdup(query.prompt);
        s[b].ids = cv_xmalloc((size_t)query.prompt_len * sizeof *s[b].ids + 1);
        memcpy(s[b].ids, query.ids, (size_t)query.prompt_len * sizeof *s[b].ids);
        s[b].docs = cv_xcalloc(count, sizeof *s[b].docs);
        s[b].n_docs = (int32_t)count;
        s[b].prompt_len = (query.prompt_len + 1) * (int32_t)count;
        for (size_t k = 0; k < count; k++) {
            s[b].docs[k] = docs[first + k].prompt;
            docs[first + k].prompt = NULL;
            s[b].prompt_len += docs[first + k].prompt_len;
        }
    }
    cv_bench_samples_free(docs, n_docs);
    free(query.prompt);
    free(query.ids);
    free(offsets);
    free(doc_lens);
    free(allowed);
    if (rc) return rc;
    *out = s;
    *n_out = n;
    return 0;
}

/* A prefix_repetition part: len ordinary ids drawn at random, fitted to len tokens unless exact;
 * *ids gets them. */
static int random_part(const cvllm_tokenizer *tok, cv_rng *rng, const int32_t *allowed, int32_t n_allowed,
                       int32_t len, bool exact, int32_t **ids, size_t *n) {
    *ids = cv_xmalloc((size_t)len * sizeof **ids + 1);
    for (int32_t k = 0; k < len; k++) (*ids)[k] = allowed[uniform_int(rng, 0, n_allowed - 1)];
    *n = (size_t)len;
    if (exact) return 0;
    char *text = NULL;
    const int rc = fit_to_length(tok, rng, allowed, n_allowed, len, ids, n, &text);
    free(text);
    return rc;
}

/* Sample `s` from a prefix and a suffix: their ids joined, as text. */
static int join_parts(const cvllm_tokenizer *tok, const int32_t *prefix, size_t n_prefix, const int32_t *suffix,
                      size_t n_suffix, int32_t output_len, cv_bench_sample *s) {
    const size_t n = n_prefix + n_suffix;
    s->ids = cv_xmalloc(n * sizeof *s->ids + 1);
    if (n_prefix) memcpy(s->ids, prefix, n_prefix * sizeof *prefix);
    if (n_suffix) memcpy(s->ids + n_prefix, suffix, n_suffix * sizeof *suffix);
    s->prompt_len = (int32_t)n;
    s->output_len = output_len;
    char *text = NULL;
    const int rc = cvllm_detokenize(tok, s->ids, n, false, &text);
    if (!rc) s->prompt = cv_xstrdup(text);
    cvllm_free(text);
    return rc;
}

int cv_prefix_repetition_dataset(const cvllm_tokenizer *tok, const cv_prefix_repetition_options *o,
                                 cv_bench_sample **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (o->num_prefixes < 1 || o->prefix_len < 0 || o->suffix_len < 0 || o->output_len < 1 ||
        o->prefix_len + o->suffix_len < 1)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "prefix_repetition dataset: --prefix-repetition-num-prefixes and "
                       "-output-len must be at least 1, the prefix and suffix lengths at least 0 and not both 0");
    const size_t per = (size_t)(o->num_prompts / o->num_prefixes), n = per * (size_t)o->num_prefixes;
    if (per == 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "num_requests (%d) must be greater than or equal to num_prefixes (%d)",
                       o->num_prompts, o->num_prefixes);
    int32_t n_allowed, vocab = cvllm_tokenizer_vocab_size(tok);
    int32_t *allowed = allowed_ids(tok, o->vocab_limit > 0 && o->vocab_limit < vocab ? o->vocab_limit : vocab, &n_allowed);
    if (n_allowed == 0) {
        free(allowed);
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "prefix_repetition dataset: the vocabulary has no ordinary token");
    }
    cv_rng rng;
    cv_rng_seed(&rng, o->seed);
    cv_bench_sample *s = cv_xcalloc(n, sizeof *s);
    int rc = 0;
    for (size_t p = 0, k = 0; p < (size_t)o->num_prefixes && !rc; p++) {
        int32_t *prefix = NULL;
        size_t n_prefix = 0;
        rc = random_part(tok, &rng, allowed, n_allowed, o->prefix_len, o->exact_ids, &prefix, &n_prefix);
        for (size_t j = 0; j < per && !rc; j++, k++) {
            int32_t *suffix = NULL;
            size_t n_suffix = 0;
            rc = random_part(tok, &rng, allowed, n_allowed, o->suffix_len, o->exact_ids, &suffix, &n_suffix);
            if (!rc) rc = join_parts(tok, prefix, n_prefix, suffix, n_suffix, o->output_len, &s[k]);
            free(suffix);
        }
        free(prefix);
    }
    free(allowed);
    if (rc) {
        cv_bench_samples_free(s, n);
        return rc;
    }
    if (!o->disable_shuffle) { /* random.shuffle(requests), applied through an index */
        size_t *order = cv_xmalloc(n * sizeof *order);
        for (size_t i = 0; i < n; i++) order[i] = i;
        cv_pyrandom r;
        cv_pyrandom_seed(&r, o->seed);
        cv_pyrandom_shuffle(&r, order, n);
        cv_bench_sample *shuffled = cv_xmalloc(n * sizeof *shuffled);
        for (size_t i = 0; i < n; i++) shuffled[i] = s[order[i]];
        free(s);
        free(order);
        s = shuffled;
    }
    *out = s;
    *n_out = n;
    return 0;
}

void cv_bench_sample_take(cv_bench_sample *s, char *prompt, const int32_t *ids, size_t n, int32_t output_len) {
    s->prompt = prompt;
    s->ids = cv_xmalloc((n + 1) * sizeof *s->ids);
    if (n) memcpy(s->ids, ids, n * sizeof *ids);
    s->prompt_len = (int32_t)n;
    s->output_len = output_len;
}

size_t cv_bench_oversample(const cv_file_sampling *from, cv_bench_sample *s, size_t got) {
    const size_t want = (size_t)from->num_prompts;
    if (got == 0 || got >= want || from->no_oversample) return got;
    cv_pyrandom r;
    cv_pyrandom_seed(&r, from->seed);
    for (size_t i = got; i < want; i++) {
        const cv_bench_sample *one = &s[cv_pyrandom_choice(&r, got)];
        cv_bench_sample_take(&s[i], cv_xstrdup(one->prompt), one->ids, (size_t)one->prompt_len, one->output_len);
    }
    cv_info("bench", "Oversampled requests to reach %zu total samples.", want);
    return want;
}

void cv_bench_samples_free(cv_bench_sample *s, size_t n) {
    if (!s) return;
    for (size_t i = 0; i < n; i++) {
        free(s[i].prompt);
        free(s[i].ids);
        for (int32_t k = 0; k < s[i].n_docs; k++) free(s[i].docs[k]);
        free(s[i].docs);
    }
    free(s);
}
