/*
 * state_pool.h — the recurrent-state slots of hybrid models, and what each one is for.
 *
 * A linear-attention layer carries a fixed-size state per sequence instead of a growing KV cache.
 * The pool hands the model one cv_state_cache whose slots are laid out as:
 *   [0, n_running)            one per sequence that can run at once;
 *   spec scratch              spec_per_seq per running slot: during a speculative verify pass the
 *                             model checkpoints the state after each position there, so the state
 *                             can be rolled back to the last accepted token;
 *   prefix checkpoints        n_ckpt slots holding the state at block boundaries of cached
 *                             prefixes, indexed by the block hash (the same chained hash as the KV
 *                             blocks'), evicted LRU. A request that shares a cached prefix copies the
 *                             checkpoint into its own slot and skips the prefix (vLLM computes it
 *                             again: its hit rate on these models is ~0).
 * The pool is bookkeeping only: the slots' memory is the runner's (executor/runner.h), and a copy
 * the engine asks for is queued here and handed to the runner with the next batch, which applies
 * the queue in order before it runs. The engine never interprets slot bytes.
 */
#ifndef CV_STATE_POOL_H
#define CV_STATE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/hash_index.h"
#include "executor/runner.h"

typedef struct cv_state_pool {
    int32_t num_slots;            /* 0: the model has no recurrent state */
    cv_state_copy *copies;        /* queued for the next batch, in order */
    int32_t n_copies, cap_copies;
    int32_t n_running;
    int32_t *free_running;
    int32_t n_free_running;
    int32_t spec_base, spec_per_seq;
    int32_t ckpt_base, n_ckpt;
    cv_hash_index ckpt_index;     /* block hash → checkpoint number (slot - ckpt_base) */
    cv_block_hash *ckpt_hash;
    int32_t *lru_prev, *lru_next; /* over checkpoints in use: head = least recently used */
    int32_t lru_head, lru_tail;
    int32_t n_ckpt_used;
} cv_state_pool;

/* Bytes of memory a pool of this shape takes (for the memory budget). */
size_t cv_state_pool_bytes(size_t state_bytes, int32_t n_running, int32_t spec_per_seq, int32_t n_ckpt);
void cv_state_pool_init(cv_state_pool *p, int32_t n_running, int32_t spec_per_seq, int32_t n_ckpt);
void cv_state_pool_free(cv_state_pool *p);

/* A slot for a sequence that starts running (-1 when none is free), and its release. */
int32_t cv_state_pool_acquire(cv_state_pool *p);
void cv_state_pool_release(cv_state_pool *p, int32_t slot);
/* Scratch slot i (< spec_per_seq) of a running slot. */
int32_t cv_state_pool_spec_slot(const cv_state_pool *p, int32_t running_slot, int32_t i);
/* Queues a copy of slot src over slot dst for the next batch. */
void cv_state_pool_copy(cv_state_pool *p, int32_t dst, int32_t src);
/* The queued copies, handed to the runner with the next batch; then cv_state_pool_copies_done. */
const cv_state_copy *cv_state_pool_copies(const cv_state_pool *p, int32_t *n);
void cv_state_pool_copies_done(cv_state_pool *p);

/* The checkpoint slot holding the state after the block with hash h, or -1 (a hit refreshes it). */
int32_t cv_state_pool_find(cv_state_pool *p, cv_block_hash h);
bool cv_state_pool_has(const cv_state_pool *p, cv_block_hash h);
/* A slot for a new checkpoint of h, evicting the least recently used; -1 when there are no
 * checkpoint slots. h must not be checkpointed already. */
int32_t cv_state_pool_checkpoint(cv_state_pool *p, cv_block_hash h);
/* Drops the checkpoint of h if there is one (its contents were never written). */
void cv_state_pool_forget(cv_state_pool *p, cv_block_hash h);

#endif
