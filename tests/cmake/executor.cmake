# Tensor parallelism over OpenMPI: a 2-rank job on this machine (one thread per rank, oversubscribed
# where there are fewer cores) against Hugging Face's f32 logits (environment: CV_OPENMPI_TEST_ENV).
find_program(MPIEXEC_BIN NAMES mpirun mpiexec)
set(TP_ENV "CVLLM_CACHE_ROOT=${CMAKE_BINARY_DIR}/test-cache;${CV_OPENMPI_TEST_ENV}")
cv_add_test(test_tp SOURCES test_tp.c LIBS cv_executor TIMEOUT 300
            LAUNCHER ${MPIEXEC_BIN} -np 2 --oversubscribe --bind-to none)
set_tests_properties(test_tp PROPERTIES ENVIRONMENT "${TP_ENV}")
# 4 ranks over the fixtures' 2 KV heads: each head on 2 ranks (the same binary, another job size)
add_test(NAME test_tp4 COMMAND ${MPIEXEC_BIN} -np 4 --oversubscribe --bind-to none $<TARGET_FILE:test_tp>)
set_tests_properties(test_tp4 PROPERTIES TIMEOUT 300 ENVIRONMENT "${TP_ENV}")
# A -tp 2 server (ranks started by cvllm itself) drains and exits 0 on SIGTERM, and exits non-zero in
# bounded time, leaving no rank behind, when its worker rank is killed.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME test_tp_failure
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/executor/test_tp_failure.py
                   $<TARGET_FILE:cvllm> ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_tp_failure PROPERTIES TIMEOUT 300 ENVIRONMENT "${TP_ENV}")
endif()
# Across hosts: test_tp with one rank in each of two network namespaces joined by a veth pair, over
# TCP only (skipped, with the reason, where namespaces cannot be made).
if(Python3_Interpreter_FOUND)
  add_test(NAME test_tp_hosts
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/executor/test_tp_hosts.py $<TARGET_FILE:test_tp>)
  set_tests_properties(test_tp_hosts PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT "${TP_ENV}")
endif()
