/*
 * dtype.c — dtype names and bulk conversion to f32 (used where small tensors such as norm gains are
 * widened once at load time so the hot loops see only f32).
 */
#include "dtype.h"

#include <math.h>
#include <stdbool.h>
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

/* `man` mantissa bits, exponent bias `bias`, largest finite `max`; finite_only: overflow is NaN. The
 * value is rounded at its own binade's quantum (the subnormals' below the smallest normal), where
 * scaling by a power of two is exact and nearbyint rounds to even. */
static uint8_t to_fp8(float f, int man, int bias, double max, bool finite_only) {
    const uint8_t sign = signbit(f) ? 0x80 : 0, nan = 0x7f, overflow = finite_only ? nan : 0x7c;
    if (isnan(f)) return sign | nan;
    if (isinf(f)) return sign | overflow;
    const double a = fabs((double)f);
    const int emin = 1 - bias; /* the smallest normal's exponent */
    int e;
    frexp(a, &e);
    int lead = a > 0 && e - 1 > emin ? e - 1 : emin;
    const double r = nearbyint(ldexp(a, man - lead)), v = ldexp(r, lead - man);
    if (v > max) return sign | overflow;
    if (v < ldexp(1.0, emin)) return sign | (uint8_t)r; /* subnormal or zero: the mantissa alone */
    frexp(v, &e);
    lead = e - 1; /* rounding may have carried into the next binade */
    const int mantissa = (int)ldexp(v, man - lead) - (1 << man);
    return sign | (uint8_t)((lead + bias) << man) | (uint8_t)mantissa;
}

uint8_t cv_f32_to_fp8_e4m3(float f) { return to_fp8(f, 3, 7, 448.0, true); }
uint8_t cv_f32_to_fp8_e5m2(float f) { return to_fp8(f, 2, 15, 57344.0, false); }

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
