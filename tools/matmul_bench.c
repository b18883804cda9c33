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
 * Usage: mmb [threads] [isa] [decode|prefill|all|chain|stream]
 *
 * chain: the decode GEMVs of a Qwen3-0.6B forward pass in I8_PANELS (28 layers × qkv, o, gate_up,
 * down, every weight its own memory: 0.44 GB, beyond any L3) run in the model's order and form
 * (q|k|v as three outputs, SwiGLU fused into gate|up), against
 * one weight of the same bytes run alone, and a plain read of that weight's bytes by the same
 * threads. chain/one is what the calls' boundaries cost (the pool's hand-over and end wait, the
 * cold start of each weight's streams); one/read is the kernel's share of what the memory gives
 * these threads, measured seconds apart, so the VM's swings cancel more than against bench/triad.
 *
 * stream: I8_PANELS and BF16_PANELS (bf16 activations where the CPU has the vdpbf16ps kernel)
 * streamed from memory by one token, alternated 40 times a fraction of a second apart, on the
 * lm_head shape (K = 1024: tiles of 48 and 96 KiB) and on one of K = 4096 with as many bytes: the
 * medians of each, and of their ratio. A tile's fixed costs show as the gap between the two K; the
 * alternation keeps the VM's swings (2× within minutes on a shared host) out of the ratio. To
 * compare two versions of the library, build the bench against each and run them in turn.
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

/* Random weights of one N × K shape in each stored form (the values do not change the time), and M
 * activation rows in each input form the kernels read. */
typedef struct bench_data {
    int64_t m, n, k;
    uint16_t *bf16;
    int8_t *i8;
    uint8_t *e4m3;
    float *row_scale, *block_scale;
    float *x, *y, *x_scale; /* x: f32 rows; y: [m][n] outputs */
    int8_t *xq;             /* x quantized per row (scales x_scale) */
    uint16_t *xb;           /* x rounded to bf16 */
    cv_weight_part parts[3]; /* BF16, I8 (row scales), F8_E4M3 (128 × 128 block scales) */
} bench_data;

static bench_data make_data(cv_threadpool *pool, int64_t m, int64_t n, int64_t k) {
    const int64_t blocks = (n + 127) / 128 * ((k + 127) / 128);
    bench_data d = {
        .m = m, .n = n, .k = k,
        .bf16 = malloc((size_t)(n * k) * 2), .i8 = malloc((size_t)(n * k)), .e4m3 = malloc((size_t)(n * k)),
        .row_scale = malloc((size_t)n * 4), .block_scale = malloc((size_t)blocks * 4),
        .x = malloc((size_t)(m * k) * 4), .y = malloc((size_t)(m * n) * 4), .x_scale = malloc((size_t)m * 4),
        .xq = malloc((size_t)(m * cv_act_i8_stride(k))), .xb = malloc((size_t)(m * cv_act_bf16_stride(k)) * 2),
    };
    if (!d.bf16 || !d.i8 || !d.e4m3 || !d.row_scale || !d.block_scale || !d.x || !d.y || !d.x_scale || !d.xq || !d.xb)
        abort();
    for (int64_t i = 0; i < n * k; i++) {
        d.bf16[i] = cv_f32_to_bf16((float)((i * 7919) % 1000) * 1e-3f - 0.5f);
        d.i8[i] = (int8_t)((i * 7919) % 255 - 127);
        d.e4m3[i] = (uint8_t)((i * 7919) % 0x7f); /* positive, no NaN */
    }
    for (int64_t i = 0; i < n; i++) d.row_scale[i] = 1e-3f;
    for (int64_t i = 0; i < blocks; i++) d.block_scale[i] = 1e-2f;
    for (int64_t i = 0; i < m * k; i++) d.x[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    const cv_act_quant dynamic = {.dynamic = true};
    cv_quantize_rows(pool, &dynamic, d.x, k, m, k, d.xq, d.x_scale);
    cv_round_bf16_rows(pool, d.x, k, m, k, d.xb);
    d.parts[0] = (cv_weight_part){.dtype = CV_DTYPE_BF16, .rows = n, .cols = k, .data = d.bf16};
    d.parts[1] = (cv_weight_part){.dtype = CV_DTYPE_I8, .rows = n, .cols = k, .data = d.i8, .row_scale = d.row_scale};
    d.parts[2] = (cv_weight_part){.dtype = CV_DTYPE_F8_E4M3, .rows = n, .cols = k, .data = d.e4m3,
                                  .block_scale = d.block_scale, .block = 128};
    return d;
}

static void free_data(bench_data *d) {
    free(d->bf16);
    free(d->i8);
    free(d->e4m3);
    free(d->row_scale);
    free(d->block_scale);
    free(d->x);
    free(d->y);
    free(d->x_scale);
    free(d->xq);
    free(d->xb);
}

/* One shape in every format, back to back. */
static void run_shape(cv_threadpool *pool, int64_t m, int64_t n, int64_t k) {
    bench_data d = make_data(pool, m, n, k);
    const cv_matrix rows = {d.bf16, CV_DTYPE_BF16, n, k};
    const cv_act act = {.f32 = d.x, .i8 = d.xq, .i8_scale = d.x_scale};
    const cv_weight view = cv_weight_view(&rows);
    time_format(pool, cv_wformat_name(view.format), &view, &act, m, d.y);
    for (size_t p = 0; p < sizeof d.parts / sizeof d.parts[0]; p++) {
        cv_weight w;
        if (cv_weight_pack(pool, &d.parts[p], 1, &w)) abort();
        if (amx) cv_cpu_amx_enable(false);
        time_format(pool, cv_wformat_name(w.format), &w, &act, m, d.y);
        if (bf16_dot && cv_wformat_bf16_input(w.format)) { /* AMX is off here: the vdpbf16ps kernels */
            char name[32];
            snprintf(name, sizeof name, "%s bf16x", cv_wformat_name(w.format));
            time_format(pool, name, &w, &(cv_act){.bf16 = d.xb}, m, d.y);
        }
        if (amx) cv_cpu_amx_enable(true);
        if (amx && w.format == CV_WFORMAT_BF16_PANELS)
            time_format(pool, "bf16_panels amx", &w, &(cv_act){.bf16 = d.xb}, m, d.y);
        if (amx && w.format == CV_WFORMAT_I8_PANELS) time_format(pool, "i8_panels amx", &w, &act, m, d.y);
        cv_weight_release(&w);
    }
    free_data(&d);
}

/* A plain read of bytes [0, n) of p split over the pool as the GEMV splits its panels: each
 * thread sums its half as 64-bit words (vectorized loads, the hardware prefetchers only). */
typedef struct read_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum[64];
} read_job;

static void read_task(void *arg, int ti, int nt) {
    read_job *r = arg;
    const size_t b = r->n / 8 * (size_t)ti / (size_t)nt, e = r->n / 8 * (size_t)(ti + 1) / (size_t)nt;
    uint64_t s = 0;
    for (size_t i = b; i < e; i++) s += r->p[i];
    r->sum[ti % 64] += s;
}

/* The chain mode (see the top): GB/s of the 0.6B's decode GEMVs in order, then of one weight as large. */
static void run_chain(cv_threadpool *pool) {
    enum { LAYERS = 28, REPS = 20 };
    static const int64_t shapes[4][2] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}};
    cv_weight w[LAYERS * 4 + 1];
    double bytes = 0;
    int8_t *codes = malloc((size_t)6144 * 3072);
    float *scale = malloc((size_t)6144 * 4), *x = malloc(3072 * 4), x_scale;
    int8_t *xq = malloc((size_t)cv_act_i8_stride(3072));
    if (!codes || !scale || !x || !xq) abort();
    for (int64_t i = 0; i < 6144 * 3072; i++) codes[i] = (int8_t)((i * 7919) % 255 - 127);
    for (int64_t i = 0; i < 6144; i++) scale[i] = 1e-3f;
    for (int64_t i = 0; i < 3072; i++) x[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    const cv_act_quant dynamic = {.dynamic = true};
    cv_quantize_rows(NULL, &dynamic, x, 3072, 1, 3072, xq, &x_scale);
    for (int i = 0; i < LAYERS * 4; i++) {
        const cv_weight_part part = {.dtype = CV_DTYPE_I8, .rows = shapes[i % 4][0], .cols = shapes[i % 4][1],
                                     .data = codes, .row_scale = scale};
        if (cv_weight_pack(pool, &part, 1, &w[i])) abort();
        bytes += (double)cv_weight_packed_bytes(w[i].format, w[i].rows, w[i].cols);
    }
    /* the single weight: rows of 1024 columns to the chain's bytes */
    const int64_t one_rows = (int64_t)(bytes / 1040) / 16 * 16;
    int8_t *big = malloc((size_t)one_rows * 1024);
    float *ones = malloc((size_t)one_rows * 4), *y = malloc((size_t)one_rows * 4);
    uint16_t *h = malloc((size_t)cv_act_bf16_stride(3072) * 2);
    if (!big || !ones || !y || !h) abort();
    memset(big, 1, (size_t)one_rows * 1024);
    for (int64_t i = 0; i < one_rows; i++) ones[i] = 1e-3f;
    const cv_weight_part one = {.dtype = CV_DTYPE_I8, .rows = one_rows, .cols = 1024, .data = big, .row_scale = ones};
    if (cv_weight_pack(pool, &one, 1, &w[LAYERS * 4])) abort();
    const double one_bytes = (double)cv_weight_packed_bytes(w[LAYERS * 4].format, one_rows, 1024);
    const cv_act act = {.i8 = xq, .i8_scale = &x_scale};
    for (int round = 0; round < 8; round++) {
        double t0 = clock_s(CLOCK_MONOTONIC);
        for (int r = 0; r < REPS; r++)
            for (int i = 0; i < LAYERS * 4; i++) {
                if (i % 4 == 0) { /* q | k | v */
                    float *ys[3] = {y, y + 2048, y + 3072};
                    cv_linear(pool, &w[i], &act, 1, 3, (const int64_t[]){2048, 1024, 1024}, ys);
                } else if (i % 4 == 2) { /* gate | up, SwiGLU fused as the model runs it */
                    if (!cv_linear_swiglu_bf16(pool, &w[i], &act, 1, 3072, h)) abort();
                } else
                    cv_linear(pool, &w[i], &act, 1, 1, &w[i].rows, &y);
            }
        const double chain = bytes * REPS / (clock_s(CLOCK_MONOTONIC) - t0) * 1e-9;
        t0 = clock_s(CLOCK_MONOTONIC);
        for (int r = 0; r < REPS; r++) cv_linear(pool, &w[LAYERS * 4], &act, 1, 1, &w[LAYERS * 4].rows, &y);
        const double single = one_bytes * REPS / (clock_s(CLOCK_MONOTONIC) - t0) * 1e-9;
        read_job rj = {.p = (const uint64_t *)w[LAYERS * 4].data, .n = (size_t)one_bytes};
        t0 = clock_s(CLOCK_MONOTONIC);
        for (int r = 0; r < REPS; r++) cv_threadpool_run(pool, read_task, &rj);
        const double read = one_bytes * REPS / (clock_s(CLOCK_MONOTONIC) - t0) * 1e-9;
        printf("i8_panels decode chain (%d calls, %.0f MB) %5.1f GB/s, one weight (%.0f MB) %5.1f GB/s, a read of "
               "it %5.1f GB/s: chain/one %.3f, one/read %.3f (sum %llu)\n",
               LAYERS * 4, bytes * 1e-6, chain, one_bytes * 1e-6, single, read, chain / single, single / read,
               (unsigned long long)rj.sum[0]);
    }
    for (int i = 0; i <= LAYERS * 4; i++) cv_weight_release(&w[i]);
    free(big);
    free(h);
    free(codes);
    free(scale);
    free(ones);
    free(x);
    free(y);
    free(xq);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The stream mode (see the top), one shape. */
static void run_stream(cv_threadpool *pool, int64_t n, int64_t k) {
    enum { ROUNDS = 40 };
    bench_data d = make_data(pool, 1, n, k);
    const cv_weight_part *parts[2] = {&d.parts[1], &d.parts[0]}; /* I8, BF16 */
    const cv_act acts[2] = {{.i8 = d.xq, .i8_scale = d.x_scale}, {.f32 = d.x, .bf16 = bf16_dot ? d.xb : NULL}};
    const int reps[2] = {4, 2}; /* about the same bytes each */
    cv_weight w[2];
    double gbs[2][ROUNDS], ratio[ROUNDS];
    for (int f = 0; f < 2; f++) {
        if (cv_weight_pack(pool, parts[f], 1, &w[f])) abort();
        cv_linear(pool, &w[f], &acts[f], 1, 1, &w[f].rows, &d.y); /* pages it in */
    }
    for (int r = 0; r < ROUNDS; r++) {
        for (int f = 0; f < 2; f++) {
            const double t0 = clock_s(CLOCK_MONOTONIC);
            for (int i = 0; i < reps[f]; i++) cv_linear(pool, &w[f], &acts[f], 1, 1, &w[f].rows, &d.y);
            gbs[f][r] = (double)cv_weight_packed_bytes(w[f].format, n, k) * reps[f] / (clock_s(CLOCK_MONOTONIC) - t0) * 1e-9;
        }
        ratio[r] = gbs[0][r] / gbs[1][r];
    }
    qsort(gbs[0], ROUNDS, sizeof(double), cmp_double);
    qsort(gbs[1], ROUNDS, sizeof(double), cmp_double);
    qsort(ratio, ROUNDS, sizeof(double), cmp_double);
    printf("stream N=%-6lld K=%-4lld medians of %d alternations: i8_panels %5.1f GB/s, bf16_panels%s %5.1f GB/s, "
           "ratio %.3f (quartiles %.3f-%.3f)\n", (long long)n, (long long)k, ROUNDS, gbs[0][ROUNDS / 2],
           bf16_dot ? " bf16x" : "", gbs[1][ROUNDS / 2], ratio[ROUNDS / 2], ratio[ROUNDS / 4], ratio[3 * ROUNDS / 4]);
    for (int f = 0; f < 2; f++) cv_weight_release(&w[f]);
    free_data(&d);
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
    if (strcmp(which, "chain") == 0) {
        run_chain(pool);
        cv_threadpool_free(pool);
        return 0;
    }
    if (strcmp(which, "stream") == 0) {
        run_stream(pool, 151936, 1024);
        run_stream(pool, 151936 / 4, 4096);
        cv_threadpool_free(pool);
        return 0;
    }
    if (strcmp(which, "decode") != 0)
        for (size_t s = 0; s < sizeof prefill / sizeof prefill[0]; s++)
            run_shape(pool, prefill[s][0], prefill[s][1], prefill[s][2]);
    if (strcmp(which, "prefill") != 0)
        for (size_t s = 0; s < sizeof decode / sizeof decode[0]; s++) run_shape(pool, decode[s][0], decode[s][1], decode[s][2]);
    cv_threadpool_free(pool);
    return 0;
}
