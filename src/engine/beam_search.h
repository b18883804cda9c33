/*
 * beam_search.h — vLLM's beam search as a search fed one step at a time (see beam_search.c); the
 * public cvllm_engine_beam_search runs it over an engine, the server over its engine loops.
 */
#ifndef CVLLM_ENGINE_BEAM_SEARCH_H
#define CVLLM_ENGINE_BEAM_SEARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"

/* vLLM's BeamSearchParams, plus what the search needs of the prompt and tokenizer. */
typedef struct cv_beam_config {
    int32_t width;            /* beams; the choices returned at most */
    int32_t max_tokens;       /* steps at most */
    bool ignore_eos;
    bool include_stop_str_in_output; /* an eos-finished hypothesis keeps the eos id in its tokens */
    float length_penalty;
    float temperature;        /* of the step requests: decides their sampled token */
    int32_t eos_token_id;     /* the tokenizer's eos_token (cv_beam_eos_token_id); -1: none */
    int32_t top_logprobs;     /* entries a position keeps for a reply; -1: no logprobs kept */
    size_t n_prompt;          /* prompt length: the score's sequence length counts it */
} cv_beam_config;

typedef struct cv_beam_search cv_beam_search;
typedef struct cv_beam_top cv_beam_top;

/* A hypothesis, read-only: its output tokens, cumulative logprob and, with logprobs kept, each
 * position's chosen entry and step entries. */
typedef struct cv_beam_hyp {
    int32_t *tokens;
    size_t n;
    cvllm_logprob *chosen;    /* n entries, or NULL */
    cv_beam_top **tops;       /* n entries, or NULL */
    double cum;
    bool eos;                 /* finished by eos */
} cv_beam_hyp;

cv_beam_search *cv_beam_search_new(const cv_beam_config *cfg);
void cv_beam_search_free(cv_beam_search *bs);
const cv_beam_config *cv_beam_search_config(const cv_beam_search *bs);
/* The logprobs each step request asks for: 2 × width candidates a beam, as vLLM, or more where a
 * reply prints more top entries. */
int32_t cv_beam_search_step_logprobs(const cv_beam_search *bs);
/* The params of every step request (vLLM's: one token, the step's logprobs, the temperature, its
 * neutral sampling defaults). */
void cv_beam_step_params(const cvllm_engine *engine, const cv_beam_search *bs, cvllm_sampling_params *p);
/* The beams to extend next (0 when the search is over); beam i's output tokens so far. */
size_t cv_beam_search_live(const cv_beam_search *bs);
const int32_t *cv_beam_search_tokens(const cv_beam_search *bs, size_t beam, size_t *n);
/* One step: results[i] is live beam i's position logprobs (its top entries and its sampled token).
 * Candidates are each beam's first 2 × width top entries and its sampled token; an eos candidate
 * finishes its hypothesis (unless ignore_eos), the best `width` others (by cumulative logprob) are
 * the next step's beams. After max_tokens steps no beam is live. */
void cv_beam_search_step(cv_beam_search *bs, const cvllm_position_logprobs *results);
/* The best (at most width) hypotheses, finished and live, by vLLM's score: cumulative logprob over the
 * sequence length (prompt included, a last eos not) to the power length_penalty. Returns how many;
 * they stay valid until the search is freed. */
size_t cv_beam_search_best(const cv_beam_search *bs, const int32_t *prompt, const cv_beam_hyp **best);
/* A hypothesis's text as vLLM decodes it: special tokens kept, a final eos left out (cv_xmalloc'd). */
char *cv_beam_hyp_text(const cv_beam_search *bs, const cv_beam_hyp *h, const cvllm_tokenizer *tok);
/* Its positions' logprobs as an engine event carries them (deep copies), or NULL when not kept. */
cvllm_position_logprobs *cv_beam_hyp_logprobs(const cv_beam_hyp *h);
/* A step result held until the step's other beams are back: a copy of `src` with its own top
 * entries, and their release (which leaves it zeroed). */
cvllm_position_logprobs cv_beam_result_copy(const cvllm_position_logprobs *src);
void cv_beam_result_free(cvllm_position_logprobs *r);
/* tokenizer_config.json's eos_token as an id (vLLM's beam search ends a hypothesis there), or -1. */
int32_t cv_beam_eos_token_id(const cvllm_tokenizer *tok);

#endif
