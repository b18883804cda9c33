/*
 * stream.c — carving the residual stream's buffers (stream.h).
 */
#include "models/layers/stream.h"

void nn_stream_take(nn_stream *s, nn_arena *a, int32_t tokens, int32_t hidden, int32_t rot_dim, const nn_binder *b) {
    const size_t T = (size_t)tokens, row = (size_t)hidden * sizeof(float);
    const size_t half_rot = (size_t)(rot_dim / 2) * sizeof(float);
    s->x = nn_take(a, T * row);
    s->a = nn_take(a, T * row);
    s->o = nn_take(a, T * row);
    s->cos = nn_take(a, T * half_rot);
    s->sin = nn_take(a, T * half_rot);
    nn_qrows_take(&s->aq, a, tokens, b->act_cols > 0 ? hidden : 0);
    s->ab.rows = b->bf16_rows ? nn_take(a, (size_t)tokens * (size_t)cv_act_bf16_stride(hidden) * 2) : NULL;
}
