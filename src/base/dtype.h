/*
 * dtype.h — element types of checkpoint tensors and the conversions the kernels need.
 *
 * bf16 is the top half of an f32, so widening is a shift; narrowing rounds to nearest even (NaN kept
 * quiet), which is what PyTorch does.
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
    CV_DTYPE_F8_E4M3, /* OCP FP8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN */
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

/* IEEE half precision by bit manipulation, so every compiler (and the fuzz build with clang 14,
 * which lacks _Float16 on x86) gets the same results. Kernels use F16C/AVX-512 conversions. */
static inline float cv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* inf / NaN */
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign; /* signed zero */
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, overflow to infinity, NaN kept quiet. */
static inline uint16_t cv_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
    if (abs < 0x38800000u) {                                   /* subnormal or zero in f16 */
        if (abs < 0x33000000u) return sign;                     /* below half the smallest subnormal */
        uint32_t man = (abs & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(abs >> 23);                     /* 14 .. 24 */
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = abs - 0x38000000u; /* rebias exponent 127 → 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* e4m3fn → f32, exact (every e4m3 value is an f32); NaN stays NaN. */
static inline float cv_fp8_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, man = b & 0x7u, u;
    if ((b & 0x7fu) == 0x7fu) {
        u = sign | 0x7fc00000u;
    } else if (exp != 0) {
        u = sign | ((exp + 120u) << 23) | (man << 20);
    } else {
        float f = (float)man * 0x1p-9f; /* subnormal: man/8 · 2^-6 */
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 → 8-bit floats, rounded to nearest even as PyTorch casts: e4m3fn (bias 7) has no infinities,
 * so what rounds past its largest finite 448 (and ±inf) is NaN (0x7f, signed); e5m2 (bias 15, the top
 * byte of an f16) rounds past 57344 to infinity. NaN stays NaN. */
uint8_t cv_f32_to_fp8_e4m3(float f);
uint8_t cv_f32_to_fp8_e5m2(float f);

/* Widens n elements of type t at src into f32. */
void cv_convert_to_f32(float *dst, const void *src, cv_dtype t, size_t n);

#endif
