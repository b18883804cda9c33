/*
 * block_pool.h — the physical blocks of the paged KV cache and who holds them.
 *
 * Every block is created once at start-up. Free blocks sit in a doubly linked queue so a block can
 * leave it from the middle in O(1) (needed when a cached prefix block is reused) and allocation takes
 * from the head: the queue is in LRU order. A block is shared by reference count; when the last
 * holder frees it, it returns to the tail of the queue if it carries a prefix hash (below), else to
 * the head: it holds nothing worth keeping, and reusing it before a never-used block reuses memory
 * already faulted in (the first write to fresh pages is the slowest memory traffic there is, 0.5 GB/s
 * on a VM whose host backs guest pages lazily). Block 0 is never handed out, so a zero in a block
 * table is visibly wrong rather than silently aliasing real data.
 *
 * Automatic prefix caching lives here too (vLLM's design): a full block can carry the hash of its
 * tokens chained with the hashes of every block before it, and a table maps hashes to blocks. A
 * freed block keeps its hash while it waits in the free queue, so a later request with the same
 * prefix can take it back (a hit); it loses the hash only when allocation evicts it from the head of
 * the queue. Hashes are 128-bit XXH3, so a collision (which would silently serve another prompt's
 * KV) is not a practical concern.
 *
 * A cached block may also keep the prompt logprobs its rows produced. A request that asks for
 * prompt logprobs (an lm-eval loglikelihood request: echo with logprobs) needs the distribution at
 * every prompt position, which K/V alone cannot give back; with these it can still skip a shared
 * prefix. They live and die with the block's hash.
 */
#ifndef CV_BLOCK_POOL_H
#define CV_BLOCK_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "engine/hash_index.h"

/* Prompt logprobs of one cached block, row by row: the logits of row r (position r) give the
 * distribution of token r+1, so for each row the k most likely tokens and the logprob and rank of
 * the token that followed. All of it depends only on the tokens up to the row, which the block's
 * hash covers, except the token after the block's last row: that entry holds for next_token only. */
typedef struct cv_block_logprobs {
    int32_t k;                    /* top entries per row */
    int32_t next_token;           /* the token the last row's entry is for; -1 when there is none */
    cvllm_logprob rows[];         /* block_size × (1 + k): the following token's entry, then the top k */
} cv_block_logprobs;

typedef struct cv_block {
    int32_t id;
    int32_t ref_count;
    int32_t prev_free, next_free; /* links of the free queue, -1 at the ends / when not queued */
    bool has_hash;
    cv_block_hash hash;
    cv_block_logprobs *logprobs;  /* owned; only while has_hash */
} cv_block;

typedef struct cv_block_pool {
    int32_t num_blocks;           /* including the reserved block 0 */
    cv_block *blocks;
    int32_t free_head, free_tail;
    int32_t num_free;
    cv_hash_index cached;         /* hash → block id of every block that carries a hash */
} cv_block_pool;

void cv_block_pool_init(cv_block_pool *pool, int32_t num_blocks);
void cv_block_pool_free(cv_block_pool *pool);
/* Takes n blocks from the head of the free queue into ids[]; false (taking none) if too few. */
bool cv_block_pool_allocate(cv_block_pool *pool, int32_t n, int32_t *ids);
/* Drops one reference to each block; blocks that reach zero go back to the queue: hashed ones to the
 * tail, in reverse order so that a request's last blocks are reused first; unhashed ones to the head,
 * in table order. */
void cv_block_pool_release(cv_block_pool *pool, const int32_t *ids, int32_t n);
int32_t cv_block_pool_num_free(const cv_block_pool *pool);

/* Hash of one full block: the parent's hash (zero for the first block), the block's tokens and, for
 * the first block only, the request's cache_salt and LoRA adapter (0: the base model), which the
 * later blocks inherit through their parents: K/V computed with an adapter differ from the base
 * model's (vLLM puts the LoRA name in every block's extra keys). */
cv_block_hash cv_block_hash_tokens(cv_block_hash parent, const int32_t *tokens, int32_t n, const char *salt,
                                   int32_t lora);
/* The chained hashes of full blocks [from, to) of `tokens` into hashes[from..to), hashes[0..from)
 * holding the earlier ones: what a sequence's blocks are cached under, and what the data-parallel
 * router (engine_group.c) matches prompts with. */
void cv_block_hash_chain(const int32_t *tokens, int32_t block_size, const char *salt, int32_t lora, int32_t from,
                         int32_t to, cv_block_hash *hashes);
/* The cached block with this hash, or -1. */
int32_t cv_block_pool_lookup(const cv_block_pool *pool, cv_block_hash h);
/* Takes one more reference to a cached block (leaving the free queue if it was there). */
void cv_block_pool_touch(cv_block_pool *pool, int32_t id);
/* Records that block `id` (full, held by the caller) holds the tokens hashed to h. A hash already
 * cached by another block is left alone (the duplicate simply is not shared). */
void cv_block_pool_cache(cv_block_pool *pool, int32_t id, cv_block_hash h);
/* The prompt logprobs kept with the cached block of hash h if they hold at least k top entries per
 * row, else NULL. */
const cv_block_logprobs *cv_block_pool_logprobs(const cv_block_pool *pool, cv_block_hash h, int32_t k);
/* Keeps lp (owned by the pool from now on) with the cached block of hash h, replacing a record with
 * fewer top entries; dropped when h is not cached or already has as many. */
void cv_block_pool_keep_logprobs(cv_block_pool *pool, cv_block_hash h, cv_block_logprobs *lp);
/* Fraction of usable blocks in use, for the kv_cache_usage metric. */
double cv_block_pool_usage(const cv_block_pool *pool);

#endif
