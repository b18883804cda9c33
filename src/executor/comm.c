/*
 * comm.c — OpenMPI under the tensor-parallel runner (design in comm.h).
 */
#include "executor/comm.h"

#include <assert.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"

static void finalize(void) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

static int ensure_init(void) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) return 0;
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return cv_fail(CVLLM_ERR_INTERNAL, "MPI_Init_thread failed");
    atexit(finalize);
    if (provided < MPI_THREAD_SERIALIZED)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "this MPI library does not allow calls from more than one thread "
                                              "(MPI_THREAD_SERIALIZED), which the engine thread needs");
    return 0;
}

/* ---- rank 0's watchdog ----------------------------------------------------------------------- */

/* When rank 0 entered the collective it waits in (0: none); the watchdog thread reads it. A peer
 * that is alive arrives within its own share of the same layer, so a wait past the timeout means a
 * rank hung or died without MPI noticing (SIGSTOP, a lost host). */
static _Atomic double waiting_since;
static double timeout_s;

static void wait_begin(void) {
    if (timeout_s > 0) atomic_store(&waiting_since, cv_now());
}

static void wait_end(void) {
    if (timeout_s > 0) atomic_store(&waiting_since, 0.0);
}

static void *watch(void *arg) {
    (void)arg;
    for (;;) {
        usleep(100 * 1000);
        const double since = atomic_load(&waiting_since);
        if (since > 0 && cv_now() - since > timeout_s) {
            cv_error_log("executor", "a tensor-parallel rank has not answered for %.0f s "
                         "(VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS): it hung or died; ending the job", timeout_s);
            kill(getpid(), SIGTERM); /* to the process: rank 0 of a job takes it as the job ending (cmd_serve.c) */
            return NULL;
        }
    }
}

/* On rank 0 of several: the timeout (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, as vLLM's multiprocess
 * executor waits for its workers; 300 s) and the thread that enforces it. */
static void start_watchdog(void) {
    const char *env = getenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS");
    timeout_s = env && atof(env) > 0 ? atof(env) : 300;
    pthread_t t;
    if (pthread_create(&t, NULL, watch, NULL) == 0) pthread_detach(t);
    else timeout_s = 0;
}

/* MPI counts are int: large transfers go in chunks of at most 2^30 elements. */
static int chunk(size_t left) { return left > (size_t)1 << 30 ? 1 << 30 : (int)left; }

static void allreduce(void *ctx, float *x, size_t n) {
    (void)ctx;
    for (size_t at = 0; at < n;) {
        const int count = chunk(n - at);
        wait_begin();
        MPI_Allreduce(MPI_IN_PLACE, x + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        wait_end();
        at += (size_t)count;
    }
}

static void gather(void *ctx, const float *part, size_t n, float *all) {
    (void)ctx;
    assert(n <= INT_MAX && "one rank's slice of the logits fits an MPI count");
    wait_begin();
    MPI_Gather(part, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    wait_end();
}

int cv_comm_join(int tp_size, cv_tp *tp) {
    int rc = ensure_init();
    if (rc) return rc;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != tp_size)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor_parallel_size=%d but the MPI job has %d ranks (start it "
                       "with mpirun -np %d)", tp_size, size, tp_size);
    *tp = (cv_tp){.rank = rank, .size = size, .allreduce = allreduce, .gather = gather};
    if (rank == 0 && size > 1 && timeout_s == 0) start_watchdog();
    cv_info("executor", "tensor-parallel rank %d of %d", rank, size);
    return 0;
}

int cv_comm_agree(int rc, const char *what) {
    int mine = rc != 0, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc) return rc;
    return any ? cv_fail(CVLLM_ERR_INTERNAL, "another tensor-parallel rank failed to %s (its log says why)", what) : 0;
}

void cv_comm_bcast_header(cv_comm_header *h) { MPI_Bcast(h, 8, MPI_INT64_T, 0, MPI_COMM_WORLD); }

void cv_comm_bcast_payload(void **payload, size_t *cap, size_t bytes) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0 && bytes > *cap) {
        free(*payload);
        *payload = cv_xmalloc(bytes);
        *cap = bytes;
    }
    for (size_t at = 0; at < bytes;) {
        const int count = chunk(bytes - at);
        MPI_Bcast((char *)*payload + at, count, MPI_BYTE, 0, MPI_COMM_WORLD);
        at += (size_t)count;
    }
}

bool cv_comm_in_job(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    return s && atoi(s) > 1;
}

int cv_comm_local_ranks(void) {
    const char *s = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int n = s ? atoi(s) : 1;
    return n > 0 ? n : 1;
}
