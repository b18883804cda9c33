/*
 * hash_index.c — see hash_index.h.
 */
#include "engine/hash_index.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>

#include "base/error.h"

enum { EMPTY = -1, DELETED = -2 };

static bool same(cv_block_hash a, cv_block_hash b) { return a.lo == b.lo && a.hi == b.hi; }

void cv_hash_index_init(cv_hash_index *ix, size_t max_entries) {
    ix->cap = 16;
    while (ix->cap < 2 * max_entries + 1) ix->cap *= 2;
    ix->keys = cv_xmalloc(ix->cap * sizeof *ix->keys);
    ix->vals = cv_xmalloc(ix->cap * sizeof *ix->vals);
    for (size_t i = 0; i < ix->cap; i++) ix->vals[i] = EMPTY;
    ix->used = 0;
}

void cv_hash_index_free(cv_hash_index *ix) {
    free(ix->keys);
    free(ix->vals);
    ix->keys = NULL;
    ix->vals = NULL;
}

static size_t find(const cv_hash_index *ix, cv_block_hash h) {
    for (size_t i = (size_t)h.lo & (ix->cap - 1);; i = (i + 1) & (ix->cap - 1)) {
        if (ix->vals[i] == EMPTY) return SIZE_MAX;
        if (ix->vals[i] >= 0 && same(ix->keys[i], h)) return i;
    }
}

int32_t cv_hash_index_get(const cv_hash_index *ix, cv_block_hash h) {
    size_t i = find(ix, h);
    return i == SIZE_MAX ? -1 : ix->vals[i];
}

static void place(cv_hash_index *ix, cv_block_hash h, int32_t val) {
    size_t i = (size_t)h.lo & (ix->cap - 1);
    while (ix->vals[i] >= 0) i = (i + 1) & (ix->cap - 1);
    if (ix->vals[i] == EMPTY) ix->used++;
    ix->keys[i] = h;
    ix->vals[i] = val;
}

/* Tombstones only go away by rebuilding; without it a miss would eventually probe forever. */
static void rebuild(cv_hash_index *ix) {
    cv_block_hash *keys = ix->keys;
    int32_t *vals = ix->vals;
    ix->keys = cv_xmalloc(ix->cap * sizeof *ix->keys);
    ix->vals = cv_xmalloc(ix->cap * sizeof *ix->vals);
    for (size_t i = 0; i < ix->cap; i++) ix->vals[i] = EMPTY;
    ix->used = 0;
    for (size_t i = 0; i < ix->cap; i++)
        if (vals[i] >= 0) place(ix, keys[i], vals[i]);
    free(keys);
    free(vals);
}

void cv_hash_index_put(cv_hash_index *ix, cv_block_hash h, int32_t val) {
    assert(val >= 0 && find(ix, h) == SIZE_MAX);
    if ((ix->used + 1) * 4 > ix->cap * 3) rebuild(ix);
    place(ix, h, val);
}

void cv_hash_index_del(cv_hash_index *ix, cv_block_hash h) {
    size_t i = find(ix, h);
    assert(i != SIZE_MAX);
    ix->vals[i] = DELETED;
}
