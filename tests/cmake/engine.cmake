cv_add_test(test_engine SOURCES test_engine.c LIBS cv_engine TIMEOUT 600)
cv_add_test(test_block_pool SOURCES test_block_pool.c LIBS cv_engine TIMEOUT 60)
cv_add_test(test_engine_loop SOURCES test_engine_loop.c LIBS cv_engine TIMEOUT 300)
cv_add_test(test_spec_decode SOURCES test_spec_decode.c LIBS cv_engine TIMEOUT 300)
