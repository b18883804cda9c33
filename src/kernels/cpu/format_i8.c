/*
 * format_i8.c — I8_PANELS: int8 weight codes for int8 × int8 → int32 products (msModelSlim W8A8
 * and W8A8_DYNAMIC), dequantized in the GEMM's epilogue.
 *
 * Panel layout [ceil(K/4)][16 rows][4 k]: one 64-byte group holds 4 consecutive k of 16 rows, the
 * order vpdpbusd (VNNI) consumes — each 32-bit lane is one row's 4 codes, multiplied by the same 4
 * activation codes broadcast to every lane — and 16 groups are one B tile of AMX's tdpbssd. Zero
 * past the last row and column. After all codes, per panel: 16 f32 row scales, 16 int32 biases
 * (msModelSlim's quant_bias, or 0) and 16 int32 sums of the row's codes (for the VNNI kernel, whose
 * unsigned operand is the activations offset by 128: Σ (x+128)·w = Σ x·w + 128·Σ w).
 *
 * The result is exact and the same bits on every ISA:
 *   y[t][n] = (float)(Σ_k xq[t][k]·w[n][k] + bias[n]) · scale[n] · x_scale[t]
 * in that order (formats.h cv_i8_dequant). The sum is exact in int32 while K·128·128 < 2^31.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/formats.h"

enum { MAX_COLS = 131071 }; /* |Σ x·w| ≤ K·128·128 must fit an int32 */

static int64_t aux_bytes(int64_t cols) { return CV_I8_AUX_WORDS * 4; }

static int check(const cv_weight_part *p) {
    if (!p->row_scale) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "int8 weights need a scale per row");
    if (p->cols > MAX_COLS)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "int8 weights with %lld columns: the int32 accumulator is exact up to %d",
                       (long long)p->cols, MAX_COLS);
    for (int64_t r = 0; r < p->rows; r++)
        if (!isfinite(p->row_scale[r]))
            return cv_fail(CVLLM_ERR_FORMAT, "row %lld has the scale %g", (long long)r, (double)p->row_scale[r]);
    return 0;
}

static int64_t pack_panel(const cv_pack_ctx *c, int64_t p) {
    uint8_t *panel = c->codes + p * c->panel_bytes;
    float scale[CV_PANEL_ROWS];
    int32_t bias[CV_PANEL_ROWS], sum[CV_PANEL_ROWS];
    memset(panel, 0, (size_t)c->panel_bytes);
    for (int r = 0; r < CV_PANEL_ROWS; r++) {
        int part;
        int64_t row;
        scale[r] = 0.0f;
        bias[r] = sum[r] = 0;
        if (!cv_pack_source_row(c, p * CV_PANEL_ROWS + r, &part, &row)) continue;
        const cv_weight_part *src = &c->parts[part];
        const int8_t *codes = (const int8_t *)src->data + row * c->cols;
        const int64_t whole = c->cols / 4; /* groups with all 4 codes in the row */
        for (int64_t g = 0; g < whole; g++) memcpy(panel + g * 64 + r * 4, codes + 4 * g, 4);
        for (int64_t k = 4 * whole; k < c->cols; k++) panel[whole * 64 + r * 4 + k % 4] = (uint8_t)codes[k];
        for (int64_t k = 0; k < c->cols; k++) sum[r] += codes[k];
        scale[r] = src->row_scale[row];
        bias[r] = src->row_bias ? src->row_bias[row] : 0;
    }
    uint8_t *aux = c->aux + p * c->aux_bytes;
    memcpy(aux + 4 * CV_I8_AUX_SCALE, scale, sizeof scale);
    memcpy(aux + 4 * CV_I8_AUX_BIAS, bias, sizeof bias);
    memcpy(aux + 4 * CV_I8_AUX_SUM, sum, sizeof sum);
    return -1;
}

const cv_format_traits cv_format_i8_panels = {
    .name = "i8_panels",
    .dtype = CV_DTYPE_I8,
    .packed = true,
    .int8_input = true,
    .k_group = 4,
    .group_bytes = 4 * CV_PANEL_ROWS,
    .kblock = 128, /* 3 panels × 128 groups × 64 B = 24 KiB in L1 */
    .aux_bytes = aux_bytes,
    .check = check,
    .pack_panel = pack_panel,
    .gemm = {[CV_ISA_SCALAR] = &cv_ref_panels_i8, [CV_ISA_AVX2] = &cv_avx2_panels_i8,
             [CV_ISA_AVX512] = &cv_avx512_panels_i8},
    .gemm_vnni = &cv_avx512_panels_i8_vnni,
    .gemm_amx = &cv_amx_panels_i8,
};
