# `cvllm quantize`: the binary end to end (W8A8_DYNAMIC against the quantized reference folders bit
# for bit, W8A8 static against ranges the test observes through the models' observer, recipes,
# shards, every error path), and the loader pieces it is built on (the arithmetic,
# the safetensors writer, the recipes, the export's refusals).
cv_add_test(test_cli_quantize SOURCES ${CMAKE_SOURCE_DIR}/tests/test_cli_quantize.c
            LIBS cv_models cv_tokenizer TIMEOUT 300)
add_dependencies(test_cli_quantize cvllm)
cv_add_test(test_quantize SOURCES ${CMAKE_SOURCE_DIR}/tests/test_quantize.c LIBS cv_loader)
