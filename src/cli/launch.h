/*
 * launch.h — how the commands that run an engine start it: in this process, or as the ranks of a
 * tensor-parallel job (launch.c).
 */
#ifndef CV_LAUNCH_H
#define CV_LAUNCH_H

#include <stdbool.h>

#include "cli/args.h"
#include "cvllm.h"

/* Called once the command's arguments `a` are parsed into the engine options `o`, before the
 * engine is created. With tensor_parallel_size N > 1 outside an MPI job (and no
 * --distributed-executor-backend mpi): checks the options as the engine would, then runs the
 * command line again as the job's ranks under mpirun, and returns true with *status the command's
 * exit status (1 when the options were refused, which is printed once). Otherwise returns false:
 * this process runs the command itself. */
bool cv_launch_ranks(const cv_args *a, const cvllm_engine_options *o, int *status);
/* Whether cv_launch_ranks would start ranks (rather than return false). */
bool cv_launch_wanted(const cv_args *a, const cvllm_engine_options *o);
/* This process's world rank in an MPI job (its ranks' or the user's own mpirun), or -1 outside one. */
int cv_launch_job_rank(void);
/* The exit status of this process, whose command ended with `status`: 0 on rank 0 of a job that
 * cv_launch_ranks started when status is not 0 but the job's workers end by themselves
 * (cvllm_job_workers_released), with status left for the launcher, which exits with it; else
 * status. */
int cv_launch_rank_exit(int status);

/* The engine of a command that runs one (generate, bench latency and throughput), once its
 * arguments `a` are parsed into `o`: NULL when the command ends here, with *status its exit status,
 * because its ranks ran it (cv_launch_ranks) or the engine could not be created (printed). */
cvllm_engine *cv_launch_engine(const cv_args *a, const cvllm_engine_options *o, int *status);

#endif
