# Qwen3-MoE and the hybrid Gated-DeltaNet models (Qwen3-Next, Qwen3.5-MoE) against Hugging Face f32
# reference logits (tests/data/vectors), on the AVX-512 and AVX2 paths; MoE and GDN kernels.
cv_add_test(test_moe_ref SOURCES test_moe_ref.c LIBS cv_models TIMEOUT 300)
cv_add_test(test_hybrid_ref SOURCES test_hybrid_ref.c LIBS cv_models TIMEOUT 300)
# The MTP module of the hybrid models against a naive implementation of the MTP math; loading
# with and without mtp.* weights.
cv_add_test(test_mtp SOURCES test_mtp.c LIBS cv_models TIMEOUT 300)
