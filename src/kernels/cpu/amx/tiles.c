/*
 * amx/tiles.c — the register tile's configurations, and loading one once per thread and shape
 * (tiles.h).
 */
#include <assert.h>
#include <immintrin.h>

#include "kernels/cpu/amx/tiles.h"

/* The configuration this thread's tile unit holds (NULL: none yet). A thread starts without one;
 * nothing in cvllm releases the tiles, so what was loaded stays until replaced. */
static _Thread_local const cv_amx_config *loaded;

void cv_amx_use(const cv_amx_config *cfg) {
    if (loaded == cfg) return;
    _tile_loadconfig(cfg);
    loaded = cfg;
}

#define HALF(m, h) ((m) - 16 * (h) <= 0 ? 0 : (m) - 16 * (h) > 16 ? 16 : (m) - 16 * (h))
#define COLS(r) ((r) ? CV_AMX_TILE_BYTES : 0)
#define CONFIG(m)                                                                                                \
    {                                                                                                            \
        .palette = 1,                                                                                            \
        .colsb = {COLS(HALF(m, 0)), COLS(HALF(m, 0)), COLS(HALF(m, 1)), COLS(HALF(m, 1)), COLS(HALF(m, 0)),      \
                  COLS(HALF(m, 1)), CV_AMX_TILE_BYTES, CV_AMX_TILE_BYTES},                                       \
        .rows = {HALF(m, 0), HALF(m, 0), HALF(m, 1), HALF(m, 1), HALF(m, 0), HALF(m, 1), CV_AMX_TILE_ROWS,        \
                 CV_AMX_TILE_ROWS},                                                                              \
    }
#define CONFIG4(b) CONFIG((b) + 1), CONFIG((b) + 2), CONFIG((b) + 3), CONFIG((b) + 4)

/* configs[m − 1]: C(h, j) tiles 0-3, A(h) 4-5, B(j) 6-7 of an m-row register tile */
static const cv_amx_config configs[CV_AMX_MAX_ROWS] = {CONFIG4(0),  CONFIG4(4),  CONFIG4(8),  CONFIG4(12),
                                                       CONFIG4(16), CONFIG4(20), CONFIG4(24), CONFIG4(28)};

void cv_amx_rows(int rows) {
    assert(rows >= 1 && rows <= CV_AMX_MAX_ROWS);
    cv_amx_use(&configs[rows - 1]);
}
