cv_add_test(test_engine SOURCES test_engine.c LIBS cv_engine TIMEOUT 600)
cv_add_test(test_block_pool SOURCES test_block_pool.c LIBS cv_engine TIMEOUT 60)
cv_add_test(test_engine_loop SOURCES test_engine_loop.c LIBS cv_engine TIMEOUT 300)
cv_add_test(test_spec_decode SOURCES test_spec_decode.c LIBS cv_engine TIMEOUT 300)
cv_add_test(test_engine_hybrid SOURCES test_engine_hybrid.c LIBS cv_engine TIMEOUT 300)
cv_add_test(test_kv_dtype SOURCES test_kv_dtype.c LIBS cv_engine TIMEOUT 300)
cv_add_test(test_engine_params SOURCES test_engine_params.c LIBS cv_engine TIMEOUT 300)
# Structured outputs end to end; validates outputs with python3 and node (ajv).
cv_add_test(test_structured SOURCES test_structured.c LIBS cv_engine TIMEOUT 600)
# LoRA adapters against the merged model, through the C API and `cvllm serve`.
cv_add_test(test_lora SOURCES test_lora.c LIBS cv_engine PkgConfig::CURL Threads::Threads TIMEOUT 300)
add_dependencies(test_lora cvllm)
# The pooling runner (embeddings) against the reference logits, through the C API.
cv_add_test(test_pooling SOURCES test_pooling.c LIBS cv_engine TIMEOUT 300)
