# Loader tests: safetensors / config parsing and weight sources.
cv_add_test(test_loader SOURCES ${CMAKE_SOURCE_DIR}/tests/test_loader.c LIBS cv_loader TIMEOUT 120)
