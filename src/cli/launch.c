/*
 * launch.c — `-tp N` with no launcher: cvllm starts its own N ranks (vLLM's
 * --distributed-executor-backend mp, the default).
 *
 * A command that runs an engine (serve, generate, bench latency and throughput) calls it once its
 * arguments are parsed, with the engine options they gave, the --config file's included. First the
 * options are checked here as the engine would (cvllm_engine_check: the model at hand, its config,
 * the quantization, the heads' split over the ranks, the memory fit of a shard), so that a job that
 * would fail is refused at once and in one line, by one process, with no mpirun. (What only loading
 * finds, a tensor missing say, the ranks agree on and rank 0 alone reports.) Then the command line
 * as typed is run again under OpenMPI's mpirun as an N-rank job with `--distributed-executor-backend
 * mpi` appended, which the ranks read as "already launched": every rank creates the engine (cvllm.h
 * tensor_parallel_size), rank 0 runs the command and the others serve its model shard. The ranks
 * also find CV_ARGS_NOTED_ENV set: this process logged the arguments' notes already. This process
 * stays the parent and exits with mpirun's status (or the one rank 0 left it in a file, when rank 0
 * failed but let its workers go and so could end with 0: see STATUS_FILE_ENV); mpirun runs in a
 * process group of its own and forwards the ranks' output (quietly: a rank's error is the last line,
 * without mpirun's advice after it). SIGTERM and SIGINT to this process reach the ranks as SIGUSR2,
 * which mpirun forwards as it is (it would answer SIGTERM itself by killing the job): rank 0 of
 * `serve` takes it as its SIGTERM and drains, the workers wait for rank 0 to stop them. Ranks are
 * spread over NUMA nodes and bound to them where the machine has several (each socket's memory
 * bandwidth serves its own shard); on one node they are not bound, and mpirun may start more ranks than cores
 * (--oversubscribe). As root, mpirun refuses to start unless told: cvllm tells it
 * (OMPI_ALLOW_RUN_AS_ROOT), since the user asked for the ranks.
 *
 * serve with -dp D shards each of its D replicas: 1 + D·(N−1) ranks (executor/comm.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/launch.h"

/* The --distributed-executor-backend the arguments name (after --config and the spellings were
 * resolved), or NULL. */
static const char *executor_backend(const cv_args *a) {
    static const char name[] = "--distributed-executor-backend";
    const char *v = NULL;
    for (int i = 1; i < a->argc; i++) {
        if (!strcmp(a->argv[i], name) && i + 1 < a->argc) v = a->argv[i + 1];
        else if (!strncmp(a->argv[i], name, sizeof name - 1) && a->argv[i][sizeof name - 1] == '=')
            v = a->argv[i] + sizeof name;
    }
    return v;
}

static volatile pid_t job;

/* Where rank 0 of a job this launcher started leaves its exit status when that is not 0 and its
 * workers end by themselves (cv_launch_rank_exit); rank 0 then exits 0. mpirun answers a rank's
 * failing status by ending the job (SIGTERM, the grace, SIGKILL), and waits out the grace twice even
 * when every rank is gone: a serve job whose model failed to load took 12 s to exit, 3 s this way. */
#define STATUS_FILE_ENV "CVLLM_JOB_STATUS_FILE"

/* The status rank 0 left in path: mpirun ended with 0, so rank 0 did too or said otherwise there. */
static int rank0_status(const char *path) {
    FILE *f = fopen(path, "r");
    int st = 0;
    if (f) {
        if (fscanf(f, "%d", &st) != 1 || st < 0 || st > 255) st = 0;
        fclose(f);
    }
    return st;
}

static void forward(int sig) {
    (void)sig;
    if (job > 0) kill(job, SIGUSR2);
}

static bool several_numa_nodes(void) { return access("/sys/devices/system/node/node1", F_OK) == 0; }

int cv_launch_job_rank(void) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    return rank ? atoi(rank) : -1;
}

bool cv_launch_wanted(const cv_args *a, const cvllm_engine_options *o) {
    const char *backend = executor_backend(a);
    return o->tensor_parallel_size > 1 && !(backend && !strcmp(backend, "mpi")) && !getenv("OMPI_COMM_WORLD_SIZE");
}

bool cv_launch_ranks(const cv_args *a, const cvllm_engine_options *o, int *status) {
    if (!cv_launch_wanted(a, o)) return false;
    const int n = o->tensor_parallel_size;
    *status = 1;
    /* rank 0 runs the same check and logs what it finds; here only its verdict is said */
    const enum cv_log_level was = cv_log_set_threshold(CV_LOG_ERROR);
    int rc = cvllm_engine_check(o);
    cv_log_set_threshold(was);
    if (rc) {
        cv_args_report_engine_error(a, rc);
        return true;
    }
    const int replicas = o->data_parallel_size > 1 ? o->data_parallel_size : 1;
    char self[PATH_MAX];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("cvllm: /proc/self/exe");
        return true;
    }
    self[len] = '\0';
    char np[16];
    snprintf(np, sizeof np, "%d", 1 + replicas * (n - 1));
    const bool numa = several_numa_nodes();
    /* When a rank exits with a failure mpirun sends the others SIGTERM, then SIGKILL: the grace lets
     * serve's rank 0 answer its clients (cmd_serve.c) before it goes. mpirun waits it out even when
     * every rank is gone already (generate failing at start: 10 s with a grace of 5, 1 s without),
     * so the commands with no clients have none. */
    const char *grace = strcmp(a->cmd, "serve") ? "0" : "5";
    const char *head[] = {"mpirun", "-q", "-np", np, "--oversubscribe", "--mca", "odls_base_sigkill_timeout", grace,
                          numa ? "--map-by" : "--bind-to", numa ? "numa" : "none", numa ? "--bind-to" : NULL,
                          numa ? "numa" : NULL, self};
    /* the command line as typed: the command's words ("bench latency"), then its arguments */
    char *words = cv_xstrdup(a->cmd), *save = NULL;
    char **args = cv_xcalloc((size_t)a->orig_argc + 32, sizeof *args);
    int k = 0;
    for (size_t i = 0; i < sizeof head / sizeof *head; i++)
        if (head[i]) args[k++] = (char *)head[i];
    for (char *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) args[k++] = w;
    for (int i = 1; i < a->orig_argc; i++) args[k++] = a->orig_argv[i];
    args[k++] = "--distributed-executor-backend";
    args[k++] = "mpi";
    args[k] = NULL;
    setenv(CV_ARGS_NOTED_ENV, "1", 1); /* the ranks need not repeat this parse's notes */
    const char *tmp = getenv("TMPDIR");
    char status_file[PATH_MAX];
    snprintf(status_file, sizeof status_file, "%s/cvllm-job-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    const int fd = mkstemp(status_file);
    if (fd < 0) {
        fprintf(stderr, "cvllm: cannot create %s: %s\n", status_file, strerror(errno));
        free(args);
        free(words);
        return true;
    }
    close(fd);
    setenv(STATUS_FILE_ENV, status_file, 1);
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    if (replicas > 1)
        fprintf(stderr, "INFO cvllm: tensor_parallel_size %d, data_parallel_size %d: starting %d ranks under "
                "mpirun%s\n", n, replicas, 1 + replicas * (n - 1), numa ? ", one per NUMA node" : "");
    else
        fprintf(stderr, "INFO cvllm: tensor_parallel_size %d: starting %d ranks under mpirun%s\n", n, n,
                numa ? ", one per NUMA node" : "");
    fflush(NULL);
    /* Forwarding starts before the job exists (a signal then reaches nobody); serve has blocked the
     * stop signals for its own threads, which a launcher does not start: mpirun and this process
     * take them again. */
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* a terminal's Ctrl-C reaches this process only, which forwards it */
        execvp("mpirun", args);
        perror("cvllm: cannot run mpirun (install openmpi-bin, or start the ranks with mpirun -np N ... "
               "--distributed-executor-backend mpi)");
        _exit(127);
    }
    free(args);
    free(words);
    if (pid < 0) {
        perror("cvllm: fork");
        unlink(status_file);
        return true;
    }
    job = pid;
    int st = 0;
    pid_t waited;
    while ((waited = waitpid(pid, &st, 0)) < 0 && errno == EINTR) continue;
    if (waited == pid) {
        *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (*status == 0) *status = rank0_status(status_file);
    }
    unlink(status_file);
    return true;
}

int cv_launch_rank_exit(int status) {
    const char *path = getenv(STATUS_FILE_ENV);
    if (!status || cv_launch_job_rank() != 0 || !path || !cvllm_job_workers_released()) return status;
    FILE *f = fopen(path, "r+"); /* the launcher's file, never a new one: a rank 0 on another host has none */
    if (!f) return status;
    const bool said = fprintf(f, "%d\n", status) > 0;
    return fclose(f) == 0 && said ? 0 : status;
}

cvllm_engine *cv_launch_engine(const cv_args *a, const cvllm_engine_options *o, int *status) {
    cvllm_engine *e = NULL;
    if (cv_launch_ranks(a, o, status)) return NULL;
    const int rc = cvllm_engine_create(o, &e);
    if (rc) {
        cv_args_report_engine_error(a, rc);
        *status = 1;
    }
    return e;
}
