/*
 * engine_drain.h — stepping an engine until every request it holds has finished, for the tests
 * that drive the engine through the public API (test_engine.c, test_engine_hybrid.c,
 * test_kv_dtype.c): each test keeps its own record of an output, this keeps the loop.
 *
 * A step that fails is a test failure (and ends the loop), and so is an engine still holding
 * unfinished requests after 100,000 steps: a bounded loop, so a scheduler that stops making
 * progress fails the test instead of hanging it. Header-only, like testutil.h.
 */
#ifndef CV_ENGINE_DRAIN_H
#define CV_ENGINE_DRAIN_H

#include "check.h"
#include "cvllm.h"

/* Steps e until nothing is unfinished, handing every request output of every step to on_output. */
static inline void tu_engine_drain(cvllm_engine *e, void (*on_output)(void *ctx, const cvllm_request_output *out),
                                   void *ctx) {
    for (int guard = 0; cvllm_engine_has_unfinished(e) && guard < 100000; guard++) {
        const cvllm_request_output *const *outs;
        size_t n_outs;
        int rc = cvllm_engine_step(e, &outs, &n_outs);
        CHECK_MSG(rc == 0, "step: %s", cvllm_last_error());
        if (rc) return;
        for (size_t k = 0; k < n_outs; k++) on_output(ctx, outs[k]);
    }
    CHECK(!cvllm_engine_has_unfinished(e));
}

#endif
