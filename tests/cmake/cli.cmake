# End-to-end tests of the cvllm binary.
cv_add_test(test_cli_generate SOURCES test_cli_generate.c LIBS cv_base TIMEOUT 600)
add_dependencies(test_cli_generate cvllm)
# its -tp 2 runs start OpenMPI ranks (tests/CMakeLists.txt)
set_tests_properties(test_cli_generate PROPERTIES
                     ENVIRONMENT "CVLLM_CACHE_ROOT=${CMAKE_BINARY_DIR}/test-cache;${CV_OPENMPI_TEST_ENV}")
# vLLM's argument parsing through the binary: spellings, abbreviations, -O, dotted JSON, --config
# YAML, the shared engine flags, the offline hint and the tutorials' command lines.
cv_add_test(test_cli_args SOURCES test_cli_args.c LIBS cv_base PkgConfig::JANSSON TIMEOUT 180)
add_dependencies(test_cli_args cvllm)
