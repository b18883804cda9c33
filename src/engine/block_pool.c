/*
 * block_pool.c — see block_pool.h.
 */
#include "engine/block_pool.h"

#include <assert.h>
#include <stdlib.h>

#include "base/error.h"

static void queue_push_tail(cv_block_pool *pool, int32_t id) {
    cv_block *b = &pool->blocks[id];
    assert(b->prev_free == -1 && b->next_free == -1 && pool->free_head != id);
    b->prev_free = pool->free_tail;
    if (pool->free_tail >= 0) pool->blocks[pool->free_tail].next_free = id;
    else pool->free_head = id;
    pool->free_tail = id;
    pool->num_free++;
}

static void queue_remove(cv_block_pool *pool, int32_t id) {
    cv_block *b = &pool->blocks[id];
    if (b->prev_free >= 0) pool->blocks[b->prev_free].next_free = b->next_free;
    else pool->free_head = b->next_free;
    if (b->next_free >= 0) pool->blocks[b->next_free].prev_free = b->prev_free;
    else pool->free_tail = b->prev_free;
    b->prev_free = b->next_free = -1;
    pool->num_free--;
}

void cv_block_pool_init(cv_block_pool *pool, int32_t num_blocks) {
    assert(num_blocks >= 2);
    pool->num_blocks = num_blocks;
    pool->blocks = cv_xcalloc((size_t)num_blocks, sizeof(cv_block));
    pool->free_head = pool->free_tail = -1;
    pool->num_free = 0;
    for (int32_t i = 0; i < num_blocks; i++) {
        pool->blocks[i] = (cv_block){.id = i, .ref_count = 0, .prev_free = -1, .next_free = -1};
        if (i > 0) queue_push_tail(pool, i);
    }
    pool->blocks[0].ref_count = 1; /* reserved forever */
}

void cv_block_pool_free(cv_block_pool *pool) {
    free(pool->blocks);
    pool->blocks = NULL;
}

bool cv_block_pool_allocate(cv_block_pool *pool, int32_t n, int32_t *ids) {
    if (n > pool->num_free) return false;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = pool->free_head;
        assert(id > 0 && pool->blocks[id].ref_count == 0);
        queue_remove(pool, id);
        pool->blocks[id].ref_count = 1;
        ids[i] = id;
    }
    return true;
}

void cv_block_pool_release(cv_block_pool *pool, const int32_t *ids, int32_t n) {
    for (int32_t i = n - 1; i >= 0; i--) {
        cv_block *b = &pool->blocks[ids[i]];
        assert(ids[i] > 0 && b->ref_count > 0);
        if (--b->ref_count == 0) queue_push_tail(pool, ids[i]);
    }
}

int32_t cv_block_pool_num_free(const cv_block_pool *pool) { return pool->num_free; }

double cv_block_pool_usage(const cv_block_pool *pool) {
    int32_t usable = pool->num_blocks - 1;
    return usable > 0 ? (double)(usable - pool->num_free) / usable : 0.0;
}
