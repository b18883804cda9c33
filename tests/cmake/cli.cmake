# End-to-end tests of the cvllm binary.
cv_add_test(test_cli_generate SOURCES test_cli_generate.c LIBS cv_base TIMEOUT 300)
add_dependencies(test_cli_generate cvllm)
