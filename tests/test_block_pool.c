/*
 * test_block_pool.c — the block pool's invariants: LRU reuse order, reference counting, prefix-cache
 * hits and evictions, the prompt logprobs kept with cached blocks, and the hash table surviving long
 * churn (tombstones are rebuilt away).
 */
#include <stdlib.h>

#include "check.h"
#include "engine/block_pool.h"

static cv_block_hash hash_of(int32_t k) {
    int32_t toks[4] = {k, k + 1, k + 2, k + 3};
    return cv_block_hash_tokens((cv_block_hash){0, 0}, toks, 4, NULL, 0);
}

static void test_lru_and_refcount(void) {
    cv_block_pool p;
    cv_block_pool_init(&p, 5); /* blocks 1..4 usable */
    int32_t a[4];
    CHECK(cv_block_pool_allocate(&p, 4, a));
    CHECK_EQ_INT(a[0], 1);
    CHECK_EQ_INT(a[3], 4);
    CHECK(!cv_block_pool_allocate(&p, 1, a));
    CHECK(cv_block_pool_usage(&p) == 1.0);
    cv_block_pool_release(&p, a, 2); /* unhashed: back to the head, in table order */
    int32_t b[2];
    CHECK(cv_block_pool_allocate(&p, 2, b));
    CHECK_EQ_INT(b[0], 1);
    CHECK_EQ_INT(b[1], 2);
    cv_block_pool_release(&p, b, 2);
    cv_block_pool_release(&p, a + 2, 2);
    CHECK_EQ_INT(cv_block_pool_num_free(&p), 4);
    CHECK(cv_block_pool_usage(&p) == 0.0);
    cv_block_pool_free(&p);
}

/* Where a freed block queues: one without a hash is reused before never-used blocks (its pages are
 * already faulted in), one with a hash only after them (LRU: it may still be hit); hashed blocks of
 * one release come back last block first. */
static void test_reuse_order(void) {
    cv_block_pool p;
    cv_block_pool_init(&p, 8); /* blocks 1..7 usable */
    int32_t a[4], b[7];
    CHECK(cv_block_pool_allocate(&p, 4, a)); /* 1 2 3 4; 5 6 7 never used */
    cv_block_pool_cache(&p, a[0], hash_of(10));
    cv_block_pool_cache(&p, a[1], hash_of(20));
    cv_block_pool_release(&p, a, 4);
    CHECK(cv_block_pool_allocate(&p, 7, b));
    const int32_t want[7] = {3, 4, 5, 6, 7, 2, 1};
    for (int i = 0; i < 7; i++) CHECK_EQ_INT(b[i], want[i]);
    CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(10)), -1); /* both evicted by the reuse */
    CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(20)), -1);
    cv_block_pool_release(&p, b, 7);
    CHECK_EQ_INT(cv_block_pool_num_free(&p), 7);
    cv_block_pool_free(&p);
}

static void test_prefix_hits_and_eviction(void) {
    cv_block_pool p;
    cv_block_pool_init(&p, 3);
    int32_t a[2];
    CHECK(cv_block_pool_allocate(&p, 2, a));
    cv_block_pool_cache(&p, a[0], hash_of(10));
    cv_block_pool_cache(&p, a[1], hash_of(20));
    cv_block_pool_cache(&p, a[1], hash_of(30)); /* already hashed: ignored */
    CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(10)), a[0]);
    CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(30)), -1);
    cv_block_pool_release(&p, a, 2);
    /* Freed blocks keep their hashes and can be taken back. */
    CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(20)), a[1]);
    cv_block_pool_touch(&p, a[1]);
    CHECK_EQ_INT(cv_block_pool_num_free(&p), 1);
    /* Allocating the other block evicts its hash. */
    int32_t c;
    CHECK(cv_block_pool_allocate(&p, 1, &c));
    CHECK_EQ_INT(c, a[0]);
    CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(10)), -1);
    CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(20)), a[1]);
    cv_block_pool_release(&p, &c, 1);
    cv_block_pool_release(&p, &a[1], 1);
    cv_block_pool_free(&p);
}

static cv_block_logprobs *record(int32_t k, int32_t next_token) {
    cv_block_logprobs *lp = calloc(1, sizeof *lp + 4 * (size_t)(1 + k) * sizeof(cvllm_logprob));
    lp->k = k;
    lp->next_token = next_token;
    return lp;
}

/* Prompt logprobs kept with a cached block: found for k up to theirs, replaced only by a record with
 * more top entries, gone with the hash when the block is evicted (ASan checks nothing leaks). */
static void test_block_logprobs(void) {
    cv_block_pool p;
    cv_block_pool_init(&p, 3);
    int32_t a[2];
    CHECK(cv_block_pool_allocate(&p, 2, a));
    cv_block_pool_keep_logprobs(&p, hash_of(10), record(2, 5)); /* not cached: dropped */
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 0) == NULL);
    cv_block_pool_cache(&p, a[0], hash_of(10));
    cv_block_pool_keep_logprobs(&p, hash_of(10), record(2, 5));
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 2)->next_token == 5);
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 0) != NULL);
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 3) == NULL);
    cv_block_pool_keep_logprobs(&p, hash_of(10), record(1, 6)); /* fewer entries: ignored */
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 1)->next_token == 5);
    cv_block_pool_keep_logprobs(&p, hash_of(10), record(4, 7));
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 3)->next_token == 7);
    /* Released, the block keeps hash and record; reallocated, it loses both. */
    cv_block_pool_release(&p, a, 2);
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 4) != NULL);
    int32_t b[2];
    CHECK(cv_block_pool_allocate(&p, 2, b));
    CHECK(cv_block_pool_logprobs(&p, hash_of(10), 0) == NULL);
    cv_block_pool_cache(&p, b[1], hash_of(20));
    cv_block_pool_keep_logprobs(&p, hash_of(20), record(0, -1)); /* freed with the pool */
    cv_block_pool_release(&p, b, 2);
    cv_block_pool_free(&p);
}

/* Many cache/evict cycles: lookups of absent hashes must still terminate and live ones be found. */
static void test_table_churn(void) {
    cv_block_pool p;
    cv_block_pool_init(&p, 9);
    int32_t ids[8];
    for (int round = 0; round < 2000; round++) {
        CHECK(cv_block_pool_allocate(&p, 8, ids));
        /* Reallocation evicted last round's hashes: none may still be found (no stale duplicates). */
        for (int i = 0; round > 0 && i < 8; i++) CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of((round - 1) * 8 + i)), -1);
        for (int i = 0; i < 8; i++) cv_block_pool_cache(&p, ids[i], hash_of(round * 8 + i));
        cv_block_pool_release(&p, ids, 8);
        if (round % 97 == 0) {
            CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(round * 8 + 3)), ids[3]);
            CHECK_EQ_INT(cv_block_pool_lookup(&p, hash_of(-5)), -1);
        }
    }
    CHECK(p.cached.used * 4 <= p.cached.cap * 3);
    cv_block_pool_free(&p);
}

static bool same_hash(cv_block_hash a, cv_block_hash b) { return a.lo == b.lo && a.hi == b.hi; }

/* The first block's salt and LoRA adapter keep blocks apart, every pairing of them, and the later
 * blocks inherit the difference. */
static void test_salt_and_lora_keys(void) {
    const int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const char *salts[] = {NULL, "", "a", "\x01"};
    const int32_t loras[] = {0, 1, 2, 256};
    cv_block_hash first[16], second[16];
    int n = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++, n++) {
            cv_block_hash h[2];
            cv_block_hash_chain(toks, 4, salts[i], loras[j], 0, 2, h);
            first[n] = h[0];
            second[n] = h[1];
        }
    for (int x = 0; x < n; x++)
        for (int y = 0; y < x; y++) {
            CHECK_MSG(!same_hash(first[x], first[y]), "first blocks %d and %d share a hash", x, y);
            CHECK_MSG(!same_hash(second[x], second[y]), "second blocks %d and %d share a hash", x, y);
        }
    /* the same key twice is the same hash */
    cv_block_hash again[2];
    cv_block_hash_chain(toks, 4, "a", 2, 0, 2, again);
    CHECK(same_hash(again[1], second[2 * 4 + 2]));
}

int main(void) {
    test_salt_and_lora_keys();
    test_reuse_order();
    test_lru_and_refcount();
    test_prefix_hits_and_eviction();
    test_block_logprobs();
    test_table_churn();
    return cv_check_summary("test_block_pool");
}
