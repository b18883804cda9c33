/*
 * scheduler.h — who runs in the next forward pass, and with how many tokens (vLLM v1 semantics).
 *
 * There are no prefill and decode phases: every sequence has num_computed chasing n_tokens, and a
 * step hands out at most max_num_batched_tokens tokens. Running sequences are served first, in
 * admission order (a decode takes one token, an unfinished prompt takes what is left of the budget:
 * chunked prefill); then, unless someone was preempted in this step, waiting sequences in queue
 * order while fewer than max_num_seqs run. When KV blocks run out, a running sequence is preempted:
 * its blocks are freed, its progress reset, and it goes back to the queue to be recomputed.
 *
 * The policy (vLLM's --scheduling-policy) decides the queue order and the victim:
 *   - fcfs: arrival order; the victim is the newest running sequence, and it goes back to the
 *     front of the queue;
 *   - priority: ascending (priority, arrival), a lower value first; the victim is the running
 *     sequence that comes last in that order, possibly one already given tokens in this step (they
 *     go back to the budget), and it goes back to its place in the queue. A waiting sequence never
 *     preempts a running one, however urgent: preemption only makes room for running sequences.
 * Arrival is the request id; the completions of one request (n > 1) follow by index.
 *
 * With prefix caching on, a sequence that is admitted first takes the longest run of cached blocks
 * that match its tokens (never the whole prompt: the last token is always computed, for its
 * logits), and every block that fills up is registered in the cache as soon as its K/V exist, even
 * when the sequence finishes in that very step (a max_tokens=1 request). A sequence that needs
 * prompt logprobs takes only blocks that also kept theirs (see block_pool.h).
 */
#ifndef CV_SCHEDULER_H
#define CV_SCHEDULER_H

#include <stdint.h>

#include "engine/block_pool.h"
#include "engine/request.h"
#include "engine/state_pool.h"

typedef struct cv_seq_list {
    cv_seq **items;
    int32_t n, cap;
} cv_seq_list;

typedef struct cv_scheduler {
    int32_t max_num_seqs;
    int32_t max_num_batched_tokens;
    int32_t block_size;
    int32_t max_model_len;
    cv_block_pool *pool;
    cv_state_pool *states;         /* models with recurrent state: a hit also needs a state checkpoint */
    bool enable_prefix_caching;
    bool priority_policy;          /* "priority", else "fcfs" */
    int32_t max_loras;             /* LoRA: distinct adapters among the running sequences, at most (0: no
                                    * adapters; set after init). A waiting sequence whose adapter would
                                    * pass it waits, and those behind it are admitted, as in vLLM */
    cv_seq_list running;           /* in admission order */
    cv_seq_list waiting;           /* front = next to admit */
    uint64_t num_preemptions;      /* total, for metrics */
    uint64_t prefix_queries;       /* tokens looked up in the prefix cache */
    uint64_t prefix_hits;          /* tokens found there */
} cv_scheduler;

typedef struct cv_schedule {
    cv_seq_list seqs;              /* scheduled this step, each with num_scheduled > 0 */
    int32_t total_tokens;
    cv_seq_list preempted;         /* sequences preempted in this step */
} cv_schedule;

void cv_scheduler_init(cv_scheduler *s, cv_block_pool *pool, int32_t max_num_seqs,
                       int32_t max_num_batched_tokens, int32_t block_size, int32_t max_model_len,
                       bool enable_prefix_caching, bool priority_policy, cv_state_pool *states);
void cv_scheduler_free(cv_scheduler *s);
void cv_scheduler_add(cv_scheduler *s, cv_seq *seq);
/* Fills *out (its list is reused across steps). */
void cv_scheduler_schedule(cv_scheduler *s, cv_schedule *out);
/* Removes a sequence (finished or aborted) from whichever queue holds it and frees its blocks. */
void cv_scheduler_finish(cv_scheduler *s, cv_seq *seq);
/* Makes sure the sequence has blocks for its first n_positions positions; false when the pool is out. */
bool cv_scheduler_reserve(cv_scheduler *s, cv_seq *seq, size_t n_positions);
/* Extends seq->block_hashes over every full block of its tokens. */
void cv_scheduler_hash_blocks(const cv_scheduler *s, cv_seq *seq);
/* After a forward pass that left the K/V of the sequence's first n_computed tokens in the cache:
 * registers its newly filled blocks in the prefix cache (with their prompt logprobs, when it
 * computes those). */
void cv_scheduler_cache_full_blocks(cv_scheduler *s, cv_seq *seq, size_t n_computed);
int32_t cv_scheduler_num_running(const cv_scheduler *s);
int32_t cv_scheduler_num_waiting(const cv_scheduler *s);
void cv_schedule_free(cv_schedule *out);

#endif
