/*
 * mask.c — which tokens may come next: a walk of the vocabulary trie from the matcher's state, and a
 * cache of the results in the grammar.
 *
 * The walk. Depth-first over the trie (a forward scan of vocab.c's preorder array), carrying the set
 * of stacks reached by each node's byte path; a node whose set dies is skipped with its subtree, and
 * a node that ends a token with a live set allows that token. The sets are the states of a
 * deterministic automaton built lazily by the walks: each distinct stack set is interned once (a
 * "walk state"), and a state's transitions are remembered in its 256-entry row. Inside a
 * JSON string almost every byte leads back to the same set, so the walk over ~all of Qwen3's trie
 * costs one row lookup per node, and only the few hundred distinct (state, byte) pairs run the real
 * step of matcher.c. The walk's stacks live in a pool of its own, seeded from the matcher's stacks.
 * This automaton stays in the matcher from one mask to the next, because the next walk revisits most
 * of it: in a bounded string (char{0,40}: a chain of optional rules) every position is a new state,
 * but the walk from position k has already built the states for k+1, k+2, ..., so only the first
 * walk in a string pays for them. It is forgotten once it passes WALK_KEEP_STATES states (~1 MiB of
 * rows) or WALK_KEEP_NODES stack nodes. Only the first ROW_CAP states have rows; later ones (only an
 * adversarial grammar makes that many) compute their transitions each time, so memory stays bounded
 * while the answer stays exact.
 *
 * The budget. A grammar whose stacks depend on every byte read (a palindrome: each byte pushes its
 * own return) makes every trie node a new state, ~330,000 real steps of ~60 stacks: seconds per
 * mask. So a walk stops after WALK_BUDGET stacks stepped (~10 ms); the grammars the converters make
 * need a few percent of it. A stopped walk's mask holds the tokens verified so far, a subset of the
 * allowed ones: the output stays valid, and progress stays possible because the single-byte tokens
 * (all 256 bytes in a byte-level vocabulary) are checked first. Such masks are exact for the tokens
 * they allow, not for the ones they leave out; the cache counts them ("stopped").
 *
 * The cache. Masks are stored in the grammar keyed by the matcher's exact state: its flags and its
 * stacks, each written out as positions from top to bottom and sorted (node ids are per matcher, the
 * positions are not), hashed with XXH3 and compared in full. It is shared by every matcher of the
 * grammar under one mutex, held only for the lookup (and the copy out) and the insertion. Entries are
 * stored as whichever is smallest of the allowed ids, the rejected ids or the bitmap, and evicted
 * least-recently-used beyond CACHE_BYTES per grammar.
 */
#define _GNU_SOURCE /* qsort_r */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/error.h"
#include "sample/grammar/grammar_internal.h"

#define CACHE_BYTES ((size_t)32 << 20) /* per grammar */
#define ROW_CAP 4096u                 /* walk states with a transition row (at most 4 MiB) */
#define WALK_KEEP_STATES 1024u        /* walk states kept between masks (rows: 1 KiB each) */
#define WALK_KEEP_NODES 65536u        /* and their stack nodes */
#define WALK_BUDGET 250000u           /* stacks stepped per walk (a JSON grammar's walks: < 15,000) */
#define DEAD 0u                       /* walk state 0: no stacks, not accepting */

/* ---- the cache ----------------------------------------------------------------------------------- */

enum { ENC_ALLOWED, ENC_REJECTED, ENC_BITMAP };

typedef struct centry {
    struct centry *chain, *prev, *next;  /* bucket chain; LRU list, most recent first */
    uint64_t hash;
    uint32_t key_len, enc, data_len;
    uint32_t words[];                    /* the key, then the data */
} centry;

struct cv_mask_cache {
    pthread_mutex_t mu;
    centry **buckets;
    size_t n_buckets, n_entries, bytes;
    size_t limit;                        /* bytes; CACHE_BYTES unless a test sets it */
    uint64_t hits, misses, evictions, stopped;
    centry lru;                          /* sentinel (last: its type ends in a flexible array) */
};

cv_mask_cache *cv_mask_cache_new(void) {
    cv_mask_cache *c = cv_xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->n_buckets = 256;
    c->buckets = cv_xcalloc(c->n_buckets, sizeof *c->buckets);
    c->lru.prev = c->lru.next = &c->lru;
    c->limit = CACHE_BYTES;
    return c;
}

void cv_mask_cache_free(cv_mask_cache *c) {
    if (!c) return;
    for (centry *e = c->lru.next, *next; e != &c->lru; e = next) {
        next = e->next;
        free(e);
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void cv_grammar_cache_stats(const cv_grammar *g, cv_mask_cache_stats *out) {
    *out = (cv_mask_cache_stats){0};
    cv_mask_cache *c = g->cache;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    *out = (cv_mask_cache_stats){.hits = c->hits, .misses = c->misses, .evictions = c->evictions,
                                 .stopped = c->stopped, .entries = c->n_entries, .bytes = c->bytes};
    pthread_mutex_unlock(&c->mu);
}

void cv_grammar_set_cache_limit(const cv_grammar *g, size_t bytes) {
    assert(g->cache);
    pthread_mutex_lock(&g->cache->mu);
    g->cache->limit = bytes;
    pthread_mutex_unlock(&g->cache->mu);
}

static void lru_unlink(centry *e) {
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void lru_front(cv_mask_cache *c, centry *e) {
    e->next = c->lru.next;
    e->prev = &c->lru;
    c->lru.next->prev = e;
    c->lru.next = e;
}

static centry **find(cv_mask_cache *c, const uint32_t *key, uint32_t key_len, uint64_t hash) {
    centry **at = &c->buckets[hash & (c->n_buckets - 1)];
    for (; *at; at = &(*at)->chain)
        if ((*at)->hash == hash && (*at)->key_len == key_len && memcmp((*at)->words, key, key_len * sizeof *key) == 0)
            break;
    return at;
}

static size_t entry_bytes(const centry *e) {
    return sizeof *e + ((size_t)e->key_len + e->data_len) * sizeof(uint32_t);
}

static void decode(const centry *e, uint32_t *mask, size_t n_words, int32_t size) {
    const uint32_t *d = e->words + e->key_len;
    switch (e->enc) {
    case ENC_BITMAP:
        memcpy(mask, d, n_words * sizeof *mask);
        break;
    case ENC_ALLOWED:
        memset(mask, 0, n_words * sizeof *mask);
        for (uint32_t k = 0; k < e->data_len; k++) mask[d[k] >> 5] |= 1u << (d[k] & 31);
        break;
    default:
        memset(mask, 0xff, n_words * sizeof *mask);
        if (size & 31) mask[n_words - 1] = (1u << (size & 31)) - 1;
        for (uint32_t k = 0; k < e->data_len; k++) mask[d[k] >> 5] &= ~(1u << (d[k] & 31));
        break;
    }
}

static bool cache_get(cv_mask_cache *c, const uint32_t *key, uint32_t key_len, uint64_t hash, uint32_t *mask,
                      size_t n_words, int32_t size) {
    pthread_mutex_lock(&c->mu);
    centry *e = *find(c, key, key_len, hash);
    if (e) {
        c->hits++;
        lru_unlink(e);
        lru_front(c, e);
        decode(e, mask, n_words, size);
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->mu);
    return e != NULL;
}

static void cache_put(cv_mask_cache *c, const uint32_t *key, uint32_t key_len, uint64_t hash, const uint32_t *mask,
                      size_t n_words, int32_t size, bool complete) {
    uint32_t allowed = 0;
    for (size_t w = 0; w < n_words; w++) allowed += (uint32_t)__builtin_popcount(mask[w]);
    uint32_t rejected = (uint32_t)size - allowed;
    uint32_t enc = ENC_BITMAP, data_len = (uint32_t)n_words;
    if (allowed <= rejected && allowed < n_words) {
        enc = ENC_ALLOWED;
        data_len = allowed;
    } else if (rejected < allowed && rejected < n_words) {
        enc = ENC_REJECTED;
        data_len = rejected;
    }
    centry *e = cv_xmalloc(sizeof *e + ((size_t)key_len + data_len) * sizeof(uint32_t));
    e->hash = hash;
    e->key_len = key_len;
    e->enc = enc;
    e->data_len = data_len;
    memcpy(e->words, key, key_len * sizeof *key);
    uint32_t *d = e->words + key_len;
    if (enc == ENC_BITMAP) {
        memcpy(d, mask, n_words * sizeof *mask);
    } else {
        uint32_t k = 0, flip = enc == ENC_REJECTED ? ~0u : 0u;
        for (size_t w = 0; w < n_words; w++) {
            uint32_t bits = mask[w] ^ flip;
            if (w == n_words - 1 && (size & 31)) bits &= (1u << (size & 31)) - 1;
            for (; bits; bits &= bits - 1) d[k++] = (uint32_t)(w * 32 + (size_t)__builtin_ctz(bits));
        }
        assert(k == data_len);
    }

    pthread_mutex_lock(&c->mu);
    c->stopped += !complete;
    centry **at = find(c, key, key_len, hash);
    if (*at) {  /* another matcher of this grammar filled it meanwhile */
        pthread_mutex_unlock(&c->mu);
        free(e);
        return;
    }
    e->chain = NULL;
    *at = e;
    lru_front(c, e);
    c->n_entries++;
    c->bytes += entry_bytes(e);
    while (c->bytes > c->limit && c->lru.prev != e) {
        centry *old = c->lru.prev;
        centry **p = find(c, old->words, old->key_len, old->hash);
        assert(*p == old);
        *p = old->chain;
        lru_unlink(old);
        c->bytes -= entry_bytes(old);
        c->n_entries--;
        c->evictions++;
        free(old);
    }
    if (c->n_entries > c->n_buckets) {
        size_t n = c->n_buckets * 2;
        centry **b = cv_xcalloc(n, sizeof *b);
        for (size_t i = 0; i < c->n_buckets; i++) {
            for (centry *x = c->buckets[i], *next; x; x = next) {
                next = x->chain;
                x->chain = b[x->hash & (n - 1)];
                b[x->hash & (n - 1)] = x;
            }
        }
        free(c->buckets);
        c->buckets = b;
        c->n_buckets = n;
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- the walk's scratch -------------------------------------------------------------------------- */

struct cv_mask_walk {
    cv_gpool pool;
    cv_gstep step;
    /* walk states: stacks tops[off .. off + n), accepting */
    uint32_t *st_off, *st_n;
    uint8_t *st_acc;
    uint32_t n_states, cap_states;
    uint32_t *tops;
    size_t n_tops, cap_tops;
    uint32_t *slots;                     /* state id + 1, by content */
    uint32_t slot_mask;
    uint32_t *rows;                      /* 256 per state below ROW_CAP: next state + 1, 0 unknown */
    uint32_t cap_rows;
    uint32_t *by_depth;                  /* the state at each depth of the trie path */
    uint32_t *bits;                      /* the mask being made, plus a word for nodes without a token */
    uint64_t work;                       /* stacks stepped by this walk's real steps */
    /* the matcher state's key and its making */
    uint32_t *key, *tmp, *idx;
    size_t cap_key, cap_tmp, cap_idx;
};

void cv_mask_walk_free(cv_mask_walk *w) {
    if (!w) return;
    cv_gpool_free(&w->pool);
    cv_gstep_free(&w->step);
    free(w->st_off);
    free(w->st_n);
    free(w->st_acc);
    free(w->tops);
    free(w->slots);
    free(w->rows);
    free(w->by_depth);
    free(w->bits);
    free(w->key);
    free(w->tmp);
    free(w->idx);
    free(w);
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    *cap = n;
    return cv_xrealloc(p, n * elem);
}

/* ---- the key ------------------------------------------------------------------------------------- */

/* Orders two stacks written as (depth, positions...) inside the buffer `base`. */
static int cmp_stack(const void *a, const void *b, void *base) {
    const uint32_t *x = (const uint32_t *)base + *(const uint32_t *)a;
    const uint32_t *y = (const uint32_t *)base + *(const uint32_t *)b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    for (uint32_t k = 1; k <= x[0]; k++)
        if (x[k] != y[k]) return x[k] < y[k] ? -1 : 1;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* key = flags, number of stacks, then each stack as (depth, positions top to bottom), the stacks
 * sorted. Returns its length. */
static uint32_t build_key(cv_mask_walk *w, const cv_matcher *m, const cv_mstate *s) {
    size_t n_tmp = 0;
    w->idx = grow(w->idx, &w->cap_idx, s->n + 1, sizeof *w->idx);
    for (uint32_t i = 0; i < s->n; i++) {
        size_t at = n_tmp++;
        w->idx[i] = (uint32_t)at;
        uint32_t depth = 0;
        for (uint32_t node = m->tops[s->off + i]; node != CV_GNIL; node = m->pool.parent[node]) {
            w->tmp = grow(w->tmp, &w->cap_tmp, n_tmp + 1, sizeof *w->tmp);
            w->tmp[n_tmp++] = m->pool.pos[node];
            depth++;
        }
        w->tmp = grow(w->tmp, &w->cap_tmp, n_tmp + 1, sizeof *w->tmp);
        w->tmp[at] = depth;
    }
    if (s->n > 1) qsort_r(w->idx, s->n, sizeof *w->idx, cmp_stack, w->tmp);
    w->key = grow(w->key, &w->cap_key, n_tmp + 2, sizeof *w->key);
    w->key[0] = s->flags;
    w->key[1] = s->n;
    uint32_t k = 2;
    for (uint32_t i = 0; i < s->n; i++) {
        const uint32_t *st = w->tmp + w->idx[i];
        memcpy(w->key + k, st, (st[0] + 1) * sizeof *st);
        k += st[0] + 1;
    }
    return k;
}

/* ---- walk states --------------------------------------------------------------------------------- */

static uint64_t state_hash(const uint32_t *tops, size_t n, bool acc) {
    return XXH3_64bits_withSeed(tops, n * sizeof *tops, acc);
}

static void state_rehash(cv_mask_walk *w, uint32_t n_slots) {
    free(w->slots);
    w->slots = cv_xcalloc(n_slots, sizeof *w->slots);
    w->slot_mask = n_slots - 1;
    for (uint32_t s = 0; s < w->n_states; s++) {
        uint32_t h = (uint32_t)state_hash(w->tops + w->st_off[s], w->st_n[s], w->st_acc[s]) & w->slot_mask;
        while (w->slots[h]) h = (h + 1) & w->slot_mask;
        w->slots[h] = s + 1;
    }
}

static uint32_t intern_state(cv_mask_walk *w, const uint32_t *tops, size_t n, bool acc) {
    if (!w->slots || (uint64_t)(w->n_states + 1) * 2 > (uint64_t)w->slot_mask + 1)
        state_rehash(w, w->slots ? (w->slot_mask + 1) * 2 : 1024);
    uint32_t h = (uint32_t)state_hash(tops, n, acc) & w->slot_mask;
    for (uint32_t s; (s = w->slots[h]) != 0; h = (h + 1) & w->slot_mask) {
        s--;
        if (w->st_n[s] == n && w->st_acc[s] == acc && memcmp(w->tops + w->st_off[s], tops, n * sizeof *tops) == 0)
            return s;
    }
    if (w->n_states == w->cap_states) {
        w->cap_states = w->cap_states ? w->cap_states * 2 : 256;
        w->st_off = cv_xrealloc(w->st_off, w->cap_states * sizeof *w->st_off);
        w->st_n = cv_xrealloc(w->st_n, w->cap_states * sizeof *w->st_n);
        w->st_acc = cv_xrealloc(w->st_acc, w->cap_states * sizeof *w->st_acc);
    }
    if (w->n_states < ROW_CAP) {
        if (w->n_states == w->cap_rows) {
            w->cap_rows = w->cap_rows ? w->cap_rows * 2 : 64;
            w->rows = cv_xrealloc(w->rows, (size_t)w->cap_rows * 256 * sizeof *w->rows);
        }
        memset(w->rows + (size_t)w->n_states * 256, 0, 256 * sizeof *w->rows);
    }
    w->tops = grow(w->tops, &w->cap_tops, w->n_tops + n, sizeof *w->tops);
    uint32_t s = w->n_states++;
    w->st_off[s] = (uint32_t)w->n_tops;
    w->st_n[s] = (uint32_t)n;
    w->st_acc[s] = acc;
    if (n) memcpy(w->tops + w->n_tops, tops, n * sizeof *tops);
    w->n_tops += n;
    w->slots[h] = s + 1;
    return s;
}

/* Forgets every walk state and stack; buffers that grew large (an unusual walk) are freed. */
static void walk_forget(cv_mask_walk *w) {
    if (w->cap_states > 4 * WALK_KEEP_STATES) {
        free(w->st_off);
        free(w->st_n);
        free(w->st_acc);
        free(w->tops);
        free(w->slots);
        free(w->rows);
        w->st_off = w->st_n = w->tops = w->slots = w->rows = NULL;
        w->st_acc = NULL;
        w->cap_states = w->cap_rows = 0;
        w->cap_tops = 0;
        w->slot_mask = 0;
    } else if (w->slots) {
        memset(w->slots, 0, ((size_t)w->slot_mask + 1) * sizeof *w->slots);
    }
    w->n_states = 0;
    w->n_tops = 0;
    cv_gpool_clear(&w->pool);
}

/* The state after byte b from `from`, the real step run once per (state, byte) with a row. Kept out
 * of line: inlined, it would take the walk loop's registers. */
static __attribute__((noinline)) uint32_t transition(const cv_grammar *g, cv_mask_walk *w, uint32_t from, uint8_t b) {
    uint32_t to = DEAD;
    w->work += 1 + w->st_n[from];
    if (cv_gstep_byte(g, &w->pool, &w->step, w->tops + w->st_off[from], w->st_n[from], b) &&
        (w->step.n_out || w->step.accept))
        to = intern_state(w, w->step.out, w->step.n_out, w->step.accept);
    if (from < ROW_CAP) w->rows[(size_t)from * 256 + b] = to + 1;
    return to;
}

/* Seeds the walk's pool with the stacks written in the key and returns the start state. */
static uint32_t start_state(cv_mask_walk *w, const uint32_t *key) {
    uint32_t n = key[1], k = 2;
    w->idx = grow(w->idx, &w->cap_idx, n + 1, sizeof *w->idx);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t depth = key[k], node = CV_GNIL;
        for (uint32_t d = depth; d > 0; d--) node = cv_gpool_intern(&w->pool, key[k + d], node);
        w->idx[i] = node;
        k += depth + 1;
    }
    qsort(w->idx, n, sizeof *w->idx, cmp_u32);
    return intern_state(w, w->idx, n, key[0] & CV_MS_ACCEPT);
}

/* The state after trie node nd's byte from `from`. */
static inline uint32_t next_state(const cv_grammar *g, cv_mask_walk *w, uint32_t from, uint8_t b) {
    uint32_t to;
    if (from < ROW_CAP && (to = w->rows[(size_t)from * 256 + b]) != 0) return to - 1;
    return transition(g, w, from, b);
}

/* Sets the bits of the tokens allowed from `start`; false when the budget stopped the walk. The
 * single-byte tokens go first, so that even a stopped walk allows every byte that may come next (a
 * byte-level vocabulary has all 256), and the hot loop does one row lookup per trie node while the
 * states are known. */
static __attribute__((noinline)) bool walk_trie(const cv_grammar *g, cv_mask_walk *w, uint32_t start) {
    const cv_vocab *v = g->vocab;
    const cv_trie_node *trie = v->trie;
    uint32_t *by_depth = w->by_depth, *bits = w->bits;
    uint32_t n = v->n_nodes;
    for (uint32_t i = 0; i < n; i = trie[i].next)
        if (next_state(g, w, start, (uint8_t)trie[i].byte) != DEAD) bits[trie[i].token >> 5] |= 1u << (trie[i].token & 31);
    const uint32_t *rows = w->rows;
    by_depth[0] = start;
    bool complete = true;
    for (uint32_t i = 0; i < n;) {
        cv_trie_node nd = trie[i];
        uint32_t from = by_depth[nd.depth - 1], to;
        if (from < ROW_CAP && (to = rows[(size_t)from * 256 + nd.byte]) != 0) {
            to--;
        } else if (w->work < WALK_BUDGET) {
            to = transition(g, w, from, (uint8_t)nd.byte);
            rows = w->rows;
        } else {
            complete = false;
            break;
        }
        if (to == DEAD) {
            i = nd.next;
            continue;
        }
        by_depth[nd.depth] = to;
        bits[nd.token >> 5] |= 1u << (nd.token & 31);
        i++;
    }
    for (size_t k = 0; k < v->n_dup; k++) {
        int32_t t = v->dup[2 * k], same = v->dup[2 * k + 1];
        if ((bits[same >> 5] >> (same & 31)) & 1u) bits[t >> 5] |= 1u << (t & 31);
    }
    return complete;
}

void cv_matcher_fill_mask(cv_matcher *m, uint32_t *mask) {
    const cv_grammar *g = m->g;
    const cv_vocab *v = g->vocab;
    assert(v);
    size_t n_words = ((size_t)v->size + 31) / 32;
    const cv_mstate *s = &m->hist[m->n_hist - 1];
    if (s->flags & CV_MS_EOS) {
        memset(mask, 0, n_words * sizeof *mask);
        return;
    }
    if (!m->walk) {
        m->walk = cv_xcalloc(1, sizeof *m->walk);
        m->walk->by_depth = cv_xmalloc(((size_t)v->max_depth + 1) * sizeof *m->walk->by_depth);
        m->walk->bits = cv_xmalloc((n_words + 1) * sizeof *m->walk->bits);
    }
    cv_mask_walk *w = m->walk;
    uint32_t key_len = build_key(w, m, s);
    uint64_t hash = XXH3_64bits(w->key, key_len * sizeof *w->key);
    if (cache_get(g->cache, w->key, key_len, hash, mask, n_words, v->size)) return;

    memset(w->bits, 0, n_words * sizeof *w->bits);
    bool complete = true;
    if (s->n) {
        if (w->n_states == 0) intern_state(w, NULL, 0, false);  /* DEAD */
        w->work = 0;
        complete = walk_trie(g, w, start_state(w, w->key));
        if (w->n_states > WALK_KEEP_STATES || w->pool.n > WALK_KEEP_NODES) walk_forget(w);
    }
    memcpy(mask, w->bits, n_words * sizeof *mask);
    if (s->flags & CV_MS_ACCEPT)
        for (size_t k = 0; k < v->n_eos; k++) mask[v->eos[k] >> 5] |= 1u << (v->eos[k] & 31);
    cache_put(g->cache, w->key, key_len, hash, mask, n_words, v->size, complete);
}
