/*
 * timed.h — the profile bracket of the layers (internal to src/models).
 *
 * Each layer charges its ops to the kernels' profile (kernels/profile.h) by role — q|k|v projection,
 * attention, routed experts, ... — so `cvllm bench latency --profile` reads the same for every
 * model built on these layers. When profiling is off the bracket is one relaxed load.
 */
#ifndef CV_LAYERS_TIMED_H
#define CV_LAYERS_TIMED_H

#include "kernels/profile.h"

/* Runs the statement(s) after `kind` and charges their time to profile op `kind` (variadic, so a
 * braced block may hold commas). */
#define NN_TIMED(kind, ...)                        \
    do {                                           \
        uint64_t t0_ = cv_profile_begin();         \
        __VA_ARGS__;                               \
        cv_profile_end(kind, t0_);                 \
    } while (0)

#endif
