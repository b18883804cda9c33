/*
 * binder.c — see binder.h. Tensor lookups, shape checks and dtype conversion are the loader's
 * (loader/weights.h); this adds the sticky error, the ownership list and the per-token byte count.
 */
#include "models/layers/binder.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

nn_binder nn_binder_for(const cv_model_load_params *p) {
    return (nn_binder){.src = p->weights, .observe = {p->observe, p->observe_ctx},
                       .tp = p->tp ? *p->tp : (cv_tp){.rank = 0, .size = 1},
                       .bf16_input = p->bf16_compute && cv_linear_bf16_input(), .pooling = p->pooling};
}

const char *nn_name(nn_binder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->name, sizeof b->name, fmt, ap);
    va_end(ap);
    return b->name;
}

void nn_bind_matrix(nn_binder *b, const char *name, int64_t rows, int64_t cols, const char *hint, cv_matrix *out) {
    if (b->rc) return;
    cv_tensor t;
    int64_t shape[2] = {rows, cols};
    b->rc = cv_weights_get(b->src, name, 2, shape, hint, &t);
    nn_check_matrix_dtype(b, name, t.dtype);
    if (b->rc) return;
    *out = (cv_matrix){t.data, t.dtype, rows, cols};
    b->matmul_bytes += t.nbytes;
}

void nn_check_matrix_dtype(nn_binder *b, const char *name, cv_dtype dtype) {
    if (b->rc || dtype == CV_DTYPE_F32 || dtype == CV_DTYPE_BF16 || dtype == CV_DTYPE_F16) return;
    b->rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "tensor %s has dtype %s; matmul weights must be F32, BF16 or F16", name,
                    cv_dtype_name(dtype));
}

void nn_bind_vector(nn_binder *b, const char *name, int64_t dim, const char *hint, const float **out) {
    if (b->rc) return;
    b->rc = cv_weights_get_f32(b->src, name, 1, &dim, hint, out);
}

void *nn_own(nn_binder *b, size_t bytes) {
    void *p = cv_aligned_alloc(bytes ? bytes : 1);
    if (!p) {
        if (!b->rc) b->rc = cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes for model tables", bytes);
        return NULL;
    }
    memset(p, 0, bytes);
    if (b->n_owned == b->cap_owned) {
        b->cap_owned = b->cap_owned ? 2 * b->cap_owned : 64;
        b->owned = cv_xrealloc(b->owned, (size_t)b->cap_owned * sizeof *b->owned);
    }
    b->owned[b->n_owned++] = p;
    return p;
}

const char *nn_own_string(nn_binder *b, const char *s) {
    const size_t n = strlen(s) + 1;
    char *copy = nn_own(b, n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

void nn_bind_gain_plus_one(nn_binder *b, const char *name, int64_t dim, const char *hint, const float **out) {
    const float *w;
    nn_bind_vector(b, name, dim, hint, &w);
    if (b->rc) return;
    float *g = nn_own(b, (size_t)dim * sizeof *g);
    if (!g) return;
    for (int64_t i = 0; i < dim; i++) g[i] = 1.0f + w[i];
    *out = g;
}

void nn_binder_free(nn_binder *b) {
    for (int i = 0; i < b->n_owned; i++) free(b->owned[i]);
    free(b->owned);
    b->owned = NULL;
    b->n_owned = b->cap_owned = 0;
}
