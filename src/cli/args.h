/*
 * args.h — command-line parsing for every subcommand, with the behaviour of vLLM's
 * FlexibleArgumentParser (vllm/utils/argparse_utils.py) on top of Python's argparse, so that a
 * `vllm serve …` or `vllm bench serve …` line runs with `cvllm` in place of `vllm`.
 *
 * Two stages.
 *
 * 1. cv_args_init() rewrites the command's arguments once, as FlexibleArgumentParser.parse_args
 *    does before argparse sees them:
 *    - `--config FILE.yaml` is replaced by the file's flags (args_config.c), inserted right after the
 *      subcommand (and after the positional MODEL when it comes first), so the command line wins;
 *    - `--some_flag` becomes `--some-flag`: underscores turn into dashes in the option name only,
 *      before any `=` and before the first `.` (so JSON keys keep theirs);
 *    - `-O3`, `-O 3`, `-O=3` become `--optimization-level 3`; `-O.key` is vLLM's older spelling of
 *      `--compilation-config.key`;
 *    - dotted JSON arguments (`--compilation-config.cudagraph_mode FULL`, `-cc.mode=3`,
 *      `--speculative-config.num_speculative_tokens 3`, a list item appended with `key+`) are merged
 *      into one JSON object per flag, values read as JSON, else as a 1k/1K-style integer, else as a
 *      string. Where the flag is also given whole (`--compilation-config '{...}'`), the dotted keys
 *      are merged over that object; vLLM would drop the whole object instead (its dotted flags are
 *      appended last and argparse keeps the last value), which loses settings silently.
 *
 * 2. Each command walks the rewritten arguments with an if-chain of cv_args_value / cv_args_flag /
 *    cv_args_list calls (names as "--long|-s" with aliases). Every option name a chain tries for the
 *    current argument is recorded; when an argument starting with `-` matched none of them, the
 *    command calls cv_args_unknown(), which resolves it as argparse does an abbreviation: the
 *    recorded names it is a prefix of (the part before `=`) — one name: the argument is rewritten to
 *    it and the chain runs again; several: "ambiguous option: --num could match --num-prompts,
 *    --num-warmups"; none: "unknown option". An exact name always wins, because the chain matches it
 *    before any abbreviation is considered. The names therefore live only in the chains that parse
 *    them, never in a second table.
 *
 * Errors print one line "cvllm CMD: message" on stderr and the command exits with status 2.
 */
#ifndef CV_ARGS_H
#define CV_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"

typedef struct cv_args {
    const char *cmd;   /* for messages: "generate", "bench latency", ... */
    int argc;
    char **argv;       /* the rewritten arguments, argv[0] = the subcommand's last word; owned */
    int i;             /* index of the argument being looked at */
    bool failed;       /* an error was printed */
    /* private */
    int orig_argc;     /* the arguments as typed, for the offline hint */
    char **orig_argv;
    bool *optional;    /* per argument: a `--no-KEY` from a config file, dropped when no such flag exists */
    struct { const char *name; size_t len; } *tried; /* option names tried for argument `tried_at` */
    size_t n_tried, cap_tried;
    int tried_at;
    char **pool;       /* option names made up while matching (the --no- forms), owned */
    size_t n_pool;
} cv_args;

/* Records the path the binary was invoked by (main's argv[0]), for the offline hint. */
void cv_args_set_program(const char *argv0);

/* Rewrites argv (argv[0] = the subcommand's last word, which stays) as described at the top and
 * starts parsing at argv[1]. Returns 0, or 2 after printing the error (a bad --config file). Call
 * cv_args_free in every case; the values handed out point into *a and live until then. */
int cv_args_init(cv_args *a, const char *cmd, int argc, char **argv);
void cv_args_free(cv_args *a);

/* Set by cvllm's tensor-parallel launcher (launch.c) in its ranks' environment: the command line
 * they parse again was parsed, and its notes logged, by the process it was typed to. */
#define CV_ARGS_NOTED_ENV "CVLLM_ARGS_NOTED"

/* A note on the arguments, logged at info level ("--X is accepted and ignored on this backend"):
 * once per command line, so not in a rank whose launcher noted it already (CV_ARGS_NOTED_ENV). */
void cv_args_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints "cvllm CMD: message" on stderr, marks the parse failed; returns 2 for `return`. */
int cv_args_error(cv_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* True when argv[i] is one of `names` ("--name|-n") taking the next argument as its value, or
 * NAME=value. On a match the index moves past it; a missing value is an error (returns true with
 * *value NULL and failed set). */
bool cv_args_value(cv_args *a, const char *names, const char **value);
/* True when argv[i] is exactly one of `names`; NAME=value is an error, as argparse's "ignored
 * explicit argument". */
bool cv_args_flag(cv_args *a, const char *names);
/* A bool of vLLM's (argparse's BooleanOptionalAction): one of `names` sets *out, its --no- form
 * clears it. */
bool cv_args_bool(cv_args *a, const char *names, bool *out);
/* vLLM's nargs="+": NAME=v gives v; NAME v1 v2 ... takes the arguments up to the next option. The
 * values are appended to *items (realloc'd, the caller frees the array). */
bool cv_args_list(cv_args *a, const char *names, const char ***items, size_t *n);
/* vLLM's nargs="?": NAME=v or NAME v gives v; NAME before another option (or last) gives NULL. */
bool cv_args_optional_value(cv_args *a, const char *names, const char **value);

/* Called when argv[i] starts with '-' and no option of the command took it. True: it was an
 * abbreviation, now rewritten to the full name (parse it again), or a config file's `--no-KEY`
 * for a flag the command does not have, now skipped. False: the error was printed. */
bool cv_args_unknown(cv_args *a);

/* Strict number parsing with range checks; errors name the flag. Integers accept vLLM's k/K/m/M/g/G
 * suffixes (1k = 1000, 1K = 1024). */
bool cv_args_int(cv_args *a, const char *flag, const char *s, int64_t min, int64_t max, int64_t *out);
bool cv_args_float(cv_args *a, const char *flag, const char *s, double min, double max, double *out);
/* An integer option: true when argv[i] is one of `names` (as cv_args_value); its value, checked by
 * cv_args_int against [min, max], goes to *out, which an error leaves as it was. */
bool cv_args_int_option(cv_args *a, const char *names, int64_t min, int64_t max, int64_t *out);
bool cv_args_int32_option(cv_args *a, const char *names, int32_t min, int32_t max, int32_t *out);

/* A vLLM flag that means nothing in cvllm: accepted so vLLM command lines run unchanged, its value
 * checked, and logged as ignored. */
typedef enum cv_ignored_kind {
    CV_IGNORED_SWITCH, /* --name */
    CV_IGNORED_BOOL,   /* --name and --no-name (argparse's BooleanOptionalAction) */
    CV_IGNORED_INT,    /* --name N, N >= 0 */
    CV_IGNORED_FLOAT,  /* --name F */
    CV_IGNORED_STRING, /* --name VALUE */
    CV_IGNORED_CHOICE, /* --name VALUE, VALUE one of `choices` */
    CV_IGNORED_JSON,   /* --name JSON, a JSON object */
    CV_IGNORED_SIZES,  /* --name N [N ...] (argparse's nargs="+"), each N >= 1 */
} cv_ignored_kind;

typedef struct cv_ignored_flag {
    const char *names; /* "--name|-n" */
    cv_ignored_kind kind;
    const char *const *choices; /* CV_IGNORED_CHOICE: NULL-terminated */
} cv_ignored_flag;

/* True when argv[i] is one of the flags of the table (consumed, checked, logged). */
bool cv_args_ignored(cv_args *a, const cv_ignored_flag *flags, size_t n);

/* A vLLM flag that cannot mean in cvllm what it means in vLLM: refused in one line saying why, never
 * silently dropped. */
typedef struct cv_refused_flag {
    const char *names; /* "--name|--other" */
    const char *why;
} cv_refused_flag;

/* True (after the usage error "--name is not supported: why") when argv[i] is one of the table's. */
bool cv_args_refused(cv_args *a, const cv_refused_flag *flags, size_t n);

/* ---- engine flags (args_engine.c) ---- */

/* Consumes one engine flag (vLLM's EngineArgs names) into *o. Returns true when argv[i] was an
 * engine flag. Every command that builds an engine (serve, generate, bench throughput, bench
 * latency) calls it, so they all accept the same names with the same checks. */
bool cv_args_engine(cv_args *a, cvllm_engine_options *o);
/* The engine flags, for --help. */
extern const char cv_args_engine_help[];

/* Prints why the engine could not be created; for a network failure also prints the same command,
 * as the user can paste it, with --load-format dummy, which works offline. */
void cv_args_report_engine_error(const cv_args *a, int status);

#endif
