/*
 * format_bf16.c — BF16_PANELS: bf16 weights repacked once at load into 16-row panels of k pairs,
 * so that one 64-byte load holds 16 outputs × 2 inputs (kernels.h, <isa>/panels_bf16.c).
 *
 * Element (r, c) of the stack lies in panel r/16 at 32-bit word (c/2)·16 + r%16, half c%2: a panel
 * is its 16 rows' pairs transposed. Rows past the last part and the high half of an odd K's last
 * pair are zero.
 *
 * The kernels read f32 activations and widen the weights (exact), or, in bf16 compute on CPUs
 * where it pays, bf16 activations through vdpbf16ps, whose second operand is this layout as is
 * (avx512/panels_bf16_dot.c), or on AMX as the B tiles of tdpbf16ps (amx/panels.c).
 */
#include <string.h>

#include "kernels/cpu/formats.h"

static int64_t pack_panel(const cv_pack_ctx *c, int64_t p) {
    uint32_t *panel = (uint32_t *)(c->codes + p * c->panel_bytes);
    const int64_t pairs = (c->cols + 1) / 2, whole = c->cols / 2; /* whole: pairs with both halves in the row */
    for (int r = 0; r < CV_PANEL_ROWS; r++) {
        int part;
        int64_t row;
        if (!cv_pack_source_row(c, p * CV_PANEL_ROWS + r, &part, &row)) {
            for (int64_t k = 0; k < pairs; k++) panel[k * CV_PANEL_ROWS + r] = 0;
            continue;
        }
        const uint16_t *src = (const uint16_t *)c->parts[part].data + row * c->cols;
        for (int64_t k = 0; k < whole; k++) {
            uint32_t word;
            memcpy(&word, src + 2 * k, sizeof word);
            panel[k * CV_PANEL_ROWS + r] = word;
        }
        if (whole < pairs) panel[whole * CV_PANEL_ROWS + r] = src[2 * whole]; /* odd cols: high half 0 */
    }
    return -1;
}

static void panel_row(const cv_weight *w, int64_t r, float *out) {
    const int64_t panel_elems = (w->cols + 1) / 2 * 2 * CV_PANEL_ROWS;
    const uint16_t *lane = (const uint16_t *)w->data + (r / CV_PANEL_ROWS) * panel_elems + (r % CV_PANEL_ROWS) * 2;
    for (int64_t c = 0; c < w->cols; c++) out[c] = cv_bf16_to_f32(lane[(c / 2) * 2 * CV_PANEL_ROWS + c % 2]);
}

const cv_format_traits cv_format_bf16_panels = {
    .name = "bf16_panels",
    .dtype = CV_DTYPE_BF16,
    .packed = true,
    .k_group = 2,
    .group_bytes = 2 * CV_PANEL_ROWS * 2,
    .kblock = 128, /* 3 panels × 128 pairs × 64 B = 24 KiB: one AVX-512 tile's weights stay in L1 */
    .pack_panel = pack_panel,
    .row = panel_row,
    .gemm = {[CV_ISA_SCALAR] = &cv_ref_panels_bf16, [CV_ISA_AVX2] = &cv_avx2_panels_bf16,
             [CV_ISA_AVX512] = &cv_avx512_panels_bf16},
    .gemm_bf16_dot = &cv_avx512_panels_bf16_dot,
    .gemm_amx = &cv_amx_panels_bf16,
};
