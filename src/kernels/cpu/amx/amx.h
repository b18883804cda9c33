/*
 * amx/amx.h — what the rest of the CPU kernels call in amx/ directly (the GEMM kernels are reached
 * through the format table instead, formats.h). Callable only where cv_cpu_amx().
 */
#ifndef CV_AMX_H
#define CV_AMX_H

#include <stdbool.h>
#include <stdint.h>

/*
 * c [m][n] (+)= a [m][kpairs] · b [kpairs][n], on bf16 pairs accumulated in f32 (tdpbf16ps):
 * a's rows are lda 32-bit words apart, each word a pair of bf16 along k; b in column tiles of 16
 * columns, tile t at b + t·ldt, one row of 16 words (64 bytes, the pairs of its columns) per k pair —
 * so a tile load reads consecutive lines; c's rows ldc floats apart. n and kpairs are multiples of
 * 16 (the caller pads with zero pairs: a zero pair of a adds exact zeros only where b's matching
 * pair is finite). Every element of c is one chain over k in steps of 16 pairs, whatever m: a
 * row's bits do not depend on the rows computed with it.
 */
void cv_amx_gemm_pairs(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *b, int64_t ldt, int m,
                       int n, int kpairs, bool accumulate);

#endif
