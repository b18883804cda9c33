/*
 * weights.h — binding the tensors a model file asks for to memory, from a checkpoint or made up.
 *
 * A model file never opens files: it asks a cv_weight_source for each tensor by name with the shape
 * its config implies. The source checks the shape (a mismatch names the tensor, both shapes and the
 * config field) and returns either a view into the mmap'd checkpoint or, for --load-format dummy,
 * freshly made random values (uniform in [-1e-3, 1e-3] like vLLM's dummy loader, from a seed) so a
 * benchmark can run with nothing but config.json. Norm gains and other small vectors are requested
 * as f32 copies so kernels see one type for them. Quantized checkpoints (loader/quant.h) use the
 * same sources; their quantized linears bind through cv_weights_get_qlinear, in the checkpoint's
 * format or, for dummy weights, in the format the folder's quantization files describe.
 */
#ifndef CV_WEIGHTS_H
#define CV_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "loader/safetensors.h"

typedef struct cv_weight_source cv_weight_source;

typedef struct cv_weight_source_params {
    const char *dir;          /* the model folder: its checkpoint, and what it declares about
                               * quantization (loader/quant.h); dummy weights take only the latter
                               * from it (NULL: unquantized dummy weights) */
    const char *quantization; /* vLLM's --quantization name; NULL: as the folder says */
    bool dummy;               /* random weights instead of the checkpoint's */
    cv_dtype dtype;           /* dummy: the float tensors' dtype (bf16, f16 or f32) */
    uint64_t seed;            /* dummy */
} cv_weight_source_params;

/* A checkpoint's views, or dummy weights in its format. Errors: the quantization checks of
 * cv_quant_config_load, a missing or malformed checkpoint (naming the file). */
int cv_weight_source_create(const cv_weight_source_params *p, cv_weight_source **out);
/* Views into the checkpoint in DIR, quantized as DIR says. */
int cv_weight_source_checkpoint(const char *dir, cv_weight_source **out);
/* Unquantized random weights of dtype `dtype` (bf16, f16 or f32) from `seed`. */
int cv_weight_source_dummy(cv_dtype dtype, uint64_t seed, cv_weight_source **out);
/* Frees the source and every buffer it made; views handed out die with it. */
void cv_weight_source_free(cv_weight_source *src);

/*
 * Binds `name` with the expected shape (ndim dims). *out is valid until the source is freed.
 * Missing tensor: CVLLM_ERR_NOT_FOUND "missing tensor NAME in DIR"; wrong shape or unsupported
 * dtype: CVLLM_ERR_FORMAT naming the tensor, both shapes and `config_hint` (e.g. "hidden_size=64").
 * A tensor the folder stores quantized (an msModelSlim description's non-FLOAT entry, int8 or fp8
 * data): CVLLM_ERR_UNSUPPORTED naming it — quantized linears bind with cv_weights_get_qlinear.
 */
int cv_weights_get(cv_weight_source *src, const char *name, int ndim, const int64_t *shape,
                   const char *config_hint, cv_tensor *out);
/* As cv_weights_get, but returns 1 (and fills *out) when present, 0 when absent. */
int cv_weights_get_optional(cv_weight_source *src, const char *name, int ndim, const int64_t *shape,
                            const char *config_hint, cv_tensor *out);
/* As cv_weights_get, converted to a new f32 array owned by the source. */
int cv_weights_get_f32(cv_weight_source *src, const char *name, int ndim, const int64_t *shape,
                       const char *config_hint, const float **out);
bool cv_weight_source_is_dummy(const cv_weight_source *src);
/* The checkpoint files behind the source (none for dummy weights). */
size_t cv_weight_source_n_files(const cv_weight_source *src);
const char *cv_weight_source_file(const cv_weight_source *src, size_t i);

#endif
