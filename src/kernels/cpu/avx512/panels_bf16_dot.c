/*
 * avx512/panels_bf16_dot.c — the bf16-input BF16_PANELS micro-kernel (AVX512-BF16 vdpbf16ps), and
 * the start-up measurement that decides whether it is used (dispatch.c, cv_linear_bf16_input).
 *
 * A panel's 64-byte group is 16 rows × one k pair, exactly vdpbf16ps's second operand; a token's
 * pair of bf16 activations (cv_act.bf16, one 32-bit word) broadcast to every lane is the first. One
 * instruction then adds 2 products to each of 16 outputs — twice the multiply-adds of an f32 FMA,
 * with no widening of the weights at all.
 *
 * Tile and k block, as measured with tools/matmul_bench on AMD Zen (1 thread, M = 512, the Qwen3-0.6B
 * projections): 8 tokens × 3 panels (24 accumulators, 3 weight lines, 1 broadcast) beat 6×4, 7×4,
 * 7×3 and 12×2 by 3-15 %; a k block of 512 pairs (3 panels × 32 KiB, in L2) beat the f32 kernel's
 * 128 (in L1) by ~10 %: the per-block reload of 24 accumulators and the short inner loop cost more
 * than the L1 misses the L2 prefetchers hide. ~350-390 GFLOP/s per core against the f32 kernel's
 * ~170; a lone decode token streams weights as fast as the f32 kernel does.
 *
 * Each output is one chain of vdpbf16ps over its k pairs in order, from zero: a k block that is not
 * the first continues from the f32 partial sums in y (stored and reloaded exactly), so the chain
 * does not depend on the tile shape, the k blocking, the thread split or the tokens batched with
 * it (a decode step and a prefill give the same bits for the same row). Odd K needs no tail: the
 * last pair's high half is zero in the activations and in the weights.
 *
 * The instruction rounds twice per lane and flushes subnormals: acc ← ftz(fma(x_even, w_even,
 * ftz(fma(x_odd, w_odd, acc)))) with bf16 inputs and acc read as zero when subnormal (the products
 * of two bf16 are exact in f32); tests/test_kernels.c checks that bit for bit.
 *
 * Whether it beats f32 FMA on widened weights depends on the core: AMD Zen 4/5 issue it at the FMA
 * rate (2× the multiply-adds), some Xeons at half that (no gain, and bf16 rounding of the inputs
 * for nothing). So dispatch.c times the two instructions once, on registers only
 * (cv_avx512_bf16_dot_speedup).
 */
#include <string.h>

#include "base/timeutil.h"
#include "kernels/cpu/avx512/panel.h"

#define BF16 __attribute__((target("avx512bf16")))

/* The 2 activations of token i at pair p, as one 32-bit word. */
INLINE int x_pair(const cv_panel_tile *t, int i, int64_t p) {
    int32_t v;
    memcpy(&v, (const uint16_t *)t->x + i * t->ldx + 2 * p, sizeof v);
    return v;
}

BF16 INLINE void dot_tile(const cv_panel_tile *t, const int MR, const int NP) {
    __m512 acc[8][3];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) /* a later k block continues the chain from y */
            acc[i][j] = t->first ? _mm512_setzero_ps()
                                 : _mm512_maskz_loadu_ps(panel_mask(t, j), t->y + i * t->ldy + 16 * j);
    const int64_t pairs = (t->k + 1) / 2;
    for (int64_t p = 0; p < pairs; p++) {
        __m512bh w[3];
        for (int j = 0; j < NP; j++) {
            const uint8_t *src = t->w + j * t->panel_stride + p * 64;
            if (MR <= CV_STREAM_TOKENS && t->ask) _mm_prefetch(cv_panel_ahead(t, j, p * 64, pairs * 64), _MM_HINT_T0);
            w[j] = (__m512bh)_mm512_loadu_si512(src);
        }
        for (int i = 0; i < MR; i++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(x_pair(t, i, p));
            for (int j = 0; j < NP; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xb, w[j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) _mm512_mask_storeu_ps(t->y + i * t->ldy + 16 * j, panel_mask(t, j), acc[i][j]);
}

BF16 PANEL_DISPATCH(panels_bf16_dot, dot_tile, 8, 3)

const cv_gemm_kernel cv_avx512_panels_bf16_dot = {.panel = panels_bf16_dot, .mr = 8, .nr = 3, .kblock = 512};

/* ---- the start-up measurement ----------------------------------------------------------------- */

/* LANES independent chains (enough to cover either instruction's latency at its full rate), n
 * steps each; the sum keeps the work live. The operands stay in registers. */
enum { LANES = 16 };

BF16 static __attribute__((noinline)) float dot_loop(int64_t n) {
    __m512 acc[LANES];
    for (int i = 0; i < LANES; i++) acc[i] = _mm512_setzero_ps();
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3c003c00), b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    for (int64_t s = 0; s < n; s++)
        for (int i = 0; i < LANES; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __m512 sum = acc[0];
    for (int i = 1; i < LANES; i++) sum = _mm512_add_ps(sum, acc[i]);
    return _mm512_reduce_add_ps(sum);
}

static __attribute__((noinline)) float fma_loop(int64_t n) {
    __m512 acc[LANES];
    for (int i = 0; i < LANES; i++) acc[i] = _mm512_setzero_ps();
    const __m512 a = _mm512_set1_ps(0x1p-8f), b = _mm512_set1_ps(0x1p-8f);
    for (int64_t s = 0; s < n; s++)
        for (int i = 0; i < LANES; i++) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    __m512 sum = acc[0];
    for (int i = 1; i < LANES; i++) sum = _mm512_add_ps(sum, acc[i]);
    return _mm512_reduce_add_ps(sum);
}

/* Under 2 ms: ROUNDS alternating short runs of each loop (10-40 µs apiece at 3-4 GHz), the fastest
 * of each counted, so a preempted run, a busy SMT sibling or a clock still ramping up does not
 * decide as long as some runs of each escape it. */
enum { ROUNDS = 32, STEPS = 1 << 12 };

double cv_avx512_bf16_dot_speedup(void) {
    double best_dot = 1e30, best_fma = 1e30;
    volatile float sink = 0.0f;
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = cv_now();
        sink += dot_loop(STEPS);
        double t1 = cv_now();
        sink += fma_loop(STEPS);
        double t2 = cv_now();
        best_dot = t1 - t0 < best_dot ? t1 - t0 : best_dot;
        best_fma = t2 - t1 < best_fma ? t2 - t1 : best_fma;
    }
    (void)sink;
    /* vdpbf16ps does 32 multiply-adds, vfmadd231ps 16, in the same number of instructions */
    return (32.0 / best_dot) / (16.0 / best_fma);
}
