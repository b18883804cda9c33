/*
 * quant_export.h — writing msModelSlim's checkpoint layout (what vllm-ascend's `--quantization
 * ascend` and cvllm load) from a float checkpoint: the tensors and quant_model_description.json.
 *
 * Every tensor of the source is classified by the recipe (quant_recipe.h). A FLOAT tensor is copied
 * byte for byte in its dtype. A quantized linear P [N][K] becomes (quantize.h for the arithmetic)
 *     W8A8_DYNAMIC  P.weight I8 [N,K], P.weight_scale F32 [N,1], P.weight_offset F32 [N,1] (zeros)
 *     W8A8          P.weight I8 [N,K], P.input_scale F32 [1], P.input_offset F32 [1],
 *                   P.deq_scale F32 [N] (I64 [N] for fp16 models, as msModelSlim writes it),
 *                   P.quant_bias I32 [N]
 * W8A8's activation range of a linear is its own, or for a routed expert that calibration never
 * reached, its group's (every expert of the layer and projection, cv_quant_recipe_expert_group).
 * The description holds one entry per stored tensor ("FLOAT" or the scheme's name), then
 * "model_quant_type" (the scheme), "version" "1.0.0", "group_size" 0 (per channel) and empty
 * "metadata" and "optional" objects (no rotation, no KV-cache quantization).
 *
 * Tensors are written in name order into quant_model_weights-0000i-of-0000n.safetensors with
 * quant_model_weights.safetensors.index.json (safetensors_write.h). Beside them go the source
 * folder's config.json (byte for byte), generation_config.json and the tokenizer and processor files
 * it has. Everything is checked before the first byte is written (shapes, dtypes, a calibration
 * range for every static linear); what can fail later is I/O, or a non-finite weight found while
 * its codes are computed.
 */
#ifndef CV_QUANT_EXPORT_H
#define CV_QUANT_EXPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "loader/quant.h"
#include "loader/quant_recipe.h"
#include "loader/quantize.h"
#include "loader/safetensors.h"

typedef struct cv_quant_export_options {
    cv_quant_recipe recipe;
    cv_linear_scheme scheme;        /* CV_SCHEME_W8A8 or CV_SCHEME_W8A8_DYNAMIC */
    bool deq_scale_i64;             /* W8A8: int64-encoded deq_scale (msModelSlim's choice for fp16 models) */
    const cv_act_ranges *ranges;    /* W8A8: input ranges by linear name (the weight's prefix) */
    uint64_t max_shard_bytes;
    cv_threadpool *pool;            /* may be NULL */
} cv_quant_export_options;

typedef struct cv_quant_export_stats {
    size_t n_tensors;               /* tensors written */
    size_t n_linears;               /* linears quantized (each expert counts) */
    size_t n_group_ranges;          /* W8A8: routed experts no calibration token reached, given their
                                     * group's range (cv_quant_recipe_expert_group) */
    int n_shards;
    uint64_t bytes;                 /* tensor bytes written */
} cv_quant_export_stats;

/* Names of the output files, for callers that check or clean up. */
#define CV_QUANT_WEIGHTS_PREFIX "quant_model_weights"
#define CV_QUANT_DESCRIPTION_FILE "quant_model_description.json"

/* Writes the checkpoint of folder src_dir (its tensors `src`) quantized by o into DIR, created
 * when absent. Errors name the tensor: an unsupported dtype or shape, a linear with a bias (Qwen3
 * linears have none; this is not handled), a static linear that calibration never reached, a recipe
 * that quantizes nothing; I/O errors name the file. */
int cv_quant_export(const char *src_dir, const cv_checkpoint *src, const cv_quant_export_options *o, const char *dir,
                    cv_quant_export_stats *stats);

#endif
