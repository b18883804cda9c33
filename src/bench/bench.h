/*
 * bench.h — the benchmark clients behind `cvllm bench serve|throughput|latency`, mirroring vLLM's
 * `vllm bench` commands (vllm/benchmarks/{serve,throughput,latency}.py): same flags, same printed lines, same JSON keys.
 *
 *   serve       online: streams requests to any OpenAI-compatible server (cvllm, vLLM, llama.cpp)
 *   throughput  offline: a whole random dataset through the engine at once
 *   latency     offline: the time of one batch, repeated
 *
 * Each entry point takes argv with argv[0] = its own name ("serve", ...) and returns the exit
 * status: 0 on success, 1 when the benchmark could not run, 2 for a usage error.
 */
#ifndef CV_BENCH_H
#define CV_BENCH_H

int cv_bench_serve_main(int argc, char **argv);
int cv_bench_throughput_main(int argc, char **argv);
int cv_bench_latency_main(int argc, char **argv);

#endif
