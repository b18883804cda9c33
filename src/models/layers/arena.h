/*
 * arena.h — a model's activation scratch: one allocation carved into buffers (internal to
 * src/models).
 *
 * A model describes its buffers once, in a carve function that takes them from an arena in order;
 * the function runs twice per size, first on an arena without memory to measure, then on the real
 * block. So the buffer list is written once, sizes cannot disagree between measuring and carving,
 * and a layer's scratch is a `take` call of that layer (attention.h, ffn.h, ...), never a copy of
 * its sizes in the model. The scratch is sized for max_num_batched_tokens at load and only grows
 * if a larger batch ever arrives, so a steady-state forward() allocates nothing.
 */
#ifndef CV_LAYERS_ARENA_H
#define CV_LAYERS_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct nn_arena {
    char *base;               /* NULL: measuring */
    size_t size;              /* bytes taken so far */
} nn_arena;

/* The next `bytes` of the arena, 64-byte aligned (NULL while measuring). */
void *nn_take(nn_arena *a, size_t bytes);

/* Points the model's buffers into `a` for batches of up to `tokens` rows. */
typedef void (*nn_carve_fn)(void *model, int32_t tokens, nn_arena *a);

typedef struct nn_scratch {
    int32_t capacity;         /* rows the carved buffers hold */
    void *mem;
} nn_scratch;

/* Makes the scratch hold `tokens` rows (no-op when it already does). Out of memory:
 * CVLLM_ERR_NO_MEMORY, and the buffers stay carved for the old capacity. */
int nn_scratch_reserve(nn_scratch *s, int32_t tokens, nn_carve_fn carve, void *model);
void nn_scratch_free(nn_scratch *s);

#endif
