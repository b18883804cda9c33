/*
 * test_moe_ref.c — Qwen3MoeForCausalLM against Hugging Face's f32 logits, and the MoE kernels.
 *
 * Reference scenarios (model_fixture.h: one-shot, chunks of 1/5/64/100, batched mixed
 * prefill/decode on shuffled KV blocks, greedy with teacher-forced logits) on the f32 and bf16
 * checkpoints, on the AVX-512 and AVX2 paths.
 * Kernels: cv_moe_route against a direct softmax/sort, with and without renormalisation; cv_moe
 * (grouped, threaded) against a per-token loop over the chosen experts with a wider shared expert,
 * and with int8 experts of every arrangement the models bind (on the AVX-512 and AVX2 paths).
 * Failure paths: missing MoE config fields, a moe_intermediate_size that disagrees with the
 * checkpoint (names the tensor), top-k above the expert count, a dense layer requested through
 * mlp_only_layers (its tensors are missing), bad mlp_only_layers entries.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_fixture.h"

static const char *const FOLDERS[] = {"qwen3-moe-f32", "qwen3-moe-bf16"};
static const int32_t CHUNKS[] = {1, 5, 64, 100};

/* ---- kernels ---------------------------------------------------------------------------------- */

static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.5f;
    }
}

static void test_route(void) {
    enum { T = 5, E = 12, K = 4 };
    float logits[T * E];
    fill(logits, T * E, 3);
    logits[2 * E + 7] = logits[2 * E + 3]; /* a tie: the lower id wins */
    logits[2 * E + 3] = logits[2 * E + 7] = 5.0f;
    int32_t ids[T * K];
    float w[T * K], wn[T * K];
    cv_moe_route(logits, T, E, K, false, ids, w);
    int32_t ids_n[T * K];
    cv_moe_route(logits, T, E, K, true, ids_n, wn);
    for (int t = 0; t < T; t++) {
        const float *l = logits + t * E;
        double mx = -INFINITY, sum = 0, picked = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) sum += exp(l[e] - mx);
        for (int k = 0; k < K; k++) {
            int32_t id = ids[t * K + k];
            CHECK_EQ_INT(id, ids_n[t * K + k]);
            /* Exactly k experts beat or tie it with a lower id before it. */
            int above = 0;
            for (int e = 0; e < E; e++) above += l[e] > l[id] || (l[e] == l[id] && e < id);
            CHECK_EQ_INT(above, k);
            double p = exp(l[id] - mx) / sum;
            CHECK(fabs(w[t * K + k] - p) < 1e-6);
            picked += p;
        }
        for (int k = 0; k < K; k++)
            CHECK(fabs(wn[t * K + k] - exp(l[ids[t * K + k]] - mx) / sum / picked) < 1e-6);
    }
    CHECK_EQ_INT(ids[2 * K], 3);
    CHECK_EQ_INT(ids[2 * K + 1], 7);
}

/* cv_moe against the definition, token by token; experts 0..E-1 of width I, expert E (the
 * "shared" one) of width 2I, bf16 weights. */
static void test_grouped_experts(cv_threadpool *pool) {
    enum { T = 37, H = 64, I = 48, E = 6, R = 3 };
    uint16_t *wbuf = cv_xmalloc((size_t)(E + 1) * 3 * 2 * I * H * sizeof *wbuf);
    float *wf = cv_xmalloc((size_t)(E + 1) * 3 * 2 * I * H * sizeof *wf);
    fill(wf, (size_t)(E + 1) * 3 * 2 * I * H, 11);
    for (size_t i = 0; i < (size_t)(E + 1) * 3 * 2 * I * H; i++) {
        wbuf[i] = cv_f32_to_bf16(wf[i]);
        wf[i] = cv_bf16_to_f32(wbuf[i]);
    }
    cv_moe_expert ex[E + 1];
    cv_weight views[E + 1][3];
    for (int e = 0; e <= E; e++) {
        int64_t inter = e == E ? 2 * I : I;
        const uint16_t *base = wbuf + (size_t)e * 3 * 2 * I * H;
        views[e][0] = cv_weight_view(&(cv_matrix){base, CV_DTYPE_BF16, inter, H});
        views[e][1] = cv_weight_view(&(cv_matrix){base + 2 * I * H, CV_DTYPE_BF16, inter, H});
        views[e][2] = cv_weight_view(&(cv_matrix){base + 4 * I * H, CV_DTYPE_BF16, H, inter});
        ex[e] = (cv_moe_expert){.gate = &views[e][0], .up = &views[e][1], .down = &views[e][2], .inter = inter};
    }
    float x[T * H], y[T * H], want[T * H], weights[T * R];
    int32_t ids[T * R];
    fill(x, T * H, 5);
    fill(weights, T * R, 9);
    for (int t = 0; t < T; t++) {
        ids[t * R] = (t * 7) % E;
        ids[t * R + 1] = (t * 7 + 1 + t % 3) % E; /* distinct from the first */
        ids[t * R + 2] = E;
        if (t % 5 == 0) ids[t * R + 1] = ids[t * R], ids[t * R] = (ids[t * R] + 2) % E;
    }
    for (int t = 0; t < T * H; t++) y[t] = 1.0f; /* cv_moe accumulates */
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < H; j++) want[t * H + j] = 1.0f;
        for (int r = 0; r < R; r++) {
            int e = ids[t * R + r];
            int64_t inter = ex[e].inter;
            const float *wb = wf + (size_t)e * 3 * 2 * I * H;
            float h[2 * I];
            for (int64_t i = 0; i < inter; i++) {
                double g = 0, u = 0;
                for (int k = 0; k < H; k++) {
                    g += wb[i * H + k] * x[t * H + k];
                    u += wb[2 * I * H + i * H + k] * x[t * H + k];
                }
                h[i] = (float)(g / (1 + exp(-g)) * u);
            }
            for (int j = 0; j < H; j++) {
                double o = 0;
                for (int64_t i = 0; i < inter; i++) o += wb[4 * I * H + j * inter + i] * h[i];
                want[t * H + j] += weights[t * R + r] * (float)o;
            }
        }
    }
    void *ws = cv_aligned_alloc(cv_moe_workspace_bytes(pool, T, R, H, 2 * I, E + 1, false, false));
    cv_moe_args a = {.n_tokens = T, .hidden = H, .n_experts = E + 1, .experts = ex, .routes = R, .ids = ids,
                     .weights = weights, .x = x, .y = y, .workspace = ws};
    cv_moe(pool, &a);
    double worst = 0;
    for (int i = 0; i < T * H; i++) worst = fmax(worst, fabs(y[i] - want[i]));
    CHECK_MSG(worst < 1e-5, "grouped experts differ from the per-token definition by %.3g", worst);
    free(ws);
    free(wbuf);
    free(wf);
}

/* ---- quantized experts -------------------------------------------------------------------------- */

typedef struct q_expert {
    int64_t inter;
    cv_weight w[4];           /* gate (stacked with up when w[1] is unused), up, down */
    cv_moe_expert ex;
    /* projection j: int8 codes with per-row scales (and biases), or bf16 (f: its values for the
     * reference) */
    int8_t *codes[3];
    uint16_t *bf16[3];
    float *f[3], *scale[3];
    int32_t *bias[3];
} q_expert;

static int8_t ref_code(float v) {
    v = rintf(v);
    return (int8_t)(v < -128.0f ? -128.0f : v > 127.0f ? 127.0f : v);
}

/* msModelSlim's activation quantization of one row, spelled out as PyTorch computes it. */
static float ref_quantize(const cv_act_quant *q, const float *x, int64_t n, int8_t *codes) {
    float div = q->scale, offset = q->offset;
    if (q->dynamic) {
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
        div = amax / 127.0f, offset = 0.0f;
    }
    for (int64_t i = 0; i < n; i++) codes[i] = q->dynamic && div == 0.0f ? 0 : ref_code(x[i] / div + offset);
    return q->dynamic ? div : 1.0f;
}

/* out[r] for rows [0, rows) of projection j of x (k columns): int8 codes with the epilogue's order,
 * or a float dot product in double. */
static void ref_project(const q_expert *e, int j, const cv_act_quant *q, const float *x, int64_t rows, int64_t k,
                        float *out) {
    if (!e->codes[j]) {
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0;
            for (int64_t c = 0; c < k; c++) acc += (double)e->f[j][r * k + c] * x[c];
            out[r] = (float)acc;
        }
        return;
    }
    int8_t xq[256];
    const float xs = ref_quantize(q, x, k, xq);
    for (int64_t r = 0; r < rows; r++) {
        int32_t acc = e->bias[j] ? e->bias[j][r] : 0;
        for (int64_t c = 0; c < k; c++) acc += (int32_t)xq[c] * e->codes[j][r * k + c];
        out[r] = (float)acc * e->scale[j][r] * xs;
    }
}

/* Projection j of e as int8 codes with row scales (and biases when static) or, int8 NULL, bf16. */
static void make_projection(q_expert *e, int j, int64_t rows, int64_t cols, bool int8, bool bias, uint32_t seed) {
    const size_t n = (size_t)(rows * cols);
    e->f[j] = cv_xmalloc(n * sizeof(float));
    fill(e->f[j], n, seed);
    if (!int8) {
        uint16_t *b = e->bf16[j] = cv_xmalloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) e->f[j][i] = cv_bf16_to_f32(b[i] = cv_f32_to_bf16(e->f[j][i]));
        return;
    }
    e->codes[j] = cv_xmalloc(n);
    for (size_t i = 0; i < n; i++) e->codes[j][i] = (int8_t)lrintf(e->f[j][i] * 500.0f); /* |f| ≤ 0.25 */
    e->scale[j] = cv_xmalloc((size_t)rows * sizeof(float));
    fill(e->scale[j], (size_t)rows, seed + 1);
    /* dynamic: the weight's scale; static: deq_scale, the input's scale (~0.004) times the weight's */
    const float unit = bias ? 2e-5f : 0.01f;
    for (int64_t r = 0; r < rows; r++) e->scale[j][r] = unit * (0.4f + fabsf(e->scale[j][r]));
    if (bias) {
        e->bias[j] = cv_xmalloc((size_t)rows * sizeof(int32_t));
        for (int64_t r = 0; r < rows; r++) e->bias[j][r] = (int32_t)(r * 37 % 401) - 200;
    }
}

static cv_weight_part part_of(const q_expert *e, int j, int64_t rows, int64_t cols) {
    return (cv_weight_part){.dtype = CV_DTYPE_I8, .rows = rows, .cols = cols, .data = e->codes[j],
                            .row_scale = e->scale[j], .row_bias = e->bias[j]};
}

/*
 * Builds expert e: gate/up [inter][H] and down [H][inter], each int8 or bf16; int8 gate|up stacked
 * into one packed weight when `stack`, else packed apart with their own quantizations.
 */
static void make_expert(cv_threadpool *pool, q_expert *e, int64_t inter, int64_t H, bool int8_gu, bool stack,
                        bool int8_down, const cv_act_quant *gq, const cv_act_quant *uq, const cv_act_quant *dq,
                        uint32_t seed) {
    *e = (q_expert){.inter = inter};
    const bool static_q = int8_gu && !gq->dynamic;
    make_projection(e, 0, inter, H, int8_gu, static_q, seed);
    make_projection(e, 1, inter, H, int8_gu, static_q, seed + 7);
    make_projection(e, 2, H, inter, int8_down, int8_down && !dq->dynamic, seed + 13);
    for (int j = 0; j < 3; j++) {
        const int64_t rows = j == 2 ? H : inter, cols = j == 2 ? inter : H;
        const bool int8 = j == 2 ? int8_down : int8_gu;
        if (!int8) e->w[j] = cv_weight_view(&(cv_matrix){e->bf16[j], CV_DTYPE_BF16, rows, cols});
    }
    if (int8_gu && stack) {
        const cv_weight_part parts[2] = {part_of(e, 0, inter, H), part_of(e, 1, inter, H)};
        CHECK_EQ_INT(cv_weight_pack(pool, parts, 2, &e->w[0]), 0);
    } else if (int8_gu) {
        const cv_weight_part gate = part_of(e, 0, inter, H), up = part_of(e, 1, inter, H);
        CHECK_EQ_INT(cv_weight_pack(pool, &gate, 1, &e->w[0]), 0);
        CHECK_EQ_INT(cv_weight_pack(pool, &up, 1, &e->w[1]), 0);
    }
    const cv_weight_part down = part_of(e, 2, H, inter);
    if (int8_down) CHECK_EQ_INT(cv_weight_pack(pool, &down, 1, &e->w[2]), 0);
    const bool stacked = int8_gu && stack;
    e->ex = (cv_moe_expert){.gate = &e->w[0], .up = stacked ? &e->w[0] : &e->w[1], .down = &e->w[2], .inter = inter,
                            .up_row = stacked ? inter : 0, .gate_quant = *gq, .up_quant = *uq, .down_quant = *dq};
}

static void free_expert(q_expert *e) {
    for (int j = 0; j < 4; j++) cv_weight_release(&e->w[j]);
    for (int j = 0; j < 3; j++) {
        free(e->codes[j]);
        free(e->bf16[j]);
        free(e->f[j]);
        free(e->scale[j]);
        free(e->bias[j]);
    }
}

/* cv_moe with int8 experts (stacked and apart, dynamic and static with biases, static gate and up
 * quantized differently, an int8 gate|up before a bf16 down) next to a bf16 one, against the
 * definition token by token: x quantized per expert, int32 products, SwiGLU, the SwiGLU rows
 * quantized per token before down. */
static void test_grouped_int8_experts(cv_threadpool *pool) {
    enum { T = 29, H = 64, E = 5, R = 3 };
    const cv_act_quant dyn = {.dynamic = true}, st_a = {.scale = 0.004f, .offset = 3.0f},
                       st_b = {.scale = 0.0025f, .offset = -5.0f}, st_h = {.scale = 0.002f, .offset = 1.0f};
    q_expert qe[E];
    make_expert(pool, &qe[0], 48, H, true, true, true, &dyn, &dyn, &dyn, 101);
    make_expert(pool, &qe[1], 48, H, true, true, true, &st_a, &st_a, &st_h, 202);
    make_expert(pool, &qe[2], 40, H, true, false, true, &st_a, &st_b, &dyn, 303);
    make_expert(pool, &qe[3], 32, H, false, false, false, &dyn, &dyn, &dyn, 404);
    make_expert(pool, &qe[4], 48, H, true, true, false, &dyn, &dyn, &dyn, 505);
    cv_moe_expert ex[E];
    for (int e = 0; e < E; e++) ex[e] = qe[e].ex;
    float x[T * H], y[T * H], want[T * H], weights[T * R];
    int32_t ids[T * R];
    fill(x, T * H, 17);
    fill(weights, T * R, 19);
    for (int t = 0; t < T; t++) {
        for (int r = 0; r < R; r++) ids[t * R + r] = (t * 3 + r * (1 + t % 2)) % E; /* distinct: steps 1 or 2 of 5 */
        for (int j = 0; j < H; j++) y[t * H + j] = want[t * H + j] = 0.5f;
    }
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) /* experts in id order, as the kernel accumulates */
            for (int r = 0; r < R; r++) {
                if (ids[t * R + r] != e) continue;
                const q_expert *q = &qe[e];
                float g[64], u[64], h[64], o[H];
                ref_project(q, 0, &q->ex.gate_quant, x + t * H, q->inter, H, g);
                ref_project(q, 1, &q->ex.up_quant, x + t * H, q->inter, H, u);
                cv_silu_mul(h, g, u, q->inter);
                ref_project(q, 2, &q->ex.down_quant, h, H, q->inter, o);
                for (int j = 0; j < H; j++) want[t * H + j] += weights[t * R + r] * o[j];
            }
    void *ws = cv_aligned_alloc(cv_moe_workspace_bytes(pool, T, R, H, 48, E, true, false));
    cv_moe_args a = {.n_tokens = T, .hidden = H, .n_experts = E, .experts = ex, .routes = R, .ids = ids,
                     .weights = weights, .x = x, .y = y, .workspace = ws};
    cv_moe(pool, &a);
    double worst = 0;
    for (int i = 0; i < T * H; i++) worst = fmax(worst, fabs(y[i] - want[i]));
    /* int8 products are exact; the bf16 ones differ from double by rounding only. */
    CHECK_MSG(worst < 1e-5, "[%s] int8 grouped experts differ from the definition by %.3g", cv_isa_name(cv_isa_active()),
              worst);
    double mean = 0;
    for (int i = 0; i < T * H; i++) mean += fabs(y[i] - 0.5f) / (T * H);
    CHECK_MSG(mean > 1e-3 && mean < 10, "int8 grouped experts: mean |contribution| %.3g", mean); /* not all clamped */
    free(ws);
    for (int e = 0; e < E; e++) free_expert(&qe[e]);
}

/* ---- failure paths ---------------------------------------------------------------------------- */

static void no_experts(json_t *r) { json_object_del(r, "num_experts"); }
static void narrow_experts(json_t *r) { json_object_set_new(r, "moe_intermediate_size", json_integer(40)); }
static void too_many_routes(json_t *r) { json_object_set_new(r, "num_experts_per_tok", json_integer(9)); }
static void negative_top_k(json_t *r) { json_object_set_new(r, "num_experts_per_tok", json_integer(-2)); }
static void dense_layer(json_t *r) { json_object_set_new(r, "mlp_only_layers", json_pack("[i]", 1)); }
static void dense_by_step(json_t *r) { json_object_set_new(r, "decoder_sparse_step", json_integer(2)); }
static void bad_layer_list(json_t *r) { json_object_set_new(r, "mlp_only_layers", json_pack("[i]", 2)); }
static void string_norm_flag(json_t *r) { json_object_set_new(r, "norm_topk_prob", json_string("yes")); }
static void unchanged(json_t *r) { (void)r; }

static void test_load_errors(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-moe-bf16", CVLLM_TEST_DATA);
    CHECK_CONTAINS(cv_model_supported_architectures(), "Qwen3MoeForCausalLM");
    CHECK_EQ_INT(mf_load_edited(dir, unchanged, pool), 0);
    CHECK_EQ_INT(mf_load_edited(dir, no_experts, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "missing required field \"num_experts\"");
    CHECK_EQ_INT(mf_load_edited(dir, narrow_experts, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "model.layers.0.mlp.experts.0.gate_proj.weight");
    CHECK_CONTAINS(cv_error_message(), "moe_intermediate_size");
    CHECK_EQ_INT(mf_load_edited(dir, too_many_routes, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "num_experts_per_tok=9 exceeds num_experts=8");
    CHECK_EQ_INT(mf_load_edited(dir, negative_top_k, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "\"num_experts_per_tok\" must be a positive integer");
    CHECK_EQ_INT(mf_load_edited(dir, dense_layer, pool), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "model.layers.1.mlp.gate_proj.weight");
    CHECK_EQ_INT(mf_load_edited(dir, dense_by_step, pool), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "model.layers.0.mlp.gate_proj.weight");
    CHECK_EQ_INT(mf_load_edited(dir, bad_layer_list, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "\"mlp_only_layers\" entry 0 is not a layer index in [0, 2)");
    CHECK_EQ_INT(mf_load_edited(dir, string_norm_flag, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "\"norm_topk_prob\" must be true or false");
}

/* Dummy weights: the per-token weight bytes count only top_k of the experts. */
static void test_dummy_weights(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-moe-f32", CVLLM_TEST_DATA);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_BF16, 3, &src), 0);
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 0};
    CHECK_EQ_INT(cv_model_load(&p, &m), 0);
    const size_t H = 64, hd = 32, I = 48, E = 8, K = 2, V = 4096;
    size_t layer = (4 * hd * H + 2 * 2 * hd * H + H * 4 * hd + E * H + K * 3 * I * H) * 2;
    CHECK_EQ_INT(m->weight_bytes, 2 * layer + V * H * 2);
    CHECK_EQ_INT(m->state_bytes_per_seq, 0);
    mf_cache c;
    mf_cache_init(&c, m);
    static const int32_t ids[] = {1, 2, 3};
    mf_sequence s = {.tokens = ids, .n_total = 3};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &s, 3);
    mf_expect_finite(m, &c, &st);
    mf_cache_free(&c);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    test_route();
    test_grouped_experts(pool);
    test_grouped_experts(NULL);
    test_grouped_int8_experts(pool);
    test_grouped_int8_experts(NULL);
    const cv_isa isa = cv_isa_active();
    if (isa != CV_ISA_AVX2 && cv_isa_force(CV_ISA_AVX2) == 0) {
        test_grouped_int8_experts(pool);
        cv_isa_force(isa);
    }
    test_load_errors(pool);
    test_dummy_weights(pool);
    mf_test_folders_on_each_isa("test_moe_ref", FOLDERS, (int)CV_ARRAY_LEN(FOLDERS), pool, CHUNKS,
                                (int)CV_ARRAY_LEN(CHUNKS));
    cv_threadpool_free(pool);
    return cv_check_summary("test_moe_ref");
}
