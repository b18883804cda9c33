/*
 * sampler.h — turning one row of logits into the next token, with vLLM's semantics and order
 * (vllm/v1/sample/sampler.py):
 *
 *   1. raw logprobs (log-softmax of the unprocessed logits) for the logprobs the request asked for
 *      (vLLM's processed modes take them of the row as it is drawn from instead: after step 6 when
 *      greedy, else after step 7's temperature and filters, removed tokens at -inf);
 *   2. allowed_token_ids: every id outside the set gets -inf;
 *   3. bad_words: the last token of each bad word gets -inf when the output so far ends with the
 *      word's other tokens (a one-token word always);
 *   4. min_tokens: while fewer than min_tokens were generated, eos and stop token ids get -inf;
 *   5. logit_bias is added;
 *   6. penalties: repetition (prompt and output tokens), frequency and presence (output only);
 *   7. temperature < 1e-5: argmax. Otherwise divide by temperature, then min_p, top_k, top_p, and
 *      draw with the exponential race argmax(p_i / q_i), q_i ~ Exp(1), from the request's own RNG.
 * Steps 2-3 are hard: no later step can bring a logit back from -inf.
 *
 * Before step 1, the sequence's logits processors (logits_proc.h: a grammar) mask what they forbid.
 *
 * Each request (each of its n completions) owns a cv_sampler_state whose RNG depends only on its
 * seed, so the same seed gives the same tokens whatever else is in the batch. The state also keeps
 * what steps 3, 4 and 6 look at: the count of tokens generated, the last few of them (as many as
 * the longest bad word needs) and the penalties' counts. Each sampled token must be recorded with
 * cv_sampler_accept before the next position is sampled; speculative decoding's verification does
 * that for every accepted draft, so each position sees the drafts accepted before it.
 *
 * NaN logits count as -inf and +inf as FLT_MAX. When nothing survives steps 2-6 (every logit -inf),
 * the result is the stop id that min_tokens masked with the best logit left by steps 2-3, or token
 * 0 when there is none (torch's argmax of an all -inf row).
 */
#ifndef CV_SAMPLE_SAMPLER_H
#define CV_SAMPLE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/rng.h"
#include "sample/logits_proc.h"

/* Token sequences back to back: sequence i is ids[starts[i] .. starts[i + 1]). */
typedef struct cv_token_seqs {
    int32_t *ids;
    int32_t *starts;          /* n + 1 entries */
    size_t n;
} cv_token_seqs;

typedef struct cv_sampler_params {
    float temperature;        /* < 1e-5: greedy */
    float top_p;              /* >= 1: off */
    int32_t top_k;            /* <= 0 or >= vocab: off; ties with the k-th largest logit are kept */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty;
    float frequency_penalty;
    const int32_t *allowed_ids; /* ascending, distinct, each < vocab; n_allowed 0: every id */
    size_t n_allowed;
    const cv_token_seqs *bad_words; /* each sequence >= 1 token; NULL: none */
    int32_t min_tokens;
    const int32_t *stop_ids;  /* eos ids (unless ignore_eos) + stop_token_ids, masked by min_tokens */
    size_t n_stop_ids;
    const int32_t *bias_ids;
    const float *bias_values;
    size_t n_bias;
    int32_t logprobs;         /* -1: none; else top-N logprobs */
    bool logits;              /* logprobs_mode *_logits: the logprobs' values are the logits */
    bool processed;           /* logprobs_mode processed_*: of the processed row (step 1), not the raw one */
} cv_sampler_params;

typedef struct cv_sampler_state {
    cv_rng rng;
    int32_t vocab_size;
    uint8_t *in_prompt;       /* [vocab] 1 when the token occurs in the prompt (repetition penalty) */
    int32_t *out_count;       /* [vocab] occurrences in the output so far */
    int32_t *seen;            /* distinct ids the penalties touch (prompt when tracked, output) */
    int32_t n_seen, cap_seen;
    int32_t *recent;          /* ring of the last cap_recent generated tokens (bad words), else NULL */
    int32_t cap_recent;       /* the longest bad word's length - 1 */
    int32_t n_generated;
    cv_logits_proc *procs;    /* owned, applied in order before step 1 */
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

/* Penalty bookkeeping (in_prompt, out_count, seen) is allocated only when a penalty of `p` is
 * active, the recent tokens only when `p` has bad words of two tokens or more; `p` must be the
 * parameters later passed to cv_sample. Prompt ids must be < vocab_size. */
void cv_sampler_state_init(cv_sampler_state *st, const cv_sampler_params *p, int32_t vocab_size,
                           uint64_t seed, const int32_t *prompt, size_t n_prompt);
void cv_sampler_state_free(cv_sampler_state *st);
/* Appends a logits processor; the state owns it from here on. */
void cv_sampler_add_proc(cv_sampler_state *st, cv_logits_proc *proc);
/* Records a generated token (bad words, min_tokens, penalties, processors). Returns false when a
 * processor forbids the token (only possible when the sampler's fallback picked a token that every
 * rule had removed); the sampler's own bookkeeping records it anyway. */
bool cv_sampler_accept(cv_sampler_state *st, int32_t token_id);

/* Samples from `logits` (vocab_size floats; modified in place). `scratch` must hold 2·vocab_size
 * 4-byte words (it holds token ids and a copy of the raw row) and come from malloc. `res` may be
 * NULL when p->logprobs < 0; otherwise res->top needs min(p->logprobs, vocab_size) entries, and
 * res->chosen / res->top / res->n_top are filled (when p->logprobs < 0, only res->token_id). */
int32_t cv_sample(const cv_sampler_params *p, cv_sampler_state *st, float *logits, void *scratch,
                  cv_sample_result *res);

/* As cv_sample, for a position where speculative decoding proposed `draft`: returns the draft with
 * probability p(draft) under the processed distribution, else a token drawn from that distribution
 * without the draft. The result has exactly cv_sample's distribution (greedy: the argmax, which the
 * caller compares with the draft). */
int32_t cv_sample_verify(const cv_sampler_params *p, cv_sampler_state *st, float *logits, void *scratch,
                         int32_t draft, cv_sample_result *res);

/* Raw logprobs of one row: top-N entries (most likely first, ties by lower id, ranks 1..N) and the
 * entry for `token_id`, whose rank is vLLM's: the number of tokens whose logprob is >= its own
 * (so 1 + those strictly above it when there is no tie). prompt_logprobs and logprobs share this.
 * n_top is clamped to vocab_size; `top` needs that many entries (may be NULL when n_top is 0).
 * as_logits (vLLM's logprobs_mode raw_logits): the values are the logits themselves, in the same
 * order and with the same ranks. */
void cv_logprobs_of(const float *logits, int32_t vocab_size, int32_t n_top, int32_t token_id, bool as_logits,
                    cv_logprob_entry *top, cv_logprob_entry *chosen);

/* The stages of cv_sample, exposed so tests can check them exactly. */

/* Steps 2-6 (allowed_token_ids, bad_words, min_tokens, logit_bias, penalties) in place on a row of
 * st->vocab_size logits. */
void cv_sampler_process_logits(const cv_sampler_params *p, const cv_sampler_state *st, float *logits);

/* Step 7 up to the draw, for temperature >= 1e-5: divides by the temperature and sets every token
 * removed by min_p, top_k or top_p to -inf. When top_k or top_p is active, writes the surviving
 * ids to `ids` (vocab_size entries) and returns their count; otherwise returns -1 (every token with
 * a finite logit is a candidate) and leaves `ids` alone. Returns 0 when no logit is finite. */
int32_t cv_sampler_filter(const cv_sampler_params *p, float *logits, int32_t vocab_size, int32_t *ids);

#endif
