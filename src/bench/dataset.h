/*
 * dataset.h — vLLM's benchmark datasets: "random", synthetic prompts of controlled token length,
 * "prefix_repetition", random prompts that share a few prefixes, and from files "sharegpt"
 * (conversations), "custom" and "spec_bench" (prompts, one a line), "sonnet" (poem lines) and
 * "burstgpt" (a trace's token counts) (below).
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

/* vLLM's "prefix_repetition" (PrefixRepetitionRandomDataset): num_prefixes random prefixes of
 * prefix_len tokens, each followed by num_prompts / num_prefixes random suffixes of suffix_len tokens
 * (each part drawn from the ordinary tokens and fitted to its length as the random dataset's prompts
 * are), output_len each, then shuffled with Python's random.seed(seed) unless disable_shuffle:
 * *n_out = num_prefixes · ⌊num_prompts / num_prefixes⌋ samples, as vLLM makes (no oversampling). */
typedef struct cv_prefix_repetition_options {
    int32_t num_prompts, prefix_len, suffix_len, num_prefixes, output_len;
    uint64_t seed;
    bool disable_shuffle;
    int32_t vocab_limit;     /* ids drawn below this; 0 = the tokenizer's vocabulary */
    bool exact_ids;          /* the drawn ids as they are, not fitted through text (as the random dataset's) */
} cv_prefix_repetition_options;

int cv_prefix_repetition_dataset(const cvllm_tokenizer *tok, const cv_prefix_repetition_options *opts,
                                 cv_bench_sample **out, size_t *n_out);

/* How the file datasets pick their samples (vLLM's --disable-shuffle, --no-oversample): the entries
 * are shuffled with Python's random.seed(seed) unless disable_shuffle, taken in that order up to
 * num_prompts, and when fewer than num_prompts pass, drawn again with random.choices (re-seeded) up
 * to num_prompts unless no_oversample (then the run has fewer requests). */
typedef struct cv_file_sampling {
    const char *path;
    int32_t num_prompts;
    uint64_t seed;
    bool disable_shuffle, no_oversample;
} cv_file_sampling;

/* vLLM's "sharegpt" dataset (sharegpt.c): a JSON list of {"conversations": [{"value": prompt},
 * {"value": completion}, ...]} entries whose first two turns pass vLLM's length checks. */
typedef struct cv_sharegpt_options {
    cv_file_sampling from;
    int32_t output_len;      /* --sharegpt-output-len; -1: the completion's own token count */
} cv_sharegpt_options;

int cv_sharegpt_dataset(const cvllm_tokenizer *tok, const cv_sharegpt_options *opts, cv_bench_sample **out,
                        size_t *n_out);

/* vLLM's "custom" dataset (custom.c): a .jsonl file of {"prompt": text} lines, each prompt the user
 * message of the model's chat template (rendered with the generation prompt, as transformers'
 * apply_chat_template) unless skip_chat_template, output_len tokens each. With spec_bench, vLLM's
 * "spec_bench": Spec-Bench's {"category": c, "turns": [text, ...]} lines, the first turn the prompt,
 * those of `category` only when it is not NULL. */
typedef struct cv_custom_options {
    cv_file_sampling from;
    const char *model;       /* whose chat template: a folder or hub id, as for the tokenizer */
    int32_t output_len;      /* --custom-output-len, --spec-bench-output-len */
    bool skip_chat_template;
    bool spec_bench;
    const char *category;    /* --spec-bench-category */
} cv_custom_options;

int cv_custom_dataset(const cvllm_tokenizer *tok, const cv_custom_options *opts, cv_bench_sample **out,
                      size_t *n_out);

/* vLLM's "sonnet" dataset (sonnet.c): prompts made of a file's lines (Shakespeare's sonnets in vLLM's
 * benchmarks/sonnet.txt) after "Pick as many lines as you can from these poem lines:\n", the first
 * lines of the file shared by every prompt (about prefix_len tokens with the chat template's), the
 * rest drawn with Python's random.choices seeded with `seed`, as many as make about input_len tokens
 * in the chat template; a prompt longer than input_len is drawn again. The request sends the
 * template's rendering (chat_endpoint false) or the prompt (true: the server renders it), as vLLM
 * does per backend. */
typedef struct cv_sonnet_options {
    const char *path, *model; /* model: whose chat template, as for the tokenizer */
    int32_t num_prompts, input_len, output_len, prefix_len;
    uint64_t seed;
    bool chat_endpoint;
} cv_sonnet_options;

int cv_sonnet_dataset(const cvllm_tokenizer *tok, const cv_sonnet_options *opts, cv_bench_sample **out);

/* vLLM's "burstgpt" dataset (burstgpt.c): the BurstGPT trace's GPT-4 rows with a response, num_prompts
 * of them drawn, each a synthetic prompt of its request tokens and its response tokens to generate. */
typedef struct cv_burstgpt_options {
    const char *path;
    int32_t num_prompts;
    uint64_t seed;
    int32_t vocab_limit;     /* prompt ids below this; 0 = the tokenizer's vocabulary */
} cv_burstgpt_options;

int cv_burstgpt_dataset(const cvllm_tokenizer *tok, const cv_burstgpt_options *opts, cv_bench_sample **out);

/* Helpers of the datasets that read a chat template (custom.c): the template of a model folder or
 * hub id; a prompt as the user message of it, rendered with the generation prompt (tmpl NULL: the
 * prompt as it is); the ids of a text as the tokenizer's __call__ gives them (special tokens added by
 * its post-processor; *ids is cvllm_free'd). */
typedef struct cv_chat_template cv_chat_template;
int cv_bench_chat_template(const char *model, cv_chat_template **out);
int cv_bench_chat_text(const cv_chat_template *tmpl, const char *prompt, char **text);
int cv_bench_encode(const cvllm_tokenizer *tok, const char *text, int32_t **ids, size_t *n);

/* Fills *s: `prompt` (cv_xmalloc'd, taken over), a copy of its n token ids, output_len. */
void cv_bench_sample_take(cv_bench_sample *s, char *prompt, const int32_t *ids, size_t n, int32_t output_len);

/* The file datasets' last step (cv_file_sampling): s holds `got` samples and room for num_prompts;
 * returns how many it holds after oversampling. */
size_t cv_bench_oversample(const cv_file_sampling *from, cv_bench_sample *s, size_t got);
void cv_bench_samples_free(cv_bench_sample *s, size_t n);

#endif
