/*
 * comm.c — OpenMPI under the tensor-parallel runner (design in comm.h).
 */
#include "executor/comm.h"

#include <assert.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "executor/runner.h"

struct cv_comm {
    MPI_Comm comm;
    int rank, size;
    _Atomic double waiting_since; /* when group rank 0 entered the collective it waits in (0: none) */
    bool released; /* group rank 0: its workers leave by themselves, a step failed together (cv_comm_agree)
                    * or CV_CMD_STOP went out */
};

/* World rank 0's view of the job's groups (one per data-parallel replica): how many there are, how
 * many it joined (in replica order), and how many it freed after letting their workers go
 * (cv_comm_workers_released). A replica it never joined, because an earlier one failed, has workers
 * waiting in MPI_Comm_create_group until cv_comm_release_unjoined. */
static atomic_int job_groups, groups_joined, groups_released;

static void finalize(void) {
    /* MPI_Finalize waits for every rank: for workers that still wait on world rank 0 (a replica
     * that failed before its workers were let go), forever. MPI_Abort has mpirun end them instead
     * (quietly under cvllm's launcher, which ran it with -q), and the job's status is 1. */
    if (job_groups > 0 && groups_released < job_groups) MPI_Abort(MPI_COMM_WORLD, 1);
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

static int ensure_init(bool multiple) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) return 0;
    const int want = multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(NULL, NULL, want, &provided) != MPI_SUCCESS)
        return cv_fail(CVLLM_ERR_INTERNAL, "MPI_Init_thread failed");
    atexit(finalize);
    if (provided < want)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "this MPI library does not allow calls from %s",
                       multiple ? "several threads at once (MPI_THREAD_MULTIPLE), which data-parallel replicas "
                                  "of a tensor-parallel model need"
                                : "more than one thread (MPI_THREAD_SERIALIZED), which the engine thread needs");
    return 0;
}

/* ---- world rank 0's watchdog ----------------------------------------------------------------- */

/* The groups whose rank 0 is this process. A peer that is alive arrives within its own share of the
 * same layer, so a wait past the timeout means a rank hung or died without MPI noticing (SIGSTOP, a
 * lost host). */
enum { MAX_WATCHED = 64 };
static pthread_mutex_t watched_mu = PTHREAD_MUTEX_INITIALIZER;
static cv_comm *watched[MAX_WATCHED];
static double timeout_s;

static void wait_begin(cv_comm *c) {
    if (timeout_s > 0) atomic_store(&c->waiting_since, cv_now());
}

static void wait_end(cv_comm *c) {
    if (timeout_s > 0) atomic_store(&c->waiting_since, 0.0);
}

static bool overdue(void) {
    bool late = false;
    pthread_mutex_lock(&watched_mu);
    for (int i = 0; i < MAX_WATCHED && !late; i++) {
        const double since = watched[i] ? atomic_load(&watched[i]->waiting_since) : 0;
        late = since > 0 && cv_now() - since > timeout_s;
    }
    pthread_mutex_unlock(&watched_mu);
    return late;
}

static void *watch(void *arg) {
    (void)arg;
    while (!overdue()) usleep(100 * 1000);
    cv_error_log("executor", "a tensor-parallel rank has not answered for %.0f s (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS): "
                 "it hung or died; ending the job", timeout_s);
    kill(getpid(), SIGTERM); /* to the process: rank 0 of a job takes it as the job ending (cmd_serve.c) */
    return NULL;
}

/* Watches c from now on; the first call starts the thread, with the timeout
 * (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, as vLLM's multiprocess executor waits for its workers; 300 s). */
static void watch_comm(cv_comm *c, bool on) {
    pthread_mutex_lock(&watched_mu);
    if (on && timeout_s == 0) {
        const char *env = getenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS");
        timeout_s = env && atof(env) > 0 ? atof(env) : 300;
        pthread_t t;
        if (pthread_create(&t, NULL, watch, NULL) == 0) pthread_detach(t);
        else timeout_s = -1; /* no watchdog */
    }
    for (int i = 0; i < MAX_WATCHED; i++)
        if (watched[i] == (on ? NULL : c)) {
            watched[i] = on ? c : NULL;
            break;
        }
    pthread_mutex_unlock(&watched_mu);
}

/* MPI counts are int: large transfers go in chunks of at most 2^30 elements. */
static int chunk(size_t left) { return left > (size_t)1 << 30 ? 1 << 30 : (int)left; }

static void allreduce(void *ctx, float *x, size_t n) {
    cv_comm *c = ctx;
    for (size_t at = 0; at < n;) {
        const int count = chunk(n - at);
        wait_begin(c);
        MPI_Allreduce(MPI_IN_PLACE, x + at, count, MPI_FLOAT, MPI_SUM, c->comm);
        wait_end(c);
        at += (size_t)count;
    }
}

static void gather(void *ctx, const float *part, size_t n, float *all) {
    cv_comm *c = ctx;
    assert(n <= INT_MAX && "one rank's slice of the logits fits an MPI count");
    wait_begin(c);
    MPI_Gather(part, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, c->comm);
    wait_end(c);
}

/* The communicator of replica `replica`'s group: world rank 0 and the replica's workers, which
 * all wait here for each other. */
static MPI_Comm create_group(int tp_size, int replica) {
    int *members = cv_xmalloc((size_t)tp_size * sizeof *members);
    members[0] = 0;
    for (int i = 1; i < tp_size; i++) members[i] = 1 + replica * (tp_size - 1) + (i - 1);
    MPI_Group all, mine;
    MPI_Comm_group(MPI_COMM_WORLD, &all);
    MPI_Group_incl(all, tp_size, members, &mine);
    MPI_Comm comm;
    MPI_Comm_create_group(MPI_COMM_WORLD, mine, replica, &comm);
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    free(members);
    return comm;
}

int cv_comm_join(int tp_size, int dp_size, int dp_rank, cv_tp *tp, cv_comm **out) {
    *out = NULL;
    if (dp_size < 1) dp_size = 1;
    int rc = ensure_init(dp_size > 1);
    if (rc) return rc;
    int world_rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int job = 1 + dp_size * (tp_size - 1);
    if (world != job)
        return dp_size > 1 ? cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "data_parallel_size=%d with tensor_parallel_size=%d "
                                     "needs 1 + %d·%d = %d MPI ranks (mpirun -np %d), the job has %d", dp_size,
                                     tp_size, dp_size, tp_size - 1, job, job, world)
                           : cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor_parallel_size=%d but the MPI job has %d ranks "
                                     "(start it with mpirun -np %d)", tp_size, world, tp_size);
    const int replica = world_rank == 0 ? dp_rank : (world_rank - 1) / (tp_size - 1);
    cv_comm *c = cv_xcalloc(1, sizeof *c);
    c->comm = create_group(tp_size, replica);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    int go = 1; /* 0: rank 0 joined only to let the workers go (cv_comm_release_unjoined) */
    MPI_Bcast(&go, 1, MPI_INT, 0, c->comm);
    if (!go) {
        MPI_Comm_free(&c->comm);
        free(c);
        return CV_RUNNER_GROUP_FAILED;
    }
    *tp = (cv_tp){.rank = c->rank, .size = c->size, .ctx = c, .allreduce = allreduce, .gather = gather};
    if (c->rank == 0) {
        watch_comm(c, true);
        job_groups = dp_size;
        groups_joined++;
    }
    if (dp_size > 1) cv_info("executor", "tensor-parallel rank %d of %d of data-parallel replica %d", c->rank, c->size,
                             replica);
    else cv_info("executor", "tensor-parallel rank %d of %d", c->rank, c->size);
    *out = c;
    return 0;
}

void cv_comm_free(cv_comm *c) {
    if (!c) return;
    if (c->rank == 0) {
        watch_comm(c, false);
        if (c->released) groups_released++;
    }
    MPI_Comm_free(&c->comm);
    free(c);
}

int cv_comm_agree(cv_comm *c, int rc, const char *what) {
    int mine = rc ? c->rank : c->size, first = c->size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->comm);
    if (first == c->size) return 0;
    struct {
        int32_t rc;
        char reason[1024];
    } why = {rc, ""};
    if (c->rank == first) snprintf(why.reason, sizeof why.reason, "%s", cv_error_message());
    MPI_Bcast(&why, (int)sizeof why, MPI_BYTE, first, c->comm);
    if (c->rank != 0) return CV_RUNNER_GROUP_FAILED;
    c->released = true;
    if (first == 0) return rc;
    return cv_fail(why.rc, "tensor-parallel rank %d of %d failed to %s: %s", first, c->size, what, why.reason);
}

void cv_comm_bcast_header(cv_comm *c, cv_comm_header *h) {
    MPI_Bcast(h, 8, MPI_INT64_T, 0, c->comm);
    if (c->rank == 0 && h->cmd == CV_CMD_STOP) c->released = true;
}

bool cv_comm_workers_released(void) { return job_groups > 0 && groups_released == job_groups; }

void cv_comm_release_unjoined(int tp_size, int dp_size) {
    /* Nothing joined yet: whatever stopped replica 0 before its group formed (the same files, the
     * same checks) stops its workers too, and a rank that has ended cannot be waited on. */
    if (groups_joined == 0) return;
    for (int replica = groups_joined; replica < dp_size; replica++) {
        MPI_Comm comm = create_group(tp_size, replica);
        int go = 0;
        MPI_Bcast(&go, 1, MPI_INT, 0, comm);
        MPI_Comm_free(&comm);
        groups_released++;
        cv_info("executor", "data-parallel replica %d of %d: its workers let go before it started", replica, dp_size);
    }
}

void cv_comm_bcast_payload(cv_comm *c, void **payload, size_t *cap, size_t bytes) {
    if (c->rank != 0 && bytes > *cap) {
        free(*payload);
        *payload = cv_xmalloc(bytes);
        *cap = bytes;
    }
    for (size_t at = 0; at < bytes;) {
        const int count = chunk(bytes - at);
        MPI_Bcast((char *)*payload + at, count, MPI_BYTE, 0, c->comm);
        at += (size_t)count;
    }
}

bool cv_comm_in_job(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    return s && atoi(s) > 1;
}

static int env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    const int n = s ? atoi(s) : fallback;
    return n > 0 ? n : fallback;
}

int cv_comm_local_shards(int tp_size, int dp_size) {
    if (dp_size < 1) dp_size = 1;
    if (!getenv("OMPI_COMM_WORLD_SIZE")) return (tp_size > 1 ? tp_size : 1) * dp_size;
    const int local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1), world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    /* world rank 0 is here when every rank is, or when this is it */
    const bool rank0_here = local == world || env_int("OMPI_COMM_WORLD_RANK", 0) == 0;
    return local + (rank0_here && dp_size > 1 ? dp_size - 1 : 0);
}
