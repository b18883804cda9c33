/*
 * avx512/panels_fp8_dot.c — the FP8_PANELS micro-kernel on bf16 activations (bf16 compute on a
 * CPU whose vdpbf16ps beats f32 FMA: AMD Zen 4/5), with AVX512-BF16 and AVX512-VBMI.
 *
 * Why: the f32 kernel (panels_fp8.c) widens each e4m3 code through f16 and vcvtph2ps and spends one
 * f32 FMA per 16 weights; on Zen 5 that conversion bounds it at ~32 GB/s of codes per core from the
 * caches, below what memory delivers, where the int8 kernel streams ~85. Here a code becomes the
 * bf16 of its value / 256 by two table lookups (vpermi2b: the low and the high byte of the 128
 * magnitudes, the sign bit ORed in by a vpternlogd; exact for every non-NaN code, subnormals
 * included, since bf16 has f32's exponent range); a vpermb first puts a group's codes in k-pair
 * order, so that vpunpcklbw/vpunpckhbw of the two bytes are vdpbf16ps's words, and one vdpbf16ps
 * adds 32 products: 3 byte permutes, 3 other vector µops and 2 dot products per 64 codes a token
 * (~61 GB/s of codes per core from L3 on Zen 5, the f32 kernel's 2×; the same as two vpermt2b
 * after the lookups, which need one permute more).
 *
 * Layout: the f32 kernel's (format_fp8.c), a 64-byte group being 4 k × 16 rows. The first k pair
 * of a group feeds one accumulator, the second another: two chains an output, so one decode token
 * has 2·NP independent vdpbf16ps chains (6-cycle latency) and streams at the rate memory gives.
 * A tile of more than 3 tokens (prefill, decode batches) widens each scale block's codes once into
 * a 12 KiB buffer and runs 3-token sub-tiles from it, each token's activation word broadcast once
 * for the tile's panels: the widening, as many µops as the dot products at 3 tokens, is paid once
 * for up to 24 (0.6B FP8 on Zen 5, 2 threads, with --profile, two alternations: pp512 467-473 →
 * 602-605 tok/s, a batch of 16 decoding 250-255 → 281-286, one token the same).
 *
 * An output, per 128-column scale block, is exactly (what tests/test_kernels.c models per lane):
 * chain A over the block's groups g of the pair (k, k+1), chain B over (k+2, k+3), each from zero
 * in vdpbf16ps's rounding (formats.h), a last partial group padded with zero codes and the zero
 * activations past cols; then y ← fma(A + B, 256·scale, y) with y = 0 at the first block, as the
 * f32 kernel adds its blocks. A k block continues from y (whole 128-column blocks), so the bits do
 * not depend on the tile shape, the k blocking, the thread split or the batch.
 */
#include <string.h>

#include "kernels/cpu/avx512/panel.h"

#define DOT __attribute__((target("avx512bf16,avx512vbmi")))

/* The bf16 of an e4m3 magnitude's value / 256 (index: the code without its sign bit), low bytes
 * then high bytes. A normal code (exponent e ≥ 1, mantissa m) is (16·m + 128·(e mod 2),
 * 0x38 + e / 2); the first 8 are the subnormals m · 2^-17. */
static const uint8_t LUT_LO[128] __attribute__((aligned(64))) = {
    0x00, 0x00, 0x80, 0xc0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0};
static const uint8_t LUT_HI[128] __attribute__((aligned(64))) = {
    0x00, 0x37, 0x37, 0x37, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38,
    0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39,
    0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a,
    0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b,
    0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c,
    0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
    0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e,
    0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f};

/* vpermb's order for a group's 64 codes ([4 k][16 rows]) that makes vpunpcklbw / vpunpckhbw of the
 * widened low and high bytes vdpbf16ps's [16 rows][k pair] words: in each 16-byte lane q, rows
 * 4q..4q+3 as (k, k+1) byte pairs, then as (k+2, k+3) pairs. */
#define ROW_PAIR(k, r) (k) * 16 + (r), ((k) + 1) * 16 + (r)
#define ROWS4(q, k) ROW_PAIR(k, 4 * (q)), ROW_PAIR(k, 4 * (q) + 1), ROW_PAIR(k, 4 * (q) + 2), ROW_PAIR(k, 4 * (q) + 3)
#define LANE(q) ROWS4(q, 0), ROWS4(q, 2)
static const uint8_t PAIR_ORDER[64] __attribute__((aligned(64))) = {LANE(0), LANE(1), LANE(2), LANE(3)};

typedef struct widen_regs {
    __m512i lo0, lo1, hi0, hi1, order, sign;
} widen_regs;

/* A group's 64 codes as the bf16 weights of its two k pairs, in vdpbf16ps's [16 rows][pair] order. */
DOT INLINE void widen64(const widen_regs *r, __m512i codes, __m512bh *w0, __m512bh *w1) {
    codes = _mm512_permutexvar_epi8(r->order, codes);
    const __m512i lo = _mm512_permutex2var_epi8(r->lo0, codes, r->lo1);
    __m512i hi = _mm512_permutex2var_epi8(r->hi0, codes, r->hi1);
    hi = _mm512_ternarylogic_epi32(hi, codes, r->sign, 0xf8); /* hi | (codes & 0x80) */
    *w0 = (__m512bh)_mm512_unpacklo_epi8(lo, hi);
    *w1 = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
}

/* The widening's registers: the two tables, the pair order and the sign bit. */
DOT INLINE widen_regs widen_regs_load(void) {
    return (widen_regs){
        .lo0 = _mm512_load_si512(LUT_LO), .lo1 = _mm512_load_si512(LUT_LO + 64),
        .hi0 = _mm512_load_si512(LUT_HI), .hi1 = _mm512_load_si512(LUT_HI + 64),
        .order = _mm512_load_si512(PAIR_ORDER),
        .sign = _mm512_set1_epi8((char)0x80),
    };
}

/* Panel j's 64 codes of the group at column k of the tile; a partial last group of K reads its
 * missing codes as zero. */
DOT INLINE __m512i group_codes(const cv_panel_tile *t, int j, int64_t k) {
    const __mmask64 m = k + 4 <= t->k ? ~(__mmask64)0 : ((__mmask64)1 << ((t->k - k) * 16)) - 1;
    return _mm512_maskz_loadu_epi8(m, t->w + j * t->panel_stride + k * 16);
}

/* Token i's activations k, k+1 as one 32-bit word, broadcast. */
DOT INLINE __m512bh x_pair(const cv_panel_tile *t, int i, int64_t k) {
    int32_t v;
    memcpy(&v, (const uint16_t *)t->x + i * t->ldx + k, sizeof v);
    return (__m512bh)_mm512_set1_epi32(v);
}

DOT INLINE void dot_tile(const cv_panel_tile *t, const int MR, const int NP) {
    const widen_regs r = widen_regs_load();
    for (int64_t b0 = 0; b0 < t->k; b0 += CV_FP8_SCALE_COLS) {
        const int64_t b1 = b0 + CV_FP8_SCALE_COLS < t->k ? b0 + CV_FP8_SCALE_COLS : t->k;
        __m512 a[3][3], b[3][3]; /* the chains of the first and the second pair of each group */
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NP; j++) a[i][j] = b[i][j] = _mm512_setzero_ps();
        for (int64_t k = b0; k < b1; k += 4) {
            for (int j = 0; j < NP; j++) {
                if (MR <= CV_STREAM_TOKENS && t->ask) _mm_prefetch(cv_panel_ahead(t, j, k * 16, t->k * 16), _MM_HINT_T0);
                __m512bh w0, w1;
                widen64(&r, group_codes(t, j, k), &w0, &w1);
                for (int i = 0; i < MR; i++) {
                    a[i][j] = _mm512_dpbf16_ps(a[i][j], x_pair(t, i, k), w0);
                    b[i][j] = _mm512_dpbf16_ps(b[i][j], x_pair(t, i, k + 2), w1);
                }
            }
        }
        for (int j = 0; j < NP; j++)
            for (int i = 0; i < MR; i++) fp8_block_store(t, i, j, b0, _mm512_add_ps(a[i][j], b[i][j]));
    }
}

DOT PANEL_DISPATCH(panels_fp8_dot_narrow, dot_tile, 3, 3)

/* dot_tile's chains for tokens i0..i0+MR-1 over one scale block [b0, b0 + 4·groups), from codes
 * widened before: panel j's group g at wb[2·(j·groups + g)] (its first k pair) and the vector after
 * it (the second). A group runs pair by pair: the NP panels' words of the pair in registers, each
 * token's activation word broadcast once for them, as the bf16 kernel does (6 weight loads and 2·MR
 * broadcasts per 2·MR·NP dot products). */
DOT INLINE void widened_tile(const cv_panel_tile *t, const __m512bh *wb, int64_t b0, int64_t groups, int i0,
                             const int MR, const int NP) {
    __m512 a[3][3], b[3][3];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) a[i][j] = b[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512bh w[3];
        for (int j = 0; j < NP; j++) w[j] = wb[2 * (j * groups + g)];
        for (int i = 0; i < MR; i++) {
            const __m512bh x = x_pair(t, i0 + i, b0 + 4 * g);
            for (int j = 0; j < NP; j++) a[i][j] = _mm512_dpbf16_ps(a[i][j], x, w[j]);
        }
        for (int j = 0; j < NP; j++) w[j] = wb[2 * (j * groups + g) + 1];
        for (int i = 0; i < MR; i++) {
            const __m512bh x = x_pair(t, i0 + i, b0 + 4 * g + 2);
            for (int j = 0; j < NP; j++) b[i][j] = _mm512_dpbf16_ps(b[i][j], x, w[j]);
        }
    }
    for (int j = 0; j < NP; j++)
        for (int i = 0; i < MR; i++) fp8_block_store(t, i0 + i, j, b0, _mm512_add_ps(a[i][j], b[i][j]));
}

#define WIDENED_CASE(MR, NP) \
    case (MR) * 4 + (NP): widened_tile(t, wb, b0, groups, i0, MR, NP); return;
#define WIDENED_ROW(MR) WIDENED_CASE(MR, 1) WIDENED_CASE(MR, 2) WIDENED_CASE(MR, 3)

/* widened_tile at the shape of mr (1-3) tokens × the tile's panels. */
DOT static void widened_shape(const cv_panel_tile *t, const __m512bh *wb, int64_t b0, int64_t groups, int i0, int mr) {
    switch (mr * 4 + t->np) {
        WIDENED_ROW(1) WIDENED_ROW(2) WIDENED_ROW(3)
    default: __builtin_unreachable();
    }
}

/* A tile of up to 3 tokens (decode) widens each code where it multiplies (dot_tile). A wider one
 * (prefill, decode batches) widens each scale block's codes once, into wb, and runs the same chains
 * over its 3-token sub-tiles from there: the same bits, and the widening (6 µops per 64 codes) paid
 * once for up to 24 tokens instead of once for 3. */
DOT static void panels_fp8_dot(const cv_panel_tile *t) {
    enum { SUB = 3, GROUPS = CV_FP8_SCALE_COLS / 4 };
    if (t->mr <= SUB) {
        panels_fp8_dot_narrow(t);
        return;
    }
    const widen_regs r = widen_regs_load();
    __m512bh wb[3 * GROUPS * 2]; /* 12 KiB */
    for (int64_t b0 = 0; b0 < t->k; b0 += CV_FP8_SCALE_COLS) {
        const int64_t groups = ((t->k - b0 < CV_FP8_SCALE_COLS ? t->k - b0 : CV_FP8_SCALE_COLS) + 3) / 4;
        for (int j = 0; j < t->np; j++)
            for (int64_t g = 0; g < groups; g++)
                widen64(&r, group_codes(t, j, b0 + 4 * g), &wb[2 * (j * groups + g)], &wb[2 * (j * groups + g) + 1]);
        /* the next scale block's codes (or the next tile's first) come in while these are multiplied */
        const uint8_t *next = b0 + CV_FP8_SCALE_COLS < t->k ? t->w + (b0 + CV_FP8_SCALE_COLS) * 16 : t->next;
        if (next)
            for (int j = 0; j < t->np; j++)
                for (int at = 0; at < CV_FP8_SCALE_COLS * 16; at += 64)
                    _mm_prefetch(next + j * t->panel_stride + at, _MM_HINT_T0);
        for (int i0 = 0; i0 < t->mr; i0 += SUB)
            widened_shape(t, wb, b0, groups, i0, t->mr - i0 < SUB ? t->mr - i0 : SUB);
    }
}

const cv_gemm_kernel cv_avx512_panels_fp8_dot = {.panel = panels_fp8_dot, .mr = 24, .nr = 3, .vbmi = true};
