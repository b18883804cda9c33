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

#endif
