/*
 * rope.c — rotary position embedding: frequency tables (default, linear, dynamic NTK, YaRN) and the
 * rotate-half application.
 *
 * Hugging Face computes inverse frequencies and angles in f32 and the cos/sin of the f32 angle;
 * at position 10⁵ one f32 ulp of angle is ~0.008 rad, so computing angles in double would be more
 * accurate but would not match the reference. We therefore round exactly where it does: inv_freq
 * to f32, angle = f32(position · inv_freq), then cos/sin of that f32 value (evaluated in double and
 * rounded once). Scaling variants only change the inverse frequencies and, for YaRN, multiply
 * cos/sin by the attention factor.
 *
 * cv_rmsnorm_rope fuses Qwen3's per-head q/k RMSNorm with the rotation: each head is normalised
 * into a stack buffer and rotated from there, one read and one write per head instead of two each,
 * and (head, token) units are split over the pool. The arithmetic is the unfused sequence's.
 * cv_rmsnorm_rope_bf16 also does what bf16-dot attention does first to each query row (scale,
 * round to bf16), so the query crosses memory once, in half the bytes.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

enum { MAX_FUSED_HEAD_DIM = 1024, PARALLEL_UNITS = 64, PARALLEL_COS_SIN = 1024 };

/* The dimension index whose wavelength completes `rotations` turns over the trained context. */
static double yarn_correction_dim(double rotations, int rot_dim, double theta, int32_t max_pos) {
    return rot_dim * log(max_pos / (rotations * 2.0 * M_PI)) / (2.0 * log(theta));
}

static void apply_yarn(float *inv, const cv_rope_params *p, int half) {
    double lo = floor(yarn_correction_dim(p->beta_fast, p->rot_dim, p->theta, p->original_max_position));
    double hi = ceil(yarn_correction_dim(p->beta_slow, p->rot_dim, p->theta, p->original_max_position));
    if (lo < 0) lo = 0;
    if (hi > p->rot_dim - 1) hi = p->rot_dim - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        float ramp = (float)(((float)i - (float)lo) / (float)(hi - lo));
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float extrapolation = 1.0f - ramp;
        float interpolated = inv[i] / (float)p->factor;
        inv[i] = interpolated * (1.0f - extrapolation) + inv[i] * extrapolation;
    }
}

static int check_params(const cv_rope_params *p) {
    if (p->rot_dim <= 0 || p->rot_dim % 2)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "rotary dimension %d must be positive and even", p->rot_dim);
    if (!(p->theta > 1.0)) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "rope_theta %g must be > 1", p->theta);
    if (p->kind != CV_ROPE_KIND_DEFAULT && !(p->factor > 0.0))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "rope scaling factor %g must be > 0", p->factor);
    if (p->kind == CV_ROPE_KIND_YARN && (p->original_max_position <= 0 || !(p->beta_fast > 0.0) || !(p->beta_slow > 0.0)))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "yarn rope needs original_max_position_embeddings > 0 and positive beta_fast/beta_slow");
    if (p->kind == CV_ROPE_KIND_DYNAMIC && p->rot_dim <= 2)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "dynamic rope needs a rotary dimension > 2");
    return 0;
}

int cv_rope_init(cv_rope *r, const cv_rope_params *p) {
    *r = (cv_rope){0};
    int rc = check_params(p);
    if (rc) return rc;
    const int half = p->rot_dim / 2;
    double theta = p->theta;
    if (p->kind == CV_ROPE_KIND_DYNAMIC) /* vLLM's static stretch for factor × the trained length */
        theta *= pow(p->factor * p->factor - (p->factor - 1.0), (double)p->rot_dim / (p->rot_dim - 2));
    float *inv = cv_xmalloc((size_t)half * sizeof *inv);
    for (int i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)p->rot_dim;
        inv[i] = 1.0f / (float)pow(theta, (double)exponent);
    }
    r->attention_factor = 1.0f;
    if (p->kind == CV_ROPE_KIND_LINEAR) {
        for (int i = 0; i < half; i++) inv[i] /= (float)p->factor;
    } else if (p->kind == CV_ROPE_KIND_YARN) {
        apply_yarn(inv, p, half);
        double af = p->attention_factor;
        if (af <= 0.0) af = p->factor > 1.0 ? 0.1 * log(p->factor) + 1.0 : 1.0;
        r->attention_factor = (float)af;
    }
    r->rot_dim = p->rot_dim;
    r->inv_freq = inv;
    return 0;
}

void cv_rope_free(cv_rope *r) {
    free(r->inv_freq);
    r->inv_freq = NULL;
}

typedef struct cos_sin_job {
    const cv_rope *r;
    const int32_t *positions;
    int64_t n;
    float *cos, *sin;
} cos_sin_job;

static void cos_sin_rows(const void *arg, int64_t t0, int64_t t1) {
    const cos_sin_job *j = arg;
    const cv_rope *r = j->r;
    const int half = r->rot_dim / 2;
    for (int64_t t = t0; t < t1; t++) {
        float pos = (float)j->positions[t];
        for (int i = 0; i < half; i++) {
            float angle = pos * r->inv_freq[i];
            j->cos[t * half + i] = (float)cos((double)angle) * r->attention_factor;
            j->sin[t * half + i] = (float)sin((double)angle) * r->attention_factor;
        }
    }
}

/* Two libm calls an entry, in double, 64 K of them for a 512-token prompt: in 16-thread AMX profiles
 * of a Qwen3-0.6B prefill the embed op (the token gather and this table) took 2.9-3.9 ms of a
 * forward, ~2 %, so prompts split their positions over the pool (each entry is computed the same
 * way wherever it runs). */
void cv_rope_cos_sin(cv_threadpool *pool, const cv_rope *r, const int32_t *positions, int64_t n, float *cos_out,
                     float *sin_out) {
    cos_sin_job j = {r, positions, n, cos_out, sin_out};
    cv_threadpool_run_range(pool, cos_sin_rows, &j, n, n * (r->rot_dim / 2) >= PARALLEL_COS_SIN);
}

void cv_rope_apply(const cv_rope *r, float *x, int64_t n, int n_heads, int head_dim, const float *cos_in,
                   const float *sin_in) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    const int half = r->rot_dim / 2;
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (t * n_heads + h) * head_dim;
            ops->rotate_half(v, v, cos_in + t * half, sin_in + t * half, half);
        }
}

typedef struct norm_rope_job {
    const cv_cpu_ops *ops;
    const cv_rope *r;
    float *dst;
    uint16_t *dst_bf16; /* instead of dst: the heads scaled by `scale` and rounded to bf16 */
    const float *src, *w, *cos, *sin;
    int64_t ld_dst, ld_src, n;
    int n_heads, head_dim;
    float eps, scale;
} norm_rope_job;

static void norm_rope_units(const void *arg, int64_t u0, int64_t u1) {
    const norm_rope_job *j = arg;
    const int hd = j->head_dim, half = j->r->rot_dim / 2;
    float buf[MAX_FUSED_HEAD_DIM], rot[MAX_FUSED_HEAD_DIM];
    for (int64_t u = u0; u < u1; u++) {
        const int64_t t = u / j->n_heads;
        const int h = (int)(u % j->n_heads);
        const float *x = j->src + t * j->ld_src + (int64_t)h * hd;
        float *y = j->dst_bf16 ? rot : j->dst + t * j->ld_dst + (int64_t)h * hd;
        j->ops->rms_apply(buf, x, j->w, hd, cv_rms_inverse(j->ops, x, hd, j->eps));
        j->ops->rotate_half(y, buf, j->cos + t * half, j->sin + t * half, half);
        if (2 * half < hd) memcpy(y + 2 * half, buf + 2 * half, (size_t)(hd - 2 * half) * sizeof *y);
        if (j->dst_bf16) {
            j->ops->scale(rot, j->scale, hd);
            j->ops->round_bf16(j->dst_bf16 + t * j->ld_dst + (int64_t)h * hd, rot, hd);
        }
    }
}

static void run_norm_rope(cv_threadpool *pool, const norm_rope_job *j) {
    assert(j->head_dim <= MAX_FUSED_HEAD_DIM && j->r->rot_dim <= j->head_dim);
    const int64_t units = j->n * j->n_heads;
    cv_threadpool_run_range(pool, norm_rope_units, j, units, units >= PARALLEL_UNITS);
}

void cv_rmsnorm_rope(cv_threadpool *pool, const cv_rope *r, float *dst, int64_t ld_dst, const float *src,
                     int64_t ld_src, int64_t n, int n_heads, int head_dim, const float *w, float eps,
                     const float *cos_in, const float *sin_in) {
    run_norm_rope(pool, &(norm_rope_job){cv_cpu_ops_active(), r, dst, NULL, src, w, cos_in, sin_in, ld_dst, ld_src, n,
                                         n_heads, head_dim, eps, 1.0f});
}

void cv_rmsnorm_rope_bf16(cv_threadpool *pool, const cv_rope *r, uint16_t *dst, int64_t ld_dst, const float *src,
                          int64_t ld_src, int64_t n, int n_heads, int head_dim, const float *w, float eps,
                          const float *cos_in, const float *sin_in, float scale) {
    run_norm_rope(pool, &(norm_rope_job){cv_cpu_ops_active(), r, NULL, dst, src, w, cos_in, sin_in, ld_dst, ld_src, n,
                                         n_heads, head_dim, eps, scale});
}
