# Data parallelism (`cvllm serve -dp N`): the router's choices, then the server as a process with one
# and two engine replicas (same greedy texts, both replicas used, aborts and prefix hits on the right
# replica), the replicas sharded over OpenMPI ranks (-dp 2 -tp 2), and the -dp flags.
cv_add_test(test_data_parallel SOURCES test_data_parallel.c
            LIBS cv_engine PkgConfig::CURL PkgConfig::JANSSON Threads::Threads TIMEOUT 600)
add_dependencies(test_data_parallel cvllm)
set_tests_properties(test_data_parallel PROPERTIES ENVIRONMENT "${CV_OPENMPI_TEST_ENV}")
