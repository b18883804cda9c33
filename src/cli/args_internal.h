/*
 * args_internal.h — what the files of the argument parser share among themselves (args.c, the
 * rewriting and matching; args_config.c, `--config FILE.yaml`; args_engine.c, the engine flags and
 * the offline hint). Not for the commands: they use args.h.
 */
#ifndef CV_ARGS_INTERNAL_H
#define CV_ARGS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

/* A growing list of owned argument strings; `optional` marks a config file's `--no-KEY`, which is
 * dropped when the command has no such flag (vLLM adds it only when the parser knows it). */
typedef struct cv_arglist {
    char **items;
    bool *optional;
    size_t n, cap;
} cv_arglist;

void cv_arglist_push(cv_arglist *l, char *owned, bool optional);
void cv_arglist_free(cv_arglist *l);

/* Appends the flags of vLLM's YAML config file PATH to *out, as vLLM's load_config_file turns them
 * into arguments. Returns NULL, or the message of why not (the caller frees it). */
char *cv_args_config_load(const char *path, cv_arglist *out);

/* The path the binary was invoked by (cv_args_set_program), "cvllm" when never set. */
const char *cv_args_program(void);

/* True when `s` is one of the NULL-terminated `list`. */
bool cv_args_in_list(const char *const *list, const char *s);
/* The items quoted as Python prints strings, "'a', 'b', 'c'", `last_sep` before the last one
 * (", " for argparse's choices, " or " for pydantic's enum members). The caller frees it. */
char *cv_args_quoted_list(const char *const *list, const char *last_sep);

/* Splits the next name off a "--name|-n" list: true with *name and *len set, false at the end. */
bool cv_args_next_name(const char **names, const char **name, size_t *len);

#endif
