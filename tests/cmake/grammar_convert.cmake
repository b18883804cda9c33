# The constraint converters (JSON schema, regex, choice, json_object → EBNF) through the grammar
# engine; the documents they generate are judged by ajv (node, Debian's node-ajv) and Python's re.
cv_add_test(test_grammar_convert SOURCES ${CMAKE_SOURCE_DIR}/tests/test_grammar_convert.c LIBS cv_sample TIMEOUT 120)
