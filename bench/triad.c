/*
 * triad.c — STREAM-style triad bandwidth (a[i] = b[i] + s·c[i]) on N threads, the denominator of
 * the decode bandwidth bound in bench/compare.sh.
 *
 * Arrays are 3 × 256 MiB by default (far beyond any L3 this code meets) and split statically over
 * pthreads; each thread first-touches its own share. Bytes counted per element are STREAM's 24
 * (two reads and one write; write-allocate traffic is not counted, as in STREAM). The best of
 * several repetitions is reported, as STREAM does, plus the median, since the machines this runs on
 * are shared.
 *
 * Build: cc -O3 -march=native -fopenmp-simd bench/triad.c -lpthread -o triad; run: triad [threads] [MiB per array]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct share {
    double *a, *b, *c;
    size_t begin, end;
    pthread_barrier_t *start, *stop;
    int reps;
} share;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *run_share(void *p) {
    share *s = p;
    for (size_t i = s->begin; i < s->end; i++) s->a[i] = 0, s->b[i] = 1, s->c[i] = 2;
    for (int r = 0; r < s->reps; r++) {
        pthread_barrier_wait(s->start);
        double *restrict a = s->a, *restrict b = s->b, *restrict c = s->c;
        for (size_t i = s->begin; i < s->end; i++) a[i] = b[i] + 3.0 * c[i];
        pthread_barrier_wait(s->stop);
    }
    return NULL;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 256;
    enum { REPS = 10 };
    if (threads < 1 || threads > 256 || mib < 1) {
        fprintf(stderr, "usage: triad [threads 1..256] [MiB per array]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(double);
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "triad: cannot allocate 3 × %zu MiB\n", mib);
        return 1;
    }
    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
    pthread_t *tid = malloc((size_t)threads * sizeof *tid);
    share *sh = malloc((size_t)threads * sizeof *sh);
    for (int t = 0; t < threads; t++) {
        sh[t] = (share){a, b, c, n * (size_t)t / (size_t)threads, n * (size_t)(t + 1) / (size_t)threads, &start, &stop, REPS};
        pthread_create(&tid[t], NULL, run_share, &sh[t]);
    }
    double gbs[REPS];
    for (int r = 0; r < REPS; r++) {
        pthread_barrier_wait(&start);
        double t0 = now();
        pthread_barrier_wait(&stop);
        gbs[r] = 3.0 * (double)n * sizeof(double) / (now() - t0) * 1e-9;
    }
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    qsort(gbs, REPS, sizeof gbs[0], cmp_double);
    printf("triad threads=%d array=%zu MiB best=%.2f GB/s median=%.2f GB/s\n", threads, mib, gbs[REPS - 1],
           (gbs[REPS / 2 - 1] + gbs[REPS / 2]) / 2);
    free(tid);
    free(sh);
    free(a);
    free(b);
    free(c);
    return 0;
}
