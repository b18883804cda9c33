/*
 * trunk.c — what every model holds around its layers (trunk.h).
 */
#include "models/layers/trunk.h"

#include <string.h>

#include "models/layers/config.h"
#include "models/layers/lora.h"
#include "models/layers/timed.h"

int nn_trunk_init(nn_trunk *t, const cv_model_load_params *p, float eps) {
    const cv_model_config *cfg = p->config;
    t->hidden = cfg->hidden_size;
    t->vocab = cfg->vocab_size;
    t->eps = eps;
    t->bound = nn_binder_for(p);
    nn_lora_init(&t->bound, p);
    return nn_init_rope(&t->rope, &cfg->rope, cfg->head_dim);
}

void nn_trunk_take(nn_trunk *t, nn_arena *a, int32_t tokens) {
    nn_stream *s = &t->st;
    const size_t T = (size_t)tokens, row = (size_t)t->hidden * sizeof(float);
    const size_t half_rot = (size_t)(t->rope.rot_dim / 2) * sizeof(float);
    s->x = nn_take(a, T * row);
    s->a = nn_take(a, T * row);
    s->o = nn_take(a, T * row);
    s->cos = nn_take(a, T * half_rot);
    s->sin = nn_take(a, T * half_rot);
    nn_qrows_take(&s->aq, a, tokens, t->bound.act_cols > 0 ? t->hidden : 0);
    s->ab.rows = t->bound.bf16_rows ? nn_take(a, T * (size_t)cv_act_bf16_stride(t->hidden) * 2) : NULL;
    nn_linear_scratch_take(&t->bound, a, tokens);
}

int nn_trunk_pack(nn_trunk *t, cv_threadpool *pool, cv_weight_source *src, const char *layout, nn_linear_list *lins) {
    if (t->bound.rc) {
        nn_linear_list_free(lins);
        return t->bound.rc;
    }
    int rc = nn_pack_model(pool, src, layout, &t->vocab_w, lins);
    nn_linear_list_free(lins);
    return rc;
}

void nn_trunk_embed(nn_trunk *t, cv_threadpool *pool, const cv_batch *b) {
    nn_lora_set_batch(&t->bound, b);
    nn_embed(&t->vocab_w, b->token_ids, b->n_tokens, t->st.x);
    NN_TIMED(CV_OP_EMBED, cv_rope_cos_sin(pool, &t->rope, b->positions, b->n_tokens, t->st.cos, t->st.sin));
}

void nn_trunk_emit(nn_trunk *t, cv_threadpool *pool, const cv_batch *b, const float *gain, float *logits) {
    const nn_stream *s = &t->st;
    const int32_t H = t->hidden;
    const size_t row = (size_t)H * sizeof(float);
    NN_TIMED(CV_OP_NORM, {
        if (b->hidden_out) {
            cv_add_rmsnorm(pool, s->x, s->o, b->hidden_out, gain, b->n_tokens, H, t->eps);
            for (int32_t i = 0; i < b->n_logits; i++)
                memcpy(s->a + (int64_t)i * H, b->hidden_out + (int64_t)b->logit_rows[i] * H, row);
        } else {
            for (int32_t i = 0; i < b->n_logits; i++) {
                const int64_t r = b->logit_rows[i];
                float *out = s->a + (int64_t)i * H; /* x itself stays: a row may be asked for twice */
                memcpy(out, s->x + r * H, row);
                cv_add_rmsnorm(NULL, out, s->o + r * H, out, gain, 1, H, t->eps);
            }
        }
    });
    nn_logits(pool, &t->vocab_w, s->a, b->n_logits, logits);
}

void nn_trunk_release(nn_trunk *t, nn_linear_list *lins) {
    nn_linear_list_release(lins);
    nn_scratch_free(&t->scratch);
    nn_vocab_release(&t->vocab_w);
    cv_rope_free(&t->rope);
    nn_lora_release(&t->bound);
    nn_binder_free(&t->bound);
}
