/*
 * arena.c — see arena.h.
 */
#include "models/layers/arena.h"

#include <stdlib.h>

#include "base/error.h"

void *nn_take(nn_arena *a, size_t bytes) {
    size_t at = a->size;
    a->size += (bytes + 63) & ~(size_t)63;
    return a->base ? a->base + at : NULL;
}

int nn_scratch_reserve(nn_scratch *s, int32_t tokens, nn_carve_fn carve, void *model) {
    if (tokens <= s->capacity) return 0;
    nn_arena probe = {0};
    carve(model, tokens, &probe);
    void *mem = cv_aligned_alloc(probe.size);
    if (!mem) {
        if (s->mem) carve(model, s->capacity, &(nn_arena){.base = s->mem}); /* the probe pointed them at NULL */
        return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes of activations for %d tokens", probe.size,
                       tokens);
    }
    free(s->mem);
    s->mem = mem;
    carve(model, tokens, &(nn_arena){.base = mem});
    s->capacity = tokens;
    return 0;
}

void nn_scratch_free(nn_scratch *s) {
    free(s->mem);
    *s = (nn_scratch){0};
}
