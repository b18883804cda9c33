/*
 * dnnl_gemm_bench.c — oneDNN's sgemm on a Qwen3-0.6B prefill shape, the evaluation behind
 * docs/performance.md's "oneDNN" note (never built by CMake or CI; needs libdnnl-dev).
 *
 * oneDNN would need the weights as f32 (sgemm; a 2× copy of every bf16 weight) or the activations
 * rounded to bf16 (its bf16 matmul, which runs on vdpbf16ps). Compare the printed GFLOP/s with
 * tools/matmul_bench.c on the same shape and threads, run back to back.
 *
 * Build and run: cc -O2 tools/dnnl_gemm_bench.c -ldnnl -o /tmp/dnnl_bench && OMP_NUM_THREADS=2 /tmp/dnnl_bench
 */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    const long m = 512, n = 3072, k = 1024;
    float *x = malloc((size_t)(m * k) * sizeof *x), *w = malloc((size_t)(n * k) * sizeof *w);
    float *y = malloc((size_t)(m * n) * sizeof *y);
    if (!x || !w || !y) return 1;
    for (long i = 0; i < m * k; i++) x[i] = (float)(i % 7) * 0.01f;
    for (long i = 0; i < n * k; i++) w[i] = (float)(i % 11) * 0.01f;
    /* y[m][n] = x[m][k] · w[n][k]ᵀ; dnnl_sgemm is row-major */
    if (dnnl_sgemm('N', 'T', m, n, k, 1.f, x, k, w, k, 0.f, y, n) != dnnl_success) return 1;
    const int reps = 10;
    double t = now();
    for (int r = 0; r < reps; r++) dnnl_sgemm('N', 'T', m, n, k, 1.f, x, k, w, k, 0.f, y, n);
    t = now() - t;
    printf("dnnl_sgemm f32 M=%ld N=%ld K=%ld: %.1f GFLOP/s\n", m, n, k, 2.0 * m * n * k * reps / t * 1e-9);
    free(x);
    free(w);
    free(y);
    return 0;
}
