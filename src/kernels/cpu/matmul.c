/*
 * matmul.c — y = x · Wᵀ for f32 activations and f32/bf16/f16 weights, blocked and threaded.
 *
 * Two weight layouts (kernels.h):
 *
 * Row-major (weights straight from the checkpoint mapping). Decode streams each thread's slice of
 * weight rows once, four rows at a time; prefill reuses each 4-row block for a 64-token block while
 * it sits in L1, so the weights cross the memory bus about once per 64 tokens.
 *
 * Panels (bf16 weights repacked at load by cv_panels_pack). A micro-tile is mr tokens × np panels
 * (np·16 outputs); its accumulators are the outputs themselves, so K can be split into blocks: a
 * block of np panels × KBLOCK pairs (3 × 128 × 64 B = 24 KiB) stays in L1 while every token tile of
 * a 64-token block runs over it, and the token block's activations stay in L2. One token (decode)
 * skips the k blocking and streams each panel once from memory.
 *
 * Work is split over panels (or rows, in multiples of 16: whole cache lines of y per thread, no
 * false sharing); when there are too few to go around but many tokens, over tokens instead. Tiny
 * products run on the caller: waking the pool would cost more than the work.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

enum { TOKEN_BLOCK = 64, ROW_ALIGN = 16, SERIAL_FLOPS = 1 << 15, KBLOCK = 128, MAX_PARTS = 4 };

bool cv_matrix_dtype_supported(cv_dtype t) {
    return t == CV_DTYPE_F32 || t == CV_DTYPE_BF16 || t == CV_DTYPE_F16;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- row-major weights ------------------------------------------------------------------------ */

typedef struct rows_job {
    const cv_matrix *w;
    const float *x;
    int64_t m;
    float *y;
    const cv_cpu_ops *ops;
    bool split_tokens;
} rows_job;

static void rows_block(const rows_job *job, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
    const cv_matrix *w = job->w;
    const cv_cpu_ops *ops = job->ops;
    const int64_t k = w->cols, n = w->rows;
    const size_t esize = cv_dtype_size(w->dtype);
    for (int64_t mb = m0; mb < m1; mb += TOKEN_BLOCK) {
        int64_t me = mb + TOKEN_BLOCK < m1 ? mb + TOKEN_BLOCK : m1;
        for (int64_t r = n0; r < n1; r += ops->nr_max) {
            int nr = (int)(n1 - r < ops->nr_max ? n1 - r : ops->nr_max);
            const void *wr = (const char *)w->data + (size_t)r * (size_t)k * esize;
            for (int64_t i = mb; i < me; i += ops->mr_max) {
                int mr = (int)(me - i < ops->mr_max ? me - i : ops->mr_max);
                ops->tile(wr, k, w->dtype, job->x + i * k, k, job->y + i * n + r, n, mr, nr, k);
            }
        }
    }
}

static void rows_task(void *arg, int ti, int nt) {
    const rows_job *job = arg;
    int64_t b, e;
    if (job->split_tokens) {
        cv_split(job->m, job->ops->mr_max, ti, nt, &b, &e);
        if (b < e) rows_block(job, 0, job->w->rows, b, e);
    } else {
        cv_split(job->w->rows, ROW_ALIGN, ti, nt, &b, &e);
        if (b < e) rows_block(job, b, e, 0, job->m);
    }
}

static void matmul_rows(cv_threadpool *pool, const cv_matrix *w, const float *x, int64_t m, float *y) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    int nt = cv_threadpool_size(pool);
    rows_job job = {.w = w, .x = x, .m = m, .y = y, .ops = ops};
    job.split_tokens = w->rows < (int64_t)ROW_ALIGN * 4 * nt && m >= (int64_t)ops->mr_max * nt;
    if (nt == 1 || m * w->rows * w->cols < SERIAL_FLOPS) {
        rows_block(&job, 0, w->rows, 0, m);
        return;
    }
    cv_threadpool_run(pool, rows_task, &job);
}

/* ---- panel weights ---------------------------------------------------------------------------- */

typedef struct panel_job {
    const cv_panels *w;
    const cv_cpu_ops *ops;
    const float *x;           /* [m][cols] */
    int64_t m, pairs, panel_stride;
    int mr, np;
    bool split_tokens;
    int n_parts;
    int64_t part_panel[MAX_PARTS + 1]; /* part j owns panels [part_panel[j], part_panel[j+1]) */
    int64_t part_rows[MAX_PARTS];
    float *ys[MAX_PARTS];
} panel_job;

/* Tiles of panels [p0, p1) of one part × tokens [m0, m1) over pairs [k0, k1). */
static void panel_range(const panel_job *job, int part, int64_t p0, int64_t p1, int64_t m0, int64_t m1, int64_t k0,
                        int64_t k1) {
    const int64_t first = job->part_panel[part], rows = job->part_rows[part];
    const int64_t cols = job->w->cols;
    cv_panel_tile t = {
        .panel_stride = job->panel_stride,
        .pairs = k1 - k0,
        .odd_tail = k1 == job->pairs && cols % 2,
        .accumulate = k0 > 0,
        .ldx = cols,
        .ldy = rows,
    };
    for (int64_t p = p0; p < p1; p += job->np) {
        t.np = (int)(p1 - p < job->np ? p1 - p : job->np);
        t.w = job->w->data + p * job->panel_stride + k0 * 32;
        int64_t c0 = (p - first) * CV_PANEL_ROWS;
        t.n_out = (int)(rows - c0 < (int64_t)t.np * CV_PANEL_ROWS ? rows - c0 : t.np * CV_PANEL_ROWS);
        for (int64_t i = m0; i < m1; i += job->mr) {
            t.mr = (int)(m1 - i < job->mr ? m1 - i : job->mr);
            t.x = job->x + i * cols + 2 * k0;
            t.y = job->ys[part] + i * rows + c0;
            job->ops->panel(&t);
        }
    }
}

/* Panels [p0, p1) (any parts) × tokens [m0, m1), blocked for the caches. */
static void panel_block(const panel_job *job, int64_t p0, int64_t p1, int64_t m0, int64_t m1) {
    const int64_t kblock = m1 - m0 == 1 ? job->pairs : KBLOCK;
    const int64_t token_block = TOKEN_BLOCK / job->mr * job->mr; /* whole register tiles */
    for (int64_t mb = m0; mb < m1; mb += token_block) {
        int64_t me = mb + token_block < m1 ? mb + token_block : m1;
        for (int part = 0; part < job->n_parts; part++) {
            int64_t a = p0 > job->part_panel[part] ? p0 : job->part_panel[part];
            int64_t b = p1 < job->part_panel[part + 1] ? p1 : job->part_panel[part + 1];
            if (a >= b) continue;
            /* k blocks innermost over panel groups, so one group's slab stays in L1 for all tokens */
            for (int64_t g = a; g < b; g += job->np) {
                int64_t ge = g + job->np < b ? g + job->np : b;
                for (int64_t k0 = 0; k0 < job->pairs; k0 += kblock)
                    panel_range(job, part, g, ge, mb, me, k0, k0 + kblock < job->pairs ? k0 + kblock : job->pairs);
            }
        }
    }
}

static void panel_task(void *arg, int ti, int nt) {
    const panel_job *job = arg;
    const int64_t panels = job->part_panel[job->n_parts];
    int64_t b, e;
    if (job->split_tokens) {
        cv_split(job->m, job->mr, ti, nt, &b, &e);
        if (b < e) panel_block(job, 0, panels, b, e);
    } else {
        cv_split(panels, 1, ti, nt, &b, &e);
        if (b < e) panel_block(job, b, e, 0, job->m);
    }
}

static void matmul_panels(cv_threadpool *pool, const cv_panels *w, const float *x, int64_t m, int n_parts,
                          const int64_t *part_rows, float *const *ys) {
    assert(n_parts >= 1 && n_parts <= MAX_PARTS);
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    panel_job job = {.w = w, .ops = ops, .x = x, .m = m, .pairs = ceil_div(w->cols, 2), .n_parts = n_parts};
    job.panel_stride = job.pairs * 2 * CV_PANEL_ROWS;
    job.mr = ops->panel_mr_max;
    job.np = ops->panel_np_max;
    for (int j = 0; j < n_parts; j++) {
        assert(j == n_parts - 1 || part_rows[j] % CV_PANEL_ROWS == 0);
        job.part_rows[j] = part_rows[j];
        job.ys[j] = ys[j];
        job.part_panel[j + 1] = job.part_panel[j] + ceil_div(part_rows[j], CV_PANEL_ROWS);
    }
    assert(job.part_panel[n_parts] == ceil_div(w->rows, CV_PANEL_ROWS));
    const int nt = cv_threadpool_size(pool);
    const int64_t panels = job.part_panel[n_parts];
    job.split_tokens = panels < 4LL * job.np * nt && m >= (int64_t)job.mr * nt;
    if (nt == 1 || m * w->rows * w->cols < SERIAL_FLOPS) panel_block(&job, 0, panels, 0, m);
    else cv_threadpool_run(pool, panel_task, &job);
}

/* ---- entry points ----------------------------------------------------------------------------- */

void cv_matmul(cv_threadpool *pool, const cv_matrix *w, const float *x, int64_t m, float *y) {
    assert(cv_matrix_dtype_supported(w->dtype));
    if (m <= 0 || w->rows <= 0) return;
    matmul_rows(pool, w, x, m, y);
}

void cv_matmul_panels(cv_threadpool *pool, const cv_panels *w, const float *x, int64_t m, float *y) {
    if (m <= 0 || w->rows <= 0) return;
    matmul_panels(pool, w, x, m, 1, &w->rows, &y);
}

void cv_matmul_panels_parts(cv_threadpool *pool, const cv_panels *w, const float *x, int64_t m, int n_parts,
                            const int64_t *part_rows, float *const *ys) {
    if (m <= 0 || w->rows <= 0) return;
    matmul_panels(pool, w, x, m, n_parts, part_rows, ys);
}

/* ---- packing ---------------------------------------------------------------------------------- */

size_t cv_panels_bytes(int64_t rows, int64_t cols) {
    return (size_t)ceil_div(rows, CV_PANEL_ROWS) * (size_t)ceil_div(cols, 2) * CV_PANEL_ROWS * 2 * sizeof(uint16_t);
}

typedef struct pack_job {
    const cv_matrix *parts;
    int n_parts;
    int64_t panels, cols, pairs;
    uint16_t *dst;
} pack_job;

/* The source row of output row r of the stack, or NULL for a padding row. */
static const uint16_t *stacked_row(const pack_job *job, int64_t r) {
    for (int j = 0; j < job->n_parts; j++) {
        if (r < job->parts[j].rows) return (const uint16_t *)job->parts[j].data + r * job->cols;
        r -= job->parts[j].rows;
    }
    return NULL;
}

/* A panel is the 16 rows' pairs transposed: pair c of row r (two bf16, one 32-bit word) goes to
 * word c·16 + r. */
static void pack_task(void *arg, int ti, int nt) {
    const pack_job *job = arg;
    const int64_t whole = job->cols / 2; /* pairs with both halves in the row */
    int64_t b, e;
    cv_split(job->panels, 1, ti, nt, &b, &e);
    for (int64_t p = b; p < e; p++) {
        uint32_t *panel = (uint32_t *)job->dst + p * job->pairs * CV_PANEL_ROWS;
        for (int r = 0; r < CV_PANEL_ROWS; r++) {
            const uint16_t *src = stacked_row(job, p * CV_PANEL_ROWS + r);
            if (!src) {
                for (int64_t c = 0; c < job->pairs; c++) panel[c * CV_PANEL_ROWS + r] = 0;
                continue;
            }
            for (int64_t c = 0; c < whole; c++) {
                uint32_t word;
                memcpy(&word, src + 2 * c, sizeof word);
                panel[c * CV_PANEL_ROWS + r] = word;
            }
            if (whole < job->pairs) panel[whole * CV_PANEL_ROWS + r] = src[2 * whole]; /* odd cols: high half 0 */
        }
    }
}

static int check_packable(const cv_matrix *parts, int n_parts) {
    assert(n_parts >= 1 && n_parts <= MAX_PARTS);
    for (int j = 0; j < n_parts; j++) {
        if (parts[j].dtype != CV_DTYPE_BF16)
            return cv_fail(CVLLM_ERR_UNSUPPORTED, "only bf16 weights are packed into panels, not %s",
                           cv_dtype_name(parts[j].dtype));
        assert(parts[j].cols == parts[0].cols);
        assert(j == n_parts - 1 || parts[j].rows % CV_PANEL_ROWS == 0);
    }
    return 0;
}

int64_t cv_panels_stacked_rows(const cv_matrix *parts, int n_parts) {
    int64_t rows = 0;
    for (int j = 0; j < n_parts; j++) rows += parts[j].rows;
    return rows;
}

int cv_panels_pack_into(cv_threadpool *pool, const cv_matrix *parts, int n_parts, void *dst, cv_panels *out) {
    int rc = check_packable(parts, n_parts);
    if (rc) return rc;
    const int64_t rows = cv_panels_stacked_rows(parts, n_parts);
    pack_job job = {.parts = parts, .n_parts = n_parts, .panels = ceil_div(rows, CV_PANEL_ROWS),
                    .cols = parts[0].cols, .pairs = ceil_div(parts[0].cols, 2), .dst = dst};
    cv_threadpool_run(pool, pack_task, &job);
    *out = (cv_panels){dst, rows, parts[0].cols, false};
    return 0;
}

int cv_panels_pack(cv_threadpool *pool, const cv_matrix *parts, int n_parts, cv_panels *out) {
    int rc = check_packable(parts, n_parts);
    if (rc) return rc;
    const int64_t rows = cv_panels_stacked_rows(parts, n_parts);
    const size_t bytes = cv_panels_bytes(rows, parts[0].cols);
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes for a packed %lldx%lld weight", bytes,
                       (long long)rows, (long long)parts[0].cols);
    madvise(mem, bytes, MADV_HUGEPAGE); /* fewer TLB misses while streaming; best effort */
    cv_panels_pack_into(pool, parts, n_parts, mem, out);
    out->owned = true;
    return 0;
}

void cv_panels_release(cv_panels *w) {
    if (w->data && w->owned) munmap((void *)w->data, cv_panels_bytes(w->rows, w->cols));
    *w = (cv_panels){0};
}

/* ---- embedding -------------------------------------------------------------------------------- */

void cv_embed_panels(const cv_panels *w, const int32_t *ids, int64_t n, float *out) {
    const int64_t panel_elems = ceil_div(w->cols, 2) * 2 * CV_PANEL_ROWS;
    for (int64_t i = 0; i < n; i++) {
        assert(ids[i] >= 0 && ids[i] < w->rows);
        const uint16_t *lane = w->data + (int64_t)(ids[i] / CV_PANEL_ROWS) * panel_elems + (ids[i] % CV_PANEL_ROWS) * 2;
        float *o = out + i * w->cols;
        for (int64_t c = 0; c < w->cols; c++) o[c] = cv_bf16_to_f32(lane[(c / 2) * 2 * CV_PANEL_ROWS + c % 2]);
    }
}

void cv_embed(const cv_matrix *table, const int32_t *ids, int64_t n, float *out) {
    assert(cv_matrix_dtype_supported(table->dtype));
    const size_t row_bytes = (size_t)table->cols * cv_dtype_size(table->dtype);
    for (int64_t i = 0; i < n; i++) {
        assert(ids[i] >= 0 && ids[i] < table->rows);
        const void *row = (const char *)table->data + (size_t)ids[i] * row_bytes;
        cv_convert_to_f32(out + i * table->cols, row, table->dtype, (size_t)table->cols);
    }
}
