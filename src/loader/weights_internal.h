/*
 * weights_internal.h — what the weight source's two files share (weights.c: sources, float tensors
 * and dummy values; qlinear.c: quantized linears). Internal to src/loader.
 */
#ifndef CV_WEIGHTS_INTERNAL_H
#define CV_WEIGHTS_INTERNAL_H

#include "loader/quant.h"
#include "loader/weights.h"

typedef struct cv_owned_buffer {
    struct cv_owned_buffer *next;
    char *name;   /* owned copy for the cv_tensor handed out */
    void *data;
} cv_owned_buffer;

struct cv_weight_source {
    cv_checkpoint *ck;        /* NULL for dummy */
    char *dir;                /* for messages */
    bool dummy;
    cv_dtype dtype;           /* dummy float tensors' dtype */
    uint64_t seed;
    cv_quant_config *quant;   /* NULL: unquantized */
    bool bare;                /* the checkpoint holds the inner *Model: names lack "model." */
    cv_owned_buffer *owned;
    size_t dummy_bytes;       /* made so far, checked against the memory the machine has */
};

/* Registers a malloc'd buffer with the source (freed with it); returns the owned copy of `name`. */
const char *cv_weights_own(cv_weight_source *src, const char *name, void *data);

/* The checkpoint's tensor the model calls `name` (without its "model." in a checkpoint of the inner
 * model), or NULL. */
const cv_tensor *cv_weights_stored(const cv_weight_source *src, const char *name);

/* Checkpoint tensor `name` of any dtype, copied when misaligned for its dtype: 1 found, 0 absent,
 * < 0 error. */
int cv_weights_find(cv_weight_source *src, const char *name, cv_tensor *out);

/* CVLLM_ERR_FORMAT: tensor `name` has t's shape where config.json implies `shape` (hint names the
 * config fields). */
int cv_weights_shape_mismatch(const cv_weight_source *src, const char *name, const cv_tensor *t, int ndim,
                              const int64_t *shape, const char *hint);

/* A dummy tensor `name` made now (owned by the source): F32/BF16/F16 uniform in [-1e-3, 1e-3], I8
 * codes uniform in [-127, 127], F8_E4M3 uniform over the finite codes; the values depend only on
 * the seed and the name. Refused with CVLLM_ERR_NO_MEMORY past the memory the machine has. */
int cv_weights_make_dummy(cv_weight_source *src, const char *name, cv_dtype dtype, int ndim, const int64_t *shape,
                          cv_tensor *out);

#endif
