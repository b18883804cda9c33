/*
 * triad.c — STREAM-style triad bandwidth (a[i] = b[i] + s·c[i]) on N threads, the denominator of
 * the decode bandwidth bound in bench/compare.py, and the read bandwidth of the same threads (each
 * sums its share of all three arrays as 64-bit integers, which the compiler vectorizes: loads
 * only, like a decode's weight stream). On the shared VMs the two differ either way by 10-30 %,
 * so compare.py reports a decode's share of each.
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
    unsigned long long sum; /* of the read passes: keeps them live */
} share;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The 64-bit words [begin, end) of x summed: a read pass. */
static unsigned long long read_pass(const double *x, size_t begin, size_t end) {
    const unsigned long long *w = (const unsigned long long *)x;
    unsigned long long sum = 0;
    for (size_t i = begin; i < end; i++) sum += w[i];
    return sum;
}

/* reps triad passes, then reps read passes, each between the two barriers. */
static void *run_share(void *p) {
    share *s = p;
    for (size_t i = s->begin; i < s->end; i++) s->a[i] = 0, s->b[i] = 1, s->c[i] = 2;
    for (int r = 0; r < s->reps; r++) {
        pthread_barrier_wait(s->start);
        double *restrict a = s->a, *restrict b = s->b, *restrict c = s->c;
        for (size_t i = s->begin; i < s->end; i++) a[i] = b[i] + 3.0 * c[i];
        pthread_barrier_wait(s->stop);
    }
    for (int r = 0; r < s->reps; r++) {
        pthread_barrier_wait(s->start);
        s->sum += read_pass(s->a, s->begin, s->end) + read_pass(s->b, s->begin, s->end) +
                  read_pass(s->c, s->begin, s->end);
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
        sh[t] = (share){a, b, c, n * (size_t)t / (size_t)threads, n * (size_t)(t + 1) / (size_t)threads, &start, &stop, REPS, 0};
        pthread_create(&tid[t], NULL, run_share, &sh[t]);
    }
    double gbs[2][REPS]; /* triad, read: 3 arrays' bytes a pass either way */
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < REPS; r++) {
            pthread_barrier_wait(&start);
            double t0 = now();
            pthread_barrier_wait(&stop);
            gbs[k][r] = 3.0 * (double)n * sizeof(double) / (now() - t0) * 1e-9;
        }
    unsigned long long sum = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        sum += sh[t].sum;
    }
    for (int k = 0; k < 2; k++) qsort(gbs[k], REPS, sizeof gbs[k][0], cmp_double);
    printf("triad threads=%d array=%zu MiB best=%.2f GB/s median=%.2f GB/s\n", threads, mib, gbs[0][REPS - 1],
           (gbs[0][REPS / 2 - 1] + gbs[0][REPS / 2]) / 2);
    printf("read threads=%d arrays=3 x %zu MiB best=%.2f GB/s median=%.2f GB/s (sum %llu)\n", threads, mib,
           gbs[1][REPS - 1], (gbs[1][REPS / 2 - 1] + gbs[1][REPS / 2]) / 2, sum);
    free(tid);
    free(sh);
    free(a);
    free(b);
    free(c);
    return 0;
}
