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
 * The kernels run only where dispatch.c found AMX and the kernel granted this process the tile
 * state (arch_prctl ARCH_REQ_XCOMP_PERM), before any of them runs (cv_cpu_amx).
 */
#ifndef CV_AMX_TILES_H
#define CV_AMX_TILES_H

#include <stdint.h>

typedef struct cv_amx_config {
    uint8_t palette;   /* 1: 8 tiles of 16 rows × 64 bytes */
    uint8_t start_row; /* 0: restart a faulted load from its first row */
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile i (0: tile unused) */
    uint8_t rows[16];
} __attribute__((aligned(64))) cv_amx_config;

_Static_assert(sizeof(cv_amx_config) == 64, "ldtilecfg reads 64 bytes");

/* Makes *cfg (static storage) the calling thread's tile configuration, unless it already is. */
void cv_amx_use(const cv_amx_config *cfg);

#endif
