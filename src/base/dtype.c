/*
 * dtype.c — dtype names and bulk conversion to f32 (used where small tensors such as norm gains are
 * widened once at load time so the hot loops see only f32).
 */
#include "dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[CV_DTYPE_COUNT] = {
    [CV_DTYPE_F32] = {"F32", 4}, [CV_DTYPE_F16] = {"F16", 2}, [CV_DTYPE_BF16] = {"BF16", 2},
    [CV_DTYPE_I8] = {"I8", 1},   [CV_DTYPE_I32] = {"I32", 4}, [CV_DTYPE_I64] = {"I64", 8},
    [CV_DTYPE_U8] = {"U8", 1},   [CV_DTYPE_BOOL] = {"BOOL", 1}, [CV_DTYPE_F64] = {"F64", 8},
    [CV_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
};

size_t cv_dtype_size(cv_dtype t) { return (unsigned)t < CV_DTYPE_COUNT ? dtypes[t].size : 0; }

const char *cv_dtype_name(cv_dtype t) { return (unsigned)t < CV_DTYPE_COUNT ? dtypes[t].name : "?"; }

int cv_dtype_from_safetensors(const char *s) {
    for (int i = 0; i < CV_DTYPE_COUNT; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

void cv_convert_to_f32(float *dst, const void *src, cv_dtype t, size_t n) {
    const uint16_t *h = src;
    switch (t) {
    case CV_DTYPE_F32: memcpy(dst, src, n * 4); break;
    case CV_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = cv_bf16_to_f32(h[i]);
        break;
    case CV_DTYPE_F16:
        for (size_t i = 0; i < n; i++) dst[i] = cv_f16_to_f32(h[i]);
        break;
    case CV_DTYPE_F8_E4M3:
        for (size_t i = 0; i < n; i++) dst[i] = cv_fp8_e4m3_to_f32(((const uint8_t *)src)[i]);
        break;
    default:
        for (size_t i = 0; i < n; i++) dst[i] = 0.0f;
        break;
    }
}
