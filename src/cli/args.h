/*
 * args.h — command-line parsing shared by the subcommands, in vLLM's conventions: `--flag value` or
 * `--flag=value`, booleans as `--flag` / `--no-flag`, and the engine flags of `vllm serve` that every
 * command accepts. Errors print one line "cvllm CMD: message" and the command exits with status 2.
 */
#ifndef CV_ARGS_H
#define CV_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "cvllm.h"

typedef struct cv_args {
    const char *cmd;   /* for messages: "generate", "bench latency", ... */
    int argc;
    char **argv;
    int i;             /* index of the argument being looked at */
    bool failed;       /* an error was printed */
} cv_args;

/* Prints "cvllm CMD: message" on stderr, marks the parse failed; returns 2 for `return`. */
int cv_args_error(cv_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* True when argv[i] is --name (taking the next argument as value) or --name=value. On a match the
 * index moves past it; a missing value is an error (returns true with *value NULL and failed set). */
bool cv_args_value(cv_args *a, const char *name, const char **value);
/* True when argv[i] is exactly --name. */
bool cv_args_flag(cv_args *a, const char *name);

/* Strict number parsing with range checks; errors name the flag. Integers accept vLLM's k/K/m/M/g/G
 * suffixes (1k = 1000, 1K = 1024). */
bool cv_args_int(cv_args *a, const char *flag, const char *s, int64_t min, int64_t max, int64_t *out);
bool cv_args_float(cv_args *a, const char *flag, const char *s, double min, double max, double *out);

/* Consumes one engine flag (vLLM's names) into *o. Returns true when argv[i] was an engine flag. */
bool cv_args_engine(cv_args *a, cvllm_engine_options *o);
/* The engine flags, for --help. */
extern const char cv_args_engine_help[];

/* Prints why the engine could not be created; for a network failure also names the same command
 * with --load-format dummy, which works offline. */
void cv_args_report_engine_error(const cv_args *a, int status);

#endif
