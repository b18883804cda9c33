/*
 * dtype.h — element types of checkpoint tensors and the conversions the kernels need.
 *
 * bf16 is the top half of an f32, so widening is a shift; narrowing rounds to nearest even (NaN kept
 * quiet), which is what PyTorch does. f16 conversions use the F16C instructions through the
 * compiler's _Float16 support where available.
 */
#ifndef CV_DTYPE_H
#define CV_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum cv_dtype {
    CV_DTYPE_F32 = 0,
    CV_DTYPE_F16,
    CV_DTYPE_BF16,
    CV_DTYPE_I8,
    CV_DTYPE_I32,
    CV_DTYPE_I64,
    CV_DTYPE_U8,
    CV_DTYPE_BOOL,
    CV_DTYPE_F64,
    CV_DTYPE_COUNT
} cv_dtype;

size_t cv_dtype_size(cv_dtype t);
const char *cv_dtype_name(cv_dtype t);       /* safetensors spelling: "F32", "BF16", ... */
/* Parses a safetensors dtype string; returns -1 when unknown. */
int cv_dtype_from_safetensors(const char *s);

static inline float cv_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t cv_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float cv_f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

static inline uint16_t cv_f32_to_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

/* Widens n elements of type t at src into f32. */
void cv_convert_to_f32(float *dst, const void *src, cv_dtype t, size_t n);

#endif
