/*
 * quantize.h — the arithmetic of msModelSlim's W8A8 and W8A8_DYNAMIC checkpoints, as `cvllm
 * quantize` computes them from a float model.
 *
 * Weights, both schemes: symmetric int8 per output channel (row n of a [N, K] linear weight):
 *     weight_scale[n] = max_k |W[n][k]| / 127            (f32)
 *     code[n][k]      = round(W[n][k] / weight_scale[n])  (f32 division, half to even, in −127..127)
 * so the row's largest magnitude maps to ±127 exactly. A row of zeros has scale 0 and codes 0. These
 * are msModelSlim's min-max per-channel weights; on the same bf16 weights they are the codes and
 * scales of the quantized reference checkpoints bit for bit.
 *
 * Activations, W8A8 static: one asymmetric (scale, offset) pair per linear from the minimum and
 * maximum of every input value seen during calibration, the range first widened to contain 0 (so a
 * zero input stays exactly representable and the offset is an integer code):
 *     input_scale  = (max − min) / 255                     (rounded once to f32)
 *     input_offset = round(−128 − min / input_scale)       (an integer in −128..127; −0 written as 0)
 * With the runtime's xq = clamp(round(x / input_scale + input_offset), −128, 127), min lands on −128,
 * max on 127 and 0 on input_offset. Where the f32 rounding of input_scale would leave an end half a
 * code short (a tie of the offset's rounding: symmetric ranges), input_scale is lowered by an ulp at a
 * time until both ends land exactly. A range of zero width (every input 0) gets input_scale 1 and
 * input_offset 0. The derived tensors:
 *     deq_scale[n]  = input_scale · weight_scale[n]          (f32 product)
 *     quant_bias[n] = −input_offset · Σ_k code[n][k]          (exact in int32, or an error)
 * W8A8_DYNAMIC has no activation tensors: the runtime scales each token by max|x| / 127.
 *
 * The row loops run on a thread pool (NULL: the caller's thread); results do not depend on it.
 */
#ifndef CV_QUANTIZE_H
#define CV_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/threadpool.h"

/* A row-major [rows][cols] float matrix of a checkpoint: a 2-D tensor, or one expert's block of a
 * fused 3-D one. dtype is F32, BF16 or F16. */
typedef struct cv_quant_matrix {
    const void *data;
    cv_dtype dtype;
    int64_t rows, cols;
} cv_quant_matrix;

/* The dtypes a weight may have to be quantized. */
bool cv_quant_dtype_supported(cv_dtype t);

/* scale[rows]. A non-finite weight: CVLLM_ERR_FORMAT naming its row and column. */
int cv_quant_weight_scales(cv_threadpool *pool, const cv_quant_matrix *w, float *scale);
/* codes[rows][cols] from the scales of cv_quant_weight_scales. */
void cv_quant_weight_codes(cv_threadpool *pool, const cv_quant_matrix *w, const float *scale, int8_t *codes);
/* sums[rows] = Σ_k code[n][k], without storing the codes. */
void cv_quant_weight_code_sums(cv_threadpool *pool, const cv_quant_matrix *w, const float *scale, int32_t *sums);

/* The values a linear's input took during calibration. */
typedef struct cv_act_range {
    float min, max;
    int64_t rows;       /* input rows observed; 0: none yet */
} cv_act_range;

/* Folds rows × cols values (rows ld floats apart) into r. */
void cv_act_range_update(cv_act_range *r, const float *x, int64_t rows, int64_t cols, int64_t ld);
/* input_scale and input_offset of a range that saw at least one row. A non-finite bound:
 * CVLLM_ERR_FORMAT. */
int cv_act_static_params(const cv_act_range *r, float *scale, float *offset);
/* deq_scale[n] = input_scale · weight_scale[n]. */
void cv_quant_deq_scale(float input_scale, const float *weight_scale, int64_t n, float *deq_scale);
/* msModelSlim's int64 deq_scale (fp16 models): each f32's bit pattern as an int32, sign-extended. */
void cv_quant_deq_scale_i64(const float *deq_scale, int64_t n, int64_t *out);
/* quant_bias[n] = −input_offset · sums[n]; a value outside int32: CVLLM_ERR_UNSUPPORTED naming the row. */
int cv_quant_bias(float input_offset, const int32_t *sums, int64_t n, int32_t *quant_bias);

/* Ranges by linear name (the weight's prefix, "model.layers.0.self_attn.q_proj"), filled by the
 * calibration run's observer. */
typedef struct cv_act_ranges cv_act_ranges;

cv_act_ranges *cv_act_ranges_create(void);
void cv_act_ranges_free(cv_act_ranges *r);
/* Folds one observed input into the range of `linear` (created on first sight). */
void cv_act_ranges_observe(cv_act_ranges *r, const char *linear, const float *x, int64_t rows, int64_t cols);
/* NULL when the linear was never observed. */
const cv_act_range *cv_act_ranges_find(const cv_act_ranges *r, const char *linear);

#endif
