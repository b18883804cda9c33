/*
 * threadpool.h — a persistent pool of worker threads for the kernels.
 *
 * The threads are started once and wait on a generation counter; cv_threadpool_run_shares() wakes
 * them, deals the call's shares (fn(arg, i, n) for each i in [0, n)) out as one contiguous run per
 * thread, the caller included, and returns when every share has run. A thread that is through with
 * its own run takes shares from the back of the others' runs: a worker that the VM has not
 * scheduled yet never holds the caller up. The callee splits its work per share (cv_split); there
 * is no queue and no per-op thread start.
 */
#ifndef CV_THREADPOOL_H
#define CV_THREADPOOL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cv_threadpool cv_threadpool;

typedef void (*cv_task_fn)(void *arg, int share, int n_shares);

/* n_threads <= 0: all online CPUs. */
cv_threadpool *cv_threadpool_create(int n_threads);
void cv_threadpool_free(cv_threadpool *pool);
int cv_threadpool_size(const cv_threadpool *pool);
/* Runs fn(arg, i, n) once for each share i in [0, n), n = the pool's size, concurrently: share i
 * on thread i unless that thread is late, then on one that is through with its own; returns when
 * all calls returned. A NULL pool runs fn(arg, 0, 1) on the caller. */
void cv_threadpool_run(cv_threadpool *pool, cv_task_fn fn, void *arg);
/* The same with n_shares shares (1 <= n_shares <= CV_THREADPOOL_MAX_SHARES), thread t's run being
 * cv_split(n_shares, 1, t, threads) in order: more shares than threads let a thread that ran ahead
 * take the last shares of a slow one. */
enum { CV_THREADPOOL_MAX_SHARES = 0xffff };
void cv_threadpool_run_shares(cv_threadpool *pool, cv_task_fn fn, void *arg, int n_shares);

/* fn(arg, begin, end) over the items [0, n) (n >= 0): split into the pool's shares (cv_split) when
 * `parallel` and the pool has more than one thread and n more than one item, else one call on the
 * caller (none for n = 0). For kernels whose items are independent, so that where an item runs never
 * changes what it computes; `parallel` is the caller's size threshold (a pool wake costs more than
 * a few thousand elements of work). */
typedef void (*cv_range_fn)(const void *arg, int64_t begin, int64_t end);
void cv_threadpool_run_range(cv_threadpool *pool, cv_range_fn fn, const void *arg, int64_t n, bool parallel);

/* The [begin, end) share of `total` items for thread `i` of `n`, in multiples of `align`. */
static inline void cv_split(int64_t total, int64_t align, int i, int n, int64_t *begin, int64_t *end) {
    int64_t chunks = (total + align - 1) / align;
    int64_t per = chunks / n, rem = chunks % n;
    int64_t b = i * per + (i < rem ? i : rem);
    int64_t e = b + per + (i < rem ? 1 : 0);
    *begin = b * align < total ? b * align : total;
    *end = e * align < total ? e * align : total;
}

#endif
