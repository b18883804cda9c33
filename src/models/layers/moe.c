/*
 * moe.c — see moe.h. The router, the routed experts and the shared expert's weighting are charged
 * to the profile's MoE role; the shared expert's ffn to its own roles.
 */
#include "models/layers/moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "models/layers/timed.h"

static const char GATE_UP_HINT[] = "moe_intermediate_size, hidden_size", DOWN_HINT[] = "hidden_size, moe_intermediate_size";

/* How this rank holds its experts: split within each (tensor parallelism), or whole. */
static nn_split expert_split(const nn_binder *b, bool rows) {
    if (b->tp.expert_parallel) return NN_WHOLE;
    return rows ? NN_SPLIT_ROWS : NN_SPLIT_COLS;
}

/* Routed expert e (the rank's i-th) bound per expert: experts.{e}.{gate,up,down}_proj in their scheme. */
static void bind_expert(nn_binder *b, const char *prefix, int32_t e, int32_t i, int32_t hidden, int32_t inter,
                        nn_moe *m) {
    nn_bind_linear_split(b, &m->gate_up[i], nn_name(b, "%sexperts.%d.gate_proj", prefix, e), inter, hidden,
                         GATE_UP_HINT, expert_split(b, true));
    nn_bind_linear_split(b, &m->gate_up[i], nn_name(b, "%sexperts.%d.up_proj", prefix, e), inter, hidden,
                         GATE_UP_HINT, expert_split(b, true));
    nn_bind_linear_split(b, &m->down[i], nn_name(b, "%sexperts.%d.down_proj", prefix, e), hidden, inter, DOWN_HINT,
                         expert_split(b, false));
}

/* Fused 3-D experts: views of expert e's rows, no copy (but for the columns of down_proj a rank
 * takes under tensor parallelism). Returns 1 bound, 0 absent. */
static int bind_fused_experts(nn_binder *b, const char *prefix, int32_t hidden, const nn_moe_config *c, nn_moe *m) {
    const int64_t E = c->n_experts, I = c->expert_inter, H = hidden;
    int64_t gu_shape[3] = {E, 2 * I, H}, down_shape[3] = {E, H, I};
    cv_tensor gu, down;
    int found = cv_weights_get_optional(b->src, nn_name(b, "%sexperts.gate_up_proj", prefix), 3, gu_shape,
                                        "num_experts, 2*moe_intermediate_size, hidden_size", &gu);
    if (found <= 0) {
        if (found < 0) b->rc = found;
        return found > 0;
    }
    b->rc = cv_weights_get(b->src, nn_name(b, "%sexperts.down_proj", prefix), 3, down_shape,
                           "num_experts, hidden_size, moe_intermediate_size", &down);
    nn_check_matrix_dtype(b, gu.name, gu.dtype);
    nn_check_matrix_dtype(b, down.name, down.dtype);
    if (b->rc) return 1;
    const size_t gu_expert = (size_t)(2 * I * H) * cv_dtype_size(gu.dtype), gu_half = gu_expert / 2;
    const size_t down_expert = (size_t)(H * I) * cv_dtype_size(down.dtype);
    for (int32_t i = 0; i < m->n_local; i++) {
        const int32_t e = m->first_expert + i;
        const char *g = (const char *)gu.data + (size_t)e * gu_expert, *d = (const char *)down.data + (size_t)e * down_expert;
        nn_linear_add_view_split(b, &m->gate_up[i], nn_name(b, "%sexperts.%d.gate_proj", prefix, e),
                                 &(cv_matrix){g, gu.dtype, I, H}, expert_split(b, true));
        nn_linear_add_view_split(b, &m->gate_up[i], nn_name(b, "%sexperts.%d.up_proj", prefix, e),
                                 &(cv_matrix){g + gu_half, gu.dtype, I, H}, expert_split(b, true));
        nn_linear_add_view_split(b, &m->down[i], nn_name(b, "%sexperts.%d.down_proj", prefix, e),
                                 &(cv_matrix){d, down.dtype, H, I}, expert_split(b, false));
    }
    b->matmul_bytes += (gu.nbytes + down.nbytes) / (size_t)E * (size_t)m->n_local;
    return 1;
}

/* Expert e as the grouped kernel takes it: pointers to its linears' weights, which packing fills
 * in place. gate|up are one weight when they stack, else one each. */
static void kernel_expert(nn_moe *m, int32_t e, int64_t inter) {
    const nn_linear *gu = &m->gate_up[e], *down = &m->down[e];
    m->experts[e] = (cv_moe_expert){.gate = &gu->w[0], .up = &gu->w[gu->n_weights - 1], .down = &down->w[0],
                                    .inter = inter, .up_row = gu->n_weights == 1 ? inter : 0,
                                    .gate_quant = gu->parts[0].quant, .up_quant = gu->parts[1].quant,
                                    .down_quant = down->parts[0].quant};
}

int nn_moe_check_expert_split(int32_t n_experts, int ranks) {
    if (n_experts % ranks == 0) return 0;
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "num_experts=%d does not split over %d expert-parallel ranks", n_experts,
                   ranks);
}

void nn_bind_moe(nn_binder *b, const char *prefix, int32_t hidden, const nn_moe_config *c, nn_moe *out) {
    if (b->rc) return;
    if (c->top_k > c->n_experts) {
        b->rc = cv_fail(CVLLM_ERR_FORMAT, "config.json: num_experts_per_tok=%d exceeds num_experts=%d", c->top_k,
                        c->n_experts);
        return;
    }
    char p[200];
    snprintf(p, sizeof p, "%s", prefix);
    const bool ep = b->tp.expert_parallel && b->tp.size > 1;
    if (ep && (b->rc = nn_moe_check_expert_split(c->n_experts, b->tp.size))) return;
    const int32_t local = ep ? c->n_experts / b->tp.size : c->n_experts;
    const size_t E = (size_t)local;
    *out = (nn_moe){.n_routed = c->n_experts, .first_expert = ep ? b->tp.rank * local : 0, .n_local = local,
                    .top_k = c->top_k, .renormalize = c->renormalize, .has_shared = c->shared_inter > 0,
                    .observe = b->observe, .bf16_input = b->bf16_input};
    out->experts = nn_own(b, E * sizeof *out->experts);
    out->gate_up = nn_own(b, E * sizeof *out->gate_up);
    out->down = nn_own(b, E * sizeof *out->down);
    if (b->rc) return;
    /* Float experts stay views of the checkpoint, except where bf16 compute runs the bf16 dot-product
     * kernel, which reads panels. */
    for (size_t e = 0; e < E; e++) out->gate_up[e].float_views = out->down[e].float_views = !b->bf16_input;
    nn_bind_linear(b, &out->route, nn_name(b, "%sgate", p), c->n_experts, hidden, "num_experts, hidden_size");
    const size_t before = b->matmul_bytes;
    b->adapters_off = true; /* an expert's rows are the tokens routed to it */
    if (!b->rc && !bind_fused_experts(b, p, hidden, c, out))
        for (int32_t i = 0; i < local && !b->rc; i++)
            bind_expert(b, p, out->first_expert + i, i, hidden, c->expert_inter, out);
    b->adapters_off = false;
    for (int32_t i = 0; i < local && !b->rc; i++)
        kernel_expert(out, i, ep ? c->expert_inter : c->expert_inter / b->tp.size);
    /* A token streams only its top_k experts, of which this rank holds local / n_experts. */
    b->matmul_bytes = before + (b->matmul_bytes - before) / (size_t)c->n_experts * (size_t)c->top_k;
    if (out->has_shared) {
        char sp[240];
        snprintf(sp, sizeof sp, "%sshared_expert.", p);
        nn_bind_ffn(b, sp, hidden, c->shared_inter, "shared_expert_intermediate_size", &out->ffn);
        out->ffn.tp = NULL; /* reduced with the routed experts' sum */
        nn_bind_linear(b, &out->route, nn_name(b, "%sshared_expert_gate", p), 1, hidden, "1, hidden_size");
    }
    out->tp = b->tp.size > 1 ? &b->tp : NULL;
}

void nn_bind_dense_mlp(nn_binder *b, const char *prefix, int32_t hidden, int32_t inter, nn_moe *out) {
    if (b->rc) return;
    *out = (nn_moe){0};
    nn_bind_ffn(b, prefix, hidden, inter, "intermediate_size", &out->ffn);
}

void nn_moe_linears(nn_moe *m, nn_linear_list *list) {
    nn_linear_list_add(list, &m->route);
    nn_ffn_linears(&m->ffn, list);
    for (int32_t e = 0; e < m->n_local; e++) {
        nn_linear_list_add(list, &m->gate_up[e]);
        nn_linear_list_add(list, &m->down[e]);
    }
}

const nn_linear *nn_moe_input_linear(const nn_moe *m) { return &m->ffn.gate_up; }

void nn_moe_sizes_add(nn_moe_sizes *z, const nn_moe *m) {
    for (int32_t e = 0; e < m->n_local; e++) {
        const cv_moe_expert *x = &m->experts[e];
        if (x->inter > z->max_inter) z->max_inter = (int32_t)x->inter;
        z->int8 = z->int8 || cv_wformat_int8_input(x->gate->format) || cv_wformat_int8_input(x->down->format);
        z->bf16 = z->bf16 || (m->bf16_input && (cv_wformat_bf16_input(x->gate->format) ||
                                                cv_wformat_bf16_input(x->down->format)));
    }
    if (m->n_routed > 0 && m->top_k > z->top_k) z->top_k = m->top_k;
    if (m->n_routed > z->n_routed) z->n_routed = m->n_routed;
    if (nn_ffn_inter(&m->ffn) > z->ffn_inter) z->ffn_inter = nn_ffn_inter(&m->ffn);
    if (m->n_routed > 0 && m->observe.fn) z->observed = true;
}

void nn_moe_scratch_take(nn_moe_scratch *s, const nn_moe_sizes *z, cv_threadpool *pool, int32_t hidden, nn_arena *a,
                         int32_t tokens) {
    const size_t T = (size_t)tokens, f = sizeof(float);
    s->logits = nn_take(a, T * (size_t)z->n_routed * f);
    s->shared_logit = nn_take(a, T * f);
    s->weights = nn_take(a, T * (size_t)z->top_k * f);
    s->ids = nn_take(a, T * (size_t)z->top_k * sizeof(int32_t));
    s->workspace = z->n_routed ? nn_take(a, cv_moe_workspace_bytes(pool, tokens, z->top_k, hidden, z->max_inter,
                                                                   z->n_routed, z->int8, z->bf16))
                               : NULL;
    nn_ffn_scratch_take(&s->ffn, z->ffn_inter, a, tokens);
    s->shared = nn_take(a, T * (size_t)hidden * f);
    const size_t inter = z->observed ? T * (size_t)z->max_inter * f : 0;
    s->xs = z->observed ? nn_take(a, T * (size_t)hidden * f) : NULL;
    s->gate_up = z->observed ? nn_take(a, 2 * inter) : NULL;
    s->h = z->observed ? nn_take(a, inter) : NULL;
}

/* Reports each routed expert's inputs: the rows of its tokens (token order) to gate_proj and up_proj,
 * and their SwiGLU, computed here from the same weights, to down_proj (whose product is computed
 * too, unused, so that the report goes through the linear). Experts no token chose report
 * nothing. */
static void observe_experts(cv_threadpool *pool, const nn_moe *m, int32_t hidden, const float *in, int32_t T,
                            const nn_moe_scratch *s) {
    const size_t row = (size_t)hidden * sizeof(float);
    for (int32_t e = 0; e < m->n_local; e++) {
        int64_t rows = 0;
        for (int32_t t = 0; t < T; t++)
            for (int32_t k = 0; k < m->top_k; k++)
                if (s->ids[(int64_t)t * m->top_k + k] == e) memcpy(s->xs + rows++ * hidden, in + (int64_t)t * hidden, row);
        if (rows == 0) continue;
        const int64_t I = m->experts[e].inter;
        float *gate_up[] = {s->gate_up, s->gate_up + rows * I};
        nn_linear_forward(pool, &m->gate_up[e], nn_f32(s->xs), rows, gate_up);
        cv_silu_mul(s->h, gate_up[0], gate_up[1], rows * I);
        nn_linear_forward(pool, &m->down[e], nn_f32(s->h), rows, &s->xs);
    }
}

/* Expert parallelism: the routes to this rank's experts as indices among them, the others none
 * (negative: the kernel skips them; their rank adds them). */
static void local_routes(const nn_moe *m, int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const int32_t e = ids[i] - m->first_expert;
        ids[i] = e >= 0 && e < m->n_local ? e : -1;
    }
}

void nn_moe_forward(cv_threadpool *pool, const nn_moe *m, int32_t hidden, nn_input in, int32_t T,
                    const nn_moe_scratch *s, float *out) {
    if (m->n_routed == 0) {
        nn_ffn_forward(pool, &m->ffn, in, T, &s->ffn, out);
        return;
    }
    NN_TIMED(CV_OP_MOE, {
        float *route[] = {s->logits, s->shared_logit};
        nn_linear_forward(pool, &m->route, in, T, route);
        cv_moe_route(s->logits, T, m->n_routed, m->top_k, m->renormalize, s->ids, s->weights);
        if (m->n_local < m->n_routed) local_routes(m, s->ids, (int64_t)T * m->top_k);
        if (m->observe.fn) observe_experts(pool, m, hidden, in.f32, T, s);
        memset(out, 0, (size_t)T * (size_t)hidden * sizeof *out);
        cv_moe_args a = {
            .n_tokens = T, .hidden = hidden, .n_experts = m->n_local, .experts = m->experts, .routes = m->top_k,
            .ids = s->ids, .weights = s->weights, .x = in.f32, .y = out, .workspace = s->workspace,
            .bf16_input = m->bf16_input,
        };
        cv_moe(pool, &a);
    });
    if (m->has_shared) {
        /* Added after the routed experts, as when it was the last route of the grouped kernel. */
        nn_ffn_forward(pool, &m->ffn, in, T, &s->ffn, s->shared);
        NN_TIMED(CV_OP_MOE, for (int32_t t = 0; t < T; t++) {
            const float w = 1.0f / (1.0f + expf(-s->shared_logit[t]));
            float *o = out + (int64_t)t * hidden;
            const float *e = s->shared + (int64_t)t * hidden;
            for (int32_t i = 0; i < hidden; i++) o[i] += w * e[i];
        });
    }
    if (m->tp) NN_TIMED(CV_OP_ALLREDUCE, m->tp->allreduce(m->tp->ctx, out, (size_t)T * (size_t)hidden));
}
