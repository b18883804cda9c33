/*
 * ffn.c — see ffn.h. The three ops are charged to the profile's gate|up, SwiGLU and down roles.
 */
#include "models/layers/ffn.h"

#include <stdio.h>

#include "models/layers/lora.h"
#include "models/layers/timed.h"

void nn_bind_ffn(nn_binder *b, const char *prefix, int32_t hidden, int32_t inter, const char *inter_name, nn_ffn *out) {
    char p[200], hint[96];
    snprintf(p, sizeof p, "%s", prefix);
    snprintf(hint, sizeof hint, "%s, hidden_size", inter_name);
    out->tp = b->tp.size > 1 ? &b->tp : NULL;
    nn_bind_linear_split(b, &out->gate_up, nn_name(b, "%sgate_proj", p), inter, hidden, hint, NN_SPLIT_ROWS);
    nn_bind_linear_split(b, &out->gate_up, nn_name(b, "%sup_proj", p), inter, hidden, hint, NN_SPLIT_ROWS);
    snprintf(hint, sizeof hint, "hidden_size, %s", inter_name);
    nn_bind_linear_split(b, &out->down, nn_name(b, "%sdown_proj", p), hidden, inter, hint, NN_SPLIT_COLS);
}

int32_t nn_ffn_inter(const nn_ffn *f) { return f->gate_up.n_parts ? (int32_t)f->gate_up.parts[0].w.rows : 0; }

void nn_ffn_linears(nn_ffn *f, nn_linear_list *list) {
    nn_linear_list_add(list, &f->gate_up);
    nn_linear_list_add(list, &f->down);
}

void nn_ffn_scratch_take(nn_ffn_scratch *s, int32_t inter, nn_arena *a, int32_t tokens) {
    const size_t n = (size_t)tokens * (size_t)inter * sizeof(float);
    s->gate_up = nn_take(a, 2 * n);
    s->h = nn_take(a, n);
}

void nn_ffn_forward(cv_threadpool *pool, const nn_ffn *f, nn_input in, int32_t T, const nn_ffn_scratch *s, float *out) {
    const int64_t I = nn_ffn_inter(f);
    float *gate_up[] = {s->gate_up, s->gate_up + (int64_t)T * I};
    const cv_act_quant *quant = nn_linear_input_quant(&f->down);
    /* down reads bf16: its input goes into the shared bf16 scratch, which down reads next and
     * nothing writes in between */
    uint16_t *hb = !quant && nn_linear_input_bf16(&f->down) && !f->down.observe.fn ? f->down.bf16_scratch->rows : NULL;
    bool fused = false; /* SwiGLU in gate|up's epilogue (the profile counts it in gate_up_proj) */
    if (hb) NN_TIMED(CV_OP_GATE_UP_PROJ, fused = nn_linear_swiglu_bf16(pool, &f->gate_up, in, T, hb));
    if (!fused) NN_TIMED(CV_OP_GATE_UP_PROJ, nn_linear_forward(pool, &f->gate_up, in, T, gate_up));
    nn_input h = nn_f32(s->h);
    if (hb) {
        h = (nn_input){.bf16 = hb};
        if (!fused) NN_TIMED(CV_OP_SWIGLU, cv_swiglu_bf16(pool, s->gate_up, T, I, I, (int64_t)T * I, hb));
    } else if (quant && !f->down.observe.fn && !nn_lora_active(&f->down)) { /* an adapter reads down's f32 input */
        const nn_qrows *q = f->down.scratch;
        h = (nn_input){.i8 = q->codes, .i8_scale = q->scale, .quant = *quant};
        NN_TIMED(CV_OP_SWIGLU, cv_swiglu_quant(pool, s->gate_up, T, I, I, (int64_t)T * I, &h.quant, q->codes, q->scale));
    } else {
        NN_TIMED(CV_OP_SWIGLU, cv_swiglu(pool, s->h, s->gate_up, T, I, I, (int64_t)T * I));
    }
    NN_TIMED(CV_OP_DOWN_PROJ, nn_linear_forward(pool, &f->down, h, T, &out));
    if (f->tp) NN_TIMED(CV_OP_ALLREDUCE, f->tp->allreduce(f->tp->ctx, out, (size_t)T * (size_t)f->down.parts[0].w.rows));
}
