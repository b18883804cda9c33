/*
 * lora.h — LoRA adapters on a model's linears (internal to src/models).
 *
 * A model loaded with LoRA on (cv_model_load_params.lora) lists, as it binds, every linear part an
 * adapter may target — its sites, numbered in binding order, each with its name and shape — and
 * the parts none may (nn_binder.adapters_off: routed experts, the lm_head, MTP), by name only, for
 * the refusal. Adapters come later, at any time and from any thread: cv_model_lora_bind lays an
 * adapter's modules out over the sites (cv_lora_binding: a module or NULL per site), checking every
 * module against its linear first, and the model itself never changes. So adapters can be loaded and
 * unloaded while the model runs (vLLM's /v1/load_lora_adapter), and a binding made on one model
 * serves every model loaded from the same config and parameters (data-parallel replicas), whose
 * sites are numbered alike.
 *
 * Each sequence of a batch names the binding it runs with (cv_batch.loras). After a part's base
 * product, every token of an adapter that targets the part gets y += s·B·(A·x): the tokens of one
 * adapter gathered, h = A·x through the GEMM kernels (cv_linear on an f32 view: long rows), then r
 * axpys of Bᵀ's rows into each token's row of y (cv_lowrank_add), where a product with r-long rows
 * would cost more per row than its work. The base product is never changed, so one forward pass
 * serves the base model and any mix of adapters, like vLLM's punica path; and a token of the base
 * model costs nothing more.
 *
 * The delta reads the linear's input at f32 (or its bf16 rows widened, where the op before wrote
 * only those), never the int8 codes an int8 part reads: on a W8A8 or FP8 base the adapter adds to
 * the quantized product what it adds to a float one (the SwiGLU then hands down_proj f32 rows,
 * which nn_linear_forward quantizes, instead of its codes alone: nn_lora_active). Tensor
 * parallelism is refused.
 */
#ifndef CV_LAYERS_LORA_H
#define CV_LAYERS_LORA_H

#include "models/layers/binder.h"
#include "models/layers/linear.h"

typedef struct cv_lora_site {
    const char *name;      /* the part's weight prefix (binder-owned) */
    int64_t in, out;       /* its weight's columns and rows */
    bool off;              /* no adapter may target it (not a site of cv_lora_binding) */
} cv_lora_site;

struct cv_lora_sites {
    cv_lora_site *site;    /* [n]: sites and the parts that are off, in binding order */
    int32_t n, cap;
    int32_t n_on;          /* sites an adapter may target: cv_lora_binding.module has one entry each */
};

struct cv_lora_binding {
    const cv_lora_adapter *adapter; /* borrowed: outlives the binding */
    int32_t n_sites;
    const cv_lora_module **module;  /* [n_sites]: the adapter's module at each site, or NULL */
};

/* The deltas' scratch, grown as batches need and kept: a forward pass allocates nothing. */
typedef struct nn_lora_work {
    int64_t *rows;         /* the tokens of one adapter */
    float *xa, *mid;       /* their input rows at f32; A·x */
    size_t cap_rows, cap_xa, cap_mid;
} nn_lora_work;

/* The adapter of each token of the current batch. */
typedef struct nn_lora_tokens {
    int32_t *of_token;     /* [cap]: 0 the base model, else k: the batch's adapter used[k - 1] */
    const cv_lora_binding **used; /* [cap]: the distinct adapters of the batch */
    int64_t n_tokens, cap;
    int32_t n_used;
    nn_lora_work *work;
} nn_lora_tokens;

/* Turns LoRA on in b when p asks for it (nothing otherwise). */
void nn_lora_init(nn_binder *b, const cv_model_load_params *p);
/* Lists part j of l, just bound, as a site (or as off, under b->adapters_off). */
void nn_lora_site(nn_binder *b, nn_linear *l, int j);
/* Each token's adapter, from the batch's sequences (forward passes start with it; a batch larger
 * than any before gets a larger table). */
void nn_lora_set_batch(nn_binder *b, const cv_batch *batch);
/* Whether some token of the current batch runs an adapter that targets l. */
bool nn_lora_active(const nn_linear *l);
/* ys[j] += s·B·(A·x) of every part j of l for the tokens of each adapter that targets it. */
void nn_lora_forward(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, float *const *ys);
/* Frees the site list and the scratch (the binder owns the rest). */
void nn_lora_release(nn_binder *b);

#endif
