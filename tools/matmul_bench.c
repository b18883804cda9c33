/*
 * matmul_bench.c — times cv_matmul (row-major bf16) and cv_matmul_panels (packed) on the Qwen3
 * projection shapes, for kernel tuning and to show what packing buys (never run in CI).
 *
 * The machine these kernels are tuned on is shared, so besides wall-clock GFLOP/s it reports
 * GFLOP/s per second of the calling thread's CPU time: that figure does not drop when another
 * process takes the core, which makes A/B comparisons of kernel variants meaningful under load.
 *
 * Build (from the repository root, after building the library):
 *   cc -O2 -Isrc -Iinclude tools/matmul_bench.c build/libcv_kernels.a build/libcv_base.a -lm -lpthread -o /tmp/mmb
 * Usage: mmb [threads] [isa]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "base/threadpool.h"
#include "kernels/kernels.h"

static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Times `reps` calls of one layout; prints a line labelled `layout`. */
static void time_layout(cv_threadpool *pool, const char *layout, const cv_matrix *rows, const cv_panels *mat,
                        const float *x, int64_t m, float *y) {
    const int64_t n = rows->rows, k = rows->cols;
    const double flops = 2.0 * (double)m * (double)n * (double)k;
    int reps = (int)(2e10 / flops) + 1;
    if (reps > 2000) reps = 2000;
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < reps; r++) {
        if (mat) cv_matmul_panels(pool, mat, x, m, y);
        else cv_matmul(pool, rows, x, m, y);
    }
    double wall = clock_s(CLOCK_MONOTONIC) - w0, cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    printf("%-9s M=%-4lld N=%-6lld K=%-5lld  %7.1f GFLOP/s wall  %7.1f GFLOP/s per thread-cpu-s  %6.1f GB/s weights\n",
           layout, (long long)m, (long long)n, (long long)k, flops * reps / wall * 1e-9, flops * reps / cpu * 1e-9,
           (double)(n * k * 2) * reps / wall * 1e-9);
}

/* The same product with the checkpoint's row-major bf16 and with the packed panels, back to back:
 * what packing at load buys (or not) on each shape. */
static void run_shape(cv_threadpool *pool, int64_t m, int64_t n, int64_t k) {
    uint16_t *w = malloc((size_t)(n * k) * 2);
    float *x = malloc((size_t)(m * k) * 4), *y = malloc((size_t)(m * n) * 4);
    for (int64_t i = 0; i < n * k; i++) w[i] = cv_f32_to_bf16((float)((i * 7919) % 1000) * 1e-3f - 0.5f);
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    cv_matrix rows = {w, CV_DTYPE_BF16, n, k};
    cv_panels mat;
    if (cv_panels_pack(pool, &rows, 1, &mat)) abort();
    cv_matmul(pool, &rows, x, m, y); /* warm-up: page in both copies */
    cv_matmul_panels(pool, &mat, x, m, y);
    time_layout(pool, "row-major", &rows, NULL, x, m, y);
    time_layout(pool, "panels", &rows, &mat, x, m, y);
    cv_panels_release(&mat);
    free(w);
    free(x);
    free(y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2 && cv_isa_force((cv_isa)cv_isa_from_name(argv[2])) != 0) {
        fprintf(stderr, "unknown or unsupported ISA %s\n", argv[2]);
        return 2;
    }
    cv_threadpool *pool = cv_threadpool_create(threads);
    printf("%s, %d thread(s), bf16 weights (row-major as stored, then packed panels), f32 activations\n", cv_isa_name(cv_isa_active()), threads);
    static const int64_t shapes[][3] = {{512, 2048, 1024}, {512, 3072, 1024}, {512, 1024, 3072},
                                        {1, 2048, 1024},   {1, 3072, 1024},   {1, 1024, 3072}, {1, 151936, 1024}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        run_shape(pool, shapes[s][0], shapes[s][1], shapes[s][2]);
    cv_threadpool_free(pool);
    return 0;
}
