/*
 * amx/tiles.h — what the AMX kernels share: the tile configuration record and loading one into the
 * calling thread's tile unit.
 *
 * An AMX tile unit has 8 tiles of up to 16 rows × 64 bytes, shaped by a 64-byte configuration
 * (ldtilecfg) that stays in the thread's state until the next one. Loading a configuration costs
 * far more than one tile product, so each thread remembers which one it holds and a kernel that
 * asks for the same shape again loads nothing.
 *
 * Configurations must live in static storage: gcc 12 models ldtilecfg as reading 8 bytes, so the
 * stores that build one on the stack may be dropped before it, and the first tile instruction then
 * faults (SIGILL). Every configuration here is a static const record, written by the compiler.
 *
 * The register tile every kernel here uses is the usual AMX blocking: up to 32 rows × 2 column tiles
 * of accumulators C(h, j) in tiles 0-3 (row half h, column tile j), the A rows of each half in tiles
 * 4-5 and the B columns in 6-7, so per k step 2 + 2 loads feed 4 products. Tile rows follow the
 * rows of the block (a half of 5 rows loads 5), so there is one configuration per row count, 1 to
 * 32 (cv_amx_rows), shared by all kernels. Only included by files compiled for AMX (amx/).
 *
 * The kernels run only where dispatch.c found AMX and the kernel granted this process the tile
 * state (arch_prctl ARCH_REQ_XCOMP_PERM), before any of them runs (cv_cpu_amx).
 */
#ifndef CV_AMX_TILES_H
#define CV_AMX_TILES_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct cv_amx_config {
    uint8_t palette;   /* 1: 8 tiles of 16 rows × 64 bytes */
    uint8_t start_row; /* 0: restart a faulted load from its first row */
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile i (0: tile unused) */
    uint8_t rows[16];
} __attribute__((aligned(64))) cv_amx_config;

_Static_assert(sizeof(cv_amx_config) == 64, "ldtilecfg reads 64 bytes");

enum { CV_AMX_TILE_ROWS = 16, CV_AMX_TILE_BYTES = 64, CV_AMX_MAX_ROWS = 2 * CV_AMX_TILE_ROWS };

/* Makes *cfg (static storage) the calling thread's tile configuration, unless it already is. */
void cv_amx_use(const cv_amx_config *cfg);

/* Makes the register tile of `rows` rows (1..32) the calling thread's configuration. */
void cv_amx_rows(int rows);

/* Rows of half h (0 or 1) of a block of `rows` rows. */
static inline int cv_amx_half_rows(int rows, int h) {
    const int r = rows - CV_AMX_TILE_ROWS * h;
    return r <= 0 ? 0 : r > CV_AMX_TILE_ROWS ? CV_AMX_TILE_ROWS : r;
}

/* One k step of the register tile: A(h) from a + h·16·a_stride (rows a_stride bytes apart), B(0)
 * from b0 and B(1) from b1 (rows b_stride bytes apart), then C(h, j) += A(h) · B(j) by tdpbssd
 * (int8) or tdpbf16ps (bf16 pairs); TWO: both row halves, NP2: both column tiles. */
static inline __attribute__((always_inline)) void cv_amx_step(const void *a, int64_t a_stride, const void *b0,
                                                              const void *b1, int64_t b_stride, const bool int8,
                                                              const bool TWO, const bool NP2) {
    _tile_loadd(4, a, a_stride);
    if (TWO) _tile_loadd(5, (const char *)a + CV_AMX_TILE_ROWS * a_stride, a_stride);
    _tile_loadd(6, b0, b_stride);
    if (NP2) _tile_loadd(7, b1, b_stride);
    if (int8) {
        _tile_dpbssd(0, 4, 6);
        if (NP2) _tile_dpbssd(1, 4, 7);
        if (TWO) _tile_dpbssd(2, 5, 6);
        if (TWO && NP2) _tile_dpbssd(3, 5, 7);
    } else {
        _tile_dpbf16ps(0, 4, 6);
        if (NP2) _tile_dpbf16ps(1, 4, 7);
        if (TWO) _tile_dpbf16ps(2, 5, 6);
        if (TWO && NP2) _tile_dpbf16ps(3, 5, 7);
    }
}

#endif
