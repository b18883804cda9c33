/*
 * compat.c — the matrix API from before cv_weight (cv_matrix, cv_matmul, cv_panels, cv_embed), as
 * thin wrappers over cv_weight and cv_linear while its callers migrate: no kernel of its own, so
 * both APIs run the same code and give the same bits.
 */
#include <assert.h>

#include "base/error.h"
#include "kernels/cpu/formats.h"

bool cv_matrix_dtype_supported(cv_dtype t) {
    return t == CV_DTYPE_F32 || t == CV_DTYPE_BF16 || t == CV_DTYPE_F16;
}

void cv_matmul(cv_threadpool *pool, const cv_matrix *w, const float *x, int64_t m, float *y) {
    assert(cv_matrix_dtype_supported(w->dtype));
    const cv_weight view = cv_weight_view(w);
    const cv_act act = {.f32 = x};
    cv_linear(pool, &view, &act, m, 1, &view.rows, &y);
}

void cv_embed(const cv_matrix *table, const int32_t *ids, int64_t n, float *out) {
    assert(cv_matrix_dtype_supported(table->dtype));
    const cv_weight view = cv_weight_view(table);
    cv_embed_weight(&view, ids, n, out);
}

/* ---- bf16 panels ------------------------------------------------------------------------------ */

static cv_weight as_weight(const cv_panels *p) {
    return (cv_weight){CV_WFORMAT_BF16_PANELS, p->rows, p->cols, p->data, p->owned};
}

size_t cv_panels_bytes(int64_t rows, int64_t cols) { return cv_weight_packed_bytes(CV_WFORMAT_BF16_PANELS, rows, cols); }

int64_t cv_panels_stacked_rows(const cv_matrix *parts, int n_parts) {
    int64_t rows = 0;
    for (int j = 0; j < n_parts; j++) rows += parts[j].rows;
    return rows;
}

/* The parts as cv_weight_parts (at most 4; cv_weight_pack checks the count). */
static int to_parts(const cv_matrix *parts, int n_parts, cv_weight_part out[4]) {
    assert(n_parts >= 1 && n_parts <= 4);
    for (int j = 0; j < n_parts; j++) {
        if (parts[j].dtype != CV_DTYPE_BF16)
            return cv_fail(CVLLM_ERR_UNSUPPORTED, "only bf16 weights are packed into panels, not %s",
                           cv_dtype_name(parts[j].dtype));
        out[j] = (cv_weight_part){.dtype = parts[j].dtype, .rows = parts[j].rows, .cols = parts[j].cols,
                                  .data = parts[j].data};
    }
    return 0;
}

static void to_panels(const cv_weight *w, cv_panels *out) { *out = (cv_panels){w->data, w->rows, w->cols, w->owned}; }

int cv_panels_pack(cv_threadpool *pool, const cv_matrix *parts, int n_parts, cv_panels *out) {
    cv_weight_part wp[4];
    cv_weight w;
    int rc = to_parts(parts, n_parts, wp);
    if (!rc) rc = cv_weight_pack(pool, wp, n_parts, &w);
    if (!rc) to_panels(&w, out);
    return rc;
}

int cv_panels_pack_into(cv_threadpool *pool, const cv_matrix *parts, int n_parts, void *dst, cv_panels *out) {
    cv_weight_part wp[4];
    cv_weight w;
    int rc = to_parts(parts, n_parts, wp);
    if (!rc) rc = cv_weight_pack_into(pool, wp, n_parts, dst, &w);
    if (!rc) to_panels(&w, out);
    return rc;
}

void cv_panels_release(cv_panels *p) {
    cv_weight w = as_weight(p);
    cv_weight_release(&w);
    *p = (cv_panels){0};
}

void cv_matmul_panels(cv_threadpool *pool, const cv_panels *p, const float *x, int64_t m, float *y) {
    const cv_weight w = as_weight(p);
    const cv_act act = {.f32 = x};
    cv_linear(pool, &w, &act, m, 1, &w.rows, &y);
}

void cv_matmul_panels_parts(cv_threadpool *pool, const cv_panels *p, const float *x, int64_t m, int n_parts,
                            const int64_t *part_rows, float *const *ys) {
    const cv_weight w = as_weight(p);
    const cv_act act = {.f32 = x};
    cv_linear(pool, &w, &act, m, n_parts, part_rows, ys);
}

void cv_embed_panels(const cv_panels *p, const int32_t *ids, int64_t n, float *out) {
    const cv_weight w = as_weight(p);
    cv_embed_weight(&w, ids, n, out);
}
