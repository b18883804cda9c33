# What happens before the first token: the footprint a model's config implies and the fit check
# against the memory budget (test_footprint, through the library); the shipped model files, offline
# messages, the fit refusal, --max-model-len and quantized checkpoints through the cvllm binary
# (test_cli_startup).
cv_add_test(test_footprint SOURCES ${CMAKE_SOURCE_DIR}/tests/test_footprint.c LIBS cv_engine TIMEOUT 120)
cv_add_test(test_cli_startup SOURCES ${CMAKE_SOURCE_DIR}/tests/test_cli_startup.c LIBS PkgConfig::JANSSON TIMEOUT 300)
add_dependencies(test_cli_startup cvllm)
