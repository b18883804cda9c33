/*
 * block_pool.c — see block_pool.h.
 */
#include "engine/block_pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t for streaming */
#include <xxhash.h>

#include "base/error.h"

/* Allocation reuses a cached block: its hash dies with its old contents. */
static void evict(cv_block_pool *pool, int32_t id) {
    cv_block *b = &pool->blocks[id];
    if (!b->has_hash) return;
    assert(cv_hash_index_get(&pool->cached, b->hash) == id);
    cv_hash_index_del(&pool->cached, b->hash);
    b->has_hash = false;
    free(b->logprobs);
    b->logprobs = NULL;
}

static void queue_push_tail(cv_block_pool *pool, int32_t id) {
    cv_block *b = &pool->blocks[id];
    assert(b->prev_free == -1 && b->next_free == -1 && pool->free_head != id);
    b->prev_free = pool->free_tail;
    if (pool->free_tail >= 0) pool->blocks[pool->free_tail].next_free = id;
    else pool->free_head = id;
    pool->free_tail = id;
    pool->num_free++;
}

static void queue_push_head(cv_block_pool *pool, int32_t id) {
    cv_block *b = &pool->blocks[id];
    assert(b->prev_free == -1 && b->next_free == -1 && pool->free_head != id);
    b->next_free = pool->free_head;
    if (pool->free_head >= 0) pool->blocks[pool->free_head].prev_free = id;
    else pool->free_tail = id;
    pool->free_head = id;
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
    cv_hash_index_init(&pool->cached, (size_t)num_blocks);
}

void cv_block_pool_free(cv_block_pool *pool) {
    for (int32_t i = 0; i < pool->num_blocks; i++) free(pool->blocks[i].logprobs);
    free(pool->blocks);
    cv_hash_index_free(&pool->cached);
    pool->blocks = NULL;
}

bool cv_block_pool_allocate(cv_block_pool *pool, int32_t n, int32_t *ids) {
    if (n > pool->num_free) return false;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = pool->free_head;
        assert(id > 0 && pool->blocks[id].ref_count == 0);
        queue_remove(pool, id);
        evict(pool, id);
        pool->blocks[id].ref_count = 1;
        ids[i] = id;
    }
    return true;
}

void cv_block_pool_release(cv_block_pool *pool, const int32_t *ids, int32_t n) {
    /* Blocks with a hash queue at the tail in LRU order; blocks without one hold nothing a later
     * request could hit, so they go to the head and are handed out again first (in table order),
     * before never-used blocks: their pages are already faulted in and may still be in cache. */
    for (int32_t i = n - 1; i >= 0; i--) {
        cv_block *b = &pool->blocks[ids[i]];
        assert(ids[i] > 0 && b->ref_count > 0);
        if (--b->ref_count == 0 && b->has_hash) queue_push_tail(pool, ids[i]);
    }
    for (int32_t i = n - 1; i >= 0; i--)
        if (pool->blocks[ids[i]].ref_count == 0 && !pool->blocks[ids[i]].has_hash) queue_push_head(pool, ids[i]);
}

int32_t cv_block_pool_num_free(const cv_block_pool *pool) { return pool->num_free; }

double cv_block_pool_usage(const cv_block_pool *pool) {
    int32_t usable = pool->num_blocks - 1;
    return usable > 0 ? (double)(usable - pool->num_free) / usable : 0.0;
}

cv_block_hash cv_block_hash_tokens(cv_block_hash parent, const int32_t *tokens, int32_t n, const char *salt,
                                   int32_t lora) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, &parent, sizeof parent);
    XXH3_128bits_update(&st, tokens, (size_t)n * sizeof *tokens);
    if (salt) XXH3_128bits_update(&st, salt, strlen(salt) + 1);
    if (lora) { /* the tag begins with a NUL, which no salt but "" (a NUL alone) begins with */
        static const char tag[5] = "\0lora";
        XXH3_128bits_update(&st, tag, sizeof tag);
        XXH3_128bits_update(&st, &lora, sizeof lora);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return (cv_block_hash){h.low64, h.high64};
}

void cv_block_hash_chain(const int32_t *tokens, int32_t block_size, const char *salt, int32_t lora, int32_t from,
                         int32_t to, cv_block_hash *hashes) {
    for (int32_t b = from; b < to; b++)
        hashes[b] = b ? cv_block_hash_tokens(hashes[b - 1], tokens + (size_t)b * (size_t)block_size, block_size, NULL, 0)
                      : cv_block_hash_tokens((cv_block_hash){0, 0}, tokens, block_size, salt, lora);
}

int32_t cv_block_pool_lookup(const cv_block_pool *pool, cv_block_hash h) { return cv_hash_index_get(&pool->cached, h); }

void cv_block_pool_touch(cv_block_pool *pool, int32_t id) {
    cv_block *b = &pool->blocks[id];
    assert(id > 0 && b->has_hash);
    if (b->ref_count++ == 0) queue_remove(pool, id);
}

void cv_block_pool_cache(cv_block_pool *pool, int32_t id, cv_block_hash h) {
    cv_block *b = &pool->blocks[id];
    assert(id > 0 && b->ref_count > 0);
    if (b->has_hash || cv_block_pool_lookup(pool, h) >= 0) return;
    b->hash = h;
    b->has_hash = true;
    cv_hash_index_put(&pool->cached, h, id);
}

const cv_block_logprobs *cv_block_pool_logprobs(const cv_block_pool *pool, cv_block_hash h, int32_t k) {
    int32_t id = cv_block_pool_lookup(pool, h);
    const cv_block_logprobs *lp = id >= 0 ? pool->blocks[id].logprobs : NULL;
    return lp && lp->k >= k ? lp : NULL;
}

void cv_block_pool_keep_logprobs(cv_block_pool *pool, cv_block_hash h, cv_block_logprobs *lp) {
    int32_t id = cv_block_pool_lookup(pool, h);
    cv_block *b = id >= 0 ? &pool->blocks[id] : NULL;
    if (!b || (b->logprobs && b->logprobs->k >= lp->k)) {
        free(lp);
        return;
    }
    free(b->logprobs);
    b->logprobs = lp;
}
