# Loader tests: safetensors / config parsing and weight sources; hub cache and downloads against a
# local stand-in server (tests/tools/hf_server.py, needs python3).
cv_add_test(test_loader SOURCES ${CMAKE_SOURCE_DIR}/tests/test_loader.c LIBS cv_loader TIMEOUT 120)
cv_add_test(test_download SOURCES ${CMAKE_SOURCE_DIR}/tests/test_download.c LIBS cv_loader TIMEOUT 150)

# libFuzzer targets for the safetensors header and config parsers (-DCVLLM_FUZZ=ON with clang);
# seeds in tests/fuzz/corpus/fuzz_safetensors and tests/fuzz/corpus/fuzz_config.
cv_add_fuzzer(fuzz_safetensors SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_safetensors.c LIBS cv_loader)
cv_add_fuzzer(fuzz_config SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_config.c LIBS cv_loader)

# Quantized checkpoints (msModelSlim W8A8 / W8A8_DYNAMIC, FP8): schemes, tensors, refusals, dummy weights.
cv_add_test(test_quant_loader SOURCES ${CMAKE_SOURCE_DIR}/tests/test_quant_loader.c LIBS cv_loader TIMEOUT 120)
