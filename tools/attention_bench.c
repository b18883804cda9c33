/*
 * attention_bench.c — times cv_attention on one prompt's prefill for kernel tuning (never run in
 * CI): Qwen3-0.6B's heads (16 query heads, 8 KV heads, head_dim 128) over a bf16 KV cache of random
 * rows, one sequence of `tokens` tokens attending causally to itself, once with the bf16 dot
 * products (AMX tiles where the CPU has them, vdpbf16ps otherwise) and once in f32. Prints
 * milliseconds per call and the rate of the causal tile products' useful multiply-adds
 * (2 products × 2 × tokens²/2 × head_dim per query head), and a hash of the output's bits.
 * "decode" mode instead times one token at the end of `tokens` of context over LAYERS caches of
 * their own (Qwen3-0.6B's 28 layers: 400 MB at 3,500 tokens, so each layer's K and V come from
 * memory as in a model's decode step): milliseconds per token and the GB/s of K and V read.
 * "decode-cold" reads a 32 MiB buffer between the layers (untimed, on the same threads), as a decode
 * step's weight stream does, so that short contexts also come from memory, not from the L3 they
 * fit in.
 *
 * Build (from the repository root, after building the library):
 *   cc -O2 -Isrc -Iinclude tools/attention_bench.c build/libcv_kernels.a build/libcv_base.a -lm -lpthread -o /tmp/atb
 * Usage: atb [threads] [both|dot|f32|decode|decode-cold] [tokens...]   (default: 2 threads, both, 512 and 3500 tokens)
 * ATB_BLOCK_SIZE=128 atb ...: the cache in 128-slot blocks (16 by default).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/bigmem.h"
#include "base/dtype.h"
#include "base/threadpool.h"
#include "kernels/cpu/formats.h"
#include "kernels/kernels.h"

enum { HEADS = 16, KV_HEADS = 8, HEAD_DIM = 128, LAYERS = 28 };

/* Slots per cache block: 16 (vLLM's default), or ATB_BLOCK_SIZE (the tutorials pass --block-size 128). */
static int32_t BLOCK = 16;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static void run(cv_threadpool *pool, int32_t tokens, bool dot) {
    const int64_t width = (int64_t)KV_HEADS * HEAD_DIM, qw = (int64_t)HEADS * HEAD_DIM;
    const int32_t blocks = (tokens + BLOCK - 1) / BLOCK;
    float *q = malloc((size_t)tokens * qw * sizeof *q), *out = malloc((size_t)tokens * qw * sizeof *out);
    float *k = malloc((size_t)tokens * width * sizeof *k), *v = malloc((size_t)tokens * width * sizeof *v);
    uint16_t *kc = malloc((size_t)blocks * BLOCK * width * 2), *vc = malloc((size_t)blocks * BLOCK * width * 2);
    int32_t *positions = malloc((size_t)tokens * sizeof *positions), *table = malloc((size_t)blocks * sizeof *table);
    int64_t *slots = malloc((size_t)tokens * sizeof *slots);
    uint64_t seed = 1;
    for (int64_t i = 0; i < tokens * qw; i++) q[i] = uniform(&seed);
    for (int64_t i = 0; i < tokens * width; i++) k[i] = uniform(&seed), v[i] = uniform(&seed);
    for (int32_t b = 0; b < blocks; b++) table[b] = blocks - 1 - b; /* scattered, as a used pool hands them out */
    for (int32_t t = 0; t < tokens; t++) {
        positions[t] = t;
        slots[t] = (int64_t)table[t / BLOCK] * BLOCK + t % BLOCK;
    }
    cv_kv_write(NULL, kc, vc, CV_DTYPE_BF16, k, v, slots, tokens, KV_HEADS, HEAD_DIM, BLOCK);
    const int32_t seq_start[2] = {0, tokens};
    const int32_t *tables[1] = {table};
    cv_attention_args a = {.n_tokens = tokens, .n_seqs = 1, .seq_start = seq_start, .positions = positions,
                           .block_tables = tables, .block_size = BLOCK, .n_heads = HEADS, .n_kv_heads = KV_HEADS,
                           .head_dim = HEAD_DIM, .scale = 0.0883883f, .q = q, .kv_dtype = CV_DTYPE_BF16,
                           .k_cache = kc, .v_cache = vc, .bf16_dot = dot, .out = out};
    cv_attention(pool, &a);
    const double flops = 2.0 * 2.0 * (double)tokens * tokens / 2.0 * HEAD_DIM * HEADS;
    int reps = (int)(2e11 / flops) + 2;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) cv_attention(pool, &a);
    double per = (now_s() - t0) / reps;
    uint64_t hash = 1469598103934665603ull; /* FNV-1a of the output's bits: a tuning change that keeps them keeps it */
    const unsigned char *bytes = (const unsigned char *)out;
    for (size_t i = 0; i < (size_t)tokens * qw * sizeof *out; i++) hash = (hash ^ bytes[i]) * 1099511628211ull;
    printf("%-5s tokens=%-5d  %8.3f ms/call  %7.1f GFLOP/s (causal products)  output %016llx\n", dot ? "bf16" : "f32",
           tokens, per * 1e3, flops / per * 1e-9, (unsigned long long)hash);
    free(q), free(out), free(k), free(v), free(kc), free(vc), free(positions), free(table), free(slots);
}

typedef struct flush_job {
    const uint64_t *words;
    _Atomic uint64_t *sum; /* the reads' sum, stored so that they are not optimized away */
} flush_job;

static void flush_words(const void *arg, int64_t b, int64_t e) {
    const flush_job *f = arg;
    uint64_t sum = 0;
    for (int64_t i = b; i < e; i++) sum += f->words[i];
    atomic_fetch_add(f->sum, sum);
}

/* One decode token at position tokens - 1, layer after layer of bf16 caches of random rows. */
static void run_decode(cv_threadpool *pool, int32_t tokens, bool dot, bool cold) {
    const int64_t width = (int64_t)KV_HEADS * HEAD_DIM, qw = (int64_t)HEADS * HEAD_DIM;
    const int32_t blocks = (tokens + BLOCK - 1) / BLOCK;
    const size_t cache_elems = (size_t)blocks * BLOCK * (size_t)width;
    float *q = malloc((size_t)qw * sizeof *q), *out = malloc((size_t)qw * sizeof *out);
    /* as the engine allocates its cache (runner.c): advised for huge pages */
    uint16_t *kc = cv_big_alloc(LAYERS * cache_elems * 2), *vc = cv_big_alloc(LAYERS * cache_elems * 2);
    int32_t *table = malloc((size_t)blocks * sizeof *table);
    uint64_t seed = 1;
    for (int64_t i = 0; i < qw; i++) q[i] = uniform(&seed);
    for (size_t i = 0; i < LAYERS * cache_elems; i++) kc[i] = cv_f32_to_bf16(uniform(&seed)), vc[i] = kc[i] ^ 0x8000;
    for (int32_t b = 0; b < blocks; b++) table[b] = blocks - 1 - b;
    const int32_t seq_start[2] = {0, 1}, position = tokens - 1;
    const int32_t *tables[1] = {table};
    cv_attention_args a = {.n_tokens = 1, .n_seqs = 1, .seq_start = seq_start, .positions = &position,
                           .block_tables = tables, .block_size = BLOCK, .n_heads = HEADS, .n_kv_heads = KV_HEADS,
                           .head_dim = HEAD_DIM, .scale = 0.0883883f, .q = q, .kv_dtype = CV_DTYPE_BF16,
                           .bf16_dot = dot, .out = out};
    enum { STEPS = 20, FLUSH_WORDS = 4 << 20 };
    uint64_t *words = cold ? malloc(FLUSH_WORDS * sizeof *words) : NULL;
    /* written, so that the reads come from pages of their own: untouched calloc memory is the
     * kernel's one zero page, which stays in L1 */
    for (int64_t i = 0; cold && i < FLUSH_WORDS; i++) words[i] = (uint64_t)i;
    _Atomic uint64_t sum = 0;
    const flush_job flush = {.words = words, .sum = &sum};
    double best = 1e30;
    for (int r = 0; r < STEPS; r++) {
        double t = 0;
        for (int l = 0; l < LAYERS; l++) {
            if (cold) cv_threadpool_run_range(pool, flush_words, &flush, FLUSH_WORDS, true); /* the same threads: they stay awake */
            a.k_cache = kc + l * cache_elems, a.v_cache = vc + l * cache_elems;
            double t0 = now_s();
            cv_attention(pool, &a);
            t += now_s() - t0;
        }
        best = t < best ? t : best;
    }
    free(words);
    const double bytes = 2.0 * LAYERS * tokens * width * 2;
    printf("decode%s %-5s tokens=%-5d  %8.3f ms/token (best of %d)  %6.1f GB/s of K and V\n", cold ? "-cold" : "",
           dot ? "bf16" : "f32", tokens, best * 1e3, STEPS, bytes / best * 1e-9);
    free(q), free(out), free(table);
    cv_big_free(kc, LAYERS * cache_elems * 2), cv_big_free(vc, LAYERS * cache_elems * 2);
}

int main(int argc, char **argv) {
    if (getenv("ATB_BLOCK_SIZE")) BLOCK = atoi(getenv("ATB_BLOCK_SIZE"));
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    cv_threadpool *pool = cv_threadpool_create(threads);
    const bool dot = cv_isa_active() == CV_ISA_AVX512 && cv_cpu_bf16_dot_enable(true) == 0;
    printf("isa %s%s, %d threads, heads %d/%d, head_dim %d\n", cv_isa_name(cv_isa_active()), cv_cpu_amx() ? "+amx" : "",
           threads, HEADS, KV_HEADS, HEAD_DIM);
    const char *which = argc > 2 ? argv[2] : "both";
    int32_t lens[8] = {512, 3500};
    int n = 2;
    if (argc > 3) {
        n = 0;
        for (int i = 3; i < argc && n < 8; i++) lens[n++] = atoi(argv[i]);
    }
    for (int i = 0; i < n; i++) {
        if (!strncmp(which, "decode", 6)) {
            run_decode(pool, lens[i], dot, !strcmp(which, "decode-cold"));
            continue;
        }
        if (dot && strcmp(which, "f32") != 0) run(pool, lens[i], true);
        if (strcmp(which, "dot") != 0) run(pool, lens[i], false);
    }
    cv_threadpool_free(pool);
    return 0;
}
