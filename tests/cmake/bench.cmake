# Benchmark clients (`cvllm bench serve|throughput|latency`): unit tests of the metric math, arrival
# schedules, SSE/stream parsing and the random dataset.
cv_add_test(test_bench SOURCES ${CMAKE_SOURCE_DIR}/tests/test_bench.c LIBS cv_bench TIMEOUT 60)

# The commands end to end: serve against tests/tools/mock_openai_server.py (python3), throughput and
# latency on the reference checkpoint.
cv_add_test(test_bench_cli SOURCES ${CMAKE_SOURCE_DIR}/tests/test_bench_cli.c LIBS cv_base TIMEOUT 150)
add_dependencies(test_bench_cli cvllm)
