# The strict HTTP/1.1 request parser of the event-driven server (src/server/http_parse.c), on its own.
cv_add_test(test_http_parse SOURCES test_http_parse.c LIBS cv_server TIMEOUT 60)

# libFuzzer target for it (-DCVLLM_FUZZ=ON with clang): heads, then chunked bodies fed whole and in
# pieces; seeds in tests/fuzz/corpus/fuzz_http.
cv_add_fuzzer(fuzz_http SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_http.c LIBS cv_server)
