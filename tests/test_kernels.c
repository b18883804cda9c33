/*
 * test_kernels.c — every CPU kernel against a plain double-precision reference, on every ISA path
 * this CPU can run, plus the thread pool.
 *
 * Sizes are deliberately odd (not multiples of 8 or 16) so that vector tails and partial register
 * tiles are exercised, and large enough in places (M > 64, contexts > 64) to cross the matmul token
 * block and the attention context tile. Tolerances are relative to Σ|terms|, the natural error
 * scale of an f32 sum, so they hold for any summation order but catch any wrong term. The
 * bf16-input kernel (vdpbf16ps) is checked bit for bit against a per-lane model of the instruction;
 * AMX's (tdpbf16ps) within f32 rounding, and bit for bit across token counts and thread splits.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/formats.h"
#include "kernels/cpu/kv_layout.h"
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

/* More shares than threads: each share runs once a run, with n = the share count, whichever thread
 * claims it; run with 3 threads on this 2-core machine, where a worker is often not scheduled. */
static void test_threadpool_shares(int n_threads) {
    cv_threadpool *pool = cv_threadpool_create(n_threads);
    pool_probe p = {.expect_n = 7, .total = 1001};
    const int rounds = 500;
    for (int r = 0; r < rounds; r++) {
        cv_threadpool_run_shares(pool, probe_task, &p, 7);
        cv_threadpool_run_shares(pool, probe_task, &(pool_probe){.expect_n = 1, .total = 1}, 1);
    }
    for (int i = 0; i < 7; i++) CHECK_EQ_INT(atomic_load(&p.calls[i]), rounds);
    CHECK_EQ_INT(atomic_load(&p.wrong_n), 0);
    CHECK_EQ_INT(atomic_load(&p.covered), (int64_t)rounds * 1001);
    /* a NULL pool runs every share on the caller */
    pool_probe q = {.expect_n = 3, .total = 30};
    cv_threadpool_run_shares(NULL, probe_task, &q, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(atomic_load(&q.calls[i]), 1);
    CHECK_EQ_INT(atomic_load(&q.covered), 30);
    cv_threadpool_free(pool);
}

/* Share 4, the first of the worker's run (7 shares on 2 threads: 0-3 and 4-6), waits for share 6:
 * it can only end if a thread through with its own run takes 6 from the back of the other's. A
 * pool that kept each run on its own thread would wait forever, which the test's ctest timeout
 * turns into a failure (no clock here: a busy machine only makes it slower). */
typedef struct steal_probe {
    _Atomic int ran[7];
} steal_probe;

static void steal_task(void *arg, int i, int n) {
    steal_probe *p = arg;
    (void)n;
    if (i == 4)
        while (!atomic_load(&p->ran[6])) {
        }
    atomic_fetch_add(&p->ran[i], 1);
}

static void test_threadpool_steals(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    for (int r = 0; r < 50; r++) {
        steal_probe p = {0};
        cv_threadpool_run_shares(pool, steal_task, &p, 7);
        for (int i = 0; i < 7; i++) CHECK_EQ_INT(atomic_load(&p.ran[i]), 1);
    }
    cv_threadpool_free(pool);
}

/* cv_threadpool_run_range: every item [0, n) exactly once, in calls of non-empty ranges; on the caller
 * in one call when not parallel, for a NULL or one-thread pool, for one item; no call for none. */
typedef struct range_counts {
    _Atomic int hits[1000];
    _Atomic int calls, empty;
} range_counts;

typedef struct range_probe {
    range_counts *c; /* the job is read-only, as a kernel's; what it writes is behind a pointer */
} range_probe;

static void range_probe_fn(const void *arg, int64_t b, int64_t e) {
    range_counts *p = ((const range_probe *)arg)->c;
    atomic_fetch_add(&p->calls, 1);
    if (b >= e) atomic_fetch_add(&p->empty, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&p->hits[i], 1);
}

static void test_threadpool_range(void) {
    cv_threadpool *pools[2] = {cv_threadpool_create(3), NULL};
    static const int64_t sizes[] = {0, 1, 2, 5, 1000};
    for (int q = 0; q < 2; q++)
        for (size_t k = 0; k < CV_ARRAY_LEN(sizes); k++)
            for (int parallel = 0; parallel < 2; parallel++) {
                static range_counts p;
                memset(&p, 0, sizeof p);
                const int64_t n = sizes[k];
                cv_threadpool_run_range(pools[q], range_probe_fn, &(range_probe){&p}, n, parallel);
                for (int64_t i = 0; i < n; i++) CHECK_EQ_INT(atomic_load(&p.hits[i]), 1);
                CHECK_EQ_INT(atomic_load(&p.empty), 0);
                const bool split = parallel && n > 1 && pools[q];
                if (!split) CHECK_EQ_INT(atomic_load(&p.calls), n > 0 ? 1 : 0);
                else CHECK(atomic_load(&p.calls) >= 2 && atomic_load(&p.calls) <= 3);
            }
    cv_threadpool_free(pools[0]);
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

/* Weights rounded to `dtype` and stored in it, plus the exact f32 values they hold (int8 and e4m3:
 * random codes and their values, before any scale). */
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
        } else if (dtype == CV_DTYPE_I8) {
            int8_t q = i == 0 ? -128 : (int8_t)(v * 128.0f); /* the codes' whole range */
            ((int8_t *)w.data)[i] = q;
            w.exact[i] = q;
        } else if (dtype == CV_DTYPE_F8_E4M3) {
            uint8_t b = (uint8_t)(v * 128.0f + 128.0f);
            if ((b & 0x7f) == 0x7f) b ^= 1; /* no NaN codes */
            ((uint8_t *)w.data)[i] = b;
            w.exact[i] = cv_fp8_e4m3_to_f32(b);
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
    const cv_weight view = cv_weight_view(&(cv_matrix){w.data, dtype, n, k});
    cv_linear(pool, &view, &(cv_act){.f32 = x}, m, 1, &view.rows, &y);
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

static void test_embed(void) {
    static const cv_dtype dtypes[] = {CV_DTYPE_F32, CV_DTYPE_BF16, CV_DTYPE_F16};
    const int64_t rows = 11, cols = 13;
    const int32_t ids[] = {10, 0, 3, 3};
    for (size_t d = 0; d < CV_ARRAY_LEN(dtypes); d++) {
        test_weights w = make_weights(dtypes[d], rows * cols);
        const cv_weight table = cv_weight_view(&(cv_matrix){w.data, dtypes[d], rows, cols});
        float out[4 * 13];
        cv_embed_weight(&table, ids, 4, out);
        int bad = 0;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < cols; j++) bad += out[i * cols + j] != w.exact[ids[i] * cols + j];
        CHECK_MSG(bad == 0, "embed %s: %d wrong", cv_dtype_name(dtypes[d]), bad);
        free_weights(&w);
    }
}

/* ---- weights in kernel formats -------------------------------------------------------------- */

/* The kernel paths: every ISA, and AVX-512 without and with VNNI (which only its int8 kernel uses),
 * and with AMX (its int8 kernel here; its bf16 one in test_bf16_compute). */
typedef struct kernel_path {
    cv_isa isa;
    bool vnni, amx;
} kernel_path;

static const kernel_path kernel_paths[] = {{CV_ISA_SCALAR, false, false}, {CV_ISA_AVX2, false, false},
                                           {CV_ISA_AVX512, false, false}, {CV_ISA_AVX512, true, false},
                                           {CV_ISA_AVX512, true, true}};

static const char *path_name(kernel_path p) {
    return p.amx ? "avx512-amx" : p.vnni ? "avx512-vnni" : cv_isa_name(p.isa);
}

static const char *active_path = "default";

/* Makes p the active path; false (with a printed reason when `report`) where the CPU lacks it. */
static bool use_path(kernel_path p, bool report) {
    if (cv_isa_force(p.isa) || cv_cpu_vnni_enable(p.vnni) || cv_cpu_amx_enable(p.amx)) {
        if (report) printf("test_kernels: %s skipped: %s\n", path_name(p), cv_error_message());
        return false;
    }
    active_path = path_name(p);
    return true;
}

/* A stack of checkpoint parts with random codes (make_weights), as the loader hands them over:
 * int8 parts with row scales and (on even parts) biases, e4m3 parts with block scales. */
typedef struct test_stack {
    cv_dtype dtype;
    int n_parts;
    int64_t part_rows[4], rows, cols;
    int32_t block;
    test_weights w;          /* [rows][cols], the parts one after another */
    float *row_scale;        /* I8 */
    int32_t *row_bias;       /* I8 */
    float *block_scale[4];   /* F8_E4M3, per part */
    cv_weight_part parts[4];
} test_stack;

static int64_t blocks(int64_t n, int32_t block) { return (n + block - 1) / block; }

static test_stack make_stack(cv_dtype dtype, const int64_t *part_rows, int n_parts, int64_t cols, int32_t block) {
    test_stack s = {.dtype = dtype, .n_parts = n_parts, .cols = cols, .block = block};
    for (int j = 0; j < n_parts; j++) s.rows += s.part_rows[j] = part_rows[j];
    s.w = make_weights(dtype, s.rows * cols);
    s.row_scale = cv_xmalloc((size_t)s.rows * sizeof *s.row_scale);
    s.row_bias = cv_xmalloc((size_t)s.rows * sizeof *s.row_bias);
    for (int64_t r = 0; r < s.rows; r++) {
        s.row_scale[r] = (1.5f + frand()) * 1e-3f;
        s.row_bias[r] = (int32_t)(frand() * 1e6f);
    }
    for (int j = 0, r0 = 0; j < n_parts; r0 += (int)part_rows[j], j++) {
        const int64_t nb = blocks(part_rows[j], block) * blocks(cols, block);
        s.block_scale[j] = cv_xmalloc((size_t)nb * sizeof(float));
        for (int64_t b = 0; b < nb; b++) s.block_scale[j][b] = (1.5f + frand()) * 0.01f;
        s.parts[j] = (cv_weight_part){
            .dtype = dtype,
            .rows = part_rows[j],
            .cols = cols,
            .data = (const char *)s.w.data + (size_t)(r0 * cols) * cv_dtype_size(dtype),
            .row_scale = s.row_scale + r0,
            .row_bias = j % 2 == 0 ? s.row_bias + r0 : NULL,
            .block_scale = s.block_scale[j],
            .block = block,
        };
    }
    return s;
}

static void free_stack(test_stack *s) {
    free_weights(&s->w);
    free(s->row_scale);
    free(s->row_bias);
    for (int j = 0; j < s->n_parts; j++) free(s->block_scale[j]);
}

/* Weight (r, c) of the stack as the model means it (e4m3 times its block's scale). */
/* The e4m3 block scale of the stack's weight (r, c): its part's block holding the part's row. */
static float stack_block_scale(const test_stack *s, int64_t r, int64_t c) {
    int j = 0;
    while (r >= s->part_rows[j]) r -= s->part_rows[j++];
    return s->block_scale[j][(r / s->block) * blocks(s->cols, s->block) + c / s->block];
}

static double stack_weight(const test_stack *s, int64_t r, int64_t c) {
    double v = s->w.exact[r * s->cols + c];
    return s->dtype == CV_DTYPE_F8_E4M3 ? v * stack_block_scale(s, r, c) : v;
}

/* The input of a linear: f32 rows, and the same count of int8 rows (cv_act_i8_stride apart, zero
 * past cols) with per-row scales. */
typedef struct test_input {
    float *f32;
    int8_t *i8;
    float *scale;
} test_input;

static test_input make_input(int64_t m, int64_t cols) {
    const int64_t stride = cv_act_i8_stride(cols);
    CHECK(stride >= cols && stride % 4 == 0);
    test_input x = {rand_vec(m * cols), cv_xcalloc((size_t)(m * stride), 1), rand_vec(m)};
    for (int64_t i = 0; i < m; i++) {
        x.scale[i] = fabsf(x.scale[i]) + 0.25f;
        for (int64_t c = 0; c < cols; c++) x.i8[i * stride + c] = (int8_t)(frand() * 128.0f);
    }
    x.i8[0] = -128; /* the codes' whole range */
    return x;
}

static void free_input(test_input *x) {
    free(x->f32);
    free(x->i8);
    free(x->scale);
}

/* The I8_PANELS result of one output from a plain int64 dot product: the sum must fit an int32,
 * and the epilogue is (float)(sum + bias) · row scale · token scale. */
static float i8_reference(const test_stack *s, const test_input *x, bool scaled, int64_t t, int64_t r) {
    const int64_t stride = cv_act_i8_stride(s->cols);
    int64_t acc = 0;
    for (int64_t c = 0; c < s->cols; c++) acc += (int64_t)x->i8[t * stride + c] * (int64_t)s->w.exact[r * s->cols + c];
    int j = 0;
    int64_t lr = r;
    while (lr >= s->part_rows[j]) lr -= s->part_rows[j++];
    acc += s->parts[j].row_bias ? s->parts[j].row_bias[lr] : 0;
    if (acc < INT32_MIN || acc > INT32_MAX) return NAN; /* the test's shapes keep it in range */
    float v = (float)acc;
    v = v * s->row_scale[r];
    return v * (scaled ? x->scale[t] : 1.0f);
}

/* cv_linear over the packed stack for m tokens, against the reference: the same bits for int8,
 * within f32 rounding of Σ|terms| for the float formats. Returns the outputs, part after part. */
static float *check_linear(cv_threadpool *pool, const test_stack *s, const cv_weight *w, const test_input *x,
                           int64_t m, bool scaled) {
    float *out = rand_vec(m * s->rows), *ys[4];
    for (int j = 0, r0 = 0; j < s->n_parts; r0 += (int)s->part_rows[j], j++) ys[j] = out + m * r0;
    const cv_act act = {.f32 = x->f32, .i8 = x->i8, .i8_scale = scaled ? x->scale : NULL};
    cv_linear(pool, w, &act, m, s->n_parts, s->part_rows, ys);
    int bad = 0;
    double worst = 0;
    for (int j = 0, r0 = 0; j < s->n_parts; r0 += (int)s->part_rows[j], j++)
        for (int64_t t = 0; t < m; t++)
            for (int64_t c = 0; c < s->part_rows[j]; c++) {
                const float got = ys[j][t * s->part_rows[j] + c];
                if (s->dtype == CV_DTYPE_I8) {
                    const float ref = i8_reference(s, x, scaled, t, r0 + c);
                    bad += memcmp(&got, &ref, sizeof got) != 0;
                    worst = fmax(worst, fabs((double)got - ref));
                    continue;
                }
                double ref = 0, mag = 0;
                for (int64_t e = 0; e < s->cols; e++) {
                    double term = (double)x->f32[t * s->cols + e] * stack_weight(s, r0 + c, e);
                    ref += term;
                    mag += fabs(term);
                }
                double err = fabs(got - ref) / (mag + 1e-30);
                worst = fmax(worst, err);
                bad += err > 1e-5;
            }
    CHECK_MSG(bad == 0, "%s %s M=%lld rows=%lld (%d parts) cols=%lld threads=%d: %d wrong (worst %.3g)",
              active_path, cv_wformat_name(w->format), (long long)m,
              (long long)s->rows, s->n_parts, (long long)s->cols, cv_threadpool_size(pool), bad, worst);
    return out;
}

/* Odd shapes: cols not a multiple of 2, 4 or 128, rows not a multiple of 16, token counts across
 * the register tile and the 64-token block, K across the prefill k blocks (256 bf16 pairs, 512
 * int8 columns), stacked parts (q|k|v, gate|up). */
static const struct linear_case {
    int64_t m, cols;
    int n_parts;
    int64_t part_rows[3];
} linear_cases[] = {
    {1, 67, 1, {37}},  {7, 33, 1, {45}},  {130, 301, 1, {21}},     {61, 1, 1, {100}},       {1, 2, 1, {16}},
    {13, 300, 1, {3}}, {5, 1031, 1, {40}}, {1, 75, 3, {48, 16, 16}}, {67, 75, 3, {48, 16, 16}}, {9, 40, 2, {32, 23}},
    /* over 1 MiB in every format: more of the pool's shares than threads, a part boundary inside one */
    {1, 1024, 2, {1040, 500}}, {3, 1024, 2, {1040, 500}},
};

static void test_format(cv_threadpool *pool, cv_dtype dtype) {
    for (size_t i = 0; i < CV_ARRAY_LEN(linear_cases); i++) {
        const struct linear_case *lc = &linear_cases[i];
        test_stack s = make_stack(dtype, lc->part_rows, lc->n_parts, lc->cols, 128);
        cv_weight w;
        CHECK_EQ_INT(cv_weight_pack(pool, s.parts, s.n_parts, &w), 0);
        CHECK_EQ_INT(w.format, cv_wformat_for_dtype(dtype));
        CHECK(w.rows == s.rows && w.cols == s.cols && w.owned);
        test_input x = make_input(lc->m, lc->cols);
        free(check_linear(pool, &s, &w, &x, lc->m, i % 2 == 0));
        cv_weight_release(&w);
        CHECK(w.data == NULL);
        free_input(&x);
        free_stack(&s);
    }
}

/* Decode tiles with and without their asks ahead (cv_cpu_stream_asks: the CPU decides which runs
 * by default): a hint never changes the bits, so both equal the reference on the active path. */
static void test_stream_asks(cv_threadpool *pool, bool vnni) {
    const bool was = cv_cpu_stream_asks();
    for (int ask = 0; ask <= 1; ask++) {
        cv_cpu_stream_asks_enable(ask);
        CHECK(cv_cpu_stream_asks() == (ask == 1));
        test_format(pool, CV_DTYPE_I8);
        if (vnni) continue; /* the float formats do not use VNNI */
        test_format(pool, CV_DTYPE_BF16);
        test_format(pool, CV_DTYPE_F8_E4M3);
    }
    cv_cpu_stream_asks_enable(was);
}

/* The row-major views through cv_linear, split into parts as a fused projection would be: the same
 * bits as the whole matrix in one part. */
static void test_views(cv_threadpool *pool) {
    static const cv_dtype dtypes[] = {CV_DTYPE_F32, CV_DTYPE_BF16, CV_DTYPE_F16};
    static const cv_wformat formats[] = {CV_WFORMAT_F32, CV_WFORMAT_BF16, CV_WFORMAT_F16};
    const int64_t part_rows[] = {32, 16, 19}, rows = 67, cols = 37, m = 9;
    for (size_t d = 0; d < CV_ARRAY_LEN(dtypes); d++) {
        test_weights w = make_weights(dtypes[d], rows * cols);
        const cv_matrix mat = {w.data, dtypes[d], rows, cols};
        const cv_weight view = cv_weight_view(&mat);
        CHECK(view.format == formats[d] && !view.owned && view.data == w.data);
        CHECK(view.rows == rows && view.cols == cols);
        CHECK_EQ_INT(cv_weight_packed_bytes(view.format, rows, cols), rows * cols * cv_dtype_size(dtypes[d]));
        float *x = rand_vec(m * cols), *whole = rand_vec(m * rows), *split = rand_vec(m * rows);
        float *ys[] = {split, split + m * 32, split + m * 48};
        cv_linear(pool, &view, &(cv_act){.f32 = x}, m, 1, &view.rows, &whole);
        cv_linear(pool, &view, &(cv_act){.f32 = x}, m, 3, part_rows, ys);
        int bad = 0;
        for (int64_t t = 0; t < m; t++)
            for (int64_t r = 0, j = 0, lr = 0; r < rows; r++, lr++) {
                if (lr == part_rows[j]) j++, lr = 0;
                bad += ys[j][t * part_rows[j] + lr] != whole[t * rows + r];
            }
        CHECK_MSG(bad == 0, "%s view in parts differs from the whole: %d", cv_wformat_name(view.format), bad);
        free(x);
        free(whole);
        free(split);
        free_weights(&w);
    }
}

/* The int8 kernels of every path give the same bits (each must equal the int64 reference anyway;
 * this compares the paths directly on one product with k blocks, parts and partial panels). */
static void test_i8_paths_agree(cv_threadpool *pool) {
    const int64_t part_rows[] = {48, 16, 21}, m = 67, cols = 1031;
    test_stack s = make_stack(CV_DTYPE_I8, part_rows, 3, cols, 128);
    cv_weight w;
    CHECK_EQ_INT(cv_weight_pack(pool, s.parts, 3, &w), 0);
    test_input x = make_input(m, cols);
    float *first = NULL;
    for (size_t p = 0; p < CV_ARRAY_LEN(kernel_paths); p++) {
        if (!use_path(kernel_paths[p], false)) continue;
        float *out = check_linear(pool, &s, &w, &x, m, true);
        if (!first) first = out;
        else {
            CHECK_MSG(memcmp(first, out, (size_t)(m * s.rows) * sizeof *out) == 0, "%s int8 result differs from %s",
                      path_name(kernel_paths[p]), cv_isa_name(CV_ISA_SCALAR));
            free(out);
        }
    }
    free(first);
    free_input(&x);
    cv_weight_release(&w);
    free_stack(&s);
}

/* The int32 sum at the format's column limit with the largest codes: the VNNI kernel's offset sum
 * Σ (x+128)·w wraps its int32 lanes on the way, and the result must still be exact. */
static void test_i8_extremes(cv_threadpool *pool) {
    const int64_t cols = 131071, rows = 3;
    int8_t *codes = cv_xmalloc((size_t)(rows * cols));
    const int64_t stride = cv_act_i8_stride(cols);
    int8_t *x = cv_xcalloc((size_t)(2 * stride), 1);
    for (int64_t c = 0; c < cols; c++) {
        codes[c] = -128, codes[cols + c] = 127, codes[2 * cols + c] = c % 2 ? 127 : -128;
        x[c] = 127, x[stride + c] = -128;
    }
    const float scale[] = {1.0f, 1.0f, 1.0f};
    const int32_t bias[] = {0, -5, 7};
    cv_weight_part part = {.dtype = CV_DTYPE_I8, .rows = rows, .cols = cols, .data = codes, .row_scale = scale,
                           .row_bias = bias};
    cv_weight w;
    CHECK_EQ_INT(cv_weight_pack(pool, &part, 1, &w), 0);
    float y[2 * 3];
    cv_linear(pool, &w, &(cv_act){.i8 = x}, 2, 1, &w.rows, (float *[]){y});
    const int64_t half = cols / 2; /* row 2: (cols+1)/2 codes -128 at even c, the rest 127 */
    const int64_t expect[2][3] = {
        {-16256 * cols, 16129 * cols - 5, -16256 * (cols - half) + 16129 * half + 7},
        {16384 * cols, -16256 * cols - 5, 16384 * (cols - half) - 16256 * half + 7},
    };
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < 3; r++)
            CHECK_MSG(y[t * 3 + r] == (float)expect[t][r], "%s int8 extreme t=%d r=%d: %.9g != %lld",
                      active_path, t, r, (double)y[t * 3 + r],
                      (long long)expect[t][r]);
    cv_weight_release(&w);
    free(codes);
    free(x);
}

/* A streamed tile's asks: CV_PANEL_AHEAD on in each panel, then past a panel's end the same place
 * in the next tile's panel (not the tile's own next panel, which is read already), or on past the
 * end when the walk has no next tile. */
static void test_panel_ahead(void) {
    static uint8_t codes[8 << 10];
    const int64_t stride = 1 << 10, span = 1 << 10; /* 1 KiB panels, a tile of three */
    cv_panel_tile t = {.w = codes, .panel_stride = stride, .np = 3};
    const uint8_t *next = codes + 3 * stride;
    CHECK((const uint8_t *)cv_panel_ahead(&t, 2, 0, 4 * span) == codes + 2 * stride + CV_PANEL_AHEAD);
    CHECK((const uint8_t *)cv_panel_ahead(&t, 1, 64, span) == codes + stride + 64 + CV_PANEL_AHEAD);
    t.next = next;
    CHECK((const uint8_t *)cv_panel_ahead(&t, 0, 0, 4 * span) == codes + CV_PANEL_AHEAD);
    for (int j = 0; j < 3; j++)
        CHECK_MSG((const uint8_t *)cv_panel_ahead(&t, j, 64, span) == next + j * stride + 64 + CV_PANEL_AHEAD - span,
                  "panel %d asks in the wrong place past its end", j);
}

/* Packing does not depend on the pool, pack_into writes what pack maps, and bf16 panels give back
 * their rows exactly (a tied embedding read from the packed lm_head). */
static void test_packing(cv_threadpool *pool) {
    static const cv_dtype dtypes[] = {CV_DTYPE_BF16, CV_DTYPE_I8};
    const int64_t part_rows[] = {32, 23}, cols = 45;
    for (size_t d = 0; d < CV_ARRAY_LEN(dtypes); d++) {
        test_stack s = make_stack(dtypes[d], part_rows, 2, cols, 128);
        cv_weight a, b;
        CHECK_EQ_INT(cv_weight_pack(pool, s.parts, 2, &a), 0);
        const size_t bytes = cv_weight_packed_bytes(a.format, s.rows, cols);
        void *dst = cv_xmalloc(bytes);
        CHECK_EQ_INT(cv_weight_pack_into(NULL, s.parts, 2, dst, &b), 0);
        CHECK(!b.owned && b.data == dst && b.format == a.format && b.rows == a.rows);
        CHECK_MSG(memcmp(a.data, b.data, bytes) == 0, "%s: pack with %d threads and pack_into differ",
                  cv_wformat_name(a.format), cv_threadpool_size(pool));
        if (dtypes[d] == CV_DTYPE_BF16) {
            const int32_t ids[] = {0, (int32_t)s.rows - 1, 33};
            float *rows = rand_vec(3 * cols);
            cv_embed_weight(&b, ids, 3, rows);
            int wrong = 0;
            for (int i = 0; i < 3; i++)
                for (int64_t c = 0; c < cols; c++) wrong += rows[i * cols + c] != s.w.exact[ids[i] * cols + c];
            CHECK_MSG(wrong == 0, "rows from bf16 panels: %d wrong", wrong);
            free(rows);
        }
        free(dst);
        cv_weight_release(&a);
        free_stack(&s);
    }
}

/* e4m3 block scales: row blocks across the rows (and the stacked parts), partial edge blocks in
 * both directions, a 256 block edge, K across the 512-column prefill blocks. */
static void test_fp8_blocks(cv_threadpool *pool) {
    static const struct {
        int64_t m, cols;
        int n_parts;
        int64_t part_rows[3];
        int32_t block;
    } cases[] = {{3, 300, 1, {200}, 128}, {67, 600, 3, {144, 32, 37}, 128}, {1, 600, 3, {144, 32, 37}, 128},
                 {2, 300, 1, {272}, 256}};
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        test_stack s = make_stack(CV_DTYPE_F8_E4M3, cases[i].part_rows, cases[i].n_parts, cases[i].cols, cases[i].block);
        cv_weight w;
        CHECK_EQ_INT(cv_weight_pack(pool, s.parts, s.n_parts, &w), 0);
        test_input x = make_input(cases[i].m, cases[i].cols);
        free(check_linear(pool, &s, &w, &x, cases[i].m, false));
        /* rows back as f32: the dequantized weights the kernels use */
        const int32_t ids[] = {0, (int32_t)s.rows - 1, 150 % (int32_t)s.rows};
        float *rows = rand_vec(3 * s.cols);
        cv_embed_weight(&w, ids, 3, rows);
        int wrong = 0;
        for (int r = 0; r < 3; r++)
            for (int64_t c = 0; c < s.cols; c++) wrong += rows[r * s.cols + c] != (float)stack_weight(&s, ids[r], c);
        CHECK_MSG(wrong == 0, "fp8 rows (block %d): %d wrong", cases[i].block, wrong);
        free(rows);
        free_input(&x);
        cv_weight_release(&w);
        free_stack(&s);
    }
}

/* Every e4m3 code but the two NaNs through the packed kernels, with the identity as input so that
 * each output is one weight: exactly the code's value times its block's scale, on every path; with
 * bf16_input, as bf16 rows (the identity is exact in bf16) through the vdpbf16ps kernel. */
static void test_fp8_widening(cv_threadpool *pool, bool bf16_input) {
    enum { CODES = 254, ROWS = 16 };
    uint8_t list[CODES], codes[ROWS * CODES];
    for (int b = 0, n = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f) list[n++] = (uint8_t)b;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < CODES; c++) codes[r * CODES + c] = list[(c + 17 * r) % CODES];
    float *x = cv_xcalloc((size_t)CODES * CODES, sizeof *x), *y = rand_vec(CODES * ROWS);
    for (int t = 0; t < CODES; t++) x[t * CODES + t] = 1.0f;
    uint16_t *xb = cv_xmalloc((size_t)(CODES * cv_act_bf16_stride(CODES)) * sizeof *xb);
    cv_round_bf16_rows(pool, x, CODES, CODES, CODES, xb);
    const cv_act act = {.f32 = bf16_input ? NULL : x, .bf16 = bf16_input ? xb : NULL};
    static const float scales[][2] = {{1.0f, 1.0f}, {0.3f, 3.7e-3f}};
    for (size_t s = 0; s < CV_ARRAY_LEN(scales); s++) {
        cv_weight_part part = {.dtype = CV_DTYPE_F8_E4M3, .rows = ROWS, .cols = CODES, .data = codes,
                               .block_scale = scales[s], .block = 128};
        cv_weight w;
        CHECK_EQ_INT(cv_weight_pack(pool, &part, 1, &w), 0);
        cv_linear(pool, &w, &act, CODES, 1, &w.rows, &y);
        int wrong = 0;
        for (int t = 0; t < CODES; t++)
            for (int r = 0; r < ROWS; r++) {
                const uint8_t code = codes[r * CODES + t];
                wrong += y[t * ROWS + r] != cv_fp8_e4m3_to_f32(code) * scales[s][t / 128];
            }
        CHECK_MSG(wrong == 0, "%s%s e4m3 widening (scales %g, %g): %d of %d codes wrong", active_path,
                  bf16_input ? " bf16-input" : "", (double)scales[s][0], (double)scales[s][1], wrong, ROWS * CODES);
        cv_weight_release(&w);
    }
    free(x);
    free(xb);
    free(y);
}

/* What the e4m3 format refuses: NaN codes (naming the row), block edges that are no multiple of
 * 128, missing or non-finite scales. */
/* f32 → fp8: every code's value maps back to it (both signs, subnormals, e5m2's infinities); a value
 * halfway between two neighbours goes to the even code and one a step off it to the nearer; what
 * rounds past the largest finite is NaN in e4m3fn and infinity in e5m2. */
static void test_fp8_narrowing(void) {
    int wrong = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) != 0x7f) wrong += cv_f32_to_fp8_e4m3(cv_fp8_e4m3_to_f32((uint8_t)c)) != c;
        const float v = cv_f16_to_f32((uint16_t)(c << 8)); /* e5m2 is the top byte of an f16 */
        if (!isnan(v)) wrong += cv_f32_to_fp8_e5m2(v) != c;
    }
    for (int c = 0; c < 0x7e; c++) { /* positive neighbours below e4m3fn's NaN */
        const float lo = cv_fp8_e4m3_to_f32((uint8_t)c), hi = cv_fp8_e4m3_to_f32((uint8_t)(c + 1)), mid = (lo + hi) / 2;
        wrong += cv_f32_to_fp8_e4m3(mid) != (c & 1 ? c + 1 : c);
        wrong += cv_f32_to_fp8_e4m3(nextafterf(mid, 0)) != c || cv_f32_to_fp8_e4m3(nextafterf(mid, INFINITY)) != c + 1;
        wrong += cv_f32_to_fp8_e4m3(-mid) != (0x80 | (c & 1 ? c + 1 : c));
    }
    for (int c = 0; c < 0x7b; c++) { /* below e5m2's infinity */
        const float lo = cv_f16_to_f32((uint16_t)(c << 8)), hi = cv_f16_to_f32((uint16_t)((c + 1) << 8)), mid = (lo + hi) / 2;
        wrong += cv_f32_to_fp8_e5m2(mid) != (c & 1 ? c + 1 : c);
        wrong += cv_f32_to_fp8_e5m2(nextafterf(mid, 0)) != c || cv_f32_to_fp8_e5m2(nextafterf(mid, INFINITY)) != c + 1;
    }
    CHECK_MSG(wrong == 0, "fp8 narrowing: %d wrong", wrong);
    CHECK_EQ_INT(cv_f32_to_fp8_e4m3(464.0f), 0x7e); /* the tie between 448 and 480 goes to 448 */
    CHECK_EQ_INT(cv_f32_to_fp8_e4m3(464.5f), 0x7f);
    CHECK_EQ_INT(cv_f32_to_fp8_e4m3(-1e6f), 0xff);
    CHECK_EQ_INT(cv_f32_to_fp8_e4m3(INFINITY), 0x7f);
    CHECK_EQ_INT(cv_f32_to_fp8_e4m3(NAN) & 0x7f, 0x7f);
    CHECK_EQ_INT(cv_f32_to_fp8_e5m2(61440.0f), 0x7c); /* the tie between 57344 and 65536 overflows */
    CHECK_EQ_INT(cv_f32_to_fp8_e5m2(61439.0f), 0x7b);
    CHECK_EQ_INT(cv_f32_to_fp8_e5m2(-INFINITY), 0xfc);
    CHECK_EQ_INT(cv_f32_to_fp8_e5m2(NAN) & 0x7f, 0x7f);
    CHECK_EQ_INT(cv_f32_to_fp8_e5m2(1e-10f), 0);
}

static void test_fp8_errors(void) {
    uint8_t codes[40 * 8];
    memset(codes, 0x38, sizeof codes); /* 1.0 */
    float scales[1] = {1.0f}, inf_scale[1] = {INFINITY};
    cv_weight_part p[2] = {
        {.dtype = CV_DTYPE_F8_E4M3, .rows = 32, .cols = 8, .data = codes, .block_scale = scales, .block = 128},
        {.dtype = CV_DTYPE_F8_E4M3, .rows = 8, .cols = 8, .data = codes + 32 * 8, .block_scale = scales, .block = 128},
    };
    cv_weight w = {0};
    codes[32 * 8 + 5 * 8 + 3] = 0xff;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "part 1 of a packed fp8_panels weight: row 5 holds an e4m3 NaN code");
    CHECK(w.data == NULL);
    codes[32 * 8 + 5 * 8 + 3] = 0x38;
    codes[2 * 8] = 0x7f;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "part 0 of a packed fp8_panels weight: row 2 holds an e4m3 NaN code");
    codes[2 * 8] = 0x38;
    p[1].block = 64;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cv_error_message(), "multiple of 128");
    p[1].block = 128, p[1].block_scale = NULL;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "block scales");
    p[1].block_scale = inf_scale;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "scale block (0, 0) holds inf");
    p[1].block_scale = scales;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), 0);
    cv_weight_release(&w);
}

/* What cannot be packed is refused with one line, nothing half-done. */
static void test_pack_errors(void) {
    int8_t codes[32 * 8] = {0};
    uint16_t halves[32 * 8] = {0};
    float scale[32], bad_scale[32];
    for (int i = 0; i < 32; i++) scale[i] = bad_scale[i] = 1.0f;
    bad_scale[17] = NAN;
    const cv_weight_part i8 = {.dtype = CV_DTYPE_I8, .rows = 32, .cols = 8, .data = codes, .row_scale = scale};
    const cv_weight_part bf16 = {.dtype = CV_DTYPE_BF16, .rows = 32, .cols = 8, .data = halves};
    cv_weight w = {0};
    cv_weight_part p[5] = {i8, i8, i8, i8, i8};
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 5, &w), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "1 to 4 parts");
    p[1] = bf16;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "mix I8 and BF16");
    p[1] = i8, p[1].cols = 7;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "same number of columns");
    p[1] = i8, p[0].rows = 20;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "multiple of 16");
    p[0] = i8, p[0].row_scale = NULL;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 1, &w), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "scale per row");
    p[0] = i8, p[1] = i8, p[1].row_scale = bad_scale;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 2, &w), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "part 1 of a packed i8_panels weight: row 17 has the scale nan");
    p[0] = i8, p[0].cols = 131072;
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 1, &w), CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cv_error_message(), "131071");
    float f[4] = {0};
    p[0] = (cv_weight_part){.dtype = CV_DTYPE_F32, .rows = 2, .cols = 2, .data = f};
    CHECK_EQ_INT(cv_weight_pack(NULL, p, 1, &w), CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cv_error_message(), "F32 weights have no packed format");
    CHECK(w.data == NULL);
}

static void test_format_names(void) {
    CHECK_EQ_INT(cv_wformat_for_dtype(CV_DTYPE_BF16), CV_WFORMAT_BF16_PANELS);
    CHECK_EQ_INT(cv_wformat_for_dtype(CV_DTYPE_I8), CV_WFORMAT_I8_PANELS);
    CHECK_EQ_INT(cv_wformat_for_dtype(CV_DTYPE_F8_E4M3), CV_WFORMAT_FP8_PANELS);
    CHECK_EQ_INT(cv_wformat_for_dtype(CV_DTYPE_F16), -1);
    CHECK(cv_wformat_int8_input(CV_WFORMAT_I8_PANELS) && !cv_wformat_int8_input(CV_WFORMAT_BF16_PANELS));
    CHECK_STR_EQ(cv_wformat_name(CV_WFORMAT_I8_PANELS), "i8_panels");
    CHECK_STR_EQ(cv_wformat_name(CV_WFORMAT_BF16), "bf16");
    CHECK_STR_EQ(cv_wformat_name(CV_WFORMAT_COUNT), "unknown");
    /* 16-row panels of 4-column groups, then 48 words per panel */
    CHECK_EQ_INT(cv_weight_packed_bytes(CV_WFORMAT_I8_PANELS, 17, 5), 2 * (2 * 64 + 192));
    CHECK_EQ_INT(cv_weight_packed_bytes(CV_WFORMAT_BF16_PANELS, 17, 5), 2 * 3 * 64);
    /* 16 bytes per column, then a scale per 128 columns */
    CHECK_EQ_INT(cv_weight_packed_bytes(CV_WFORMAT_FP8_PANELS, 17, 129), 2 * (129 * 16 + 2 * 4));
}

/* ---- bf16 compute: bf16 rows and the vdpbf16ps kernel --------------------------------------- */

/* Round to nearest even at bf16's precision, in double: 8 significant bits, quantum 2^-133 below
 * the smallest normal (bf16 has f32's exponent range), infinity past the largest finite bf16. */
static float bf16_round_ref(float v) {
    if (!isfinite(v) || v == 0.0f) return v;
    int e;
    frexp(v, &e); /* |v| in [2^(e-1), 2^e) */
    const double quantum = ldexp(1.0, e - 8 > -133 ? e - 8 : -133);
    const double r = nearbyint((double)v / quantum) * quantum;
    return fabs(r) >= 0x1p128 ? copysignf(INFINITY, v) : (float)r;
}

static uint32_t f32_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static float f32_of(uint32_t u) {
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static void test_round_bf16_rows(cv_threadpool *pool) {
    CHECK_EQ_INT(cv_act_bf16_stride(0), 0);
    CHECK_EQ_INT(cv_act_bf16_stride(1), 32);
    CHECK_EQ_INT(cv_act_bf16_stride(32), 32);
    CHECK_EQ_INT(cv_act_bf16_stride(33), 64);
    /* the edges, by bit pattern: the expected bf16 of each f32 */
    static const uint32_t edge_in[] = {
        0x3f808000u, /* 1 + 2^-8: a tie, the even neighbour (down) */
        0x3f818000u, /* a tie whose lower neighbour is odd: up */
        0x3f808001u, /* just above a tie: up */
        0x3f80ffffu, /* carries into the next bf16 */
        0x7f7fffffu, /* the largest float: rounds to infinity */
        0x7f800000u, 0xff800000u, /* ±inf */
        0x80000000u, /* -0 */
        0x00018000u, /* a subnormal tie: rounds to even (2 quanta), not flushed */
        0x807fffffu, /* the largest negative subnormal: rounds to -2^-126 */
        0x7f800001u, /* a signalling NaN: quieted, still NaN */
        0xffc12345u, /* a quiet NaN with payload and sign */
    };
    static const uint16_t edge_out[] = {0x3f80, 0x3f82, 0x3f81, 0x3f81, 0x7f80, 0x7f80, 0xff80,
                                        0x8000, 0x0002, 0x8080, 0x7fc0, 0xffc1};
    enum { N_EDGE = (int)CV_ARRAY_LEN(edge_in) };
    float edge[N_EDGE];
    for (int i = 0; i < N_EDGE; i++) edge[i] = f32_of(edge_in[i]);
    uint16_t out[2 * 32];
    for (int i = 0; i < 2 * 32; i++) out[i] = 0xaaaa; /* the padding must be written */
    cv_round_bf16_rows(NULL, edge, 6, 2, 6, out);     /* two rows of 6 */
    for (int i = 0; i < N_EDGE; i++) {
        const uint16_t got = out[(i / 6) * 32 + i % 6];
        CHECK_MSG(got == edge_out[i], "bf16 of 0x%08x: 0x%04x, not 0x%04x", edge_in[i], got, edge_out[i]);
        CHECK(isnan(edge[i]) == isnan(cv_bf16_to_f32(got)));
    }
    /* the specials again in a row without subnormals (AVX512-BF16's vcvtneps2bf16 rounds such rows;
     * a row holding a subnormal takes the integer route) */
    static const int special[] = {5, 6, 7, 10, 11, 0};
    float row[CV_ARRAY_LEN(special)];
    uint16_t row_out[32];
    for (size_t i = 0; i < CV_ARRAY_LEN(special); i++) row[i] = edge[special[i]];
    cv_round_bf16_rows(NULL, row, 6, 1, 6, row_out);
    for (size_t i = 0; i < CV_ARRAY_LEN(special); i++)
        CHECK_MSG(row_out[i] == edge_out[special[i]], "bf16 of 0x%08x beside no subnormal: 0x%04x, not 0x%04x",
                  edge_in[special[i]], row_out[i], edge_out[special[i]]);
    int bad_pad = 0;
    for (int r = 0; r < 2; r++)
        for (int c = 6; c < 32; c++) bad_pad += out[r * 32 + c] != 0;
    CHECK_MSG(bad_pad == 0, "bf16 rows: %d padding elements not zero", bad_pad);

    /* random rows of every magnitude, strided input, on the pool (large enough to split) and not */
    const int64_t m = 300, cols = 301, ldx = 307, stride = cv_act_bf16_stride(cols);
    float *x = cv_xmalloc((size_t)(m * ldx) * sizeof *x);
    for (int64_t i = 0; i < m * ldx; i++) x[i] = ldexpf(frand(), (int)(frand() * 140.0f));
    uint16_t *a = cv_xmalloc((size_t)(m * stride) * sizeof *a), *b = cv_xmalloc((size_t)(m * stride) * sizeof *b);
    memset(a, 0x55, (size_t)(m * stride) * sizeof *a);
    cv_round_bf16_rows(pool, x, ldx, m, cols, a);
    cv_round_bf16_rows(NULL, x, ldx, m, cols, b);
    int bad = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < stride; c++) {
            const float want = c < cols ? bf16_round_ref(x[r * ldx + c]) : 0.0f;
            const uint16_t got = a[r * stride + c];
            bad += f32_bits(cv_bf16_to_f32(got)) != f32_bits(want) || got != b[r * stride + c];
        }
    CHECK_MSG(bad == 0, "bf16 rows threads=%d: %d of %lld elements wrong", cv_threadpool_size(pool), bad,
              (long long)(m * stride));
    free(x);
    free(a);
    free(b);
}

/* One lane of vdpbf16ps as AMD Zen computes it, checked bit for bit against the instruction over
 * millions of random lanes (normal, subnormal, overflowing and cancelling): bf16 inputs and the
 * incoming sum read as zero when subnormal, the odd member's product added first, each add a fused
 * multiply-add rounded to nearest even (the product of two bf16 is exact in f32, so this is also
 * Intel's documented product-then-add), a subnormal result flushed to zero with its sign. The
 * kernel's outputs must equal this chain bit for bit. */
static float flush(float v) { return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v; }

static float dpbf16_lane(float acc, const uint16_t x[2], const uint16_t w[2]) {
    acc = flush(fmaf(flush(cv_bf16_to_f32(x[1])), flush(cv_bf16_to_f32(w[1])), flush(acc)));
    return flush(fmaf(flush(cv_bf16_to_f32(x[0])), flush(cv_bf16_to_f32(w[0])), acc));
}

/* FP8_PANELS on bf16 rows (avx512/panels_fp8_dot.c): per 128-column block, chain A over the first
 * k pair and chain B over the second of each 4 columns, from zero, the codes as the bf16 of their
 * value / 256 and zero past cols (as the activations are); then y ← fma(A + B, 256·scale, y). */
static float fp8_dot_reference(const test_stack *s, const uint16_t *xb, int64_t r) {
    const uint8_t *codes = (const uint8_t *)s->w.data + r * s->cols;
    float y = 0.0f;
    for (int64_t b0 = 0; b0 < s->cols; b0 += 128) {
        const int64_t b1 = b0 + 128 < s->cols ? b0 + 128 : s->cols;
        float a = 0.0f, b = 0.0f;
        for (int64_t k = b0; k < b1; k += 4) {
            uint16_t w[4];
            for (int q = 0; q < 4; q++)
                w[q] = k + q < s->cols ? cv_f32_to_bf16(cv_fp8_e4m3_to_f32(codes[k + q]) / 256.0f) : 0;
            a = dpbf16_lane(a, xb + k, w);
            b = dpbf16_lane(b, xb + k + 2, w + 2);
        }
        y = fmaf(a + b, stack_block_scale(s, r, b0) * 256.0f, y);
    }
    return y;
}

/* The bf16-input product of the stack's row r for the token's bf16 row: for bf16 weights one chain
 * over the pairs (zero past cols in both operands), for e4m3 ones fp8_dot_reference. */
static float dot_reference(const test_stack *s, const uint16_t *xb, int64_t r) {
    if (s->dtype == CV_DTYPE_F8_E4M3) return fp8_dot_reference(s, xb, r);
    const uint16_t *w = (const uint16_t *)s->w.data + r * s->cols;
    float acc = 0.0f;
    for (int64_t c = 0; c < s->cols; c += 2) {
        const uint16_t wp[2] = {w[c], c + 1 < s->cols ? w[c + 1] : 0};
        acc = dpbf16_lane(acc, xb + c, wp);
    }
    return acc;
}

/* cv_linear on bf16 rows of the first m tokens of xb against want [m][rows] (the reference),
 * bit for bit; y starts as garbage. */
static void check_dot(cv_threadpool *pool, const test_stack *s, const cv_weight *w, const float *x32,
                      const uint16_t *xb, int64_t m, const float *want, const char *what) {
    float *out = rand_vec(m * s->rows), *ys[4];
    for (int j = 0, r0 = 0; j < s->n_parts; r0 += (int)s->part_rows[j], j++) ys[j] = out + m * r0;
    /* f32 rows too: BF16_PANELS must read the bf16 ones */
    cv_linear(pool, w, &(cv_act){.f32 = x32, .bf16 = xb}, m, s->n_parts, s->part_rows, ys);
    int bad = 0;
    for (int j = 0, r0 = 0; j < s->n_parts; r0 += (int)s->part_rows[j], j++)
        for (int64_t t = 0; t < m; t++)
            for (int64_t c = 0; c < s->part_rows[j]; c++)
                bad += f32_bits(ys[j][t * s->part_rows[j] + c]) != f32_bits(want[t * s->rows + r0 + c]);
    CHECK_MSG(bad == 0, "bf16 dot %s %s M=%lld rows=%lld (%d parts) cols=%lld threads=%d: %d of %lld differ",
              cv_dtype_name(s->dtype), what, (long long)m, (long long)s->rows, s->n_parts, (long long)s->cols,
              cv_threadpool_size(pool), bad, (long long)(m * s->rows));
    free(out);
}

/* The oracle's outputs [m][rows] for the stack on xb rows, and the rows from f32 input. */
static float *dot_want(const test_stack *s, const uint16_t *xb, int64_t m) {
    const int64_t stride = cv_act_bf16_stride(s->cols);
    float *want = cv_xmalloc((size_t)(m * s->rows) * sizeof *want);
    for (int64_t t = 0; t < m; t++)
        for (int64_t r = 0; r < s->rows; r++) want[t * s->rows + r] = dot_reference(s, xb + t * stride, r);
    return want;
}

static uint16_t *bf16_rows_of(cv_threadpool *pool, const float *x, int64_t m, int64_t cols) {
    uint16_t *xb = cv_xmalloc((size_t)(m * cv_act_bf16_stride(cols)) * sizeof *xb);
    cv_round_bf16_rows(pool, x, cols, m, cols, xb);
    return xb;
}

/* A check of a bf16-input product of m tokens: x (f32) and xb (its bf16 rows) on the packed stack. */
typedef void (*bf16_check)(cv_threadpool *pool, const test_stack *s, const cv_weight *w, const float *x,
                           const uint16_t *xb, int64_t m);

/* The check on each odd shape of the f32 kernels (linear_cases), as packed weights of dtype. */
static void on_bf16_odd_shapes(cv_threadpool *pool, cv_dtype dtype, bf16_check check) {
    for (size_t i = 0; i < CV_ARRAY_LEN(linear_cases); i++) {
        const struct linear_case *lc = &linear_cases[i];
        test_stack s = make_stack(dtype, lc->part_rows, lc->n_parts, lc->cols, 128);
        cv_weight w;
        CHECK_EQ_INT(cv_weight_pack(pool, s.parts, s.n_parts, &w), 0);
        float *x = rand_vec(lc->m * lc->cols);
        uint16_t *xb = bf16_rows_of(pool, x, lc->m, lc->cols);
        check(pool, &s, &w, x, xb, lc->m);
        free(xb);
        free(x);
        cv_weight_release(&w);
        free_stack(&s);
    }
}

static void dot_odd_shape(cv_threadpool *pool, const test_stack *s, const cv_weight *w, const float *x,
                          const uint16_t *xb, int64_t m) {
    float *want = dot_want(s, xb, m);
    check_dot(pool, s, w, x, xb, m, want, "odd shape");
    free(want);
}

/* The vdpbf16ps kernel of dtype's packed format (bf16, or e4m3 with 128-blocks and a 256-block). */
static void test_bf16_dot(cv_threadpool *pool, cv_dtype dtype) {
    on_bf16_odd_shapes(pool, dtype, dot_odd_shape);
    /* three stacked parts (the last not whole panels), K over k blocks with a last partial group
     * (of pairs; of 4 codes); every M of 1..13 and 70, each against the same per-token reference
     * rows: a token's row is the same bits whatever it is batched with */
    const int64_t part_rows[] = {48, 16, 21}, cols = 2061, M = 70;
    test_stack s = make_stack(dtype, part_rows, 3, cols, dtype == CV_DTYPE_F8_E4M3 ? 256 : 128);
    cv_weight w;
    CHECK_EQ_INT(cv_weight_pack(pool, s.parts, 3, &w), 0);
    float *x = rand_vec(M * cols);
    uint16_t *xb = bf16_rows_of(pool, x, M, cols);
    float *want = dot_want(&s, xb, M);
    for (int64_t m = 1; m <= 13; m++) check_dot(pool, &s, &w, x, xb, m, want, "batch");
    check_dot(pool, &s, &w, x, xb, M, want, "batch");
    /* batch invariance directly: M = 1 rows (no k blocks) against the same rows inside M = 37 (k
     * blocks, split over tokens on a pool) */
    enum { M_BIG = 37 };
    float *big = cv_xmalloc((size_t)(M_BIG * s.rows) * sizeof *big), *one = cv_xmalloc((size_t)s.rows * sizeof *one);
    cv_linear(pool, &w, &(cv_act){.bf16 = xb}, M_BIG, 1, &w.rows, (float *[]){big});
    int differ = 0;
    const int64_t stride = cv_act_bf16_stride(cols);
    for (int64_t t = 0; t < M_BIG; t++) {
        cv_linear(pool, &w, &(cv_act){.bf16 = xb + t * stride}, 1, 1, &w.rows, (float *[]){one});
        differ += memcmp(one, big + t * s.rows, (size_t)s.rows * sizeof *one) != 0;
    }
    CHECK_MSG(differ == 0, "bf16 dot %s: %d of %d tokens differ between M=1 and M=%d (threads=%d)",
              cv_dtype_name(dtype), differ, M_BIG, M_BIG, cv_threadpool_size(pool));
    free(big);
    free(one);
    free(want);
    free(xb);
    free(x);
    cv_weight_release(&w);
    free_stack(&s);
}

/* cv_moe in bf16 compute against the definition built from cv_linear on bf16 rows, expert by
 * expert in id order: packed experts of dtype (bf16, or e4m3 where FP8 reads bf16 rows or not)
 * with gate|up stacked (e0, e2) or packed apart (e1), one whose down is an f32 view (e2: it reads
 * the f32 SwiGLU rows), one whose gate and up are f32 views before a packed down (e3); hidden and widths not multiples of 16 or 32; every fifth
 * token's second route skipped (a negative id). The same
 * bits: the rows are rounded as cv_round_bf16_rows rounds them, and each product is one chain. */
static void test_moe_bf16(cv_threadpool *pool, cv_dtype dtype) {
    enum { T = 29, H = 70, R = 2, E = 4 };
    static const int64_t inter[E] = {48, 37, 32, 20};
    test_stack gu[E], down[E];
    test_weights views[E][3];
    cv_weight wgu[E], wup[E], wdown[E], vgate[E], vup[E], vdown[E];
    cv_moe_expert ex[E];
    for (int e = 0; e < E; e++) {
        const int64_t two[] = {inter[e], inter[e]}, hidden[] = {H};
        gu[e] = make_stack(dtype, two, 2, H, 128);
        down[e] = make_stack(dtype, hidden, 1, inter[e], 128);
        for (int j = 0; j < 3; j++) views[e][j] = make_weights(CV_DTYPE_F32, inter[e] * H);
        vgate[e] = cv_weight_view(&(cv_matrix){views[e][0].data, CV_DTYPE_F32, inter[e], H});
        vup[e] = cv_weight_view(&(cv_matrix){views[e][1].data, CV_DTYPE_F32, inter[e], H});
        vdown[e] = cv_weight_view(&(cv_matrix){views[e][2].data, CV_DTYPE_F32, H, inter[e]});
        wgu[e] = wup[e] = (cv_weight){0};
        if (e == 0 || e == 2) CHECK_EQ_INT(cv_weight_pack(pool, gu[e].parts, 2, &wgu[e]), 0);
        if (e == 1) {
            CHECK_EQ_INT(cv_weight_pack(pool, &gu[e].parts[0], 1, &wgu[e]), 0);
            CHECK_EQ_INT(cv_weight_pack(pool, &gu[e].parts[1], 1, &wup[e]), 0);
        }
        CHECK_EQ_INT(cv_weight_pack(pool, down[e].parts, 1, &wdown[e]), 0);
        ex[e] = (cv_moe_expert){.inter = inter[e], .down = e == 2 ? &vdown[e] : &wdown[e]};
        if (e == 3) ex[e].gate = &vgate[e], ex[e].up = &vup[e];
        else ex[e].gate = &wgu[e], ex[e].up = e == 1 ? &wup[e] : &wgu[e], ex[e].up_row = e == 1 ? 0 : inter[e];
    }
    float *x = rand_vec(T * H), *weights = rand_vec(T * R), *y = rand_vec(T * H);
    float *want = cv_xmalloc(sizeof(float) * T * H);
    memcpy(want, y, sizeof(float) * T * H);
    int32_t ids[T * R];
    for (int t = 0; t < T; t++) ids[t * R] = t % E, ids[t * R + 1] = t % 5 ? (t + 1 + t % 3 % 2) % E : -1;
    /* the definition: per expert, its tokens in order, through cv_linear on bf16 rows; a negative id
     * is no route (expert parallelism: another rank's expert) */
    float *xs = cv_xmalloc(sizeof(float) * T * H), *g = cv_xmalloc(sizeof(float) * T * 48),
          *u = cv_xmalloc(sizeof(float) * T * 48), *o = cv_xmalloc(sizeof(float) * T * H);
    int32_t tok[T];
    float wt[T];
    for (int e = 0; e < E; e++) {
        int m = 0;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++)
                if (ids[t * R + r] == e) {
                    tok[m] = t, wt[m] = weights[t * R + r];
                    memcpy(xs + m * H, x + t * H, sizeof(float) * H);
                    m++;
                }
        if (!m) continue;
        uint16_t *xb = bf16_rows_of(NULL, xs, m, H);
        const cv_act xa = {.f32 = xs, .bf16 = xb};
        cv_linear_rows(ex[e].gate, &xa, m, 0, inter[e], g);
        cv_linear_rows(ex[e].up, &xa, m, ex[e].up_row, ex[e].up_row + inter[e], u);
        for (int i = 0; i < m; i++) cv_silu_mul(g + i * inter[e], g + i * inter[e], u + i * inter[e], inter[e]);
        uint16_t *hb = bf16_rows_of(NULL, g, m, inter[e]);
        cv_linear(NULL, ex[e].down, &(cv_act){.f32 = g, .bf16 = hb}, m, 1, &ex[e].down->rows, (float *[]){o});
        for (int i = 0; i < m; i++)
            for (int j = 0; j < H; j++) want[tok[i] * H + j] += wt[i] * o[i * H + j];
        free(xb);
        free(hb);
    }
    void *ws = cv_aligned_alloc(cv_moe_workspace_bytes(pool, T, R, H, 48, E, false, true));
    cv_moe(pool, &(cv_moe_args){.n_tokens = T, .hidden = H, .n_experts = E, .experts = ex, .routes = R, .ids = ids,
                                 .weights = weights, .x = x, .y = y, .workspace = ws, .bf16_input = true});
    int bad = 0;
    for (int i = 0; i < T * H; i++) bad += f32_bits(y[i]) != f32_bits(want[i]);
    CHECK_MSG(bad == 0, "cv_moe bf16 input, %s experts, threads=%d: %d of %d outputs differ from per-expert cv_linear",
              cv_dtype_name(dtype), cv_threadpool_size(pool), bad, T * H);
    free(ws);
    free(x);
    free(weights);
    free(y);
    free(want);
    free(xs);
    free(g);
    free(u);
    free(o);
    for (int e = 0; e < E; e++) {
        cv_weight_release(&wgu[e]);
        cv_weight_release(&wup[e]);
        cv_weight_release(&wdown[e]);
        free_stack(&gu[e]);
        free_stack(&down[e]);
        for (int j = 0; j < 3; j++) free_weights(&views[e][j]);
    }
}

/* The AMX bf16 product of the stack's rows for the first m tokens of xb (bf16 rows): within f32
 * rounding of the exact sum of the bf16 products (the tile unit adds a step's products in its own
 * order, so there is no bit-exact model), and every output's bits the same whatever the token
 * count: against `same` [m][rows] when given. Returns the outputs [m][rows]. */
static float *check_amx(cv_threadpool *pool, const test_stack *s, const cv_weight *w, const uint16_t *xb, int64_t m,
                        const float *same) {
    float *out = rand_vec(m * s->rows), *ys[4];
    for (int j = 0, r0 = 0; j < s->n_parts; r0 += (int)s->part_rows[j], j++) ys[j] = out + m * r0;
    cv_linear(pool, w, &(cv_act){.bf16 = xb}, m, s->n_parts, s->part_rows, ys);
    const int64_t stride = cv_act_bf16_stride(s->cols);
    float *rows = cv_xmalloc((size_t)(m * s->rows) * sizeof *rows);
    int bad = 0, differ = 0;
    double worst = 0;
    for (int j = 0, r0 = 0; j < s->n_parts; r0 += (int)s->part_rows[j], j++)
        for (int64_t t = 0; t < m; t++)
            for (int64_t c = 0; c < s->part_rows[j]; c++) {
                const float got = rows[t * s->rows + r0 + c] = ys[j][t * s->part_rows[j] + c];
                double ref = 0, mag = 0;
                for (int64_t e = 0; e < s->cols; e++) {
                    const double term = (double)cv_bf16_to_f32(xb[t * stride + e]) * s->w.exact[(r0 + c) * s->cols + e];
                    ref += term;
                    mag += fabs(term);
                }
                const double err = fabs(got - ref) / (mag + 1e-30);
                worst = fmax(worst, err);
                bad += err > 1e-5;
                if (same) differ += f32_bits(got) != f32_bits(same[t * s->rows + r0 + c]);
            }
    CHECK_MSG(bad == 0 && differ == 0, "amx bf16 M=%lld rows=%lld (%d parts) cols=%lld threads=%d: %d wrong (worst "
              "rel %.3g), %d differ from another token count", (long long)m, (long long)s->rows, s->n_parts,
              (long long)s->cols, cv_threadpool_size(pool), bad, worst, differ);
    free(out);
    return rows;
}

/* AMX tdpbf16ps on the odd shapes; then K across the kernel's k blocks with a partial last step,
 * stacked parts with a partial last panel, token counts across the 16-token tile halves, the 32-token
 * tile and the token block, each against the same bits as the largest product's rows (decode and
 * prefill agree, as does any thread split). */
static void amx_odd_shape(cv_threadpool *pool, const test_stack *s, const cv_weight *w, const float *x,
                          const uint16_t *xb, int64_t m) {
    free(check_amx(pool, s, w, xb, m, NULL));
}

static void test_amx_bf16(cv_threadpool *pool) {
    on_bf16_odd_shapes(pool, CV_DTYPE_BF16, amx_odd_shape);
    const int64_t part_rows[] = {48, 16, 21}, cols = 8231, M = 290;
    test_stack s = make_stack(CV_DTYPE_BF16, part_rows, 3, cols, 128);
    cv_weight w;
    CHECK_EQ_INT(cv_weight_pack(pool, s.parts, 3, &w), 0);
    float *x = rand_vec(M * cols);
    uint16_t *xb = bf16_rows_of(pool, x, M, cols);
    float *all = check_amx(pool, &s, &w, xb, M, NULL);
    static const int64_t ms[] = {1, 2, 15, 16, 17, 31, 32, 33, 70};
    for (size_t i = 0; i < CV_ARRAY_LEN(ms); i++) free(check_amx(pool, &s, &w, xb, ms[i], all));
    /* a lone token later in the batch: its row only */
    const int64_t stride = cv_act_bf16_stride(cols);
    free(check_amx(pool, &s, &w, xb + 200 * stride, 1, all + 200 * s.rows));
    free(all);
    free(xb);
    free(x);
    cv_weight_release(&w);
    free_stack(&s);
}

/* SwiGLU fused into gate|up (cv_linear_swiglu_bf16) gives the bits of the product into f32 rows and
 * then cv_swiglu_bf16, zero padding included: bf16 weights on the bf16-input kernel of the moment,
 * and FP8 (bf16 input where it reads it, else f32; block scales in the panels' aux data, reached
 * through the same panel stride); one token, several k blocks (on vdpbf16ps), more tokens than a token block, inter not a
 * multiple of 32. It declines a width not in whole panels and a row-major weight. */
static void test_swiglu_fused(cv_threadpool *pool) {
    static const int64_t shapes[][3] = {{48, 2061, 37}, {16, 64, 1}, {80, 130, 300}}; /* inter, cols, tokens */
    static const cv_dtype dtypes[] = {CV_DTYPE_BF16, CV_DTYPE_F8_E4M3};
    for (size_t d = 0; d < CV_ARRAY_LEN(dtypes); d++)
        for (size_t i = 0; i < CV_ARRAY_LEN(shapes); i++) {
            const int64_t inter = shapes[i][0], cols = shapes[i][1], m = shapes[i][2], ld = cv_act_bf16_stride(inter);
            const int64_t part_rows[] = {inter, inter};
            test_stack s = make_stack(dtypes[d], part_rows, 2, cols, 128);
            cv_weight w;
            CHECK_EQ_INT(cv_weight_pack(pool, s.parts, 2, &w), 0);
            float *x = rand_vec(m * cols), *gu = cv_xmalloc((size_t)(m * 2 * inter) * sizeof *gu);
            uint16_t *xb = bf16_rows_of(pool, x, m, cols);
            const cv_act act = {.f32 = x, .bf16 = xb}; /* a format reads the bf16 rows where it can */
            cv_linear(pool, &w, &act, m, 2, part_rows, (float *[]){gu, gu + m * inter});
            uint16_t *want = cv_xmalloc((size_t)(m * ld) * sizeof *want), *got = cv_xmalloc((size_t)(m * ld) * sizeof *got);
            cv_swiglu_bf16(pool, gu, m, inter, inter, m * inter, want);
            memset(got, 0xab, (size_t)(m * ld) * sizeof *got);
            CHECK(cv_linear_swiglu_bf16(pool, &w, &act, m, inter, got));
            CHECK_MSG(memcmp(got, want, (size_t)(m * ld) * sizeof *got) == 0,
                      "fused SwiGLU, %s weights, inter %lld, %lld columns, %lld tokens (%d threads)",
                      cv_dtype_name(dtypes[d]), (long long)inter, (long long)cols, (long long)m,
                      cv_threadpool_size(pool));
            CHECK(!cv_linear_swiglu_bf16(pool, &w, &act, m, inter - 8, got)); /* not whole panels */
            free(x), free(gu), free(xb), free(want), free(got);
            cv_weight_release(&w);
            free_stack(&s);
        }
    const cv_matrix rows = {rand_vec(64 * 8), CV_DTYPE_F32, 64, 8};
    const cv_weight view = cv_weight_view(&rows);
    float *x = rand_vec(8);
    uint16_t h[32];
    CHECK(!cv_linear_swiglu_bf16(pool, &view, &(cv_act){.f32 = x}, 1, 32, h));
    free(x), free((void *)rows.data);
}

/* The bf16-input path on every pool, where the CPU has AVX512-BF16 (else skipped with the reason);
 * it is never taken off the AVX-512 path or when switched off. vdpbf16ps runs with AMX switched off,
 * then AMX where the CPU has it. */
static void test_bf16_compute(cv_threadpool *const *pools, size_t n_pools) {
    if (!use_path((kernel_path){CV_ISA_AVX512, false, false}, false) || cv_cpu_bf16_dot_enable(true)) {
        printf("test_kernels: bf16 dot (AVX512-BF16 vdpbf16ps) skipped: %s\n", cv_error_message());
        return;
    }
    CHECK(cv_linear_bf16_input());
    CHECK(cv_format_gemm_bf16(CV_WFORMAT_BF16_PANELS) != NULL);
    CHECK(cv_format_gemm_bf16(CV_WFORMAT_I8_PANELS) == NULL && cv_format_gemm_bf16(CV_WFORMAT_BF16) == NULL);
    CHECK(cv_wformat_bf16_input(CV_WFORMAT_BF16_PANELS) && !cv_wformat_bf16_input(CV_WFORMAT_I8_PANELS));
    /* FP8 on vdpbf16ps needs the byte permutes of AVX512-VBMI */
    const bool fp8 = cv_cpu_avx512_vbmi();
    CHECK(cv_format_gemm_bf16(CV_WFORMAT_FP8_PANELS) == (fp8 ? &cv_avx512_panels_fp8_dot : NULL));
    CHECK(cv_wformat_bf16_input(CV_WFORMAT_FP8_PANELS) == fp8);
    if (!fp8) printf("test_kernels: FP8 on bf16 inputs (vdpbf16ps) skipped: this CPU has no AVX512-VBMI\n");
    const bool asks = cv_cpu_stream_asks();
    for (int ask = 0; ask <= 1; ask++) { /* the decode tiles with and without their asks ahead */
        cv_cpu_stream_asks_enable(ask);
        test_bf16_dot(pools[n_pools - 1], CV_DTYPE_BF16);
        if (fp8) test_bf16_dot(pools[n_pools - 1], CV_DTYPE_F8_E4M3);
    }
    cv_cpu_stream_asks_enable(asks);
    for (size_t p = 0; p < n_pools; p++) {
        test_bf16_dot(pools[p], CV_DTYPE_BF16);
        if (fp8) {
            test_bf16_dot(pools[p], CV_DTYPE_F8_E4M3);
            test_fp8_widening(pools[p], true);
        }
        test_moe_bf16(pools[p], CV_DTYPE_BF16);
        test_moe_bf16(pools[p], CV_DTYPE_F8_E4M3);
        test_swiglu_fused(pools[p]);
    }
    if (cv_isa_force(CV_ISA_AVX2) == 0) {
        CHECK(!cv_linear_bf16_input());
        CHECK(cv_format_gemm_bf16(CV_WFORMAT_BF16_PANELS) == NULL && cv_format_gemm_bf16(CV_WFORMAT_FP8_PANELS) == NULL);
        CHECK_EQ_INT(cv_isa_force(CV_ISA_AVX512), 0);
    }
    if (cv_cpu_amx_enable(true)) {
        printf("test_kernels: bf16 on AMX skipped: %s\n", cv_error_message());
    } else {
        CHECK(cv_format_gemm_bf16(CV_WFORMAT_BF16_PANELS) == &cv_amx_panels_bf16);
        CHECK(!cv_wformat_bf16_input(CV_WFORMAT_FP8_PANELS)); /* no tile kernel: f32 input */
        for (size_t p = 0; p < n_pools; p++) {
            test_amx_bf16(pools[p]);
            test_moe_bf16(pools[p], CV_DTYPE_BF16);
            test_moe_bf16(pools[p], CV_DTYPE_F8_E4M3);
            test_swiglu_fused(pools[p]);
        }
        CHECK_EQ_INT(cv_cpu_amx_enable(false), 0);
    }
    CHECK_EQ_INT(cv_cpu_bf16_dot_enable(false), 0);
    CHECK(!cv_linear_bf16_input());
    CHECK(cv_format_gemm_bf16(CV_WFORMAT_BF16_PANELS) == NULL);
}

/* ---- row-wise kernels ----------------------------------------------------------------------- */

/* The row max of the active path against the scalar rule, tails and passed-over NaNs included. */
static void test_row_max(void) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    for (int n = 1; n <= 41; n++) {
        float *x = rand_vec(n);
        if (n > 5) x[n / 2] = NAN;
        if (n > 9) x[n - 1] = 2.0f; /* the largest in a tail lane */
        float want = x[0];
        for (int i = 1; i < n; i++) want = x[i] > want ? x[i] : want;
        CHECK_MSG(ops->max(x, n) == want, "%s max of %d: %g, not %g", ops->name, n, (double)ops->max(x, n), (double)want);
        free(x);
    }
}

/* The norm and rotation steps and the fused bf16 numerators give the portable formulas' bits on
 * every ISA (this file is compiled without FMA, so its products round alone), at odd lengths, the
 * rotation in place too. */
static void test_row_ops(void) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    int bad = 0;
    for (int n = 1; n <= 37; n += 4) {
        float *x = rand_vec(2 * n), *w = rand_vec(n), *c = rand_vec(n), *sn = rand_vec(n), *y = rand_vec(2 * n);
        ops->rms_apply(y, x, w, n, 0.37f);
        for (int i = 0; i < n; i++) bad += y[i] != w[i] * (x[i] * 0.37f);
        ops->rotate_half(y, x, c, sn, n);
        for (int i = 0; i < n; i++) bad += y[i] != x[i] * c[i] - x[i + n] * sn[i] || y[i + n] != x[i + n] * c[i] + x[i] * sn[i];
        ops->rotate_half(x, x, c, sn, n);
        bad += memcmp(x, y, (size_t)(2 * n) * sizeof *x) != 0;
        if (ops->exp_sum_bf16) {
            float *e = rand_vec(n);
            uint16_t *eb = cv_xmalloc((size_t)n * sizeof *eb), *want = cv_xmalloc((size_t)n * sizeof *want);
            for (int i = 0; i < n; i++) x[i] = 4.0f * x[i] - (i == n / 2 ? 120.0f : 0.0f); /* one subnormal numerator */
            const float sum = ops->exp_sum(e, x, 2.0f, n), sum_b = ops->exp_sum_bf16(eb, x, 2.0f, n);
            ops->round_bf16(want, e, n);
            bad += sum != sum_b || memcmp(eb, want, (size_t)n * sizeof *eb) != 0;
            free(e), free(eb), free(want);
        }
        free(x), free(w), free(c), free(sn), free(y);
    }
    CHECK_MSG(bad == 0, "%s: rms_apply, rotate_half or exp_sum_bf16 off the portable bits (%d)", ops->name, bad);
}

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

/* The low-rank update against a double reference, and the same bits whatever rows are updated in
 * one call (runs of consecutive rows, single rows, scattered ones) and the pool. */
static void test_lowrank_add(cv_threadpool *pool) {
    const int64_t rank = 13, n = 600, ld = n + 5, m = 9; /* column blocks of 256, a partial last one */
    const int64_t rows[] = {0, 1, 2, 3, 4, 7, 8, 11, 10};  /* runs of 5 and 2, then out of order */
    float *h = rand_vec(m * rank), *bt = rand_vec(rank * n), *y0 = rand_vec(12 * ld);
    float *y = malloc((size_t)(12 * ld) * sizeof *y), *one = malloc((size_t)(12 * ld) * sizeof *one);
    memcpy(y, y0, (size_t)(12 * ld) * sizeof *y);
    memcpy(one, y0, (size_t)(12 * ld) * sizeof *one);
    cv_lowrank_add(pool, y, ld, rows, h, m, rank, bt, n);
    for (int64_t i = 0; i < m; i++) cv_lowrank_add(NULL, one, ld, &rows[i], h + i * rank, 1, rank, bt, n);
    int bad = 0, differ = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t o = 0; o < n; o++) {
            double ref = y0[rows[i] * ld + o];
            for (int64_t r = 0; r < rank; r++) ref += (double)h[i * rank + r] * bt[r * n + o];
            bad += fabs(y[rows[i] * ld + o] - ref) > 1e-5 * (fabs(ref) + 1);
        }
    for (int64_t k = 0; k < 12 * ld; k++) differ += memcmp(&y[k], &one[k], sizeof *y) != 0;
    CHECK_MSG(bad == 0, "lowrank_add (%s, %d threads): %d wrong", cv_isa_name(cv_isa_active()),
              cv_threadpool_size(pool), bad);
    CHECK_MSG(differ == 0, "lowrank_add (%s): %d elements differ between one call and a call a row", cv_isa_name(cv_isa_active()),
              differ);
    /* rows not listed are untouched (5, 6, 9 and the columns past n) */
    for (int64_t o = 0; o < ld; o++) CHECK(y[5 * ld + o] == y0[5 * ld + o] && y[9 * ld + o] == y0[9 * ld + o]);
    for (int64_t o = n; o < ld; o++) CHECK(y[0 * ld + o] == y0[0 * ld + o]);
    free(h);
    free(bt);
    free(y0);
    free(y);
    free(one);
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

/* ---- activation quantization ---------------------------------------------------------------- */

/* Hand-checked codes: ties to even, clamping at both ends, the static offset, a dynamic row with a
 * scale of exactly 1, a zero row; codes past cols are zero. */
static void test_quantize_rows(void) {
    enum { COLS = 7 };
    const int64_t stride = cv_act_i8_stride(COLS);
    CHECK_EQ_INT(stride % 4, 0);
    const float x[3][COLS + 1] = {
        {1.25f, 0.25f, -0.75f, 0.75f, 100.0f, -100.0f, 0.0f, 99.0f}, /* the last column is not part of the row */
        {2.5f, 3.5f, -2.5f, -127.0f, 127.0f, 0.49f, -1.5f, 99.0f},
        {0.0f, -0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 99.0f},
    };
    int8_t *q = cv_xmalloc((size_t)(3 * stride));
    float scale[3] = {-1.0f, -1.0f, -1.0f};
    /* static, scale 0.5 and offset 3: x / 0.5 + 3 = 5.5 6 | 3.5 4 | 1.5 2 | 4.5 4 | 203 127 | -197 -128 | 3 */
    memset(q, 0x55, (size_t)(3 * stride));
    const cv_act_quant st = {.dynamic = false, .scale = 0.5f, .offset = 3.0f};
    cv_quantize_rows(NULL, &st, &x[0][0], COLS + 1, 3, COLS, q, scale);
    const int8_t want_static[COLS] = {6, 4, 2, 4, 127, -128, 3};
    CHECK(memcmp(q, want_static, COLS) == 0);
    CHECK(scale[0] == 1.0f && scale[2] == 1.0f);
    CHECK(q[2 * stride] == 3); /* a zero row still gets the offset */
    /* dynamic: row 1 has max |x| = 127, so s = 1 and the codes are the rounded values */
    memset(q, 0x55, (size_t)(3 * stride));
    const cv_act_quant dyn = {.dynamic = true};
    cv_quantize_rows(NULL, &dyn, &x[0][0], COLS + 1, 3, COLS, q, scale);
    const int8_t want_dynamic[COLS] = {2, 4, -2, -127, 127, 0, -2};
    CHECK(memcmp(q + stride, want_dynamic, COLS) == 0);
    CHECK(scale[1] == 1.0f);
    CHECK(scale[0] == 100.0f / 127.0f && q[4] == 127 && q[5] == -127);
    CHECK(q[0] == (int8_t)rintf(1.25f / (100.0f / 127.0f)));
    CHECK(scale[2] == 0.0f);
    int nonzero = 0;
    for (int64_t r = 0; r < 3; r++)
        for (int64_t c = r == 2 ? 0 : COLS; c < stride; c++) nonzero += q[r * stride + c] != 0;
    CHECK_MSG(nonzero == 0, "%d codes of the zero row or of the padding are not 0", nonzero);
    /* a true division, not a product with 1/scale: next to a .5 the two round differently here */
    const float near_half[2] = {-0x1.3ae63p+1f, -0x1.382c3cp+1f}; /* x / s = -115.499992, -114.5 */
    const cv_act_quant odd_scale = {.dynamic = false, .scale = 0.0213f};
    cv_quantize_rows(NULL, &odd_scale, near_half, 2, 1, 2, q, scale);
    CHECK(q[0] == -115 && q[1] == -114);
    free(q);
}

/* The fused norm/SwiGLU + quantization against the unfused kernels, bit for bit, for both schemes,
 * with and without the f32 rows kept, parallel and not (41 × 403 values: past the size that splits
 * the rows of cv_quantize_rows over a pool too); and the fused bf16 rounding likewise. */
static void test_fused_quant(cv_threadpool *pool) {
    const int64_t rows = 41, dim = 403, stride = cv_act_i8_stride(dim);
    const cv_act_quant schemes[] = {{.dynamic = true}, {.dynamic = false, .scale = 0.02f, .offset = 5.0f}};
    float *x0 = rand_vec(rows * dim), *d = rand_vec(rows * dim), *w = rand_vec(dim);
    float *x_ref = cv_xmalloc((size_t)(rows * dim) * sizeof(float)), *x_fused = cv_xmalloc((size_t)(rows * dim) * sizeof(float));
    float *y_ref = rand_vec(rows * dim), *y_fused = rand_vec(rows * dim), *s_ref = rand_vec(rows), *s_fused = rand_vec(rows);
    int8_t *q_ref = cv_xmalloc((size_t)(rows * stride)), *q_fused = cv_xmalloc((size_t)(rows * stride));
    memset(x0 + 3 * dim, 0, (size_t)dim * sizeof(float)); /* a row that normalises to zeros */
    memset(d + 3 * dim, 0, (size_t)dim * sizeof(float));
    for (size_t s = 0; s < CV_ARRAY_LEN(schemes); s++)
        for (int keep = 0; keep < 2; keep++) {
            memcpy(x_ref, x0, (size_t)(rows * dim) * sizeof(float));
            memcpy(x_fused, x0, (size_t)(rows * dim) * sizeof(float));
            cv_add_rmsnorm(pool, x_ref, d, y_ref, w, rows, dim, 1e-6f);
            cv_quantize_rows(NULL, &schemes[s], y_ref, dim, rows, dim, q_ref, s_ref);
            memset(q_fused, 0x55, (size_t)(rows * stride));
            cv_add_rmsnorm_quant(pool, x_fused, d, keep ? y_fused : NULL, w, rows, dim, 1e-6f, &schemes[s], q_fused,
                                 s_fused);
            CHECK(memcmp(x_ref, x_fused, (size_t)(rows * dim) * sizeof(float)) == 0);
            CHECK(!keep || memcmp(y_ref, y_fused, (size_t)(rows * dim) * sizeof(float)) == 0);
            CHECK_MSG(memcmp(q_ref, q_fused, (size_t)(rows * stride)) == 0 && memcmp(s_ref, s_fused, (size_t)rows * 4) == 0,
                      "%s add_rmsnorm_quant (%s, keep %d, %d threads) differs from add_rmsnorm + quantize_rows",
                      active_path, schemes[s].dynamic ? "dynamic" : "static", keep, cv_threadpool_size(pool));
            if (keep) continue;
            /* the unfused quantization on the pool (its rows split over the threads) */
            memset(q_fused, 0x55, (size_t)(rows * stride));
            cv_quantize_rows(pool, &schemes[s], y_ref, dim, rows, dim, q_fused, s_fused);
            CHECK_MSG(memcmp(q_ref, q_fused, (size_t)(rows * stride)) == 0 && memcmp(s_ref, s_fused, (size_t)rows * 4) == 0,
                      "%s quantize_rows (%s, %d threads) differs from one thread's", active_path,
                      schemes[s].dynamic ? "dynamic" : "static", cv_threadpool_size(pool));
        }
    /* SwiGLU: gate | up | 3 unused columns, values large enough to saturate the sigmoid and the codes */
    const int64_t n = 517, ld = 2 * n + 3, hstride = cv_act_i8_stride(n);
    float *gu = rand_vec(rows * ld), *h = rand_vec(rows * n), *hs_ref = rand_vec(rows), *hs_fused = rand_vec(rows);
    int8_t *hq_ref = cv_xmalloc((size_t)(rows * hstride)), *hq_fused = cv_xmalloc((size_t)(rows * hstride));
    for (int64_t i = 0; i < rows * ld; i++) gu[i] *= 12.0f;
    memset(gu + 5 * ld, 0, (size_t)(2 * n) * sizeof(float)); /* a zero row */
    for (size_t s = 0; s < CV_ARRAY_LEN(schemes); s++) {
        cv_swiglu(pool, h, gu, rows, n, ld, n);
        cv_quantize_rows(NULL, &schemes[s], h, n, rows, n, hq_ref, hs_ref);
        memset(hq_fused, 0x55, (size_t)(rows * hstride));
        cv_swiglu_quant(pool, gu, rows, n, ld, n, &schemes[s], hq_fused, hs_fused);
        CHECK_MSG(memcmp(hq_ref, hq_fused, (size_t)(rows * hstride)) == 0 && memcmp(hs_ref, hs_fused, (size_t)rows * 4) == 0,
                  "%s swiglu_quant (%s, %d threads) differs from swiglu + quantize_rows", active_path,
                  schemes[s].dynamic ? "dynamic" : "static", cv_threadpool_size(pool));
        if (schemes[s].dynamic) CHECK(hs_fused[5] == 0.0f && hq_fused[5 * hstride] == 0);
    }
    /* the bf16 forms: cv_round_bf16_rows of the unfused output, padding included (poisoned first) */
    const int64_t bstride = cv_act_bf16_stride(dim), hbstride = cv_act_bf16_stride(n);
    uint16_t *b_ref = cv_xmalloc((size_t)(rows * bstride) * 2), *b_fused = cv_xmalloc((size_t)(rows * bstride) * 2);
    uint16_t *hb_ref = cv_xmalloc((size_t)(rows * hbstride) * 2), *hb_fused = cv_xmalloc((size_t)(rows * hbstride) * 2);
    memcpy(x_ref, x0, (size_t)(rows * dim) * sizeof(float));
    memcpy(x_fused, x0, (size_t)(rows * dim) * sizeof(float));
    cv_add_rmsnorm(pool, x_ref, d, y_ref, w, rows, dim, 1e-6f);
    cv_round_bf16_rows(NULL, y_ref, dim, rows, dim, b_ref);
    memset(b_fused, 0x55, (size_t)(rows * bstride) * 2);
    cv_add_rmsnorm_bf16(pool, x_fused, d, y_fused, w, rows, dim, 1e-6f, b_fused);
    CHECK(memcmp(x_ref, x_fused, (size_t)(rows * dim) * sizeof(float)) == 0);
    CHECK(memcmp(y_ref, y_fused, (size_t)(rows * dim) * sizeof(float)) == 0);
    CHECK_MSG(memcmp(b_ref, b_fused, (size_t)(rows * bstride) * 2) == 0,
              "%s add_rmsnorm_bf16 (%d threads) differs from add_rmsnorm + round_bf16_rows", active_path,
              cv_threadpool_size(pool));
    cv_swiglu(pool, h, gu, rows, n, ld, n);
    cv_round_bf16_rows(NULL, h, n, rows, n, hb_ref);
    memset(hb_fused, 0x55, (size_t)(rows * hbstride) * 2);
    cv_swiglu_bf16(pool, gu, rows, n, ld, n, hb_fused);
    CHECK_MSG(memcmp(hb_ref, hb_fused, (size_t)(rows * hbstride) * 2) == 0,
              "%s swiglu_bf16 (%d threads) differs from swiglu + round_bf16_rows", active_path, cv_threadpool_size(pool));
    free(b_ref);
    free(b_fused);
    free(hb_ref);
    free(hb_fused);
    free(x0);
    free(d);
    free(w);
    free(x_ref);
    free(x_fused);
    free(y_ref);
    free(y_fused);
    free(s_ref);
    free(s_fused);
    free(q_ref);
    free(q_fused);
    free(gu);
    free(h);
    free(hs_ref);
    free(hs_fused);
    free(hq_ref);
    free(hq_fused);
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
    cv_rope_cos_sin(NULL, &rope, positions, n, c, s);
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

/* Fused q/k norm + rope against the two unfused kernels, strided source (a fused qkv row) and in
 * place; and the cos/sin of a prompt's positions on the pool against one thread's. */
static void test_rmsnorm_rope(cv_threadpool *pool) {
    cv_rope_params p = {.kind = CV_ROPE_KIND_DEFAULT, .theta = 1e6, .factor = 1, .rot_dim = 30};
    cv_rope rope;
    CHECK_EQ_INT(cv_rope_init(&rope, &p), 0);
    const int n_heads = 5, hd = 34, half = 15;
    {
        enum { MANY = 100 }; /* 1500 entries: past the size that splits them over a pool */
        int32_t many[MANY];
        for (int i = 0; i < MANY; i++) many[i] = 37 * i + 5;
        float *c1 = rand_vec(MANY * half), *s1 = rand_vec(MANY * half), *c2 = rand_vec(MANY * half), *s2 = rand_vec(MANY * half);
        cv_rope_cos_sin(NULL, &rope, many, MANY, c1, s1);
        cv_rope_cos_sin(pool, &rope, many, MANY, c2, s2);
        CHECK_MSG(memcmp(c1, c2, sizeof(float) * MANY * half) == 0 && memcmp(s1, s2, sizeof(float) * MANY * half) == 0,
                  "rope cos/sin of %d positions on %d threads differ from one thread's", MANY, cv_threadpool_size(pool));
        free(c1);
        free(s1);
        free(c2);
        free(s2);
    }
    const int64_t n = 19, ld_src = n_heads * hd + 7;
    int32_t positions[19];
    for (int i = 0; i < 19; i++) positions[i] = 3 * i + 1;
    float *src = rand_vec(n * ld_src), *w = rand_vec(hd), *dst = rand_vec(n * n_heads * hd);
    float *c = cv_xmalloc((size_t)(n * half) * sizeof *c), *s = cv_xmalloc((size_t)(n * half) * sizeof *s);
    cv_rope_cos_sin(NULL, &rope, positions, n, c, s);
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
    /* scaled and rounded to bf16: the f32 results times the scale, rounded */
    uint16_t *qb = cv_xmalloc((size_t)(n * n_heads * hd) * sizeof *qb);
    cv_rmsnorm_rope_bf16(pool, &rope, qb, n_heads * hd, src, ld_src, n, n_heads, hd, w, 1e-6f, c, s, 0.3f);
    int bad = 0;
    for (int64_t i = 0; i < n * n_heads * hd; i++) bad += qb[i] != cv_f32_to_bf16(ref[i] * 0.3f);
    CHECK_MSG(bad == 0, "rmsnorm_rope_bf16 (%s): %d values off", cv_isa_name(cv_isa_active()), bad);
    free(qb);
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

/* Element e of KV head g's K or V (value) at slot in a's cache, widened. */
static double cache_at(const cv_attention_args *a, bool value, int64_t slot, int g, int e) {
    const void *cache = value ? a->v_cache : a->k_cache;
    const int64_t i = cv_kv_index(a->kv_dtype, value, slot, g, e, a->n_kv_heads, a->head_dim, a->block_size);
    return a->kv_dtype == CV_DTYPE_BF16 ? cv_bf16_to_f32(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
}

/* Reference: gather the sequence's context in order, then a two-pass softmax in double. */
static void ref_attention(const cv_attention_args *a, int32_t t, int32_t s, double *out) {
    const int nh = a->n_heads, hd = a->head_dim, bs = a->block_size, group = nh / a->n_kv_heads;
    const int n_ctx = a->positions[t] + 1;
    double *score = cv_xmalloc((size_t)n_ctx * sizeof *score);
    for (int h = 0; h < nh; h++) {
        const float *q = a->q + ((int64_t)t * nh + h) * hd;
        int g = h / group;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n_ctx; j++) {
            int64_t slot = (int64_t)a->block_tables[s][j / bs] * bs + j % bs;
            double d = 0;
            for (int e = 0; e < hd; e++) d += (double)q[e] * cache_at(a, false, slot, g, e);
            score[j] = d * a->scale;
            mx = fmax(mx, score[j]);
        }
        for (int j = 0; j < n_ctx; j++) sum += score[j] = exp(score[j] - mx);
        for (int e = 0; e < hd; e++) {
            double o = 0;
            for (int j = 0; j < n_ctx; j++) {
                int64_t slot = (int64_t)a->block_tables[s][j / bs] * bs + j % bs;
                o += score[j] / sum * cache_at(a, true, slot, g, e);
            }
            out[h * hd + e] = o;
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

/* The batch of the bf16 attention tests: 37 tokens at 480..516 (across the edge of AMX's 512-position
 * chunk, several query blocks, and on AMX several 32-row groups whose causal end falls inside the
 * tile); one decode token at 600 (ten tiles of 64, five of AMX's 128, two chunks); position 0
 * alone; 6 tokens at 60..65 (across the first 64-position tile's edge); in blocks of bs slots (7:
 * partial blocks and tiles, pairs across blocks; 16: the engine's default, K and V read in place by
 * the bf16 dot products; 32: two K panels a block, read in place; 40: a last K panel of 8 rows, K
 * gathered) scattered over the cache. */
enum { ATT_MAX_BS = 40, ATT_BLOCKS = 192, ATT_T = 45, ATT_SEQS = 4 };
typedef struct attention_batch {
    int bs, slots;
    int32_t seq_start[ATT_SEQS + 1], positions[ATT_T], tables[ATT_SEQS][96];
    const int32_t *table_rows[ATT_SEQS];
    int64_t identity[ATT_MAX_BS * ATT_BLOCKS]; /* slot i for row i: cv_kv_write of the whole cache */
} attention_batch;

static void attention_batch_init(attention_batch *b, int bs) {
    static const int32_t seq_start[ATT_SEQS + 1] = {0, 37, 38, 39, ATT_T}, first_pos[ATT_SEQS] = {480, 600, 0, 60};
    CHECK(bs <= ATT_MAX_BS);
    b->bs = bs, b->slots = bs * ATT_BLOCKS;
    memcpy(b->seq_start, seq_start, sizeof seq_start);
    int next_block = 0;
    for (int s = 0; s < ATT_SEQS; s++) {
        for (int32_t t = seq_start[s]; t < seq_start[s + 1]; t++) b->positions[t] = first_pos[s] + t - seq_start[s];
        for (int k = 0; k * bs <= b->positions[seq_start[s + 1] - 1]; k++)
            b->tables[s][k] = (next_block++ * 37 + 5) % ATT_BLOCKS;
        b->table_rows[s] = b->tables[s];
    }
    CHECK(next_block <= ATT_BLOCKS);
    for (int i = 0; i < b->slots; i++) b->identity[i] = i;
}

/* The args of the whole batch (f32 cache, no output yet). */
static cv_attention_args attention_batch_args(const attention_batch *b, int nh, int nkv, int hd, const float *q) {
    return (cv_attention_args){.n_tokens = ATT_T, .n_seqs = ATT_SEQS, .seq_start = b->seq_start,
                               .positions = b->positions, .block_tables = b->table_rows, .block_size = b->bs,
                               .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
                               .scale = 1.0f / sqrtf((float)hd), .q = q};
}

/* a's batch again, each sequence alone and in chunks of 5, into out. */
static void attention_batch_split(cv_threadpool *pool, const attention_batch *b, const cv_attention_args *a,
                                  float *out) {
    const int64_t row = (int64_t)a->n_heads * a->head_dim;
    for (int s = 0; s < ATT_SEQS; s++)
        for (int32_t t0 = b->seq_start[s]; t0 < b->seq_start[s + 1]; t0 += 5) {
            const int32_t n = b->seq_start[s + 1] - t0 < 5 ? b->seq_start[s + 1] - t0 : 5, one[2] = {0, n};
            cv_attention_args c = *a;
            c.n_tokens = n, c.n_seqs = 1, c.seq_start = one, c.positions = b->positions + t0;
            c.block_tables = b->table_rows + s, c.q = a->q + t0 * row, c.out = out + t0 * row;
            if (a->k_new) { /* the chunk's own rows */
                const int64_t kv_row = (int64_t)a->n_kv_heads * a->head_dim;
                c.k_new = a->k_new + t0 * kv_row, c.v_new = a->v_new + t0 * kv_row, c.slot_mapping = a->slot_mapping + t0;
            }
            cv_attention(pool, &c);
        }
}

/* A bf16 KV cache: attention is bit for bit the f32 attention over an f32 cache holding the widened
 * bf16 values, for GQA groups of 1, 3, 7 and 2 (odd head_dim too), contexts of several 64-position
 * tiles in 7-slot blocks (partial blocks and tiles) and 40-slot ones (a partial K panel), and the
 * batch split per sequence and in chunks; and it is attention: within 1e-5 of the double reference on
 * those values. */
static void attention_bf16_cache(cv_threadpool *pool, int bs) {
    static const int shapes[][3] = {{3, 1, 19}, {9, 3, 40}, {7, 7, 32}, {14, 2, 128}}; /* heads, KV heads, head_dim */
    attention_batch batch;
    attention_batch_init(&batch, bs);
    for (size_t sh = 0; sh < CV_ARRAY_LEN(shapes); sh++) {
        const int nh = shapes[sh][0], nkv = shapes[sh][1], hd = shapes[sh][2];
        const int64_t width = (int64_t)nkv * hd, cache = batch.slots * width, rows = (int64_t)ATT_T * nh * hd;
        float *k = rand_vec(cache), *v = rand_vec(cache), *q = rand_vec(rows);
        for (int64_t i = 0; i < rows; i++) q[i] *= 3.0f; /* peaky softmax */
        uint16_t *kb = cv_xmalloc((size_t)cache * sizeof *kb), *vb = cv_xmalloc((size_t)cache * sizeof *vb);
        cv_kv_write(pool, kb, vb, CV_DTYPE_BF16, k, v, batch.identity, batch.slots, nkv, hd, batch.bs);
        for (int64_t slot = 0; slot < batch.slots; slot++) /* the f32 cache of the same values, in its own layout */
            for (int g = 0; g < nkv; g++)
                for (int d = 0; d < hd; d++) {
                    k[cv_kv_index(CV_DTYPE_F32, false, slot, g, d, nkv, hd, batch.bs)] =
                        cv_bf16_to_f32(kb[cv_kv_index(CV_DTYPE_BF16, false, slot, g, d, nkv, hd, batch.bs)]);
                    v[cv_kv_index(CV_DTYPE_F32, true, slot, g, d, nkv, hd, batch.bs)] =
                        cv_bf16_to_f32(vb[cv_kv_index(CV_DTYPE_BF16, true, slot, g, d, nkv, hd, batch.bs)]);
                }
        float *out_f = rand_vec(rows), *out_b = rand_vec(rows), *out_split = rand_vec(rows);
        cv_attention_args a = attention_batch_args(&batch, nh, nkv, hd, q);
        a.kv_dtype = CV_DTYPE_F32, a.k_cache = k, a.v_cache = v, a.out = out_f;
        cv_attention(pool, &a);
        cv_attention_args ab = a;
        ab.kv_dtype = CV_DTYPE_BF16, ab.k_cache = kb, ab.v_cache = vb, ab.out = out_b;
        cv_attention(pool, &ab);
        attention_batch_split(pool, &batch, &ab, out_split);
        CHECK_MSG(memcmp(out_b, out_f, (size_t)rows * sizeof *out_b) == 0 &&
                      memcmp(out_split, out_b, (size_t)rows * sizeof *out_b) == 0,
                  "bf16 KV attention %d/%d heads, head_dim %d, %d-slot blocks (%s, %d threads): not the f32 bits "
                  "(batched %d, split %d)", nh, nkv, hd, bs, cv_isa_name(cv_isa_active()), cv_threadpool_size(pool),
                  memcmp(out_b, out_f, (size_t)rows * sizeof *out_b) != 0,
                  memcmp(out_split, out_b, (size_t)rows * sizeof *out_b) != 0);
        double *ref = cv_xmalloc((size_t)nh * hd * sizeof *ref), worst = 0;
        for (int s = 0; s < ATT_SEQS; s++)
            for (int32_t t = batch.seq_start[s]; t < batch.seq_start[s + 1]; t++) {
                ref_attention(&ab, t, s, ref);
                for (int i = 0; i < nh * hd; i++) worst = fmax(worst, fabs(out_b[(int64_t)t * nh * hd + i] - ref[i]));
            }
        CHECK_MSG(worst <= 1e-5, "bf16 KV attention %d/%d heads, head_dim %d, %d-slot blocks: %g from the reference",
                  nh, nkv, hd, bs, worst);
        free(ref);
        free(k), free(v), free(q), free(kb), free(vb), free(out_f), free(out_b), free(out_split);
    }
}

/* Attention given its batch's own K and V rows (k_new) stores them as cv_kv_write does before it
 * reads them: the caches' bytes and the output's bits are those of cv_kv_write then attention, for
 * the whole batch (its 37-token sequence is several units a KV head where the GQA group is large:
 * the rows stored before the units) and split per sequence in chunks of 5 (a unit a KV head, which
 * stores that head's rows itself: a decode batch's way). f32 and bf16 caches, bf16 dot products
 * where `dot`. */
static void attention_new_rows(cv_threadpool *pool, int bs, cv_dtype dtype, bool dot) {
    static const int shapes[][3] = {{3, 1, 20}, {7, 7, 32}, {16, 2, 128}}; /* heads, KV heads, head_dim */
    attention_batch batch;
    attention_batch_init(&batch, bs);
    const size_t el = dtype == CV_DTYPE_BF16 ? 2 : 4;
    int64_t slot[ATT_T];
    for (int s = 0; s < ATT_SEQS; s++)
        for (int32_t t = batch.seq_start[s]; t < batch.seq_start[s + 1]; t++)
            slot[t] = (int64_t)batch.tables[s][batch.positions[t] / bs] * bs + batch.positions[t] % bs;
    for (size_t sh = 0; sh < CV_ARRAY_LEN(shapes); sh++) {
        const int nh = shapes[sh][0], nkv = shapes[sh][1], hd = shapes[sh][2];
        const int64_t width = (int64_t)nkv * hd, cache = batch.slots * width, rows = (int64_t)ATT_T * nh * hd;
        float *k = rand_vec(cache), *v = rand_vec(cache), *q = rand_vec(rows), *noise = rand_vec(ATT_T * width);
        float *kn = cv_xmalloc((size_t)(ATT_T * width) * sizeof *kn), *vn = cv_xmalloc((size_t)(ATT_T * width) * sizeof *vn);
        for (int t = 0; t < ATT_T; t++) { /* the batch's rows: the values the reference has at their slots */
            memcpy(kn + t * width, k + slot[t] * width, (size_t)width * sizeof *kn);
            memcpy(vn + t * width, v + slot[t] * width, (size_t)width * sizeof *vn);
        }
        void *want_k = cv_xmalloc((size_t)cache * el), *want_v = cv_xmalloc((size_t)cache * el);
        void *got_k = cv_xmalloc((size_t)cache * el), *got_v = cv_xmalloc((size_t)cache * el);
        cv_kv_write(pool, want_k, want_v, dtype, k, v, batch.identity, batch.slots, nkv, hd, bs);
        float *want = rand_vec(rows), *got = rand_vec(rows);
        cv_attention_args a = attention_batch_args(&batch, nh, nkv, hd, q);
        a.kv_dtype = dtype, a.k_cache = want_k, a.v_cache = want_v, a.bf16_dot = dot, a.out = want;
        cv_attention(pool, &a);
        cv_attention_args g = a;
        g.k_cache = got_k, g.v_cache = got_v, g.k_new = kn, g.v_new = vn, g.slot_mapping = slot, g.out = got;
        for (int split = 0; split < 2; split++) {
            memcpy(got_k, want_k, (size_t)cache * el), memcpy(got_v, want_v, (size_t)cache * el);
            cv_kv_write(pool, got_k, got_v, dtype, noise, noise, slot, ATT_T, nkv, hd, bs); /* not the rows */
            memset(got, 0, (size_t)rows * sizeof *got);
            if (split) attention_batch_split(pool, &batch, &g, got);
            else cv_attention(pool, &g);
            CHECK_MSG(memcmp(got, want, (size_t)rows * sizeof *got) == 0 &&
                          memcmp(got_k, want_k, (size_t)cache * el) == 0 && memcmp(got_v, want_v, (size_t)cache * el) == 0,
                      "attention storing its rows (%s cache%s, %d-slot blocks, %d/%d heads, head_dim %d, %s, %d "
                      "threads, %s): output %d, K %d, V %d differ", dtype == CV_DTYPE_BF16 ? "bf16" : "f32",
                      dot ? ", bf16 dot" : "", bs, nh, nkv, hd, cv_isa_name(cv_isa_active()), cv_threadpool_size(pool),
                      split ? "split" : "batched", memcmp(got, want, (size_t)rows * sizeof *got) != 0,
                      memcmp(got_k, want_k, (size_t)cache * el) != 0, memcmp(got_v, want_v, (size_t)cache * el) != 0);
        }
        free(k), free(v), free(q), free(noise), free(kn), free(vn), free(want_k), free(want_v), free(got_k), free(got_v);
        free(want), free(got);
    }
}

static void test_attention_new_rows(cv_threadpool *pool) {
    attention_new_rows(pool, 16, CV_DTYPE_F32, false);
    attention_new_rows(pool, 7, CV_DTYPE_BF16, false);
    attention_new_rows(pool, 16, CV_DTYPE_BF16, false);
    if (!cv_cpu_ops_active()->gemm_rows_dot || cv_cpu_bf16_dot_enable(true)) {
        printf("test_kernels: attention storing its rows with bf16 dot products skipped on %s: %s\n",
               cv_isa_name(cv_isa_active()),
               cv_cpu_ops_active()->gemm_rows_dot ? cv_error_message() : "no bf16 dot product on this path");
        return;
    }
    CHECK_EQ_INT(cv_cpu_amx_enable(false), 0);
    attention_new_rows(pool, 16, CV_DTYPE_BF16, true);
    attention_new_rows(pool, 40, CV_DTYPE_BF16, true);
    if (cv_cpu_amx_enable(true)) {
        printf("test_kernels: AMX attention storing its rows skipped: %s\n", cv_error_message());
        return;
    }
    attention_new_rows(pool, 16, CV_DTYPE_BF16, true);
    CHECK_EQ_INT(cv_cpu_amx_enable(false), 0);
}

static void test_attention_bf16_cache(cv_threadpool *pool) {
    attention_bf16_cache(pool, 7);
    attention_bf16_cache(pool, 40);
}

/* Attention with bf16 dot products (bf16 compute over a bf16 cache): within bf16's rounding of the
 * scaled query and of the softmax numerators from a double reference that rounds the query the same
 * way (numerators are rounded against the running max of the online softmax, the reference's
 * against the final one, so only the size of that error can be bounded: 2⁻⁸ of max |V| = 1);
 * not the f32 tile products' bits; and the same bits batched, per sequence and in chunks of 5.
 * Skipped where the ISA path or the CPU has no bf16 dot product. */
/* The bf16-dot attention on the active kernels (path: their name) against the f32 one and the reference. */
static void attention_bf16_dot(cv_threadpool *pool, const char *path, int bs) {
    static const int shapes[][3] = {{9, 3, 40}, {7, 7, 32}, {14, 2, 128}, {16, 2, 256}}; /* heads, KV heads, head_dim */
    attention_batch batch;
    attention_batch_init(&batch, bs);
    for (size_t sh = 0; sh < CV_ARRAY_LEN(shapes); sh++) {
        const int nh = shapes[sh][0], nkv = shapes[sh][1], hd = shapes[sh][2];
        const int64_t width = (int64_t)nkv * hd, cache = batch.slots * width, rows = (int64_t)ATT_T * nh * hd;
        float *k = rand_vec(cache), *v = rand_vec(cache), *q = rand_vec(rows), *q_rounded = rand_vec(rows);
        for (int64_t i = 0; i < rows; i++) q[i] *= 3.0f; /* peaky softmax */
        const float scale = 1.0f / sqrtf((float)hd);
        /* the reference's query: what the kernel rounds (q · scale), divided back by the scale */
        for (int64_t i = 0; i < rows; i++) q_rounded[i] = (float)((double)cv_bf16_to_f32(cv_f32_to_bf16(q[i] * scale)) / scale);
        uint16_t *kb = cv_xmalloc((size_t)cache * sizeof *kb), *vb = cv_xmalloc((size_t)cache * sizeof *vb);
        cv_kv_write(pool, kb, vb, CV_DTYPE_BF16, k, v, batch.identity, batch.slots, nkv, hd, batch.bs);
        float *out_f = rand_vec(rows), *out_d = rand_vec(rows), *out_split = rand_vec(rows);
        cv_attention_args a = attention_batch_args(&batch, nh, nkv, hd, q);
        a.kv_dtype = CV_DTYPE_BF16, a.k_cache = kb, a.v_cache = vb, a.out = out_f;
        cv_attention(pool, &a);
        cv_attention_args ad = a;
        ad.bf16_dot = true, ad.out = out_d;
        cv_attention(pool, &ad);
        attention_batch_split(pool, &batch, &ad, out_split);
        CHECK_MSG(memcmp(out_split, out_d, (size_t)rows * sizeof *out_d) == 0,
                  "%s attention (%d-slot blocks) %d/%d heads, head_dim %d (%d threads): batched and split differ", path,
                  bs, nh, nkv, hd, cv_threadpool_size(pool));
        CHECK_MSG(memcmp(out_f, out_d, (size_t)rows * sizeof *out_d) != 0,
                  "%s attention (%d-slot blocks) %d/%d heads, head_dim %d: the f32 tile products' bits", path, bs, nh,
                  nkv, hd);
        { /* the query given scaled and rounded (cv_rmsnorm_rope_bf16's rows): the same output */
            uint16_t *qb = cv_xmalloc((size_t)rows * sizeof *qb);
            for (int64_t i = 0; i < rows; i++) qb[i] = cv_f32_to_bf16(q[i] * scale);
            float *out_q = rand_vec(rows);
            cv_attention_args aq = ad;
            aq.q = NULL, aq.q_bf16 = qb, aq.out = out_q;
            cv_attention(pool, &aq);
            CHECK_MSG(memcmp(out_q, out_d, (size_t)rows * sizeof *out_d) == 0,
                      "%s attention (%d-slot blocks) %d/%d heads, head_dim %d: bf16 query rows", path, bs, nh, nkv, hd);
            free(qb), free(out_q);
        }
        if (nh * hd % 32 == 0) { /* bf16 output rows: the f32 output's, rounded */
            uint16_t *ob = cv_xmalloc((size_t)rows * sizeof *ob), *want = cv_xmalloc((size_t)rows * sizeof *want);
            cv_attention_args ab = ad;
            ab.out = NULL, ab.out_bf16 = ob;
            cv_attention(pool, &ab);
            cv_round_bf16_rows(NULL, out_d, nh * hd, ATT_T, nh * hd, want);
            CHECK_MSG(memcmp(ob, want, (size_t)rows * sizeof *ob) == 0,
                      "%s attention (%d-slot blocks) %d/%d heads, head_dim %d: bf16 output", path, bs, nh, nkv, hd);
            free(ob), free(want);
        }
        cv_attention_args r = ad;
        r.q = q_rounded;
        double *ref = cv_xmalloc((size_t)nh * hd * sizeof *ref), worst = 0;
        for (int s = 0; s < ATT_SEQS; s++)
            for (int32_t t = batch.seq_start[s]; t < batch.seq_start[s + 1]; t++) {
                ref_attention(&r, t, s, ref);
                for (int i = 0; i < nh * hd; i++) worst = fmax(worst, fabs(out_d[(int64_t)t * nh * hd + i] - ref[i]));
            }
        CHECK_MSG(worst <= 0x1p-8, "%s attention (%d-slot blocks) %d/%d heads, head_dim %d: %g from the reference",
                  path, bs, nh, nkv, hd, worst);
        free(ref);
        free(k), free(v), free(q), free(q_rounded), free(kb), free(vb), free(out_f), free(out_d), free(out_split);
    }
}

/* vdpbf16ps attention, then AMX's (head_dim a multiple of 32; the others stay on vdpbf16ps) where
 * the CPU has it. */
static void test_attention_bf16_dot(cv_threadpool *pool) {
    /* switched on rather than asked: the start-up choice is timed, and the test must not depend on it */
    if (!cv_cpu_ops_active()->gemm_rows_dot || cv_cpu_bf16_dot_enable(true)) {
        printf("test_kernels: bf16-dot attention skipped on %s: %s\n", cv_isa_name(cv_isa_active()),
               cv_cpu_ops_active()->gemm_rows_dot ? cv_error_message() : "no bf16 dot product on this path");
        return;
    }
    CHECK_EQ_INT(cv_cpu_amx_enable(false), 0);
    attention_bf16_dot(pool, "bf16-dot", 7);
    attention_bf16_dot(pool, "bf16-dot", 16);
    attention_bf16_dot(pool, "bf16-dot", 32);
    attention_bf16_dot(pool, "bf16-dot", 40);
    if (cv_cpu_amx_enable(true)) {
        printf("test_kernels: AMX attention skipped: %s\n", cv_error_message());
        return;
    }
    attention_bf16_dot(pool, "amx", 7);
    attention_bf16_dot(pool, "amx", 16);
    attention_bf16_dot(pool, "amx", 40);
    CHECK_EQ_INT(cv_cpu_amx_enable(false), 0);
}

/* Element e of token row `slot`'s K or V (heads one after another) in a cache of the kernels.h layout. */
static int64_t kv_at(cv_dtype dtype, bool value, int64_t slot, int e, int n_kv_heads, int head_dim, int block_size) {
    return cv_kv_index(dtype, value, slot, e / head_dim, e % head_dim, n_kv_heads, head_dim, block_size);
}

/* Rows land head by head in their blocks: 2 heads of 3 in 4-slot blocks, slots in two blocks. */
static void test_kv_write(void) {
    enum { NKV_W = 2, HD_W = 3, BS_W = 4, WIDTH = NKV_W * HD_W };
    const int64_t slots[] = {7, 2, 4};
    float kc[8 * WIDTH] = {0}, vc[8 * WIDTH] = {0}, k[3 * WIDTH], v[3 * WIDTH];
    for (int i = 0; i < 3 * WIDTH; i++) k[i] = (float)(i + 1), v[i] = (float)-(i + 1);
    cv_kv_write(NULL, kc, vc, CV_DTYPE_F32, k, v, slots, 3, NKV_W, HD_W, BS_W);
    int bad = 0;
    for (int t = 0; t < 3; t++)
        for (int e = 0; e < WIDTH; e++) {
            const int64_t at = kv_at(CV_DTYPE_F32, false, slots[t], e, NKV_W, HD_W, BS_W);
            bad += kc[at] != k[t * WIDTH + e] || vc[at] != v[t * WIDTH + e];
            bad += at != kv_at(CV_DTYPE_F32, true, slots[t], e, NKV_W, HD_W, BS_W); /* f32: K and V alike */
        }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT((int)kv_at(CV_DTYPE_F32, false, 7, 4, NKV_W, HD_W, BS_W), (1 * NKV_W + 1) * BS_W * HD_W + 3 * HD_W + 1); /* head 1, row 3 of block 1 */
    for (int e = 0; e < WIDTH; e++) /* untouched slots stay */
        for (int64_t slot = 0; slot < 8; slot += 6) bad += kc[kv_at(CV_DTYPE_F32, false, slot, e, NKV_W, HD_W, BS_W)] != 0.0f;
    CHECK_EQ_INT(bad, 0);
}

/* Into a bf16 cache, K and V are rounded to nearest even: ties to the even neighbour, above a tie
 * up, overflow past bf16's largest to infinity; infinities, signed zero and NaN kept. */
static void test_kv_write_bf16(void) {
    enum { W = 8, NKV_W = 2, HD_W = 4, BS_W = 2 };
    const float in[W] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, INFINITY, -0.0f, NAN,
                         0x1.fffffep127f};
    const float want[W] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.5f, INFINITY, -0.0f, NAN, INFINITY};
    float k[2 * W], v[2 * W];
    for (int i = 0; i < W; i++) k[i] = v[W + i] = in[i], k[W + i] = v[i] = -in[i];
    const int64_t slots[] = {3, 0};
    uint16_t kc[4 * W] = {0}, vc[4 * W] = {0};
    cv_kv_write(NULL, kc, vc, CV_DTYPE_BF16, k, v, slots, 2, NKV_W, HD_W, BS_W);
    int bad = 0;
    for (int i = 0; i < W; i++) {
#define AT(value, slot) kv_at(CV_DTYPE_BF16, value, slot, i, NKV_W, HD_W, BS_W)
        const float got[4] = {cv_bf16_to_f32(kc[AT(false, 3)]), cv_bf16_to_f32(vc[AT(true, 0)]),
                              -cv_bf16_to_f32(kc[AT(false, 0)]), -cv_bf16_to_f32(vc[AT(true, 3)])};
        for (int j = 0; j < 4; j++)
            bad += isnan(want[i]) ? !isnan(got[j]) : got[j] != want[i] || signbit(got[j]) != signbit(want[i]);
    }
    CHECK_MSG(bad == 0, "%d bf16 KV values not rounded to nearest even", bad);
    for (int i = 0; i < W; i++) /* untouched slots stay */
        for (int64_t slot = 1; slot <= 2; slot++)
            bad += kc[AT(false, slot)] != 0 || vc[AT(true, slot)] != 0;
#undef AT
    CHECK_EQ_INT(bad, 0);
}

/* The bf16 layout is the pairs kernels.h describes: K words of two adjacent elements of a row, in
 * panels of 16 rows (17-slot blocks: 16 and 1), a panel's pair rows its rows words apart; V words of
 * two adjacent rows; an odd head_dim's last K element and an odd block's last V row plain after the
 * words. Every slot written, each element of the cache is written once (the layout is a bijection),
 * for even and odd shapes (values up to 256, exact in bf16). */
static void test_kv_layout_bf16(void) {
    static const int shapes[][3] = {{2, 4, 4}, {2, 3, 3}, {1, 5, 1}, {3, 2, 7}, {1, 5, 17}}; /* KV heads, head_dim,
                                                                                             * block_size */
    for (size_t sh = 0; sh < CV_ARRAY_LEN(shapes); sh++) {
        const int nkv = shapes[sh][0], hd = shapes[sh][1], bs = shapes[sh][2], width = nkv * hd, slots = 3 * bs;
        float *k = cv_xmalloc((size_t)slots * width * sizeof *k), *v = cv_xmalloc((size_t)slots * width * sizeof *v);
        int64_t *all = cv_xmalloc((size_t)slots * sizeof *all);
        for (int i = 0; i < slots * width; i++) k[i] = (float)(i + 1), v[i] = (float)-(i + 1); /* exact in bf16 */
        for (int i = 0; i < slots; i++) all[i] = (i * 5 + 1) % slots; /* a permutation: 5 is prime to 3·bs here */
        uint16_t *kc = cv_xmalloc((size_t)slots * width * sizeof *kc), *vc = cv_xmalloc((size_t)slots * width * sizeof *vc);
        int *hits = calloc((size_t)slots * width * 2, sizeof *hits);
        cv_kv_write(NULL, kc, vc, CV_DTYPE_BF16, k, v, all, slots, nkv, hd, bs);
        int bad = 0;
        for (int t = 0; t < slots; t++)
            for (int e = 0; e < width; e++) {
                const int64_t ak = kv_at(CV_DTYPE_BF16, false, all[t], e, nkv, hd, bs);
                const int64_t av = kv_at(CV_DTYPE_BF16, true, all[t], e, nkv, hd, bs);
                bad += cv_bf16_to_f32(kc[ak]) != k[t * width + e] || cv_bf16_to_f32(vc[av]) != v[t * width + e];
                hits[ak]++, hits[slots * width + av]++;
            }
        for (int i = 0; i < 2 * slots * width; i++) bad += hits[i] != 1;
        CHECK_MSG(bad == 0, "bf16 KV layout %d heads × %d in %d-slot blocks: %d wrong", nkv, hd, bs, bad);
        free(k), free(v), free(all), free(kc), free(vc), free(hits);
    }
    /* where: head 1 of 2, head_dim 3, 3-slot blocks, slot 4 (block 1, row 1): region (1·2 + 1)·9 = 27 */
    CHECK_EQ_INT((int)cv_kv_index(CV_DTYPE_BF16, false, 4, 1, 1, 2, 3, 3), 27 + (0 * 3 + 1) * 2 + 1); /* pair 0, high */
    CHECK_EQ_INT((int)cv_kv_index(CV_DTYPE_BF16, false, 4, 1, 2, 2, 3, 3), 27 + 2 * 3 + 1);           /* plain last */
    CHECK_EQ_INT((int)cv_kv_index(CV_DTYPE_BF16, true, 4, 1, 2, 2, 3, 3), 27 + (0 * 3 + 2) * 2 + 1);  /* rows 0|1 */
    CHECK_EQ_INT((int)cv_kv_index(CV_DTYPE_BF16, true, 5, 1, 2, 2, 3, 3), 27 + 2 * 3 + 2);            /* plain row 2 */
    /* K in panels of 16 rows: head_dim 5, 40-slot blocks (panels of 16, 16 and 8 rows), slot 35 (row 35:
     * panel 2, its row 3), head 0 of 1: the earlier panels' 32 rows × 4 paired elements come first */
    CHECK_EQ_INT((int)cv_kv_index(CV_DTYPE_BF16, false, 35, 0, 3, 1, 5, 40), 32 * 4 + (1 * 8 + 3) * 2 + 1);
    CHECK_EQ_INT((int)cv_kv_index(CV_DTYPE_BF16, false, 17, 0, 0, 1, 5, 40), 16 * 4 + (0 * 16 + 1) * 2);
    CHECK_EQ_INT((int)cv_kv_index(CV_DTYPE_BF16, false, 35, 0, 4, 1, 5, 40), 4 * 40 + 35); /* plain last */
}

/* The gathers put each word where kv_layout.h says, for the lane-wise tiles (W = 64 positions, W =
 * head_dim elements) and AMX's column tiles (W = 16; several tiles per call), from blocks scattered
 * over the cache, for even and odd head_dim and block sizes (pairs across blocks, an odd block's
 * plain last row, an odd head_dim's plain last element, a zero past an odd n); and write nothing
 * else. K's panels and V's pair rows as pointers hold the same words, pointing into the cache where
 * a block holds whole panels (K: block_size a multiple of 16) or pairs rows (V: an even block_size). */
static void test_kv_gather(void) {
    static const int shapes[][3] = {{2, 128, 16}, {1, 32, 7},  {2, 19, 5}, {1, 6, 1},
                                    {3, 8, 2},    {1, 16, 32}, {1, 9, 16}, {2, 10, 40}}; /* KV heads, head_dim,
                                                                                         * block_size */
    static const int spans[][2] = {{0, 1}, {0, 16}, {2, 37}, {64, 64}, {6, 128}, {32, 50}}; /* j0, n */
    enum { SENTINEL = 0x5a5a5a5a };
    for (size_t sh = 0; sh < CV_ARRAY_LEN(shapes); sh++) {
        const int nkv = shapes[sh][0], hd = shapes[sh][1], bs = shapes[sh][2], width = nkv * hd;
        const int blocks = (134 + bs - 1) / bs + 3, slots = blocks * bs, pairs = (hd + 1) / 2;
        CHECK(blocks % 11 != 0);
        float *k = rand_vec((int64_t)slots * width), *v = rand_vec((int64_t)slots * width);
        int64_t *all = cv_xmalloc((size_t)slots * sizeof *all);
        int32_t *table = cv_xmalloc((size_t)blocks * sizeof *table);
        for (int i = 0; i < slots; i++) all[i] = i;
        for (int b = 0; b < blocks; b++) table[b] = (b * 11 + 3) % blocks; /* a permutation (checked above) */
        uint16_t *kc = cv_xmalloc((size_t)slots * width * 2), *vc = cv_xmalloc((size_t)slots * width * 2);
        cv_kv_write(NULL, kc, vc, CV_DTYPE_BF16, k, v, all, slots, nkv, hd, bs);
        int bad = 0;
        for (int g = 0; g < nkv; g++)
            for (size_t sp = 0; sp < CV_ARRAY_LEN(spans); sp++)
                for (int W = 16; W <= 64; W *= 4) {
                    const int32_t j0 = spans[sp][0];
                    const int n = spans[sp][1], rows = (n + 1) / 2 + 1, wv = W == 64 ? hd : W;
                    const int64_t kwords = (int64_t)(n + W - 1) / W * pairs * W, vwords = (int64_t)(hd + wv - 1) / wv * rows * wv;
                    uint32_t *kd = cv_xmalloc((size_t)kwords * 4), *vd = cv_xmalloc((size_t)vwords * 4);
                    int *kwant = calloc((size_t)kwords, sizeof *kwant), *vwant = calloc((size_t)vwords, sizeof *vwant);
                    for (int64_t i = 0; i < kwords; i++) kd[i] = SENTINEL;
                    for (int64_t i = 0; i < vwords; i++) vd[i] = SENTINEL;
                    const cv_kv_head kh = {kc, table, g, nkv, hd, bs}, vh = {vc, table, g, nkv, hd, bs};
                    cv_kv_gather_k(&kh, j0, n, kd, W);
                    cv_kv_gather_v(&vh, j0, n, vd, wv, rows);
#define SLOT(pos) ((int64_t)table[(pos) / bs] * bs + (pos) % bs)
#define ELEM(c, value, pos, d) (c)[cv_kv_index(CV_DTYPE_BF16, value, SLOT(pos), g, d, nkv, hd, bs)]
                    for (int j = 0; j < n; j++)
                        for (int p = 0; p < pairs; p++) {
                            const int64_t at = (int64_t)(j / W) * pairs * W + (int64_t)p * W + j % W;
                            const uint32_t hi = 2 * p + 1 < hd ? ELEM(kc, false, j0 + j, 2 * p + 1) : 0;
                            bad += kd[at] != ((uint32_t)ELEM(kc, false, j0 + j, 2 * p) | hi << 16);
                            kwant[at] = 1;
                        }
                    for (int q = 0; 2 * q < n; q++)
                        for (int d = 0; d < hd; d++) {
                            const int64_t at = (int64_t)(d / wv) * rows * wv + (int64_t)q * wv + d % wv;
                            const uint32_t hi = 2 * q + 1 < n ? ELEM(vc, true, j0 + 2 * q + 1, d) : 0;
                            bad += vd[at] != ((uint32_t)ELEM(vc, true, j0 + 2 * q, d) | hi << 16);
                            vwant[at] = 1;
                        }
                    if (W == 64 && n <= 64) { /* K as panels of 16 positions: in the cache where a block holds them */
                        const uint32_t *pan[4];
                        int64_t ldp = 0;
                        uint32_t *spare = cv_xmalloc((size_t)pairs * 64 * 4);
                        cv_kv_k_panels(&kh, j0, n, pan, &ldp, spare);
                        for (int j = 0; j < n; j += 16) {
                            const bool in_cache = (const uint16_t *)pan[j / 16] >= kc &&
                                                  (const uint16_t *)pan[j / 16] < kc + (int64_t)slots * width;
                            bad += in_cache != (bs % 16 == 0 && j0 % 16 == 0 && hd % 2 == 0);
                        }
                        for (int j = 0; j < n; j++)
                            for (int p = 0; p < pairs; p++) {
                                const uint32_t hi = 2 * p + 1 < hd ? ELEM(kc, false, j0 + j, 2 * p + 1) : 0;
                                bad += pan[j / 16][p * ldp + j % 16] !=
                                       ((uint32_t)ELEM(kc, false, j0 + j, 2 * p) | hi << 16);
                            }
                        free(spare);
                    }
                    if (W == 64) { /* the same words as row pointers: in the cache itself where it pairs rows */
                        const uint32_t *pr[80];
                        uint32_t *spare = cv_xmalloc((size_t)(n + 1) / 2 * hd * 4);
                        cv_kv_v_pair_rows(&vh, j0, n, pr, spare);
                        for (int q = 0; 2 * q < n; q++) {
                            const bool in_cache = (const uint16_t *)pr[q] >= vc && (const uint16_t *)pr[q] < vc + (int64_t)slots * width;
                            bad += in_cache != (bs % 2 == 0 && 2 * q + 1 < n);
                            for (int d = 0; d < hd; d++) {
                                const uint32_t hi = 2 * q + 1 < n ? ELEM(vc, true, j0 + 2 * q + 1, d) : 0;
                                bad += pr[q][d] != ((uint32_t)ELEM(vc, true, j0 + 2 * q, d) | hi << 16);
                            }
                        }
                        free(spare);
                    }
#undef ELEM
#undef SLOT
                    for (int64_t i = 0; i < kwords; i++) bad += !kwant[i] && kd[i] != SENTINEL;
                    for (int64_t i = 0; i < vwords; i++) bad += !vwant[i] && vd[i] != SENTINEL;
                    free(kd), free(vd), free(kwant), free(vwant);
                }
        CHECK_MSG(bad == 0, "KV gather %d heads × %d in %d-slot blocks (%s): %d words wrong", nkv, hd, bs,
                  cv_isa_name(cv_isa_active()), bad);
        free(k), free(v), free(all), free(table), free(kc), free(vc);
    }
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
}

int main(void) {
    /* the start-up choice of bf16 compute (timed, so its answer is not checked; a CPU without the
     * instructions never says yes); the tests below switch it as they need */
    const bool bf16_dot = cv_linear_bf16_input();
    CHECK(bf16_dot == cv_linear_bf16_input());
    CHECK(!bf16_dot || cv_cpu_bf16_dot_enable(true) == 0);
    test_threadpool_null_and_split();
    test_threadpool_range();
    test_threadpool_steals();
    for (int n = 1; n <= 3; n++) {
        test_threadpool(n);
        test_threadpool_shares(n);
    }
    test_isa_selection();
    test_format_names();
    test_panel_ahead();
    test_pack_errors();
    test_fp8_errors();
    test_fp8_narrowing();
    cv_threadpool *pools[] = {NULL, cv_threadpool_create(3)};
    for (size_t path = 0; path < CV_ARRAY_LEN(kernel_paths); path++) {
        if (!use_path(kernel_paths[path], true)) continue;
        CHECK_EQ_INT(cv_isa_active(), kernel_paths[path].isa);
        for (size_t p = 0; p < CV_ARRAY_LEN(pools); p++) {
            test_format(pools[p], CV_DTYPE_I8);
            if (kernel_paths[path].vnni) continue; /* the rest does not use VNNI or AMX */
            test_format(pools[p], CV_DTYPE_BF16);
            test_format(pools[p], CV_DTYPE_F8_E4M3);
            test_fp8_blocks(pools[p]);
            test_fp8_widening(pools[p], false);
            test_views(pools[p]);
            test_packing(pools[p]);
            test_matmul(pools[p]);
            test_attention(pools[p]);
            test_attention_bf16_cache(pools[p]);
            test_attention_bf16_dot(pools[p]);
            test_attention_new_rows(pools[p]);
            test_add_rmsnorm(pools[p]);
            test_swiglu(pools[p]);
            test_lowrank_add(pools[p]);
            test_fused_quant(pools[p]);
            test_rmsnorm_rope(pools[p]);
            test_round_bf16_rows(pools[p]);
        }
        test_i8_extremes(pools[1]);
        test_stream_asks(pools[1], kernel_paths[path].vnni);
        if (kernel_paths[path].vnni) continue;
        test_rmsnorm();
        test_row_ops();
        test_row_max();
        test_quantize_rows();
        test_elementwise();
        test_embed();
        test_rope();
        test_kv_write();
        test_kv_write_bf16();
        test_kv_layout_bf16();
        test_kv_gather();
    }
    test_i8_paths_agree(pools[1]);
    test_bf16_compute(pools, CV_ARRAY_LEN(pools));
    cv_threadpool_free(pools[1]);
    return cv_check_summary("test_kernels");
}
