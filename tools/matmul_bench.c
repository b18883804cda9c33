/*
 * matmul_bench.c — times cv_linear for every weight format on the Qwen3 projection shapes, for
 * kernel tuning and to compare formats (never run in CI): the checkpoint's row-major bf16, and the
 * packed BF16_PANELS, I8_PANELS (int8 activations, quantized once before timing) and FP8_PANELS.
 * BF16_PANELS and FP8_PANELS run twice where the CPU has AVX512-BF16: on f32 activations (f32 FMA),
 * and on bf16 activations (vdpbf16ps, bf16 compute; rounded once before timing; "bf16x" lines),
 * whatever the start-up measurement of cv_linear_bf16_input() decided — its verdict is printed in
 * the header. Where the
 * CPU has AMX, BF16_PANELS (bf16 activations) and I8_PANELS run once more on it ("amx" lines).
 *
 * Decode (M = 1) is bound by memory bandwidth, so its figure of merit is GB/s of weight bytes
 * streamed (the packed bytes, scales included); prefill is bound by arithmetic (GFLOP/s, 2·M·N·K).
 * The machine these kernels are tuned on is shared, so besides wall-clock figures it reports
 * GFLOP/s per second of the calling thread's CPU time, which does not drop when another process
 * takes the core; and formats are run back to back on the same shape, so their ratio within one
 * run is meaningful even when the absolute numbers move.
 *
 * Build (from the repository root, after building the library):
 *   cc -O2 -Isrc -Iinclude tools/matmul_bench.c build/libcv_kernels.a build/libcv_base.a -lm -lpthread -o /tmp/mmb
 * Usage: mmb [threads] [isa] [decode|prefill|all]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "base/threadpool.h"
#include "kernels/cpu/formats.h"
#include "kernels/kernels.h"

static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Times `reps` products of one weight; prints one line. */
static void time_format(cv_threadpool *pool, const char *name, const cv_weight *w, const cv_act *x, int64_t m,
                        float *y) {
    const double flops = 2.0 * (double)m * (double)w->rows * (double)w->cols;
    const double bytes = (double)cv_weight_packed_bytes(w->format, w->rows, w->cols);
    int reps = (int)(2e10 / flops) + 1;
    if (reps > 2000) reps = 2000;
    cv_linear(pool, w, x, m, 1, &w->rows, &y); /* warm-up: pages in the weight */
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < reps; r++) cv_linear(pool, w, x, m, 1, &w->rows, &y);
    double wall = clock_s(CLOCK_MONOTONIC) - w0, cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    printf("%-17s M=%-4lld N=%-6lld K=%-5lld  %7.1f GFLOP/s wall  %7.1f GFLOP/s per thread-cpu-s  %6.1f GB/s weights\n",
           name, (long long)m, (long long)w->rows, (long long)w->cols, flops * reps / wall * 1e-9,
           flops * reps / cpu * 1e-9, bytes * reps / wall * 1e-9);
}

/* The CPU has the bf16-input kernel (switched on for the bench where the start-up measurement said no). */
static bool bf16_dot;
/* The CPU has AMX: its kernels run as extra lines, the others with it switched off. */
static bool amx;

/* One shape in every format, back to back, on random weights (the values do not change the time). */
static void run_shape(cv_threadpool *pool, int64_t m, int64_t n, int64_t k) {
    uint16_t *bf16 = malloc((size_t)(n * k) * 2);
    int8_t *i8 = malloc((size_t)(n * k));
    uint8_t *e4m3 = malloc((size_t)(n * k));
    float *row_scale = malloc((size_t)n * 4), *block_scale = malloc((size_t)((n + 127) / 128 * ((k + 127) / 128)) * 4);
    float *x = malloc((size_t)(m * k) * 4), *y = malloc((size_t)(m * n) * 4), *x_scale = malloc((size_t)m * 4);
    int8_t *xq = malloc((size_t)(m * cv_act_i8_stride(k)));
    uint16_t *xb = malloc((size_t)(m * cv_act_bf16_stride(k)) * 2);
    if (!bf16 || !i8 || !e4m3 || !row_scale || !block_scale || !x || !y || !x_scale || !xq || !xb) abort();
    for (int64_t i = 0; i < n * k; i++) {
        bf16[i] = cv_f32_to_bf16((float)((i * 7919) % 1000) * 1e-3f - 0.5f);
        i8[i] = (int8_t)((i * 7919) % 255 - 127);
        e4m3[i] = (uint8_t)((i * 7919) % 0x7f); /* positive, no NaN */
    }
    for (int64_t i = 0; i < n; i++) row_scale[i] = 1e-3f;
    for (int64_t i = 0; i < (n + 127) / 128 * ((k + 127) / 128); i++) block_scale[i] = 1e-2f;
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    const cv_act_quant dynamic = {.dynamic = true};
    cv_quantize_rows(&dynamic, x, k, m, k, xq, x_scale);
    cv_round_bf16_rows(pool, x, k, m, k, xb);
    const cv_matrix rows = {bf16, CV_DTYPE_BF16, n, k};
    const cv_weight_part parts[] = {
        {.dtype = CV_DTYPE_BF16, .rows = n, .cols = k, .data = bf16},
        {.dtype = CV_DTYPE_I8, .rows = n, .cols = k, .data = i8, .row_scale = row_scale},
        {.dtype = CV_DTYPE_F8_E4M3, .rows = n, .cols = k, .data = e4m3, .block_scale = block_scale, .block = 128},
    };
    const cv_act act = {.f32 = x, .i8 = xq, .i8_scale = x_scale};
    const cv_weight view = cv_weight_view(&rows);
    time_format(pool, cv_wformat_name(view.format), &view, &act, m, y);
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
        cv_weight w;
        if (cv_weight_pack(pool, &parts[p], 1, &w)) abort();
        if (amx) cv_cpu_amx_enable(false);
        time_format(pool, cv_wformat_name(w.format), &w, &act, m, y);
        if (bf16_dot && cv_wformat_bf16_input(w.format)) { /* AMX is off here: the vdpbf16ps kernels */
            char name[32];
            snprintf(name, sizeof name, "%s bf16x", cv_wformat_name(w.format));
            time_format(pool, name, &w, &(cv_act){.bf16 = xb}, m, y);
        }
        if (amx) cv_cpu_amx_enable(true);
        if (amx && w.format == CV_WFORMAT_BF16_PANELS)
            time_format(pool, "bf16_panels amx", &w, &(cv_act){.bf16 = xb}, m, y);
        if (amx && w.format == CV_WFORMAT_I8_PANELS) time_format(pool, "i8_panels amx", &w, &act, m, y);
        cv_weight_release(&w);
    }
    free(bf16);
    free(i8);
    free(e4m3);
    free(row_scale);
    free(block_scale);
    free(x);
    free(y);
    free(x_scale);
    free(xq);
    free(xb);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2 && cv_isa_force((cv_isa)cv_isa_from_name(argv[2])) != 0) {
        fprintf(stderr, "unknown or unsupported ISA %s\n", argv[2]);
        return 2;
    }
    const char *which = argc > 3 ? argv[3] : "all";
    cv_threadpool *pool = cv_threadpool_create(threads);
    amx = cv_cpu_amx();
    const bool chosen = cv_linear_bf16_input();
    bf16_dot = chosen || (cv_isa_active() == CV_ISA_AVX512 && cv_cpu_bf16_dot_enable(true) == 0);
    printf("%s%s, %d thread(s), f32 activations (int8 for i8_panels, bf16 for bf16x and amx), weights as named; bf16 "
           "compute would use %s\n", cv_isa_name(cv_isa_active()), amx ? "+amx" : "", threads,
           amx ? "bf16 inputs (AMX)" : chosen ? "bf16 inputs (vdpbf16ps)"
           : bf16_dot ? "f32 inputs (vdpbf16ps measured too slow)" : "f32 inputs");
    static const int64_t prefill[][3] = {{512, 2048, 1024}, {512, 3072, 1024}, {512, 1024, 3072}};
    static const int64_t decode[][3] = {{1, 2048, 1024}, {1, 3072, 1024}, {1, 1024, 3072}, {1, 151936, 1024}};
    if (strcmp(which, "decode") != 0)
        for (size_t s = 0; s < sizeof prefill / sizeof prefill[0]; s++)
            run_shape(pool, prefill[s][0], prefill[s][1], prefill[s][2]);
    if (strcmp(which, "prefill") != 0)
        for (size_t s = 0; s < sizeof decode / sizeof decode[0]; s++) run_shape(pool, decode[s][0], decode[s][1], decode[s][2]);
    cv_threadpool_free(pool);
    return 0;
}
