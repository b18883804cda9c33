/*
 * router.c — see router.h for the policy.
 *
 * Each replica's record is an LRU set of block hashes: a hash index (hash_index.h) into a fixed
 * array of entries that a doubly linked list keeps in recency order, so a touch, an insertion and
 * an eviction are O(1) and nothing is allocated after creation.
 */
#include "engine/router.h"

#include <stdbool.h>
#include <stdlib.h>

#include "base/error.h"

/* A record beyond this many blocks (1M tokens at the default block size, a few MiB per replica)
 * forgets sooner than a very large KV cache: only prefix hits are lost, and those old. */
#define RECORD_MAX_BLOCKS (1 << 16)

/* A prefix holder loses the request to the least loaded replica when it has more than BALANCE_ABS
 * requests more than that replica and more than BALANCE_REL times as many: a few requests of
 * imbalance are worth a skipped prefill, a replica that is clearly busier is not. */
#define BALANCE_ABS 4
#define BALANCE_REL 1.25

typedef struct entry {
    cv_block_hash hash;
    int32_t prev, next;        /* toward the most / least recent; -1 at the ends */
} entry;

typedef struct record {
    cv_hash_index index;       /* hash -> entry */
    entry *entries;
    int32_t n, cap;
    int32_t head, tail;        /* most and least recent */
} record;

struct cv_router {
    int n_replicas;
    record *records;
};

cv_router *cv_router_new(int n_replicas, int32_t blocks) {
    cv_router *r = cv_xcalloc(1, sizeof *r);
    r->n_replicas = n_replicas;
    r->records = cv_xcalloc((size_t)n_replicas, sizeof *r->records);
    int32_t cap = blocks < 1 ? 1 : blocks > RECORD_MAX_BLOCKS ? RECORD_MAX_BLOCKS : blocks;
    for (int i = 0; i < n_replicas; i++) {
        record *rec = &r->records[i];
        cv_hash_index_init(&rec->index, (size_t)cap);
        rec->entries = cv_xmalloc((size_t)cap * sizeof *rec->entries);
        rec->cap = cap;
        rec->head = rec->tail = -1;
    }
    return r;
}

void cv_router_free(cv_router *r) {
    if (!r) return;
    for (int i = 0; i < r->n_replicas; i++) {
        cv_hash_index_free(&r->records[i].index);
        free(r->records[i].entries);
    }
    free(r->records);
    free(r);
}

static void unlink_entry(record *rec, int32_t i) {
    entry *e = &rec->entries[i];
    if (e->prev >= 0) rec->entries[e->prev].next = e->next;
    else rec->head = e->next;
    if (e->next >= 0) rec->entries[e->next].prev = e->prev;
    else rec->tail = e->prev;
}

static void push_front(record *rec, int32_t i) {
    entry *e = &rec->entries[i];
    e->prev = -1;
    e->next = rec->head;
    if (rec->head >= 0) rec->entries[rec->head].prev = i;
    rec->head = i;
    if (rec->tail < 0) rec->tail = i;
}

/* Makes h the most recent hash of the record, evicting the least recent one when it is full. */
static void touch(record *rec, cv_block_hash h) {
    int32_t i = cv_hash_index_get(&rec->index, h);
    if (i >= 0) {
        unlink_entry(rec, i);
    } else {
        if (rec->n < rec->cap) {
            i = rec->n++;
        } else {
            i = rec->tail;
            unlink_entry(rec, i);
            cv_hash_index_del(&rec->index, rec->entries[i].hash);
        }
        rec->entries[i].hash = h;
        cv_hash_index_put(&rec->index, h, i);
    }
    push_front(rec, i);
}

int32_t cv_router_match(const cv_router *r, int replica, const cv_block_hash *hashes, int32_t n) {
    const record *rec = &r->records[replica];
    int32_t m = 0;
    while (m < n && cv_hash_index_get(&rec->index, hashes[m]) >= 0) m++;
    return m;
}

static bool less_loaded(const cv_replica_load *a, const cv_replica_load *b) {
    if (a->requests != b->requests) return a->requests < b->requests;
    return a->kv_cache_usage < b->kv_cache_usage;
}

static bool overloaded(const cv_replica_load *holder, const cv_replica_load *least) {
    return holder->requests > least->requests + BALANCE_ABS &&
           (double)holder->requests > BALANCE_REL * (double)least->requests;
}

int cv_router_route(cv_router *r, const cv_block_hash *hashes, int32_t n, const cv_replica_load *loads) {
    int least = 0, best = 0;
    int32_t best_match = cv_router_match(r, 0, hashes, n);
    for (int i = 1; i < r->n_replicas; i++) {
        if (less_loaded(&loads[i], &loads[least])) least = i;
        int32_t m = cv_router_match(r, i, hashes, n);
        if (m > best_match || (m == best_match && less_loaded(&loads[i], &loads[best]))) {
            best = i;
            best_match = m;
        }
    }
    int chosen = best_match > 0 && !overloaded(&loads[best], &loads[least]) ? best : least;
    /* Last block first, so that the record evicts a prompt's tail before its head, as the engine does. */
    for (int32_t b = n - 1; b >= 0; b--) touch(&r->records[chosen], hashes[b]);
    return chosen;
}
