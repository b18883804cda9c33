/*
 * main.c — the cvllm binary: dispatches to a subcommand, each built on the public API (cvllm.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cvllm.h"

static const char usage[] =
    "usage: cvllm <command> [options]\n"
    "commands:\n"
    "  serve MODEL      OpenAI-compatible HTTP server, as `vllm serve` (cvllm serve --help)\n"
    "  generate MODEL   offline batch inference (cvllm generate --help)\n"
    "  tokenize MODEL   encode text or decode ids with the model's tokenizer\n"
    "  quantize MODEL OUT  write an msModelSlim W8A8 checkpoint (cvllm quantize --help)\n"
    "  bench serve      load test an OpenAI-compatible server (vLLM's `bench serve`)\n"
    "  bench throughput offline throughput of the engine (vLLM's `bench throughput`)\n"
    "  bench latency    latency of one batch (vLLM's `bench latency`)\n"
    "MODEL is a Hugging Face model folder or a hub id (ORG/NAME) in the Hugging Face cache.\n";

int main(int argc, char **argv) {
    cv_args_set_program(argv[0]); /* the offline hint repeats the command as it was typed */
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("cvllm %s\n", CVLLM_VERSION);
        return 0;
    }
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {
        {"serve", cmd_serve},
        {"generate", cmd_generate},
        {"tokenize", cmd_tokenize},
        {"bench", cmd_bench},
        {"quantize", cmd_quantize},
    };
    /* A rank of a tensor-parallel job (cli/launch.c): whole lines, so that mpirun, which forwards
     * every rank's output, never splices two ranks' lines; rank 0 alone speaks on stdout, and the
     * other ranks log warnings and errors only (unless CVLLM_LOG_LEVEL says otherwise): their info
     * lines would repeat rank 0's. */
    const int rank = cv_launch_job_rank();
    if (rank >= 0) {
        setvbuf(stderr, NULL, _IOLBF, 0);
        if (rank > 0) {
            setenv("CVLLM_LOG_LEVEL", "warning", 0);
            if (!freopen("/dev/null", "w", stdout)) perror("cvllm: /dev/null");
        }
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return cv_launch_rank_exit(commands[i].run(argc - 1, argv + 1));
    fprintf(stderr, "cvllm: unknown command '%s'\n%s", argv[1], usage);
    return 2;
}
