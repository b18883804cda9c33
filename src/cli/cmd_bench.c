/*
 * cmd_bench.c — `cvllm bench serve|throughput|latency`: picks the benchmark; each lives in the
 * bench layer (src/bench/bench.h) and mirrors the vLLM command of the same name.
 */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "cli/commands.h"

static const char bench_usage[] =
    "usage: cvllm bench <benchmark> [options]\n"
    "benchmarks (vLLM's `vllm bench`):\n"
    "  serve       online: stream requests to an OpenAI-compatible server (cvllm bench serve --help)\n"
    "  throughput  offline: a random dataset through the engine at once\n"
    "  latency     offline: the latency of one batch\n";

int cmd_bench(int argc, char **argv) {
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } benchmarks[] = {
        {"serve", cv_bench_serve_main},
        {"throughput", cv_bench_throughput_main},
        {"latency", cv_bench_latency_main},
    };
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(bench_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof benchmarks / sizeof *benchmarks; i++)
        if (!strcmp(argv[1], benchmarks[i].name)) return benchmarks[i].run(argc - 1, argv + 1);
    fprintf(stderr, "cvllm bench: unknown benchmark '%s' (available: serve, throughput, latency)\n", argv[1]);
    return 2;
}
