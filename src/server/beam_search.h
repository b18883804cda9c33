/*
 * beam_search.h — `use_beam_search` as vLLM's server runs it: over the engine, one single-token
 * request a beam a step (see beam_search.c).
 *
 * Two layers. cv_beam_search is the search alone — beams, candidates, finished hypotheses and the
 * final ranking — fed one step's logprobs at a time, with no engine or thread in it (tested on its
 * own). cv_beam_driver runs a search for one prompt on the engine group: it submits each step's
 * requests, folds their results in, and hands the outcome to the caller's callback as one final
 * cv_request_event, the shape every other generation's last event has.
 */
#ifndef CVLLM_SERVER_BEAM_SEARCH_H
#define CVLLM_SERVER_BEAM_SEARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "engine/engine_group.h"
#include "engine/engine_loop.h"

/* vLLM's BeamSearchParams, plus what the search needs of the prompt and tokenizer. */
typedef struct cv_beam_config {
    int32_t width;            /* the request's n */
    int32_t max_tokens;       /* steps at most */
    bool ignore_eos;
    bool include_stop_str_in_output; /* an eos-finished beam keeps the eos id in its token_ids */
    float length_penalty;
    float temperature;        /* of the step requests: decides their sampled token */
    int32_t eos_token_id;     /* the tokenizer's eos_token; -1: none */
    int32_t top_logprobs;     /* entries a position keeps for the reply; -1: no logprobs asked */
    size_t n_prompt;          /* prompt length: the score's sequence length counts it */
} cv_beam_config;

typedef struct cv_beam_search cv_beam_search;

cv_beam_search *cv_beam_search_new(const cv_beam_config *cfg);
void cv_beam_search_free(cv_beam_search *bs);
/* The logprobs each step request asks for: 2 × width candidates a beam, as vLLM, or more where the
 * reply prints more top entries. */
int32_t cv_beam_search_step_logprobs(const cv_beam_search *bs);
/* The beams to extend next (0 when the search is over); beam i's output tokens so far. */
size_t cv_beam_search_live(const cv_beam_search *bs);
const int32_t *cv_beam_search_tokens(const cv_beam_search *bs, size_t beam, size_t *n);
/* One step: results[i] is live beam i's position logprobs (its top entries and its sampled token).
 * Candidates are each beam's first 2 × width top entries and its sampled token; an eos candidate
 * finishes its hypothesis (unless ignore_eos), the best `width` others (by cumulative logprob) are
 * the next step's beams. After max_tokens steps no beam is live. */
void cv_beam_search_step(cv_beam_search *bs, const cvllm_position_logprobs *results);
/* The best `width` hypotheses, finished and live, by vLLM's score (cumulative logprob over the
 * sequence length, prompt included, to the power length_penalty), as the final event of one
 * request: outputs[i] is choice i, its whole text decoded with special tokens kept (a final eos
 * left out), finish_reason "stop" (eos) or "length". prompt ids are copied into it. */
cv_request_event *cv_beam_search_result(const cv_beam_search *bs, const cvllm_tokenizer *tok, const int32_t *prompt);

typedef struct cv_beam_driver cv_beam_driver;

/* Starts the search for one prompt; `done(user, ev)` receives its final event exactly once — the
 * result, or outputs that finished "abort" or "error" when a step request did — from an engine
 * thread. Returns NULL with *rc and cvllm_last_error() when the first step cannot be submitted
 * (done is then never called). */
cv_beam_driver *cv_beam_driver_start(cv_engine_group *group, const cvllm_tokenizer *tok, const cv_beam_config *cfg,
                                     const int32_t *prompt, const char *cache_salt, double arrival, cv_event_fn done,
                                     void *user, int *rc);
/* Aborts the step in flight and submits no other; done follows with finish_reason "abort". Safe
 * from any thread, also after done. */
void cv_beam_driver_abort(cv_beam_driver *d);
/* After done has returned. */
void cv_beam_driver_free(cv_beam_driver *d);

#endif
