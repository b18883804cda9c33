/*
 * lora.h — LoRA adapters on a model's linears (internal to src/models).
 *
 * A linear part that an adapter targets keeps the adapter's f32 A [r][in] and scaled Bᵀ [r][out]
 * (loader/lora.h) beside its weight, and after the weight's product every token that runs with that
 * adapter gets y += s·B·(A·x): the tokens of one adapter gathered, h = A·x through the GEMM kernels
 * (cv_linear on an f32 view: long rows), then r axpys of Bᵀ's rows into each token's row of y
 * (cv_lowrank_add), where a product with r-long rows would cost more per row than its work. The base product is never changed, so
 * one forward pass serves the base model and any mix of adapters, each token as its sequence asks
 * (cv_batch.lora_ids), like vLLM's punica path; and a token of the base model costs nothing more.
 *
 * The delta reads the linear's input at f32 (or its bf16 rows widened, where the op before wrote
 * only those), never the int8 codes an int8 part reads: on a W8A8 or FP8 base the adapter adds to
 * the quantized product what it adds to a float one (the SwiGLU then hands down_proj f32 rows, which
 * nn_linear_forward quantizes, instead of its codes alone). Linears whose rows are not the batch's
 * tokens (nn_binder.adapters_off) and tensor parallelism are refused.
 * An adapter module that no linear of the model took fails the load (nn_lora_check_bound), as
 * vLLM refuses target modules it does not expect.
 */
#ifndef CV_LAYERS_LORA_H
#define CV_LAYERS_LORA_H

#include "models/layers/binder.h"
#include "models/layers/linear.h"

/* The adapter of each token of the current batch. */
typedef struct nn_lora_tokens {
    int32_t *of_token; /* [cap]: 0 the base model, else 1…n_loras */
    int64_t n_tokens, cap;
    bool any;          /* some token runs with an adapter */
} nn_lora_tokens;

/* Sets up b for p's adapters (nothing when it has none). */
void nn_lora_init(nn_binder *b, const cv_model_load_params *p);
/* Attaches to l the adapters' tensors for its part j, just bound (sticky error in b->rc). */
void nn_lora_attach(nn_binder *b, nn_linear *l, int j);
/* Fails (sticky) naming the first adapter module no linear took. */
void nn_lora_check_bound(nn_binder *b);
/* Each token's adapter, from the batch's sequences (forward passes start with it; a batch larger
 * than any before gets a larger table). */
void nn_lora_set_batch(nn_binder *b, const cv_batch *batch);
/* ys[j] += s·B·(A·x) of every part j of l for the tokens of each adapter that targets it. */
void nn_lora_forward(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, float *const *ys);

#endif
