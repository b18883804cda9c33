# Sampler and RNG. The sampler needs nothing above cv_base, so the test compiles its source directly
# instead of linking the whole engine layer (and everything below it).
cv_add_test(test_sampler SOURCES ${CMAKE_SOURCE_DIR}/tests/test_sampler.c ${CMAKE_SOURCE_DIR}/src/engine/sampler.c
            LIBS cv_base TIMEOUT 60)
