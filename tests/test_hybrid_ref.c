/*
 * test_hybrid_ref.c — Qwen3NextForCausalLM, Qwen3_5MoeForConditionalGeneration and Qwen3.5 dense
 * (Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM) against Hugging Face's f32 logits, and the
 * Gated DeltaNet kernels.
 *
 * Reference scenarios (model_fixture.h: one-shot, chunks of 1/5/64/100 — 64 and 100 leave the
 * delta rule's 64-token chunks misaligned with the prompt's and start them from non-zero state —
 * batched mixed prefill/decode with separate state slots, greedy with teacher-forced logits, and a
 * byte copy of a state slot mid-prompt) on the f32 and bf16 checkpoints of the three families, on
 * the AVX-512 and AVX2 paths (the bf16 ones packed on the first load, mapped from the
 * packed-weight cache on the second). The Qwen3.5 checkpoints also carry mtp.* and model.visual.*
 * tensors, which must simply be ignored. Qwen3_5ForCausalLM: the dense checkpoint under a flat
 * text config and/or the text-only tensor names ("model." instead of "model.language_model.")
 * gives exactly the wrapper's logits, and a missing tensor is named as that checkpoint spells it.
 * Kernels: the chunked delta rule against the recurrence run token by token in double precision,
 * over runs that end mid-chunk and span several chunks from a random state; the conv state across
 * calls of 1, 2 and 5 tokens against one call.
 * Failure paths: missing/ill-typed linear-attention fields, layer_types of the wrong length or
 * spelling, value heads not a multiple of key heads, shape mismatches naming the tensor, a missing
 * GDN tensor, attn_output_gate=false, a missing or wrong MLP width (shared expert; dense
 * intermediate_size), and batches without state slots, with shared, out-of-range
 * or too-small slots; state checkpoints naming a missing sequence, unsorted, outside the batch's
 * tokens, into an out-of-range, running or doubly written slot, or asked of a stateless model.
 * (The checkpoint scenarios themselves, prefill and verify, run in model_fixture.h.)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_edit.h"
#include "model_fixture.h"

static const char *const FOLDERS[] = {"qwen3-next-f32",   "qwen3-next-bf16",   "qwen3.5-moe-f32",
                                       "qwen3.5-moe-bf16", "qwen3.5-dense-f32", "qwen3.5-dense-bf16"};
static const int32_t CHUNKS[] = {1, 5, 64, 100};

static void fill(float *x, size_t n, uint32_t seed, float scale) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * scale;
    }
}

/* ---- kernels ---------------------------------------------------------------------------------- */

enum { NK = 2, NV = 4, DK = 16, DV = 24, LD = 2 * NK * DK + NV * DV };

/* The recurrence of kernels.h, in double, for one sequence from state s [NV][DK][DV]. */
static void reference_delta_rule(const float *qkv, const float *g, const float *beta, int n, double *s, double *out) {
    for (int t = 0; t < n; t++)
        for (int j = 0; j < NV; j++) {
            const float *q = qkv + t * LD + (j / (NV / NK)) * DK, *k = q + NK * DK, *v = qkv + t * LD + 2 * NK * DK + j * DV;
            double *S = s + j * DK * DV, decay = exp(g[t * NV + j]), u[DV];
            for (int c = 0; c < DV; c++) {
                u[c] = 0;
                for (int r = 0; r < DK; r++) u[c] += decay * S[r * DV + c] * k[r];
            }
            for (int r = 0; r < DK; r++)
                for (int c = 0; c < DV; c++) S[r * DV + c] = decay * S[r * DV + c] + k[r] * beta[t * NV + j] * (v[c] - u[c]);
            for (int c = 0; c < DV; c++) {
                double o = 0;
                for (int r = 0; r < DK; r++) o += S[r * DV + c] * q[r];
                out[t * NV * DV + j * DV + c] = o;
            }
        }
}

/* Two sequences in one call: a 150-token run (three chunks, the last partial) and a single token,
 * both from a random state; then the long one continued by a 1-token and a 70-token call. */
static void test_delta_rule(cv_threadpool *pool) {
    enum { N0 = 150, N1 = 1, N2 = 71, T = N0 + N1 + N2 };
    float *qkv = cv_xmalloc((size_t)T * LD * sizeof(float)), g[T * NV], beta[T * NV];
    fill(qkv, (size_t)T * LD, 1, 2.0f);
    fill(g, T * NV, 2, 1.0f);
    fill(beta, T * NV, 3, 1.0f);
    for (int i = 0; i < T * NV; i++) {
        g[i] = -fabsf(g[i]) * (i % 7 == 0 ? 12.0f : 0.3f); /* now and then a near-total decay */
        beta[i] += 0.5f;
    }
    for (int t = 0; t < T; t++) {
        cv_l2norm(qkv + t * LD, NK, DK, 1e-6f, 1.0f / sqrtf(DK));
        cv_l2norm(qkv + t * LD + NK * DK, NK, DK, 1e-6f, 1.0f);
    }
    const size_t sfloats = (size_t)NV * DK * DV;
    float *state0 = cv_aligned_alloc(sfloats * sizeof(float)), *state1 = cv_aligned_alloc(sfloats * sizeof(float));
    fill(state0, sfloats, 4, 0.2f);
    fill(state1, sfloats, 5, 0.2f);
    double *ref0 = cv_xmalloc(sfloats * sizeof(double)), *ref1 = cv_xmalloc(sfloats * sizeof(double));
    for (size_t i = 0; i < sfloats; i++) ref0[i] = state0[i], ref1[i] = state1[i];
    double *want = cv_xmalloc((size_t)T * NV * DV * sizeof(double));
    float *out = cv_xmalloc((size_t)T * NV * DV * sizeof(float));
    /* Reference: sequence 0 runs tokens [0,N0) then [N0+N1, T); sequence 1 the token N0. */
    reference_delta_rule(qkv, g, beta, N0, ref0, want);
    reference_delta_rule(qkv + N0 * LD, g + N0 * NV, beta + N0 * NV, N1, ref1, want + N0 * NV * DV);
    reference_delta_rule(qkv + (N0 + N1) * LD, g + (N0 + N1) * NV, beta + (N0 + N1) * NV, N2, ref0,
                         want + (N0 + N1) * NV * DV);

    void *ws = cv_aligned_alloc(cv_gdn_workspace_bytes(pool, DK, DV));
    float *states[2] = {state0, state1};
    int32_t starts1[3] = {0, N0, N0 + N1};
    cv_gdn_args a = {.n_seqs = 2, .seq_start = starts1, .states = states, .n_k_heads = NK, .n_v_heads = NV,
                     .k_dim = DK, .v_dim = DV, .q = qkv, .k = qkv + NK * DK, .v = qkv + 2 * NK * DK, .ld = LD,
                     .g = g, .beta = beta, .out = out, .workspace = ws};
    cv_gdn(pool, &a);
    /* Continue sequence 0: one token (recurrent form), then 70 (chunked from a non-zero state). */
    int32_t starts2[2] = {0, 1}, starts3[2] = {0, N2 - 1};
    const int64_t base = N0 + N1;
    a = (cv_gdn_args){.n_seqs = 1, .seq_start = starts2, .states = states, .n_k_heads = NK, .n_v_heads = NV,
                      .k_dim = DK, .v_dim = DV, .q = qkv + base * LD, .k = qkv + base * LD + NK * DK,
                      .v = qkv + base * LD + 2 * NK * DK, .ld = LD, .g = g + base * NV, .beta = beta + base * NV,
                      .out = out + base * NV * DV, .workspace = ws};
    cv_gdn(pool, &a);
    a.seq_start = starts3;
    a.q += LD, a.k += LD, a.v += LD, a.g += NV, a.beta += NV, a.out += NV * DV;
    cv_gdn(pool, &a);
    double worst = 0, worst_state = 0;
    for (int i = 0; i < T * NV * DV; i++) worst = fmax(worst, fabs(out[i] - want[i]) / (1 + fabs(want[i])));
    for (size_t i = 0; i < sfloats; i++) {
        worst_state = fmax(worst_state, fabs(state0[i] - ref0[i]));
        worst_state = fmax(worst_state, fabs(state1[i] - ref1[i]));
    }
    CHECK_MSG(worst < 2e-5, "delta rule outputs differ from the recurrence by %.3g", worst);
    CHECK_MSG(worst_state < 2e-5, "delta rule states differ from the recurrence by %.3g", worst_state);
    free(ws);
    free(qkv);
    free(state0);
    free(state1);
    free(ref0);
    free(ref1);
    free(want);
    free(out);
}

static void test_conv_state(void) {
    enum { C = 10, K = 4, N = 8 };
    float x[N * C], w[K * C], one[N * C], pieces[N * C], state_a[(K - 1) * C], state_b[(K - 1) * C];
    fill(x, N * C, 6, 2.0f);
    fill(w, K * C, 7, 2.0f);
    fill(state_a, (K - 1) * C, 8, 2.0f);
    memcpy(state_b, state_a, sizeof state_a);
    cv_conv1d_silu(one, x, C, N, C, w, K, state_a);
    static const int split[] = {1, 2, 5};
    for (int i = 0, at = 0; i < 3; at += split[i++]) cv_conv1d_silu(pieces + at * C, x + at * C, C, split[i], C, w, K, state_b);
    CHECK(memcmp(one, pieces, sizeof one) == 0);
    CHECK(memcmp(state_a, state_b, sizeof state_a) == 0);
    CHECK(memcmp(state_a, x + (N - K + 1) * C, sizeof state_a) == 0);
    /* Token 0 from the state: tap j multiplies state row j, tap K-1 the token. */
    float acc = w[(K - 1) * C + 3] * x[3];
    fill(state_a, (K - 1) * C, 8, 2.0f);
    for (int j = 0; j < K - 1; j++) acc += w[j * C + 3] * state_a[j * C + 3];
    CHECK(fabsf(one[3] - acc / (1.0f + expf(-acc))) < 1e-6f);
}

/* ---- failure paths ---------------------------------------------------------------------------- */

static void unchanged(json_t *t) { (void)t; }
static void no_key_heads(json_t *t) { json_object_del(t, "linear_num_key_heads"); }
static void string_value_dim(json_t *t) { json_object_set_new(t, "linear_value_head_dim", json_string("32")); }
static void odd_value_heads(json_t *t) { json_object_set_new(t, "linear_num_value_heads", json_integer(3)); }
static void wide_key_heads(json_t *t) { json_object_set_new(t, "linear_key_head_dim", json_integer(16)); }
static void short_layer_types(json_t *t) { json_array_remove(json_object_get(t, "layer_types"), 0); }
static void misspelt_layer_type(json_t *t) {
    json_array_set_new(json_object_get(t, "layer_types"), 1, json_string("linear"));
}
/* Without layer_types, interval 2 makes layer 1 full attention; the checkpoint has GDN there. */
static void interval_two(json_t *t) {
    json_object_del(t, "layer_types");
    json_object_set_new(t, "full_attention_interval", json_integer(2));
}
static void ungated(json_t *t) { json_object_set_new(t, "attn_output_gate", json_false()); }
static void no_shared_width(json_t *t) { json_object_del(t, "shared_expert_intermediate_size"); }
static void no_dense_width(json_t *t) { json_object_del(t, "intermediate_size"); }
static void narrow_dense_width(json_t *t) { json_object_set_new(t, "intermediate_size", json_integer(96)); }
static void wide_kernel(json_t *t) { json_object_set_new(t, "linear_conv_kernel_dim", json_integer(3)); }

static void test_load_errors(cv_threadpool *pool) {
    CHECK_CONTAINS(cv_model_supported_architectures(), "Qwen3NextForCausalLM");
    CHECK_CONTAINS(cv_model_supported_architectures(), "Qwen3_5MoeForConditionalGeneration");
    CHECK_CONTAINS(cv_model_supported_architectures(), "Qwen3_5ForConditionalGeneration");
    static const char *const folders[] = {"qwen3-next-bf16", "qwen3.5-moe-bf16", "qwen3.5-dense-bf16"};
    for (int f = 0; f < 3; f++) {
        const char *folder = folders[f];
        const char *root = f ? "model.language_model." : "model.";
        const bool dense = f == 2;
        char dir[512], want[160];
        snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
        CHECK_EQ_INT(mf_load_edited(dir, unchanged, pool), 0);
        CHECK_EQ_INT(mf_load_edited(dir, no_key_heads, pool), CVLLM_ERR_FORMAT);
        CHECK_CONTAINS(cv_error_message(), "missing required field \"linear_num_key_heads\"");
        CHECK_EQ_INT(mf_load_edited(dir, string_value_dim, pool), CVLLM_ERR_FORMAT);
        CHECK_CONTAINS(cv_error_message(), "\"linear_value_head_dim\" must be a positive integer");
        CHECK_EQ_INT(mf_load_edited(dir, odd_value_heads, pool), CVLLM_ERR_FORMAT);
        CHECK_CONTAINS(cv_error_message(), "linear_num_value_heads=3 is not a multiple of linear_num_key_heads=2");
        CHECK_EQ_INT(mf_load_edited(dir, wide_key_heads, pool), CVLLM_ERR_FORMAT);
        snprintf(want, sizeof want, "%slayers.0.linear_attn.in_proj_qkv", root);
        CHECK_CONTAINS(cv_error_message(), want);
        CHECK_EQ_INT(mf_load_edited(dir, short_layer_types, pool), CVLLM_ERR_FORMAT);
        CHECK_CONTAINS(cv_error_message(), "layer_types must list one type for each of the 4 layers");
        CHECK_EQ_INT(mf_load_edited(dir, misspelt_layer_type, pool), CVLLM_ERR_FORMAT);
        CHECK_CONTAINS(cv_error_message(), "layer_types[1] must be");
        CHECK_EQ_INT(mf_load_edited(dir, interval_two, pool), CVLLM_ERR_NOT_FOUND);
        snprintf(want, sizeof want, "missing tensor %slayers.1.self_attn.q_proj.weight", root);
        CHECK_CONTAINS(cv_error_message(), want);
        CHECK_EQ_INT(mf_load_edited(dir, ungated, pool), CVLLM_ERR_UNSUPPORTED);
        CHECK_CONTAINS(cv_error_message(), "attn_output_gate=false");
        if (dense) {
            CHECK_EQ_INT(mf_load_edited(dir, no_dense_width, pool), CVLLM_ERR_FORMAT);
            CHECK_CONTAINS(cv_error_message(), "missing required field \"intermediate_size\" for "
                                               "Qwen3_5ForConditionalGeneration");
            CHECK_EQ_INT(mf_load_edited(dir, narrow_dense_width, pool), CVLLM_ERR_FORMAT);
            snprintf(want, sizeof want, "%slayers.0.mlp.gate_proj.weight", root);
            CHECK_CONTAINS(cv_error_message(), want);
        } else {
            CHECK_EQ_INT(mf_load_edited(dir, no_shared_width, pool), CVLLM_ERR_FORMAT);
            CHECK_CONTAINS(cv_error_message(), "shared_expert_intermediate_size");
        }
        CHECK_EQ_INT(mf_load_edited(dir, wide_kernel, pool), CVLLM_ERR_FORMAT);
        snprintf(want, sizeof want, "%slayers.0.linear_attn.conv1d.weight", root);
        CHECK_CONTAINS(cv_error_message(), want);
    }
}

static void test_bad_state(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3.5-moe-f32", CVLLM_TEST_DATA);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    if (mf_load_model(dir, &cfg, &src, pool, &m)) {
        CHECK_MSG(0, "loading %s: %s", dir, cv_error_message());
        return;
    }
    /* 3 GDN layers × (conv state 3×256 + 4 heads × 32×32) floats; 1 attention layer in the KV cache. */
    CHECK_EQ_INT(m->state_bytes_per_seq, 3 * (3 * 256 + 4 * 32 * 32) * 4);
    CHECK_EQ_INT(m->kv_spec.num_layers, 1);
    CHECK(m->state_checkpoints);
    mf_cache c;
    mf_cache_init(&c, m);
    static const int32_t ids[] = {1, 2, 3, 4};
    mf_sequence a = {.tokens = ids, .n_total = 2, .state_slot = 1}, b = {.tokens = ids + 2, .n_total = 2, .state_slot = 1};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &a, 2);
    mf_step_add(&st, &c, &b, 2);
    mf_expect_forward_error(m, &c, &st, &c.state, "share state slot 1");
    st.state_slots[1] = MF_STATE_SLOTS;
    mf_expect_forward_error(m, &c, &st, &c.state, "state slot 10, outside [0, 10)");
    st.state_slots[1] = 2;
    mf_expect_forward_error(m, &c, &st, NULL, "no state cache");
    st.batch.state_slots = NULL;
    mf_expect_forward_error(m, &c, &st, &c.state, "no state cache");
    st.batch.state_slots = st.state_slots;
    cv_state_cache small = c.state;
    small.slot_bytes -= 64;
    mf_expect_forward_error(m, &c, &st, &small, "the model needs");
    /* Checkpoints: a, b run in slots 1 and 2. */
    const cv_state_checkpoint good[] = {{0, 1, 0}, {1, 0, 3}};
    st.batch.checkpoints = good;
    st.batch.n_checkpoints = 2;
    float *logits = cv_xmalloc(4 * (size_t)m->vocab_size * sizeof(float));
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, &c.state, logits), 0);
    free(logits);
    static const struct {
        cv_state_checkpoint list[2];
        const char *error;
    } bad[] = {
        {{{0, 1, 0}, {2, 0, 3}}, "checkpoint 1 names sequence 2, outside [0, 2)"},
        {{{1, 0, 0}, {0, 1, 3}}, "not sorted by (sequence, position) at entry 1"},
        {{{0, 1, 0}, {0, 0, 3}}, "not sorted by (sequence, position) at entry 1"},
        {{{0, 2, 0}, {1, 0, 3}}, "checkpoint 0 at position 2 is not among the tokens of sequence 0"},
        {{{0, 1, 0}, {1, 0, MF_STATE_SLOTS}}, "checkpoint 1 has state slot 10, outside [0, 10)"},
        {{{0, 1, 1}, {1, 0, 3}}, "checkpoint 0 writes state slot 1, which a sequence of the batch"},
        {{{0, 1, 3}, {1, 1, 3}}, "checkpoint 1 writes state slot 3"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(bad); i++) {
        st.batch.checkpoints = bad[i].list;
        mf_expect_forward_error(m, &c, &st, &c.state, bad[i].error);
    }
    st.batch.checkpoints = NULL;
    mf_expect_forward_error(m, &c, &st, &c.state, "n_checkpoints=2 without a checkpoint list");
    st.batch.n_checkpoints = 0;
    st.positions[1] = 2; /* a gap: the state would skip a token */
    st.slots[1] = (int64_t)a.block_table[0] * MF_BLOCK_SIZE + 2;
    st.context_lens[0] = 3;
    mf_expect_forward_error(m, &c, &st, &c.state, "not consecutive");
    mf_cache_free(&c);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

/* Checkpoints asked of a model that keeps no recurrent state. */
static void test_checkpoints_without_state(cv_threadpool *pool) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/qwen3-moe-f32", CVLLM_TEST_DATA);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    if (mf_load_model(dir, &cfg, &src, pool, &m)) {
        CHECK_MSG(0, "loading %s: %s", dir, cv_error_message());
        return;
    }
    CHECK(!m->state_checkpoints);
    mf_cache c;
    mf_cache_init(&c, m);
    static const int32_t ids[] = {1, 2};
    mf_sequence a = {.tokens = ids, .n_total = 2};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &a, 2);
    mf_step_checkpoint(&st, 0, 1, 0);
    mf_expect_forward_error(m, &c, &st, NULL, "state checkpoints asked of a model without recurrent state");
    mf_cache_free(&c);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

/* Dummy weights (experts per expert, as a dummy source has no fused tensors): weight bytes per
 * token — 3 GDN layers, 1 attention layer, 4 MLPs streaming `mlp` weights each and the lm_head, in
 * bf16 — and a forward over two sequences with finite logits. */
static void test_dummy_weights(cv_threadpool *pool, const char *folder, size_t mlp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    CHECK_EQ_INT(cv_model_config_load(dir, NULL, &cfg), 0);
    CHECK_EQ_INT(cv_weight_source_dummy(CV_DTYPE_BF16, 5, &src), 0);
    cv_model_load_params p = {.config = &cfg, .weights = src, .pool = pool, .max_num_batched_tokens = 0};
    CHECK_EQ_INT(cv_model_load(&p, &m), 0);
    const size_t H = 64, V = 4096;
    const size_t gdn = 256 * H + 128 * H + 2 * 4 * H + H * 128, attn = 512 * H + 2 * 128 * H + H * 256;
    CHECK_EQ_INT(m->weight_bytes, (3 * gdn + attn + 4 * mlp + V * H) * 2);
    mf_cache c;
    mf_cache_init(&c, m);
    static const int32_t ids[] = {1, 2, 3, 4, 5};
    mf_sequence a = {.tokens = ids, .n_total = 3, .state_slot = 3}, b = {.tokens = ids + 3, .n_total = 2};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &a, 3);
    mf_step_add(&st, &c, &b, 2);
    mf_expect_finite(m, &c, &st);
    mf_cache_free(&c);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
}

/* ---- Qwen3_5ForCausalLM layouts ---------------------------------------------------------------- */

/* The names Qwen3_5ForCausalLM saves: the wrapper's "model.language_model." as "model.", no vision
 * tower; ctx, when not NULL, names one tensor (in the new spelling) to leave out. */
static bool causal_lm_name(const char *name, const void *ctx, char *out, size_t cap) {
    static const char wrapper[] = "model.language_model.";
    if (!strncmp(name, "model.visual.", strlen("model.visual."))) return false;
    if (!strncmp(name, wrapper, strlen(wrapper))) snprintf(out, cap, "model.%s", name + strlen(wrapper));
    else snprintf(out, cap, "%s", name);
    return !ctx || strcmp(out, (const char *)ctx) != 0;
}

/* A new folder holding the checkpoint in `from` with its config.json as is (the wrapper's, text
 * fields nested) or flat as Qwen3_5ForCausalLM's (text_config's fields, model_type qwen3_5_text, at
 * the top), and its tensors as is (linked) or under causal_lm_name (without `drop`). */
static char *layout_folder(const char *from, bool flat_config, bool causal_names, const char *drop) {
    char *dir = tu_make_temp_dir(), path[1024];
    snprintf(path, sizeof path, "%s/config.json", from);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) abort();
    if (flat_config) {
        json_t *text = json_incref(json_object_get(root, "text_config"));
        json_decref(root);
        root = text;
        json_object_set_new(root, "architectures", json_pack("[s]", "Qwen3_5ForCausalLM"));
    }
    char *text = json_dumps(root, JSON_INDENT(1));
    tu_write_file(dir, "config.json", text, strlen(text));
    free(text);
    json_decref(root);
    if (causal_names) {
        ce_write_checkpoint(from, dir, causal_lm_name, drop);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", from);
        tu_link(path, dir, "model.safetensors");
    }
    return dir;
}

/* The logits at every position of ref's prompt, prefilled in one call by the model in `dir`. */
static float *prefill_logits(const char *dir, const mf_reference *ref, cv_threadpool *pool) {
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    if (mf_load_model(dir, &cfg, &src, pool, &m)) {
        CHECK_MSG(0, "loading %s: %s", dir, cv_error_message());
        return NULL;
    }
    mf_cache c;
    mf_cache_init(&c, m);
    mf_sequence s = {.tokens = ref->prompt, .n_total = ref->n_prompt};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &s, ref->n_prompt);
    float *logits = cv_xmalloc((size_t)ref->n_prompt * (size_t)ref->vocab * sizeof *logits);
    CHECK_EQ_INT(m->ops->forward(m, &st.batch, &c.kv, &c.state, logits), 0);
    mf_cache_free(&c);
    cv_model_free(m);
    cv_weight_source_free(src);
    cv_model_config_free(&cfg);
    return logits;
}

/* The dense checkpoint as Qwen3_5ForCausalLM (flat config, "model." names), and each spelling under
 * the other's config (text towers cut out of the wrapper keep its names): the same weights found,
 * so exactly the wrapper's logits. */
static void test_causal_lm_layouts(cv_threadpool *pool) {
    CHECK_CONTAINS(cv_model_supported_architectures(), "Qwen3_5ForCausalLM");
    char from[512];
    snprintf(from, sizeof from, "%s/vectors/qwen3.5-dense-f32", CVLLM_TEST_DATA);
    mf_reference ref;
    if (mf_load_reference(from, "long150", &ref)) {
        CHECK_MSG(0, "cannot read the long150 reference in %s", from);
        return;
    }
    const size_t bytes = (size_t)ref.n_prompt * (size_t)ref.vocab * sizeof(float);
    float *want = prefill_logits(from, &ref, pool);
    double worst = 0;
    for (int64_t i = 0; want && i < ref.n_prompt; i++)
        worst = fmax(worst, mf_row_error(want + i * ref.vocab, ref.logits + i * ref.vocab, ref.vocab));
    CHECK_MSG(want && worst <= MF_TOLERANCE, "wrapper layout: rel error %.3g vs the reference", worst);
    static const struct {
        bool flat_config, causal_names;
    } layouts[] = {{true, true}, {true, false}, {false, true}};
    for (size_t i = 0; i < CV_ARRAY_LEN(layouts); i++) {
        char *dir = layout_folder(from, layouts[i].flat_config, layouts[i].causal_names, NULL);
        float *got = prefill_logits(dir, &ref, pool);
        CHECK_MSG(got && want && memcmp(got, want, bytes) == 0, "%s config, %s names: logits differ from the wrapper's",
                  layouts[i].flat_config ? "flat" : "nested", layouts[i].causal_names ? "model." : "model.language_model.");
        free(got);
        tu_remove_tree(dir);
        free(dir);
    }
    char *dir = layout_folder(from, true, true, "model.layers.2.linear_attn.A_log");
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m = NULL;
    CHECK_EQ_INT(mf_load_model(dir, &cfg, &src, pool, &m), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "missing tensor model.layers.2.linear_attn.A_log");
    tu_remove_tree(dir);
    free(dir);
    free(want);
    mf_free_reference(&ref);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    static const cv_isa isas[] = {CV_ISA_AVX512, CV_ISA_AVX2};
    for (size_t i = 0; i < CV_ARRAY_LEN(isas); i++)
        if (cv_isa_force(isas[i]) == 0) {
            test_delta_rule(pool);
            test_delta_rule(NULL);
        }
    test_conv_state();
    test_load_errors(pool);
    test_bad_state(pool);
    test_checkpoints_without_state(pool);
    /* MoE: router, 2 of 8 experts of width 48, shared expert of 64 and its gate; dense: SwiGLU of 128. */
    test_dummy_weights(pool, "qwen3.5-moe-f32", 8 * 64 + 2 * 3 * 48 * 64 + 3 * 64 * 64 + 64);
    test_dummy_weights(pool, "qwen3.5-dense-f32", 3 * 128 * 64);
    test_causal_lm_layouts(pool);
    mf_test_folders_on_each_isa("test_hybrid_ref", FOLDERS, (int)CV_ARRAY_LEN(FOLDERS), pool, CHUNKS,
                                (int)CV_ARRAY_LEN(CHUNKS));
    cv_threadpool_free(pool);
    return cv_check_summary("test_hybrid_ref");
}
