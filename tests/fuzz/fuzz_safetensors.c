/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors header parser.
 *
 * Each input is used twice: as a bare header (the JSON after the length prefix, against a data
 * section whose length comes from the input size) and as a whole file buffer (first 8 bytes the
 * header length). Whatever the parser accepts must keep its promises — every tensor inside the data
 * section, byte length equal to numel × dtype size, no two tensors overlapping — and every byte it
 * points at is read, so AddressSanitizer catches a view that escapes the buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "loader/safetensors.h"

static void require(int cond) {
    if (!cond) abort();
}

static void check_tensors(const cv_tensor *ts, size_t n, uintptr_t lo, uintptr_t hi) {
    for (size_t i = 0; i < n; i++) {
        const cv_tensor *t = &ts[i];
        uintptr_t b = (uintptr_t)t->data;
        require(t->name != NULL && t->dtype < CV_DTYPE_COUNT && t->ndim >= 0 && t->ndim <= CV_MAX_DIMS);
        require(b >= lo && t->nbytes <= hi - b);
        require((uint64_t)cv_tensor_numel(t) * cv_dtype_size(t->dtype) == t->nbytes);
        for (size_t j = 0; j < n; j++) {
            uintptr_t c = (uintptr_t)ts[j].data;
            require(j == i || t->nbytes == 0 || ts[j].nbytes == 0 || b + t->nbytes <= c || c + ts[j].nbytes <= b);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cv_tensor *ts;
    size_t n;
    uint64_t data_len = (uint64_t)size * 3;
    if (cv_safetensors_parse_header((const char *)data, size, data_len, &ts, &n) == 0) {
        check_tensors(ts, n, 0, (uintptr_t)data_len);
        cv_safetensors_free_tensors(ts, n);
    } else {
        require(ts == NULL && n == 0 && cv_error_message()[0] != '\0');
    }
    if (cv_safetensors_parse_buffer(data, size, &ts, &n) == 0) {
        check_tensors(ts, n, (uintptr_t)data + 8, (uintptr_t)data + size);
        volatile unsigned char sink = 0;
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < ts[i].nbytes; k++) sink ^= ((const unsigned char *)ts[i].data)[k];
        (void)sink;
        cv_safetensors_free_tensors(ts, n);
    }
    return 0;
}
