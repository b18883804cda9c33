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

/* How an architecture is built, for arithmetic that needs the block structure without loading
 * (footprint.c). The hybrid (Gated DeltaNet) families come last: `fam >= CV_FAMILY_NEXT` = hybrid. */
typedef enum cv_model_family {
    CV_FAMILY_DENSE,        /* Qwen3: attention + SwiGLU */
    CV_FAMILY_MOE,          /* Qwen3-MoE: attention + routed experts */
    CV_FAMILY_NEXT,         /* Qwen3-Next: GDN + gated attention, MoE with shared expert, grouped in_proj */
    CV_FAMILY_QWEN3_5_MOE,  /* Qwen3.5/3.6-MoE: the same with contiguous in_proj */
    CV_FAMILY_QWEN3_5_DENSE /* Qwen3.5/3.6 dense: the hybrid stack with a SwiGLU MLP */
} cv_model_family;

/* The family of a config.json "architectures" name; false when the registry does not know it. */
bool cv_model_family_of(const char *architecture, cv_model_family *out);

int cv_qwen3_load(const cv_model_load_params *p, cv_model **out); /* Qwen3ForCausalLM */
int cv_qwen3_moe_load(const cv_model_load_params *p, cv_model **out); /* Qwen3MoeForCausalLM */
/* Qwen3NextForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3_5ForConditionalGeneration,
 * Qwen3_5ForCausalLM */
int cv_qwen3_hybrid_load(const cv_model_load_params *p, cv_model **out);

#endif
