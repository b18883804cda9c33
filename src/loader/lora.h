/*
 * lora.h — LoRA adapters in PEFT's layout, read for serving beside the base model (vLLM's
 * --enable-lora --lora-modules).
 *
 * A PEFT adapter folder holds adapter_config.json (peft_type LORA, r, lora_alpha, use_rslora,
 * target_modules, ...) and adapter_model.safetensors, whose tensors are named
 * "base_model.model.<module>.lora_A.weight" [r][in] and "...lora_B.weight" [out][r] for each linear
 * <module> of the base model it adapts ("model.layers.0.self_attn.q_proj"). The adapted linear
 * computes y = W·x + s·B·(A·x), s = lora_alpha / r (lora_alpha / √r with use_rslora), as vLLM's
 * PEFTHelper scales it.
 *
 * The adapter is read whole into f32 copies (a rank-16 adapter of a 0.6B model is ~40 MB), B
 * already multiplied by s and transposed, so the model's layers (models/layers/lora.h) add s·B·(A·x)
 * as `rank` axpys of its rows (kernels.h cv_lowrank_add). What
 * vLLM serves and this does not — DoRA, a LoRA bias, modules_to_save, embedding LoRA, per-module
 * rank or alpha patterns, fan_in_fan_out, pickled adapter_model.bin — is refused in one line naming
 * the key or the tensor, never run as something else. Which modules the base model can adapt is
 * the model's to say, when it binds (an adapter module it has no linear for fails the load there).
 */
#ifndef CV_LOADER_LORA_H
#define CV_LOADER_LORA_H

#include <stddef.h>
#include <stdint.h>

/* vLLM's default --max-lora-rank; and the most adapters one engine serves (its metrics keep a state
 * byte for each). */
enum { CV_LORA_DEFAULT_MAX_RANK = 16, CV_MAX_LORA_MODULES = 256 };
/* 0 when r is one of vLLM's --max-lora-rank choices, else CVLLM_ERR_INVALID_ARGUMENT listing them. */
int cv_lora_check_max_rank(int32_t r);

typedef struct cv_lora_module {
    char *name;        /* the base model's linear: "model.layers.0.self_attn.q_proj" */
    int64_t rank, in, out; /* A is [rank][in], B [out][rank] */
    float *a;          /* [rank][in] */
    float *bt;         /* [rank][out]: Bᵀ multiplied by the adapter's scaling */
} cv_lora_module;

typedef struct cv_lora_adapter {
    char *name;        /* what requests call it (their "model") */
    char *path;        /* as given: the folder, or the hub id it was read from */
    int32_t rank;
    float scaling;
    size_t n_modules;
    cv_lora_module *modules; /* sorted by name */
} cv_lora_adapter;

/* Reads the PEFT adapter at `path` as `name`: a folder, else a hub id ORG/NAME, from the Hugging Face
 * cache or downloaded into it (loader/hub.h), as vLLM resolves --lora-modules paths. Errors (one
 * line naming the folder and what is wrong): CVLLM_ERR_NOT_FOUND for a missing folder, config or
 * weights file (CVLLM_ERR_NETWORK when a hub id cannot be fetched); CVLLM_ERR_FORMAT for a
 * malformed config, an unpaired lora_A/lora_B, or shapes that disagree with r; CVLLM_ERR_INVALID_ARGUMENT
 * for r above max_rank (vLLM's message); CVLLM_ERR_UNSUPPORTED for the features above. */
int cv_lora_adapter_load(const char *name, const char *path, int32_t max_rank, cv_lora_adapter **out);
/* The adapter's module `name`, or NULL. */
const cv_lora_module *cv_lora_adapter_find(const cv_lora_adapter *a, const char *name);
void cv_lora_adapter_free(cv_lora_adapter *a);

#endif
