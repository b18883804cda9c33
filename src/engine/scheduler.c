/*
 * scheduler.c — see scheduler.h for the policy.
 */
#include "engine/scheduler.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static void list_push(cv_seq_list *l, cv_seq *seq) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->items = cv_xrealloc(l->items, (size_t)l->cap * sizeof *l->items);
    }
    l->items[l->n++] = seq;
}

static void list_push_front(cv_seq_list *l, cv_seq *seq) {
    list_push(l, seq);
    memmove(l->items + 1, l->items, (size_t)(l->n - 1) * sizeof *l->items);
    l->items[0] = seq;
}

static void list_remove_at(cv_seq_list *l, int32_t i) {
    memmove(l->items + i, l->items + i + 1, (size_t)(l->n - i - 1) * sizeof *l->items);
    l->n--;
}

static int32_t list_find(const cv_seq_list *l, const cv_seq *seq) {
    for (int32_t i = 0; i < l->n; i++)
        if (l->items[i] == seq) return i;
    return -1;
}

/* vLLM's Request ordering under the priority policy: (priority, arrival), then completion index. */
static bool comes_before(const cv_seq *a, const cv_seq *b) {
    int32_t pa = a->req->params.priority, pb = b->req->params.priority;
    if (pa != pb) return pa < pb;
    if (a->req->id != b->req->id) return a->req->id < b->req->id;
    return a->index < b->index;
}

/* Puts seq into a list kept in comes_before order, after the sequences that come before it. */
static void list_insert_ordered(cv_seq_list *l, cv_seq *seq) {
    int32_t at = l->n;
    while (at > 0 && comes_before(seq, l->items[at - 1])) at--;
    list_push(l, seq);
    memmove(l->items + at + 1, l->items + at, (size_t)(l->n - 1 - at) * sizeof *l->items);
    l->items[at] = seq;
}

void cv_scheduler_init(cv_scheduler *s, cv_block_pool *pool, int32_t max_num_seqs,
                       int32_t max_num_batched_tokens, int32_t block_size, int32_t max_model_len,
                       bool enable_prefix_caching, bool priority_policy, cv_state_pool *states) {
    memset(s, 0, sizeof *s);
    s->enable_prefix_caching = enable_prefix_caching;
    s->priority_policy = priority_policy;
    s->states = states;
    s->pool = pool;
    s->max_num_seqs = max_num_seqs;
    s->max_num_batched_tokens = max_num_batched_tokens;
    s->block_size = block_size;
    s->max_model_len = max_model_len;
}

void cv_scheduler_free(cv_scheduler *s) {
    free(s->running.items);
    free(s->waiting.items);
}

void cv_schedule_free(cv_schedule *out) {
    free(out->seqs.items);
    free(out->preempted.items);
}

void cv_scheduler_add(cv_scheduler *s, cv_seq *seq) {
    seq->status = CV_SEQ_WAITING;
    if (s->priority_policy) list_insert_ordered(&s->waiting, seq);
    else list_push(&s->waiting, seq);
}

static void release_blocks(cv_scheduler *s, cv_seq *seq) {
    cv_block_pool_release(s->pool, seq->block_table, seq->n_blocks);
    seq->n_blocks = 0;
    seq->n_cached_blocks = 0;
}

void cv_scheduler_hash_blocks(const cv_scheduler *s, cv_seq *seq) {
    int32_t bs = s->block_size, full = (int32_t)(seq->n_tokens / (size_t)bs);
    if (full > seq->cap_block_hashes) {
        seq->cap_block_hashes = full * 2;
        seq->block_hashes = cv_xrealloc(seq->block_hashes, (size_t)seq->cap_block_hashes * sizeof *seq->block_hashes);
    }
    cv_block_hash_chain(seq->tokens, bs, seq->req->cache_salt, cv_request_lora_id(seq->req), seq->n_block_hashes, full, seq->block_hashes);
    if (full > seq->n_block_hashes) seq->n_block_hashes = full;
}

/* Top entries the prompt-logprob records of a sequence must hold, or -1 when it needs none: only
 * the first completion of a request computes its prompt logprobs. */
static int32_t prompt_logprobs_k(const cv_seq *seq) {
    return seq->index == 0 && cv_request_wants_prompt_logprobs(seq->req) ? seq->req->params.prompt_logprobs : -1;
}

/* Whether the prompt-logprob entries of rows of block b are all kept with its cached block, the
 * last row's included when that entry is a prompt entry (it is only kept for one next token). */
static bool block_rows_kept(const cv_scheduler *s, const cv_seq *seq, int32_t b, int32_t k) {
    const cv_block_logprobs *lp = cv_block_pool_logprobs(s->pool, seq->block_hashes[b], k);
    size_t next = (size_t)(b + 1) * (size_t)s->block_size;
    return lp && (next >= seq->req->n_prompt || lp->next_token == seq->tokens[next]);
}

/* A sequence that needs prompt logprobs may skip a cached prefix of `hits` blocks only if the
 * entries it has not recorded yet, up to the one of position hits·bs (from the prefix's last row,
 * never computed), are kept with those blocks; otherwise the prefix gets shorter. Entry 0 has no
 * distribution and needs nothing. */
static int32_t hits_with_logprobs(const cv_scheduler *s, const cv_seq *seq, int32_t hits, int32_t k) {
    size_t bs = (size_t)s->block_size, done = seq->req->n_prompt_logprobs_done, first = done ? done : 1;
    if (first > (size_t)hits * bs) return hits;
    int32_t b = (int32_t)((first - 1) / bs);
    while (b < hits && block_rows_kept(s, seq, b, k)) b++;
    return b;
}

/* Fills the prompt-logprob entries of positions [done, hits·bs] from the rows kept with the first
 * `hits` cached blocks (hits_with_logprobs made sure they are there). */
static void restore_prompt_logprobs(const cv_scheduler *s, cv_seq *seq, int32_t hits, int32_t k) {
    cv_request *req = seq->req;
    size_t bs = (size_t)s->block_size, end = (size_t)hits * bs + 1;
    if (end > req->n_prompt) end = req->n_prompt;
    if (req->n_prompt_logprobs_done == 0) {
        req->prompt_logprobs[0] = (cvllm_position_logprobs){.chosen = {req->prompt[0], 0.0f, 0}};
        req->n_prompt_logprobs_done = 1;
    }
    const cv_block_logprobs *lp = NULL;
    for (size_t p = req->n_prompt_logprobs_done; p < end; p++) {
        size_t row = p - 1;
        if (!lp || row % bs == 0) lp = cv_block_pool_logprobs(s->pool, seq->block_hashes[row / bs], k);
        const cvllm_logprob *e = lp->rows + (row % bs) * (size_t)(1 + lp->k);
        cvllm_logprob *top = k ? cv_xmalloc((size_t)k * sizeof *top) : NULL;
        if (k) memcpy(top, e + 1, (size_t)k * sizeof *top);
        req->prompt_logprobs[p] = (cvllm_position_logprobs){.chosen = e[0], .top = top, .n_top = k};
    }
    if (end > req->n_prompt_logprobs_done) req->n_prompt_logprobs_done = end;
}

/* Keeps the prompt-logprob entries of the rows of block b (a block of the prompt) with its cached
 * block, once they are all recorded. */
static void keep_block_logprobs(cv_scheduler *s, const cv_seq *seq, int32_t b, int32_t k) {
    const cv_request *req = seq->req;
    size_t bs = (size_t)s->block_size, first = (size_t)b * bs, next = first + bs, stride = 1 + (size_t)k;
    size_t last_entry = next < req->n_prompt ? next : req->n_prompt - 1;
    if (next > req->n_prompt || req->n_prompt_logprobs_done <= last_entry ||
        cv_block_pool_logprobs(s->pool, seq->block_hashes[b], k))
        return;
    cv_block_logprobs *lp = cv_xcalloc(1, sizeof *lp + bs * stride * sizeof(cvllm_logprob));
    lp->k = k;
    lp->next_token = next < req->n_prompt ? req->prompt[next] : -1;
    for (size_t p = first + 1; p <= last_entry; p++) {
        const cvllm_position_logprobs *src = &req->prompt_logprobs[p];
        cvllm_logprob *dst = lp->rows + (p - 1 - first) * stride;
        dst[0] = src->chosen;
        if (src->n_top) memcpy(dst + 1, src->top, (size_t)src->n_top * sizeof *dst);
    }
    cv_block_pool_keep_logprobs(s->pool, seq->block_hashes[b], lp);
}

/* Takes the longest cached prefix of a sequence that has nothing computed; returns its tokens. */
static size_t take_cached_prefix(cv_scheduler *s, cv_seq *seq) {
    if (!s->enable_prefix_caching) return 0;
    assert(seq->num_computed == 0 && seq->n_blocks == 0);
    cv_scheduler_hash_blocks(s, seq);
    int32_t usable = (int32_t)((seq->n_tokens - 1) / (size_t)s->block_size), hits = 0;
    while (hits < usable && hits < seq->n_block_hashes && cv_block_pool_lookup(s->pool, seq->block_hashes[hits]) >= 0)
        hits++;
    int32_t k = prompt_logprobs_k(seq);
    if (k >= 0) hits = hits_with_logprobs(s, seq, hits, k);
    /* With recurrent state, the hit ends at the last block whose state was checkpointed. */
    if (s->states) {
        while (hits > 0 && !cv_state_pool_has(s->states, seq->block_hashes[hits - 1])) hits--;
        if (hits > 0) seq->restore_slot = cv_state_pool_find(s->states, seq->block_hashes[hits - 1]);
    }
    for (int32_t b = 0; b < hits; b++) {
        int32_t id = cv_block_pool_lookup(s->pool, seq->block_hashes[b]);
        cv_block_pool_touch(s->pool, id);
        cv_seq_add_blocks(seq, &id, 1);
    }
    if (k >= 0 && hits > 0) restore_prompt_logprobs(s, seq, hits, k);
    seq->n_cached_blocks = hits;
    seq->num_computed = (size_t)hits * (size_t)s->block_size;
    return seq->num_computed;
}

void cv_scheduler_cache_full_blocks(cv_scheduler *s, cv_seq *seq, size_t n_computed) {
    if (!s->enable_prefix_caching) return;
    int32_t computed_full = (int32_t)(n_computed / (size_t)s->block_size);
    if (computed_full <= seq->n_cached_blocks) return;
    cv_scheduler_hash_blocks(s, seq);
    int32_t k = prompt_logprobs_k(seq);
    for (int32_t b = seq->n_cached_blocks; b < computed_full; b++) {
        cv_block_pool_cache(s->pool, seq->block_table[b], seq->block_hashes[b]);
        if (k >= 0) keep_block_logprobs(s, seq, b, k);
    }
    seq->n_cached_blocks = computed_full;
}

static void preempt(cv_scheduler *s, cv_seq *seq) {
    release_blocks(s, seq);
    seq->num_computed = 0;
    seq->num_scheduled = 0;
    seq->n_draft = 0;
    seq->num_preemptions++;
    seq->status = CV_SEQ_WAITING;
    if (s->priority_policy) list_insert_ordered(&s->waiting, seq);
    else list_push_front(&s->waiting, seq);
    s->num_preemptions++;
}

/* Tokens the sequence still needs, limited by the budget; draft tokens are dropped first. */
static int32_t tokens_wanted(const cv_scheduler *s, cv_seq *seq, int32_t budget) {
    size_t remaining = seq->n_tokens - seq->num_computed;
    if (remaining > (size_t)budget) remaining = (size_t)budget;
    int32_t room = budget - (int32_t)remaining;
    if (seq->n_draft > room) seq->n_draft = room;
    return (int32_t)remaining + seq->n_draft;
}

static bool grow_blocks(cv_scheduler *s, cv_seq *seq, int32_t n_tokens) {
    return cv_scheduler_reserve(s, seq, seq->num_computed + (size_t)n_tokens);
}

/* Index in s->running of the sequence to preempt (see scheduler.h). */
static int32_t victim_index(const cv_scheduler *s) {
    int32_t v = s->running.n - 1;
    if (s->priority_policy)
        for (int32_t i = 0; i < s->running.n; i++)
            if (comes_before(s->running.items[v], s->running.items[i])) v = i;
    return v;
}

/* Takes a sequence that was given tokens earlier in this step back out of the schedule. */
static void unschedule(cv_schedule *out, cv_seq *seq, int32_t *budget) {
    int32_t i = list_find(&out->seqs, seq);
    if (i < 0) return;
    list_remove_at(&out->seqs, i);
    out->total_tokens -= seq->num_scheduled;
    *budget += seq->num_scheduled;
}

static void schedule_running(cv_scheduler *s, cv_schedule *out, int32_t *budget) {
    for (int32_t i = 0; i < s->running.n && *budget > 0; i++) {
        cv_seq *seq = s->running.items[i];
        int32_t n = tokens_wanted(s, seq, *budget);
        if (n == 0) continue;
        bool scheduled = false;
        while (!scheduled) {
            if (grow_blocks(s, seq, n)) {
                scheduled = true;
                break;
            }
            /* Out of blocks: preempt the policy's victim (possibly this one) and try again. */
            int32_t v = victim_index(s);
            cv_seq *victim = s->running.items[v];
            list_remove_at(&s->running, v);
            if (v < i) i--;
            unschedule(out, victim, budget);
            preempt(s, victim);
            list_push(&out->preempted, victim);
            if (victim == seq) break;
        }
        if (!scheduled) break;
        seq->num_scheduled = n;
        list_push(&out->seqs, seq);
        out->total_tokens += n;
        *budget -= n;
    }
}

/* The distinct adapters of the running sequences into active (room for running.n); their count. */
static int32_t running_loras(const cv_scheduler *s, int32_t *active) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->running.n; i++) {
        const int32_t l = cv_request_lora_id(s->running.items[i]->req);
        bool seen = l == 0;
        for (int32_t j = 0; j < n && !seen; j++) seen = active[j] == l;
        if (!seen) active[n++] = l;
    }
    return n;
}

/* Whether adapter `lora` may run beside the active ones (within max_loras); if so it is active. */
static bool lora_fits(const cv_scheduler *s, int32_t *active, int32_t *n_active, int32_t lora) {
    if (!lora) return true;
    for (int32_t j = 0; j < *n_active; j++)
        if (active[j] == lora) return true;
    if (*n_active >= s->max_loras) return false;
    active[(*n_active)++] = lora;
    return true;
}

static void schedule_waiting(cv_scheduler *s, cv_schedule *out, int32_t *budget) {
    int32_t *active = s->max_loras ? cv_xmalloc(((size_t)s->running.n + (size_t)s->max_loras) * sizeof *active) : NULL;
    int32_t n_active = active ? running_loras(s, active) : 0;
    int32_t at = 0; /* the waiting sequences before it wait for their adapter */
    while (at < s->waiting.n && *budget > 0 && s->running.n < s->max_num_seqs) {
        cv_seq *seq = s->waiting.items[at];
        if (active && !lora_fits(s, active, &n_active, cv_request_lora_id(seq->req))) {
            at++;
            continue;
        }
        size_t hit = take_cached_prefix(s, seq);
        int32_t n = tokens_wanted(s, seq, *budget);
        assert(n > 0);
        if (!grow_blocks(s, seq, n)) {
            release_blocks(s, seq); /* give the cached blocks back; they keep their hashes */
            seq->num_computed = 0;
            seq->restore_slot = -1;
            break;
        }
        if (s->enable_prefix_caching) {
            s->prefix_queries += seq->n_tokens;
            s->prefix_hits += hit;
        }
        cv_request *req = seq->req;
        if (seq->index == 0 && !req->admitted) {
            req->n_cached_tokens = hit;
            req->admitted = true;
        }
        list_remove_at(&s->waiting, at);
        seq->status = CV_SEQ_RUNNING;
        list_push(&s->running, seq);
        seq->num_scheduled = n;
        list_push(&out->seqs, seq);
        out->total_tokens += n;
        *budget -= n;
    }
    free(active);
}

void cv_scheduler_schedule(cv_scheduler *s, cv_schedule *out) {
    out->seqs.n = 0;
    out->total_tokens = 0;
    out->preempted.n = 0;
    for (int32_t i = 0; i < s->running.n; i++) s->running.items[i]->num_scheduled = 0;
    int32_t budget = s->max_num_batched_tokens;
    schedule_running(s, out, &budget);
    if (out->preempted.n == 0) schedule_waiting(s, out, &budget);
}

void cv_scheduler_finish(cv_scheduler *s, cv_seq *seq) {
    int32_t i = list_find(&s->running, seq);
    if (i >= 0) list_remove_at(&s->running, i);
    i = list_find(&s->waiting, seq);
    if (i >= 0) list_remove_at(&s->waiting, i);
    release_blocks(s, seq);
    seq->status = CV_SEQ_FINISHED;
}

int32_t cv_scheduler_num_running(const cv_scheduler *s) { return s->running.n; }
int32_t cv_scheduler_num_waiting(const cv_scheduler *s) { return s->waiting.n; }

bool cv_scheduler_reserve(cv_scheduler *s, cv_seq *seq, size_t n_positions) {
    int32_t need = cv_seq_blocks_needed(seq, n_positions, s->block_size);
    if (need == 0) return true;
    int32_t ids[need];
    if (!cv_block_pool_allocate(s->pool, need, ids)) return false;
    cv_seq_add_blocks(seq, ids, need);
    return true;
}
