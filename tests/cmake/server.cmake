# The OpenAI-compatible server: the protocol layer alone, then the HTTP server in-process.
cv_add_test(test_server_api SOURCES test_server_api.c LIBS cv_server TIMEOUT 60)
cv_add_test(test_server SOURCES test_server.c LIBS cv_server PkgConfig::CURL TIMEOUT 180)
