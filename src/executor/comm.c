/*
 * comm.c — OpenMPI under the tensor-parallel runner (design in comm.h).
 */
#include "executor/comm.h"

#include <assert.h>
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/log.h"

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

/* MPI counts are int: large transfers go in chunks of at most 2^30 elements. */
static int chunk(size_t left) { return left > (size_t)1 << 30 ? 1 << 30 : (int)left; }

static void allreduce(void *ctx, float *x, size_t n) {
    (void)ctx;
    for (size_t at = 0; at < n;) {
        const int count = chunk(n - at);
        MPI_Allreduce(MPI_IN_PLACE, x + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        at += (size_t)count;
    }
}

static void gather(void *ctx, const float *part, size_t n, float *all) {
    (void)ctx;
    assert(n <= INT_MAX && "one rank's slice of the logits fits an MPI count");
    MPI_Gather(part, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
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
