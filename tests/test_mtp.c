/*
 * test_mtp.c — the multi-token-prediction module of Qwen3-Next, Qwen3.5-MoE and Qwen3.5 dense.
 *
 * There are no reference logits for MTP, so the model's mtp_forward is checked against a naive
 * implementation written here straight from the spec: plain double-precision loops over the
 * checkpoint's tensors converted to f32 — embedding, the two (1+w) pre-fc norms, fc over
 * [embedding; hidden], one gated-attention layer (partial RoPE, (1+w) q/k norms, causal softmax,
 * sigmoid output gate), the MoE with its sigmoid-gated shared expert (Qwen3.5 dense: its SwiGLU
 * MLP), the final (1+w) norm and lm_head. It shares no code with the model beyond the checkpoint
 * reader.
 *
 * On every family, f32 and bf16, AVX-512 and AVX2:
 *   - forward()'s hidden_out is the final-normed hidden: lm_head over it gives forward's logits;
 *   - mtp_forward over 40 positions of a prompt (row i = token i+1 with the main model's hidden of
 *     token i) against the naive module, logits and hidden_out;
 *   - a second draft step fed its own hidden_out (the same buffer as input and output) against the
 *     naive module continued by one row;
 *   - the same 40 positions in chunks of 1, 7 and 16 (the MTP KV cache carries the context) against
 *     the one-shot call.
 * Loading: without load_mtp no mtp tensor is bound (one KV layer, no mtp_forward, weight bytes
 * unchanged); with it on a checkpoint stripped of mtp.* there is no mtp_forward and no error;
 * config.json declaring 0 MTP layers skips it, 2 is refused, a negative count is a format error; a
 * checkpoint missing one mtp tensor fails naming it; made-up weights follow config.json. Bad
 * calls: no hidden states, a KV cache without the MTP layer.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_edit.h"
#include "loader/safetensors.h"
#include "model_fixture.h"

static const char *const FOLDERS[] = {"qwen3-next-f32",   "qwen3-next-bf16",   "qwen3.5-moe-f32",
                                       "qwen3.5-moe-bf16", "qwen3.5-dense-f32", "qwen3.5-dense-bf16"};

enum { P = 40 }; /* MTP rows checked: positions 0..P-1, tokens 1..P of the prompt */

/* ---- the naive module ------------------------------------------------------------------------- */

typedef struct naive_expert {
    float *gate, *up, *down; /* [I][H], [I][H], [H][I] */
    int64_t inter;
} naive_expert;

typedef struct naive_mtp {
    int64_t H, V, n_heads, n_kv, hd, rot;
    int64_t n_experts, top_k; /* n_experts 0: a dense MLP */
    double eps, theta;
    float *embed, *lm_head, *norm_e, *norm_h, *fc, *final_norm, *in_norm, *post_norm;
    float *wq, *wk, *wv, *wo, *q_norm, *k_norm, *router, *shared_gate; /* router, shared_gate: MoE only */
    naive_expert *experts; /* n_experts routed, then the shared one or the dense MLP */
} naive_mtp;

static float *tensor_f32(const cv_checkpoint *ck, const char *name) {
    const cv_tensor *t = cv_checkpoint_find(ck, name);
    if (!t) {
        fprintf(stderr, "test_mtp: tensor %s missing from the reference checkpoint\n", name);
        abort();
    }
    size_t n = (size_t)cv_tensor_numel(t);
    float *f = cv_xmalloc(n * sizeof *f);
    cv_convert_to_f32(f, t->data, t->dtype, n);
    return f;
}

/* Slice [offset, offset+n) of a fused tensor as its own f32 array. */
static float *slice_f32(const cv_checkpoint *ck, const char *name, size_t offset, size_t n) {
    const cv_tensor *t = cv_checkpoint_find(ck, name);
    float *f = cv_xmalloc(n * sizeof *f);
    cv_convert_to_f32(f, (const char *)t->data + offset * cv_dtype_size(t->dtype), t->dtype, n);
    return f;
}

static void naive_load(naive_mtp *n, const cv_checkpoint *ck, const cv_model_config *cfg, bool next) {
    json_t *text = cfg->text;
    n->H = cfg->hidden_size;
    n->V = cfg->vocab_size;
    n->n_heads = cfg->num_attention_heads;
    n->n_kv = cfg->num_key_value_heads;
    n->hd = cfg->head_dim;
    n->rot = (int64_t)(cfg->head_dim * cfg->rope.partial_rotary_factor);
    n->eps = cfg->rms_norm_eps;
    n->theta = cfg->rope.theta;
    n->embed = tensor_f32(ck, next ? "model.embed_tokens.weight" : "model.language_model.embed_tokens.weight");
    n->lm_head = tensor_f32(ck, "lm_head.weight");
    n->norm_e = tensor_f32(ck, "mtp.pre_fc_norm_embedding.weight");
    n->norm_h = tensor_f32(ck, "mtp.pre_fc_norm_hidden.weight");
    n->fc = tensor_f32(ck, "mtp.fc.weight");
    n->final_norm = tensor_f32(ck, "mtp.norm.weight");
    n->in_norm = tensor_f32(ck, "mtp.layers.0.input_layernorm.weight");
    n->post_norm = tensor_f32(ck, "mtp.layers.0.post_attention_layernorm.weight");
    n->wq = tensor_f32(ck, "mtp.layers.0.self_attn.q_proj.weight");
    n->wk = tensor_f32(ck, "mtp.layers.0.self_attn.k_proj.weight");
    n->wv = tensor_f32(ck, "mtp.layers.0.self_attn.v_proj.weight");
    n->wo = tensor_f32(ck, "mtp.layers.0.self_attn.o_proj.weight");
    n->q_norm = tensor_f32(ck, "mtp.layers.0.self_attn.q_norm.weight");
    n->k_norm = tensor_f32(ck, "mtp.layers.0.self_attn.k_norm.weight");
    if (!cv_checkpoint_find(ck, "mtp.layers.0.mlp.gate.weight")) { /* no router: Qwen3.5 dense */
        n->experts = cv_xcalloc(1, sizeof *n->experts);
        *n->experts = (naive_expert){tensor_f32(ck, "mtp.layers.0.mlp.gate_proj.weight"),
                                     tensor_f32(ck, "mtp.layers.0.mlp.up_proj.weight"),
                                     tensor_f32(ck, "mtp.layers.0.mlp.down_proj.weight"), cfg->intermediate_size};
        return;
    }
    n->n_experts = json_integer_value(json_object_get(text, "num_experts"));
    n->top_k = json_integer_value(json_object_get(text, "num_experts_per_tok"));
    const int64_t I = json_integer_value(json_object_get(text, "moe_intermediate_size"));
    n->router = tensor_f32(ck, "mtp.layers.0.mlp.gate.weight");
    n->shared_gate = tensor_f32(ck, "mtp.layers.0.mlp.shared_expert_gate.weight");
    n->experts = cv_xcalloc((size_t)n->n_experts + 1, sizeof *n->experts);
    const size_t HI = (size_t)(n->H * I);
    for (int64_t e = 0; e < n->n_experts; e++) {
        naive_expert *x = &n->experts[e];
        x->inter = I;
        if (cv_checkpoint_find(ck, "mtp.layers.0.mlp.experts.gate_up_proj")) {
            /* fused [E][2I][H], gate rows first; down [E][H][I] */
            x->gate = slice_f32(ck, "mtp.layers.0.mlp.experts.gate_up_proj", (size_t)e * 2 * HI, HI);
            x->up = slice_f32(ck, "mtp.layers.0.mlp.experts.gate_up_proj", (size_t)e * 2 * HI + HI, HI);
            x->down = slice_f32(ck, "mtp.layers.0.mlp.experts.down_proj", (size_t)e * HI, HI);
        } else {
            char name[128];
            snprintf(name, sizeof name, "mtp.layers.0.mlp.experts.%lld.gate_proj.weight", (long long)e);
            x->gate = tensor_f32(ck, name);
            snprintf(name, sizeof name, "mtp.layers.0.mlp.experts.%lld.up_proj.weight", (long long)e);
            x->up = tensor_f32(ck, name);
            snprintf(name, sizeof name, "mtp.layers.0.mlp.experts.%lld.down_proj.weight", (long long)e);
            x->down = tensor_f32(ck, name);
        }
    }
    naive_expert *sh = &n->experts[n->n_experts];
    sh->inter = json_integer_value(json_object_get(text, "shared_expert_intermediate_size"));
    sh->gate = tensor_f32(ck, "mtp.layers.0.mlp.shared_expert.gate_proj.weight");
    sh->up = tensor_f32(ck, "mtp.layers.0.mlp.shared_expert.up_proj.weight");
    sh->down = tensor_f32(ck, "mtp.layers.0.mlp.shared_expert.down_proj.weight");
}

static void naive_free(naive_mtp *n) {
    float *all[] = {n->embed, n->lm_head, n->norm_e, n->norm_h, n->fc, n->final_norm, n->in_norm, n->post_norm,
                    n->wq, n->wk, n->wv, n->wo, n->q_norm, n->k_norm, n->router, n->shared_gate};
    for (size_t i = 0; i < CV_ARRAY_LEN(all); i++) free(all[i]);
    for (int64_t e = 0; e <= n->n_experts; e++) {
        free(n->experts[e].gate);
        free(n->experts[e].up);
        free(n->experts[e].down);
    }
    free(n->experts);
}

/* y = x / rms(x) · (1 + w) */
static void norm_plus_one(double *y, const double *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * (1.0 + w[i]);
}

/* y[rows] = W[rows][cols] · x */
static void matvec(double *y, const float *W, const double *x, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        double acc = 0;
        for (int64_t c = 0; c < cols; c++) acc += (double)W[r * cols + c] * x[c];
        y[r] = acc;
    }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Rotate-half RoPE on the first rot dims of one head. */
static void rope(const naive_mtp *n, double *x, int64_t pos) {
    const int64_t half = n->rot / 2;
    for (int64_t j = 0; j < half; j++) {
        const double angle = (double)pos * pow(n->theta, -2.0 * (double)j / (double)n->rot);
        const double a = x[j], b = x[j + half];
        x[j] = a * cos(angle) - b * sin(angle);
        x[j + half] = b * cos(angle) + a * sin(angle);
    }
}

static void expert_add(double *y, const naive_expert *e, const double *x, double weight, int64_t H) {
    double *g = cv_xmalloc((size_t)e->inter * sizeof *g), *u = cv_xmalloc((size_t)e->inter * sizeof *u);
    double *d = cv_xmalloc((size_t)H * sizeof *d);
    matvec(g, e->gate, x, e->inter, H);
    matvec(u, e->up, x, e->inter, H);
    for (int64_t i = 0; i < e->inter; i++) g[i] = g[i] * sigmoid(g[i]) * u[i];
    matvec(d, e->down, g, H, e->inter);
    for (int64_t i = 0; i < H; i++) y[i] += weight * d[i];
    free(g);
    free(u);
    free(d);
}

/* Softmax router, top-k, renormalised; plus the shared expert weighted by σ(gate · x). Without
 * experts, the dense MLP. */
static void mlp(const naive_mtp *n, double *y, const double *x) {
    const int64_t E = n->n_experts, H = n->H;
    if (E == 0) {
        memset(y, 0, (size_t)H * sizeof *y);
        expert_add(y, &n->experts[0], x, 1.0, H);
        return;
    }
    double logits[64], p[64], chosen_sum = 0;
    bool chosen[64] = {0};
    if (E > 64) abort(); /* the test checkpoints have 8 */
    matvec(logits, n->router, x, E, H);
    double mx = logits[0];
    for (int64_t e = 1; e < E; e++) mx = fmax(mx, logits[e]);
    /* Unnormalised softmax: renormalising over the chosen experts cancels the full sum. */
    for (int64_t e = 0; e < E; e++) p[e] = exp(logits[e] - mx);
    for (int64_t k = 0; k < n->top_k; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (!chosen[e] && (best < 0 || p[e] > p[best])) best = e;
        chosen[best] = true;
        chosen_sum += p[best];
    }
    memset(y, 0, (size_t)H * sizeof *y);
    for (int64_t e = 0; e < E; e++)
        if (chosen[e]) expert_add(y, &n->experts[e], x, p[e] / chosen_sum, H);
    double gate;
    matvec(&gate, n->shared_gate, x, 1, H);
    expert_add(y, &n->experts[E], x, sigmoid(gate), H);
}

/*
 * The MTP module over rows 0..rows-1 of one sequence (row i: token ids[i], hidden[i], position
 * first_pos + i, attending to rows ≤ i). Writes logits [rows][V] and m [rows][H].
 */
static void naive_forward(const naive_mtp *n, const int32_t *ids, const float *hidden, int64_t rows,
                          int64_t first_pos, float *logits, float *m_out) {
    const int64_t H = n->H, hd = n->hd, nh = n->n_heads, nkv = n->n_kv;
    double *cat = cv_xmalloc((size_t)(2 * H) * sizeof *cat), *tmp = cv_xmalloc((size_t)H * sizeof *tmp);
    double *x = cv_xmalloc((size_t)(rows * H) * sizeof *x), *a = cv_xmalloc((size_t)H * sizeof *a);
    double *q = cv_xmalloc((size_t)(rows * nh * 2 * hd) * sizeof *q);
    double *k = cv_xmalloc((size_t)(rows * nkv * hd) * sizeof *k);
    double *v = cv_xmalloc((size_t)(rows * nkv * hd) * sizeof *v);
    double *o = cv_xmalloc((size_t)(nh * hd) * sizeof *o), *scores = cv_xmalloc((size_t)rows * sizeof *scores);
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t c = 0; c < H; c++) {
            tmp[c] = n->embed[(int64_t)ids[i] * H + c];
            a[c] = hidden[i * H + c];
        }
        norm_plus_one(cat, tmp, n->norm_e, H, n->eps);
        norm_plus_one(cat + H, a, n->norm_h, H, n->eps);
        matvec(x + i * H, n->fc, cat, H, 2 * H);
        norm_plus_one(a, x + i * H, n->in_norm, H, n->eps);
        double *qi = q + i * nh * 2 * hd, *ki = k + i * nkv * hd, *vi = v + i * nkv * hd;
        matvec(qi, n->wq, a, nh * 2 * hd, H); /* per head: [query | gate] */
        matvec(ki, n->wk, a, nkv * hd, H);
        matvec(vi, n->wv, a, nkv * hd, H);
        for (int64_t h = 0; h < nh; h++) {
            norm_plus_one(qi + h * 2 * hd, qi + h * 2 * hd, n->q_norm, hd, n->eps);
            rope(n, qi + h * 2 * hd, first_pos + i);
        }
        for (int64_t h = 0; h < nkv; h++) {
            norm_plus_one(ki + h * hd, ki + h * hd, n->k_norm, hd, n->eps);
            rope(n, ki + h * hd, first_pos + i);
        }
    }
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t h = 0; h < nh; h++) {
            const int64_t g = h / (nh / nkv);
            const double *qh = q + i * nh * 2 * hd + h * 2 * hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= i; j++) {
                double s = 0;
                for (int64_t d = 0; d < hd; d++) s += qh[d] * k[j * nkv * hd + g * hd + d];
                scores[j] = s / sqrt((double)hd);
                mx = fmax(mx, scores[j]);
            }
            for (int64_t j = 0; j <= i; j++) sum += scores[j] = exp(scores[j] - mx);
            for (int64_t d = 0; d < hd; d++) {
                double acc = 0;
                for (int64_t j = 0; j <= i; j++) acc += scores[j] / sum * v[j * nkv * hd + g * hd + d];
                o[h * hd + d] = acc * sigmoid(qh[hd + d]);
            }
        }
        double *xi = x + i * H;
        matvec(tmp, n->wo, o, H, nh * hd);
        for (int64_t c = 0; c < H; c++) xi[c] += tmp[c];
        norm_plus_one(a, xi, n->post_norm, H, n->eps);
        mlp(n, tmp, a);
        for (int64_t c = 0; c < H; c++) xi[c] += tmp[c];
        norm_plus_one(a, xi, n->final_norm, H, n->eps);
        for (int64_t c = 0; c < H; c++) m_out[i * H + c] = (float)a[c];
        double *lg = cv_xmalloc((size_t)n->V * sizeof *lg);
        matvec(lg, n->lm_head, a, n->V, H);
        for (int64_t c = 0; c < n->V; c++) logits[i * n->V + c] = (float)lg[c];
        free(lg);
    }
    free(cat);
    free(tmp);
    free(x);
    free(a);
    free(q);
    free(k);
    free(v);
    free(o);
    free(scores);
}

/* ---- driving the model ------------------------------------------------------------------------ */

static double worst_naive, worst_chunked, worst_hidden_out;

static double max_row_error(const float *got, const float *want, int64_t rows, int64_t cols) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double e = mf_row_error(got + r * cols, want + r * cols, cols);
        worst = e > worst || isnan(e) ? e : worst;
    }
    return worst;
}

/* An MTP step over `n` rows of sequence s (tokens s->tokens[done..]), all rows wanting logits. */
static int mtp_step(cv_model *m, mf_cache *c, mf_sequence *s, int32_t n, const float *hidden, float *hidden_out,
                    float *logits) {
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, c, s, n);
    st.batch.hidden_out = hidden_out;
    return m->ops->mtp_forward(m, &st.batch, hidden, &c->kv, logits);
}

/* The main model over the first P+1 prompt tokens of s: hidden_out, and lm_head over it = its logits. */
static float *main_hidden(const char *folder, cv_model *m, mf_cache *c, const naive_mtp *n, mf_sequence *s) {
    const int64_t H = n->H, V = n->V;
    float *hidden = cv_xmalloc((size_t)(P + 1) * (size_t)H * sizeof *hidden);
    float *logits = cv_xmalloc((size_t)(P + 1) * (size_t)V * sizeof *logits);
    float *want = cv_xmalloc((size_t)(P + 1) * (size_t)V * sizeof *want);
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, c, s, P + 1);
    st.batch.hidden_out = hidden;
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c->kv, &c->state, logits), 0);
    for (int64_t r = 0; r <= P; r++)
        for (int64_t v = 0; v < V; v++) {
            double acc = 0;
            for (int64_t i = 0; i < H; i++) acc += (double)n->lm_head[v * H + i] * hidden[r * H + i];
            want[r * V + v] = (float)acc;
        }
    double e = max_row_error(logits, want, P + 1, V);
    CHECK_MSG(e < 1e-5, "%s [%s]: lm_head over forward's hidden_out differs from its logits by %.3g", folder,
              cv_isa_name(cv_isa_active()), e);
    free(logits);
    free(want);
    return hidden;
}

static void check_close(const char *folder, const char *what, double err, double bound, double *worst) {
    CHECK_MSG(err <= bound, "%s [%s]: %s rel error %.3g (bound %.0e)", folder, cv_isa_name(cv_isa_active()), what, err,
              bound);
    if (err > *worst || isnan(err)) *worst = err;
}

static void test_folder(const char *folder, cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    mf_reference ref;
    if (mf_load_reference(dir, "long150", &ref)) {
        CHECK_MSG(0, "cannot read the reference prompt in %s", dir);
        return;
    }
    cv_model_config cfg;
    cv_weight_source *src;
    cv_checkpoint *ck;
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &src), 0);
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    cv_model *m;
    cv_model_load_params lp = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 8,
                               .load_mtp = true};
    int rc = cv_model_load(&lp, &m);
    CHECK_MSG(rc == 0, "loading %s with MTP: %s", folder, cv_error_message());
    if (rc) goto out;
    CHECK(m->ops->mtp_forward != NULL);
    CHECK_EQ_INT(m->kv_spec.num_layers, 2);
    naive_mtp n = {0};
    naive_load(&n, ck, &cfg, strstr(folder, "next") != NULL);
    const int64_t H = n.H, V = n.V;
    mf_cache c;
    mf_cache_init(&c, m);
    mf_sequence main_seq = {.tokens = ref.prompt, .n_total = ref.n_prompt, .state_slot = 0};
    float *hidden = main_hidden(folder, m, &c, &n, &main_seq);

    /* One-shot MTP over rows 0..P-1, then a draft step fed its own output, against the naive module. */
    float *want = cv_xmalloc((size_t)(P + 1) * (size_t)V * sizeof *want);
    float *want_m = cv_xmalloc((size_t)(P + 1) * (size_t)H * sizeof *want_m);
    float *got = cv_xmalloc((size_t)P * (size_t)V * sizeof *got), *got_m = cv_xmalloc((size_t)P * H * sizeof *got_m);
    int32_t ids[P + 1];
    memcpy(ids, ref.prompt + 1, P * sizeof *ids);
    /* The MTP rows share the main sequence's blocks (its own kv layer), as in the engine. */
    mf_sequence s = main_seq;
    s.tokens = ids;
    s.done = 0;
    CHECK_EQ_INT(mtp_step(m, &c, &s, P, hidden, got_m, got), 0);
    naive_forward(&n, ids, hidden, P, 0, want, want_m);
    check_close(folder, "one-shot MTP logits vs the naive module", max_row_error(got, want, P, V), 1e-4, &worst_naive);
    check_close(folder, "one-shot MTP hidden_out vs the naive module", max_row_error(got_m, want_m, P, H), 1e-4,
                &worst_hidden_out);
    ids[P] = mf_argmax(got + (int64_t)(P - 1) * V, (int32_t)V);
    float *fed = cv_xmalloc((size_t)H * sizeof *fed), *naive_hidden = cv_xmalloc((size_t)(P + 1) * H * sizeof(float));
    memcpy(fed, got_m + (int64_t)(P - 1) * H, (size_t)H * sizeof *fed);
    CHECK_EQ_INT(mtp_step(m, &c, &s, 1, fed, fed, got), 0); /* hidden in and out: one buffer */
    memcpy(naive_hidden, hidden, (size_t)P * H * sizeof(float));
    memcpy(naive_hidden + (int64_t)P * H, want_m + (int64_t)(P - 1) * H, (size_t)H * sizeof(float));
    naive_forward(&n, ids, naive_hidden, P + 1, 0, want, want_m);
    check_close(folder, "draft step 2 vs the naive module", max_row_error(got, want + (int64_t)P * V, 1, V), 1e-4,
                &worst_naive);
    check_close(folder, "draft step 2 hidden_out", max_row_error(fed, want_m + (int64_t)P * H, 1, H), 1e-4,
                &worst_hidden_out);

    /* The main model carries on over KV blocks the MTP layer wrote too: its layers are untouched.
     * Logits of a few rows out of order, with hidden_out: each comes from its own row. */
    float *main_logits = cv_xmalloc(3 * (size_t)V * sizeof *main_logits);
    float *main_hidden_out = cv_xmalloc(8 * (size_t)H * sizeof *main_hidden_out);
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &main_seq, 8);
    static const int32_t rows[] = {7, 0, 3};
    st.batch.n_logits = 3;
    memcpy(st.logit_rows, rows, sizeof rows);
    st.batch.hidden_out = main_hidden_out;
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, &c.state, main_logits), 0);
    for (int i = 0; i < 3; i++) {
        double e = mf_row_error(main_logits + i * V, ref.logits + (int64_t)(P + 1 + rows[i]) * V, V);
        CHECK_MSG(e <= MF_TOLERANCE, "%s [%s]: main model after MTP steps, row %d: rel error %.3g vs the reference",
                  folder, cv_isa_name(cv_isa_active()), rows[i], e);
    }
    free(main_logits);
    free(main_hidden_out);

    /* Chunked against one-shot, on fresh KV blocks. */
    float *one = cv_xmalloc((size_t)P * (size_t)V * sizeof *one);
    static const int32_t chunks[] = {1, 7, 16};
    mf_cache_reset_blocks(&c, &m->kv_spec);
    mf_sequence s1 = {.tokens = ids, .n_total = P};
    CHECK_EQ_INT(mtp_step(m, &c, &s1, P, hidden, NULL, one), 0);
    for (size_t k = 0; k < CV_ARRAY_LEN(chunks); k++) {
        mf_cache_reset_blocks(&c, &m->kv_spec);
        mf_sequence sc = {.tokens = ids, .n_total = P};
        while (sc.done < P) {
            int32_t first = sc.done, len = P - first < chunks[k] ? P - first : chunks[k];
            CHECK_EQ_INT(mtp_step(m, &c, &sc, len, hidden + (int64_t)first * H, NULL, got + (int64_t)first * V), 0);
        }
        check_close(folder, "chunked MTP vs one-shot", max_row_error(got, one, P, V), 1e-5, &worst_chunked);
    }

    /* Bad calls. */
    mf_sequence sb = {.tokens = ids, .n_total = 2};
    CHECK_EQ_INT(mtp_step(m, &c, &sb, 2, NULL, NULL, got), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "no hidden states");
    float *saved = c.kv.k[1];
    c.kv.k[1] = NULL;
    mf_sequence sk = {.tokens = ids, .n_total = 2};
    CHECK_EQ_INT(mtp_step(m, &c, &sk, 2, hidden, NULL, got), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "KV cache layer 1 is missing");
    c.kv.k[1] = saved;

    free(one);
    free(fed);
    free(naive_hidden);
    free(want);
    free(want_m);
    free(got);
    free(got_m);
    free(hidden);
    mf_cache_free(&c);
    naive_free(&n);
    cv_model_free(m);
out:
    cv_checkpoint_close(ck);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
    mf_free_reference(&ref);
}

/* ---- loading ---------------------------------------------------------------------------------- */

typedef struct drop_rule {
    const char *drop;
    bool exact;
} drop_rule;

static bool keep_undropped(const char *name, const void *ctx, char *out, size_t cap) {
    const drop_rule *r = ctx;
    if (r->exact ? !strcmp(name, r->drop) : !strncmp(name, r->drop, strlen(r->drop))) return false;
    snprintf(out, cap, "%s", name);
    return true;
}

/* A copy of the checkpoint in `from` without the tensors whose names start with `drop` (or equal
 * it, when exact), next to a copy of config.json in a new folder. */
static char *stripped_checkpoint(const char *from, const char *drop, bool exact) {
    char *dir = tu_make_temp_dir(), path[1024];
    snprintf(path, sizeof path, "%s/config.json", from);
    tu_link(path, dir, "config.json");
    const drop_rule rule = {drop, exact};
    ce_write_checkpoint(from, dir, keep_undropped, &rule);
    return dir;
}

typedef struct load_result {
    int rc;
    bool has_mtp;
    int32_t kv_layers;
    size_t weight_bytes;
} load_result;

/* Loads the checkpoint in `dir` (or made-up weights) with config.json edited by `edit`. */
static load_result load(const char *dir, const char *edit_key, int edit_value, bool load_mtp, bool dummy,
                        cv_threadpool *pool) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *text = json_object_get(root, "text_config") ? json_object_get(root, "text_config") : root;
    if (edit_key) json_object_set_new(text, edit_key, json_integer(edit_value));
    char *s = json_dumps(root, 0);
    json_decref(root);
    load_result r = {0};
    cv_model_config cfg;
    CHECK_EQ_INT(cv_model_config_parse(s, strlen(s), "config.json", &cfg), 0);
    free(s);
    cv_weight_source *src;
    CHECK_EQ_INT(dummy ? cv_weight_source_dummy(CV_DTYPE_BF16, 3, &src) : cv_weight_source_checkpoint(dir, &src), 0);
    cv_model *m = NULL;
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 4,
                              .load_mtp = load_mtp};
    r.rc = cv_model_load(&p, &m);
    if (!r.rc) {
        r.has_mtp = m->ops->mtp_forward != NULL;
        r.kv_layers = m->kv_spec.num_layers;
        r.weight_bytes = m->weight_bytes;
        if (dummy && r.has_mtp) { /* made-up MTP weights run */
            mf_cache c;
            mf_cache_init(&c, m);
            static const int32_t ids[] = {5, 6, 7};
            float hidden[3 * 64] = {0}, logits[3 * 4096];
            hidden[0] = hidden[64 + 1] = hidden[128 + 2] = 1.0f;
            mf_sequence sq = {.tokens = ids, .n_total = 3};
            CHECK_EQ_INT(mtp_step(m, &c, &sq, 3, hidden, NULL, logits), 0);
            int finite = 0;
            for (size_t i = 0; i < CV_ARRAY_LEN(logits); i++) finite += isfinite(logits[i]) != 0;
            CHECK_EQ_INT(finite, (int)CV_ARRAY_LEN(logits));
            mf_cache_free(&c);
        }
        cv_model_free(m);
    }
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
    return r;
}

static void test_loading(cv_threadpool *pool) {
    static const char *const folders[] = {"qwen3-next-bf16", "qwen3.5-moe-bf16", "qwen3.5-dense-bf16"};
    for (int f = 0; f < 3; f++) {
        const char *folder = folders[f];
        const char *count_key = f ? "mtp_num_hidden_layers" : "num_nextn_predict_layers";
        char dir[512];
        snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
        load_result without = load(dir, NULL, 0, false, false, pool), with = load(dir, NULL, 0, true, false, pool);
        CHECK_EQ_INT(without.rc, 0);
        CHECK(!without.has_mtp);
        CHECK_EQ_INT(without.kv_layers, 1);
        CHECK_EQ_INT(with.rc, 0);
        CHECK(with.has_mtp);
        CHECK_EQ_INT(with.kv_layers, 2);
        CHECK_EQ_INT(with.weight_bytes, without.weight_bytes); /* per main-model token */

        char *stripped = stripped_checkpoint(dir, "mtp.", false);
        load_result none = load(stripped, NULL, 0, true, false, pool);
        CHECK_EQ_INT(none.rc, 0);
        CHECK(!none.has_mtp);
        CHECK_EQ_INT(none.kv_layers, 1);
        none = load(stripped, NULL, 0, false, false, pool); /* proves nothing of mtp.* is needed */
        CHECK_EQ_INT(none.rc, 0);
        tu_remove_tree(stripped);
        free(stripped);

        stripped = stripped_checkpoint(dir, "mtp.norm.weight", true);
        CHECK_EQ_INT(load(stripped, NULL, 0, true, false, pool).rc, CVLLM_ERR_NOT_FOUND);
        CHECK_CONTAINS(cv_error_message(), "missing tensor mtp.norm.weight");
        tu_remove_tree(stripped);
        free(stripped);

        load_result zero = load(dir, count_key, 0, true, false, pool);
        CHECK_EQ_INT(zero.rc, 0);
        CHECK(!zero.has_mtp);
        CHECK_EQ_INT(load(dir, count_key, 2, true, false, pool).rc, CVLLM_ERR_UNSUPPORTED);
        CHECK_CONTAINS(cv_error_message(), "only one MTP layer is supported");
        CHECK_EQ_INT(load(dir, count_key, -1, true, false, pool).rc, CVLLM_ERR_FORMAT);
        CHECK_CONTAINS(cv_error_message(), "must be a non-negative integer");
        CHECK_EQ_INT(load(dir, count_key, 2, false, false, pool).rc, 0); /* not asked for: not looked at */

        /* Made-up weights: config.json decides (Qwen3-Next's test config does not declare MTP). */
        load_result dummy = load(dir, NULL, 0, true, true, pool);
        CHECK_EQ_INT(dummy.rc, 0);
        CHECK(dummy.has_mtp == (f != 0));
        dummy = load(dir, count_key, 1, true, true, pool);
        CHECK(dummy.has_mtp);
    }
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    test_loading(pool);
    static const cv_isa isas[] = {CV_ISA_AVX512, CV_ISA_AVX2};
    for (size_t i = 0; i < CV_ARRAY_LEN(isas); i++) {
        if (cv_isa_force(isas[i])) {
            printf("test_mtp: %s path not supported on this CPU, skipped\n", cv_isa_name(isas[i]));
            continue;
        }
        for (size_t f = 0; f < CV_ARRAY_LEN(FOLDERS); f++) test_folder(FOLDERS[f], pool);
    }
    printf("test_mtp: max rel error vs the naive module: logits %.3g, hidden_out %.3g; chunked vs one-shot %.3g\n",
           worst_naive, worst_hidden_out, worst_chunked);
    cv_threadpool_free(pool);
    return cv_check_summary("test_mtp");
}
