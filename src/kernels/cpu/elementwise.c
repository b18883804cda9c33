/*
 * elementwise.c — the row-wise and element-wise kernels: RMSNorm, SwiGLU, residual add, softmax
 * and the KV cache write.
 *
 * These touch each activation once and are a few percent of a forward pass, so they run on the
 * calling thread in plain C; only RMSNorm's sum of squares goes through the ISA dot product.
 * The operation order follows Hugging Face's f32 code (normalise, then scale by the gain) so that
 * rounding matches as closely as the summation order allows.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

void cv_rmsnorm(float *y, const float *x, const float *w, int64_t rows, int64_t dim, float eps) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        float mean_sq = ops->dot(xr, xr, dim) / (float)dim;
        float inv_rms = 1.0f / sqrtf(mean_sq + eps);
        for (int64_t i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * inv_rms);
    }
}

void cv_silu_mul(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cv_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void cv_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void cv_kv_write(float *k_cache, float *v_cache, const float *k, const float *v, const int64_t *slot_mapping,
                 int64_t n, int64_t width) {
    const size_t bytes = (size_t)width * sizeof(float);
    for (int64_t t = 0; t < n; t++) {
        memcpy(k_cache + slot_mapping[t] * width, k + t * width, bytes);
        memcpy(v_cache + slot_mapping[t] * width, v + t * width, bytes);
    }
}
