/*
 * linear.c — see linear.h. The originals of packed weights are dropped from memory once packed
 * (madvise DONTNEED), so resident weights stay ~1× their packed size (1 byte a weight plus scales
 * for int8 and e4m3); a hit in the packed-weight cache never touches them at all.
 */
#include "models/layers/linear.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t for streaming */
#include <xxhash.h>

#include "base/error.h"
#include "models/layers/lora.h"

/* ---- binding ---------------------------------------------------------------------------------- */

/* The packed format part p would have, or -1 when it stays a view. */
static int packed_format(const nn_linear *l, const nn_linear_part *p) {
    if (p->scheme == CV_SCHEME_FLOAT && (l->float_views || p->w.dtype != CV_DTYPE_BF16)) return -1;
    return cv_wformat_for_dtype(p->w.dtype);
}

/* Decides l's weights from its parts: one packed weight when they stack (one packed format, one
 * input quantization, every part but the last whole panels), else a weight per part — a view when
 * float. */
static void regroup(nn_linear *l) {
    const int f = packed_format(l, &l->parts[0]);
    bool stack = f >= 0;
    int64_t rows = 0;
    for (int j = 0; j < l->n_parts; j++) {
        const nn_linear_part *p = &l->parts[j];
        stack = stack && packed_format(l, p) == f && p->w.dtype == l->parts[0].w.dtype &&
                cv_act_quant_same(&p->quant, &l->parts[0].quant) &&
                (j == l->n_parts - 1 || p->w.rows % CV_PANEL_ROWS == 0);
        rows += p->w.rows;
    }
    const int64_t cols = l->parts[0].w.cols;
    if (stack) {
        l->n_weights = 1;
        l->first[1] = l->n_parts;
        l->w[0] = (cv_weight){(cv_wformat)f, rows, cols, NULL, false};
        return;
    }
    l->n_weights = l->n_parts;
    for (int j = 0; j < l->n_parts; j++) {
        const cv_weight_part *w = &l->parts[j].w;
        l->first[j + 1] = j + 1;
        l->w[j] = l->parts[j].scheme == CV_SCHEME_FLOAT
                      ? cv_weight_view(&(cv_matrix){w->data, w->dtype, w->rows, w->cols})
                      : (cv_weight){(cv_wformat)cv_wformat_for_dtype(w->dtype), w->rows, w->cols, NULL, false};
    }
}

/* The scheme of `part` agrees with the parts already in l. */
static int check_stack(nn_binder *b, const nn_linear *l, const nn_linear_part *part) {
    if (l->n_parts == 0 || part->scheme == l->parts[0].scheme) return 0;
    const nn_linear_part *first = &l->parts[0];
    return cv_fail(CVLLM_ERR_FORMAT, "%s.weight is %s but %s.weight is %s (%s): parts computed as one stacked "
                   "projection must share a scheme", first->name, cv_linear_scheme_name(first->scheme), part->name,
                   cv_linear_scheme_name(part->scheme), cv_quant_config_origin(cv_weight_source_quant(b->src)));
}

static bool reads_bf16(const nn_linear *l) {
    for (int g = 0; g < l->n_weights; g++)
        if (cv_wformat_bf16_input(l->w[g].format)) return true;
    return false;
}

static void add_part(nn_binder *b, nn_linear *l, const nn_linear_part *part) {
    assert(l->n_parts < NN_MAX_PARTS);
    if ((b->rc = check_stack(b, l, part))) return;
    nn_linear_part *p = &l->parts[l->n_parts++];
    *p = *part;
    p->name = nn_own_string(b, part->name);
    l->observe = b->observe;
    regroup(l);
    if (b->lora_sites) nn_lora_site(b, l, l->n_parts - 1);
    if (b->bf16_input && reads_bf16(l)) {
        if (!b->bf16_rows) b->bf16_rows = nn_own(b, sizeof *b->bf16_rows);
        if (part->w.cols > b->bf16_cols) b->bf16_cols = part->w.cols;
        l->bf16_scratch = b->bf16_rows;
    }
    if (part->scheme != CV_SCHEME_W8A8 && part->scheme != CV_SCHEME_W8A8_DYNAMIC) return;
    if (!b->act_rows) b->act_rows = nn_own(b, sizeof *b->act_rows);
    if (part->w.cols > b->act_cols) b->act_cols = part->w.cols;
    l->scratch = b->act_rows;
}

/* Rows [first, first + n) of p's current rows, in place (a view). */
static void narrow_rows(nn_linear_part *p, int64_t first, int64_t n) {
    p->w.data = (const uint8_t *)p->w.data + (size_t)first * (size_t)p->w.cols * cv_dtype_size(p->w.dtype);
    if (p->w.row_scale) p->w.row_scale += first;
    if (p->w.row_bias) p->w.row_bias += first;
    p->w.rows = n;
}

/* p's rows as n_groups consecutive blocks of group[] rows each cut into n equal pieces: piece r of
 * every block, concatenated in block order — a view of the one block, else an owned copy (with the
 * int8 row scales and biases). */
static void take_row_pieces(nn_binder *b, nn_linear_part *p, const int64_t *group, int n_groups, int n, int r) {
    if (n_groups == 1) {
        narrow_rows(p, (int64_t)r * (group[0] / n), group[0] / n);
        return;
    }
    int64_t rows = 0;
    for (int g = 0; g < n_groups; g++) rows += group[g] / n;
    const size_t row = (size_t)p->w.cols * cv_dtype_size(p->w.dtype);
    uint8_t *data = nn_own(b, (size_t)rows * row);
    float *scale = p->w.row_scale ? nn_own(b, (size_t)rows * sizeof *scale) : NULL;
    int32_t *bias = p->w.row_bias ? nn_own(b, (size_t)rows * sizeof *bias) : NULL;
    if (b->rc) return;
    for (int64_t g = 0, at = 0, start = 0; g < n_groups; start += group[g++]) {
        const int64_t piece = group[g] / n, first = start + (int64_t)r * piece;
        memcpy(data + (size_t)at * row, (const uint8_t *)p->w.data + (size_t)first * row, (size_t)piece * row);
        if (scale) memcpy(scale + at, p->w.row_scale + first, (size_t)piece * sizeof *scale);
        if (bias) memcpy(bias + at, p->w.row_bias + first, (size_t)piece * sizeof *bias);
        at += piece;
    }
    p->w = (cv_weight_part){.dtype = p->w.dtype, .rows = rows, .cols = p->w.cols, .data = data, .row_scale = scale,
                            .row_bias = bias};
}

/* An FP8 part's piece r of n, its block scales with it: the codes of a row piece are a view and
 * the scale grid starts at the piece's first block (block_row0 rows into it); a column piece is a
 * copy of its columns and of its columns of the grid (block_col0 columns into the first). The
 * packed format keeps a scale per 16 rows and 128 columns, so a piece must start on those. */
static void take_fp8_shard(nn_binder *b, nn_linear_part *p, nn_split split, int n_groups, int n, int r) {
    const bool rows = split == NN_SPLIT_ROWS;
    const int64_t part = (rows ? p->w.rows : p->w.cols) / n, first = (int64_t)r * part, B = p->w.block;
    if (n_groups > 1 || part % (rows ? CV_PANEL_ROWS : CV_FP8_SCALE_COLS)) {
        b->rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "tensor %s.weight: an FP8 tensor-parallel shard must be whole %s of "
                        "%d (%lld per rank)", p->name, rows ? "rows in groups" : "columns in groups",
                        rows ? CV_PANEL_ROWS : CV_FP8_SCALE_COLS, (long long)part);
        return;
    }
    const int64_t grid_cols = (p->w.cols + B - 1) / B;
    if (rows) {
        p->w.data = (const uint8_t *)p->w.data + (size_t)first * (size_t)p->w.cols;
        p->w.block_scale += first / B * grid_cols;
        p->w.block_row0 = (int32_t)(first % B);
        p->w.rows = part;
        return;
    }
    const int64_t grid_rows = (p->w.rows + B - 1) / B, col0 = first % B, cols = (col0 + part + B - 1) / B;
    uint8_t *slice = nn_own(b, (size_t)p->w.rows * (size_t)part);
    float *scale = nn_own(b, (size_t)(grid_rows * cols) * sizeof *scale);
    if (b->rc) return;
    for (int64_t i = 0; i < p->w.rows; i++)
        memcpy(slice + (size_t)(i * part), (const uint8_t *)p->w.data + (size_t)(i * p->w.cols + first), (size_t)part);
    for (int64_t i = 0; i < grid_rows; i++)
        memcpy(scale + i * cols, p->w.block_scale + i * grid_cols + first / B, (size_t)cols * sizeof *scale);
    p->w.data = slice;
    p->w.cols = part;
    p->w.block_scale = scale;
    p->w.block_col0 = (int32_t)col0;
}

/* Returns the whole pages inside [p, p + n) to the kernel: a file mapping re-reads them if ever
 * touched again, anonymous memory (dummy weights) reads back zeros, so only for weights never read
 * again. */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = ((uintptr_t)p + page - 1) / page * page, end = ((uintptr_t)p + n) / page * page;
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
}

/* Dummy weights are made whole on every rank: once a rank has taken its shard (a copy, or a view of
 * some rows) of `whole`, the pages of the rest go back, so that a rank holds its shard and not the
 * model (a -tp 2 rank of the 0.6B held all 1.49 GB of it). */
static void drop_unsharded(const cv_tensor *whole, const cv_weight_part *shard) {
    const uintptr_t w0 = (uintptr_t)whole->data, w1 = w0 + whole->nbytes, s0 = (uintptr_t)shard->data;
    const uintptr_t s1 = s0 + (uintptr_t)shard->rows * (uintptr_t)shard->cols * cv_dtype_size(shard->dtype);
    if (s0 >= w0 && s1 <= w1) { /* a view: the rows around it */
        drop_pages(whole->data, s0 - w0);
        drop_pages((const void *)s1, w1 - s1);
    } else {
        drop_pages(whole->data, whole->nbytes);
    }
}

/* Narrows p (the whole [rows][cols] tensor) to piece r of n: of its columns (an owned copy of the
 * slice), or of its rows as take_row_pieces cuts them (group: NULL for all rows as one block). */
static void take_shard(nn_binder *b, nn_linear_part *p, nn_split split, const int64_t *group, int n_groups, int n,
                       int r) {
    const int64_t whole = split == NN_SPLIT_ROWS ? p->w.rows : p->w.cols;
    if (!group) {
        group = &whole;
        n_groups = 1;
    }
    for (int g = 0; g < n_groups; g++)
        if (group[g] % n) {
            b->rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "tensor %s.weight: %s %lld do not split evenly into %d "
                            "tensor-parallel shards", p->name, split == NN_SPLIT_ROWS ? "rows" : "columns",
                            (long long)group[g], n);
            return;
        }
    if (p->w.block_scale) {
        take_fp8_shard(b, p, split, n_groups, n, r);
        return;
    }
    if (split == NN_SPLIT_ROWS) {
        take_row_pieces(b, p, group, n_groups, n, r);
        return;
    }
    const size_t esize = cv_dtype_size(p->w.dtype);
    const int64_t part = whole / n, first = (int64_t)r * part;
    uint8_t *slice = nn_own(b, (size_t)p->w.rows * (size_t)part * esize);
    if (!slice) return;
    for (int64_t i = 0; i < p->w.rows; i++)
        memcpy(slice + (size_t)(i * part) * esize, (const uint8_t *)p->w.data + (size_t)(i * p->w.cols + first) * esize,
               (size_t)part * esize);
    p->w.data = slice;
    p->w.cols = part;
    if (r != 0) p->w.row_bias = NULL; /* added once to the sum over the ranks */
}

/* Binds part `name` of l, narrowed as take_shard says when split (parts > 1). */
static void bind_part(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint,
                      nn_split split, const int64_t *group, int n_groups, int parts, int index) {
    if (b->rc) return;
    cv_qlinear q;
    b->rc = cv_weights_get_qlinear(b->src, name, rows, cols, hint, &q);
    if (b->rc) return;
    if (q.scheme == CV_SCHEME_FLOAT) nn_check_matrix_dtype(b, q.weight.name, q.weight.dtype);
    if (b->rc) return;
    nn_linear_part part = {
        .name = name, .scheme = q.scheme,
        .w = {.dtype = q.weight.dtype, .rows = rows, .cols = cols, .data = q.weight.data, .row_scale = q.row_scale,
              .row_bias = q.row_bias, .block_scale = q.block_scale, .block = q.block},
        .quant = {.dynamic = q.scheme == CV_SCHEME_W8A8_DYNAMIC, .scale = q.input_scale, .offset = q.input_offset},
    };
    if (split != NN_WHOLE && parts > 1) {
        take_shard(b, &part, split, group, n_groups, parts, index);
        if (!b->rc && cv_weight_source_is_dummy(b->src)) drop_unsharded(&q.weight, &part.w);
    }
    if (b->rc) return;
    add_part(b, l, &part);
    if (b->rc) return;
    b->matmul_bytes += q.scheme == CV_SCHEME_FLOAT
                           ? (size_t)part.w.rows * (size_t)part.w.cols * cv_dtype_size(part.w.dtype)
                           : cv_linear_scheme_bytes(q.scheme, part.w.rows, part.w.cols, q.block);
}

void nn_bind_linear_piece(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint,
                          nn_split split, int parts, int index) {
    bind_part(b, l, name, rows, cols, hint, split, NULL, 0, parts, index);
}

void nn_bind_linear_row_groups(nn_binder *b, nn_linear *l, const char *name, const int64_t *group, int n_groups,
                               int64_t cols, const char *hint) {
    int64_t rows = 0;
    for (int g = 0; g < n_groups; g++) rows += group[g];
    bind_part(b, l, name, rows, cols, hint, NN_SPLIT_ROWS, group, n_groups, b->tp.size, b->tp.rank);
}

void nn_bind_linear_split(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint,
                          nn_split split) {
    nn_bind_linear_piece(b, l, name, rows, cols, hint, split, b->tp.size, b->tp.rank);
}

void nn_bind_linear(nn_binder *b, nn_linear *l, const char *name, int64_t rows, int64_t cols, const char *hint) {
    nn_bind_linear_split(b, l, name, rows, cols, hint, NN_WHOLE);
}

void nn_linear_add_view_split(nn_binder *b, nn_linear *l, const char *name, const cv_matrix *w, nn_split split) {
    if (b->rc) return;
    nn_linear_part part = {
        .name = name, .scheme = CV_SCHEME_FLOAT,
        .w = {.dtype = w->dtype, .rows = w->rows, .cols = w->cols, .data = w->data}};
    if (split != NN_WHOLE && b->tp.size > 1) take_shard(b, &part, split, NULL, 0, b->tp.size, b->tp.rank);
    if (!b->rc) add_part(b, l, &part);
}

void nn_linear_add_view(nn_binder *b, nn_linear *l, const char *name, const cv_matrix *w) {
    nn_linear_add_view_split(b, l, name, w, NN_WHOLE);
}

/* ---- forward ---------------------------------------------------------------------------------- */

const cv_act_quant *nn_linear_input_quant(const nn_linear *l) {
    return l->n_parts && cv_wformat_int8_input(l->w[0].format) ? &l->parts[0].quant : NULL;
}

bool nn_linear_input_bf16(const nn_linear *l) {
    if (!l->bf16_scratch || !l->n_weights) return false;
    for (int g = 0; g < l->n_weights; g++)
        if (!cv_wformat_bf16_input(l->w[g].format)) return false;
    return true;
}

/* x's rows as int8 codes quantized with q: the producer's, or the scratch's, quantized there unless
 * *in_scratch (what the scratch holds in this call, NULL: nothing yet) is q already. */
static cv_act int8_rows(cv_threadpool *pool, const nn_linear *l, const cv_act_quant *q, nn_input x, int64_t T,
                        const cv_act_quant **in_scratch) {
    if (x.i8 && cv_act_quant_same(&x.quant, q)) return (cv_act){.i8 = x.i8, .i8_scale = x.i8_scale};
    if (!*in_scratch || !cv_act_quant_same(*in_scratch, q)) {
        assert(x.f32);
        const int64_t cols = l->parts[0].w.cols;
        cv_quantize_rows(pool, q, x.f32, cols, T, cols, l->scratch->codes, l->scratch->scale);
        *in_scratch = q;
    }
    return (cv_act){.i8 = l->scratch->codes, .i8_scale = l->scratch->scale};
}

/* The input of l's weight g: x's int8 codes or bf16 rows, made in the scratch when the producer
 * did not (*in_scratch, *bf16: what the scratch holds in this call, as int8_rows), or x's f32 rows. */
static cv_act weight_input(cv_threadpool *pool, const nn_linear *l, int g, nn_input x, int64_t T,
                           const cv_act_quant **in_scratch, const uint16_t **bf16) {
    assert(l->w[g].data);
    if (cv_wformat_int8_input(l->w[g].format)) return int8_rows(pool, l, &l->parts[l->first[g]].quant, x, T, in_scratch);
    cv_act act = {.f32 = x.f32};
    if (l->bf16_scratch && cv_wformat_bf16_input(l->w[g].format)) {
        if (!*bf16) *bf16 = x.bf16;
        if (!*bf16) {
            assert(x.f32);
            const int64_t cols = l->parts[0].w.cols;
            cv_round_bf16_rows(pool, x.f32, cols, T, cols, l->bf16_scratch->rows);
            *bf16 = l->bf16_scratch->rows;
        }
        act.bf16 = *bf16;
    }
    return act;
}

bool nn_linear_swiglu_bf16(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, uint16_t *h) {
    if (l->observe.fn || nn_lora_active(l) || l->n_weights != 1 || l->n_parts != 2 || l->parts[0].w.rows != l->parts[1].w.rows)
        return false;
    /* h is the shared bf16 scratch: the input must not be rounded into it too */
    if (l->bf16_scratch && cv_wformat_bf16_input(l->w[0].format) && !x.bf16) return false;
    const cv_act_quant *in_scratch = NULL;
    const uint16_t *bf16 = NULL;
    const cv_act act = weight_input(pool, l, 0, x, T, &in_scratch, &bf16);
    return cv_linear_swiglu_bf16(pool, &l->w[0], &act, T, l->parts[0].w.rows, h);
}

void nn_linear_forward(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, float *const *ys) {
    if (l->observe.fn) {
        assert(x.f32);
        for (int j = 0; j < l->n_parts; j++)
            l->observe.fn(l->observe.ctx, l->parts[j].name, x.f32, T, l->parts[j].w.cols);
    }
    const cv_act_quant *in_scratch = NULL;
    const uint16_t *bf16 = NULL; /* x rounded, once for every bf16 weight of l */
    for (int g = 0; g < l->n_weights; g++) {
        const nn_linear_part *first = &l->parts[l->first[g]];
        const cv_act act = weight_input(pool, l, g, x, T, &in_scratch, &bf16);
        int64_t rows[NN_MAX_PARTS];
        const int n = l->first[g + 1] - l->first[g];
        for (int j = 0; j < n; j++) rows[j] = first[j].w.rows;
        cv_linear(pool, &l->w[g], &act, T, n, rows, ys + l->first[g]);
    }
    nn_lora_forward(pool, l, x, T, ys);
}

nn_input nn_add_rmsnorm_for(cv_threadpool *pool, float *x, const float *delta, float *a, const float *w, int64_t T,
                            int64_t dim, float eps, const nn_linear *next, bool only_next, const nn_qrows *q,
                            const nn_brows *ab) {
    const cv_act_quant *quant = next ? nn_linear_input_quant(next) : NULL;
    if (!quant && ab->rows && next && nn_linear_input_bf16(next)) {
        /* the f32 rows cost a write of 4 bytes an element that nothing may read */
        float *y = only_next && !next->observe.fn ? NULL : a;
        cv_add_rmsnorm_bf16(pool, x, delta, y, w, T, dim, eps, ab->rows);
        return (nn_input){.f32 = y, .bf16 = ab->rows};
    }
    if (!quant) {
        cv_add_rmsnorm(pool, x, delta, a, w, T, dim, eps);
        return nn_f32(a);
    }
    cv_add_rmsnorm_quant(pool, x, delta, a, w, T, dim, eps, quant, q->codes, q->scale);
    return (nn_input){.f32 = a, .i8 = q->codes, .i8_scale = q->scale, .quant = *quant};
}

void nn_qrows_take(nn_qrows *q, nn_arena *a, int32_t tokens, int64_t cols) {
    if (cols <= 0) return;
    q->codes = nn_take(a, (size_t)tokens * (size_t)cv_act_i8_stride(cols));
    q->scale = nn_take(a, (size_t)tokens * sizeof(float));
}

void nn_linear_scratch_take(const nn_binder *b, nn_arena *a, int32_t tokens) {
    if (b->act_rows) nn_qrows_take(b->act_rows, a, tokens, b->act_cols);
    if (b->bf16_rows) b->bf16_rows->rows = nn_take(a, (size_t)tokens * (size_t)cv_act_bf16_stride(b->bf16_cols) * 2);
}

void nn_linear_list_add(nn_linear_list *list, nn_linear *l) {
    if (list->n == list->cap) {
        list->cap = list->cap ? 2 * list->cap : 64;
        list->at = cv_xrealloc(list->at, (size_t)list->cap * sizeof *list->at);
    }
    list->at[list->n++] = l;
}

void nn_linear_list_free(nn_linear_list *list) {
    free(list->at);
    *list = (nn_linear_list){0};
}

/* ---- packing ---------------------------------------------------------------------------------- */

/* One weight to pack: weight g of linear l. */
typedef struct pack_item {
    nn_linear *l;
    int g;
} pack_item;

/* What the cache key must cover besides the checkpoint files: the packing, every packed weight's
 * format and the shapes of its parts. */
static uint64_t pack_layout_hash(const char *layout, const pack_item *items, int n) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, layout, strlen(layout) + 1);
    for (int i = 0; i < n; i++) {
        const nn_linear *l = items[i].l;
        const int64_t head[2] = {l->w[items[i].g].format, l->first[items[i].g + 1] - l->first[items[i].g]};
        XXH3_64bits_update(&st, head, sizeof head);
        for (int j = l->first[items[i].g]; j < l->first[items[i].g + 1]; j++) {
            const int64_t shape[3] = {j, l->parts[j].w.rows, l->parts[j].w.cols};
            XXH3_64bits_update(&st, shape, sizeof shape);
        }
    }
    return XXH3_64bits_digest(&st);
}

static size_t item_bytes(const pack_item *it) {
    const cv_weight *w = &it->l->w[it->g];
    return cv_weight_packed_bytes(w->format, w->rows, w->cols);
}

/* The packed-weight cache entry for items[0..n) (NULL for dummy weights or when unavailable). */
static cv_pack_cache *open_pack_cache(cv_weight_source *src, const char *layout, const pack_item *items, int n,
                                      cv_threadpool *pool) {
    const size_t n_files = cv_weight_source_n_files(src);
    if (!n_files || !n) return NULL;
    const char **files = cv_xmalloc(n_files * sizeof *files);
    for (size_t i = 0; i < n_files; i++) files[i] = cv_weight_source_file(src, i);
    size_t *sizes = cv_xmalloc((size_t)n * sizeof *sizes);
    for (int i = 0; i < n; i++) sizes[i] = item_bytes(&items[i]);
    cv_pack_cache *c = cv_pack_cache_open(files, n_files, pack_layout_hash(layout, items, n), sizes, n, pool);
    free(sizes);
    free(files);
    return c;
}

/* Packs one item into dst (a cache section), or into memory of its own when dst is NULL, then
 * drops the checkpoint's pages of its parts. */
static int pack_item_into(cv_threadpool *pool, const pack_item *it, void *dst) {
    nn_linear *l = it->l;
    const int first = l->first[it->g], n = l->first[it->g + 1] - first;
    cv_weight_part parts[NN_MAX_PARTS];
    for (int j = 0; j < n; j++) parts[j] = l->parts[first + j].w;
    int rc = dst ? cv_weight_pack_into(pool, parts, n, dst, &l->w[it->g]) : cv_weight_pack(pool, parts, n, &l->w[it->g]);
    if (rc) return cv_fail_prefix(rc, "packing %s", l->parts[first].name);
    for (int j = 0; j < n; j++)
        drop_pages(parts[j].data, (size_t)(parts[j].rows * parts[j].cols) * cv_dtype_size(parts[j].dtype));
    return 0;
}

int nn_pack_linears(cv_threadpool *pool, cv_weight_source *src, const char *layout, const nn_linear_list *lins,
                    cv_pack_cache **cache) {
    int n = 0, cap = 64;
    pack_item *items = cv_xmalloc((size_t)cap * sizeof *items);
    for (int i = 0; i < lins->n; i++)
        for (int g = 0; g < lins->at[i]->n_weights; g++) {
            if (lins->at[i]->w[g].data) continue; /* a view */
            if (n == cap) items = cv_xrealloc(items, (size_t)(cap *= 2) * sizeof *items);
            items[n++] = (pack_item){lins->at[i], g};
        }
    *cache = open_pack_cache(src, layout, items, n, pool);
    const bool hit = *cache && cv_pack_cache_hit(*cache);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        cv_weight *w = &items[i].l->w[items[i].g];
        if (hit) w->data = cv_pack_cache_section(*cache, i); /* the originals are never touched */
        else rc = pack_item_into(pool, &items[i], *cache ? cv_pack_cache_section(*cache, i) : NULL);
    }
    if (!rc && *cache && !hit) cv_pack_cache_commit(*cache, pool);
    free(items);
    return rc;
}

void nn_linear_release(nn_linear *l) {
    for (int g = 0; g < l->n_weights; g++) cv_weight_release(&l->w[g]);
}

void nn_linear_list_release(nn_linear_list *list) {
    for (int i = 0; i < list->n; i++) nn_linear_release(list->at[i]);
    nn_linear_list_free(list);
}
