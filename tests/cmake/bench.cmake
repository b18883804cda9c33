# Benchmark clients (`cvllm bench serve|throughput|latency`): unit tests of the metric math, arrival
# schedules, SSE/stream parsing and the random dataset.
cv_add_test(test_bench SOURCES ${CMAKE_SOURCE_DIR}/tests/test_bench.c LIBS cv_bench TIMEOUT 60)

# The commands end to end: serve against tests/tools/mock_openai_server.py (python3), throughput and
# latency on the reference checkpoint.
cv_add_test(test_bench_cli SOURCES ${CMAKE_SOURCE_DIR}/tests/test_bench_cli.c LIBS cv_tokenizer TIMEOUT 150)
add_dependencies(test_bench_cli cvllm)

# Compile time of every constraint of the structured-outputs corpus (not a test: `bench_grammar_compile`).
add_executable(bench_grammar_compile ${CMAKE_SOURCE_DIR}/bench/grammar_compile.c)
target_link_libraries(bench_grammar_compile PRIVATE cv_sample)
target_compile_definitions(bench_grammar_compile PRIVATE CVLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
