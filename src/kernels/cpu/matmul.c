/*
 * matmul.c — cv_linear: y = x · Wᵀ for every weight format, blocked and threaded, written once.
 *
 * The format traits (formats.h) give the micro-kernel for the active ISA and the layout constants;
 * the two drivers here do the rest for any format:
 *
 * Row-major (F32/BF16/F16 views of the checkpoint). Decode streams each thread's slice of weight
 * rows once, a few rows at a time; prefill reuses each block of rows for a 64-token block while it
 * sits in L1, so the weights cross the memory bus about once per 64 tokens.
 *
 * Panels (packed formats). A micro-tile is mr tokens × np panels (np·16 outputs); its accumulators
 * are the outputs themselves, so K can be split into blocks: a block of np panels × kblock groups
 * (≈ 24 KiB; a kernel may ask for larger ones) stays in L1 while every token tile of a 64-token
 * block (a kernel may ask for more: AMX's rate needs the weights re-read less often) runs over it,
 * and the token block's activations stay in L2. The k blocks of one output run in order, each
 * continuing from the previous one's partial sums in y (f32 values, or int32 bits for int8 formats,
 * whose last block applies the dequantizing epilogue). One token (decode) skips the k blocking and
 * streams each panel once from memory, a tile's panels taken from np parts of its range so that
 * each stream runs on through the range (panel_block).
 *
 * bf16 compute: a format with a bf16-input kernel on this CPU (cv_wformat_bf16_input: BF16_PANELS,
 * FP8_PANELS) reads cv_act.bf16 when it is given, with the same blocking and k-block continuation
 * (f32 partial sums in y), so an output is one chain whatever M and the split. Other formats read
 * their own input from the same cv_act (f32 rows must be there for them).
 *
 * Work is split over panels (or rows, in multiples of 16: whole cache lines of y per share, no
 * false sharing), a share a thread, or for one token (decode) shares of about SHARE_BYTES of
 * weights, dealt out in runs by the pool (a thread through with its own takes a slow one's last
 * shares); when there are too few panels to go around but many tokens, over tokens instead.
 * Tiny products run on the caller: waking the pool would cost more than the work.
 *
 * SwiGLU fused into gate|up (cv_linear_swiglu_bf16): a unit is a gate panel, and its tile is that
 * panel and the up panel of the same outputs — two panels `inter` rows apart, which the kernels
 * reach through the tile's panel stride, so any packed kernel with two panels a tile runs it
 * unchanged. The tile's outputs go to a per-thread buffer (a token block × 32), and once its k
 * blocks are done each token's 16 gate and 16 up values become 16 bf16 inputs of down_proj through
 * the ISA's silu_mul_bf16 (silu_mul and round_bf16 where it has none), one call per token block:
 * the f32 gate|up rows (8 bytes an output) are never written or read back.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/formats.h"

enum {
    TOKEN_BLOCK = 64, ROW_ALIGN = 16, SERIAL_FLOPS = 1 << 15, MAX_PARTS = 4, I8_ROW_ALIGN = 64,
    SHARE_BYTES = 256 << 10, MAX_NR = 4 /* panels a register tile, at most */
};

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int64_t cv_act_i8_stride(int64_t cols) { return ceil_div(cols, I8_ROW_ALIGN) * I8_ROW_ALIGN; }

typedef struct linear_job {
    const cv_weight *w;
    const cv_format_traits *f;
    const cv_gemm_kernel *kern;
    const char *x;            /* f32, bf16 or int8 rows */
    int64_t ldx;              /* elements between rows */
    int x_size;               /* bytes per element */
    const float *x_scale;
    int64_t m;
    bool asks;                /* cv_cpu_stream_asks(), read once a product for its decode tiles */
    bool split_tokens;
    int n_parts;
    int64_t part_first[MAX_PARTS + 1]; /* part j owns rows (row-major) or panels [part_first[j], part_first[j+1]) */
    int64_t part_rows[MAX_PARTS];
    float *ys[MAX_PARTS];
    int64_t units;            /* rows (row-major) or panels (packed) */
    /* packed formats */
    int64_t groups, panel_stride, aux_stride;
    const uint8_t *aux;
    /* SwiGLU fused (units are gate panels): up's panel this many panels after gate's; h's rows */
    int64_t glu_up;
    uint16_t *h;
    int64_t ldh;
} linear_job;

/* ---- row-major weights ------------------------------------------------------------------------ */

static void rows_block(const linear_job *job, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
    const int64_t k = job->w->cols;
    const size_t esize = cv_dtype_size(job->f->dtype);
    const cv_gemm_kernel *kern = job->kern;
    const float *x = (const float *)job->x;
    for (int64_t mb = m0; mb < m1; mb += TOKEN_BLOCK) {
        const int64_t me = min64(mb + TOKEN_BLOCK, m1);
        for (int part = 0; part < job->n_parts; part++) {
            const int64_t first = job->part_first[part], ldy = job->part_rows[part];
            const int64_t a = max64(n0, first), b = min64(n1, job->part_first[part + 1]);
            for (int64_t r = a; r < b; r += kern->nr) {
                const int nr = (int)min64(b - r, kern->nr);
                const void *wr = (const char *)job->w->data + (size_t)r * (size_t)k * esize;
                for (int64_t i = mb; i < me; i += kern->mr) {
                    const int mr = (int)min64(me - i, kern->mr);
                    kern->rows(wr, k, x + i * k, k, job->ys[part] + i * ldy + (r - first), ldy, mr, nr, k);
                }
            }
        }
    }
}

/* ---- packed panels ---------------------------------------------------------------------------- */

static const uint8_t *panel_codes(const linear_job *job, int64_t p) {
    return (const uint8_t *)job->w->data + p * job->panel_stride;
}

/* The tiles of one register tile's panels [p0, p1) of one part (p1 − p0 ≤ nr) × tokens [m0, m1) over
 * k groups [g0, g1), into y (token m0's outputs of panel p0; rows ldy apart). SwiGLU fused: p1 = p0 +
 * 1, the tile's second panel is up's. spread > 1 (one token, whole panels): the tile's panels are
 * p0, p0 + spread, … (p1 − p0 of them), their outputs put in place from a buffer, as the kernels
 * write a tile's panels side by side. next_p: the first panel of the tile the walk reaches next, for
 * the streams to run into (−1: none known, or the next tile is these panels' next k block, where
 * their streams run on by themselves). */
static void panel_range(const linear_job *job, int part, int64_t p0, int64_t p1, int64_t spread, int64_t m0,
                        int64_t m1, int64_t g0, int64_t g1, float *y, int64_t ldy, int64_t next_p) {
    const cv_format_traits *f = job->f;
    const cv_gemm_kernel *kern = job->kern;
    const int64_t first = job->part_first[part], rows = job->part_rows[part];
    const int64_t k0 = g0 * f->k_group, step = job->glu_up ? job->glu_up : spread;
    float spread_y[MAX_NR * CV_PANEL_ROWS];
    assert(p1 - p0 <= kern->nr && kern->nr <= MAX_NR);
    assert(spread == 1 || (m1 - m0 == 1 && !job->glu_up &&
                           (p0 + (p1 - p0 - 1) * spread - first + 1) * CV_PANEL_ROWS <= rows)); /* whole panels */
    cv_panel_tile t = {
        .panel_stride = step * job->panel_stride,
        .next = next_p >= 0 ? panel_codes(job, next_p) : NULL,
        .aux_stride = step * job->aux_stride,
        .k0 = k0,
        .k = min64(g1 * f->k_group, job->w->cols) - k0,
        .ldx = job->ldx,
        .first = g0 == 0,
        .last = g1 == job->groups,
        .ask = m1 - m0 <= CV_STREAM_TOKENS && job->asks,
        .ldy = ldy,
    };
    for (int64_t p = p0; p < p1; p += kern->nr) {
        t.np = job->glu_up ? 2 : (int)min64(p1 - p, kern->nr);
        t.w = panel_codes(job, p) + g0 * f->group_bytes;
        t.aux = job->aux + p * job->aux_stride;
        const int64_t c0 = (p - first) * CV_PANEL_ROWS;
        t.n_out = job->glu_up ? 2 * CV_PANEL_ROWS : (int)min64(rows - c0, (int64_t)t.np * CV_PANEL_ROWS);
        /* A streamed tile's kernel waits on its first aux line (the row sums of an int8 tile seed
         * its accumulators; the scales end it), one line of another stream a tile: ask for the next
         * tile's now (+3 % on the int8 lm_head shape, with the asks of cv_panel_ahead). */
        if (next_p >= 0 && m1 - m0 <= CV_STREAM_TOKENS)
            for (int j = 0; j < t.np; j++)
                for (int64_t b = 0; b < job->aux_stride; b += 64)
                    __builtin_prefetch(job->aux + next_p * job->aux_stride + j * t.aux_stride + b);
        for (int64_t i = m0; i < m1; i += kern->mr) {
            t.mr = (int)min64(m1 - i, kern->mr);
            t.x = job->x + (i * job->ldx + k0) * job->x_size;
            t.x_scale = job->x_scale ? job->x_scale + i : NULL;
            t.y = spread > 1 ? spread_y : y + (i - m0) * ldy + (p - p0) * CV_PANEL_ROWS;
            kern->panel(&t);
        }
        for (int j = 0; spread > 1 && j < t.np; j++)
            memcpy(y + j * spread * CV_PANEL_ROWS, spread_y + j * CV_PANEL_ROWS, CV_PANEL_ROWS * sizeof *spread_y);
    }
}

static int64_t token_block_of(const linear_job *job) {
    const int mr = job->kern->mr;
    return (job->kern->token_block ? job->kern->token_block : TOKEN_BLOCK) / mr * mr; /* whole tiles */
}

/* SwiGLU of gate panel p's 16 outputs for tokens [m0, m1), from buf (a token's gate values, then
 * its up values, 32 floats a token) into h, as cv_swiglu_bf16 computes them. */
static void glu_finish(const linear_job *job, int64_t p, int64_t m0, int64_t m1, float *buf) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    const int64_t inter = job->glu_up * CV_PANEL_ROWS, c0 = p * CV_PANEL_ROWS, ld = 2 * CV_PANEL_ROWS;
    if (ops->silu_mul_bf16 && cv_cpu_avx512_bf16()) /* one call: a call per 16 values cost 2× the SwiGLU */
        ops->silu_mul_bf16(job->h + m0 * job->ldh + c0, job->ldh, buf, buf + CV_PANEL_ROWS, ld, (int)(m1 - m0),
                           CV_PANEL_ROWS);
    else
        for (int64_t i = m0; i < m1; i++) {
            float *g = buf + (i - m0) * ld;
            ops->silu_mul(g, g, g + CV_PANEL_ROWS, CV_PANEL_ROWS);
            ops->round_bf16(job->h + i * job->ldh + c0, g, CV_PANEL_ROWS);
        }
    if (c0 + CV_PANEL_ROWS == inter)
        for (int64_t i = m0; i < m1; i++) memset(job->h + i * job->ldh + inter, 0, (size_t)(job->ldh - inter) * 2);
}

/* Panels [p0, p1) (any parts) × tokens [m0, m1), blocked for the caches; SwiGLU fused: gate panels,
 * through buf (token_block_of × 32 floats). */
static void panel_block(const linear_job *job, int64_t p0, int64_t p1, int64_t m0, int64_t m1, float *buf) {
    const int np = job->glu_up ? 1 : job->kern->nr;
    const int64_t kblock = m1 - m0 == 1 ? job->groups : job->kern->kblock ? job->kern->kblock : job->f->kblock;
    const int64_t token_block = token_block_of(job);
    for (int64_t mb = m0; mb < m1; mb += token_block) {
        const int64_t me = min64(mb + token_block, m1);
        for (int part = 0; part < job->n_parts; part++) {
            const int64_t a = max64(p0, job->part_first[part]), b = min64(p1, job->part_first[part + 1]);
            const int64_t rows = job->part_rows[part];
            float *part_y = job->ys[part] + mb * rows; /* the part's first panel's outputs */
            const int64_t first = job->part_first[part];
            int64_t g = a;
            /* One token streams each weight byte once, np panels at a time. Side by side, a tile's
             * panels are np short streams (16 KiB each for int8 at K = 1024) that end together,
             * and the next tile's start cold: its panels come from the range's np parts instead,
             * so each stream runs on through the range, and the hardware prefetchers keep up with
             * it (+5-10 % GB/s at K = 1024, where K = 4096 streamed no faster or slower). A
             * partial last panel goes as usual. */
            const int64_t partial = b == job->part_first[part + 1] && rows % CV_PANEL_ROWS;
            const int64_t spread = me - mb == 1 && np > 1 && !job->glu_up ? (b - a - partial) / np : 0;
            if (spread > 1) {
                for (int64_t q = 0; q < spread; q++)
                    panel_range(job, part, a + q, a + q + np, spread, mb, me, 0, job->groups,
                                part_y + (a + q - first) * CV_PANEL_ROWS, rows, q + 1 < spread ? a + q + 1 : -1);
                g = a + np * spread;
            }
            /* k blocks innermost over panel groups, so one group's slab stays in L1 for all tokens */
            for (; g < b; g += np) {
                const int64_t ge = min64(g + np, b);
                float *y = job->glu_up ? buf : part_y + (g - first) * CV_PANEL_ROWS;
                const int64_t ldy = job->glu_up ? 2 * CV_PANEL_ROWS : rows;
                for (int64_t k0 = 0; k0 < job->groups; k0 += kblock) {
                    const int64_t k1 = min64(k0 + kblock, job->groups);
                    panel_range(job, part, g, ge, 1, mb, me, k0, k1, y, ldy,
                                k1 == job->groups && ge < job->units ? ge : -1);
                }
                if (job->glu_up) glu_finish(job, g, mb, me, buf);
            }
        }
    }
}

/* ---- threading -------------------------------------------------------------------------------- */

static void run_block(const linear_job *job, int64_t u0, int64_t u1, int64_t m0, int64_t m1) {
    if (!job->f->packed) {
        rows_block(job, u0, u1, m0, m1);
        return;
    }
    /* the fused SwiGLU's tile outputs, a token block's (up to 64 KiB; a decode token's 128 bytes) */
    const int64_t buf_tokens = min64(token_block_of(job), m1 - m0);
    float *buf = job->glu_up ? cv_xmalloc((size_t)buf_tokens * 2 * CV_PANEL_ROWS * sizeof *buf) : NULL;
    panel_block(job, u0, u1, m0, m1, buf);
    free(buf);
}

/* A share's units come in multiples of this: whole register tiles of panels, whole lines of y. */
static int64_t unit_align(const linear_job *job) { return job->f->packed ? job->kern->nr : ROW_ALIGN; }

static void linear_task(void *arg, int share, int shares) {
    const linear_job *job = arg;
    int64_t b, e;
    if (job->split_tokens) {
        cv_split(job->m, job->kern->mr, share, shares, &b, &e);
        if (b < e) run_block(job, 0, job->units, b, e);
    } else {
        cv_split(job->units, unit_align(job), share, shares, &b, &e);
        if (b < e) run_block(job, b, e, 0, job->m);
    }
}

/* Runs the job over the pool, or on the caller when it is tiny. Split over units for one token, a
 * share is about SHARE_BYTES of weights (at least one per thread): a thread whose vCPU started late
 * or ran slow leaves its last shares to the others, where fixed halves kept the faster one waiting
 * at the end of every call (with a busy loop beside it on 2 cores, a 0.6B W8A8 decode ran 10.7-11.1
 * tok/s so, 33.0-36.1 now); a thread walks its own shares in order, one stream for the prefetchers. */
static void run_job(cv_threadpool *pool, linear_job *job) {
    const int nt = cv_threadpool_size(pool);
    /* per thread: a few register tiles' worth of panels, or 4 row groups */
    const int64_t enough = job->f->packed ? 4LL * job->kern->nr * nt : (int64_t)ROW_ALIGN * 4 * nt;
    job->split_tokens = job->units < enough && job->m >= (int64_t)job->kern->mr * nt;
    if (nt == 1 || job->m * job->w->rows * job->w->cols < SERIAL_FLOPS) {
        run_block(job, 0, job->units, 0, job->m);
        return;
    }
    int64_t shares = nt;
    if (!job->split_tokens) {
        const int64_t unit_bytes = job->f->packed ? job->panel_stride * (job->glu_up ? 2 : 1)
                                                  : job->w->cols * (int64_t)cv_dtype_size(job->f->dtype);
        const int64_t align = unit_align(job), aligned = ceil_div(job->units, align);
        /* Only one token's product is cut finer: every share reads all the activations, and with
         * 256 KiB shares for every product a 16×512-token prefill ran 5-8 % slower and `bench serve`
         * (16 streams, prefill chunks in the steps) ~5 % slower; one share a thread restored both.
         * A batch-16 decode alone ran 3-7 % faster with them, but serve's loss is not yet explained,
         * so decode batches take one share a thread too. */
        if (job->m == 1) {
            const int64_t by_bytes = ceil_div(aligned * align * unit_bytes, SHARE_BYTES);
            shares = max64(min64(aligned, min64(CV_THREADPOOL_MAX_SHARES, by_bytes)), nt);
        }
    }
    cv_threadpool_run_shares(pool, linear_task, job, (int)shares);
}

/* The job's weight and input; the caller sets its parts. */
static void job_init(linear_job *job, const cv_weight *w, const cv_act *x, int64_t m) {
    assert((unsigned)w->format < CV_WFORMAT_COUNT);
    const cv_format_traits *f = cv_formats[w->format];
    *job = (linear_job){.w = w, .f = f, .kern = cv_format_gemm(w->format, m), .m = m, .asks = cv_cpu_stream_asks()};
    const cv_gemm_kernel *bf16_kern = x->bf16 ? cv_format_gemm_bf16(w->format) : NULL;
    if (bf16_kern) {
        job->kern = bf16_kern;
        job->x = (const char *)x->bf16;
        job->ldx = cv_act_bf16_stride(w->cols);
        job->x_size = sizeof *x->bf16;
    } else if (f->int8_input) {
        assert(x->i8);
        job->x = (const char *)x->i8;
        job->ldx = cv_act_i8_stride(w->cols);
        job->x_size = 1;
        job->x_scale = x->i8_scale;
    } else {
        assert(x->f32);
        job->x = (const char *)x->f32;
        job->ldx = w->cols;
        job->x_size = sizeof(float);
    }
    job->units = f->packed ? ceil_div(w->rows, CV_PANEL_ROWS) : w->rows;
    if (f->packed) {
        job->groups = ceil_div(w->cols, f->k_group);
        job->panel_stride = job->groups * f->group_bytes;
        job->aux_stride = f->aux_bytes ? f->aux_bytes(w->cols) : 0;
        job->aux = (const uint8_t *)w->data + job->units * job->panel_stride;
    }
}

void cv_linear(cv_threadpool *pool, const cv_weight *w, const cv_act *x, int64_t m, int n_parts,
               const int64_t *part_rows, float *const *ys) {
    assert(n_parts >= 1 && n_parts <= MAX_PARTS);
    if (m <= 0 || w->rows <= 0) return;
    linear_job job;
    job_init(&job, w, x, m);
    const cv_format_traits *f = job.f;
    job.n_parts = n_parts;
    /* Row-major parts are row ranges; packed parts are whole panels (all but the last part are
     * multiples of 16 rows). */
    for (int j = 0; j < n_parts; j++) {
        assert(j == n_parts - 1 || part_rows[j] % CV_PANEL_ROWS == 0);
        job.part_rows[j] = part_rows[j];
        job.ys[j] = ys[j];
        job.part_first[j + 1] = job.part_first[j] + (f->packed ? ceil_div(part_rows[j], CV_PANEL_ROWS) : part_rows[j]);
    }
    assert(job.part_first[n_parts] == job.units);
    run_job(pool, &job);
}

bool cv_linear_swiglu_bf16(cv_threadpool *pool, const cv_weight *w, const cv_act *x, int64_t m, int64_t inter,
                           uint16_t *h) {
    linear_job job;
    job_init(&job, w, x, m);
    if (!job.f->packed || job.kern->nr < 2 || inter <= 0 || inter % CV_PANEL_ROWS || w->rows != 2 * inter) return false;
    if (m <= 0) return true;
    job.glu_up = inter / CV_PANEL_ROWS;
    job.h = h;
    job.ldh = cv_act_bf16_stride(inter);
    job.n_parts = 1;
    job.part_rows[0] = inter;
    job.part_first[1] = job.units = job.glu_up; /* the units are gate's panels */
    run_job(pool, &job);
    return true;
}

/* One part that starts at unit part_first[0] instead of 0: the drivers index y and the part's
 * rows from there, so only the units of the range are touched. */
void cv_linear_rows(const cv_weight *w, const cv_act *x, int64_t m, int64_t row0, int64_t row1, float *y) {
    assert(0 <= row0 && row0 <= row1 && row1 <= w->rows);
    if (m <= 0 || row0 == row1) return;
    linear_job job;
    job_init(&job, w, x, m);
    const int64_t unit = job.f->packed ? CV_PANEL_ROWS : 1;
    assert(row0 % unit == 0);
    job.n_parts = 1;
    job.part_rows[0] = row1 - row0;
    job.ys[0] = y;
    job.part_first[0] = row0 / unit;
    job.part_first[1] = ceil_div(row1, unit);
    run_block(&job, job.part_first[0], job.part_first[1], 0, m);
}
