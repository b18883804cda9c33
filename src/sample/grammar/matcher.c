/*
 * matcher.c — the byte-level pushdown automaton and the per-sequence matcher.
 *
 * A matcher's position is a set of stacks (grammar_internal.h): the grammar is nondeterministic, so
 * every way of reading the input so far that can still continue is kept, as llama.cpp's grammar
 * stacks do, but over bytes. One step (cv_gstep_byte) keeps the stacks whose top byte set holds the
 * byte, moves each past it, and closes the result: an alternative that ended returns to the node
 * below, a rule reference expands into the rule's alternatives (its return node pushed unless the
 * reference is last in its alternative — a tail call, so x* and right recursion do not grow the
 * stack), until every stack's top is a byte set again or the stack is empty (the input is a whole
 * sentence: `accept`). Each (rule, return node) pair expands once per step, which both deduplicates
 * and ends cycles through empty rules (x* with x nullable); ebnf.c refuses the cycles that would
 * push forever. Stacks are interned nodes, so deduplication is sorting node ids.
 *
 * The matcher keeps one state per accepted token or byte string (its stacks, whether it accepts,
 * whether eos came), so rollback is truncation. Nodes stay in the pool after a rollback; they are few
 * per token and reused when the same stacks come back.
 *
 * End of sequence: an eos id is accepted only when the input is a whole sentence; after it the
 * matcher accepts nothing, and can_end turns false with it, so that "eos may come next" stays exactly
 * "can_end" for the mask (grammar.h: eos bits are set iff can_end).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "sample/grammar/grammar_internal.h"

/* ---- the node pool ------------------------------------------------------------------------------- */

/* A pool grown past this many nodes (by one large mask walk) is freed, not kept, when cleared. */
#define POOL_KEEP_NODES (1u << 14)

static uint32_t node_hash(uint32_t pos, uint32_t parent) {
    uint64_t k = ((uint64_t)pos << 32 | parent) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32);
}

static void pool_rehash(cv_gpool *p, uint32_t n_slots) {
    free(p->slots);
    p->slots = cv_xcalloc(n_slots, sizeof *p->slots);
    p->slot_mask = n_slots - 1;
    for (uint32_t id = 0; id < p->n; id++) {
        uint32_t h = node_hash(p->pos[id], p->parent[id]) & p->slot_mask;
        while (p->slots[h]) h = (h + 1) & p->slot_mask;
        p->slots[h] = id + 1;
    }
}

uint32_t cv_gpool_intern(cv_gpool *p, uint32_t pos, uint32_t parent) {
    if (!p->slots || (uint64_t)(p->n + 1) * 2 > (uint64_t)p->slot_mask + 1)
        pool_rehash(p, p->slots ? (p->slot_mask + 1) * 2 : 256);
    uint32_t h = node_hash(pos, parent) & p->slot_mask;
    for (uint32_t s; (s = p->slots[h]) != 0; h = (h + 1) & p->slot_mask)
        if (p->pos[s - 1] == pos && p->parent[s - 1] == parent) return s - 1;
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 256;
        p->pos = cv_xrealloc(p->pos, p->cap * sizeof *p->pos);
        p->parent = cv_xrealloc(p->parent, p->cap * sizeof *p->parent);
    }
    uint32_t id = p->n++;
    p->pos[id] = pos;
    p->parent[id] = parent;
    p->slots[h] = id + 1;
    return id;
}

void cv_gpool_clear(cv_gpool *p) {
    if (p->cap > POOL_KEEP_NODES) {
        cv_gpool_free(p);
        return;
    }
    p->n = 0;
    if (p->slots) memset(p->slots, 0, ((size_t)p->slot_mask + 1) * sizeof *p->slots);
}

void cv_gpool_free(cv_gpool *p) {
    free(p->pos);
    free(p->parent);
    free(p->slots);
    *p = (cv_gpool){0};
}

/* ---- one step ------------------------------------------------------------------------------------ */

void cv_gstep_free(cv_gstep *st) {
    free(st->work);
    free(st->out);
    free(st->seen);
    free(st->seen_gen);
    *st = (cv_gstep){0};
}

static void work_push(cv_gstep *st, uint32_t pos, uint32_t ret) {
    if (st->n_work + 2 > st->cap_work) {
        st->cap_work = st->cap_work ? st->cap_work * 2 : 64;
        st->work = cv_xrealloc(st->work, st->cap_work * sizeof *st->work);
    }
    st->work[st->n_work++] = pos;
    st->work[st->n_work++] = ret;
}

static void out_push(cv_gstep *st, uint32_t node) {
    if (st->n_out == st->cap_out) {
        st->cap_out = st->cap_out ? st->cap_out * 2 : 64;
        st->out = cv_xrealloc(st->out, st->cap_out * sizeof *st->out);
    }
    st->out[st->n_out++] = node;
}

static uint32_t seen_hash(uint64_t key) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32);
}

static void seen_grow(cv_gstep *st) {
    uint32_t old_n = st->seen ? st->seen_mask + 1 : 0;
    uint64_t *old = st->seen;
    uint32_t *old_gen = st->seen_gen;
    uint32_t n_slots = old_n ? old_n * 2 : 64;
    st->seen = cv_xmalloc(n_slots * sizeof *st->seen);
    st->seen_gen = cv_xcalloc(n_slots, sizeof *st->seen_gen);
    st->seen_mask = n_slots - 1;
    for (uint32_t k = 0; k < old_n; k++) {
        if (old_gen[k] != st->gen) continue;
        uint32_t h = seen_hash(old[k]) & st->seen_mask;
        while (st->seen_gen[h] == st->gen) h = (h + 1) & st->seen_mask;
        st->seen[h] = old[k];
        st->seen_gen[h] = st->gen;
    }
    free(old);
    free(old_gen);
}

/* True the first time (rule, ret) is expanded in this step. */
static bool seen_insert(cv_gstep *st, uint32_t rule, uint32_t ret) {
    if (!st->seen || (uint64_t)(st->n_seen + 1) * 2 > (uint64_t)st->seen_mask + 1) seen_grow(st);
    uint64_t key = (uint64_t)rule << 32 | ret;
    uint32_t h = seen_hash(key) & st->seen_mask;
    for (; st->seen_gen[h] == st->gen; h = (h + 1) & st->seen_mask)
        if (st->seen[h] == key) return false;
    st->seen[h] = key;
    st->seen_gen[h] = st->gen;
    st->n_seen++;
    return true;
}

static void step_reset(cv_gstep *st) {
    st->n_work = st->n_out = 0;
    st->accept = false;
    st->n_seen = 0;
    if (++st->gen == 0) {  /* stamps wrapped: forget them all */
        if (st->seen_gen) memset(st->seen_gen, 0, ((size_t)st->seen_mask + 1) * sizeof *st->seen_gen);
        st->gen = 1;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Runs the pending work to byte-set tops; false when the stacks or the expansions pass their limit. */
static bool closure(const cv_grammar *g, cv_gpool *p, cv_gstep *st) {
    const uint64_t max_seen = (uint64_t)g->n_rules + CV_GRAMMAR_MAX_EXPANSIONS;
    while (st->n_work && st->n_seen <= max_seen) {
        uint32_t ret = st->work[--st->n_work];
        uint32_t pos = st->work[--st->n_work];
        for (;;) {
            uint32_t e = g->elems[pos];
            if (CV_GE_KIND(e) == CV_GE_BYTES) {
                out_push(st, cv_gpool_intern(p, pos, ret));
                break;
            }
            if (CV_GE_KIND(e) == CV_GE_END) {
                if (ret == CV_GNIL) {
                    st->accept = true;
                    break;
                }
                pos = p->pos[ret];
                ret = p->parent[ret];
                continue;
            }
            uint32_t r = CV_GE_ARG(e);
            uint32_t r_ret = CV_GE_KIND(g->elems[pos + 1]) == CV_GE_END ? ret : cv_gpool_intern(p, pos + 1, ret);
            if (seen_insert(st, r, r_ret))
                for (uint32_t a = g->rule_alt[r + 1]; a-- > g->rule_alt[r];) work_push(st, g->alt_start[a], r_ret);
            break;
        }
        /* Duplicates are bounded by the distinct expansions, but not small: stop early. */
        if (st->n_out > 8 * (size_t)CV_GRAMMAR_MAX_STACKS) break;
    }
    if (st->n_out <= 16) {
        for (size_t i = 1; i < st->n_out; i++) {
            uint32_t x = st->out[i];
            size_t j = i;
            for (; j && st->out[j - 1] > x; j--) st->out[j] = st->out[j - 1];
            st->out[j] = x;
        }
    } else {
        qsort(st->out, st->n_out, sizeof *st->out, cmp_u32);
    }
    size_t n = 0;
    for (size_t i = 0; i < st->n_out; i++)
        if (!n || st->out[n - 1] != st->out[i]) st->out[n++] = st->out[i];
    st->n_out = n;
    if (n > CV_GRAMMAR_MAX_STACKS || st->n_work) {
        st->n_out = st->n_work = 0;
        st->accept = false;
        return false;
    }
    return true;
}

bool cv_gstep_start(const cv_grammar *g, cv_gpool *p, cv_gstep *st) {
    step_reset(st);
    for (uint32_t a = g->rule_alt[g->root + 1]; a-- > g->rule_alt[g->root];) work_push(st, g->alt_start[a], CV_GNIL);
    return closure(g, p, st);
}

bool cv_gstep_byte(const cv_grammar *g, cv_gpool *p, cv_gstep *st, const uint32_t *tops, size_t n, uint8_t b) {
    step_reset(st);
    for (size_t i = n; i-- > 0;) {
        uint32_t pos = p->pos[tops[i]];
        if (cv_byteset_has(&g->sets[CV_GE_ARG(g->elems[pos])], b)) work_push(st, pos + 1, p->parent[tops[i]]);
    }
    return closure(g, p, st);
}

/* ---- the matcher -------------------------------------------------------------------------------- */

static cv_mstate *current(const cv_matcher *m) {
    return &m->hist[m->n_hist - 1];
}

/* Appends a state; tops must not point into m->tops. */
static void push_state(cv_matcher *m, const uint32_t *tops, size_t n, uint32_t flags) {
    if (m->n_tops + n > m->cap_tops) {
        while (m->n_tops + n > m->cap_tops) m->cap_tops = m->cap_tops ? m->cap_tops * 2 : 64;
        m->tops = cv_xrealloc(m->tops, m->cap_tops * sizeof *m->tops);
    }
    if (m->n_hist == m->cap_hist) {
        m->cap_hist = m->cap_hist ? m->cap_hist * 2 : 64;
        m->hist = cv_xrealloc(m->hist, m->cap_hist * sizeof *m->hist);
    }
    if (n) memcpy(m->tops + m->n_tops, tops, n * sizeof *tops);
    m->hist[m->n_hist++] = (cv_mstate){.off = (uint32_t)m->n_tops, .n = (uint32_t)n, .flags = flags};
    m->n_tops += n;
}

static uint32_t *scratch(cv_matcher *m, size_t n) {
    if (n > m->cap_scratch) {
        m->cap_scratch = n > 2 * m->cap_scratch ? n : 2 * m->cap_scratch;
        m->scratch = cv_xrealloc(m->scratch, m->cap_scratch * sizeof *m->scratch);
    }
    return m->scratch;
}

cv_matcher *cv_matcher_new(const cv_grammar *g) {
    cv_matcher *m = cv_xcalloc(1, sizeof *m);
    m->g = g;
    const bool fits = cv_gstep_start(g, &m->pool, &m->step);
    assert(fits && "cv_grammar_parse refuses a grammar whose start does not fit");
    (void)fits;
    push_state(m, m->step.out, m->step.n_out, m->step.accept ? CV_MS_ACCEPT : 0);
    return m;
}

void cv_matcher_free(cv_matcher *m) {
    if (!m) return;
    cv_gpool_free(&m->pool);
    cv_gstep_free(&m->step);
    free(m->tops);
    free(m->hist);
    free(m->scratch);
    cv_mask_walk_free(m->walk);
    free(m);
}

/* Advances through bytes; pushes the new state and returns true, or changes nothing. */
static bool advance(cv_matcher *m, const uint8_t *bytes, size_t n) {
    const cv_mstate *cur = current(m);
    if (cur->flags & CV_MS_EOS) return false;
    if (n == 0) {
        uint32_t *copy = scratch(m, cur->n + 1);
        if (cur->n) memcpy(copy, m->tops + cur->off, cur->n * sizeof *copy);
        push_state(m, copy, cur->n, cur->flags);
        return true;
    }
    const uint32_t *tops = cur->n ? m->tops + cur->off : NULL; /* no stack ever stored: m->tops is NULL */
    size_t n_tops = cur->n;
    for (size_t i = 0; i < n; i++) {
        if (!cv_gstep_byte(m->g, &m->pool, &m->step, tops, n_tops, bytes[i])) return false;
        if (m->step.n_out == 0 && !m->step.accept) return false;
        if (i + 1 < n) {
            uint32_t *copy = scratch(m, m->step.n_out + 1);
            if (m->step.n_out) memcpy(copy, m->step.out, m->step.n_out * sizeof *copy);
            tops = copy;
            n_tops = m->step.n_out;
        }
    }
    push_state(m, m->step.out, m->step.n_out, m->step.accept ? CV_MS_ACCEPT : 0);
    return true;
}

bool cv_matcher_accept_bytes(cv_matcher *m, const void *bytes, size_t n) {
    return advance(m, bytes, n);
}

bool cv_matcher_accept_token(cv_matcher *m, int32_t token) {
    const cv_vocab *v = m->g->vocab;
    const cv_mstate *cur = current(m);
    if (!v || token < 0 || token >= v->size || (cur->flags & CV_MS_EOS)) return false;
    switch (v->kind[token]) {
    case CV_TOK_EOS:
        if (!(cur->flags & CV_MS_ACCEPT)) return false;
        push_state(m, NULL, 0, CV_MS_EOS);
        return true;
    case CV_TOK_BYTES:
        return advance(m, v->bytes + v->off[token], v->off[token + 1] - v->off[token]);
    default:
        return false;
    }
}

void cv_matcher_rollback(cv_matcher *m, size_t n) {
    assert(n < m->n_hist);
    m->n_hist -= n;
    m->n_tops = current(m)->off + current(m)->n;
}

size_t cv_matcher_history(const cv_matcher *m) {
    return m->n_hist - 1;
}

bool cv_matcher_can_end(const cv_matcher *m) {
    return current(m)->flags & CV_MS_ACCEPT;
}

bool cv_matcher_terminated(const cv_matcher *m) {
    const cv_mstate *cur = current(m);
    if (cur->flags & CV_MS_EOS) return true;
    if (!(cur->flags & CV_MS_ACCEPT)) return false;
    for (uint32_t i = 0; i < cur->n; i++) {
        const cv_byteset *s = &m->g->sets[CV_GE_ARG(m->g->elems[m->pool.pos[m->tops[cur->off + i]]])];
        for (int w = 0; w < 8; w++)
            if (s->w[w]) return false;
    }
    return true;
}
