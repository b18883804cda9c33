/*
 * comm.h — the ranks of a tensor-parallel runner and what travels between them, over OpenMPI
 * (internal to src/executor).
 *
 * A tensor-parallel group is the engine's rank (group rank 0) and its workers. Every rank of a
 * group runs the same model load and cache allocation; then group rank 0 sends each command to the
 * others — allocate the caches, run a batch with its state copies, stop — as one broadcast of a
 * fixed header and one of a byte payload, and the model's own collectives (the all-reduce after
 * o_proj and down_proj) run inside the forward pass that follows. A rank that fails a step every
 * rank takes together (load, allocation) makes all of them fail it: each result is agreed on with
 * one all-reduce, so no rank waits on a peer that gave up, and the first failing rank's reason goes
 * to rank 0, which alone reports it.
 *
 * Data parallelism with tensor parallelism (`serve -dp D -tp T`): the job has 1 + D·(T−1) ranks.
 * World rank 0 is the API server and holds group rank 0 of every replica (one engine thread each);
 * world ranks 1 + d·(T−1) … (d+1)·(T−1) are replica d's workers. Each group has its own
 * communicator (MPI_Comm_create_group, only its members take part), and rank 0's engine threads use
 * theirs concurrently (MPI_THREAD_MULTIPLE; one replica needs only MPI_THREAD_SERIALIZED, as the
 * engine thread that steps the runner is not the process's main thread).
 *
 * A rank that dies ends the job: mpirun ends the others (SIGTERM, then SIGKILL), or MPI's default
 * error handler (MPI_ERRORS_ARE_FATAL) aborts them. A rank that hangs, or dies unseen, leaves rank 0
 * waiting in a collective: a watchdog thread on world rank 0 sends the process SIGTERM once a wait
 * of any of its groups passes VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s) — rank 0 of a job takes
 * SIGTERM as the job ending, and its exit makes mpirun end the rest. Never a hang.
 *
 * MPI is initialised here on first use and finalised at exit.
 */
#ifndef CV_EXECUTOR_COMM_H
#define CV_EXECUTOR_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "models/model.h"

enum { CV_CMD_EXECUTE = 1, CV_CMD_EXECUTE_MTP, CV_CMD_ALLOC, CV_CMD_STOP };

/* The header of a command: cmd and up to 7 sizes. */
typedef struct cv_comm_header {
    int64_t cmd, n[7];
} cv_comm_header;

typedef struct cv_comm cv_comm;

/* Joins the MPI job (initialising MPI once per process) as a rank of a tensor-parallel group of
 * tp_size ranks; the job must have 1 + dp_size·(tp_size − 1) ranks. On world rank 0 the group is
 * replica dp_rank's (every replica's group is joined from there, in order); elsewhere the world
 * rank says which. Fills tp (rank, size, the collectives, ctx: the cv_comm) and *out. A worker
 * whose rank 0 joined only to let it go (cv_comm_release_unjoined) gets CV_RUNNER_GROUP_FAILED. */
int cv_comm_join(int tp_size, int dp_size, int dp_rank, cv_tp *tp, cv_comm **out);
void cv_comm_free(cv_comm *c);
/* 0 when every rank of the group got rc == 0. Else group rank 0 returns the error of the lowest
 * failing rank (its own, or that rank's code and reason, named "tensor-parallel rank R of N failed
 * to <what>: ..."), and a worker CV_RUNNER_GROUP_FAILED (runner.h): one process reports it. */
int cv_comm_agree(cv_comm *c, int rc, const char *what);
/* Group rank 0 sends (the others receive) a header, then payload bytes; a receiver's payload is
 * grown to fit and stays the caller's. */
void cv_comm_bcast_header(cv_comm *c, cv_comm_header *h);
void cv_comm_bcast_payload(cv_comm *c, void **payload, size_t *cap, size_t bytes);
/* On world rank 0: whether it has freed every group of the job after letting its workers go (a
 * failed cv_comm_agree, a CV_CMD_STOP header, cv_comm_release_unjoined), so that no worker waits
 * on it. */
bool cv_comm_workers_released(void);
/* On world rank 0, after a replica failed to start: joins the groups of the replicas it has not
 * joined yet, whose workers wait for it, and lets their workers go at once (their cv_comm_join
 * returns CV_RUNNER_GROUP_FAILED), so that the job can end without mpirun's kill sequence. */
void cv_comm_release_unjoined(int tp_size, int dp_size);

/* Whether this process is a rank of an MPI job of more than one rank (without initialising MPI). */
bool cv_comm_in_job(void);
/* How many model shards of a job of tp_size × dp_size this machine runs (its ranks, and the other
 * replicas' group ranks 0 where world rank 0 is), for the default thread count and the memory
 * share. Outside MPI, those of the job cvllm's launcher would start here (cli/launch.c): all of
 * them, tp_size · dp_size. */
int cv_comm_local_shards(int tp_size, int dp_size);

#endif
