# Loader tests: safetensors / config parsing and weight sources; hub cache and downloads against a
# local stand-in server (tests/tools/hf_server.py, needs python3).
cv_add_test(test_loader SOURCES ${CMAKE_SOURCE_DIR}/tests/test_loader.c LIBS cv_loader TIMEOUT 120)
cv_add_test(test_download SOURCES ${CMAKE_SOURCE_DIR}/tests/test_download.c LIBS cv_loader TIMEOUT 150)
