/*
 * hash_index.h — a map from 128-bit block hashes to small integers (block ids, checkpoint slots).
 *
 * Open addressing with linear probing; deleted entries leave tombstones, and the table is rebuilt
 * in place when live entries plus tombstones pass 3/4 of the capacity, so a miss always terminates.
 * The capacity is fixed at creation (at least twice the most entries it will hold), because its
 * users (the block pool, the state checkpoints) have a fixed number of things to index.
 */
#ifndef CV_HASH_INDEX_H
#define CV_HASH_INDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct cv_block_hash {
    uint64_t lo, hi;
} cv_block_hash;

typedef struct cv_hash_index {
    cv_block_hash *keys;
    int32_t *vals;     /* >= 0 live, -1 empty, -2 deleted */
    size_t cap;        /* power of two */
    size_t used;       /* live + deleted */
} cv_hash_index;

void cv_hash_index_init(cv_hash_index *ix, size_t max_entries);
void cv_hash_index_free(cv_hash_index *ix);
/* The value stored for h, or -1. */
int32_t cv_hash_index_get(const cv_hash_index *ix, cv_block_hash h);
/* Stores h → val (val >= 0); h must be absent. */
void cv_hash_index_put(cv_hash_index *ix, cv_block_hash h, int32_t val);
/* Removes h, which must be present. */
void cv_hash_index_del(cv_hash_index *ix, cv_block_hash h);

#endif
