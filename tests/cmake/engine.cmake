cv_add_test(test_engine SOURCES test_engine.c LIBS cv_engine TIMEOUT 600)
