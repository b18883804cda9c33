/*
 * footprint.h — what a model will occupy, from config.json alone, before anything is allocated.
 *
 * The engine refuses a model that cannot fit its memory budget before it spends time filling
 * memory with weights (engine/kv_cache.c); this is the arithmetic it needs, kept with the model
 * files so that the engine never knows which architecture it runs. Parameters are counted per
 * architecture family the way the model files bind them (dense Qwen3; Qwen3-MoE; the hybrid
 * Gated-DeltaNet models Qwen3-Next and Qwen3.5/3.6, dense or MoE, with their MTP module when it is
 * loaded), so MoE counts every expert, not only the ones a token reads; a quantized checkpoint's
 * linears count in their scheme. test_footprint checks the counts against the reference
 * checkpoints' tensor bytes and the KV and state sizes against the loaded models.
 */
#ifndef CV_FOOTPRINT_H
#define CV_FOOTPRINT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "loader/config.h"
#include "loader/quant.h"

typedef struct cv_footprint {
    uint64_t weight_bytes;        /* every parameter the model loads, at the weight dtype; a quantized
                                   * linear at 1 byte per weight plus its scales */
    uint64_t activation_bytes;    /* forward scratch for max_num_batched_tokens tokens, plus the logits */
    uint64_t kv_bytes_per_token;  /* K and V of every attention layer, at the KV cache dtype */
    uint64_t state_bytes_per_seq; /* recurrent state of the linear-attention layers; 0 without */
} cv_footprint;

typedef struct cv_footprint_params {
    cv_dtype weight_dtype;        /* of the float tensors */
    cv_dtype kv_dtype;            /* of the KV cache: CV_DTYPE_F32 (0) or CV_DTYPE_BF16 */
    const cv_quant_config *quant; /* the checkpoint's quantization; NULL: none */
    bool with_mtp;                /* the MTP module is loaded (MTP speculative decoding) */
    int32_t max_num_batched_tokens;
    int32_t max_num_seqs;         /* rows of logits one step may produce */
} cv_footprint_params;

/* False for an architecture this file does not know (the model registry then names the problem). */
bool cv_model_footprint(const cv_model_config *cfg, const cv_footprint_params *p, cv_footprint *out);

#endif
