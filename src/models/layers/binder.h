/*
 * binder.h — binding a model's tensors by name, with the shapes its config implies (internal to
 * src/models).
 *
 * Binds tensors one after another; the first failure sticks in rc and later calls do nothing, so a
 * loader reads as a list of bindings followed by one check. Everything the model derives from the
 * checkpoint at load — zero-centred gains as 1 + w, transposed conv weights, expert tables, the
 * names of its linears — is owned by the binder and freed by nn_binder_free, so a model keeps its
 * binder for its lifetime. The binder also carries the calibration observer (model.h) from the load
 * parameters to every linear it binds, and the one int8 scratch that the model's int8-input linears
 * quantize their inputs into (layers/linear.h) — and likewise the one bf16 scratch that bf16 weights
 * round their inputs into in bf16 compute: linears run one after another, so one buffer as wide as
 * the widest of them serves all.
 */
#ifndef CV_LAYERS_BINDER_H
#define CV_LAYERS_BINDER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "models/model.h"

/* The calibration observer of cv_model_load_params (fn NULL: none). */
typedef struct nn_observer {
    cv_linear_observer fn;
    void *ctx;
} nn_observer;

/* int8 rows: codes [T][cv_act_i8_stride(cols)] and a scale per row. */
typedef struct nn_qrows {
    int8_t *codes;
    float *scale;
} nn_qrows;

/* bf16 rows [T][cv_act_bf16_stride(cols)]. */
typedef struct nn_brows {
    uint16_t *rows;
} nn_brows;

/* How a linear's weight is shared over tensor-parallel ranks (model.h cv_tp): whole on every rank;
 * its rows (outputs) split, as q/k/v and gate/up are; or its columns (inputs) split, as o_proj and
 * down_proj are, whose partial outputs the block then all-reduces. */
typedef enum nn_split { NN_WHOLE, NN_SPLIT_ROWS, NN_SPLIT_COLS } nn_split;

typedef struct nn_binder {
    cv_weight_source *src;
    cv_tp tp;                 /* {0, 1}: no tensor parallelism */
    nn_observer observe;
    nn_qrows *act_rows;       /* the int8 scratch of the linears bound so far (NULL: none reads int8) */
    int64_t act_cols;         /* the widest input of those linears */
    bool bf16_input;          /* weights whose format can read bf16 rows do (cv_wformat_bf16_input): bf16
                               * compute on a CPU with a bf16 dot kernel */
    nn_brows *bf16_rows;      /* the bf16 scratch of the linears bound so far (NULL: none reads bf16) */
    int64_t bf16_cols;        /* the widest input of those linears */
    size_t matmul_bytes;      /* weight bytes streamed per token */
    cv_lora_sites *lora_sites; /* LoRA on (layers/lora.h): the parts adapters may target; NULL: off */
    struct nn_lora_tokens *lora_tokens; /* the batch's adapter of each token (NULL: LoRA off) */
    bool pooling;             /* cv_model_load_params.pooling: no lm_head of its own */
    bool adapters_off;        /* set while binding linears whose rows are not the batch's tokens (routed
                               * experts, the lm_head, MTP): an adapter for one of them is refused */
    int rc;
    char name[256];
    void **owned;
    int n_owned, cap_owned;
} nn_binder;

/* A binder over p's weights and observer. */
nn_binder nn_binder_for(const cv_model_load_params *p);
/* Formats a tensor name into b->name (valid until the next call). */
const char *nn_name(nn_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A 2-D matmul weight (f32, bf16 or f16) as a view of the checkpoint, counted in matmul_bytes. */
void nn_bind_matrix(nn_binder *b, const char *name, int64_t rows, int64_t cols, const char *hint, cv_matrix *out);
/* Fails (sticky) unless a float matmul weight `name` has a dtype the kernels read row-major. */
void nn_check_matrix_dtype(nn_binder *b, const char *name, cv_dtype dtype);
/* A 1-D tensor as f32. */
void nn_bind_vector(nn_binder *b, const char *name, int64_t dim, const char *hint, const float **out);
/* A zero-centred RMSNorm gain (stored w, effective 1 + w) as f32 1 + w. */
void nn_bind_gain_plus_one(nn_binder *b, const char *name, int64_t dim, const char *hint, const float **out);
/* An owned, zeroed, 64-byte aligned block of `bytes` (NULL after a failure, which sets rc). */
void *nn_own(nn_binder *b, size_t bytes);
/* An owned copy of s. */
const char *nn_own_string(nn_binder *b, const char *s);
void nn_binder_free(nn_binder *b);

#endif
