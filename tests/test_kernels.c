/*
 * test_kernels.c — every CPU kernel against a plain double-precision reference, on every ISA path
 * this CPU can run, plus the thread pool.
 *
 * Sizes are deliberately odd (not multiples of 8 or 16) so that vector tails and partial register
 * tiles are exercised, and large enough in places (M > 64, contexts > 64) to cross the matmul token
 * block and the attention context tile. Tolerances are relative to Σ|terms|, the natural error
 * scale of an f32 sum, so they hold for any summation order but catch any wrong term.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "check.h"
#include "kernels/kernels.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 23)) - 1.0);
}

static float *rand_vec(int64_t n) {
    float *v = cv_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = frand();
    return v;
}

/* ---- thread pool ---------------------------------------------------------------------------- */

typedef struct pool_probe {
    _Atomic int calls[8];
    _Atomic int wrong_n;
    int expect_n;
    int64_t total;
    _Atomic int64_t covered;
} pool_probe;

static void probe_task(void *arg, int i, int n) {
    pool_probe *p = arg;
    atomic_fetch_add(&p->calls[i], 1);
    if (n != p->expect_n) atomic_fetch_add(&p->wrong_n, 1);
    int64_t b, e;
    cv_split(p->total, 4, i, n, &b, &e);
    atomic_fetch_add(&p->covered, e - b);
}

static void test_threadpool(int n_threads) {
    cv_threadpool *pool = cv_threadpool_create(n_threads);
    CHECK_EQ_INT(cv_threadpool_size(pool), n_threads);
    pool_probe p = {.expect_n = n_threads, .total = 1001};
    const int rounds = 500;
    for (int r = 0; r < rounds; r++) cv_threadpool_run(pool, probe_task, &p);
    for (int i = 0; i < n_threads; i++) CHECK_EQ_INT(atomic_load(&p.calls[i]), rounds);
    CHECK_EQ_INT(atomic_load(&p.wrong_n), 0);
    CHECK_EQ_INT(atomic_load(&p.covered), (int64_t)rounds * 1001);
    cv_threadpool_free(pool);
}

static void test_threadpool_null_and_split(void) {
    pool_probe p = {.expect_n = 1, .total = 10};
    cv_threadpool_run(NULL, probe_task, &p);
    CHECK_EQ_INT(atomic_load(&p.calls[0]), 1);
    CHECK_EQ_INT(atomic_load(&p.covered), 10);
    CHECK_EQ_INT(cv_threadpool_size(NULL), 1);
    /* Shares are contiguous, aligned, and cover [0, total) for awkward totals. */
    for (int n = 1; n <= 5; n++) {
        int64_t expect_begin = 0;
        for (int i = 0; i < n; i++) {
            int64_t b, e;
            cv_split(37, 16, i, n, &b, &e);
            CHECK_EQ_INT(b, expect_begin);
            CHECK(b % 16 == 0 || b == 37);
            expect_begin = e;
        }
        CHECK_EQ_INT(expect_begin, 37);
    }
}

/* ---- matmul and embedding ------------------------------------------------------------------- */

/* Weights rounded to `dtype` and stored in it, plus the exact f32 values they hold. */
typedef struct test_weights {
    void *data;
    float *exact;
} test_weights;

static test_weights make_weights(cv_dtype dtype, int64_t n) {
    test_weights w = {cv_xmalloc((size_t)n * cv_dtype_size(dtype)), cv_xmalloc((size_t)n * sizeof(float))};
    for (int64_t i = 0; i < n; i++) {
        float v = frand();
        if (dtype == CV_DTYPE_BF16) {
            ((uint16_t *)w.data)[i] = cv_f32_to_bf16(v);
            w.exact[i] = cv_bf16_to_f32(((uint16_t *)w.data)[i]);
        } else if (dtype == CV_DTYPE_F16) {
            ((uint16_t *)w.data)[i] = cv_f32_to_f16(v);
            w.exact[i] = cv_f16_to_f32(((uint16_t *)w.data)[i]);
        } else {
            ((float *)w.data)[i] = v;
            w.exact[i] = v;
        }
    }
    return w;
}

static void free_weights(test_weights *w) {
    free(w->data);
    free(w->exact);
}

static void check_matmul(cv_threadpool *pool, cv_dtype dtype, int64_t m, int64_t n, int64_t k) {
    test_weights w = make_weights(dtype, n * k);
    float *x = rand_vec(m * k), *y = rand_vec(m * n);
    cv_matrix mat = {w.data, dtype, n, k};
    cv_matmul(pool, &mat, x, m, y);
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t e = 0; e < k; e++) {
                ref += (double)x[i * k + e] * w.exact[j * k + e];
                mag += fabs((double)x[i * k + e] * w.exact[j * k + e]);
            }
            double err = fabs(y[i * n + j] - ref) / (mag + 1e-30);
            worst = err > worst ? err : worst;
            bad += err > 1e-5;
        }
    CHECK_MSG(bad == 0, "%s matmul %s M=%lld N=%lld K=%lld threads=%d: %d wrong (worst rel %.3g)",
              cv_isa_name(cv_isa_active()), cv_dtype_name(dtype), (long long)m, (long long)n, (long long)k,
              cv_threadpool_size(pool), bad, worst);
    free_weights(&w);
    free(x);
    free(y);
}

static void test_matmul(cv_threadpool *pool) {
    static const int64_t shapes[][3] = {{1, 37, 67}, {3, 37, 67}, {5, 19, 16}, {2, 4, 8}, {1, 1, 1},
                                        {70, 45, 33}, {130, 9, 130}, {4, 300, 40}};
    static const cv_dtype dtypes[] = {CV_DTYPE_F32, CV_DTYPE_BF16, CV_DTYPE_F16};
    for (size_t d = 0; d < CV_ARRAY_LEN(dtypes); d++)
        for (size_t s = 0; s < CV_ARRAY_LEN(shapes); s++)
            check_matmul(pool, dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2]);
}

/* Packed panels: one or several stacked parts, odd K (a half pair), rows not a multiple of 16, token
 * counts that cross the register tile (6) and the token block (60), K beyond one k block (256). */
static void check_panels(cv_threadpool *pool, int64_t m, const int64_t *part_rows, int n_parts, int64_t k) {
    int64_t n = 0;
    for (int j = 0; j < n_parts; j++) n += part_rows[j];
    test_weights w = make_weights(CV_DTYPE_BF16, n * k);
    cv_matrix parts[4];
    float *ys[4];
    for (int j = 0, r = 0; j < n_parts; r += (int)part_rows[j], j++) {
        parts[j] = (cv_matrix){(const uint16_t *)w.data + r * k, CV_DTYPE_BF16, part_rows[j], k};
        ys[j] = rand_vec(m * part_rows[j]);
    }
    cv_panels packed;
    CHECK_EQ_INT(cv_panels_pack(pool, parts, n_parts, &packed), 0);
    CHECK_EQ_INT(packed.rows, n);
    float *x = rand_vec(m * k);
    if (n_parts == 1) cv_matmul_panels(pool, &packed, x, m, ys[0]);
    else cv_matmul_panels_parts(pool, &packed, x, m, n_parts, part_rows, ys);
    int bad = 0;
    double worst = 0;
    for (int j = 0, r0 = 0; j < n_parts; r0 += (int)part_rows[j], j++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t c = 0; c < part_rows[j]; c++) {
                double ref = 0, mag = 0;
                for (int64_t e = 0; e < k; e++) {
                    double term = (double)x[i * k + e] * w.exact[(r0 + c) * k + e];
                    ref += term;
                    mag += fabs(term);
                }
                double err = fabs(ys[j][i * part_rows[j] + c] - ref) / (mag + 1e-30);
                worst = err > worst ? err : worst;
                bad += err > 1e-5;
            }
    CHECK_MSG(bad == 0, "%s panel matmul M=%lld N=%lld (%d parts) K=%lld threads=%d: %d wrong (worst rel %.3g)",
              cv_isa_name(cv_isa_active()), (long long)m, (long long)n, n_parts, (long long)k,
              cv_threadpool_size(pool), bad, worst);
    /* The packed matrix still yields its rows as an embedding table (tied lm_head). */
    const int32_t ids[] = {0, (int32_t)(n - 1), (int32_t)(n / 2)};
    float *row = rand_vec(3 * k);
    cv_embed_panels(&packed, ids, 3, row);
    int wrong_rows = 0;
    for (int i = 0; i < 3; i++)
        for (int64_t e = 0; e < k; e++) wrong_rows += row[i * k + e] != w.exact[ids[i] * k + e];
    CHECK_MSG(wrong_rows == 0, "embed from panels N=%lld K=%lld: %d wrong", (long long)n, (long long)k, wrong_rows);
    cv_panels_release(&packed);
    CHECK(packed.data == NULL);
    for (int j = 0; j < n_parts; j++) free(ys[j]);
    free(row);
    free(x);
    free_weights(&w);
}

static void test_panels(cv_threadpool *pool) {
    static const int64_t one[][3] = {{1, 37, 67}, {7, 45, 33}, {130, 21, 301}, {61, 100, 1}, {1, 16, 2}, {13, 3, 300}};
    for (size_t s = 0; s < CV_ARRAY_LEN(one); s++) check_panels(pool, one[s][0], &one[s][1], 1, one[s][2]);
    const int64_t qkv[] = {48, 16, 16}, gate_up[] = {32, 23};
    check_panels(pool, 1, qkv, 3, 75);
    check_panels(pool, 67, qkv, 3, 75);
    check_panels(pool, 9, gate_up, 2, 40);
    /* Only bf16 is packed; anything else is refused with a message, not packed wrongly. */
    float f[4] = {0};
    cv_matrix f32 = {f, CV_DTYPE_F32, 2, 2};
    cv_panels out;
    CHECK_EQ_INT(cv_panels_pack(pool, &f32, 1, &out), CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cv_error_message(), "bf16");
}

static void test_embed(void) {
    static const cv_dtype dtypes[] = {CV_DTYPE_F32, CV_DTYPE_BF16, CV_DTYPE_F16};
    const int64_t rows = 11, cols = 13;
    const int32_t ids[] = {10, 0, 3, 3};
    for (size_t d = 0; d < CV_ARRAY_LEN(dtypes); d++) {
        test_weights w = make_weights(dtypes[d], rows * cols);
        cv_matrix table = {w.data, dtypes[d], rows, cols};
        float out[4 * 13];
        cv_embed(&table, ids, 4, out);
        int bad = 0;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < cols; j++) bad += out[i * cols + j] != w.exact[ids[i] * cols + j];
        CHECK_MSG(bad == 0, "embed %s: %d wrong", cv_dtype_name(dtypes[d]), bad);
        free_weights(&w);
    }
}

/* ---- row-wise kernels ----------------------------------------------------------------------- */

static void test_rmsnorm(void) {
    const int64_t rows = 3, dim = 67;
    float *x = rand_vec(rows * dim), *w = rand_vec(dim), *y = rand_vec(rows * dim);
    x[5] = 40.0f; /* a large outlier must not upset the scale */
    cv_rmsnorm(y, x, w, rows, dim, 1e-6f);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int64_t i = 0; i < dim; i++) {
            double ref = w[i] * x[r * dim + i] * inv;
            bad += fabs(y[r * dim + i] - ref) > 2e-6 * (fabs(ref) + 1e-3);
        }
    }
    CHECK_MSG(bad == 0, "rmsnorm (%s): %d wrong", cv_isa_name(cv_isa_active()), bad);
    /* In place, as the model uses it for per-head q/k norms. */
    float *copy = cv_xmalloc((size_t)(rows * dim) * sizeof *copy);
    memcpy(copy, x, (size_t)(rows * dim) * sizeof *copy);
    cv_rmsnorm(copy, copy, w, rows, dim, 1e-6f);
    CHECK(memcmp(copy, y, (size_t)(rows * dim) * sizeof *copy) == 0);
    free(copy);
    free(x);
    free(w);
    free(y);
}

static void test_add_rmsnorm(cv_threadpool *pool) {
    const int64_t rows = 41, dim = 403; /* enough elements to go parallel */
    float *x = rand_vec(rows * dim), *d = rand_vec(rows * dim), *w = rand_vec(dim), *y = rand_vec(rows * dim);
    float *x0 = cv_xmalloc((size_t)(rows * dim) * sizeof *x0);
    memcpy(x0, x, (size_t)(rows * dim) * sizeof *x0);
    cv_add_rmsnorm(pool, x, d, y, w, rows, dim, 1e-6f);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) {
            float s = x0[r * dim + i] + d[r * dim + i];
            bad += x[r * dim + i] != s;
            ss += (double)s * s;
        }
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int64_t i = 0; i < dim; i++) {
            double ref = w[i] * x[r * dim + i] * inv;
            bad += fabs(y[r * dim + i] - ref) > 2e-6 * (fabs(ref) + 1e-3);
        }
    }
    CHECK_MSG(bad == 0, "add_rmsnorm (%s, %d threads): %d wrong", cv_isa_name(cv_isa_active()),
              cv_threadpool_size(pool), bad);
    /* Without a delta it is a plain norm and leaves x alone. */
    memcpy(x0, x, (size_t)(rows * dim) * sizeof *x0);
    float *y2 = rand_vec(rows * dim);
    cv_add_rmsnorm(pool, x, NULL, y2, w, rows, dim, 1e-6f);
    CHECK(memcmp(x, x0, (size_t)(rows * dim) * sizeof *x0) == 0);
    CHECK(memcmp(y, y2, (size_t)(rows * dim) * sizeof *y) == 0);
    free(x);
    free(x0);
    free(d);
    free(w);
    free(y);
    free(y2);
}

static void test_swiglu(cv_threadpool *pool) {
    const int64_t rows = 37, n = 517, ld = 2 * n + 3; /* gate | up | 3 unused columns */
    float *gu = rand_vec(rows * ld), *out = rand_vec(rows * n);
    for (int64_t i = 0; i < rows * ld; i++) gu[i] *= 12.0f; /* saturating both ends of the sigmoid */
    gu[5] = -100.0f;
    gu[6] = 100.0f;
    cv_swiglu(pool, out, gu, rows, n, ld, n);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            double g = gu[r * ld + i], u = gu[r * ld + n + i];
            double ref = g / (1.0 + exp(-g)) * u;
            bad += fabs(out[r * n + i] - ref) > 2e-6 * (fabs(ref) + 1e-6);
        }
    CHECK_MSG(bad == 0, "swiglu (%s, %d threads): %d wrong", cv_isa_name(cv_isa_active()), cv_threadpool_size(pool), bad);
    /* In place over the gate half gives the same values. */
    cv_swiglu(pool, gu, gu, rows, n, ld, n);
    bad = 0;
    for (int64_t i = 0; i < rows * n; i++) bad += gu[i] != out[i];
    CHECK_MSG(bad == 0, "swiglu in place: %d differ", bad);
    free(gu);
    free(out);
}

static void test_elementwise(void) {
    const int64_t n = 37;
    float *g = rand_vec(n), *u = rand_vec(n), *out = rand_vec(n);
    for (int64_t i = 0; i < n; i++) g[i] *= 8.0f;
    cv_silu_mul(out, g, u, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        bad += fabs(out[i] - ref) > 1e-6 * (fabs(ref) + 1e-6);
    }
    CHECK_MSG(bad == 0, "silu_mul: %d wrong", bad);

    memcpy(out, g, (size_t)n * sizeof *out);
    cv_add(out, u, n);
    bad = 0;
    for (int64_t i = 0; i < n; i++) bad += out[i] != g[i] + u[i];
    CHECK_MSG(bad == 0, "add: %d wrong", bad);

    memcpy(out, g, (size_t)n * sizeof *out);
    out[3] = 300.0f; /* would overflow expf without max subtraction */
    double max = 300.0, sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)(i == 3 ? 300.0f : g[i]) - max);
    cv_softmax(out, n);
    bad = 0;
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = exp((double)(i == 3 ? 300.0f : g[i]) - max) / sum;
        bad += fabs(out[i] - ref) > 1e-6 * ref + 1e-12;
        total += out[i];
    }
    CHECK_MSG(bad == 0, "softmax: %d wrong", bad);
    CHECK(fabs(total - 1.0) < 1e-5);
    free(g);
    free(u);
    free(out);
}

/* ---- rotary embedding ----------------------------------------------------------------------- */

static double ref_inv_freq(const cv_rope_params *p, int i) {
    double base = pow(p->theta, -2.0 * i / p->rot_dim);
    if (p->kind == CV_ROPE_KIND_LINEAR) return base / p->factor;
    if (p->kind != CV_ROPE_KIND_YARN) return base;
    double lo = floor(p->rot_dim * log(p->original_max_position / (p->beta_fast * 2 * M_PI)) / (2 * log(p->theta)));
    double hi = ceil(p->rot_dim * log(p->original_max_position / (p->beta_slow * 2 * M_PI)) / (2 * log(p->theta)));
    lo = fmax(lo, 0);
    hi = fmin(hi, p->rot_dim - 1);
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0.0), 1.0); /* 1: fully interpolated */
    return base / p->factor * ramp + base * (1.0 - ramp);
}

static void check_rope(const cv_rope_params *p, int head_dim, double attention_factor) {
    cv_rope rope;
    CHECK_EQ_INT(cv_rope_init(&rope, p), 0);
    const int n_heads = 3, half = p->rot_dim / 2;
    const int32_t positions[] = {0, 1, 7, 150};
    const int64_t n = 4;
    float *x = rand_vec(n * n_heads * head_dim);
    float *orig = cv_xmalloc((size_t)(n * n_heads * head_dim) * sizeof *orig);
    memcpy(orig, x, (size_t)(n * n_heads * head_dim) * sizeof *orig);
    float *c = cv_xmalloc((size_t)(n * half) * sizeof *c), *s = cv_xmalloc((size_t)(n * half) * sizeof *s);
    cv_rope_cos_sin(&rope, positions, n, c, s);
    cv_rope_apply(&rope, x, n, n_heads, head_dim, c, s);
    int bad = 0;
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *o = orig + (t * n_heads + h) * head_dim;
            const float *r = x + (t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                double a = positions[t] * ref_inv_freq(p, i);
                double cc = cos(a) * attention_factor, ss = sin(a) * attention_factor;
                double lo = o[i] * cc - o[i + half] * ss, hi = o[i + half] * cc + o[i] * ss;
                /* f32 angles lose ~1e-5 rad at position 150; that is the tolerance's scale */
                bad += fabs(r[i] - lo) > 3e-5 || fabs(r[i + half] - hi) > 3e-5;
            }
            for (int i = p->rot_dim; i < head_dim; i++) bad += r[i] != o[i];
        }
    CHECK_MSG(bad == 0, "rope kind=%d rot_dim=%d head_dim=%d: %d wrong", p->kind, p->rot_dim, head_dim, bad);
    free(x);
    free(orig);
    free(c);
    free(s);
    cv_rope_free(&rope);
}

/* Fused q/k norm + rope against the two unfused kernels, strided source (a fused qkv row) and in place. */
static void test_rmsnorm_rope(cv_threadpool *pool) {
    cv_rope_params p = {.kind = CV_ROPE_KIND_DEFAULT, .theta = 1e6, .factor = 1, .rot_dim = 30};
    cv_rope rope;
    CHECK_EQ_INT(cv_rope_init(&rope, &p), 0);
    const int n_heads = 5, hd = 34, half = 15;
    const int64_t n = 19, ld_src = n_heads * hd + 7;
    int32_t positions[19];
    for (int i = 0; i < 19; i++) positions[i] = 3 * i + 1;
    float *src = rand_vec(n * ld_src), *w = rand_vec(hd), *dst = rand_vec(n * n_heads * hd);
    float *c = cv_xmalloc((size_t)(n * half) * sizeof *c), *s = cv_xmalloc((size_t)(n * half) * sizeof *s);
    cv_rope_cos_sin(&rope, positions, n, c, s);
    cv_rmsnorm_rope(pool, &rope, dst, n_heads * hd, src, ld_src, n, n_heads, hd, w, 1e-6f, c, s);
    float *ref = cv_xmalloc((size_t)(n * n_heads * hd) * sizeof *ref);
    for (int64_t t = 0; t < n; t++) memcpy(ref + t * n_heads * hd, src + t * ld_src, (size_t)(n_heads * hd) * sizeof *ref);
    cv_rmsnorm(ref, ref, w, n * n_heads, hd, 1e-6f);
    cv_rope_apply(&rope, ref, n, n_heads, hd, c, s);
    CHECK_MSG(memcmp(ref, dst, (size_t)(n * n_heads * hd) * sizeof *ref) == 0, "rmsnorm_rope (%s, %d threads) differs from rmsnorm then rope",
              cv_isa_name(cv_isa_active()), cv_threadpool_size(pool));
    for (int64_t t = 0; t < n; t++) memcpy(dst + t * n_heads * hd, src + t * ld_src, (size_t)(n_heads * hd) * sizeof *dst);
    cv_rmsnorm_rope(pool, &rope, dst, n_heads * hd, dst, n_heads * hd, n, n_heads, hd, w, 1e-6f, c, s);
    CHECK(memcmp(ref, dst, (size_t)(n * n_heads * hd) * sizeof *ref) == 0);
    free(src);
    free(w);
    free(dst);
    free(ref);
    free(c);
    free(s);
    cv_rope_free(&rope);
}

static void test_rope(void) {
    cv_rope_params p = {.kind = CV_ROPE_KIND_DEFAULT, .theta = 1e6, .factor = 1, .rot_dim = 34};
    check_rope(&p, 34, 1.0);
    p.rot_dim = 16; /* partial rotary: the last 18 entries pass through */
    check_rope(&p, 34, 1.0);
    p = (cv_rope_params){.kind = CV_ROPE_KIND_LINEAR, .theta = 1e4, .factor = 4, .rot_dim = 32};
    check_rope(&p, 32, 1.0);
    p = (cv_rope_params){.kind = CV_ROPE_KIND_YARN, .theta = 1e6, .factor = 4, .original_max_position = 32768,
                         .beta_fast = 32, .beta_slow = 1, .rot_dim = 64};
    check_rope(&p, 64, 0.1 * log(4.0) + 1.0);
    p.attention_factor = 1.5;
    check_rope(&p, 64, 1.5);

    cv_rope r;
    p = (cv_rope_params){.kind = CV_ROPE_KIND_DEFAULT, .theta = 1e4, .rot_dim = 7};
    CHECK_EQ_INT(cv_rope_init(&r, &p), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "even");
    p.rot_dim = 8;
    p.theta = 0.5;
    CHECK_EQ_INT(cv_rope_init(&r, &p), CVLLM_ERR_INVALID_ARGUMENT);
    p = (cv_rope_params){.kind = CV_ROPE_KIND_YARN, .theta = 1e4, .factor = 2, .rot_dim = 8};
    CHECK_EQ_INT(cv_rope_init(&r, &p), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "original_max_position");
}

/* ---- paged attention ------------------------------------------------------------------------ */

enum { NH = 4, NKV = 2, HD = 19, BS = 5, NBLOCKS = 40 };

/* Reference: gather the sequence's context in order, then a two-pass softmax in double. */
static void ref_attention(const cv_attention_args *a, int32_t t, int32_t s, double *out) {
    const int group = NH / NKV, n_ctx = a->positions[t] + 1;
    double *score = cv_xmalloc((size_t)n_ctx * sizeof *score);
    for (int h = 0; h < NH; h++) {
        const float *q = a->q + ((int64_t)t * NH + h) * HD;
        int g = h / group;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n_ctx; j++) {
            int64_t slot = (int64_t)a->block_tables[s][j / BS] * BS + j % BS;
            const float *k = a->k_cache + slot * NKV * HD + g * HD;
            double d = 0;
            for (int e = 0; e < HD; e++) d += (double)q[e] * k[e];
            score[j] = d * a->scale;
            mx = fmax(mx, score[j]);
        }
        for (int j = 0; j < n_ctx; j++) sum += score[j] = exp(score[j] - mx);
        for (int e = 0; e < HD; e++) {
            double o = 0;
            for (int j = 0; j < n_ctx; j++) {
                int64_t slot = (int64_t)a->block_tables[s][j / BS] * BS + j % BS;
                o += score[j] / sum * a->v_cache[slot * NKV * HD + g * HD + e];
            }
            out[h * HD + e] = o;
        }
    }
    free(score);
}

static void test_attention(cv_threadpool *pool) {
    /* Sequence 0: a 3-token chunk at positions 10..12 (context 13, earlier tokens already cached).
     * Sequence 1: one decode token at position 70 (context 71: two context tiles).
     * Sequence 2: a 37-token chunk at positions 30..66: three query blocks of the tiled path, the
     * causal cut falling inside the second context tile for some rows and not others.
     * Blocks are shuffled and interleaved between the sequences. */
    enum { T = 41 };
    const int32_t table0[] = {17, 3, 9};
    const int32_t table1[] = {0, 22, 5, 11, 2, 19, 7, 13, 1, 23, 4, 15, 8, 20, 6};
    const int32_t table2[] = {30, 24, 39, 25, 38, 26, 37, 27, 36, 28, 35, 29, 34, 31};
    const int32_t *tables[] = {table0, table1, table2};
    int32_t positions[T] = {10, 11, 12, 70};
    for (int i = 4; i < T; i++) positions[i] = 30 + i - 4;
    const int32_t seq_start[] = {0, 3, 4, T};
    float *k_cache = rand_vec((int64_t)NBLOCKS * BS * NKV * HD), *v_cache = rand_vec((int64_t)NBLOCKS * BS * NKV * HD);
    float *q = rand_vec(T * NH * HD), *out = rand_vec(T * NH * HD);
    for (int i = 0; i < T * NH * HD; i++) q[i] *= 3.0f; /* peaky softmax */
    cv_attention_args a = {.n_tokens = T, .n_seqs = 3, .seq_start = seq_start, .positions = positions,
                           .block_tables = tables, .block_size = BS, .n_heads = NH, .n_kv_heads = NKV,
                           .head_dim = HD, .scale = 1.0f / sqrtf((float)HD), .q = q, .k_cache = k_cache,
                           .v_cache = v_cache, .out = out};
    cv_attention(pool, &a);
    double ref[NH * HD];
    int bad = 0;
    for (int32_t t = 0; t < T; t++) {
        ref_attention(&a, t, t < 3 ? 0 : t < 4 ? 1 : 2, ref);
        for (int i = 0; i < NH * HD; i++) bad += fabs(out[t * NH * HD + i] - ref[i]) > 1e-5;
    }
    CHECK_MSG(bad == 0, "attention (%s, %d threads): %d wrong", cv_isa_name(cv_isa_active()),
              cv_threadpool_size(pool), bad);
    free(k_cache);
    free(v_cache);
    free(q);
    free(out);
}

static void test_kv_write(void) {
    const int64_t width = 6, slots[] = {7, 2, 4};
    float kc[8 * 6] = {0}, vc[8 * 6] = {0}, k[3 * 6], v[3 * 6];
    for (int i = 0; i < 18; i++) k[i] = (float)i, v[i] = (float)-i;
    cv_kv_write(kc, vc, k, v, slots, 3, width);
    int bad = 0;
    for (int t = 0; t < 3; t++)
        for (int e = 0; e < width; e++)
            bad += kc[slots[t] * width + e] != k[t * width + e] || vc[slots[t] * width + e] != v[t * width + e];
    CHECK_EQ_INT(bad, 0);
    CHECK(kc[0] == 0.0f && vc[6 * 6] == 0.0f); /* untouched slots stay */
}

/* ---- ISA selection -------------------------------------------------------------------------- */

static void test_isa_selection(void) {
    CHECK_EQ_INT(cv_isa_from_name("avx2"), CV_ISA_AVX2);
    CHECK_EQ_INT(cv_isa_from_name("avx512"), CV_ISA_AVX512);
    CHECK_EQ_INT(cv_isa_from_name("scalar"), CV_ISA_SCALAR);
    CHECK_EQ_INT(cv_isa_from_name("sse9"), -1);
    CHECK(cv_isa_supported(CV_ISA_SCALAR));
    CHECK_EQ_INT(cv_isa_force((cv_isa)42), CVLLM_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < CV_ISA_COUNT; i++)
        if (!cv_isa_supported((cv_isa)i)) {
            CHECK_EQ_INT(cv_isa_force((cv_isa)i), CVLLM_ERR_UNSUPPORTED);
            CHECK_CONTAINS(cv_error_message(), cv_isa_name((cv_isa)i));
        }
    CHECK(cv_matrix_dtype_supported(CV_DTYPE_BF16));
    CHECK(!cv_matrix_dtype_supported(CV_DTYPE_I8));
}

int main(void) {
    test_threadpool_null_and_split();
    for (int n = 1; n <= 3; n++) test_threadpool(n);
    test_isa_selection();
    cv_threadpool *pools[] = {NULL, cv_threadpool_create(3)};
    for (int isa = 0; isa < CV_ISA_COUNT; isa++) {
        if (!cv_isa_supported((cv_isa)isa)) {
            printf("test_kernels: %s not supported here, skipped\n", cv_isa_name((cv_isa)isa));
            continue;
        }
        CHECK_EQ_INT(cv_isa_force((cv_isa)isa), 0);
        CHECK_EQ_INT(cv_isa_active(), isa);
        for (size_t p = 0; p < CV_ARRAY_LEN(pools); p++) {
            test_matmul(pools[p]);
            test_panels(pools[p]);
            test_attention(pools[p]);
            test_add_rmsnorm(pools[p]);
            test_swiglu(pools[p]);
            test_rmsnorm_rope(pools[p]);
        }
        test_rmsnorm();
        test_elementwise();
        test_embed();
        test_rope();
        test_kv_write();
    }
    cv_threadpool_free(pools[1]);
    return cv_check_summary("test_kernels");
}
