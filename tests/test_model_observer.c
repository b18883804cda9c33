/*
 * test_model_observer.c — the calibration observer (model.h, cv_linear_observer) on every model family.
 *
 * A model loaded with an observer reports each linear before it runs: its name (the weight's
 * prefix), its input rows and columns, and the rows themselves. On the f32 reference checkpoints of
 * dense Qwen3 (also bf16, whose linears take the packed path), Qwen3-MoE (per-expert tensors),
 * Qwen3-Next (grouped GDN projections), Qwen3.5-MoE (fused experts, "model.language_model." names)
 * and Qwen3.5 dense, one forward over 13 tokens with 2 logit rows is recorded and walked:
 *   - the names are the model's linears in execution order, each part of a stacked linear (q|k|v,
 *     gate|up, router|shared_expert_gate, in_proj_*) once with the same rows, every routed expert
 *     some token chose as experts.E.{gate,up,down}_proj in id order, lm_head last with one row per
 *     logit row, and nothing else;
 *   - the rows are the layers' inputs: the residual stream is followed in double precision from the
 *     embedding using only observed rows and the checkpoint's weights — each block's first linear
 *     sees rmsnorm(stream)·gain, the stream advances by each block's last observed input times its
 *     weight (o_proj / out_proj, down_proj), a routed expert sees exactly the rows of the tokens
 *     whose top-k (recomputed from the router's input) picked it, and every down_proj sees the
 *     SwiGLU of its gate_proj/up_proj input;
 *   - with the MTP module, mtp_forward reports mtp.fc (the normed [embedding; hidden] pairs) and its
 *     decoder layer under mtp.layers.0., walked the same way, then lm_head;
 *   - the same model without an observer gives the same logits, bit for bit.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/safetensors.h"
#include "model_fixture.h"

static const char *const FOLDERS[] = {"qwen3-dense-f32", "qwen3-dense-bf16", "qwen3-moe-f32",
                                      "qwen3-next-f32",  "qwen3.5-moe-f32",  "qwen3.5-dense-f32"};

enum { T = 13, N_LOGITS = 2 };
static const int32_t LOGIT_ROWS[N_LOGITS] = {3, T - 1};
#define BOUND 1e-4

/* ---- the recording observer ----------------------------------------------------------------- */

typedef struct observation {
    char *name;
    int64_t rows, cols;
    float *x;
} observation;

typedef struct recorder {
    observation *v;
    int n, cap;
} recorder;

static void record(void *ctx, const char *linear, const float *x, int64_t rows, int64_t cols) {
    recorder *r = ctx;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->v = cv_xrealloc(r->v, (size_t)r->cap * sizeof *r->v);
    }
    const size_t n = (size_t)(rows * cols);
    observation *o = &r->v[r->n++];
    *o = (observation){cv_xstrdup(linear), rows, cols, cv_xmalloc((n ? n : 1) * sizeof(float))};
    memcpy(o->x, x, n * sizeof(float));
}

static void recorder_clear(recorder *r) {
    for (int i = 0; i < r->n; i++) {
        free(r->v[i].name);
        free(r->v[i].x);
    }
    r->n = 0;
}

/* ---- what the walk knows: the checkpoint, config fields, the position in the recording ------ */

typedef struct walk {
    const char *folder;
    const cv_checkpoint *ck;
    const cv_model_config *cfg;
    const recorder *r;
    int at, end;              /* the observations of the call being walked: [at, end) */
    bool zero_centred;        /* the hybrids store norm gains as w, applied as 1 + w */
    int64_t H;
    double worst;
} walk;

static const char *fmt(char *buf, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static const char *fmt(char *buf, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, cap, f, ap);
    va_end(ap);
    return buf;
}

static const cv_tensor *tensor(const walk *w, const char *name) {
    const cv_tensor *t = cv_checkpoint_find(w->ck, name);
    if (!t) {
        fprintf(stderr, "test_model_observer: tensor %s missing from %s\n", name, w->folder);
        abort(); /* the walk asks only for what the family has: a test bug */
    }
    return t;
}

/* Elements [offset, offset+n) of a tensor as f32 (n 0: all of it). */
static float *weight_part(const walk *w, const char *name, size_t offset, size_t n) {
    const cv_tensor *t = tensor(w, name);
    if (!n) n = (size_t)cv_tensor_numel(t);
    float *f = cv_xmalloc(n * sizeof *f);
    cv_convert_to_f32(f, (const char *)t->data + offset * cv_dtype_size(t->dtype), t->dtype, n);
    return f;
}

static float *weight(const walk *w, const char *name) { return weight_part(w, name, 0, 0); }

static float *gain(const walk *w, const char *name) {
    float *g = weight(w, name);
    if (w->zero_centred)
        for (int64_t i = 0; i < w->H; i++) g[i] += 1.0f;
    return g;
}

static int64_t cfg_int(const walk *w, const char *key) {
    return (int64_t)json_integer_value(json_object_get(w->cfg->text, key));
}

/* The next observation, which must be `name` with rows × cols; NULL after a failed check. */
static const observation *take(walk *w, const char *name, int64_t rows, int64_t cols) {
    if (w->at >= w->end) {
        CHECK_MSG(0, "%s: expected %s, but nothing more was observed", w->folder, name);
        return NULL;
    }
    const observation *o = &w->r->v[w->at++];
    bool ok = !strcmp(o->name, name) && o->rows == rows && o->cols == cols;
    CHECK_MSG(ok, "%s: observation %d is %s [%lld x %lld], expected %s [%lld x %lld]", w->folder, w->at - 1, o->name,
              (long long)o->rows, (long long)o->cols, name, (long long)rows, (long long)cols);
    return ok ? o : NULL;
}

/* The next observation is another part of the same linear: `name`, with the rows of `first`. */
static bool take_same(walk *w, const observation *first, const char *name) {
    const observation *o = take(w, name, first->rows, first->cols);
    bool same = o && !memcmp(o->x, first->x, (size_t)(first->rows * first->cols) * sizeof(float));
    CHECK_MSG(!o || same, "%s: %s sees other rows than %s", w->folder, name, first->name);
    return same;
}

/* ---- naive math ----------------------------------------------------------------------------- */

static void rmsnorm(const double *x, const float *g, int64_t rows, int64_t dim, double eps, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += x[r * dim + i] * x[r * dim + i];
        double inv = 1.0 / sqrt(ss / (double)dim + eps);
        for (int64_t i = 0; i < dim; i++) y[r * dim + i] = g[i] * (x[r * dim + i] * inv);
    }
}

/* y [rows][out] (+)= x [rows][in] · wᵀ, w [out][in]. */
static void matmul(const float *x, int64_t rows, int64_t in, const float *w, int64_t out, bool add, double *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = 0;
            for (int64_t i = 0; i < in; i++) s += (double)x[r * in + i] * w[o * in + i];
            y[r * out + o] = add ? y[r * out + o] + s : s;
        }
}

/* The observation's rows against want, max|Δ| / max|want|; checked against BOUND. */
static void expect_rows(walk *w, const observation *o, const double *want) {
    const int64_t n = o->rows * o->cols;
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(o->x[i] - want[i]);
        if (!(d <= diff)) diff = d; /* NaN sticks */
        ref = fmax(ref, fabs(want[i]));
    }
    const double e = diff / ref;
    CHECK_MSG(e <= BOUND, "%s: the rows %s sees differ from its layer input: rel error %.3g", w->folder, o->name, e);
    if (e > w->worst || isnan(e)) w->worst = e;
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

/* down_proj's observation must be the SwiGLU of gate_proj/up_proj weights over x [rows][H]. */
static void expect_swiglu(walk *w, const observation *down, const float *x, const float *wg, const float *wu) {
    const int64_t rows = down->rows, I = down->cols;
    double *g = cv_xmalloc((size_t)(rows * I) * sizeof *g), *u = cv_xmalloc((size_t)(rows * I) * sizeof *u);
    matmul(x, rows, w->H, wg, I, false, g);
    matmul(x, rows, w->H, wu, I, false, u);
    for (int64_t i = 0; i < rows * I; i++) g[i] = silu(g[i]) * u[i];
    expect_rows(w, down, g);
    free(g);
    free(u);
}

/* ---- one block at a time -------------------------------------------------------------------- */

/* Attention or GDN at `p` ("...layers.3."): its first linear sees a [T][H]; adds its output to x. */
static bool walk_mixer(walk *w, const char *p, bool linear_attn, const double *a, double *x) {
    char name[256], name2[256];
    const int64_t H = w->H;
    const observation *first, *out;
    if (!linear_attn) {
        if (!(first = take(w, fmt(name, sizeof name, "%sself_attn.q_proj", p), T, H))) return false;
        if (!take_same(w, first, fmt(name, sizeof name, "%sself_attn.k_proj", p)) ||
            !take_same(w, first, fmt(name, sizeof name, "%sself_attn.v_proj", p)))
            return false;
        out = take(w, fmt(name, sizeof name, "%sself_attn.o_proj", p), T,
                   (int64_t)w->cfg->num_attention_heads * w->cfg->head_dim);
        fmt(name2, sizeof name2, "%sself_attn.o_proj.weight", p);
    } else {
        const bool grouped = cv_checkpoint_find(w->ck, fmt(name, sizeof name, "%slinear_attn.in_proj_qkvz.weight", p));
        static const char *const grouped_parts[] = {"in_proj_qkvz", "in_proj_ba"};
        static const char *const parts[] = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"};
        const char *const *names = grouped ? grouped_parts : parts;
        if (!(first = take(w, fmt(name, sizeof name, "%slinear_attn.%s", p, names[0]), T, H))) return false;
        for (int i = 1; i < (grouped ? 2 : 4); i++)
            if (!take_same(w, first, fmt(name, sizeof name, "%slinear_attn.%s", p, names[i]))) return false;
        out = take(w, fmt(name, sizeof name, "%slinear_attn.out_proj", p), T,
                   cfg_int(w, "linear_num_value_heads") * cfg_int(w, "linear_value_head_dim"));
        fmt(name2, sizeof name2, "%slinear_attn.out_proj.weight", p);
    }
    expect_rows(w, first, a);
    if (!out) return false;
    float *wo = weight(w, name2);
    matmul(out->x, T, out->cols, wo, H, true, x);
    free(wo);
    return true;
}

/* A SwiGLU at `p` ("...mlp." or "...mlp.shared_expert.") whose gate_proj sees the rows of `first`
 * (or, when first is NULL, opens the block and must see a); adds scale[t] (NULL: 1) times its output
 * to x. */
static bool walk_ffn(walk *w, const char *p, const observation *first, const double *a, const double *scale,
                     double *x) {
    char name[256];
    const int64_t H = w->H;
    const observation *gate = take(w, fmt(name, sizeof name, "%sgate_proj", p), T, H);
    if (!gate) return false;
    if (first) CHECK_MSG(!memcmp(gate->x, first->x, (size_t)(T * H) * sizeof(float)), "%s: %s sees other rows than %s",
                         w->folder, gate->name, first->name);
    else expect_rows(w, gate, a);
    if (!take_same(w, gate, fmt(name, sizeof name, "%sup_proj", p))) return false;
    float *wg = weight(w, fmt(name, sizeof name, "%sgate_proj.weight", p));
    float *wu = weight(w, fmt(name, sizeof name, "%sup_proj.weight", p));
    float *wd = weight(w, fmt(name, sizeof name, "%sdown_proj.weight", p));
    const int64_t I = tensor(w, name)->shape[1];
    const observation *down = take(w, fmt(name, sizeof name, "%sdown_proj", p), T, I);
    if (down) {
        expect_swiglu(w, down, gate->x, wg, wu);
        double *y = cv_xmalloc((size_t)(T * H) * sizeof *y);
        matmul(down->x, T, I, wd, H, false, y);
        for (int64_t i = 0; i < T * H; i++) x[i] += (scale ? scale[i / H] : 1.0) * y[i];
        free(y);
    }
    free(wg);
    free(wu);
    free(wd);
    return down != NULL;
}

/* Expert e's gate, up and down weights from per-expert tensors or the fused 3-D ones. */
static void expert_weights(const walk *w, const char *p, int64_t e, int64_t I, float **g, float **u, float **d) {
    char name[256];
    const size_t HI = (size_t)(w->H * I);
    if (cv_checkpoint_find(w->ck, fmt(name, sizeof name, "%sexperts.gate_up_proj", p))) {
        *g = weight_part(w, name, (size_t)e * 2 * HI, HI);
        *u = weight_part(w, name, (size_t)e * 2 * HI + HI, HI);
        *d = weight_part(w, fmt(name, sizeof name, "%sexperts.down_proj", p), (size_t)e * HI, HI);
        return;
    }
    *g = weight(w, fmt(name, sizeof name, "%sexperts.%lld.gate_proj.weight", p, (long long)e));
    *u = weight(w, fmt(name, sizeof name, "%sexperts.%lld.up_proj.weight", p, (long long)e));
    *d = weight(w, fmt(name, sizeof name, "%sexperts.%lld.down_proj.weight", p, (long long)e));
}

/* The routed experts' renormalisation, as each family's config says. */
static bool renormalizes(const walk *w) {
    json_t *v = json_object_get(w->cfg->text, "norm_topk_prob");
    if (!strncmp(w->cfg->architecture, "Qwen3_5", 7)) return true; /* no flag: always */
    if (!v || json_is_null(v)) return strcmp(w->cfg->architecture, "Qwen3MoeForCausalLM") != 0;
    return json_is_true(v);
}

/* The MoE at `p` ("...mlp."): router input a; adds the block's output to x. */
static bool walk_moe(walk *w, const char *p, const double *a, double *x) {
    char name[256];
    const int64_t H = w->H, E = cfg_int(w, "num_experts"), K = cfg_int(w, "num_experts_per_tok");
    const bool shared = cv_checkpoint_find(w->ck, fmt(name, sizeof name, "%sshared_expert_gate.weight", p));
    const observation *router = take(w, fmt(name, sizeof name, "%sgate", p), T, H);
    if (!router || (shared && !take_same(w, router, fmt(name, sizeof name, "%sshared_expert_gate", p)))) return false;
    expect_rows(w, router, a);
    /* Top-k of the softmax over the router logits, ties to the lower id. */
    float *wr = weight(w, fmt(name, sizeof name, "%sgate.weight", p));
    double *logits = cv_xmalloc((size_t)(T * E) * sizeof *logits), *route_w = cv_xcalloc((size_t)(T * E), sizeof *route_w);
    matmul(router->x, T, H, wr, E, false, logits);
    for (int64_t t = 0; t < T; t++) {
        const double *l = logits + t * E;
        double mx = l[0], sum = 0, picked = 0;
        for (int64_t e = 1; e < E; e++) mx = fmax(mx, l[e]);
        for (int64_t e = 0; e < E; e++) sum += exp(l[e] - mx);
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (route_w[t * E + e] == 0 && (best < 0 || l[e] > l[best])) best = e;
            route_w[t * E + best] = exp(l[best] - mx) / sum;
            picked += route_w[t * E + best];
        }
        if (renormalizes(w))
            for (int64_t e = 0; e < E; e++) route_w[t * E + e] /= picked;
    }
    bool ok = true;
    const int64_t I = cfg_int(w, "moe_intermediate_size");
    float *rows = cv_xmalloc((size_t)(T * H) * sizeof *rows);
    double *y = cv_xmalloc((size_t)(T * H) * sizeof *y);
    for (int64_t e = 0; e < E && ok; e++) {
        int64_t n = 0, tokens[T];
        for (int64_t t = 0; t < T; t++)
            if (route_w[t * E + e] != 0) {
                memcpy(rows + n * H, router->x + t * H, (size_t)H * sizeof *rows);
                tokens[n++] = t;
            }
        if (n == 0) continue; /* no token chose it: nothing to report */
        const observation *gate = take(w, fmt(name, sizeof name, "%sexperts.%lld.gate_proj", p, (long long)e), n, H);
        ok = gate != NULL;
        if (ok) {
            CHECK_MSG(!memcmp(gate->x, rows, (size_t)(n * H) * sizeof *rows),
                      "%s: %s does not see the rows of the tokens routed to it", w->folder, gate->name);
            ok = take_same(w, gate, fmt(name, sizeof name, "%sexperts.%lld.up_proj", p, (long long)e));
        }
        const observation *down =
            ok ? take(w, fmt(name, sizeof name, "%sexperts.%lld.down_proj", p, (long long)e), n, I) : NULL;
        ok = down != NULL;
        if (ok) {
            float *wg, *wu, *wd;
            expert_weights(w, p, e, I, &wg, &wu, &wd);
            expect_swiglu(w, down, rows, wg, wu);
            matmul(down->x, n, I, wd, H, false, y);
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < H; j++) x[tokens[i] * H + j] += route_w[tokens[i] * E + e] * y[i * H + j];
            free(wg);
            free(wu);
            free(wd);
        }
    }
    if (ok && shared) {
        float *wsg = weight(w, fmt(name, sizeof name, "%sshared_expert_gate.weight", p));
        double scale[T];
        matmul(router->x, T, H, wsg, 1, false, scale);
        for (int64_t t = 0; t < T; t++) scale[t] = 1.0 / (1.0 + exp(-scale[t]));
        ok = walk_ffn(w, fmt(name, sizeof name, "%sshared_expert.", p), router, NULL, scale, x);
        free(wsg);
    }
    free(rows);
    free(y);
    free(wr);
    free(logits);
    free(route_w);
    return ok;
}

/* One decoder layer at `p` ("model.layers.3.") on the stream x [T][H]. */
static bool walk_layer(walk *w, const char *p, bool linear_attn, double *x) {
    char name[256];
    const int64_t H = w->H;
    double *a = cv_xmalloc((size_t)(T * H) * sizeof *a);
    float *g = gain(w, fmt(name, sizeof name, "%sinput_layernorm.weight", p));
    rmsnorm(x, g, T, H, w->cfg->rms_norm_eps, a);
    free(g);
    bool ok = walk_mixer(w, p, linear_attn, a, x);
    if (ok) {
        g = gain(w, fmt(name, sizeof name, "%spost_attention_layernorm.weight", p));
        rmsnorm(x, g, T, H, w->cfg->rms_norm_eps, a);
        free(g);
        fmt(name, sizeof name, "%smlp.", p);
        char router[300];
        snprintf(router, sizeof router, "%sgate.weight", name);
        ok = cv_checkpoint_find(w->ck, router) ? walk_moe(w, name, a, x) : walk_ffn(w, name, NULL, a, NULL, x);
    }
    free(a);
    return ok;
}

/* lm_head sees the logit rows of the stream, normed with `norm`'s gain; then the recording ends. */
static void walk_lm_head(walk *w, const char *norm, const double *x) {
    const int64_t H = w->H;
    const observation *o = take(w, "lm_head", N_LOGITS, H);
    if (o) {
        double *rows = cv_xmalloc((size_t)(N_LOGITS * H) * sizeof *rows);
        for (int i = 0; i < N_LOGITS; i++) memcpy(rows + i * H, x + LOGIT_ROWS[i] * H, (size_t)H * sizeof *rows);
        float *g = gain(w, norm);
        rmsnorm(rows, g, N_LOGITS, H, w->cfg->rms_norm_eps, rows);
        free(g);
        expect_rows(w, o, rows);
        free(rows);
    }
    CHECK_MSG(w->at == w->end, "%s: %d more observations after lm_head, the first %s", w->folder, w->end - w->at,
              w->at < w->end ? w->r->v[w->at].name : "");
}

/* The text model's name prefix and whether layer l is linear attention, from config.json. */
static const char *text_root(const walk *w) {
    return strstr(w->cfg->architecture, "ForConditionalGeneration") ? "model.language_model." : "model.";
}

static bool linear_layer(const walk *w, int64_t l) {
    const char *t = json_string_value(json_array_get(json_object_get(w->cfg->text, "layer_types"), (size_t)l));
    return t && !strcmp(t, "linear_attention");
}

/* The whole forward pass over `ids`; returns the stream after the last layer in *x_out (caller frees). */
static void walk_forward(walk *w, const int32_t *ids, double **x_out) {
    char name[256];
    const char *root = text_root(w);
    const int64_t H = w->H;
    float *embed = weight(w, fmt(name, sizeof name, "%sembed_tokens.weight", root));
    double *x = cv_xmalloc((size_t)(T * H) * sizeof *x);
    for (int64_t i = 0; i < T * H; i++) x[i] = embed[(int64_t)ids[i / H] * H + i % H];
    free(embed);
    bool ok = true;
    for (int64_t l = 0; l < w->cfg->num_hidden_layers && ok; l++)
        ok = walk_layer(w, fmt(name, sizeof name, "%slayers.%lld.", root, (long long)l), linear_layer(w, l), x);
    if (ok) walk_lm_head(w, fmt(name, sizeof name, "%snorm.weight", root), x);
    *x_out = x;
}

/* mtp_forward: mtp.fc over [norm_e(embed(next)); norm_h(hidden)] with hidden the main model's
 * final-normed stream, then its layer and lm_head. */
static void walk_mtp(walk *w, const int32_t *next_ids, const double *main_x) {
    char name[256];
    const int64_t H = w->H;
    const observation *fc = take(w, "mtp.fc", T, 2 * H);
    if (!fc) return;
    float *embed = weight(w, fmt(name, sizeof name, "%sembed_tokens.weight", text_root(w)));
    float *ge = gain(w, "mtp.pre_fc_norm_embedding.weight"), *gh = gain(w, "mtp.pre_fc_norm_hidden.weight");
    float *gf = gain(w, fmt(name, sizeof name, "%snorm.weight", text_root(w)));
    double *e = cv_xmalloc((size_t)(T * H) * sizeof *e), *hid = cv_xmalloc((size_t)(T * H) * sizeof *hid);
    double *pair = cv_xmalloc((size_t)(2 * T * H) * sizeof *pair), *x = cv_xcalloc((size_t)(T * H), sizeof *x);
    for (int64_t i = 0; i < T * H; i++) e[i] = embed[(int64_t)next_ids[i / H] * H + i % H];
    rmsnorm(main_x, gf, T, H, w->cfg->rms_norm_eps, hid); /* the hidden states forward() handed out */
    rmsnorm(e, ge, T, H, w->cfg->rms_norm_eps, e);
    rmsnorm(hid, gh, T, H, w->cfg->rms_norm_eps, hid);
    for (int64_t t = 0; t < T; t++) {
        memcpy(pair + t * 2 * H, e + t * H, (size_t)H * sizeof *pair);
        memcpy(pair + t * 2 * H + H, hid + t * H, (size_t)H * sizeof *pair);
    }
    expect_rows(w, fc, pair);
    float *wfc = weight(w, "mtp.fc.weight");
    matmul(fc->x, T, 2 * H, wfc, H, false, x);
    if (walk_layer(w, "mtp.layers.0.", false, x)) walk_lm_head(w, "mtp.norm.weight", x);
    free(wfc);
    free(embed);
    free(ge);
    free(gh);
    free(gf);
    free(e);
    free(hid);
    free(pair);
    free(x);
}

/* ---- driving a model ------------------------------------------------------------------------ */

static int load(const char *dir, const cv_model_config *cfg, cv_weight_source *src, cv_threadpool *pool,
                recorder *r, cv_model **m) {
    cv_model_load_params p = {.config = cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 8,
                              .load_mtp = true, .observe = r ? record : NULL, .observe_ctx = r};
    int rc = cv_model_load(&p, m);
    CHECK_MSG(rc == 0, "loading %s: %s", dir, cv_error_message());
    return rc;
}

/* One forward of the first T prompt tokens (logits of LOGIT_ROWS, hidden states of every token),
 * then with an MTP module its step over the same positions; *after_forward: what r held between
 * the two (r NULL: not observed). */
static int run(cv_model *m, mf_cache *c, const int32_t *ids, const recorder *r, int *after_forward, float *logits,
               float *hidden) {
    mf_cache_reset_blocks(c, &m->kv_spec);
    mf_sequence s = {.tokens = ids, .n_total = T};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, c, &s, T);
    st.batch.n_logits = N_LOGITS;
    memcpy(st.logit_rows, LOGIT_ROWS, sizeof LOGIT_ROWS);
    st.batch.hidden_out = m->ops->mtp_forward ? hidden : NULL;
    int rc = m->ops->forward(m, &st.batch, &c->kv, c->state.num_slots ? &c->state : NULL, logits);
    CHECK_MSG(rc == 0, "forward: %s", cv_error_message());
    *after_forward = r ? r->n : 0;
    if (rc || !m->ops->mtp_forward) return rc;
    mf_sequence next = {.tokens = ids + 1, .n_total = T};
    mf_step_begin(&st);
    mf_step_add(&st, c, &next, T);
    st.batch.n_logits = N_LOGITS;
    memcpy(st.logit_rows, LOGIT_ROWS, sizeof LOGIT_ROWS);
    rc = m->ops->mtp_forward(m, &st.batch, hidden, &c->kv, logits + N_LOGITS * m->vocab_size);
    CHECK_MSG(rc == 0, "mtp_forward: %s", cv_error_message());
    return rc;
}

static void test_folder(const char *folder, cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    mf_reference ref = {0};
    if (mf_load_reference(dir, "long150", &ref) || ref.n_prompt < T + 1) {
        CHECK_MSG(0, "cannot read the long150 reference in %s", dir);
        mf_free_reference(&ref);
        return;
    }
    cv_model_config cfg;
    cv_weight_source *src;
    cv_checkpoint *ck;
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &src), 0);
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    recorder r = {0};
    cv_model *observed, *plain;
    if (load(dir, &cfg, src, pool, &r, &observed) == 0) {
        if (load(dir, &cfg, src, pool, NULL, &plain) == 0) {
            const size_t n_out = 2 * N_LOGITS * (size_t)observed->vocab_size;
            float *logits = cv_xcalloc(n_out, sizeof *logits), *again = cv_xcalloc(n_out, sizeof *again);
            float *hidden = cv_xmalloc((size_t)T * (size_t)cfg.hidden_size * sizeof *hidden);
            mf_cache c;
            mf_cache_init(&c, observed);
            CHECK_EQ_INT(r.n, 0); /* loading runs nothing */
            const bool hybrid = strstr(cfg.architecture, "Qwen3Next") || !strncmp(cfg.architecture, "Qwen3_5", 7);
            walk w = {.folder = folder, .ck = ck, .cfg = &cfg, .r = &r, .H = cfg.hidden_size, .zero_centred = hybrid};
            int after_forward, unused;
            if (run(observed, &c, ref.prompt, &r, &after_forward, logits, hidden) == 0) {
                double *x;
                w.end = after_forward;
                walk_forward(&w, ref.prompt, &x);
                if (observed->ops->mtp_forward) {
                    w.at = after_forward;
                    w.end = r.n;
                    walk_mtp(&w, ref.prompt + 1, x);
                }
                free(x);
                const int recorded = r.n;
                CHECK_EQ_INT(run(plain, &c, ref.prompt, NULL, &unused, again, hidden), 0);
                CHECK_EQ_INT(r.n, recorded); /* the plain model reports nothing */
                CHECK_MSG(!memcmp(logits, again, n_out * sizeof *logits),
                          "%s: observing changes the logits", folder);
                printf("%-18s %3d observations%s, rows vs the layer inputs: max rel error %.3g\n", folder, r.n,
                       observed->ops->mtp_forward ? " (MTP included)" : "", w.worst);
            }
            mf_cache_free(&c);
            free(logits);
            free(again);
            free(hidden);
            cv_model_free(plain);
        }
        cv_model_free(observed);
    }
    recorder_clear(&r);
    free(r.v);
    cv_checkpoint_close(ck);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
    mf_free_reference(&ref);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    for (size_t f = 0; f < CV_ARRAY_LEN(FOLDERS); f++) test_folder(FOLDERS[f], pool);
    cv_threadpool_free(pool);
    return cv_check_summary("test_model_observer");
}
