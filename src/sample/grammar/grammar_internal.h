/*
 * grammar_internal.h — the structures that the grammar core's four files share: ebnf.c builds a
 * cv_grammar (a flat array of rule alternatives over byte sets), matcher.c advances sets of stacks
 * over it, vocab.c builds the trie of the vocabulary's byte strings, and mask.c walks that trie.
 *
 * The automaton. A grammar is a list of rules; a rule is a list of alternatives; an alternative is a
 * run of elements in `elems` closed by an END element. An element is either a set of bytes (one
 * input byte in the set matches it) or a reference to a rule. A position is an index into `elems`.
 *
 * A stack is a chain of nodes (position, parent): the top node's position is the byte set to match
 * next, every node below holds the position to continue at when the alternative above it ends.
 * Nodes are interned in a pool, so equal stacks are the same node id, stacks share their lower
 * parts, and a set of stacks is a sorted array of node ids that compares with memcmp. The pool is
 * persistent: advancing never modifies a node, which is what makes history (rollback) and the
 * mask walk's branching cheap.
 */
#ifndef CV_SAMPLE_GRAMMAR_INTERNAL_H
#define CV_SAMPLE_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sample/grammar/grammar.h"

/* ---- the grammar --------------------------------------------------------------------------------- */

/* Elements: 2 bits of kind, 30 bits of argument (a byte-set index or a rule id). */
#define CV_GE_END 0u
#define CV_GE_BYTES 1u
#define CV_GE_REF 2u
#define CV_GE(kind, arg) ((uint32_t)(kind) << 30 | (uint32_t)(arg))
#define CV_GE_KIND(e) ((e) >> 30)
#define CV_GE_ARG(e) ((e) & 0x3fffffffu)

typedef struct cv_byteset {
    uint32_t w[8];
} cv_byteset;

static inline bool cv_byteset_has(const cv_byteset *s, uint8_t b) {
    return (s->w[b >> 5] >> (b & 31)) & 1u;
}

typedef struct cv_mask_cache cv_mask_cache;

struct cv_grammar {
    uint32_t *elems;          /* every alternative's elements, each alternative closed by END */
    uint32_t n_elems;
    uint32_t *alt_start;      /* position of each alternative's first element */
    uint32_t *rule_alt;       /* rule r's alternatives are alt_start[rule_alt[r] .. rule_alt[r + 1]) */
    uint32_t n_rules, root;
    cv_byteset *sets;
    uint32_t n_sets;
    const cv_vocab *vocab;    /* NULL: bytes only */
    cv_mask_cache *cache;     /* masks by matcher state (mask.c); NULL without a vocabulary */
};

/* ---- the vocabulary ------------------------------------------------------------------------------ */

enum { CV_TOK_NEVER = 0, CV_TOK_BYTES = 1, CV_TOK_EOS = 2 };

/* The trie in preorder: node i's children follow it, and `next` is the index just past its subtree,
 * so a walk that rejects node i skips to next. Depth 1 is a token's first byte. Eight bytes a node
 * (the walk streams the whole array): hence at most 16M nodes, ids below 2^20 - 32 and tokens of at
 * most 4095 bytes (vocab.c leaves longer ones out: never allowed). A node that ends no token holds
 * cv_vocab.no_token, the first bit of the word just past the mask, so the walk sets a bit for every
 * node without a branch. */
typedef struct cv_trie_node {
    uint32_t next : 24;
    uint32_t byte : 8;
    uint32_t token : 20;
    uint32_t depth : 12;
} cv_trie_node;

struct cv_vocab {
    int32_t size;             /* the mask's width: the model's rows */
    uint8_t *kind;            /* CV_TOK_* per id */
    uint32_t *off;            /* token t's bytes are bytes[off[t] .. off[t + 1]) */
    uint8_t *bytes;
    cv_trie_node *trie;
    uint32_t n_nodes, max_depth;
    uint32_t no_token;        /* 32 * the mask's words */
    int32_t *dup;             /* pairs (id, earlier id with the same bytes): one trie node per string */
    size_t n_dup;
    int32_t *eos;
    size_t n_eos;
};

/* ---- stacks -------------------------------------------------------------------------------------- */

#define CV_GNIL UINT32_MAX

/* Refused: an input byte that would leave more stacks than this (a badly ambiguous grammar) is
 * treated as not allowed, so one byte never costs more than bounded time and memory. */
#define CV_GRAMMAR_MAX_STACKS 4096
/* And one whose closure expands more (rule, return) pairs than the grammar has rules plus this:
 * every rule once is fair (a chain of 50,000 rules expands them all for its first byte), but nested
 * repetitions of parts that may be empty, ((x?)+)+…, have as many distinct return stacks as paths
 * through them, 2^depth, with no byte set on top, so the stacks' count alone never stops them. */
#define CV_GRAMMAR_MAX_EXPANSIONS (8 * CV_GRAMMAR_MAX_STACKS)

typedef struct cv_gpool {
    uint32_t *pos, *parent;
    uint32_t n, cap;
    uint32_t *slots;          /* open addressing, node id + 1 (0: empty) */
    uint32_t slot_mask;
} cv_gpool;

uint32_t cv_gpool_intern(cv_gpool *p, uint32_t pos, uint32_t parent);
void cv_gpool_clear(cv_gpool *p);
void cv_gpool_free(cv_gpool *p);

/* The scratch of one step (the closure after a byte): reused so that a step allocates nothing once
 * warm. The result of a step is out[0 .. n_out), sorted and unique, plus accept. */
typedef struct cv_gstep {
    uint32_t *work;           /* pending (position, return node) pairs */
    size_t n_work, cap_work;
    uint32_t *out;
    size_t n_out, cap_out;
    bool accept;
    uint64_t *seen;           /* (rule, return node) expanded in this step, with seen_gen stamps */
    uint32_t *seen_gen;
    uint32_t seen_mask, gen, n_seen;
} cv_gstep;

void cv_gstep_free(cv_gstep *st);
/* The stacks that start the grammar (root expanded). False (and no stacks) past the limits above:
 * cv_grammar_parse refuses such a grammar. */
bool cv_gstep_start(const cv_grammar *g, cv_gpool *p, cv_gstep *st);
/* The stacks after byte b from tops[0 .. n). False (and no stacks) when the result would exceed
 * CV_GRAMMAR_MAX_STACKS or its closure CV_GRAMMAR_MAX_EXPANSIONS. */
bool cv_gstep_byte(const cv_grammar *g, cv_gpool *p, cv_gstep *st, const uint32_t *tops, size_t n, uint8_t b);

/* ---- matchers ------------------------------------------------------------------------------------ */

enum { CV_MS_ACCEPT = 1, CV_MS_EOS = 2 };

typedef struct cv_mstate {
    uint32_t off, n;          /* its stacks: matcher tops[off .. off + n) */
    uint32_t flags;           /* CV_MS_* */
} cv_mstate;

typedef struct cv_mask_walk cv_mask_walk;

struct cv_matcher {
    const cv_grammar *g;
    cv_gpool pool;
    cv_gstep step;
    uint32_t *tops;
    size_t n_tops, cap_tops;
    cv_mstate *hist;          /* hist[0] is the start; the current state is the last */
    size_t n_hist, cap_hist;
    uint32_t *scratch;        /* stacks between the bytes of one token */
    size_t cap_scratch;
    cv_mask_walk *walk;       /* mask.c's scratch, made on the first fill_mask */
};

/* mask.c */
cv_mask_cache *cv_mask_cache_new(void);
void cv_mask_cache_free(cv_mask_cache *c);
void cv_mask_walk_free(cv_mask_walk *w);

/* For the benchmark and tests: the cache's counters since the grammar was built (stopped: walks that
 * ran out of budget and gave a subset of the allowed tokens, mask.c). */
typedef struct cv_mask_cache_stats {
    uint64_t hits, misses, evictions, stopped;
    size_t entries, bytes;
} cv_mask_cache_stats;
void cv_grammar_cache_stats(const cv_grammar *g, cv_mask_cache_stats *out);
/* The cache's bound in bytes (32 MiB by default); tests lower it to see eviction. */
void cv_grammar_set_cache_limit(const cv_grammar *g, size_t bytes);

#endif
