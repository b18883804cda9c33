/*
 * dnnl_gemm_bench.c — oneDNN on the Qwen3-0.6B prefill shapes, the evaluation behind
 * docs/performance.md's "oneDNN" note (never built by CMake or CI; needs libdnnl-dev).
 *
 * Two ways oneDNN could serve a bf16 checkpoint: sgemm on f32 weights (a 2× copy of every bf16
 * weight), and its bf16 matmul primitive (bf16 activations and weights, f32 output), with the
 * weights in the blocked layout it picks for itself (on AMX CPUs its brgemm AMX kernels), and its
 * int8 matmul (s8 × s8 → f32) for the W8A8 formats. The printed line names the implementation
 * oneDNN chose. Compare the GFLOP/s with tools/matmul_bench.c on the same shapes and threads, run
 * back to back.
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

#define OK(call)                                                     \
    do {                                                             \
        if ((call) != dnnl_success) {                                \
            fprintf(stderr, "dnnl_gemm_bench: %s failed\n", #call); \
            exit(1);                                                 \
        }                                                            \
    } while (0)

static void sgemm(long m, long n, long k) {
    float *x = malloc((size_t)(m * k) * sizeof *x), *w = malloc((size_t)(n * k) * sizeof *w);
    float *y = malloc((size_t)(m * n) * sizeof *y);
    if (!x || !w || !y) exit(1);
    for (long i = 0; i < m * k; i++) x[i] = (float)(i % 7) * 0.01f;
    for (long i = 0; i < n * k; i++) w[i] = (float)(i % 11) * 0.01f;
    /* y[m][n] = x[m][k] · w[n][k]ᵀ; dnnl_sgemm is row-major */
    OK(dnnl_sgemm('N', 'T', m, n, k, 1.f, x, k, w, k, 0.f, y, n));
    const int reps = 10;
    double t = now();
    for (int r = 0; r < reps; r++) dnnl_sgemm('N', 'T', m, n, k, 1.f, x, k, w, k, 0.f, y, n);
    t = now() - t;
    printf("dnnl_sgemm f32           M=%ld N=%ld K=%ld: %7.1f GFLOP/s\n", m, n, k, 2.0 * m * n * k * reps / t * 1e-9);
    free(x);
    free(w);
    free(y);
}

/* The matmul primitive on `in` activations and weights (weights in the layout oneDNN prefers). */
static void matmul(dnnl_engine_t eng, dnnl_stream_t st, dnnl_data_type_t in, long m, long n, long k) {
    dnnl_memory_desc_t src_md, wei_md, dst_md;
    dnnl_dims_t sd = {m, k}, wd = {k, n}, dd = {m, n};
    OK(dnnl_memory_desc_init_by_tag(&src_md, 2, sd, in, dnnl_ab));
    OK(dnnl_memory_desc_init_by_tag(&wei_md, 2, wd, in, dnnl_format_tag_any));
    OK(dnnl_memory_desc_init_by_tag(&dst_md, 2, dd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t desc;
    OK(dnnl_matmul_desc_init(&desc, &src_md, &wei_md, NULL, &dst_md));
    dnnl_primitive_desc_t pd;
    OK(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL));
    const char *impl = "?";
    OK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_t src, wei, dst;
    OK(dnnl_memory_create(&src, &src_md, eng, DNNL_MEMORY_ALLOCATE));
    OK(dnnl_memory_create(&wei, wmd, eng, DNNL_MEMORY_ALLOCATE));
    OK(dnnl_memory_create(&dst, &dst_md, eng, DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_t prim;
    OK(dnnl_primitive_create(&prim, pd));
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    OK(dnnl_primitive_execute(prim, st, 3, args));
    OK(dnnl_stream_wait(st));
    const int reps = 20;
    double t = now();
    for (int r = 0; r < reps; r++) OK(dnnl_primitive_execute(prim, st, 3, args));
    OK(dnnl_stream_wait(st));
    t = now() - t;
    printf("dnnl_matmul %-4s -> f32  M=%ld N=%ld K=%ld: %7.1f GFLOP/s  (%s)\n", in == dnnl_bf16 ? "bf16" : "s8", m, n,
           k, 2.0 * m * n * k * reps / t * 1e-9, impl);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(src);
    dnnl_memory_destroy(wei);
    dnnl_memory_destroy(dst);
}

int main(void) {
    static const long shapes[][3] = {{512, 2048, 1024}, {512, 3072, 1024}, {512, 1024, 3072}};
    dnnl_engine_t eng;
    dnnl_stream_t st;
    OK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    OK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        sgemm(shapes[s][0], shapes[s][1], shapes[s][2]);
        matmul(eng, st, dnnl_bf16, shapes[s][0], shapes[s][1], shapes[s][2]);
        matmul(eng, st, dnnl_s8, shapes[s][0], shapes[s][1], shapes[s][2]);
    }
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return 0;
}
