/*
 * amx/panels.c — the AMX micro-kernels of the packed formats: BF16_PANELS on bf16 activations
 * (tdpbf16ps) and I8_PANELS on int8 activations (tdpbssd).
 *
 * A panel's k groups are already B tiles: 16 consecutive 64-byte groups (16 k pairs of 16 rows for
 * bf16, 16 k quads of 16 rows for int8) are one 1 KiB tile, read contiguously. Activation rows are
 * the A tiles: 16 tokens × 64 bytes (32 bf16 or 64 int8 columns), their rows cv_act_*_stride apart
 * and zero past the weight's columns, so a tile never reads past a row. A tile product adds
 * 16 tokens × 16 outputs × 32 (or 64) products at once.
 *
 * Register tile (tiles.h): up to 32 tokens × 2 panels — accumulators C(h, j) (token half h, panel
 * j), activations A(h), weights B(j).
 *
 * Accumulation: each output is one chain of tile products over its k steps of 32 (bf16) or 64
 * (int8) columns, from zero; a k block that is not the first continues from the partial sums in y
 * (f32, or int32 bits for int8), stored and reloaded exactly, and k blocks start on whole steps.
 * So an output's bits do not depend on the token count, the tile shape, the k blocking or the
 * thread split: a decode step and a prefill give the same bits for the same row. int8 sums are
 * exact, and end in the epilogue every ISA shares (cv_i8_dequant); bf16 sums are f32 in the order
 * the hardware adds a step's pairs, which differs from vdpbf16ps's chain, so a CPU runs one or the
 * other for all token counts (formats.c).
 *
 * Decode (1-2 tokens) streams the weights from memory: a software prefetch 1 KiB ahead of each tile
 * load, one per line, brings a lone token's tile products to the bandwidth of the vdpbf16ps kernel
 * (matmul_bench, lm_head shape: 19 → 36 GB/s on 2 threads); without it they reach half of that.
 *
 * The last step of a panel's k range may be partial: its groups are copied into a zeroed tile, so
 * no load reads past the panel's codes (the last panel's would leave the mapping). A partial last
 * panel (n_out < 16) goes through a 16 × 16 buffer with masked copies; whole ones are read and
 * written in y directly.
 */
#include <assert.h>
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/amx/tiles.h"
#include "kernels/cpu/avx512/panel.h" /* panel_mask: the epilogues are AVX-512 */

enum { TILE_ROWS = CV_AMX_TILE_ROWS, TILE_BYTES = CV_AMX_TILE_BYTES, STEP_GROUPS = 16 };

/* Every output of panel j holds a result (not a partial last panel): y can be a tile's memory. */
INLINE bool whole_panel(const cv_panel_tile *t, int j) { return panel_mask(t, j) == (__mmask16)0xffff; }

INLINE float *y_at(const cv_panel_tile *t, int h, int j) { return t->y + (int64_t)h * 16 * t->ldy + 16 * j; }

/* Where C(h, j) starts from when it continues earlier k blocks: y itself, or buf holding y's rows
 * of a partial panel zero-extended. Sets *stride (bytes). */
INLINE const float *c_source(const cv_panel_tile *t, int h, int j, float *buf, int64_t *stride) {
    if (whole_panel(t, j)) {
        *stride = t->ldy * 4;
        return y_at(t, h, j);
    }
    const __mmask16 mask = panel_mask(t, j);
    for (int r = 0; r < cv_amx_half_rows(t->mr, h); r++)
        _mm512_store_ps(buf + 16 * r, _mm512_maskz_loadu_ps(mask, y_at(t, h, j) + r * t->ldy));
    *stride = TILE_BYTES;
    return buf;
}

/* Writes the results of half h, panel j from buf (the tile stored there): int8 partial sums as is,
 * the last k block of int8 through the epilogue, f32 as is; masked to the panel's outputs. */
INLINE void c_finish(const cv_panel_tile *t, int h, int j, const float *buf, bool int8) {
    const __mmask16 mask = panel_mask(t, j);
    for (int r = 0; r < cv_amx_half_rows(t->mr, h); r++) {
        float *out = y_at(t, h, j) + r * t->ldy;
        if (int8 && t->last)
            _mm512_mask_storeu_ps(out, mask, i8_dequant(t, 16 * h + r, j, _mm512_load_si512(buf + 16 * r)));
        else _mm512_mask_storeu_ps(out, mask, _mm512_load_ps(buf + 16 * r));
    }
}

/* Starting and ending accumulator tile T = C(h, j) (tile numbers must be constants). */
#define C_START(T, h, j)                                                   \
    do {                                                                   \
        if (t->first) {                                                    \
            _tile_zero(T);                                                 \
        } else {                                                           \
            int64_t stride_;                                               \
            const float *src_ = c_source(t, h, j, buf, &stride_);          \
            _tile_loadd(T, src_, stride_);                                 \
        }                                                                  \
    } while (0)

#define C_END(T, h, j)                                                       \
    do {                                                                     \
        if (whole_panel(t, j) && !(int8 && t->last)) {                       \
            _tile_stored(T, y_at(t, h, j), t->ldy * 4);                      \
        } else {                                                             \
            _tile_stored(T, buf, TILE_BYTES);                                \
            c_finish(t, h, j, buf, int8);                                    \
        }                                                                    \
    } while (0)

/* The register tile: TWO token halves or one, NP2 two panels or one. */
INLINE void tile_body(const cv_panel_tile *t, const bool int8, const bool TWO, const bool NP2) {
    cv_amx_rows(t->mr);
    float buf[TILE_ROWS * 16] __attribute__((aligned(64)));
    C_START(0, 0, 0);
    if (NP2) C_START(1, 0, 1);
    if (TWO) C_START(2, 1, 0);
    if (TWO && NP2) C_START(3, 1, 1);

    const int64_t elems_per_group = int8 ? 4 : 2, x_size = int8 ? 1 : 2;
    assert(t->k0 % (STEP_GROUPS * elems_per_group) == 0 && "k blocks start on whole steps");
    const int64_t groups = (t->k + elems_per_group - 1) / elems_per_group;
    const int64_t steps = (groups + STEP_GROUPS - 1) / STEP_GROUPS, whole = groups / STEP_GROUPS;
    const int64_t x_stride = t->ldx * x_size;
    const char *x = t->x;
    uint8_t tail[2][STEP_GROUPS * TILE_BYTES] __attribute__((aligned(64)));
    for (int64_t s = 0; s < steps; s++) {
        const uint8_t *b0 = t->w + s * STEP_GROUPS * TILE_BYTES, *b1 = b0 + t->panel_stride;
        if (s == whole) { /* the partial last step: its groups, then zeros */
            const size_t bytes = (size_t)(groups - whole * STEP_GROUPS) * TILE_BYTES;
            for (int j = 0; j < (NP2 ? 2 : 1); j++) {
                memcpy(tail[j], j ? b1 : b0, bytes);
                memset(tail[j] + bytes, 0, sizeof tail[j] - bytes);
            }
            b0 = tail[0], b1 = tail[1];
        }
        if (s < t->mr && whole_panel(t, 0) && (!NP2 || whole_panel(t, 1))) /* y's row s, for C_END's stores */
            for (int j = 0; j < (NP2 ? 2 : 1); j++) __builtin_prefetch(y_at(t, 0, j) + s * t->ldy, 1, 3);
        if (!TWO && t->ask) /* decode streams weights from memory: ask ahead of the tile loads */
            for (int l = 0; l < STEP_GROUPS; l++) {
                const int64_t at = (s * STEP_GROUPS + l) * TILE_BYTES, span = groups * TILE_BYTES;
                _mm_prefetch(cv_panel_ahead(t, 0, at, span), _MM_HINT_T0);
                if (NP2) _mm_prefetch(cv_panel_ahead(t, 1, at, span), _MM_HINT_T0);
            }
        cv_amx_step(x + s * TILE_BYTES, x_stride, b0, b1, TILE_BYTES, int8, TWO, NP2);
    }

    C_END(0, 0, 0);
    if (NP2) C_END(1, 0, 1);
    if (TWO) C_END(2, 1, 0);
    if (TWO && NP2) C_END(3, 1, 1);
}

INLINE void panel_tile(const cv_panel_tile *t, const bool int8) {
    const bool two = t->mr > TILE_ROWS, np2 = t->np > 1;
    if (two && np2) tile_body(t, int8, true, true);
    else if (two) tile_body(t, int8, true, false);
    else if (np2) tile_body(t, int8, false, true);
    else tile_body(t, int8, false, false);
}

static void panels_bf16(const cv_panel_tile *t) { panel_tile(t, false); }
static void panels_i8(const cv_panel_tile *t) { panel_tile(t, true); }

/* Prefill blocking: k blocks of 4096 groups, so every product of the Qwen3 shapes runs its whole K in
 * one call — the accumulators start as zeros and are stored once, instead of a round trip through
 * y (cache misses at y's row stride) per k block — with the weights of the 2 panels (≤ 256 KiB)
 * in L2; and token blocks of 256 tokens, whose activations stay in L2 while every panel pair passes
 * over them, so the weights cross the memory bus once per 256 tokens, as the products' rate needs.
 * k blocks are whole steps, as the chain requires. */
const cv_gemm_kernel cv_amx_panels_bf16 = {.panel = panels_bf16, .mr = CV_AMX_MAX_ROWS, .nr = 2, .kblock = 4096,
                                           .token_block = 256};
const cv_gemm_kernel cv_amx_panels_i8 = {.panel = panels_i8, .mr = CV_AMX_MAX_ROWS, .nr = 2, .kblock = 4096,
                                         .token_block = 256};
