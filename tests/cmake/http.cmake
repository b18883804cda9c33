# The strict HTTP/1.1 request parser of the event-driven server (src/server/http_parse.c), on its own.
cv_add_test(test_http_parse SOURCES test_http_parse.c LIBS cv_server TIMEOUT 60)
