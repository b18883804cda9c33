# The vLLM tutorials' `serve` and `bench serve` command lines as users paste them (tests/tutorials/
# test_tutorials.py says what it replaces: the model ids by stand-in checkpoints, ports, prompt count).
# The Qwen3-32B line's -tp 4 runs as 4 OpenMPI ranks (CV_OPENMPI_TEST_ENV).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME test_tutorials
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/tutorials/test_tutorials.py
                   $<TARGET_FILE:cvllm> ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_tutorials PROPERTIES TIMEOUT 1200
                       ENVIRONMENT "CVLLM_CACHE_ROOT=${CMAKE_BINARY_DIR}/test-cache;${CV_OPENMPI_TEST_ENV}")
endif()
