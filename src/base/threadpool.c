/*
 * threadpool.c — persistent workers woken through a generation counter; shares dealt in runs, the
 * last ones stolen.
 *
 * A kernel call is short (tens of microseconds for a decode GEMV), so starting threads or passing
 * work through a locked queue would cost as much as the work. Instead the workers are started once
 * and sleep on one 32-bit word, `generation`. cv_threadpool_run_shares() publishes fn/arg and deals
 * the shares out as one contiguous run per thread, bumps the generation (release) and wakes the
 * sleepers; every thread, the caller too, runs its own shares front to back, then takes shares from
 * the back of the others' runs until none is left, and the caller waits until `done` counts them all.
 *
 * Why shares move between threads: on the shared VMs a worker's vCPU is sometimes not running when
 * its call starts (measured: 50 µs and more, thousands of times in a 10 s decode). With share i
 * fixed to thread i the caller sat idle for all of it; now it runs the late thread's shares itself,
 * and a worker that wakes after they are gone finds nothing to do and goes back to waiting. Why runs
 * and not one shared counter: a GEMV's shares are consecutive slices of one weight, so a thread that
 * walks its own run reads one long stream, which the hardware prefetchers follow; and taking a share
 * touches only that run's own cache line, which no other thread writes until it steals. (A shared
 * counter, every 256 KiB share claimed from it, ran a quiet 0.6B W8A8 decode at 69-74 tok/s in five
 * interleaved pairs against 69-80 for fixed halves.)
 *
 * Each thread's run is one 64-bit word: the run serial (32 bits), its next share and its end (16
 * each). A take is one compare-and-swap, so the owner (from the front) and a thief (from the back)
 * never take the same share, and a thread still holding a word of an earlier run fails the swap.
 * After a successful take, fn and arg are the run's own: the caller rewrites them only for its next
 * run, after every share of this one is counted, and a thread counts its shares only once it has
 * found no more to take.
 *
 * Waiting is spin-then-futex on both sides: back-to-back kernel calls find the workers still
 * spinning (no syscall on the hot path), while an idle server lets them sleep in the kernel
 * instead of burning cores. The spin is bounded so that oversubscription (more workers than cores,
 * as in the 3-thread test on a 2-core machine) degrades to sleeping rather than livelock.
 *
 * The pool serves one caller at a time and fn must not call cv_threadpool_run() on the same pool;
 * both are asserted.
 */
#define _GNU_SOURCE
#include "base/threadpool.h"

#include <assert.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"

#define CV_SPIN_ITERATIONS 20000

typedef struct cv_worker {
    cv_threadpool *pool;
    int index;
    pthread_t thread;
} cv_worker;

/* A thread's run of shares: serial (32 bits) | next (16) | end (16); 64 bytes apart, so that no two
 * words share a cache line and an owner's takes stay in its own cache. */
typedef struct cv_share_run {
    _Atomic uint64_t word;
    char pad[64 - sizeof(uint64_t)];
} cv_share_run;

struct cv_threadpool {
    int n_threads;
    cv_worker *workers;          /* [n_threads - 1]; thread 0 is the caller */
    cv_share_run *runs;          /* [n_threads] */
    cv_task_fn fn;
    void *arg;
    int n_shares;
    _Atomic uint32_t serial;     /* the current run's; runs' words carry it */
    _Atomic uint32_t generation; /* bumped once per run; workers wait for it to change */
    _Atomic uint32_t done;       /* shares of the current run counted by threads that are through */
    _Atomic int32_t sleepers;    /* workers inside futex_wait on generation */
    _Atomic int32_t caller_sleeping;
    _Atomic int32_t busy;        /* a run is in progress (reentrancy check) */
    atomic_bool stop;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits until the generation differs from `seen`; returns the new value. */
static uint32_t wait_for_generation(cv_threadpool *pool, uint32_t seen) {
    for (int i = 0; i < CV_SPIN_ITERATIONS; i++) {
        uint32_t g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
    }
    /* sleepers++ before re-checking pairs with the caller's bump-then-read (both seq_cst): either
     * the caller sees a sleeper and wakes, or futex_wait sees the new generation and returns. */
    atomic_fetch_add_explicit(&pool->sleepers, 1, memory_order_seq_cst);
    uint32_t g;
    while ((g = atomic_load_explicit(&pool->generation, memory_order_seq_cst)) == seen)
        futex_wait(&pool->generation, seen);
    atomic_fetch_sub_explicit(&pool->sleepers, 1, memory_order_relaxed);
    return g;
}

/* Takes a share of run r of `serial`: its first (the owner) or its last (a thief). */
static bool take_share(cv_threadpool *pool, int r, bool last, uint32_t serial, int *share) {
    _Atomic uint64_t *word = &pool->runs[r].word;
    uint64_t v = atomic_load_explicit(word, memory_order_acquire);
    for (;;) {
        const uint32_t next = (uint32_t)(v >> 16) & 0xffff, end = (uint32_t)v & 0xffff;
        if ((uint32_t)(v >> 32) != serial || next >= end) return false;
        if (atomic_compare_exchange_weak_explicit(word, &v, last ? v - 1 : v + (1u << 16), memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *share = (int)(last ? end - 1 : next);
            return true;
        }
    }
}

/* Thread `self` runs its own shares of the current run, then the others' from their backs, and
 * counts what it ran once there is nothing left. */
static void run_shares(cv_threadpool *pool, int self) {
    const uint32_t serial = atomic_load_explicit(&pool->serial, memory_order_acquire);
    uint32_t ran = 0;
    int share;
    while (take_share(pool, self, false, serial, &share)) {
        pool->fn(pool->arg, share, pool->n_shares);
        ran++;
    }
    for (int k = 1; k < pool->n_threads; k++) {
        const int victim = (self + k) % pool->n_threads;
        while (take_share(pool, victim, true, serial, &share)) {
            pool->fn(pool->arg, share, pool->n_shares);
            ran++;
        }
    }
    if (!ran) return;
    /* ran > 0: the run cannot end before the add, so n_shares is still this run's; read it first */
    const uint32_t shares = (uint32_t)pool->n_shares;
    if (atomic_fetch_add_explicit(&pool->done, ran, memory_order_seq_cst) + ran == shares &&
        atomic_load_explicit(&pool->caller_sleeping, memory_order_seq_cst))
        futex_wake_all(&pool->done);
}

static void *worker_main(void *p) {
    cv_worker *w = p;
    cv_threadpool *pool = w->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_for_generation(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) return NULL;
        run_shares(pool, w->index);
    }
}

static void wait_for_shares(cv_threadpool *pool, uint32_t shares) {
    for (int i = 0; i < CV_SPIN_ITERATIONS; i++) {
        if (atomic_load_explicit(&pool->done, memory_order_acquire) == shares) return;
        cpu_relax();
    }
    atomic_store_explicit(&pool->caller_sleeping, 1, memory_order_seq_cst);
    for (;;) {
        uint32_t done = atomic_load_explicit(&pool->done, memory_order_seq_cst);
        if (done == shares) break;
        futex_wait(&pool->done, done);
    }
    atomic_store_explicit(&pool->caller_sleeping, 0, memory_order_relaxed);
}

cv_threadpool *cv_threadpool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    cv_threadpool *pool = cv_xcalloc(1, sizeof *pool);
    pool->n_threads = n_threads;
    pool->workers = cv_xcalloc((size_t)n_threads, sizeof *pool->workers);
    pool->runs = cv_xcalloc((size_t)n_threads, sizeof *pool->runs);
    for (int i = 1; i < n_threads; i++) {
        cv_worker *w = &pool->workers[i - 1];
        w->pool = pool;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            /* Fewer threads still compute correctly; shrink the pool to those that started. */
            cv_warn("threadpool", "could not start thread %d of %d; using %d", i, n_threads, i);
            pool->n_threads = i;
            break;
        }
    }
    return pool;
}

void cv_threadpool_free(cv_threadpool *pool) {
    if (!pool) return;
    atomic_store_explicit(&pool->stop, true, memory_order_release);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_acq_rel);
    futex_wake_all(&pool->generation);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->workers[i - 1].thread, NULL);
    free(pool->workers);
    free(pool->runs);
    free(pool);
}

int cv_threadpool_size(const cv_threadpool *pool) { return pool ? pool->n_threads : 1; }

void cv_threadpool_run(cv_threadpool *pool, cv_task_fn fn, void *arg) {
    cv_threadpool_run_shares(pool, fn, arg, cv_threadpool_size(pool));
}

typedef struct range_job {
    cv_range_fn fn;
    const void *arg;
    int64_t n;
} range_job;

static void range_task(void *arg, int share, int n_shares) {
    const range_job *j = arg;
    int64_t b, e;
    cv_split(j->n, 1, share, n_shares, &b, &e);
    if (b < e) j->fn(j->arg, b, e);
}

void cv_threadpool_run_range(cv_threadpool *pool, cv_range_fn fn, const void *arg, int64_t n, bool parallel) {
    assert(n >= 0);
    if (parallel && n > 1 && cv_threadpool_size(pool) > 1) {
        range_job j = {fn, arg, n};
        cv_threadpool_run(pool, range_task, &j);
    } else if (n > 0) {
        fn(arg, 0, n);
    }
}

void cv_threadpool_run_shares(cv_threadpool *pool, cv_task_fn fn, void *arg, int n_shares) {
    assert(n_shares >= 1 && n_shares <= CV_THREADPOOL_MAX_SHARES);
    if (!pool || pool->n_threads == 1 || n_shares == 1) {
        for (int i = 0; i < n_shares; i++) fn(arg, i, n_shares);
        return;
    }
    int32_t was_busy = atomic_exchange_explicit(&pool->busy, 1, memory_order_acquire);
    assert(!was_busy && "cv_threadpool_run is not reentrant");
    (void)was_busy;
    pool->fn = fn;
    pool->arg = arg;
    pool->n_shares = n_shares;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    const uint32_t serial = atomic_load_explicit(&pool->serial, memory_order_relaxed) + 1;
    for (int t = 0; t < pool->n_threads; t++) {
        int64_t b, e;
        cv_split(n_shares, 1, t, pool->n_threads, &b, &e);
        atomic_store_explicit(&pool->runs[t].word, (uint64_t)serial << 32 | (uint64_t)b << 16 | (uint64_t)e,
                              memory_order_release);
    }
    atomic_store_explicit(&pool->serial, serial, memory_order_release);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&pool->sleepers, memory_order_seq_cst) > 0) futex_wake_all(&pool->generation);
    run_shares(pool, 0);
    wait_for_shares(pool, (uint32_t)n_shares);
    atomic_store_explicit(&pool->busy, 0, memory_order_release);
}
