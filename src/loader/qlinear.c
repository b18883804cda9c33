/*
 * qlinear.c — a quantized linear layer's tensors from a weight source (quant.h's second half).
 *
 * From a checkpoint, every tensor of the linear's scheme is looked up and checked before any is
 * handed out: the codes' dtype and shape, each scale's presence, dtype and shape, finite scales,
 * zero weight offsets. Scales are small ([rows] or one per block), so they are always copied into
 * f32 arrays the source owns — whatever their stored dtype (F32, F16, BF16, or the int64 deq_scale
 * of float16 models) the model sees f32. The codes stay views into the mapping.
 *
 * Dummy weights make the same tensors from the seed and the tensor names: codes uniform over their
 * range, and scales that put the dequantized weights in the float dummy's ±1e-3 (a per-row or
 * per-block factor in [0.5, 1) of 1e-3 / the largest code). Static W8A8 also needs an activation
 * scale (codes cover ±1e-3), an integer zero point in [-8, 8] and a quant_bias; the bias is random
 * with the spread of the zero-point correction −offset·Σ_k codes, rather than that sum itself,
 * which would cost a pass over every weight of a dummy model at start-up.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "loader/weights_internal.h"

#define I8_MAX_CODE 127.0f
#define E4M3_MAX 448.0f
#define DUMMY_MAGNITUDE 1e-3f

const cv_quant_config *cv_weight_source_quant(const cv_weight_source *src) { return src->quant; }

cv_quant_method cv_weight_source_quant_method(const cv_weight_source *src) {
    return cv_quant_config_method(src->quant);
}

int cv_weights_linear_scheme(cv_weight_source *src, const char *prefix, cv_linear_scheme *out) {
    return cv_quant_config_scheme(src->quant, prefix, out);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ------------------------------------------------------------------------------------------------ */
/* From a checkpoint                                                                                 */

/* What a tensor of the linear may be stored as: a set of dtypes, and one of two shapes. */
typedef struct tensor_rule {
    const char *suffix;
    unsigned dtypes;          /* bit per cv_dtype */
    const char *dtype_names;  /* for messages */
    int ndim;
    int64_t shape[2];
    bool also_flat;           /* [rows, 1] may also be stored as [rows] (and [1] as a scalar) */
} tensor_rule;

#define BIT(t) (1u << (t))
#define FLOAT_DTYPES (BIT(CV_DTYPE_F32) | BIT(CV_DTYPE_F16) | BIT(CV_DTYPE_BF16))

static bool shape_ok(const cv_tensor *t, const tensor_rule *r) {
    if (t->ndim == r->ndim && t->shape[0] == r->shape[0] && (r->ndim == 1 || t->shape[1] == r->shape[1])) return true;
    if (!r->also_flat) return false;
    if (r->ndim == 2) return t->ndim == 1 && t->shape[0] == r->shape[0]; /* [rows, 1] as [rows] */
    return t->ndim == 0;                                                  /* [1] as a scalar */
}

/* Finds `prefix.suffix` and checks it against the rule. */
static int get_checked(cv_weight_source *src, const char *prefix, const tensor_rule *r, cv_linear_scheme scheme,
                       const char *hint, cv_tensor *out) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", prefix, r->suffix);
    int rc = cv_weights_find(src, name, out);
    if (rc < 0) return rc;
    if (rc == 0)
        return cv_fail(CVLLM_ERR_NOT_FOUND, "missing tensor %s in %s (%s declares %s.weight %s)", name, src->dir,
                       cv_quant_config_origin(src->quant), prefix, cv_linear_scheme_name(scheme));
    if (!(r->dtypes & BIT(out->dtype)))
        return cv_fail(CVLLM_ERR_FORMAT, "tensor %s in %s has dtype %s; a %s linear's %s must be %s (%s)", name, src->dir,
                       cv_dtype_name(out->dtype), cv_linear_scheme_name(scheme), r->suffix, r->dtype_names,
                       cv_quant_config_origin(src->quant));
    if (!shape_ok(out, r)) return cv_weights_shape_mismatch(src, name, out, r->ndim, r->shape, hint);
    return 0;
}

/* An f32 copy of a scale tensor owned by the source; int64 elements hold fp32 bits in their low half. */
static int scale_f32(cv_weight_source *src, const cv_tensor *t, const float **out) {
    size_t n = (size_t)cv_tensor_numel(t);
    float *f = cv_xmalloc((n ? n : 1) * sizeof *f);
    if (t->dtype == CV_DTYPE_I64) {
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)((const uint64_t *)t->data)[i];
            memcpy(&f[i], &bits, sizeof bits);
        }
    } else {
        cv_convert_to_f32(f, t->data, t->dtype, n);
    }
    cv_weights_own(src, t->name, f);
    *out = f;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(f[i]))
            return cv_fail(CVLLM_ERR_FORMAT, "tensor %s in %s holds a non-finite scale (%g at element %zu)", t->name,
                           src->dir, (double)f[i], i);
    return 0;
}

static int check_zero_offset(cv_weight_source *src, const cv_tensor *t) {
    const float *f;
    int rc = scale_f32(src, t, &f);
    if (rc) return rc;
    for (int64_t i = 0; i < cv_tensor_numel(t); i++)
        if (f[i] != 0.0f)
            return cv_fail(CVLLM_ERR_UNSUPPORTED,
                           "tensor %s in %s is not all zeros (%g in row %lld): asymmetric weights are not supported",
                           t->name, src->dir, (double)f[i], (long long)i);
    return 0;
}

static int bind_w8a8(cv_weight_source *src, const char *prefix, int64_t rows, const char *hint, cv_qlinear *out) {
    const cv_linear_scheme s = CV_SCHEME_W8A8;
    const tensor_rule scalar_rule = {"input_scale", FLOAT_DTYPES, "F32, F16 or BF16", 1, {1}, true};
    tensor_rule offset_rule = scalar_rule;
    offset_rule.suffix = "input_offset";
    const tensor_rule deq_rule = {"deq_scale", FLOAT_DTYPES | BIT(CV_DTYPE_I64), "F32, F16, BF16 or I64", 1, {rows}, false};
    const tensor_rule bias_rule = {"quant_bias", BIT(CV_DTYPE_I32), "I32", 1, {rows}, false};
    cv_tensor t;
    const float *f;
    int rc;
    if ((rc = get_checked(src, prefix, &scalar_rule, s, hint, &t)) || (rc = scale_f32(src, &t, &f))) return rc;
    out->input_scale = f[0];
    if ((rc = get_checked(src, prefix, &offset_rule, s, hint, &t)) || (rc = scale_f32(src, &t, &f))) return rc;
    out->input_offset = f[0];
    if ((rc = get_checked(src, prefix, &deq_rule, s, hint, &t))) return rc;
    if (t.dtype == CV_DTYPE_I64 && !cv_quant_config_int64_deq_scale(src->quant))
        return cv_fail(CVLLM_ERR_FORMAT,
                       "tensor %s in %s is I64 (fp32 bits, as msModelSlim writes deq_scale for float16 models), but "
                       "config.json's dtype is not float16: expected F32",
                       t.name, src->dir);
    if ((rc = scale_f32(src, &t, &out->row_scale))) return rc;
    if ((rc = get_checked(src, prefix, &bias_rule, s, hint, &t))) return rc;
    out->row_bias = t.data;
    /* vllm-ascend's static layers may also carry the weight's own offset: zero like the dynamic ones'. */
    char name[512];
    snprintf(name, sizeof name, "%s.weight_offset", prefix);
    const tensor_rule zero_rule = {"weight_offset", FLOAT_DTYPES, "F32, F16 or BF16", 2, {rows, 1}, true};
    if (!cv_weights_stored(src, name)) return 0;
    if ((rc = get_checked(src, prefix, &zero_rule, s, hint, &t))) return rc;
    return check_zero_offset(src, &t);
}

static int bind_w8a8_dynamic(cv_weight_source *src, const char *prefix, int64_t rows, const char *hint,
                             cv_qlinear *out) {
    const cv_linear_scheme s = CV_SCHEME_W8A8_DYNAMIC;
    const tensor_rule scale_rule = {"weight_scale", FLOAT_DTYPES, "F32, F16 or BF16", 2, {rows, 1}, true};
    tensor_rule offset_rule = scale_rule;
    offset_rule.suffix = "weight_offset";
    cv_tensor t;
    int rc;
    if ((rc = get_checked(src, prefix, &scale_rule, s, hint, &t)) || (rc = scale_f32(src, &t, &out->row_scale)))
        return rc;
    if ((rc = get_checked(src, prefix, &offset_rule, s, hint, &t))) return rc;
    return check_zero_offset(src, &t);
}

static int bind_fp8(cv_weight_source *src, const char *prefix, int64_t rows, int64_t cols, const char *hint,
                    cv_qlinear *out) {
    const int32_t b = out->block;
    const tensor_rule rule = {"weight_scale_inv", FLOAT_DTYPES, "F32, F16 or BF16", 2,
                              {ceil_div(rows, b), ceil_div(cols, b)}, false};
    cv_tensor t;
    int rc = get_checked(src, prefix, &rule, CV_SCHEME_FP8_BLOCK, hint, &t);
    return rc ? rc : scale_f32(src, &t, &out->block_scale);
}

static int bind_qlinear(cv_weight_source *src, const char *prefix, int64_t rows, int64_t cols, const char *hint,
                        cv_qlinear *out) {
    const bool fp8 = out->scheme == CV_SCHEME_FP8_BLOCK;
    const tensor_rule weight_rule = {"weight", fp8 ? BIT(CV_DTYPE_F8_E4M3) : BIT(CV_DTYPE_I8),
                                     fp8 ? "F8_E4M3" : "I8", 2, {rows, cols}, false};
    int rc = get_checked(src, prefix, &weight_rule, out->scheme, hint, &out->weight);
    if (rc) return rc;
    switch (out->scheme) {
    case CV_SCHEME_W8A8: return bind_w8a8(src, prefix, rows, hint, out);
    case CV_SCHEME_W8A8_DYNAMIC: return bind_w8a8_dynamic(src, prefix, rows, hint, out);
    default: return bind_fp8(src, prefix, rows, cols, hint, out);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Dummy                                                                                             */

/* n f32 values in [0.5, 1) · unit, from the dummy noise of `name` (uniform in ±DUMMY_MAGNITUDE). */
static int dummy_scales(cv_weight_source *src, const char *prefix, const char *suffix, int64_t n, float unit,
                        float **out) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    cv_tensor t;
    int rc = cv_weights_make_dummy(src, name, CV_DTYPE_F32, 1, &n, &t);
    if (rc) return rc;
    float *f = (float *)t.data;
    for (int64_t i = 0; i < n; i++) f[i] = unit * (0.75f + f[i] * (0.25f / DUMMY_MAGNITUDE));
    *out = f;
    return 0;
}

static int make_w8a8(cv_weight_source *src, const char *prefix, int64_t rows, int64_t cols, cv_qlinear *out) {
    float *x_scale, *offset, *deq;
    int rc;
    if ((rc = dummy_scales(src, prefix, "input_scale", 1, DUMMY_MAGNITUDE / I8_MAX_CODE, &x_scale)) ||
        (rc = dummy_scales(src, prefix, "input_offset", 1, 1.0f, &offset)) ||
        (rc = dummy_scales(src, prefix, "deq_scale", rows, DUMMY_MAGNITUDE / I8_MAX_CODE, &deq)))
        return rc;
    out->input_scale = x_scale[0];
    out->input_offset = nearbyintf((offset[0] - 0.75f) * 32.0f); /* [0.5, 1) → [-8, 8] */
    for (int64_t n = 0; n < rows; n++) deq[n] *= out->input_scale; /* input_scale · weight scale */
    out->row_scale = deq;
    char name[512];
    snprintf(name, sizeof name, "%s.quant_bias", prefix);
    cv_tensor sums;
    if ((rc = cv_weights_make_dummy(src, name, CV_DTYPE_F32, 1, &rows, &sums))) return rc;
    /* A row's code sum spreads as 127/√3 · √cols; the bias is −offset times such a sum. */
    const float spread = I8_MAX_CODE / sqrtf(3.0f) * sqrtf((float)cols) / DUMMY_MAGNITUDE;
    int32_t *bias = cv_xmalloc((size_t)(rows ? rows : 1) * sizeof *bias);
    for (int64_t n = 0; n < rows; n++) bias[n] = (int32_t)lrintf(-out->input_offset * ((const float *)sums.data)[n] * spread);
    cv_weights_own(src, name, bias);
    out->row_bias = bias;
    return 0;
}

static int make_qlinear(cv_weight_source *src, const char *prefix, int64_t rows, int64_t cols, cv_qlinear *out) {
    const int64_t shape[2] = {rows, cols};
    char name[512];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const bool fp8 = out->scheme == CV_SCHEME_FP8_BLOCK;
    int rc = cv_weights_make_dummy(src, name, fp8 ? CV_DTYPE_F8_E4M3 : CV_DTYPE_I8, 2, shape, &out->weight);
    if (rc) return rc;
    float *scales = NULL;
    switch (out->scheme) {
    case CV_SCHEME_W8A8: return make_w8a8(src, prefix, rows, cols, out);
    case CV_SCHEME_W8A8_DYNAMIC:
        rc = dummy_scales(src, prefix, "weight_scale", rows, DUMMY_MAGNITUDE / I8_MAX_CODE, &scales);
        out->row_scale = scales;
        return rc;
    default:
        rc = dummy_scales(src, prefix, "weight_scale_inv", ceil_div(rows, out->block) * ceil_div(cols, out->block),
                          DUMMY_MAGNITUDE / E4M3_MAX, &scales);
        out->block_scale = scales;
        return rc;
    }
}

/* ------------------------------------------------------------------------------------------------ */

int cv_weights_get_qlinear(cv_weight_source *src, const char *prefix, int64_t rows, int64_t cols,
                           const char *config_hint, cv_qlinear *out) {
    *out = (cv_qlinear){0};
    if (rows < 0 || cols < 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "linear %s: negative dimension requested", prefix);
    int rc = cv_weights_linear_scheme(src, prefix, &out->scheme);
    if (rc) return rc;
    if (out->scheme == CV_SCHEME_FLOAT) {
        char name[512];
        snprintf(name, sizeof name, "%s.weight", prefix);
        return cv_weights_get(src, name, 2, (const int64_t[]){rows, cols}, config_hint, &out->weight);
    }
    if (out->scheme == CV_SCHEME_FP8_BLOCK) out->block = cv_quant_config_block(src->quant);
    return src->dummy ? make_qlinear(src, prefix, rows, cols, out) : bind_qlinear(src, prefix, rows, cols, config_hint, out);
}
