/*
 * kv_layout.h — the KV cache's words into attention's tiles (internal to src/kernels). The layout
 * itself is kernels.h's (cv_kv_index); cv_kv_write and cv_kv_store store rows into it (kv_layout.c).
 */
#ifndef CV_KV_LAYOUT_H
#define CV_KV_LAYOUT_H

#include <stdint.h>

#include "base/dtype.h"

/* A batch's new K and V rows and the cache slots they go to (cv_kv_write's arguments). */
typedef struct cv_kv_rows {
    void *k_cache, *v_cache;
    cv_dtype dtype;              /* CV_DTYPE_F32 or CV_DTYPE_BF16 */
    const float *k, *v;          /* [n][n_kv_heads·head_dim] */
    const int64_t *slot_mapping; /* [n] */
    int n_kv_heads, head_dim, block_size;
} cv_kv_rows;

/* Stores KV heads [g0, g1) of rows [t0, t1) on the calling thread, as cv_kv_write stores them:
 * decode attention writes a sequence's head just before it reads that head's context. */
void cv_kv_store(const cv_kv_rows *r, int64_t t0, int64_t t1, int g0, int g1);

/* One KV head of one sequence in a bf16 K or V cache. */
typedef struct cv_kv_head {
    const uint16_t *cache;
    const int32_t *table; /* the sequence's block table */
    int g, n_kv_heads, head_dim, block_size;
} cv_kv_head;

/* K's words at positions [j0, j0 + n), word (p, j) — elements 2p and 2p+1 of position j0 + j; an odd
 * head_dim's last one with zero — to dst[(j / W)·(pairs·W) + p·W + j % W], pairs = ⌈head_dim/2⌉:
 * one [pairs][W] tile per W positions (W = the lane-wise tile, or 16 for AMX's column tiles). */
void cv_kv_gather_k(const cv_kv_head *h, int32_t j0, int n, uint32_t *dst, int W);

/* V's words at positions [j0, j0 + n), j0 even, as position pairs, word (q, d) — element d of
 * positions j0 + 2q (low half) and j0 + 2q + 1 (high half; zero at n) — to dst[(d / W)·(rows·W) +
 * q·W + d % W]: one [rows][W] tile per W elements (W = head_dim on the lane-wise path, 16 for AMX's
 * column tiles), rows ≥ ⌈n/2⌉. */
void cv_kv_gather_v(const cv_kv_head *h, int32_t j0, int n, uint32_t *dst, int W, int rows);

/* K's words at positions [j0, j0 + n) as panels of 16 positions for gemm_panels_dot, word (p, j) at
 * panels[j / 16][p·ldp + j % 16] (*ldp set): in the cache itself where blocks hold whole panels
 * (block_size and j0 multiples of 16, head_dim even: no copy), else gathered into `spare`
 * ([⌈head_dim/2⌉][64] words, n ≤ 64). Words read in place are not asked for: the caller asks
 * ahead (cv_kv_ask_k); a gather asks for what it copies. */
void cv_kv_k_panels(const cv_kv_head *h, int32_t j0, int n, const uint32_t **panels, int64_t *ldp, uint32_t *spare);

/* V's words (W = head_dim) as row pointers, rows[q] → word (q, 0): into the cache itself where
 * it pairs the rows (an even block_size: no copy), else into `spare` ([⌈n/2⌉][head_dim] words)
 * where they are gathered; an odd n's last pair, with its zero, is always in spare. Words read in
 * place are not asked for: the caller asks ahead (cv_kv_ask_v); a gather asks for what it copies. */
void cv_kv_v_pair_rows(const cv_kv_head *h, int32_t j0, int n, const uint32_t **rows, uint32_t *spare);

/* Ask for (prefetch) the cache lines of K's pair rows [p0, p1) at positions [j0, j0 + n), and of V's
 * position pairs [q0, q1) of positions [j0, j0 + n) (j0 even): the lines cv_kv_k_panels' and
 * cv_kv_v_pair_rows' products read there. Hints only; the results never depend on them. */
void cv_kv_ask_k(const cv_kv_head *h, int32_t j0, int n, int p0, int p1);
void cv_kv_ask_v(const cv_kv_head *h, int32_t j0, int n, int q0, int q1);

#endif
