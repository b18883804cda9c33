/*
 * sampler.h — turning one row of logits into the next token, with vLLM's semantics and order
 * (vllm/v1/sample/sampler.py):
 *
 *   1. raw logprobs (log-softmax of the unprocessed logits) for the logprobs the request asked for;
 *   2. min_tokens: while fewer than min_tokens were generated, eos and stop token ids get -inf;
 *   3. logit_bias is added;
 *   4. penalties: repetition (prompt and output tokens), frequency and presence (output only);
 *   5. temperature < 1e-5: argmax. Otherwise divide by temperature, then min_p, top_k, top_p, and
 *      draw with the exponential race argmax(p_i / q_i), q_i ~ Exp(1), from the request's own RNG.
 *
 * Each request (each of its n completions) owns a cv_sampler_state whose RNG depends only on its
 * seed, so the same seed gives the same tokens whatever else is in the batch.
 */
#ifndef CV_SAMPLER_H
#define CV_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/rng.h"

typedef struct cv_sampler_params {
    float temperature;
    float top_p;
    int32_t top_k;            /* <= 0: off */
    float min_p;
    float repetition_penalty; /* 1: off */
    float presence_penalty;
    float frequency_penalty;
    int32_t min_tokens;
    const int32_t *stop_ids;  /* eos ids (unless ignore_eos) + stop_token_ids, masked by min_tokens */
    size_t n_stop_ids;
    const int32_t *bias_ids;
    const float *bias_values;
    size_t n_bias;
    int32_t logprobs;         /* -1: none; else top-N raw logprobs */
} cv_sampler_params;

typedef struct cv_sampler_state {
    cv_rng rng;
    int32_t vocab_size;
    uint8_t *in_prompt;       /* [vocab] 1 when the token occurs in the prompt (repetition penalty) */
    int32_t *out_count;       /* [vocab] occurrences in the output so far */
    int32_t n_generated;
} cv_sampler_state;

typedef struct cv_logprob_entry {
    int32_t token_id;
    float logprob;
    int32_t rank;             /* 1-based rank in the raw distribution */
} cv_logprob_entry;

typedef struct cv_sample_result {
    int32_t token_id;
    cv_logprob_entry chosen;  /* logprob and rank of token_id in the raw distribution */
    cv_logprob_entry *top;    /* caller-provided array of at least params->logprobs entries */
    int32_t n_top;
} cv_sample_result;

/* Penalty bookkeeping is allocated only when a penalty is active. */
void cv_sampler_state_init(cv_sampler_state *st, const cv_sampler_params *p, int32_t vocab_size,
                           uint64_t seed, const int32_t *prompt, size_t n_prompt);
void cv_sampler_state_free(cv_sampler_state *st);
/* Records a generated token (penalties, min_tokens). */
void cv_sampler_accept(cv_sampler_state *st, int32_t token_id);

/* Samples from `logits` (vocab_size floats; modified in place). `scratch` must hold
 * 2·vocab_size floats. */
int32_t cv_sample(const cv_sampler_params *p, cv_sampler_state *st, float *logits, float *scratch,
                  cv_sample_result *res);

/* Raw logprobs of one row: top-N entries (most likely first) and the entry for `token_id`
 * (prompt_logprobs and logprobs share this). `scratch` holds vocab_size floats. */
void cv_logprobs_of(const float *logits, int32_t vocab_size, int32_t n_top, int32_t token_id,
                    float *scratch, cv_logprob_entry *top, cv_logprob_entry *chosen);

#endif
