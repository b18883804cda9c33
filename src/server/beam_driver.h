/*
 * beam_driver.h — use_beam_search in the server: one search (engine/beam_search.h) a prompt, run over
 * the engine group, its outcome handed on as the prompt's one final cv_request_event — the shape every
 * other generation's last event has, so the reply is built the same way.
 */
#ifndef CVLLM_SERVER_BEAM_DRIVER_H
#define CVLLM_SERVER_BEAM_DRIVER_H

#include "engine/beam_search.h"
#include "engine/engine_group.h"
#include "engine/engine_loop.h"

/* The best hypotheses as the final event of one request: outputs[i] is choice i, its whole text,
 * finish_reason "stop" (eos, stop_token_id the eos id as vLLM's stop_reason) or "length". */
cv_request_event *cv_beam_result_event(const cv_beam_search *bs, const cvllm_tokenizer *tok, const int32_t *prompt);

typedef struct cv_beam_driver cv_beam_driver;

/* Starts the search for one prompt (its token ids, cfg->n_prompt of them; every step request keeps
 * its cache_salt and LoRA adapter); `done(user, ev)` receives its final event exactly once — the
 * result, or outputs that finished "abort" or "error" when a step request did — from an engine
 * thread. Returns NULL with *rc and cvllm_last_error() when the first step cannot be submitted
 * (done is then never called). */
cv_beam_driver *cv_beam_driver_start(cv_engine_group *group, const cvllm_tokenizer *tok, const cv_beam_config *cfg,
                                     const cvllm_prompt *prompt, double arrival, cv_event_fn done, void *user, int *rc);
/* Aborts the step in flight and submits no other; done follows with finish_reason "abort". Safe
 * from any thread until the driver is freed. */
void cv_beam_driver_abort(cv_beam_driver *d);
/* After done has returned. */
void cv_beam_driver_free(cv_beam_driver *d);

#endif
