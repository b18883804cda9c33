# Kernels and thread pool: every kernel against a scalar double reference on each ISA path.
cv_add_test(test_kernels SOURCES test_kernels.c LIBS cv_kernels TIMEOUT 180)
