/*
 * format_rows.c — the row-major formats F32, BF16 and F16: a view of the checkpoint matrix as
 * stored (no packing, no copy), widened to f32 inside the micro-kernels (<isa>/rows.c).
 */
#include "kernels/cpu/formats.h"

static void view_row(const cv_weight *w, int64_t r, float *out) {
    const cv_dtype dtype = cv_formats[w->format]->dtype;
    const size_t row_bytes = (size_t)w->cols * cv_dtype_size(dtype);
    cv_convert_to_f32(out, (const char *)w->data + (size_t)r * row_bytes, dtype, (size_t)w->cols);
}

const cv_format_traits cv_format_f32 = {
    .name = "f32",
    .dtype = CV_DTYPE_F32,
    .row = view_row,
    .gemm = {[CV_ISA_SCALAR] = &cv_ref_rows_f32, [CV_ISA_AVX2] = &cv_avx2_rows_f32, [CV_ISA_AVX512] = &cv_avx512_rows_f32},
};

const cv_format_traits cv_format_bf16 = {
    .name = "bf16",
    .dtype = CV_DTYPE_BF16,
    .row = view_row,
    .gemm = {[CV_ISA_SCALAR] = &cv_ref_rows_bf16, [CV_ISA_AVX2] = &cv_avx2_rows_bf16,
             [CV_ISA_AVX512] = &cv_avx512_rows_bf16},
};

const cv_format_traits cv_format_f16 = {
    .name = "f16",
    .dtype = CV_DTYPE_F16,
    .row = view_row,
    .gemm = {[CV_ISA_SCALAR] = &cv_ref_rows_f16, [CV_ISA_AVX2] = &cv_avx2_rows_f16, [CV_ISA_AVX512] = &cv_avx512_rows_f16},
};
