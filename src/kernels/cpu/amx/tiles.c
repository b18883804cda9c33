/*
 * amx/tiles.c — loading a tile configuration once per thread and shape (tiles.h).
 */
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
