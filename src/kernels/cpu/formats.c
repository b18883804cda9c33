/*
 * formats.c — the weight-format traits table (formats.h) and what is the same for every format:
 * names, sizes, views, validation of the parts to stack, threaded packing, release.
 *
 * A format's own rules (its scales, its layout of one panel) are in its entry, format_*.c; packing
 * here only splits the panels over the pool and calls the entry's pack_panel for each, so the
 * packed bytes do not depend on the number of threads.
 */
#include <assert.h>
#include <stdatomic.h>

#include "base/bigmem.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "kernels/cpu/formats.h"

enum { MAX_PARTS = 4 };

const cv_format_traits *const cv_formats[CV_WFORMAT_COUNT] = {
    [CV_WFORMAT_F32] = &cv_format_f32,
    [CV_WFORMAT_BF16] = &cv_format_bf16,
    [CV_WFORMAT_F16] = &cv_format_f16,
    [CV_WFORMAT_BF16_PANELS] = &cv_format_bf16_panels,
    [CV_WFORMAT_I8_PANELS] = &cv_format_i8_panels,
    [CV_WFORMAT_FP8_PANELS] = &cv_format_fp8_panels,
};

/* int8 products of fewer tokens run on VNNI even where AMX is there: a lone decode token streams
 * the weights from memory ~10 % faster through vpdpbusd than through tile loads (matmul_bench, on
 * the lm_head shape), and from 2 tokens on the tile products win. int8 sums are exact, so the
 * choice never changes a bit of the result. */
enum { AMX_INT8_MIN_TOKENS = 2 };

const cv_gemm_kernel *cv_format_gemm(cv_wformat f, int64_t m) {
    const cv_format_traits *t = cv_formats[f];
    const cv_isa isa = cv_isa_active();
    if (isa == CV_ISA_AVX512 && t->int8_input && t->gemm_amx && m >= AMX_INT8_MIN_TOKENS && cv_cpu_amx())
        return t->gemm_amx;
    if (isa == CV_ISA_AVX512 && t->gemm_vnni && cv_cpu_vnni()) return t->gemm_vnni;
    return t->gemm[isa];
}

/* One kernel for every token count (tdpbf16ps and vdpbf16ps add a step's products in different
 * orders), so a CPU with AMX runs it for decode too: an output's bits never depend on the batch. */
const cv_gemm_kernel *cv_format_gemm_bf16(cv_wformat f) {
    const cv_format_traits *t = cv_formats[f];
    if (!t->gemm_bf16_dot || !cv_cpu_bf16_dot()) return NULL;
    if (cv_cpu_amx()) return t->gemm_amx; /* none: f32 input (formats.h) */
    return t->gemm_bf16_dot->vbmi && !cv_cpu_avx512_vbmi() ? NULL : t->gemm_bf16_dot;
}

bool cv_wformat_bf16_input(cv_wformat f) {
    assert((unsigned)f < CV_WFORMAT_COUNT);
    return cv_format_gemm_bf16(f) != NULL;
}

const char *cv_wformat_name(cv_wformat f) { return (unsigned)f < CV_WFORMAT_COUNT ? cv_formats[f]->name : "unknown"; }

int cv_wformat_for_dtype(cv_dtype t) {
    for (int f = 0; f < CV_WFORMAT_COUNT; f++)
        if (cv_formats[f]->packed && cv_formats[f]->dtype == t) return f;
    return -1;
}

bool cv_wformat_int8_input(cv_wformat f) {
    assert((unsigned)f < CV_WFORMAT_COUNT);
    return cv_formats[f]->int8_input;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t codes_per_panel(const cv_format_traits *t, int64_t cols) { return ceil_div(cols, t->k_group) * t->group_bytes; }

static int64_t aux_per_panel(const cv_format_traits *t, int64_t cols) { return t->aux_bytes ? t->aux_bytes(cols) : 0; }

size_t cv_weight_packed_bytes(cv_wformat f, int64_t rows, int64_t cols) {
    assert((unsigned)f < CV_WFORMAT_COUNT);
    const cv_format_traits *t = cv_formats[f];
    if (!t->packed) return (size_t)rows * (size_t)cols * cv_dtype_size(t->dtype);
    return (size_t)ceil_div(rows, CV_PANEL_ROWS) * (size_t)(codes_per_panel(t, cols) + aux_per_panel(t, cols));
}

cv_weight cv_weight_view(const cv_matrix *m) {
    for (int f = 0; f < CV_WFORMAT_COUNT; f++)
        if (!cv_formats[f]->packed && cv_formats[f]->dtype == m->dtype)
            return (cv_weight){(cv_wformat)f, m->rows, m->cols, m->data, false};
    assert(!"cv_weight_view: not a row-major weight dtype");
    return (cv_weight){0};
}

bool cv_pack_source_row(const cv_pack_ctx *c, int64_t r, int *part, int64_t *row) {
    for (int j = 0; j < c->n_parts; j++) {
        if (r < c->parts[j].rows) {
            *part = j;
            *row = r;
            return true;
        }
        r -= c->parts[j].rows;
    }
    return false;
}

/* The parts can be stacked into one packed weight; *out is their format. */
static int check_parts(const cv_weight_part *parts, int n_parts, cv_wformat *out) {
    if (n_parts < 1 || n_parts > MAX_PARTS)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "a packed weight stacks 1 to %d parts, not %d", MAX_PARTS, n_parts);
    const int f = cv_wformat_for_dtype(parts[0].dtype);
    if (f < 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s weights have no packed format (bf16, int8 and e4m3 weights do)",
                       cv_dtype_name(parts[0].dtype));
    const cv_format_traits *t = cv_formats[f];
    for (int j = 0; j < n_parts; j++) {
        const cv_weight_part *p = &parts[j];
        if (p->dtype != parts[0].dtype)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "the parts of a packed weight mix %s and %s",
                           cv_dtype_name(parts[0].dtype), cv_dtype_name(p->dtype));
        if (p->rows <= 0 || p->cols <= 0 || p->cols != parts[0].cols)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "part %d of a packed weight is %lldx%lld; parts need the same "
                           "number of columns (%lld) and at least one row", j, (long long)p->rows, (long long)p->cols,
                           (long long)parts[0].cols);
        if (j < n_parts - 1 && p->rows % CV_PANEL_ROWS)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "part %d of a packed weight has %lld rows; every part but the "
                           "last needs a multiple of %d", j, (long long)p->rows, CV_PANEL_ROWS);
        int rc = t->check ? t->check(p) : 0;
        if (rc) return cv_fail_prefix(rc, "part %d of a packed %s weight", j, t->name);
    }
    *out = (cv_wformat)f;
    return 0;
}

typedef struct pack_job {
    const cv_format_traits *t;
    cv_pack_ctx ctx;
    _Atomic int64_t bad_row; /* a stacked row whose codes the format refuses, or -1 */
} pack_job;

static void pack_task(void *arg, int ti, int nt) {
    pack_job *job = arg;
    int64_t b, e;
    cv_split(job->ctx.panels, 1, ti, nt, &b, &e);
    for (int64_t p = b; p < e; p++) {
        int64_t bad = job->t->pack_panel(&job->ctx, p);
        if (bad >= 0) atomic_store(&job->bad_row, bad);
    }
}

int cv_weight_pack_into(cv_threadpool *pool, const cv_weight_part *parts, int n_parts, void *dst, cv_weight *out) {
    cv_wformat f;
    int rc = check_parts(parts, n_parts, &f);
    if (rc) return rc;
    const cv_format_traits *t = cv_formats[f];
    int64_t rows = 0;
    for (int j = 0; j < n_parts; j++) rows += parts[j].rows;
    const int64_t cols = parts[0].cols, panels = ceil_div(rows, CV_PANEL_ROWS);
    pack_job job = {.t = t, .bad_row = -1};
    job.ctx = (cv_pack_ctx){.parts = parts, .n_parts = n_parts, .rows = rows, .cols = cols, .panels = panels,
                            .codes = dst, .panel_bytes = codes_per_panel(t, cols), .aux_bytes = aux_per_panel(t, cols)};
    job.ctx.aux = job.ctx.codes + panels * job.ctx.panel_bytes;
    cv_threadpool_run(pool, pack_task, &job);
    const int64_t bad = atomic_load(&job.bad_row);
    if (bad >= 0) {
        int part = 0;
        int64_t row = 0;
        bool real = cv_pack_source_row(&job.ctx, bad, &part, &row);
        assert(real);
        return cv_fail(CVLLM_ERR_FORMAT, "part %d of a packed %s weight: row %lld holds %s", part, t->name,
                       (long long)row, t->bad_code);
    }
    *out = (cv_weight){f, rows, cols, dst, false};
    return 0;
}

int cv_weight_pack(cv_threadpool *pool, const cv_weight_part *parts, int n_parts, cv_weight *out) {
    cv_wformat f;
    int rc = check_parts(parts, n_parts, &f);
    if (rc) return rc;
    int64_t rows = 0;
    for (int j = 0; j < n_parts; j++) rows += parts[j].rows;
    const size_t bytes = cv_weight_packed_bytes(f, rows, parts[0].cols);
    void *mem = cv_big_alloc(bytes);
    if (!mem)
        return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes for a packed %lldx%lld %s weight", bytes,
                       (long long)rows, (long long)parts[0].cols, cv_formats[f]->name);
    rc = cv_weight_pack_into(pool, parts, n_parts, mem, out);
    if (rc) {
        cv_big_free(mem, bytes);
        return rc;
    }
    out->owned = true;
    return 0;
}

void cv_weight_release(cv_weight *w) {
    if (w->data && w->owned) cv_big_free((void *)w->data, cv_weight_packed_bytes(w->format, w->rows, w->cols));
    *w = (cv_weight){0};
}

void cv_embed_weight(const cv_weight *w, const int32_t *ids, int64_t n, float *out) {
    const cv_format_traits *t = cv_formats[w->format];
    assert(t->row);
    for (int64_t i = 0; i < n; i++) {
        assert(ids[i] >= 0 && ids[i] < w->rows);
        t->row(w, ids[i], out + i * w->cols);
    }
}
