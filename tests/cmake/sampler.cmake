# Sampler, logits processors and RNG (the cv_sample layer).
cv_add_test(test_sampler SOURCES ${CMAKE_SOURCE_DIR}/tests/test_sampler.c LIBS cv_sample TIMEOUT 60)
