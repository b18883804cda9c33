/*
 * linear.c — see linear.h. The originals of packed weights are dropped from memory once packed
 * (madvise DONTNEED), so resident weights stay ~1× their size; a hit in the packed-weight cache
 * never touches them at all.
 */
#include "models/layers/linear.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t for streaming */
#include <xxhash.h>

#include "base/error.h"

static void add_part(nn_binder *b, nn_linear *l, const char *name, const cv_matrix *w) {
    assert(l->n_parts < NN_MAX_PARTS);
    l->parts[l->n_parts++] = (nn_linear_part){nn_own_string(b, name), *w};
    l->observe = b->observe;
}

void nn_bind_linear(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint) {
    if (b->rc) return;
    char tensor[300];
    snprintf(tensor, sizeof tensor, "%s.weight", name);
    cv_matrix w;
    nn_bind_matrix(b, tensor, rows, cols, hint, &w);
    if (!b->rc) add_part(b, l, name, &w);
}

void nn_linear_add_view(nn_binder *b, nn_linear *l, const char *name, const cv_matrix *w) {
    if (!b->rc) add_part(b, l, name, w);
}

void nn_linear_forward(cv_threadpool *pool, const nn_linear *l, const float *x, int64_t T, float *const *ys) {
    if (l->observe.fn)
        for (int j = 0; j < l->n_parts; j++) l->observe.fn(l->observe.ctx, l->parts[j].name, x, T, l->parts[j].w.cols);
    if (l->packed.data) {
        int64_t rows[NN_MAX_PARTS];
        for (int j = 0; j < l->n_parts; j++) rows[j] = l->parts[j].w.rows;
        cv_matmul_panels_parts(pool, &l->packed, x, T, l->n_parts, rows, ys);
        return;
    }
    for (int j = 0; j < l->n_parts; j++) cv_matmul(pool, &l->parts[j].w, x, T, ys[j]);
}

static bool packable(const nn_linear *l) {
    for (int j = 0; j < l->n_parts; j++)
        if (l->parts[j].w.dtype != CV_DTYPE_BF16 || (j < l->n_parts - 1 && l->parts[j].w.rows % CV_PANEL_ROWS))
            return false;
    return l->n_parts > 0;
}

static void part_matrices(const nn_linear *l, cv_matrix *out) {
    for (int j = 0; j < l->n_parts; j++) out[j] = l->parts[j].w;
}

/* Returns the whole pages inside [p, p + n) to the kernel: a file mapping re-reads them if ever
 * touched again, anonymous memory (dummy weights) reads back zeros, so only for weights never read
 * again. */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = ((uintptr_t)p + page - 1) / page * page, end = ((uintptr_t)p + n) / page * page;
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
}

/* What the cache key must cover besides the checkpoint files: the packing and every packed shape. */
static uint64_t pack_layout_hash(const char *layout, nn_linear *const *lins, int n) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, layout, strlen(layout) + 1);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < lins[i]->n_parts; j++) {
            const int64_t shape[3] = {j, lins[i]->parts[j].w.rows, lins[i]->parts[j].w.cols};
            XXH3_64bits_update(&st, shape, sizeof shape);
        }
    return XXH3_64bits_digest(&st);
}

static int64_t stacked_rows(const nn_linear *l) {
    cv_matrix m[NN_MAX_PARTS];
    part_matrices(l, m);
    return cv_panels_stacked_rows(m, l->n_parts);
}

/* The packed-weight cache entry for lins[0..n) (NULL for dummy weights or when unavailable). */
static cv_pack_cache *open_pack_cache(cv_weight_source *src, const char *layout, nn_linear *const *lins, int n,
                                      cv_threadpool *pool) {
    const size_t n_files = cv_weight_source_n_files(src);
    if (!n_files || !n) return NULL;
    const char **files = cv_xmalloc(n_files * sizeof *files);
    for (size_t i = 0; i < n_files; i++) files[i] = cv_weight_source_file(src, i);
    size_t *sizes = cv_xmalloc((size_t)n * sizeof *sizes);
    for (int i = 0; i < n; i++) sizes[i] = cv_panels_bytes(stacked_rows(lins[i]), lins[i]->parts[0].w.cols);
    cv_pack_cache *c = cv_pack_cache_open(files, n_files, pack_layout_hash(layout, lins, n), sizes, n, pool);
    free(sizes);
    free(files);
    return c;
}

int nn_pack_linears(cv_threadpool *pool, cv_weight_source *src, const char *layout, nn_linear *const *lins, int n,
                    cv_pack_cache **cache) {
    nn_linear **packed = cv_xmalloc(sizeof *packed * (size_t)(n ? n : 1));
    int k = 0;
    for (int i = 0; i < n; i++)
        if (packable(lins[i])) packed[k++] = lins[i];
    *cache = open_pack_cache(src, layout, packed, k, pool);
    const bool hit = *cache && cv_pack_cache_hit(*cache);
    int rc = 0;
    for (int i = 0; i < k && !rc; i++) {
        nn_linear *l = packed[i];
        if (hit) {
            l->packed = (cv_panels){cv_pack_cache_section(*cache, i), stacked_rows(l), l->parts[0].w.cols, false};
            continue; /* the originals were never touched */
        }
        cv_matrix parts[NN_MAX_PARTS];
        part_matrices(l, parts);
        rc = *cache ? cv_panels_pack_into(pool, parts, l->n_parts, cv_pack_cache_section(*cache, i), &l->packed)
                    : cv_panels_pack(pool, parts, l->n_parts, &l->packed);
        for (int j = 0; j < l->n_parts && !rc; j++)
            drop_pages(parts[j].data, (size_t)(parts[j].rows * parts[j].cols) * sizeof(uint16_t));
    }
    if (!rc && *cache && !hit) cv_pack_cache_commit(*cache, pool);
    free(packed);
    return rc;
}

void nn_linear_release(nn_linear *l) { cv_panels_release(&l->packed); }
