/*
 * state_pool.c — see state_pool.h.
 */
#include "engine/state_pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

size_t cv_state_pool_bytes(size_t state_bytes, int32_t n_running, int32_t spec_per_seq, int32_t n_ckpt) {
    size_t slots = (size_t)n_running * (1 + (size_t)spec_per_seq) + (size_t)n_ckpt;
    return slots * cv_runner_state_slot_bytes(state_bytes);
}

void cv_state_pool_init(cv_state_pool *p, int32_t n_running, int32_t spec_per_seq, int32_t n_ckpt) {
    memset(p, 0, sizeof *p);
    p->n_running = n_running;
    p->spec_per_seq = spec_per_seq;
    p->spec_base = n_running;
    p->ckpt_base = n_running * (1 + spec_per_seq);
    p->n_ckpt = n_ckpt;
    p->num_slots = p->ckpt_base + n_ckpt;
    p->free_running = cv_xmalloc((size_t)n_running * sizeof *p->free_running);
    for (int32_t i = 0; i < n_running; i++) p->free_running[i] = n_running - 1 - i;
    p->n_free_running = n_running;
    cv_hash_index_init(&p->ckpt_index, (size_t)n_ckpt);
    p->ckpt_hash = cv_xcalloc((size_t)n_ckpt + 1, sizeof *p->ckpt_hash);
    p->lru_prev = cv_xmalloc(((size_t)n_ckpt + 1) * sizeof *p->lru_prev);
    p->lru_next = cv_xmalloc(((size_t)n_ckpt + 1) * sizeof *p->lru_next);
    p->lru_head = p->lru_tail = -1;
}

void cv_state_pool_free(cv_state_pool *p) {
    free(p->copies);
    free(p->free_running);
    cv_hash_index_free(&p->ckpt_index);
    free(p->ckpt_hash);
    free(p->lru_prev);
    free(p->lru_next);
    memset(p, 0, sizeof *p);
}

int32_t cv_state_pool_acquire(cv_state_pool *p) {
    return p->n_free_running > 0 ? p->free_running[--p->n_free_running] : -1;
}

void cv_state_pool_release(cv_state_pool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_running && p->n_free_running < p->n_running);
    p->free_running[p->n_free_running++] = slot;
}

int32_t cv_state_pool_spec_slot(const cv_state_pool *p, int32_t running_slot, int32_t i) {
    assert(running_slot >= 0 && running_slot < p->n_running && i >= 0 && i < p->spec_per_seq);
    return p->spec_base + running_slot * p->spec_per_seq + i;
}

void cv_state_pool_copy(cv_state_pool *p, int32_t dst, int32_t src) {
    assert(dst >= 0 && src >= 0 && dst < p->num_slots && src < p->num_slots);
    if (dst == src) return;
    if (p->n_copies == p->cap_copies) {
        p->cap_copies = p->cap_copies ? 2 * p->cap_copies : 16;
        p->copies = cv_xrealloc(p->copies, (size_t)p->cap_copies * sizeof *p->copies);
    }
    p->copies[p->n_copies++] = (cv_state_copy){dst, src};
}

const cv_state_copy *cv_state_pool_copies(const cv_state_pool *p, int32_t *n) {
    *n = p->n_copies;
    return p->copies;
}

void cv_state_pool_copies_done(cv_state_pool *p) { p->n_copies = 0; }

static void lru_unlink(cv_state_pool *p, int32_t c) {
    if (p->lru_prev[c] >= 0) p->lru_next[p->lru_prev[c]] = p->lru_next[c];
    else p->lru_head = p->lru_next[c];
    if (p->lru_next[c] >= 0) p->lru_prev[p->lru_next[c]] = p->lru_prev[c];
    else p->lru_tail = p->lru_prev[c];
}

static void lru_append(cv_state_pool *p, int32_t c) {
    p->lru_prev[c] = p->lru_tail;
    p->lru_next[c] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = c;
    else p->lru_head = c;
    p->lru_tail = c;
}

bool cv_state_pool_has(const cv_state_pool *p, cv_block_hash h) {
    return p->n_ckpt > 0 && cv_hash_index_get(&p->ckpt_index, h) >= 0;
}

int32_t cv_state_pool_find(cv_state_pool *p, cv_block_hash h) {
    if (p->n_ckpt == 0) return -1;
    int32_t c = cv_hash_index_get(&p->ckpt_index, h);
    if (c < 0) return -1;
    lru_unlink(p, c);
    lru_append(p, c);
    return p->ckpt_base + c;
}

int32_t cv_state_pool_checkpoint(cv_state_pool *p, cv_block_hash h) {
    if (p->n_ckpt == 0) return -1;
    assert(!cv_state_pool_has(p, h));
    int32_t c;
    if (p->n_ckpt_used < p->n_ckpt) {
        c = p->n_ckpt_used++;
    } else {
        c = p->lru_head;
        lru_unlink(p, c);
        if (cv_hash_index_get(&p->ckpt_index, p->ckpt_hash[c]) == c) cv_hash_index_del(&p->ckpt_index, p->ckpt_hash[c]);
    }
    p->ckpt_hash[c] = h;
    cv_hash_index_put(&p->ckpt_index, h, c);
    lru_append(p, c);
    return p->ckpt_base + c;
}

void cv_state_pool_forget(cv_state_pool *p, cv_block_hash h) {
    if (p->n_ckpt == 0) return;
    int32_t c = cv_hash_index_get(&p->ckpt_index, h);
    if (c < 0) return;
    cv_hash_index_del(&p->ckpt_index, h);
    lru_unlink(p, c);
    /* The entry stays allocated but unindexed at the LRU head, so it is the next one reused. */
    p->lru_prev[c] = -1;
    p->lru_next[c] = p->lru_head;
    if (p->lru_head >= 0) p->lru_prev[p->lru_head] = c;
    else p->lru_tail = c;
    p->lru_head = c;
    p->ckpt_hash[c] = (cv_block_hash){0, 0};
}
