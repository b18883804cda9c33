# Benchmark clients (`cvllm bench serve|throughput|latency`): unit tests of the metric math, arrival
# schedules, SSE/stream parsing and the random dataset.
cv_add_test(test_bench SOURCES ${CMAKE_SOURCE_DIR}/tests/test_bench.c LIBS cv_bench TIMEOUT 60)
