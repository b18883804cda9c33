/*
 * kv_layout.c — the paged KV cache's layout in use (kernels.h cv_kv_index): cv_kv_write stores a
 * batch's K and V rows into their slots, and a bf16 cache's words reach the tiles attention
 * multiplies by a copy (the gathers) or in place (cv_kv_v_pair_rows) (kv_layout.h).
 *
 * A bf16 cache is kept in the pairs the bf16 dot products take (K: two adjacent head_dim elements
 * of a row to a word; V: one element of two adjacent rows), so the write scatters each rounded row
 * into words a block_size apart (K) or into every other bf16 (V), and reading a tile is a copy of
 * runs of words — a block's pair rows for K, runs of whole pair rows for V — where it used to be a
 * transpose and a pairing per query block. attention_bench (Zen 5, 2 threads, Qwen3-0.6B heads, the
 * output bits unchanged), the copies against the transposes: bf16 dot products — decode over a
 * cache-resident context 1.2-2x faster, decode from memory the same (it waits on the misses either
 * way), prefill the same to 1.08x; f32 products over the bf16 cache (widened words) — the
 * 3,500-token prefill 1.16-1.24x, 512 the same; on the AVX2 path 512 1.13-1.22x, 3,500 1.14x,
 * decode at 1,000 positions 1.25x. Reading V in place added more (cv_kv_v_pair_rows).
 */
#include <assert.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_layout.h"
#include "kernels/kernels.h"

/* Below this many elements the write runs on the caller: a pool wake costs more. */
enum { PARALLEL_ELEMENTS = 1 << 14 };

/* Row x's heads [g0, g1) into `slot` (cv_kv_index): f32 rows copied; bf16 rounded, then K's pairs one
 * word every panel's rows words and V's elements every other bf16 (an odd last K element or V row
 * plain). */
static void store_row(const cv_cpu_ops *ops, const cv_kv_rows *r, void *cache, bool value, int64_t slot,
                      const float *x, int g0, int g1) {
    const int hd = r->head_dim, bs = r->block_size, i = (int)(slot % bs);
    for (int g = g0; g < g1; g++) {
        const float *xg = x + (int64_t)g * hd;
        if (r->dtype != CV_DTYPE_BF16) {
            memcpy((float *)cache + cv_kv_index(r->dtype, value, slot, g, 0, r->n_kv_heads, hd, bs), xg,
                   (size_t)hd * sizeof(float));
            continue;
        }
        uint16_t row[CV_MAX_HEAD_DIM];
        ops->round_bf16(row, xg, hd);
        uint16_t *at = (uint16_t *)cache + cv_kv_index(CV_DTYPE_BF16, value, slot, g, 0, r->n_kv_heads, hd, bs);
        if (!value) { /* at: row i's first pair; pairs a panel's rows words apart (an odd region's words are
                       * unaligned) */
            const int64_t rows = cv_kv_panel_rows(i, bs);
            int d = 0;
            for (; d + 1 < hd; d += 2) memcpy(at + (int64_t)d * rows, row + d, 2 * sizeof *row);
            if (d < hd) *((uint16_t *)cache + cv_kv_index(CV_DTYPE_BF16, false, slot, g, d, r->n_kv_heads, hd, bs)) = row[d];
        } else { /* paired rows: element d at 2d; an odd block's last row plain */
            const int step = i < (bs & ~1) ? 2 : 1;
            for (int d = 0; d < hd; d++) at[(int64_t)d * step] = row[d];
        }
    }
}

void cv_kv_store(const cv_kv_rows *r, int64_t t0, int64_t t1, int g0, int g1) {
    assert(r->dtype == CV_DTYPE_F32 || r->dtype == CV_DTYPE_BF16);
    assert(r->n_kv_heads > 0 && r->head_dim > 0 && r->block_size > 0 && r->head_dim <= CV_MAX_HEAD_DIM);
    assert(0 <= g0 && g0 <= g1 && g1 <= r->n_kv_heads);
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    const int64_t width = (int64_t)r->n_kv_heads * r->head_dim;
    for (int64_t t = t0; t < t1; t++) {
        store_row(ops, r, r->k_cache, false, r->slot_mapping[t], r->k + t * width, g0, g1);
        store_row(ops, r, r->v_cache, true, r->slot_mapping[t], r->v + t * width, g0, g1);
    }
}

static void store_rows(const void *arg, int64_t t0, int64_t t1) {
    const cv_kv_rows *r = arg;
    cv_kv_store(r, t0, t1, 0, r->n_kv_heads);
}

void cv_kv_write(cv_threadpool *pool, void *k_cache, void *v_cache, cv_dtype dtype, const float *k, const float *v,
                 const int64_t *slot_mapping, int64_t n, int n_kv_heads, int head_dim, int block_size) {
    const cv_kv_rows r = {k_cache, v_cache, dtype, k, v, slot_mapping, n_kv_heads, head_dim, block_size};
    /* a prefill's rows are a few MiB: with one thread they ran at ~1 % of a pp512 forward pass */
    cv_threadpool_run_range(pool, store_rows, &r, n, n * n_kv_heads * head_dim >= PARALLEL_ELEMENTS);
}

/* The first element of h's region in a block: element 0 of its first slot, K or V alike. */
static const uint16_t *region(const cv_kv_head *h, int32_t block) {
    return h->cache + cv_kv_index(CV_DTYPE_BF16, false, (int64_t)block * h->block_size, h->g, 0, h->n_kv_heads,
                                  h->head_dim, h->block_size);
}

/* Pair 0 of row `off` of h's K in `block`, and the rows of its panel (*rows): its pairs lie *rows
 * words apart. */
static const uint16_t *k_row(const cv_kv_head *h, int32_t block, int32_t off, int *rows) {
    const int start = cv_kv_panel_start(off);
    *rows = cv_kv_panel_rows(off, h->block_size);
    return region(h, block) + (int64_t)start * (h->head_dim & ~1) + (int64_t)(off - start) * 2;
}

/* The positions from j0 + j to the end of its K panel, at most n − j. */
static int k_run(const cv_kv_head *h, int32_t j0, int j, int n) {
    const int32_t off = (j0 + j) % h->block_size, end = cv_kv_panel_start(off) + cv_kv_panel_rows(off, h->block_size);
    return end - off < n - j ? end - off : n - j;
}

/* Panel by panel, pair row by pair row; every line is asked for before the first copy (attention.c
 * fetch_rows says why: the copy's plain loads wait out the misses best). */
void cv_kv_gather_k(const cv_kv_head *h, int32_t j0, int n, uint32_t *dst, int W) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    const int32_t bs = h->block_size;
    const int full = h->head_dim / 2, pairs = (h->head_dim + 1) / 2;
    cv_kv_ask_k(h, j0, n, 0, full);
    for (int j = 0; j < n;) {
        const int32_t pos = j0 + j, off = pos % bs, block = h->table[pos / bs];
        int run = k_run(h, j0, j, n), rows;
        run = run < W - j % W ? run : W - j % W;
        const uint16_t *r = k_row(h, block, off, &rows);
        uint32_t *out = dst + (int64_t)(j / W) * pairs * W + j % W;
        ops->copy_rows(out, (int64_t)W * 4, r, (int64_t)rows * 4, full, (int64_t)run * 4);
        if (full < pairs) { /* the odd last element: a plain row of bs bf16 after the words */
            const uint16_t *plain = region(h, block) + (int64_t)full * 2 * bs + off;
            for (int i = 0; i < run; i++) out[(int64_t)full * W + i] = plain[i];
        }
        j += run;
    }
}

/* j0 is even, so where the cache pairs a block's rows the tile's pairs are the cache's words and runs
 * of them are copied (asked for first); pairs across blocks (block_size 1 or odd), with an odd
 * block's plain last row, or with the zero at n are put together element by element. */
void cv_kv_gather_v(const cv_kv_head *h, int32_t j0, int n, uint32_t *dst, int W, int rows) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    const int32_t bs = h->block_size, paired = bs & ~1;
    const int hd = h->head_dim;
    assert(j0 % 2 == 0 && 2 * rows >= n);
    cv_kv_ask_v(h, j0, n, 0, (n + 1) / 2);
    for (int j = 0; j < n;) {
        const int32_t pos = j0 + j, off = pos % bs;
        int run = off % 2 == 0 && off < paired ? (paired - off) / 2 : 0; /* whole pairs in this block */
        run = run < (n - j) / 2 ? run : (n - j) / 2;
        const int q = j / 2;
        if (run > 0) {
            const uint16_t *src = region(h, h->table[pos / bs]) + (int64_t)off * hd; /* pair row off/2 */
            for (int d0 = 0; d0 < hd; d0 += W)
                ops->copy_rows(dst + (int64_t)(d0 / W) * rows * W + (int64_t)q * W, (int64_t)W * 4,
                               src + (int64_t)d0 * 2, (int64_t)hd * 4, run, (int64_t)(hd - d0 < W ? hd - d0 : W) * 4);
            j += 2 * run;
            continue;
        }
        const int64_t lo = (int64_t)h->table[pos / bs] * bs + off;
        const int64_t hi = j + 1 < n ? (int64_t)h->table[(pos + 1) / bs] * bs + (pos + 1) % bs : -1;
        for (int d = 0; d < hd; d++) {
            const uint32_t l = h->cache[cv_kv_index(CV_DTYPE_BF16, true, lo, h->g, d, h->n_kv_heads, hd, bs)];
            const uint32_t u = hi < 0 ? 0 : h->cache[cv_kv_index(CV_DTYPE_BF16, true, hi, h->g, d, h->n_kv_heads, hd, bs)];
            dst[(int64_t)(d / W) * rows * W + (int64_t)q * W + d % W] = l | u << 16;
        }
        j += 2;
    }
}

/* Q·Kᵀ reads K's words where they are, 16 positions of a block at a time (attention_bench, Zen 5,
 * three pairs each against the copy: decode over a cache-resident context 1.3-2x faster (1 thread),
 * decode from memory 1.14-1.2x and the 512-token prefill 1.1-1.27x (2 threads), 3,500 the same). */
void cv_kv_k_panels(const cv_kv_head *h, int32_t j0, int n, const uint32_t **panels, int64_t *ldp, uint32_t *spare) {
    const int32_t bs = h->block_size;
    if (bs % 16 || j0 % 16 || h->head_dim % 2) { /* panels across blocks, or an odd head_dim's plain last row */
        assert(n <= 64);
        cv_kv_gather_k(h, j0, n, spare, 64);
        for (int j = 0; j < n; j += 16) panels[j / 16] = spare + j;
        *ldp = 64;
        return;
    }
    int rows = CV_KV_PANEL;
    for (int j = 0; j < n; j += 16) {
        const int32_t pos = j0 + j;
        panels[j / 16] = (const uint32_t *)k_row(h, h->table[pos / bs], pos % bs, &rows);
    }
    *ldp = rows; /* every panel of such a block holds 16 rows */
}

/* The bf16 dot products read V's words where they are: the tile's copy cost more than it saved
 * (attention_bench, Zen 5, three pairs each against the copy: decode over a cache-resident context
 * 1.15-1.35x faster without it (1 thread), the 3,500-token prefill the same to 1.15x and decode from
 * memory the same to 1.3x (2 threads)). */
void cv_kv_v_pair_rows(const cv_kv_head *h, int32_t j0, int n, const uint32_t **rows, uint32_t *spare) {
    const int32_t bs = h->block_size;
    const int hd = h->head_dim;
    if (bs % 2) { /* pairs across blocks, or an odd block's plain last row */
        cv_kv_gather_v(h, j0, n, spare, hd, (n + 1) / 2);
        for (int q = 0; 2 * q < n; q++) rows[q] = spare + (int64_t)q * hd;
        return;
    }
    for (int q = 0; 2 * q + 1 < n; q++) {
        const int32_t pos = j0 + 2 * q;
        rows[q] = (const uint32_t *)(region(h, h->table[pos / bs]) + (int64_t)(pos % bs) * hd); /* pair row off/2 */
    }
    if (n % 2) {
        cv_kv_gather_v(h, j0 + n - 1, 1, spare + (int64_t)(n / 2) * hd, hd, 1);
        rows[n / 2] = spare + (int64_t)(n / 2) * hd;
    }
}

void cv_kv_ask_k(const cv_kv_head *h, int32_t j0, int n, int p0, int p1) {
    const int32_t bs = h->block_size;
    for (int j = 0; j < n;) { /* a panel's run of positions: a run of words in each pair row */
        const int32_t pos = j0 + j, run = k_run(h, j0, j, n);
        int rows;
        const uint16_t *r = k_row(h, h->table[pos / bs], pos % bs, &rows);
        for (int p = p0; p < p1; p++) cv_prefetch_bytes(r + (int64_t)p * rows * 2, (size_t)run * 4);
        j += run;
    }
}

void cv_kv_ask_v(const cv_kv_head *h, int32_t j0, int n, int q0, int q1) {
    const int32_t bs = h->block_size, paired = bs & ~1;
    for (int q = q0; q < q1 && 2 * q < n; q++) { /* the pair row of each pair's first position */
        const int32_t pos = j0 + 2 * q, off = pos % bs;
        const uint16_t *r = region(h, h->table[pos / bs]);
        if (off < paired) cv_prefetch_bytes(r + (int64_t)off * h->head_dim, (size_t)h->head_dim * 4);
        else cv_prefetch_bytes(r + (int64_t)paired * h->head_dim, (size_t)h->head_dim * 2); /* an odd block's last row */
    }
}
