/*
 * calibrate.h — the calibration run of `cvllm quantize --scheme w8a8`: the float model prefills
 * each prompt while the models' linear observer (models/model.h) folds every linear's input into
 * its min-max range (loader/quantize.h), keyed by the linear's weight prefix; a routed expert's
 * inputs also go into its group's range (cv_quant_recipe_expert_group), for the experts that no
 * calibration token reaches.
 *
 * Each prompt is one sequence, tokenized with the model's tokenizer as plain text (no chat
 * template, no special tokens added), prefilled in chunks of at most CV_CALIB_CHUNK tokens into a
 * KV cache of its own; only the first CV_CALIB_MAX_TOKENS tokens of a prompt are used. Logits are
 * computed for one row per chunk (the model needs at least one) and dropped.
 */
#ifndef CV_CLI_CALIBRATE_H
#define CV_CLI_CALIBRATE_H

#include <stddef.h>

#include "base/threadpool.h"
#include "loader/config.h"
#include "loader/quantize.h"

#define CV_CALIB_CHUNK 512
#define CV_CALIB_MAX_TOKENS 4096

/* The prompts calibration uses when none are given: a few paragraphs of varied text (prose, code,
 * arithmetic, Chinese), NULL-terminated. */
extern const char *const cv_calib_default_prompts[];

/* Runs the model of folder `dir` (config cfg, loaded by the caller) over the prompts, observing into
 * `ranges`. Errors: a missing tokenizer.json names the file; a token id outside the model's
 * vocabulary names the prompt; model load and forward errors are passed on. */
int cv_calibrate(const char *dir, const cv_model_config *cfg, const char *const *prompts, size_t n_prompts,
                 cv_threadpool *pool, cv_act_ranges *ranges);

#endif
