# Tokenizer: exact agreement with Hugging Face on the reference cases, round trips, the incremental
# detokenizer and every load/encode/decode error; the public API (through the hub resolver) and the
# `cvllm tokenize` command.
cv_add_test(test_tokenizer SOURCES ${CMAKE_SOURCE_DIR}/tests/test_tokenizer.c
            LIBS cv_tokenizer PkgConfig::UTF8PROC TIMEOUT 600)

cv_add_test(test_tokenizer_api SOURCES ${CMAKE_SOURCE_DIR}/tests/test_tokenizer_api.c
            LIBS cv_tokenizer)

if(EXISTS ${CMAKE_SOURCE_DIR}/src/cli/main.c AND EXISTS ${CMAKE_SOURCE_DIR}/tests/test_tokenizer_cli.c)
  cv_add_test(test_tokenizer_cli SOURCES ${CMAKE_SOURCE_DIR}/tests/test_tokenizer_cli.c
              LIBS cv_base)
  add_dependencies(test_tokenizer_cli cvllm)
endif()

add_executable(bench_tokenizer ${CMAKE_SOURCE_DIR}/bench/tokenizer_bench.c)
target_link_libraries(bench_tokenizer PRIVATE cv_tokenizer)
target_compile_definitions(bench_tokenizer PRIVATE CVLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
