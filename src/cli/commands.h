/*
 * commands.h — the subcommands of the cvllm binary. Each takes argv with argv[0] = its own name and
 * returns the process exit status: 0 on success, 1 when the work failed, 2 for a usage error.
 */
#ifndef CV_COMMANDS_H
#define CV_COMMANDS_H

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

/* -tp N > 1 outside an MPI job (launch.c): runs the command line again as an N-rank mpirun job and
 * returns its exit status; -1 when there is nothing to launch. */
int cv_launch_ranks(int argc, char **argv);

#endif
