/*
 * quant.h — quantized checkpoints: which scheme each linear layer uses, and its tensors, checked.
 *
 * Two families of quantized checkpoints load, each declared by the model folder itself:
 *
 *   ascend  msModelSlim's export for Ascend (vLLM's `--quantization ascend`, also detected, with a
 *           log line, when the folder holds quant_model_description*.json). That flat JSON file
 *           names each stored tensor's scheme — "FLOAT", "W8A8" (static) or "W8A8_DYNAMIC" — and
 *           nothing is assumed about which layers a recipe quantized: a linear's scheme is the
 *           entry of "<prefix>.weight". Weights are quant_model_weights*.safetensors (or the older
 *           quant_model_weight_w8a8.safetensors).
 *   fp8     Qwen's *-FP8 checkpoints: config.json's quantization_config {quant_method "fp8", fmt
 *           "e4m3", weight_block_size [B, B]}; every linear is F8_E4M3 with a weight_scale_inv per
 *           B×B block, except the modules_to_not_convert, which stay FLOAT. `--quantization fp8`
 *           may name it; without it the config alone selects it, as in vLLM.
 *
 * What cvllm does not run is refused when the folder is opened, in one line naming the file, the
 * tensor and the scheme — never loaded into silently wrong numbers: W4A8, W8A16 and other schemes,
 * per-group weights (group_size), QuaRot rotations, a quantized KV cache or attention (kv_cache_type,
 * fa_quant_type), FP8 without blocks, other methods (awq, gptq, ...), a --quantization that the
 * folder does not declare (fp8 on an msModelSlim export; ascend without its description is vLLM's
 * "Cannot find the config file for ascend"; fp8 on an unquantized checkpoint, which vLLM would
 * quantize online and cvllm does not).
 *
 * A linear's tensors (cv_weights_get_qlinear) come checked: codes of the scheme's dtype and shape,
 * every scale present with its shape, scales widened to f32 exactly as stored (F32, F16 or BF16; never
 * rounded to bf16 as vllm-ascend does), weight offsets all zero (msModelSlim's weights are symmetric).
 * deq_scale may be stored as int64 holding the fp32 bits (msModelSlim writes it so for float16
 * models): accepted when config.json's dtype is float16, refused for any other model, whose exporter
 * writes F32. --load-format dummy with a quantized folder makes random tensors in the same format.
 */
#ifndef CV_QUANT_H
#define CV_QUANT_H

#include <stdint.h>

#include "loader/weights.h"

typedef enum cv_quant_method { CV_QUANT_NONE = 0, CV_QUANT_ASCEND, CV_QUANT_FP8 } cv_quant_method;

typedef enum cv_linear_scheme {
    CV_SCHEME_FLOAT = 0,     /* the checkpoint's float weight (bf16, f16 or f32) */
    CV_SCHEME_W8A8,          /* int8 per-row weights, static per-tensor asymmetric int8 activations */
    CV_SCHEME_W8A8_DYNAMIC,  /* int8 per-row weights, per-token symmetric int8 activations */
    CV_SCHEME_FP8_BLOCK      /* e4m3 weights with a scale per block×block tile; f32 activations */
} cv_linear_scheme;

const char *cv_linear_scheme_name(cv_linear_scheme s); /* "FLOAT", "W8A8", "W8A8_DYNAMIC", "FP8_BLOCK" */

/* ---- what a model folder declares ----------------------------------------------------------------- */

typedef struct cv_quant_config cv_quant_config;

/* Reads what DIR declares (quant_model_description*.json, config.json's quantization_config) and
 * checks it against `quantization`, vLLM's --quantization name (NULL: as the folder says). *out is
 * NULL for an unquantized folder. Every refusal above is one line; a detected msModelSlim folder
 * is logged. */
int cv_quant_config_load(const char *dir, const char *quantization, cv_quant_config **out);
void cv_quant_config_free(cv_quant_config *q);
cv_quant_method cv_quant_config_method(const cv_quant_config *q); /* NONE for NULL */
/* The scheme of the linear whose weight is "<prefix>.weight": ascend, the description's entry
 * (none: CVLLM_ERR_FORMAT naming the tensor and the file); fp8, FLOAT for modules_to_not_convert
 * (an entry names the module or a module above it) and FP8_BLOCK otherwise; FLOAT unquantized. */
int cv_quant_config_scheme(const cv_quant_config *q, const char *prefix, cv_linear_scheme *out);
/* The description's type of `tensor` ("FLOAT", "W8A8", ...), NULL when it has no entry or the
 * folder is not an msModelSlim export. */
const char *cv_quant_config_tensor_type(const cv_quant_config *q, const char *tensor);
int32_t cv_quant_config_block(const cv_quant_config *q); /* fp8's block edge; 0 otherwise */
/* The file that declares the quantization (the description, or config.json), for messages. */
const char *cv_quant_config_origin(const cv_quant_config *q);
/* Whether an int64 deq_scale is valid: config.json's dtype is float16. */
bool cv_quant_config_int64_deq_scale(const cv_quant_config *q);
/* Bytes a [rows][cols] linear of a quantized scheme takes loaded: 1 per weight, plus its scales,
 * offsets and biases as the checkpoint stores them with every scale at f32 (W8A8: deq_scale,
 * quant_bias, input_scale, input_offset; W8A8_DYNAMIC: weight_scale, weight_offset; FP8: one f32
 * per block). FLOAT: 0 (its bytes depend on the float dtype). */
uint64_t cv_linear_scheme_bytes(cv_linear_scheme s, int64_t rows, int64_t cols, int32_t block);

/* ---- a weight source's quantized linears -------------------------------------------------------- */

/* The folder's quantization, as the source was created with it (NULL / NONE: unquantized). */
const cv_quant_config *cv_weight_source_quant(const cv_weight_source *src);
cv_quant_method cv_weight_source_quant_method(const cv_weight_source *src);

/* The scheme of the linear whose weight is "<prefix>.weight" (cv_quant_config_scheme). Schemes
 * cvllm does not run never get here: the source refused them, naming the tensor and the scheme
 * (CVLLM_ERR_UNSUPPORTED), when it was created. */
int cv_weights_linear_scheme(cv_weight_source *src, const char *prefix, cv_linear_scheme *out);

/* A linear layer's weight in its checkpoint format, every pointer valid until the source is freed. */
typedef struct cv_qlinear {
    cv_linear_scheme scheme;
    cv_tensor weight;          /* [rows][cols]: FLOAT bf16/f16/f32, W8A8* I8, FP8_BLOCK F8_E4M3 */
    const float *row_scale;    /* [rows] W8A8: deq_scale (= input_scale · weight scale); W8A8_DYNAMIC:
                                * weight_scale; else NULL */
    const int32_t *row_bias;   /* [rows] W8A8: quant_bias, in accumulator units; else NULL */
    float input_scale, input_offset; /* W8A8: x_q = clamp(round(x / input_scale + input_offset)) */
    const float *block_scale;  /* FP8_BLOCK: [ceil(rows/block)][ceil(cols/block)] weight_scale_inv */
    int32_t block;             /* FP8_BLOCK: the block edge; else 0 */
} cv_qlinear;

/* Binds the linear "<prefix>" of shape [rows][cols] in its scheme (FLOAT too: then only `weight`).
 * Missing tensor: CVLLM_ERR_NOT_FOUND naming it; a wrong dtype or shape, a non-finite scale, a
 * non-zero weight_offset, an int64 deq_scale of a non-float16 model: CVLLM_ERR_FORMAT naming the
 * tensor (shapes with config_hint, as cv_weights_get). Dummy sources make the tensors. */
int cv_weights_get_qlinear(cv_weight_source *src, const char *prefix, int64_t rows, int64_t cols,
                           const char *config_hint, cv_qlinear *out);

#endif
