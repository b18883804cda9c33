/*
 * dataset.h — vLLM's benchmark datasets: "random", synthetic prompts of controlled token length, and
 * "sharegpt", conversations from a file (below).
 *
 * Per request i: an input length drawn uniformly from [⌊L·(1−r)⌋, ⌈L·(1+r)⌉], an output length from
 * [max(1, ⌊O·(1−r)⌋), max(1, ⌈O·(1+r)⌉)] and an offset; the prompt is a shared random prefix of P
 * tokens followed by allowed[(offset + i + k) mod |allowed|] for k < input length, where `allowed`
 * is every id below the vocabulary limit that is not a special token (vLLM also leaves out the few
 * non-special added tokens such as <think>, which the tokenizer API does not tell apart from base
 * tokens; they re-encode to themselves, so lengths stay exact). The ids are decoded to text
 * and, because decode∘encode is not the identity for BPE, re-encoded and trimmed or padded up to
 * ten times until the text encodes to exactly P + input length tokens (vLLM's
 * gen_prompt_decode_to_target_len); prompt_len is the count finally reached.
 *
 * `exact_ids` skips the text round trip and keeps the sampled ids as they are, for engines whose
 * embedding table is smaller than the tokenizer (re-encoding could produce ids it cannot embed).
 *
 * "random-rerank" (vLLM's RandomDatasetForReranking) makes one query of about L/2 − 1 tokens and
 * num_prompts documents of about L − query − 1 tokens each (lengths drawn as above, the query as
 * request 0 and document i as request i + 1), then groups the documents batch_size at a time under
 * the query: one sample a group, its prompt_len counting the query (and one separator) once a
 * document.
 */
#ifndef CV_BENCH_DATASET_H
#define CV_BENCH_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"

typedef struct cv_random_dataset_options {
    int32_t num_prompts;
    int32_t input_len, output_len, prefix_len;
    double range_ratio;      /* [0, 1) */
    uint64_t seed;
    int32_t vocab_limit;     /* ids drawn below this; 0 = the tokenizer's vocabulary */
    bool exact_ids;
} cv_random_dataset_options;

typedef struct cv_bench_sample {
    char *prompt;            /* the prompt text (random-rerank: the query) */
    int32_t *ids;            /* its token ids (random-rerank: the query's) */
    int32_t prompt_len, output_len;
    char **docs;             /* random-rerank: the documents ranked against the prompt */
    int32_t n_docs;
} cv_bench_sample;

/* *out gets opts->num_prompts samples; free with cv_bench_samples_free. */
int cv_random_dataset(const cvllm_tokenizer *tok, const cv_random_dataset_options *opts,
                      cv_bench_sample **out);

/* "random-rerank": *n_out samples (ceil(num_prompts / batch_size)); free with cv_bench_samples_free. */
int cv_random_rerank_dataset(const cvllm_tokenizer *tok, const cv_random_dataset_options *opts, int32_t batch_size,
                             cv_bench_sample **out, size_t *n_out);

/* vLLM's "sharegpt" dataset (sharegpt.c): a JSON list of {"conversations": [{"value": prompt},
 * {"value": completion}, ...]} entries, shuffled with Python's random.seed(seed), taken in that order
 * while they pass vLLM's length checks, then drawn again (random.choices) up to num_prompts. */
typedef struct cv_sharegpt_options {
    const char *path;
    int32_t num_prompts;
    int32_t output_len;      /* --sharegpt-output-len; -1: the completion's own token count */
    uint64_t seed;
} cv_sharegpt_options;

int cv_sharegpt_dataset(const cvllm_tokenizer *tok, const cv_sharegpt_options *opts, cv_bench_sample **out);
void cv_bench_samples_free(cv_bench_sample *s, size_t n);

#endif
