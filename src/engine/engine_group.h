/*
 * engine_group.h — data parallelism: N engine replicas behind one server, in one process (`cvllm
 * serve -dp N`, vLLM's --data-parallel-size).
 *
 * It lives in the engine layer, not in the server, because routing needs what only this layer has:
 * the tokenized prompt of a prepared request and the block hashes the prefix cache files blocks
 * under (block_pool.h). The server sees one engine: submit, abort, drain, the read-only facts of
 * replica 0, and per-replica statistics for /metrics.
 *
 * Each replica is its own cvllm_engine, created from the same options with data_parallel_size N
 * (so each takes 1/N of the memory budget and of the kernel threads, cvllm.h), on its own engine
 * loop (engine_loop.h). A submit is validated and tokenized once, on the submitting thread, by
 * replica 0's loop: every replica would do the same with the same options. The router (router.h)
 * then picks the replica from the prompt's block hashes and the replicas' loads, and the request
 * goes into that replica's inbox; both under the group's lock, so that the next submit already
 * counts this one in its replica's load. Requests with their own seed sample the same on any
 * replica (the seed, not the engine, seeds them); the others draw from their replica's stream.
 *
 * Request ids carry their replica (engine id × N + replica; the engine ids all come from replica
 * 0's counter, so they are unique in the group), so an abort reaches the replica that holds the
 * request without a map, and ids still increase with arrival, which the scheduler orders by.
 * With N = 1 the group is a pass-through to the one loop: no hashing, no lock, the same ids.
 */
#ifndef CV_ENGINE_GROUP_H
#define CV_ENGINE_GROUP_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine_loop.h"

typedef struct cv_engine_group cv_engine_group;

/* Creates options->data_parallel_size engines (one when it is 0 or 1), each from those options, and
 * starts a loop on each (loop_options with each replica's engine_index). On failure nothing is left
 * running and cvllm_last_error() says why; the status is the failing engine's. */
int cv_engine_group_start(const cvllm_engine_options *options, const cv_loop_options *loop_options,
                          cv_engine_group **out);
/* Stops every loop (aborting what is in flight, each request still getting its final event) and
 * destroys the engines. */
void cv_engine_group_stop(cv_engine_group *g);
/* Waits up to `seconds` in all until every replica has delivered every final event; true when none
 * is left (SIGTERM drain). */
bool cv_engine_group_drain(cv_engine_group *g, double seconds);

/* Thread-safe, as cv_engine_loop_submit; the id is the group's (for cv_engine_group_abort). */
int cv_engine_group_submit(cv_engine_group *g, const cv_submit *s, uint64_t *request_id);
/* Thread-safe; unknown or finished ids are ignored. */
void cv_engine_group_abort(cv_engine_group *g, uint64_t request_id);

int cv_engine_group_size(const cv_engine_group *g);
/* Replica 0's engine, for the immutable facts every replica shares (tokenizer, limits, grammars). */
const cvllm_engine *cv_engine_group_engine(const cv_engine_group *g);
/* cvllm_engine_load_lora / cvllm_engine_unload_lora for the whole group: every request is prepared
 * on replica 0, so its adapters serve every replica (their models' linears are laid out alike). */
int cv_engine_group_load_lora(cv_engine_group *g, const cvllm_lora_module *m, bool replace);
int cv_engine_group_unload_lora(cv_engine_group *g, const char *name);
/* Copies of the names of the adapters by table slot, as cv_engine_stats.lora_state indexes them, into
 * names[CV_MAX_LORA_MODULES] (NULL for free slots; the caller frees each). */
void cv_engine_group_lora_slot_names(cv_engine_group *g, char **names);
/* A snapshot of one replica's statistics (cv_engine_loop_stats). */
void cv_engine_group_stats(cv_engine_group *g, int replica, cv_engine_stats *out);

#endif
