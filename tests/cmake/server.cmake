# The OpenAI-compatible server: the protocol layer alone, then the HTTP server in-process.
cv_add_test(test_server_api SOURCES test_server_api.c LIBS cv_server TIMEOUT 60)
cv_add_test(test_server SOURCES test_server.c LIBS cv_server PkgConfig::CURL TIMEOUT 180)
# The HTTP layer on the wire: malformed requests as raw bytes, protocol features, no lock-out.
cv_add_test(test_http_wire SOURCES test_http_wire.c LIBS cv_server TIMEOUT 180)
set_tests_properties(test_http_wire PROPERTIES SKIP_RETURN_CODE 77)
# `cvllm serve` as a process: the tutorial command line, bad flags, SIGTERM drain and abort.
cv_add_test(test_server_cli SOURCES test_server_cli.c LIBS PkgConfig::CURL PkgConfig::JANSSON Threads::Threads TIMEOUT 120)
add_dependencies(test_server_cli cvllm)

# libFuzzer target for the request parser and response builder (-DCVLLM_FUZZ=ON with clang); seeds
# in tests/fuzz/corpus/fuzz_request.
cv_add_fuzzer(fuzz_request SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_request.c LIBS cv_server)
if(TARGET fuzz_request)
  target_compile_definitions(fuzz_request PRIVATE CVLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endif()

# The official OpenAI SDK (npm package openai, pinned in tests/sdk/package.json) against `cvllm serve`:
# chat with and without streaming, tools and the reasoning fields. tools/test.sh runs `npm ci` in
# tests/sdk first; without the package the test reports itself skipped (exit 77).
find_program(CVLLM_NODE node)
if(CVLLM_NODE)
  add_test(NAME test_openai_sdk
           COMMAND ${CVLLM_NODE} ${CMAKE_SOURCE_DIR}/tests/sdk/openai_sdk_test.mjs $<TARGET_FILE:cvllm> ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_openai_sdk PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endif()
# `cvllm serve` on an embedding model: /v1/embeddings as vLLM's pooling runner serves it.
cv_add_test(test_server_embed SOURCES test_server_embed.c LIBS PkgConfig::CURL PkgConfig::JANSSON m TIMEOUT 120)
add_dependencies(test_server_embed cvllm)
# HTTPS (--ssl-*): certificates made by the openssl command line at run time.
cv_add_test(test_server_tls SOURCES test_server_tls.c LIBS PkgConfig::CURL TIMEOUT 120)
add_dependencies(test_server_tls cvllm)
