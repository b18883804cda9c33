/*
 * launch.c — `-tp N` with no launcher: cvllm starts its own N ranks (vLLM's
 * --distributed-executor-backend mp, the default).
 *
 * The command line is run again under OpenMPI's mpirun as an N-rank job with
 * `--distributed-executor-backend mpi` appended, which the ranks read as "already launched": every
 * rank creates the engine (cvllm.h tensor_parallel_size), rank 0 runs the command and the others
 * serve its model shard. This process stays the parent and exits with mpirun's status; mpirun runs
 * in a process group of its own and forwards the ranks' output (quietly: a rank's error is the last
 * line, without mpirun's advice after it). SIGTERM and SIGINT to this process reach the ranks as
 * SIGUSR2, which mpirun forwards as it is (it would answer SIGTERM itself by killing the job): rank 0
 * of `serve` takes it as its SIGTERM and drains, the workers wait for rank 0 to stop them. Ranks are
 * spread over NUMA nodes and bound to them where the machine has several
 * (each socket's memory bandwidth serves its own shard); on one node they are not bound, and mpirun
 * may start more ranks than cores (--oversubscribe). As root, mpirun refuses to start unless told:
 * cvllm tells it (OMPI_ALLOW_RUN_AS_ROOT), since the user asked for the ranks.
 *
 * Only the command line's own -tp / --tensor-parallel-size (space or = separated),
 * --distributed-executor-backend and serve's -dp / --data-parallel-size are read here (serve with
 * -dp D shards each of its D replicas: 1 + D·(N−1) ranks, executor/comm.h); a size given some other
 * way (a --config file) reaches the engine, which then fails with the mpirun command to use. A model
 * whose weights are not at hand is not launched: one process reports it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "loader/resolve.h"

/* The value of option `name` in argv (`name V` or `name=V`), or NULL. */
static const char *option(int argc, char **argv, const char *name) {
    const size_t n = strlen(name);
    const char *v = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], name) && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], name, n) && argv[i][n] == '=') v = argv[i] + n + 1;
    }
    return v;
}

/* The model argument: --model V, else serve's and generate's first positional argument. */
static const char *model_arg(int argc, char **argv) {
    const char *m = option(argc, argv, "--model");
    if (m) return m;
    const bool positional = !strcmp(argv[1], "serve") || !strcmp(argv[1], "generate");
    return positional && argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
}

/* Whether the model is at hand (its weights too, unless they are made up). When the model cannot be
 * told here, true: the ranks then report what is wrong with it. A model that is not at hand is not
 * launched: one process says so once, with its offline hint. */
static bool at_hand(const char *model, bool dummy) {
    char *dir = NULL;
    if (!model) return true;
    if (cv_resolve_model(model, NULL, !dummy, &dir)) return false;
    free(dir);
    return true;
}

static volatile pid_t job;

static void forward(int sig) {
    (void)sig;
    if (job > 0) kill(job, SIGUSR2);
}

static bool several_numa_nodes(void) { return access("/sys/devices/system/node/node1", F_OK) == 0; }

int cv_launch_ranks(int argc, char **argv) {
    const char *tp = option(argc, argv, "--tensor-parallel-size");
    if (!tp) tp = option(argc, argv, "-tp");
    const int n = tp ? atoi(tp) : 1;
    const char *backend = option(argc, argv, "--distributed-executor-backend");
    if (n <= 1 || (backend && !strcmp(backend, "mpi"))) return -1;
    const char *dp = option(argc, argv, "--data-parallel-size");
    if (!dp) dp = option(argc, argv, "-dp");
    const int replicas = dp && atoi(dp) > 1 && !strcmp(argv[1], "serve") ? atoi(dp) : 1;
    if (getenv("OMPI_COMM_WORLD_SIZE")) return -1; /* a rank of a job already */
    const char *format = option(argc, argv, "--load-format");
    if (!format) format = option(argc, argv, "--load_format");
    if (!at_hand(model_arg(argc, argv), format && !strcmp(format, "dummy"))) return -1;
    char self[PATH_MAX];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("cvllm: /proc/self/exe");
        return 1;
    }
    self[len] = '\0';
    char np[16];
    snprintf(np, sizeof np, "%d", 1 + replicas * (n - 1));
    const bool numa = several_numa_nodes();
    /* When a rank dies mpirun sends the others SIGTERM, then SIGKILL: the grace lets rank 0 answer
     * its clients (cmd_serve.c) before it goes. */
    const char *head[] = {"mpirun", "-q", "-np", np, "--oversubscribe", "--mca", "odls_base_sigkill_timeout", "5",
                          numa ? "--map-by" : "--bind-to", numa ? "numa" : "none", numa ? "--bind-to" : NULL,
                          numa ? "numa" : NULL, self};
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (!args) return 1;
    int k = 0;
    for (size_t i = 0; i < sizeof head / sizeof *head; i++)
        if (head[i]) args[k++] = (char *)head[i];
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    args[k++] = "--distributed-executor-backend";
    args[k++] = "mpi";
    args[k] = NULL;
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
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* a terminal's Ctrl-C reaches this process only, which forwards it */
        execvp("mpirun", args);
        perror("cvllm: cannot run mpirun (install openmpi-bin, or start the ranks with mpirun -np N ... "
               "--distributed-executor-backend mpi)");
        _exit(127);
    }
    free(args);
    if (pid < 0) {
        perror("cvllm: fork");
        return 1;
    }
    job = pid;
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return 1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
