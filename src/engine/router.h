/*
 * router.h — which data-parallel replica serves a request (`cvllm serve -dp N`, engine_group.h).
 *
 * Two things make a replica a good choice: it may already hold the request's prompt prefix in its
 * prefix cache (then the prefill of those blocks is skipped), and it may have less to do. The
 * replica with the longest match wins, counted in whole KV blocks by the chained block hashes the
 * engine caches under (block_pool.h); among equals (no match anywhere, or matches of one length) the
 * least loaded does: fewest requests in flight, then lowest KV-cache usage, then lowest index.
 * A match does not win at any price: a holder with clearly more requests than the least loaded
 * replica (see BALANCE_* in router.c) loses the request to it, which from then on holds that prefix
 * too. So a prefix that every request shares (a system prompt, a chat template's head) spreads over
 * the replicas after a few requests instead of piling them all on the first.
 *
 * What a replica holds is the router's own record, not the engine's index: the engine's hash table
 * changes on its loop thread at every step, and reading it from the submitting threads would put a
 * lock on the engine's hot path. The record is what the router sent each replica: the block hashes
 * of the prompts it routed there, in an LRU set as large as the replica's KV cache (capped, see
 * router.c), so that it forgets roughly as the engine evicts. Most recent are a prompt's first
 * blocks, as in the engine, which evicts a released request's last blocks first. The record can be
 * wrong both ways (the engine evicts sooner under pressure; it also caches output blocks the router
 * never saw): a wrong guess costs a prefill, never a wrong answer.
 *
 * Not thread-safe: the engine group calls it under its lock.
 */
#ifndef CV_ROUTER_H
#define CV_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/hash_index.h"

typedef struct cv_router cv_router;

typedef struct cv_replica_load {
    size_t requests;        /* submitted and not finished */
    double kv_cache_usage;  /* 0..1 */
} cv_replica_load;

/* `blocks` is the number of KV blocks of each replica (they are alike). */
cv_router *cv_router_new(int n_replicas, int32_t blocks);
void cv_router_free(cv_router *r);

/* How many leading blocks of hashes[0..n) the router's record says `replica` holds. */
int32_t cv_router_match(const cv_router *r, int replica, const cv_block_hash *hashes, int32_t n);

/* The replica for a prompt whose cacheable blocks hash to hashes[0..n) (n may be 0), given each
 * replica's load (loads[0..n_replicas)); records that the chosen one now holds those blocks. */
int cv_router_route(cv_router *r, const cv_block_hash *hashes, int32_t n, const cv_replica_load *loads);

#endif
