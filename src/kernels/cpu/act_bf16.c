/*
 * act_bf16.c — bf16 activations for the bf16-input GEMM (BF16_PANELS weights in bf16 compute): f32
 * rows rounded to bf16 rows of k pairs, the operand vdpbf16ps (and an AMX B tile) reads.
 *
 * A row is cv_act_bf16_stride(cols) elements, a multiple of 32 (whole 64-byte lines of pairs), and is
 * zero past cols: a kernel reads the pair that holds an odd K's last column whole, and the weight's
 * padding is zero too, so padded columns add exact zeros.
 *
 * Rounding is cv_f32_to_bf16's, what PyTorch's .to(torch.bfloat16) gives: nearest even, NaN kept
 * (quieted), subnormals rounded like any other value. Each ISA runs the same branch-free integer
 * arithmetic (cpu_ops.h round_bf16; at the baseline ISA it took 7 % of an AMX prefill), except that
 * AVX-512 uses vcvtneps2bf16 where the CPU has it for vectors without an f32 subnormal, which that
 * instruction flushes to zero (checked on AMD Zen): the same bits. It is one pass over
 * m·cols elements against the m·n·cols multiply-adds of the GEMM that reads the rows; large inputs
 * split their rows over the pool. The norm and SwiGLU in front of a bf16-input linear round their
 * rows on the way instead (quantize.c), with the same op.
 */
#include <string.h>

#include "base/threadpool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"

enum { BF16_ROW_ALIGN = 32, PARALLEL_ELEMENTS = 1 << 15 };

int64_t cv_act_bf16_stride(int64_t cols) { return (cols + BF16_ROW_ALIGN - 1) / BF16_ROW_ALIGN * BF16_ROW_ALIGN; }

typedef struct round_job {
    const float *x;
    int64_t ldx, m, cols;
    uint16_t *out;
} round_job;

static void round_rows(const void *arg, int64_t r0, int64_t r1) {
    const round_job *j = arg;
    const int64_t stride = cv_act_bf16_stride(j->cols);
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->ldx;
        uint16_t *o = j->out + r * stride;
        ops->round_bf16(o, x, j->cols);
        memset(o + j->cols, 0, (size_t)(stride - j->cols) * sizeof *o);
    }
}

void cv_round_bf16_rows(cv_threadpool *pool, const float *x, int64_t ldx, int64_t m, int64_t cols, uint16_t *out) {
    round_job j = {x, ldx, m, cols, out};
    cv_threadpool_run_range(pool, round_rows, &j, m, m * cols >= PARALLEL_ELEMENTS);
}
