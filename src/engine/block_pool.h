/*
 * block_pool.h — the physical blocks of the paged KV cache and who holds them.
 *
 * Every block is created once at start-up. Free blocks sit in a doubly linked queue so a block can
 * leave it from the middle in O(1) (needed when a cached prefix block is reused) and allocation takes
 * from the head: the queue is in LRU order. A block is shared by reference count; when the last
 * holder frees it, it returns to the tail of the queue. Block 0 is never handed out, so a zero in a
 * block table is visibly wrong rather than silently aliasing real data.
 */
#ifndef CV_BLOCK_POOL_H
#define CV_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cv_block {
    int32_t id;
    int32_t ref_count;
    int32_t prev_free, next_free; /* links of the free queue, -1 at the ends / when not queued */
} cv_block;

typedef struct cv_block_pool {
    int32_t num_blocks;           /* including the reserved block 0 */
    cv_block *blocks;
    int32_t free_head, free_tail;
    int32_t num_free;
} cv_block_pool;

void cv_block_pool_init(cv_block_pool *pool, int32_t num_blocks);
void cv_block_pool_free(cv_block_pool *pool);
/* Takes n blocks from the head of the free queue into ids[]; false (taking none) if too few. */
bool cv_block_pool_allocate(cv_block_pool *pool, int32_t n, int32_t *ids);
/* Drops one reference to each block; blocks that reach zero go back to the tail. Blocks are released
 * in reverse order so that a request's last blocks are reused first. */
void cv_block_pool_release(cv_block_pool *pool, const int32_t *ids, int32_t n);
int32_t cv_block_pool_num_free(const cv_block_pool *pool);
/* Fraction of usable blocks in use, for the kv_cache_usage metric. */
double cv_block_pool_usage(const cv_block_pool *pool);

#endif
