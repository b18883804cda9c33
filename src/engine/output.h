/*
 * output.h — what a sequence shows of itself: stop conditions, the visible text, and the outputs a
 * step publishes.
 *
 * The engine step samples a token and hands it here: the token's stop conditions (vLLM's order:
 * stop tokens once min_tokens are out, then the length limits), the detokenized text with stop
 * strings cut out of it, and the part of the text a reader may see while a stop string could still
 * be forming. At the end of the step every changed request is published, in arrival order, as the
 * cvllm_request_output its caller reads until the next step; finished requests are retired then.
 */
#ifndef CV_ENGINE_OUTPUT_H
#define CV_ENGINE_OUTPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

/* The finish reason a new token gives the sequence (CVLLM_FINISH_NONE: it goes on); *stop_token is
 * the token when a request's stop_token_ids ended it, else -1. */
cvllm_finish_reason cv_output_stop_token(const cv_seq *seq, int32_t token, int32_t *stop_token);
/* Detokenizes the token onto the text (flushing when finished) and cuts the text at a stop string
 * the token completed, which finishes the sequence with that string. */
void cv_output_append_text(cv_seq *seq, int32_t token, bool finished);
/* Moves the visible end of the text forward, holding back what a stop string could still claim. */
void cv_output_update_visible(cv_seq *seq, bool finished);

/* Publishes every changed request in arrival order and retires the finished ones. */
void cv_output_collect(cvllm_engine *e);
/* Puts back the bytes the published text views hid (before the text grows again). */
void cv_output_restore_views(cvllm_engine *e);

#endif
