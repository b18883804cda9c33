/*
 * architectures.h — the loader of each architecture, for the registry (internal to src/models).
 *
 * Each model file exports exactly one function of this shape; registry.c maps config.json
 * "architectures" names to them. Adding an architecture = one model file + one line here + one
 * registry entry.
 */
#ifndef CV_ARCHITECTURES_H
#define CV_ARCHITECTURES_H

#include "models/model.h"

typedef int (*cv_model_loader)(const cv_model_load_params *p, cv_model **out);

int cv_qwen3_load(const cv_model_load_params *p, cv_model **out); /* Qwen3ForCausalLM */
int cv_qwen3_moe_load(const cv_model_load_params *p, cv_model **out); /* Qwen3MoeForCausalLM */
/* Qwen3NextForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3_5ForConditionalGeneration,
 * Qwen3_5ForCausalLM */
int cv_qwen3_hybrid_load(const cv_model_load_params *p, cv_model **out);

#endif
