# What happens before the first token: the footprint a model's config implies and the fit check
# against the memory budget (test_footprint, through the library); the shipped model files, offline
# messages, the fit refusal, --max-model-len and quantized checkpoints through the cvllm binary
# (test_cli_startup); and the installed tree (test_install).
cv_add_test(test_footprint SOURCES ${CMAKE_SOURCE_DIR}/tests/test_footprint.c LIBS cv_engine TIMEOUT 120)
cv_add_test(test_cli_startup SOURCES ${CMAKE_SOURCE_DIR}/tests/test_cli_startup.c LIBS PkgConfig::JANSSON TIMEOUT 300)
add_dependencies(test_cli_startup cvllm)

# `cmake --install` into a scratch prefix, then what a user of the installed tree does (a shell
# script: it is a sequence of commands). A sanitized build's library needs the sanitizers at link.
set(CVLLM_EXAMPLE_CFLAGS "")
if(CVLLM_SANITIZE)
  set(CVLLM_EXAMPLE_CFLAGS "-fsanitize=address,undefined")
endif()
add_test(NAME test_install COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
         "${CMAKE_C_COMPILER}" "${CVLLM_EXAMPLE_CFLAGS}")
set_tests_properties(test_install PROPERTIES TIMEOUT 300)
