# Qwen3 dense forward against Hugging Face f32 reference logits (tests/data/vectors), on the
# AVX-512 and AVX2 paths.
cv_add_test(test_qwen3_ref SOURCES test_qwen3_ref.c LIBS cv_models TIMEOUT 120)

# The packed-weight cache: the file format's failure paths, and the Qwen3 bf16 references cold, warm
# and after damage to the cache entry.
cv_add_test(test_pack_cache SOURCES test_pack_cache.c LIBS cv_models TIMEOUT 120)

# The calibration observer: every linear of every family reports its name and input rows, and the
# rows are the layer inputs (followed through the residual stream from the checkpoint's weights).
cv_add_test(test_model_observer SOURCES test_model_observer.c LIBS cv_models TIMEOUT 120)

# Quantized checkpoints (msModelSlim W8A8, W8A8_DYNAMIC, FP8) against Hugging Face's logits on the
# dequantized weights, under the folders' log-prob bounds, on every kernel path (scalar, AVX2,
# AVX-512 with and without VNNI, AMX); the AMX, VNNI and plain AVX-512 int8 kernels bit-identical
# end to end.
cv_add_test(test_quant_ref SOURCES test_quant_ref.c LIBS cv_models TIMEOUT 600)

# The bf16 compute mode against Hugging Face's f32 logits, within Hugging Face's own bf16 run's error,
# with the bf16 dot-product kernels and without; prefill and decode rows bit-identical.
cv_add_test(test_bf16_ref SOURCES test_bf16_ref.c LIBS cv_models TIMEOUT 600)
