# Grammar engine core (src/sample/grammar/): the EBNF parser's errors and limits, the byte-level
# automaton on many small grammars, rollback and end of sequence, and token masks over the real Qwen3
# vocabulary checked against accepting each token one by one.
cv_add_test(test_grammar SOURCES ${CMAKE_SOURCE_DIR}/tests/test_grammar.c LIBS cv_sample TIMEOUT 300)

# Mask timings on the real Qwen3 tokenizer (not a test: `bench_grammar_mask [steps]`).
add_executable(bench_grammar_mask ${CMAKE_SOURCE_DIR}/bench/grammar_mask.c)
target_link_libraries(bench_grammar_mask PRIVATE cv_sample)
target_compile_definitions(bench_grammar_mask PRIVATE CVLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
