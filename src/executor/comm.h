/*
 * comm.h — the ranks of a tensor-parallel runner and what travels between them, over OpenMPI
 * (internal to src/executor).
 *
 * Every rank runs the same model load and cache allocation; then rank 0 (the engine's) sends each
 * command to the others — allocate the caches, run a batch with its state copies, stop — as one
 * broadcast of a fixed header and one of a byte payload, and the model's own collectives (the
 * all-reduce after o_proj and down_proj) run inside the forward pass that follows. A rank that
 * fails a step every rank takes together (load, allocation) makes all of them fail it: each result
 * is agreed on with one all-reduce, so no rank waits on a peer that gave up. A rank that dies ends
 * the job: mpirun ends the others (SIGTERM, then SIGKILL), or MPI's default error handler
 * (MPI_ERRORS_ARE_FATAL) aborts them. A rank that hangs, or dies unseen, leaves rank 0 waiting in a
 * collective: a watchdog thread on rank 0 raises SIGTERM there once a wait passes
 * VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s) — rank 0 of a job takes SIGTERM as the job ending, and
 * its exit makes mpirun end the rest. Never a hang.
 *
 * MPI is initialised here on first use (threads: serialized, as the engine thread that steps the
 * runner is not the process's main thread) and finalised at exit.
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

/* Joins the MPI job (initialising MPI once per process) as a tensor-parallel group of tp_size ranks,
 * which must be the whole job; fills tp (rank, size and the all-reduce). */
int cv_comm_join(int tp_size, cv_tp *tp);
/* Whether every rank got rc == 0; the failing ranks have logged why, the others learn it here. */
int cv_comm_agree(int rc, const char *what);
/* Rank 0 sends (others receive) a header, then payload bytes; a receiver's payload is grown to fit
 * and stays the caller's. */
void cv_comm_bcast_header(cv_comm_header *h);
void cv_comm_bcast_payload(void **payload, size_t *cap, size_t bytes);

/* Whether this process is a rank of an MPI job of more than one rank (without initialising MPI). */
bool cv_comm_in_job(void);
/* How many ranks of this job share this machine (for the default thread count); 1 outside MPI. */
int cv_comm_local_ranks(void);

#endif
