/*
 * test_moe_ref.c — Qwen3MoeForCausalLM against Hugging Face's f32 logits, and the MoE kernels.
 *
 * Reference scenarios (model_fixture.h: one-shot, chunks of 1/5/64/100, batched mixed
 * prefill/decode on shuffled KV blocks, greedy with teacher-forced logits) on the f32 and bf16
 * checkpoints, on the AVX-512 and AVX2 paths.
 * Kernels: cv_moe_route against a direct softmax/sort, with and without renormalisation; cv_moe
 * (grouped, threaded) against a per-token loop over the chosen experts with a wider shared expert.
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
    void *ws = cv_aligned_alloc(cv_moe_workspace_bytes(pool, T, R, H, 2 * I, E + 1, false));
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

/* ---- failure paths ---------------------------------------------------------------------------- */

static int load_with(const char *dir, void (*edit)(json_t *root), cv_threadpool *pool) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return -1000;
    edit(root);
    char *text = json_dumps(root, 0);
    json_decref(root);
    cv_model_config cfg;
    int rc = cv_model_config_parse(text, strlen(text), "config.json", &cfg);
    free(text);
    if (rc) return rc;
    cv_weight_source *src;
    rc = cv_weight_source_checkpoint(dir, &src);
    if (rc) {
        cv_model_config_free(&cfg);
        return rc;
    }
    cv_model *m = (cv_model *)&cfg; /* must come back NULL on failure */
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 8};
    rc = cv_model_load(&p, &m);
    if (rc) CHECK(m == NULL);
    else cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
    return rc;
}

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
    CHECK_EQ_INT(load_with(dir, unchanged, pool), 0);
    CHECK_EQ_INT(load_with(dir, no_experts, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "missing required field \"num_experts\"");
    CHECK_EQ_INT(load_with(dir, narrow_experts, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "model.layers.0.mlp.experts.0.gate_proj.weight");
    CHECK_CONTAINS(cv_error_message(), "moe_intermediate_size");
    CHECK_EQ_INT(load_with(dir, too_many_routes, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "num_experts_per_tok=9 exceeds num_experts=8");
    CHECK_EQ_INT(load_with(dir, negative_top_k, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "\"num_experts_per_tok\" must be a positive integer");
    CHECK_EQ_INT(load_with(dir, dense_layer, pool), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "model.layers.1.mlp.gate_proj.weight");
    CHECK_EQ_INT(load_with(dir, dense_by_step, pool), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "model.layers.0.mlp.gate_proj.weight");
    CHECK_EQ_INT(load_with(dir, bad_layer_list, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "\"mlp_only_layers\" entry 0 is not a layer index in [0, 2)");
    CHECK_EQ_INT(load_with(dir, string_norm_flag, pool), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "\"norm_topk_prob\" must be true or false");
}

/* Dummy weights: the per-token weight bytes count only top_k of the experts. */
static void test_dummy_weights(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-moe-f32", CVLLM_TEST_DATA);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    CHECK_EQ_INT(cv_model_config_load(dir, &cfg), 0);
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
    float *logits = cv_xmalloc(3 * V * sizeof(float));
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, NULL, logits), 0);
    int finite = 0;
    for (size_t i = 0; i < 3 * V; i++) finite += isfinite(logits[i]) != 0;
    CHECK_EQ_INT(finite, 3 * V);
    free(logits);
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
    test_load_errors(pool);
    test_dummy_weights(pool);
    mf_test_folders_on_each_isa("test_moe_ref", FOLDERS, (int)CV_ARRAY_LEN(FOLDERS), pool, CHUNKS,
                                (int)CV_ARRAY_LEN(CHUNKS));
    cv_threadpool_free(pool);
    return cv_check_summary("test_moe_ref");
}
