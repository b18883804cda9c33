/*
 * request_log.h — vLLM's request log (--enable-log-requests, --enable-log-outputs, --max-log-len), in
 * vLLM's words (vllm/entrypoints/logger.py) and with Python's reprs, so the lines read as vLLM's:
 *
 *   Received request cmpl-…-0: params: SamplingParams(n=1, presence_penalty=0.0, …), lora_request: None.
 *   Generated response cmpl-…-0: output: 'Paris.', output_token_ids: [12095, 13], finish_reason: stop
 *
 * The params are the engine's for that prompt, printed as vLLM's SamplingParams.__repr__ prints its
 * fields; --max-log-len cuts the output text (in characters) and the id list.
 */
#ifndef CV_SERVER_REQUEST_LOG_H
#define CV_SERVER_REQUEST_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"

/* vLLM's SamplingParams repr of p (malloc'd). truncate: -2 when not given; constraint NULL: none. */
char *cv_sampling_params_repr(const cvllm_sampling_params *p, int64_t truncate, const cvllm_constraint *constraint);
/* "Received request ID: params: …, lora_request: …." (lora: the adapter's name, NULL: None). */
void cv_log_request_received(const char *id, const char *params_repr, const char *lora);
/* "Generated response ID: output: …, output_token_ids: […], finish_reason: …"; max_log_len < 0: whole. */
void cv_log_response_generated(const char *id, const char *text, size_t len, const int32_t *ids, size_t n_ids,
                               const char *finish_reason, int64_t max_log_len);

#endif
