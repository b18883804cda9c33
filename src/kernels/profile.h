/*
 * profile.h — time per op kind across forward passes, for `cvllm bench latency --profile`.
 *
 * A model brackets each op of its forward with cv_profile_begin()/cv_profile_end(kind, t0). When
 * profiling is off (the default) begin returns 0 and end returns at once, so the hooks cost one
 * relaxed load each. When on, end adds the elapsed monotonic nanoseconds and one call to the
 * kind's totals (atomic adds: any thread may record, the forward is usually one). Kinds are the
 * roles of a transformer layer rather than kernel names, so the table reads as "where the time of
 * a token goes" — a slow kernel shows up as its role taking more than its share of the flops.
 */
#ifndef CV_PROFILE_H
#define CV_PROFILE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum cv_op_kind {
    CV_OP_EMBED = 0,       /* token embedding gather and the RoPE tables */
    CV_OP_NORM,            /* RMSNorms (with their fused residual adds) */
    CV_OP_QKV_PROJ,
    CV_OP_QK_NORM_ROPE,
    CV_OP_ATTENTION,       /* with the batch's K and V rows stored into the cache (cv_attention_args.k_new) */
    CV_OP_O_PROJ,
    CV_OP_GATE_UP_PROJ,
    CV_OP_SWIGLU,
    CV_OP_DOWN_PROJ,
    CV_OP_MOE,             /* routed experts (MoE models) */
    CV_OP_LINEAR_ATTENTION, /* gated delta rule layers (hybrid models) */
    CV_OP_LM_HEAD,
    CV_OP_ALLREDUCE,       /* tensor parallelism: o_proj and down_proj summed over the ranks, logits gathered */
    CV_OP_COUNT
} cv_op_kind;

typedef struct cv_profile_totals {
    uint64_t ns[CV_OP_COUNT];
    uint64_t calls[CV_OP_COUNT];
} cv_profile_totals;

void cv_profile_enable(bool on);
bool cv_profile_enabled(void);
/* Zeroes the totals (e.g. after warm-up). */
void cv_profile_reset(void);
void cv_profile_read(cv_profile_totals *out);
const char *cv_op_kind_name(cv_op_kind kind); /* "qkv_proj", ... */

/* A timestamp to pass to cv_profile_end, or 0 when profiling is off. */
uint64_t cv_profile_begin(void);
void cv_profile_end(cv_op_kind kind, uint64_t t0);

#endif
