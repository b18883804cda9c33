/*
 * kernels.h — the numeric building blocks of a forward pass, on the CPU.
 *
 * Kernels know tensors as pointers, sizes and element types only; nothing here knows about models,
 * configs or the engine. Activations are f32 (rows contiguous), or int8 codes for int8 weights.
 * Weights are [out, in]: row-major f32, bf16 or f16 straight from the checkpoint mapping, or
 * repacked once at load into a kernel format (cv_weight: bf16, int8 or e4m3 panels); either way
 * they are widened inside the kernel, so no dequantized copy of the weights ever exists.
 *
 * The hot kernels (matmul, dot products inside attention and norms) have AVX-512, AVX2 and scalar
 * versions; one is picked at first use from the CPU's features, or from CVLLM_ISA
 * (avx512|avx2|scalar), and tests can switch with cv_isa_force(). The AVX-512 int8 matmul uses
 * AVX512-VNNI where the CPU has it. Kernels that take a thread pool split their work across it
 * (NULL: run on the caller); the others are cheap enough to run on the calling thread.
 */
#ifndef CV_KERNELS_H
#define CV_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

typedef struct cv_threadpool cv_threadpool;

/* ---- instruction set selection ---------------------------------------------------------------- */

typedef enum cv_isa { CV_ISA_SCALAR = 0, CV_ISA_AVX2, CV_ISA_AVX512, CV_ISA_COUNT } cv_isa;

bool cv_isa_supported(cv_isa isa);      /* the CPU (and this build) can run it */
cv_isa cv_isa_active(void);
/* Makes `isa` the active path for all later kernel calls (not while kernels run). An ISA the CPU
 * lacks: CVLLM_ERR_UNSUPPORTED. */
int cv_isa_force(cv_isa isa);
const char *cv_isa_name(cv_isa isa);    /* "scalar", "avx2", "avx512" */
/* Parses a name as cv_isa_name spells it; -1 when unknown. */
int cv_isa_from_name(const char *name);

/* ---- weights in kernel formats (the format traits table, kernels/cpu/formats.c) -------------- */

/* A checkpoint matrix [rows][cols] (rows = output features) of dtype f32, bf16 or f16, row-major as
 * stored (what cv_weight_view wraps). */
typedef struct cv_matrix {
    const void *data;
    cv_dtype dtype;
    int64_t rows, cols;
} cv_matrix;

/*
 * A linear layer's weight as the kernels stream it. Every format has one entry in a traits table:
 * its packing, the input it reads (f32 activations, or int8 codes quantized by the caller), and its
 * GEMM per ISA. Packed formats store rows in 16-row panels (CV_PANEL_ROWS) so one vector load holds
 * 16 outputs; per-row or per-block scales live in the same block of memory after the codes, so one
 * mapping (or one packed-weight cache file) holds the whole weight.
 *
 *   F32, BF16, F16   row-major, a view of the checkpoint (not packed)
 *   BF16_PANELS      bf16, panels of k pairs ([ceil(K/2)][16 rows][2 k]: element (r, c) at panel
 *                    r/16, offset ((c/2)·16 + r%16)·2 + c%2, zero-padded past the last row and
 *                    column), so one 64-byte load holds 16 outputs × 2 inputs, widened in registers
 *                    for lane-wise f32 FMA with no horizontal sums
 *   I8_PANELS        int8 codes, panels of k quads ([ceil(K/4)][16 rows][4 k], VNNI order), then per
 *                    row an f32 scale, an int32 bias (0 when none) and the int32 sum of the row's
 *                    codes: y[t][n] = (Σ_k xq[t][k]·w[n][k] + bias[n]) · row_scale[n] · x_scale[t],
 *                    the sum exact in int32 (K ≤ 131071), then (float)(sum + bias), times the row
 *                    scale, times the token scale, in that order: the same bits on every ISA
 *   FP8_PANELS       e4m3 codes, panels k-major ([K][16 rows]), then an f32 scale per panel per
 *                    128-column block: y = Σ_k x[k] · e4m3(w[n][k]) · scale(n, k); activations f32;
 *                    the scale is applied per 128-column block sum
 */
enum { CV_PANEL_ROWS = 16, CV_FP8_SCALE_COLS = 128 /* FP8_PANELS: columns per scale */ };

typedef enum cv_wformat {
    CV_WFORMAT_F32 = 0,
    CV_WFORMAT_BF16,
    CV_WFORMAT_F16,
    CV_WFORMAT_BF16_PANELS,
    CV_WFORMAT_I8_PANELS,
    CV_WFORMAT_FP8_PANELS,
    CV_WFORMAT_COUNT
} cv_wformat;

typedef struct cv_weight {
    cv_wformat format;
    int64_t rows, cols;
    const void *data;         /* the row-major view, or the packed block (codes, then scales) */
    bool owned;               /* data is this struct's own mapping (cv_weight_pack) */
} cv_weight;

/* One checkpoint matrix to pack, row-major [rows][cols]. */
typedef struct cv_weight_part {
    cv_dtype dtype;           /* BF16 → BF16_PANELS, I8 → I8_PANELS, F8_E4M3 → FP8_PANELS */
    int64_t rows, cols;
    const void *data;
    const float *row_scale;   /* I8: [rows] (msModelSlim deq_scale or weight_scale) */
    const int32_t *row_bias;  /* I8: [rows] added to the int32 accumulator (quant_bias), or NULL */
    const float *block_scale; /* FP8: [ceil((block_row0+rows)/block)][ceil((block_col0+cols)/block)]
                               * (weight_scale_inv) */
    int32_t block;            /* FP8: the block edge (partial edge blocks included); a multiple of
                               * 128, as the packed format keeps a scale per 128 columns */
    int32_t block_row0, block_col0; /* FP8: where the part starts inside its first scale block (a
                               * tensor-parallel shard; 0 for a whole tensor): rows a multiple of 16,
                               * columns of 128, so that a panel and a 128-column scale lie in one block */
} cv_weight_part;

const char *cv_wformat_name(cv_wformat f);
/* The packed format of a checkpoint dtype (-1 when none). */
int cv_wformat_for_dtype(cv_dtype t);
/* The format reads int8 codes (cv_act.i8) rather than f32 activations. */
bool cv_wformat_int8_input(cv_wformat f);
/* In bf16 compute on this CPU (cv_linear_bf16_input, asked before), weights of format f read bf16
 * rows (cv_act.bf16) rather than f32 ones: BF16_PANELS, and FP8_PANELS without AMX. */
bool cv_wformat_bf16_input(cv_wformat f);
size_t cv_weight_packed_bytes(cv_wformat f, int64_t rows, int64_t cols);
/* Packs parts[0..n_parts) (n_parts ≤ 4, one dtype, equal cols, every part but the last with
 * rows % CV_PANEL_ROWS == 0) stacked by rows, on the pool. cv_weight_pack maps memory of its own
 * (cv_weight_release); cv_weight_pack_into writes cv_weight_packed_bytes bytes at dst (e.g. a
 * file mapping) and *out borrows dst; the bytes do not depend on the pool. A dtype without a
 * packed format, an FP8 block edge not a multiple of 128, more columns than an int8 sum holds:
 * CVLLM_ERR_UNSUPPORTED; parts that do not stack, missing scales: CVLLM_ERR_INVALID_ARGUMENT;
 * non-finite scales, e4m3 NaN codes: CVLLM_ERR_FORMAT (naming the part and row or block); no
 * memory: CVLLM_ERR_NO_MEMORY. */
int cv_weight_pack(cv_threadpool *pool, const cv_weight_part *parts, int n_parts, cv_weight *out);
int cv_weight_pack_into(cv_threadpool *pool, const cv_weight_part *parts, int n_parts, void *dst, cv_weight *out);
void cv_weight_release(cv_weight *w);
/* A row-major checkpoint matrix as a weight (a view; f32, bf16 or f16). */
cv_weight cv_weight_view(const cv_matrix *m);
/* out[i][:] = row ids[i] of w as f32 (an embedding table, or a tied embedding read from the packed
 * lm_head); every id < w->rows. Any format but I8_PANELS, whose rows mean nothing without the
 * activation scale. */
void cv_embed_weight(const cv_weight *w, const int32_t *ids, int64_t n, float *out);

/* The input of a linear, in the form its weight's format reads: f32 rows, or int8 codes rows
 * cv_act_i8_stride(cols) bytes apart (zero past cols: the kernels read whole groups of 4) with a
 * per-row scale (NULL: 1); for BF16_PANELS in bf16 compute, the f32 rows rounded to bf16. */
typedef struct cv_act {
    const float *f32;         /* [m][cols] */
    const int8_t *i8;         /* [m][cv_act_i8_stride(cols)] */
    const float *i8_scale;    /* [m] or NULL */
    const uint16_t *bf16;     /* [m][cv_act_bf16_stride(cols)], zero past cols, or NULL: BF16_PANELS then
                               * reads f32 (exact f32 FMA on the widened weights) */
} cv_act;

int64_t cv_act_i8_stride(int64_t cols);   /* cols rounded up to a multiple of 64 */
int64_t cv_act_bf16_stride(int64_t cols); /* cols rounded up to a multiple of 32 (one 64-byte row of k pairs) */

/* out [m][cv_act_bf16_stride(cols)] = x rows rounded to bf16 (nearest even; NaN stays NaN), zero
 * past cols; on the pool. */
void cv_round_bf16_rows(cv_threadpool *pool, const float *x, int64_t ldx, int64_t m, int64_t cols, uint16_t *out);

/* bf16 compute: true when this CPU has a bf16 dot-product kernel for BF16_PANELS that beats f32 FMA
 * on widened weights (AMX tdpbf16ps wherever this process may use AMX; else AVX512-BF16 vdpbf16ps
 * where a start-up measurement says so), so that bf16 layers should pass cv_act.bf16; false: they
 * pass f32 rows, computed exactly. Decided once and logged with the reason. */
bool cv_linear_bf16_input(void);
/* Tests: force the bf16-input kernels on (CVLLM_ERR_UNSUPPORTED on a CPU without them) or off; not
 * while kernels run. */
int cv_cpu_bf16_dot_enable(bool on);

/* ys[j] [m][part_rows[j]] = x · part jᵀ for every stacked part of w (part_rows as packed; one part:
 * n_parts 1, part_rows &w->rows). One pass over x, one wake of the pool. x is read in the form w's
 * format takes: int8 codes for I8_PANELS; for BF16_PANELS the bf16 rows when x->bf16 is given
 * (vdpbf16ps or AMX tdpbf16ps: products of bf16 pairs accumulated in f32), else the f32 rows (f32
 * FMA, exact); f32 otherwise. Every output is one accumulation chain in k order whatever m, the tile
 * or the thread split, so a token's row does not depend on the tokens computed with it (batch
 * invariance). */
void cv_linear(cv_threadpool *pool, const cv_weight *w, const cv_act *x, int64_t m, int n_parts,
               const int64_t *part_rows, float *const *ys);
/* SwiGLU fused into its gate|up product: w stacks gate rows [0, inter) over up rows [inter,
 * 2·inter); h [m][cv_act_bf16_stride(inter)] (zero past inter) = bf16(silu(x·gateᵀ) ⊙ (x·upᵀ)),
 * the bits of cv_linear into f32 rows and then cv_swiglu_bf16, without writing those rows. Returns
 * false, having done nothing, where the fused form does not run: a row-major weight, a kernel whose
 * tile holds one panel, or inter not a multiple of 16. */
bool cv_linear_swiglu_bf16(cv_threadpool *pool, const cv_weight *w, const cv_act *x, int64_t m, int64_t inter,
                           uint16_t *h);
/* y [m][row1 − row0] = x · rows [row0, row1) of wᵀ, on the calling thread (a thread's share of a
 * weight, as the grouped MoE kernel splits experts). Packed formats: row0 a multiple of
 * CV_PANEL_ROWS. */
void cv_linear_rows(const cv_weight *w, const cv_act *x, int64_t m, int64_t row0, int64_t row1, float *y);

/* ---- activation quantization (int8 inputs of I8_PANELS weights) ---------------------------------- */

/* msModelSlim's two activation schemes, rounding half to even as PyTorch does:
 *   static:  xq = clamp(round(x / scale + offset), −128, 127), row scale 1 (it is in the weight's)
 *   dynamic: per row s = max|x| / 127, xq = round(x / s), row scale s (a zero row: codes 0, s 0) */
typedef struct cv_act_quant {
    bool dynamic;
    float scale, offset;      /* static only */
} cv_act_quant;

/* a and b give the same codes for the same rows. */
static inline bool cv_act_quant_same(const cv_act_quant *a, const cv_act_quant *b) {
    return a->dynamic == b->dynamic && (a->dynamic || (a->scale == b->scale && a->offset == b->offset));
}

/* xq [m][cv_act_i8_stride(cols)], scale [m] (written for both schemes); large inputs split their
 * rows over the pool (NULL: on the calling thread). */
void cv_quantize_rows(cv_threadpool *pool, const cv_act_quant *q, const float *x, int64_t ldx, int64_t m,
                      int64_t cols, int8_t *xq, float *scale);
/* cv_add_rmsnorm, then the normed rows quantized with q into yq/yscale; y (f32) is still written
 * when not NULL (a later f32 consumer of the same rows). */
void cv_add_rmsnorm_quant(cv_threadpool *pool, float *x, const float *delta, float *y, const float *w, int64_t rows,
                          int64_t dim, float eps, const cv_act_quant *q, int8_t *yq, float *yscale);
/* cv_swiglu with the result quantized with q into hq/hscale instead of written as f32. */
void cv_swiglu_quant(cv_threadpool *pool, const float *gu, int64_t rows, int64_t n, int64_t ld, int64_t up_offset,
                     const cv_act_quant *q, int8_t *hq, float *hscale);
/* The same two with the rows rounded to bf16 as cv_round_bf16_rows rounds them (yb, hb: rows
 * cv_act_bf16_stride apart, zero-padded), for a bf16-input linear. */
void cv_add_rmsnorm_bf16(cv_threadpool *pool, float *x, const float *delta, float *y, const float *w, int64_t rows,
                         int64_t dim, float eps, uint16_t *yb);
void cv_swiglu_bf16(cv_threadpool *pool, const float *gu, int64_t rows, int64_t n, int64_t ld, int64_t up_offset,
                    uint16_t *hb);

/* ---- element-wise and row-wise ---------------------------------------------------------------- */

/* For each of `rows` rows of length dim: y = w ⊙ (x / sqrt(mean(x²) + eps)). y may alias x. Per-head
 * norms are the same call with rows = tokens·heads and dim = head_dim. */
void cv_rmsnorm(float *y, const float *x, const float *w, int64_t rows, int64_t dim, float eps);
/* Fused residual add and norm, on the pool: x += delta (skipped when delta is NULL), then
 * y = rmsnorm(x) · w, row by row, each row touched once while in cache. */
void cv_add_rmsnorm(cv_threadpool *pool, float *x, const float *delta, float *y, const float *w, int64_t rows,
                    int64_t dim, float eps);
/* out = silu(gate) ⊙ up; out may alias gate or up. */
void cv_silu_mul(float *out, const float *gate, const float *up, int64_t n);
/* SwiGLU over rows of a fused gate|up projection, on the pool: out[t][i] = silu(gu[t·ld + i]) ·
 * gu[t·ld + up_offset + i] for i < n, with n ≤ ld. out may equal gu (then it runs on the caller). */
void cv_swiglu(cv_threadpool *pool, float *out, const float *gu, int64_t rows, int64_t n, int64_t ld,
               int64_t up_offset);
/* y += x */
void cv_add(float *y, const float *x, int64_t n);
/* A low-rank update (LoRA's B·h, with B stored transposed): y[rows[i]·ldy + o] += Σ_r h[i·rank + r] ·
 * bt[r·n + o] for o < n and i < m (rank ≤ 1024), the terms added to y one r after another, whatever m
 * and the pool: every element sums in the same order. */
void cv_lowrank_add(cv_threadpool *pool, float *y, int64_t ldy, const int64_t *rows, const float *h, int64_t m,
                    int64_t rank, const float *bt, int64_t n);
/* In-place softmax of one row (f32, max-subtracted). */
void cv_softmax(float *x, int64_t n);

/* ---- rotary position embedding ---------------------------------------------------------------- */

typedef enum cv_rope_kind { CV_ROPE_KIND_DEFAULT = 0, CV_ROPE_KIND_LINEAR, CV_ROPE_KIND_DYNAMIC, CV_ROPE_KIND_YARN } cv_rope_kind;

typedef struct cv_rope_params {
    cv_rope_kind kind;
    double theta;
    double factor;                 /* linear / dynamic / yarn */
    int32_t original_max_position; /* yarn, dynamic: the trained context length */
    double beta_fast, beta_slow;   /* yarn */
    double attention_factor;       /* yarn; 0 = 0.1·ln(factor) + 1 */
    int32_t rot_dim;               /* even, ≤ head_dim; the first rot_dim entries of a head rotate */
} cv_rope_params;

typedef struct cv_rope {
    int32_t rot_dim;
    float attention_factor;        /* multiplies cos and sin */
    float *inv_freq;               /* [rot_dim/2] */
} cv_rope;

/* Dynamic NTK is applied statically as vLLM does (the base stretched once for
 * factor·original_max_position), not per sequence length as Hugging Face does.
 * Invalid parameters (odd or non-positive rot_dim, factor ≤ 0, theta ≤ 1): CVLLM_ERR_INVALID_ARGUMENT. */
int cv_rope_init(cv_rope *r, const cv_rope_params *p);
void cv_rope_free(cv_rope *r);
/* cos/sin [n][rot_dim/2] for the given positions, computed as Hugging Face does in f32 (angle =
 * f32(position · inv_freq)); many positions are split over the pool (NULL: the calling thread). */
void cv_rope_cos_sin(cv_threadpool *pool, const cv_rope *r, const int32_t *positions, int64_t n, float *cos,
                     float *sin);
/* Rotate-half (NeoX) rotation of x [n][n_heads][head_dim] in place; entry i pairs with i + rot_dim/2. */
void cv_rope_apply(const cv_rope *r, float *x, int64_t n, int n_heads, int head_dim, const float *cos,
                   const float *sin);
/* Fused per-head RMSNorm and rotation (Qwen3's q/k norm then RoPE), on the pool: for token t and
 * head h, the head_dim values at src + t·ld_src + h·head_dim are normalised with gain w (dim
 * head_dim), rotated with cos/sin row t, and written to dst + t·ld_dst + h·head_dim. dst may equal
 * src (in place). Each head is read once and written once. */
void cv_rmsnorm_rope(cv_threadpool *pool, const cv_rope *r, float *dst, int64_t ld_dst, const float *src,
                     int64_t ld_src, int64_t n, int n_heads, int head_dim, const float *w, float eps,
                     const float *cos, const float *sin);
/* The same, each result then multiplied by `scale` and rounded to bf16 into dst (not in place):
 * the query rows of bf16-dot attention (cv_attention_args.q_bf16). */
void cv_rmsnorm_rope_bf16(cv_threadpool *pool, const cv_rope *r, uint16_t *dst, int64_t ld_dst, const float *src,
                          int64_t ld_src, int64_t n, int n_heads, int head_dim, const float *w, float eps,
                          const float *cos, const float *sin, float scale);

/* ---- attention over a paged KV cache ---------------------------------------------------------- */

/*
 * Cache layout: slot = block_id·block_size + offset; a block holds, KV head after KV head, a region
 * of block_size·head_dim elements of kv_dtype: f32, or bf16 (what cv_kv_write rounds to), in which
 * cv_kv_index places each element. An f32 region is that head's block_size rows one after another.
 * A bf16 region is laid out in the pairs the bf16 dot products multiply (vdpbf16ps and AMX take two
 * bf16 in each 32-bit word), so that attention reads a block's words as they are, or copies them,
 * where it used to transpose and pair its rows for every query block. K is cut into panels of
 * CV_KV_PANEL (16) rows (the last one of a block the rest of it, and a block of at most 16 rows one
 * panel), each panel [head_dim/2][rows] words, word (p, i) holding elements 2p and 2p+1 of its row i
 * (Q·Kᵀ pairs over head_dim; 16 positions' words of one pair are one vector). V is
 * [block_size/2][head_dim] words, word (q, d) holding element d of rows 2q and 2q+1 (P·V pairs over
 * positions). An odd head_dim's last K element and an odd block_size's last V row are a plain bf16
 * row after the words. vLLM's paged-attention K cache groups head_size by x elements inside the
 * block the same way. A decode token reads one contiguous run per block and head for K and one for
 * V (4 KiB each for a bf16 head_dim of 128 in 16-slot blocks), and in larger blocks reads K in the
 * order it lies: with one [head_dim/2][block_size] run per block instead of panels, a 64-position
 * tile read half of each 512-byte pair row of a 128-slot block, and decode attention over 3,000
 * positions ran 15 % slower in 128-slot blocks than in 16-slot ones (attention_bench decode-cold,
 * Zen 5); in panels the two read alike.
 *
 * Token t (of sequence s, at position positions[t]) attends causally over positions
 * [0, positions[t]] of s, read through block_tables[s]; its own K/V must be in the cache, or be
 * given as k_new and v_new, which attention stores first.
 * Query head h uses KV head h / (n_heads / n_kv_heads). A bf16 cache is widened as it is read and
 * everything else is the f32 computation: the output is bit for bit that of an f32 cache holding the
 * same (bf16) values.
 * With bf16_dot (bf16 compute, a bf16 cache, and cv_linear_bf16_input()) the two tile products run
 * as bf16 dot products instead: the scaled query and the softmax numerators are rounded to bf16,
 * accumulation, the online softmax and the final division stay f32.
 */
typedef struct cv_attention_args {
    int32_t n_tokens;
    int32_t n_seqs;
    const int32_t *seq_start;           /* [n_seqs+1] */
    const int32_t *positions;           /* [n_tokens] */
    const int32_t *const *block_tables; /* [n_seqs] */
    int32_t block_size;
    int32_t n_heads, n_kv_heads, head_dim;
    float scale;
    const float *q;                     /* [n_tokens][n_heads·head_dim] */
    /* With bf16_dot, instead of q when not NULL: q · scale rounded to bf16 (cv_rmsnorm_rope_bf16),
     * the rows attention makes itself from q */
    const uint16_t *q_bf16;
    cv_dtype kv_dtype;                  /* CV_DTYPE_F32 (0) or CV_DTYPE_BF16: the elements of k_cache, v_cache */
    void *k_cache, *v_cache;            /* written only with k_new */
    /* When not NULL: the batch's own K and V rows [n_tokens][n_kv_heads·head_dim], stored into slots
     * slot_mapping[t] (as cv_kv_write stores them) before they are read. Where each sequence's tokens
     * are one unit of work (a decode batch), the thread that reads a sequence's KV head stores that
     * head's rows just before: in a decode step the rows' lines are in that thread's cache when it
     * reads them, and no separate pass waits on them (a decode token's K row alone touches
     * head_dim/2 lines a head, one pair a line, each a miss after the weights streamed through). */
    const float *k_new, *v_new;
    const int64_t *slot_mapping;
    bool bf16_dot;                      /* Q·Kᵀ and P·V as bf16 dot products (see above) */
    float *out;                         /* [n_tokens][n_heads·head_dim] */
    /* Instead of out when not NULL: the output rounded as cv_round_bf16_rows rounds it, rows
     * [n_tokens][n_heads·head_dim], a multiple of 32 (so cv_act_bf16_stride's rows, for a bf16 linear) */
    uint16_t *out_bf16;
} cv_attention_args;

void cv_attention(cv_threadpool *pool, const cv_attention_args *a);

/* The widest head attention and cv_kv_write take. */
enum { CV_MAX_HEAD_DIM = 1024 };

enum { CV_KV_PANEL = 16 };

/* The first row of the K panel that holds row i of a block, and that panel's rows (above). */
static inline int cv_kv_panel_start(int i) { return i / CV_KV_PANEL * CV_KV_PANEL; }
static inline int cv_kv_panel_rows(int i, int block_size) {
    const int rest = block_size - cv_kv_panel_start(i);
    return rest < CV_KV_PANEL ? rest : CV_KV_PANEL;
}

/* Where element d of KV head g's K (value false) or V (value true) at `slot` sits in a cache of
 * `dtype` laid out as above. */
static inline int64_t cv_kv_index(cv_dtype dtype, bool value, int64_t slot, int g, int d, int n_kv_heads, int head_dim,
                                  int block_size) {
    const int64_t region = (slot / block_size * n_kv_heads + g) * block_size * head_dim;
    const int i = (int)(slot % block_size);
    if (dtype != CV_DTYPE_BF16) return region + (int64_t)i * head_dim + d;
    if (!value) {
        const int paired = head_dim & ~1, start = cv_kv_panel_start(i);
        if (d >= paired) return region + (int64_t)paired * block_size + i;
        const int64_t panel = region + (int64_t)start * paired; /* the earlier panels' words, 2 bf16 each */
        return panel + ((int64_t)(d / 2) * cv_kv_panel_rows(i, block_size) + (i - start)) * 2 + d % 2;
    }
    const int paired = block_size & ~1;
    return region + (i < paired ? ((int64_t)(i / 2) * head_dim + d) * 2 + i % 2 : (int64_t)paired * head_dim + d);
}

/* Stores k and v rows [n][n_kv_heads·head_dim] into the cache slots slot_mapping[0..n) of a cache
 * of `dtype` in the layout above (F32: copied; BF16: rounded to nearest even, NaN kept), rows split
 * over the pool (may be NULL). */
void cv_kv_write(cv_threadpool *pool, void *k_cache, void *v_cache, cv_dtype dtype, const float *k, const float *v,
                 const int64_t *slot_mapping, int64_t n, int n_kv_heads, int head_dim, int block_size);

/* ---- mixture of experts (moe.c) --------------------------------------------------------------- */

/* One SwiGLU expert: down · (silu(gate · x) ⊙ (up · x)), in any weight format. gate is rows
 * [0, inter) of *gate and up rows [up_row, up_row + inter) of *up — the same weight when gate|up
 * are stacked (up_row = inter; packed, up_row a multiple of CV_PANEL_ROWS) — and down is
 * [hidden][inter]. Experts of one call may differ in inter (a shared expert is often wider) and in
 * format. Weights that read int8 (I8_PANELS) get their input quantized as the expert says: x for
 * gate and up (both int8 or neither; quantized once when their quantizations agree, as they do
 * when stacked), per expert after gathering its tokens, and the SwiGLU output per token before
 * down (msModelSlim's routed experts). */
typedef struct cv_moe_expert {
    const cv_weight *gate, *up, *down;
    int64_t inter, up_row;
    cv_act_quant gate_quant, up_quant, down_quant; /* of the weights that read int8 */
} cv_moe_expert;

/* Per token: softmax over the n_experts router logits (f32), the top_k largest probabilities in
 * descending order (ties: lower expert id first), renormalised to sum 1 when `renormalize`.
 * ids and weights are [n_tokens][top_k]; top_k ≤ n_experts. */
void cv_moe_route(const float *logits, int64_t n_tokens, int32_t n_experts, int32_t top_k, bool renormalize,
                  int32_t *ids, float *weights);

typedef struct cv_moe_args {
    int64_t n_tokens;
    int32_t hidden;
    int32_t n_experts;              /* entries of experts */
    const cv_moe_expert *experts;
    int32_t routes;                 /* experts per token: columns of ids and weights */
    const int32_t *ids;             /* [n_tokens][routes], < n_experts, distinct within a token; negative:
                                     * no route (its expert is another rank's, under expert parallelism) */
    const float *weights;           /* [n_tokens][routes] */
    const float *x;                 /* [n_tokens][hidden] */
    float *y;                       /* [n_tokens][hidden]: y += Σ_r weight·expert_r(x), experts in id order */
    void *workspace;                /* cv_moe_workspace_bytes(...) bytes, 64-byte aligned */
    bool bf16_input;                /* bf16 compute (only where cv_linear_bf16_input()): weights whose
                                     * format reads them (cv_wformat_bf16_input) read bf16 rows — each
                                     * expert's gathered x rows and its SwiGLU rows rounded to bf16
                                     * (nearest even) before gate|up and before down */
} cv_moe_args;

/* Workspace for cv_moe with at most these sizes on this pool (max_inter: the widest expert; int8:
 * some expert's weights read int8; bf16: bf16_input with some expert weight that reads bf16 rows). */
size_t cv_moe_workspace_bytes(const cv_threadpool *pool, int64_t n_tokens, int32_t routes, int32_t hidden,
                              int32_t max_inter, int32_t n_experts, bool int8, bool bf16);
/* Routed SwiGLU experts, grouped: the tokens of each expert are gathered and each selected expert's
 * weights are streamed once per call, whatever the number of tokens routed to it. */
void cv_moe(cv_threadpool *pool, const cv_moe_args *a);

/* ---- gated delta rule (gdn.c) ----------------------------------------------------------------- */

/* In place, for each of `rows` rows of length dim: x ← scale · x / sqrt(Σx² + eps). */
void cv_l2norm(float *x, int64_t rows, int64_t dim, float eps, float scale);

/* Depthwise causal convolution of width `kernel` over one sequence's n tokens, then SiLU:
 * y[t][c] = silu(Σ_j w[j][c] · x_{t−kernel+1+j}[c]), tap kernel−1 on the current token. Rows of x are
 * ld_x apart, rows of y are `channels` apart. w is tap-major [kernel][channels]. `state`
 * [kernel−1][channels] holds the raw inputs of the tokens before x (oldest first; zeros at a
 * sequence start) and is advanced past x. */
void cv_conv1d_silu(float *y, const float *x, int64_t ld_x, int64_t n, int64_t channels, const float *w, int kernel,
                    float *state);
/* The conv state as it stands right after token j of x (0 ≤ j < n) of the same call, written to
 * dst [kernel−1][channels]: the raw inputs of tokens j−kernel+2 .. j, from `state` (as it was before
 * the call) where they precede x. */
void cv_conv1d_state_after(float *dst, const float *x, int64_t ld_x, int64_t j, int64_t channels, int kernel,
                           const float *state);

/* Gated-delta-rule gates per token and value head: beta = σ(b), g = −exp(a_log)·softplus(a + dt_bias)
 * (softplus(z) = z above 20, as in PyTorch). a, b, g, beta are [n_tokens][n_heads]. */
void cv_gdn_gates(float *g, float *beta, const float *a, const float *b, int64_t n_tokens, int32_t n_heads,
                  const float *a_log, const float *dt_bias);

/*
 * The gated delta rule over a batch of sequences, per value head j with key head j / (n_v/n_k):
 *   S ← exp(g)·S;  δ = beta·(v − Sᵀk);  S ← S + k ⊗ δ;  o = Sᵀq
 * with the state S [k_dim][v_dim] f32 per head. A sequence's tokens continue from its state, which
 * is left after its last token. Single tokens use that recurrence; longer runs the equivalent
 * chunked form (chunks of up to 64 tokens from the run's first token), which touches the state once
 * per chunk. q and k must already be L2-normalised (q also scaled by k_dim^−1/2).
 * Checkpoints (optional): sequence s's entries [ckpt_start[s], ckpt_start[s+1]) ask for a copy of
 * its state as it stands right after token ckpt_token[i] of its run (ascending per sequence) in
 * ckpt_states[i]; chunks are cut there, so the copy is exact and costs one state write.
 */
typedef struct cv_gdn_args {
    int32_t n_seqs;
    const int32_t *seq_start;       /* [n_seqs+1] */
    float *const *states;           /* [n_seqs] → [n_v_heads][k_dim][v_dim] */
    int32_t n_k_heads, n_v_heads, k_dim, v_dim;
    const float *q, *k, *v;         /* token t, head h at q + t·ld + h·k_dim (k likewise, v by v_dim) */
    int64_t ld;
    const float *g, *beta;          /* [n_tokens][n_v_heads] */
    float *out;                     /* [n_tokens][n_v_heads·v_dim] */
    void *workspace;                /* cv_gdn_workspace_bytes(...) bytes, 64-byte aligned */
    const int32_t *ckpt_start;      /* [n_seqs+1], or NULL: no checkpoints */
    const int32_t *ckpt_token;      /* token index within its sequence's run */
    float *const *ckpt_states;      /* → [n_v_heads][k_dim][v_dim], none of them a sequence's state */
} cv_gdn_args;

size_t cv_gdn_workspace_bytes(const cv_threadpool *pool, int32_t k_dim, int32_t v_dim);
void cv_gdn(cv_threadpool *pool, const cv_gdn_args *a);

#endif
