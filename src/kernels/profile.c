/*
 * profile.c — per-op-kind timers (profile.h): global atomic counters, monotonic clock.
 *
 * Globals rather than a per-model object so that the bench command can read them without the
 * engine or the model API knowing about profiling; there is one profile per process, which is
 * what a benchmark run is.
 */
#include "kernels/profile.h"

#include <assert.h>
#include <stdatomic.h>
#include <time.h>

static atomic_bool enabled;
static _Atomic uint64_t total_ns[CV_OP_COUNT], total_calls[CV_OP_COUNT];

void cv_profile_enable(bool on) { atomic_store_explicit(&enabled, on, memory_order_relaxed); }

bool cv_profile_enabled(void) { return atomic_load_explicit(&enabled, memory_order_relaxed); }

void cv_profile_reset(void) {
    for (int k = 0; k < CV_OP_COUNT; k++) {
        atomic_store_explicit(&total_ns[k], 0, memory_order_relaxed);
        atomic_store_explicit(&total_calls[k], 0, memory_order_relaxed);
    }
}

void cv_profile_read(cv_profile_totals *out) {
    for (int k = 0; k < CV_OP_COUNT; k++) {
        out->ns[k] = atomic_load_explicit(&total_ns[k], memory_order_relaxed);
        out->calls[k] = atomic_load_explicit(&total_calls[k], memory_order_relaxed);
    }
}

const char *cv_op_kind_name(cv_op_kind kind) {
    static const char *const names[CV_OP_COUNT] = {
        [CV_OP_EMBED] = "embed",           [CV_OP_NORM] = "rmsnorm",
        [CV_OP_QKV_PROJ] = "qkv_proj",     [CV_OP_QK_NORM_ROPE] = "qk_norm_rope",
        [CV_OP_ATTENTION] = "attention",   [CV_OP_O_PROJ] = "o_proj",
        [CV_OP_GATE_UP_PROJ] = "gate_up_proj", [CV_OP_SWIGLU] = "swiglu",
        [CV_OP_DOWN_PROJ] = "down_proj",   [CV_OP_MOE] = "moe_experts",
        [CV_OP_LINEAR_ATTENTION] = "linear_attention", [CV_OP_LM_HEAD] = "lm_head",
        [CV_OP_ALLREDUCE] = "allreduce",
    };
    return (unsigned)kind < CV_OP_COUNT ? names[kind] : "unknown";
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t cv_profile_begin(void) { return cv_profile_enabled() ? now_ns() : 0; }

void cv_profile_end(cv_op_kind kind, uint64_t t0) {
    if (t0 == 0) return;
    assert((unsigned)kind < CV_OP_COUNT);
    atomic_fetch_add_explicit(&total_ns[kind], now_ns() - t0, memory_order_relaxed);
    atomic_fetch_add_explicit(&total_calls[kind], 1, memory_order_relaxed);
}
