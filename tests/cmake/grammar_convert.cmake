# The constraint converters (JSON schema, regex, choice, json_object → EBNF) through the grammar
# engine; the documents they generate are judged by ajv (node, Debian's node-ajv) and Python's re.
cv_add_test(test_grammar_convert SOURCES ${CMAKE_SOURCE_DIR}/tests/test_grammar_convert.c LIBS cv_sample TIMEOUT 120)

# libFuzzer over the grammar engine's front ends (schema, regex, GBNF) and a matcher walk; seeds in
# tests/fuzz/corpus/fuzz_grammar.
cv_add_fuzzer(fuzz_grammar SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_grammar.c LIBS cv_sample)
