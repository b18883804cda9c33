/*
 * threadpool.c — persistent workers woken through a generation counter.
 *
 * A kernel call is short (tens of microseconds for a decode GEMV), so starting threads or passing
 * work through a locked queue would cost as much as the work. Instead the workers are started once
 * and sleep on one 32-bit word, `generation`. cv_threadpool_run() publishes fn/arg, bumps the
 * generation (release) and wakes the sleepers; every worker runs its share, decrements `pending`
 * and the last one wakes the caller, which ran share 0 meanwhile.
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

struct cv_threadpool {
    int n_threads;
    cv_worker *workers;          /* [n_threads - 1]; thread 0 is the caller */
    cv_task_fn fn;
    void *arg;
    _Atomic uint32_t generation; /* bumped once per run; workers wait for it to change */
    _Atomic int32_t pending;     /* workers still running the current generation */
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

static void finish_share(cv_threadpool *pool) {
    if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_seq_cst) == 1 &&
        atomic_load_explicit(&pool->caller_sleeping, memory_order_seq_cst))
        futex_wake_all((_Atomic uint32_t *)&pool->pending);
}

static void *worker_main(void *p) {
    cv_worker *w = p;
    cv_threadpool *pool = w->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_for_generation(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) return NULL;
        pool->fn(pool->arg, w->index, pool->n_threads);
        finish_share(pool);
    }
}

static void wait_for_workers(cv_threadpool *pool) {
    for (int i = 0; i < CV_SPIN_ITERATIONS; i++) {
        if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0) return;
        cpu_relax();
    }
    atomic_store_explicit(&pool->caller_sleeping, 1, memory_order_seq_cst);
    for (;;) {
        int32_t left = atomic_load_explicit(&pool->pending, memory_order_seq_cst);
        if (left == 0) break;
        futex_wait((_Atomic uint32_t *)&pool->pending, (uint32_t)left);
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
    free(pool);
}

int cv_threadpool_size(const cv_threadpool *pool) { return pool ? pool->n_threads : 1; }

void cv_threadpool_run(cv_threadpool *pool, cv_task_fn fn, void *arg) {
    if (!pool || pool->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    int32_t was_busy = atomic_exchange_explicit(&pool->busy, 1, memory_order_acquire);
    assert(!was_busy && "cv_threadpool_run is not reentrant");
    (void)was_busy;
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&pool->sleepers, memory_order_seq_cst) > 0) futex_wake_all(&pool->generation);
    fn(arg, 0, pool->n_threads);
    wait_for_workers(pool);
    atomic_store_explicit(&pool->busy, 0, memory_order_release);
}
