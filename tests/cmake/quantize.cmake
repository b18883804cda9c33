# `cvllm quantize`: the loader pieces it is built on (the arithmetic, the safetensors writer, the
# recipes, the export's refusals).
cv_add_test(test_quantize SOURCES ${CMAKE_SOURCE_DIR}/tests/test_quantize.c LIBS cv_loader)
