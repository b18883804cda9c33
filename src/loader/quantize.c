/*
 * quantize.c — see quantize.h. Each row is widened to f32 once into a per-thread buffer; the
 * divisions and roundings are the f32 operations the header states (nearbyintf in the default
 * rounding mode is half to even), so a result never depends on the pool size.
 */
#include "loader/quantize.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

bool cv_quant_dtype_supported(cv_dtype t) {
    return t == CV_DTYPE_F32 || t == CV_DTYPE_BF16 || t == CV_DTYPE_F16;
}

typedef enum row_op { ROW_SCALE, ROW_CODES, ROW_SUMS } row_op;

typedef struct row_task {
    const cv_quant_matrix *w;
    row_op op;
    float *scale;       /* ROW_SCALE writes, the others read */
    int8_t *codes;
    int32_t *sums;
} row_task;

static int8_t code_of(float v, float scale) {
    if (scale == 0.0f) return 0;
    float q = nearbyintf(v / scale);
    assert(q >= -127.0f && q <= 127.0f);
    return (int8_t)q;
}

static void row_range(const void *arg, int64_t begin, int64_t end) {
    const row_task *t = arg;
    const cv_quant_matrix *w = t->w;
    const size_t esize = cv_dtype_size(w->dtype);
    float *row = cv_xmalloc((size_t)(w->cols ? w->cols : 1) * sizeof *row);
    for (int64_t n = begin; n < end; n++) {
        cv_convert_to_f32(row, (const char *)w->data + (size_t)n * (size_t)w->cols * esize, w->dtype, (size_t)w->cols);
        if (t->op == ROW_SCALE) {
            float max = 0.0f;
            bool finite = true;
            for (int64_t k = 0; k < w->cols; k++) {
                finite &= isfinite(row[k]) != 0;
                max = fmaxf(max, fabsf(row[k]));
            }
            t->scale[n] = finite ? max / 127.0f : NAN; /* NAN marks the row for the error */
        } else if (t->op == ROW_CODES) {
            int8_t *out = t->codes + n * w->cols;
            for (int64_t k = 0; k < w->cols; k++) out[k] = code_of(row[k], t->scale[n]);
        } else {
            int32_t sum = 0;
            for (int64_t k = 0; k < w->cols; k++) sum += code_of(row[k], t->scale[n]);
            t->sums[n] = sum;
        }
    }
    free(row);
}

static void run_rows(cv_threadpool *pool, row_task *t) {
    assert(cv_quant_dtype_supported(t->w->dtype) && t->w->rows >= 0 && t->w->cols >= 0);
    cv_threadpool_run_range(pool, row_range, t, t->w->rows, true);
}

int cv_quant_weight_scales(cv_threadpool *pool, const cv_quant_matrix *w, float *scale) {
    row_task t = {.w = w, .op = ROW_SCALE, .scale = scale};
    run_rows(pool, &t);
    const size_t esize = cv_dtype_size(w->dtype);
    for (int64_t n = 0; n < w->rows; n++) {
        if (!isnan(scale[n])) continue;
        float v = 0.0f;
        for (int64_t k = 0; k < w->cols; k++) {
            cv_convert_to_f32(&v, (const char *)w->data + ((size_t)n * (size_t)w->cols + (size_t)k) * esize, w->dtype, 1);
            if (!isfinite(v))
                return cv_fail(CVLLM_ERR_FORMAT, "weight [%lld, %lld] is %g; only finite weights can be quantized",
                               (long long)n, (long long)k, (double)v);
        }
    }
    return 0;
}

void cv_quant_weight_codes(cv_threadpool *pool, const cv_quant_matrix *w, const float *scale, int8_t *codes) {
    row_task t = {.w = w, .op = ROW_CODES, .scale = (float *)scale, .codes = codes};
    run_rows(pool, &t);
}

void cv_quant_weight_code_sums(cv_threadpool *pool, const cv_quant_matrix *w, const float *scale, int32_t *sums) {
    row_task t = {.w = w, .op = ROW_SUMS, .scale = (float *)scale, .sums = sums};
    run_rows(pool, &t);
}

/* ---- activations --------------------------------------------------------------------------------- */

void cv_act_range_update(cv_act_range *r, const float *x, int64_t rows, int64_t cols, int64_t ld) {
    if (rows <= 0) return;
    float lo = r->rows ? r->min : INFINITY, hi = r->rows ? r->max : -INFINITY;
    bool nan = isnan(lo);
    for (int64_t i = 0; i < rows && !nan; i++)
        for (int64_t k = 0; k < cols; k++) {
            float v = x[i * ld + k];
            nan |= isnan(v) != 0;
            lo = fminf(lo, v);
            hi = fmaxf(hi, v);
        }
    r->min = nan ? NAN : lo;
    r->max = nan ? NAN : hi;
    r->rows += rows;
}

/* The runtime's code of x (clamp(round(x / scale + offset), −128, 127)). */
static float act_code(float x, float scale, float offset) {
    return fminf(fmaxf(nearbyintf(x / scale + offset), -128.0f), 127.0f);
}

int cv_act_static_params(const cv_act_range *r, float *scale, float *offset) {
    assert(r->rows > 0);
    if (!isfinite(r->min) || !isfinite(r->max))
        return cv_fail(CVLLM_ERR_FORMAT, "the calibration inputs reached %g..%g; only finite values can be quantized",
                       (double)r->min, (double)r->max);
    const float lo = fminf(r->min, 0.0f), hi = fmaxf(r->max, 0.0f);
    /* In double, so the difference cannot overflow: the quotient is rounded to f32 once. */
    float s = (float)(((double)hi - (double)lo) / 255.0);
    if (s == 0.0f) { /* every input was 0 (or the range is below f32's resolution) */
        *scale = 1.0f;
        *offset = 0.0f;
        return 0;
    }
    /* The f32 rounding of s can leave the ends half a code inside, where a tie of the offset's rounding
     * costs the end code: lower s an ulp at a time until both ends land exactly. */
    for (int tries = 0; tries < 64; tries++, s = nextafterf(s, 0.0f)) {
        /* −128 − lo/s lies in −128..127 since 0 ≤ −lo ≤ 255·s; + 0 turns a −0 into 0. */
        const float o = fminf(fmaxf(nearbyintf(-128.0f - lo / s) + 0.0f, -128.0f), 127.0f);
        if (act_code(lo, s, o) == -128.0f && act_code(hi, s, o) == 127.0f) {
            *scale = s;
            *offset = o;
            return 0;
        }
    }
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "the calibration inputs' range %g..%g is too narrow for f32 scales",
                   (double)r->min, (double)r->max);
}

void cv_quant_deq_scale(float input_scale, const float *weight_scale, int64_t n, float *deq_scale) {
    for (int64_t i = 0; i < n; i++) deq_scale[i] = input_scale * weight_scale[i];
}

void cv_quant_deq_scale_i64(const float *deq_scale, int64_t n, int64_t *out) {
    for (int64_t i = 0; i < n; i++) {
        int32_t bits;
        memcpy(&bits, &deq_scale[i], sizeof bits);
        out[i] = bits;
    }
}

int cv_quant_bias(float input_offset, const int32_t *sums, int64_t n, int32_t *quant_bias) {
    for (int64_t i = 0; i < n; i++) {
        double b = -(double)input_offset * (double)sums[i]; /* exact: both are small integers */
        if (b < INT32_MIN || b > INT32_MAX)
            return cv_fail(CVLLM_ERR_UNSUPPORTED, "quant_bias of row %lld is %.0f, outside int32", (long long)i, b);
        quant_bias[i] = (int32_t)b;
    }
    return 0;
}

/* ---- ranges by linear ---------------------------------------------------------------------------- */

struct cv_act_ranges {
    json_t *index;      /* name → integer index into ranges */
    cv_act_range *ranges;
    size_t n, cap;
};

cv_act_ranges *cv_act_ranges_create(void) {
    cv_act_ranges *r = cv_xcalloc(1, sizeof *r);
    r->index = json_object();
    return r;
}

void cv_act_ranges_free(cv_act_ranges *r) {
    if (!r) return;
    json_decref(r->index);
    free(r->ranges);
    free(r);
}

void cv_act_ranges_observe(cv_act_ranges *r, const char *linear, const float *x, int64_t rows, int64_t cols) {
    json_t *at = json_object_get(r->index, linear);
    size_t i;
    if (at) {
        i = (size_t)json_integer_value(at);
    } else {
        if (r->n == r->cap) r->ranges = cv_xrealloc(r->ranges, (r->cap = r->cap ? 2 * r->cap : 64) * sizeof *r->ranges);
        i = r->n++;
        r->ranges[i] = (cv_act_range){0};
        json_object_set_new(r->index, linear, json_integer((json_int_t)i));
    }
    cv_act_range_update(&r->ranges[i], x, rows, cols, cols);
}

const cv_act_range *cv_act_ranges_find(const cv_act_ranges *r, const char *linear) {
    json_t *at = json_object_get(r->index, linear);
    return at ? &r->ranges[json_integer_value(at)] : NULL;
}
