/*
 * format_fp8.c — FP8_PANELS: e4m3fn weights with block scales (Qwen's *-FP8 checkpoints:
 * weight_scale_inv per 128×128 block), run weight-only: activations and accumulation stay f32.
 *
 * Panel layout [K][16 rows], one byte per code, so one 16-byte group is one k of 16 outputs and the
 * kernels widen codes in registers — no dequantized copy exists. Widening: the code sign-extended
 * to 16 bits, shifted left by 7, bit 14 cleared, is the f16 of the code's value / 256, exactly
 * (subnormals included; cv_fp8_f16_bits), which vcvtph2ps turns into f32. The 256 is folded into
 * the stored scales: after all codes, per panel one f32 per 128 columns, 256 × the block's scale.
 * The kernels sum x·(value/256) over each 128-column block and add that sum times 256·scale to the
 * output: one multiply per block instead of one per weight, and (v/256)·(256·s) is v·s exactly.
 *
 * A panel's 16 rows lie in one part (earlier parts are whole panels) and in one row block (the
 * block edge is a multiple of 16); the block edge must be a multiple of 128 so that each 128-column
 * scale lies in one column block. Edge blocks may be partial, and a part may start inside its first
 * block (a tensor-parallel shard: block_row0, block_col0). The two NaN codes (S.1111.111) have
 * no f16 image here and are refused at packing: a checkpoint holding them is broken.
 *
 * In bf16 compute, where vdpbf16ps is fast (AMD Zen), the activations are bf16 and the codes widen
 * to bf16 instead, by table lookups (avx512/panels_fp8_dot.c), from the same layout.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/formats.h"

static int64_t col_blocks(int64_t cols, int64_t block) { return (cols + block - 1) / block; }

static int64_t aux_bytes(int64_t cols) { return col_blocks(cols, CV_FP8_SCALE_COLS) * (int64_t)sizeof(float); }

static int check(const cv_weight_part *p) {
    if (!p->block_scale) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "e4m3 weights need block scales");
    if (p->block <= 0 || p->block % CV_FP8_SCALE_COLS)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "e4m3 weights with %d×%d scale blocks: the block edge must be a multiple "
                       "of %d", p->block, p->block, CV_FP8_SCALE_COLS);
    if (p->block_row0 % CV_PANEL_ROWS || p->block_col0 % CV_FP8_SCALE_COLS || p->block_row0 >= p->block ||
        p->block_col0 >= p->block)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "e4m3 part starting at (%d, %d) inside its scale block of %d",
                       p->block_row0, p->block_col0, p->block);
    const int64_t rb = col_blocks(p->block_row0 + p->rows, p->block), cb = col_blocks(p->block_col0 + p->cols, p->block);
    for (int64_t b = 0; b < rb * cb; b++) {
        const float s = p->block_scale[b];
        if (!isfinite(s) || !isfinite(s * 256.0f))
            return cv_fail(CVLLM_ERR_FORMAT, "scale block (%lld, %lld) holds %g", (long long)(b / cb), (long long)(b % cb),
                           (double)s);
    }
    return 0;
}

static int64_t pack_panel(const cv_pack_ctx *c, int64_t p) {
    uint8_t *panel = c->codes + p * c->panel_bytes;
    float *scale = (float *)(c->aux + p * c->aux_bytes);
    const int64_t n_scales = col_blocks(c->cols, CV_FP8_SCALE_COLS);
    int64_t bad = -1;
    memset(panel, 0, (size_t)c->panel_bytes);
    for (int64_t b = 0; b < n_scales; b++) scale[b] = 0.0f;
    for (int r = 0; r < CV_PANEL_ROWS; r++) {
        int part;
        int64_t row;
        if (!cv_pack_source_row(c, p * CV_PANEL_ROWS + r, &part, &row)) break; /* padding to the end */
        const cv_weight_part *src = &c->parts[part];
        const uint8_t *codes = (const uint8_t *)src->data + row * c->cols;
        for (int64_t k = 0; k < c->cols; k++) {
            if ((codes[k] & 0x7f) == 0x7f) bad = p * CV_PANEL_ROWS + r;
            panel[k * CV_PANEL_ROWS + r] = codes[k];
        }
        if (r == 0) { /* the panel's row block, the same for all its rows */
            const float *block_row = src->block_scale + (src->block_row0 + row) / src->block *
                                                            col_blocks(src->block_col0 + c->cols, src->block);
            for (int64_t b = 0; b < n_scales; b++)
                scale[b] = block_row[(src->block_col0 + b * CV_FP8_SCALE_COLS) / src->block] * 256.0f;
        }
    }
    return bad;
}

static void panel_row(const cv_weight *w, int64_t r, float *out) {
    const int64_t panel = r / CV_PANEL_ROWS;
    const uint8_t *codes = (const uint8_t *)w->data + panel * w->cols * CV_PANEL_ROWS + r % CV_PANEL_ROWS;
    const float *scale = (const float *)((const uint8_t *)w->data + (w->rows + CV_PANEL_ROWS - 1) / CV_PANEL_ROWS *
                                                                        w->cols * CV_PANEL_ROWS) +
                         panel * col_blocks(w->cols, CV_FP8_SCALE_COLS);
    for (int64_t c = 0; c < w->cols; c++)
        out[c] = cv_f16_to_f32(cv_fp8_f16_bits(codes[c * CV_PANEL_ROWS])) * scale[c / CV_FP8_SCALE_COLS];
}

const cv_format_traits cv_format_fp8_panels = {
    .name = "fp8_panels",
    .dtype = CV_DTYPE_F8_E4M3,
    .packed = true,
    .k_group = 1,
    .group_bytes = CV_PANEL_ROWS,
    .kblock = 512, /* 3 panels × 512 k × 16 B = 24 KiB in L1; whole 128-column scale blocks */
    .aux_bytes = aux_bytes,
    .check = check,
    .pack_panel = pack_panel,
    .bad_code = "an e4m3 NaN code (0x7f or 0xff)",
    .row = panel_row,
    .gemm = {[CV_ISA_SCALAR] = &cv_ref_panels_fp8, [CV_ISA_AVX2] = &cv_avx2_panels_fp8,
             [CV_ISA_AVX512] = &cv_avx512_panels_fp8},
    .gemm_bf16_dot = &cv_avx512_panels_fp8_dot,
};
