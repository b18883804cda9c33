/*
 * gdn.c — see gdn.h. The input projections are charged to the profile's q|k|v role, out_proj to
 * o_proj's, the rest of the block to linear attention.
 */
#include "models/layers/gdn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "models/layers/config.h"
#include "models/layers/timed.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

int nn_gdn_dims_from_config(const cv_model_config *cfg, bool grouped, int tp_size, nn_gdn_dims *g) {
    *g = (nn_gdn_dims){.grouped = grouped, .eps = (float)cfg->rms_norm_eps};
    int rc = nn_cfg_int(cfg, "linear_num_key_heads", -1, &g->n_k_heads);
    if (!rc) rc = nn_cfg_int(cfg, "linear_num_value_heads", -1, &g->n_v_heads);
    if (!rc) rc = nn_cfg_int(cfg, "linear_key_head_dim", -1, &g->k_dim);
    if (!rc) rc = nn_cfg_int(cfg, "linear_value_head_dim", -1, &g->v_dim);
    if (!rc) rc = nn_cfg_int(cfg, "linear_conv_kernel_dim", 4, &g->kernel);
    if (rc) return rc;
    if (g->n_v_heads % g->n_k_heads)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: linear_num_value_heads=%d is not a multiple of "
                       "linear_num_key_heads=%d", g->n_v_heads, g->n_k_heads);
    if (g->n_k_heads % tp_size)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "linear_num_key_heads=%d does not split over tensor_parallel_size=%d",
                       g->n_k_heads, tp_size);
    g->n_k_heads /= tp_size;
    g->n_v_heads /= tp_size;
    g->key_dim = g->n_k_heads * g->k_dim;
    g->value_dim = g->n_v_heads * g->v_dim;
    g->conv_dim = 2 * g->key_dim + g->value_dim;
    return 0;
}

size_t nn_gdn_conv_state_bytes(const nn_gdn_dims *d) {
    return align64((size_t)(d->kernel - 1) * (size_t)d->conv_dim * sizeof(float));
}

size_t nn_gdn_state_bytes(const nn_gdn_dims *d) {
    return nn_gdn_conv_state_bytes(d) + align64((size_t)d->n_v_heads * (size_t)d->k_dim * (size_t)d->v_dim * sizeof(float));
}

/* Channel c of this rank's [q | k | v] (the conv's channels, as the projection's rows): the rank's
 * slice of each of the whole tensor's three blocks, which are n times as wide. */
static int64_t whole_channel(const nn_gdn_dims *g, int n, int r, int32_t c) {
    if (c < g->key_dim) return (int64_t)r * g->key_dim + c;
    if (c < 2 * g->key_dim) return (int64_t)n * g->key_dim + (int64_t)r * g->key_dim + (c - g->key_dim);
    return 2 * (int64_t)n * g->key_dim + (int64_t)r * g->value_dim + (c - 2 * g->key_dim);
}

/* conv1d.weight [conv_dim][1][kernel] → this rank's channels tap-major [kernel][conv_dim] f32 for the
 * conv kernel. */
static void bind_conv(nn_binder *b, const char *name, const nn_gdn_dims *g, const float **out) {
    if (b->rc) return;
    const int n = b->tp.size;
    const int64_t whole = (int64_t)n * g->conv_dim;
    int64_t shape[3] = {whole, 1, g->kernel};
    cv_tensor t;
    b->rc = cv_weights_get(b->src, name, 3, shape, "2*linear_num_key_heads*linear_key_head_dim + "
                           "linear_num_value_heads*linear_value_head_dim, 1, linear_conv_kernel_dim", &t);
    if (b->rc) return;
    const size_t n_raw = (size_t)whole * (size_t)g->kernel;
    float *raw = cv_xmalloc(n_raw * sizeof *raw), *w = nn_own(b, (size_t)g->conv_dim * (size_t)g->kernel * sizeof *w);
    if (w) {
        cv_convert_to_f32(raw, t.data, t.dtype, n_raw);
        for (int32_t c = 0; c < g->conv_dim; c++) {
            const float *taps = raw + whole_channel(g, n, b->tp.rank, c) * g->kernel;
            for (int32_t j = 0; j < g->kernel; j++) w[(size_t)j * g->conv_dim + c] = taps[j];
        }
        *out = w;
    }
    free(raw);
}

/* A per-value-head vector, this rank's heads. */
static void bind_head_vector(nn_binder *b, const char *name, const nn_gdn_dims *g, const float **out) {
    const float *whole = NULL;
    nn_bind_vector(b, name, (int64_t)b->tp.size * g->n_v_heads, "linear_num_value_heads", &whole);
    if (whole) *out = whole + (size_t)b->tp.rank * (size_t)g->n_v_heads;
}

void nn_bind_gdn(nn_binder *b, const char *prefix, const nn_gdn_dims *g, int32_t hidden, nn_gdn *w) {
    const int32_t H = hidden;
    const int64_t n = b->tp.size; /* the whole tensors are n times this rank's heads */
    char p[200];
    snprintf(p, sizeof p, "%s", prefix);
    w->tp = n > 1 ? &b->tp : NULL;
    if (g->grouped) { /* grouped per key head: a rank's key heads are whole, consecutive groups of rows */
        nn_bind_linear_split(b, &w->in_proj, nn_name(b, "%sin_proj_qkvz", p), n * (2 * g->key_dim + 2 * g->value_dim),
                             H, "2*linear_num_key_heads*linear_key_head_dim + 2*linear_num_value_heads*"
                             "linear_value_head_dim, hidden_size", NN_SPLIT_ROWS);
        nn_bind_linear_split(b, &w->in_proj, nn_name(b, "%sin_proj_ba", p), n * 2 * g->n_v_heads, H,
                             "2*linear_num_value_heads, hidden_size", NN_SPLIT_ROWS);
    } else {
        const int64_t qkv[3] = {n * g->key_dim, n * g->key_dim, n * g->value_dim};
        nn_bind_linear_row_groups(b, &w->in_proj, nn_name(b, "%sin_proj_qkv", p), qkv, 3, H,
                                  "2*linear_num_key_heads*linear_key_head_dim + "
                                  "linear_num_value_heads*linear_value_head_dim, hidden_size");
        nn_bind_linear_split(b, &w->in_proj, nn_name(b, "%sin_proj_z", p), n * g->value_dim, H,
                             "linear_num_value_heads*linear_value_head_dim, hidden_size", NN_SPLIT_ROWS);
        nn_bind_linear_split(b, &w->in_ba, nn_name(b, "%sin_proj_b", p), n * g->n_v_heads, H,
                             "linear_num_value_heads, hidden_size", NN_SPLIT_ROWS);
        nn_bind_linear_split(b, &w->in_ba, nn_name(b, "%sin_proj_a", p), n * g->n_v_heads, H,
                             "linear_num_value_heads, hidden_size", NN_SPLIT_ROWS);
    }
    bind_conv(b, nn_name(b, "%sconv1d.weight", p), g, &w->conv);
    bind_head_vector(b, nn_name(b, "%sdt_bias", p), g, &w->dt_bias);
    bind_head_vector(b, nn_name(b, "%sA_log", p), g, &w->a_log);
    nn_bind_vector(b, nn_name(b, "%snorm.weight", p), g->v_dim, "linear_value_head_dim", &w->norm);
    nn_bind_linear_split(b, &w->out_proj, nn_name(b, "%sout_proj", p), H, n * g->value_dim,
                         "hidden_size, linear_num_value_heads*linear_value_head_dim", NN_SPLIT_COLS);
}

void nn_gdn_linears(nn_gdn *g, nn_linear_list *list) {
    nn_linear_list_add(list, &g->in_proj);
    nn_linear_list_add(list, &g->in_ba);
    nn_linear_list_add(list, &g->out_proj);
}

void nn_gdn_scratch_take(nn_gdn_scratch *s, const nn_gdn_dims *g, cv_threadpool *pool, nn_arena *ar, int32_t tokens) {
    const size_t T = (size_t)tokens, f = sizeof(float);
    s->qkvz = g->grouped ? nn_take(ar, T * (size_t)(2 * g->key_dim + 2 * g->value_dim) * f) : NULL;
    s->ba = g->grouped ? nn_take(ar, T * (size_t)(2 * g->n_v_heads) * f) : NULL;
    s->qkv = nn_take(ar, T * (size_t)g->conv_dim * f);
    s->u = nn_take(ar, T * (size_t)g->conv_dim * f);
    s->z = nn_take(ar, T * (size_t)g->value_dim * f);
    s->o = nn_take(ar, T * (size_t)g->value_dim * f);
    s->b = nn_take(ar, T * (size_t)g->n_v_heads * f);
    s->alpha = nn_take(ar, T * (size_t)g->n_v_heads * f);
    s->g = nn_take(ar, T * (size_t)g->n_v_heads * f);
    s->beta = nn_take(ar, T * (size_t)g->n_v_heads * f);
    s->workspace = nn_take(ar, cv_gdn_workspace_bytes(pool, g->k_dim, g->v_dim));
}

void nn_gdn_batch_take(nn_gdn_batch *g, nn_arena *a, int32_t rows) {
    const size_t n = (size_t)rows;
    g->states = nn_take(a, n * sizeof *g->states);
    g->ckpt_start = nn_take(a, (n + 1) * sizeof *g->ckpt_start);
    g->ckpt_token = nn_take(a, n * sizeof *g->ckpt_token);
    g->ckpt_states = nn_take(a, n * sizeof *g->ckpt_states);
}

/* The checkpoints grouped by sequence, as token indices within each sequence's run (the batch check
 * guarantees they are sorted and inside the run). */
void nn_gdn_batch_index(nn_gdn_batch *g, const cv_batch *b) {
    int32_t i = 0;
    for (int32_t q = 0; q < b->n_seqs; q++) {
        g->ckpt_start[q] = i;
        for (; i < b->n_checkpoints && b->checkpoints[i].seq == q; i++)
            g->ckpt_token[i] = b->checkpoints[i].position - b->positions[b->seq_start[q]];
    }
    g->ckpt_start[b->n_seqs] = i;
}

/* Qwen3-Next's grouped projections into the contiguous layout: per key head g, qkvz holds
 * [q_g | k_g | v of its r value heads | z of them] and ba holds [b of its r heads | a of them]. */
static void unpack_grouped(const nn_gdn_dims *g, const nn_gdn_scratch *s, int32_t T) {
    const int32_t r = g->n_v_heads / g->n_k_heads, group = 2 * g->k_dim + 2 * r * g->v_dim;
    const size_t kb = (size_t)g->k_dim * sizeof(float), vb = (size_t)r * g->v_dim * sizeof(float);
    for (int64_t t = 0; t < T; t++) {
        const float *src = s->qkvz + t * (2 * g->key_dim + 2 * g->value_dim);
        float *qkv = s->qkv + t * g->conv_dim, *z = s->z + t * g->value_dim;
        for (int32_t k = 0; k < g->n_k_heads; k++, src += group) {
            memcpy(qkv + k * g->k_dim, src, kb);
            memcpy(qkv + g->key_dim + k * g->k_dim, src + g->k_dim, kb);
            memcpy(qkv + 2 * g->key_dim + k * r * g->v_dim, src + 2 * g->k_dim, vb);
            memcpy(z + k * r * g->v_dim, src + 2 * g->k_dim + r * g->v_dim, vb);
        }
        const float *ba = s->ba + t * 2 * g->n_v_heads;
        for (int32_t k = 0; k < g->n_k_heads; k++)
            for (int32_t i = 0; i < r; i++) {
                s->b[t * g->n_v_heads + k * r + i] = ba[k * 2 * r + i];
                s->alpha[t * g->n_v_heads + k * r + i] = ba[k * 2 * r + r + i];
            }
    }
}

static void project(cv_threadpool *pool, const nn_gdn *w, const nn_gdn_dims *g, nn_input in, int32_t T,
                    const nn_gdn_scratch *s) {
    if (g->grouped) {
        float *ys[] = {s->qkvz, s->ba};
        nn_linear_forward(pool, &w->in_proj, in, T, ys);
        unpack_grouped(g, s, T);
    } else {
        float *qkvz[] = {s->qkv, s->z}, *ba[] = {s->b, s->alpha};
        nn_linear_forward(pool, &w->in_proj, in, T, qkvz);
        nn_linear_forward(pool, &w->in_ba, in, T, ba);
    }
}

static uint8_t *slot_bytes(const cv_state_cache *st, int32_t slot) { return st->data + (size_t)slot * st->slot_bytes; }

/* Conv states at the checkpoints of sequence q, before the conv advances the sequence's own state. */
static void checkpoint_conv_states(const nn_gdn_dims *g, const cv_batch *b, const cv_state_cache *st, size_t part,
                                   const nn_gdn_batch *gb, const nn_gdn_scratch *s, int32_t q) {
    const float *x = s->qkv + (int64_t)b->seq_start[q] * g->conv_dim;
    const float *state = (const float *)(slot_bytes(st, b->state_slots[q]) + part);
    for (int32_t i = gb->ckpt_start[q]; i < gb->ckpt_start[q + 1]; i++)
        cv_conv1d_state_after((float *)(slot_bytes(st, b->checkpoints[i].slot) + part), x, g->conv_dim,
                              gb->ckpt_token[i], g->conv_dim, g->kernel, state);
}

/* Conv + SiLU per sequence (checkpointing the conv states first), then the L2 norms and gates. */
static void mix_inputs(const nn_gdn *w, const nn_gdn_dims *g, const cv_batch *b, const cv_state_cache *st,
                       size_t part, const nn_gdn_batch *gb, const nn_gdn_scratch *s) {
    const int32_t T = b->n_tokens;
    const size_t conv_bytes = nn_gdn_conv_state_bytes(g);
    for (int32_t q = 0; q < b->n_seqs; q++) {
        const int32_t t0 = b->seq_start[q], n = b->seq_start[q + 1] - t0;
        uint8_t *slot = slot_bytes(st, b->state_slots[q]) + part;
        gb->states[q] = (float *)(slot + conv_bytes);
        if (b->n_checkpoints) checkpoint_conv_states(g, b, st, part, gb, s, q);
        if (n > 0)
            cv_conv1d_silu(s->u + (int64_t)t0 * g->conv_dim, s->qkv + (int64_t)t0 * g->conv_dim, g->conv_dim, n,
                           g->conv_dim, w->conv, g->kernel, (float *)slot);
    }
    for (int32_t i = 0; i < b->n_checkpoints; i++)
        gb->ckpt_states[i] = (float *)(slot_bytes(st, b->checkpoints[i].slot) + part + conv_bytes);
    for (int64_t t = 0; t < T; t++) {
        float *row = s->u + t * g->conv_dim;
        cv_l2norm(row, g->n_k_heads, g->k_dim, 1e-6f, 1.0f / sqrtf((float)g->k_dim));
        cv_l2norm(row + g->key_dim, g->n_k_heads, g->k_dim, 1e-6f, 1.0f);
    }
    cv_gdn_gates(s->g, s->beta, s->alpha, s->b, T, g->n_v_heads, w->a_log, w->dt_bias);
}

void nn_gdn_forward(cv_threadpool *pool, const nn_gdn *w, const nn_gdn_dims *g, const cv_batch *b,
                    const cv_state_cache *st, size_t part, const nn_gdn_batch *gb, nn_input in,
                    const nn_gdn_scratch *s, float *out) {
    const int32_t T = b->n_tokens;
    NN_TIMED(CV_OP_QKV_PROJ, project(pool, w, g, in, T, s));
    NN_TIMED(CV_OP_LINEAR_ATTENTION, {
        mix_inputs(w, g, b, st, part, gb, s);
        cv_gdn_args args = {
            .n_seqs = b->n_seqs, .seq_start = b->seq_start, .states = gb->states, .n_k_heads = g->n_k_heads,
            .n_v_heads = g->n_v_heads, .k_dim = g->k_dim, .v_dim = g->v_dim, .q = s->u, .k = s->u + g->key_dim,
            .v = s->u + 2 * g->key_dim, .ld = g->conv_dim, .g = s->g, .beta = s->beta, .out = s->o,
            .workspace = s->workspace, .ckpt_start = b->n_checkpoints ? gb->ckpt_start : NULL,
            .ckpt_token = gb->ckpt_token, .ckpt_states = gb->ckpt_states,
        };
        cv_gdn(pool, &args);
        cv_rmsnorm(s->o, s->o, w->norm, (int64_t)T * g->n_v_heads, g->v_dim, g->eps);
        cv_silu_mul(s->o, s->z, s->o, (int64_t)T * g->value_dim);
    });
    NN_TIMED(CV_OP_O_PROJ, nn_linear_forward(pool, &w->out_proj, nn_f32(s->o), T, &out));
    if (w->tp) NN_TIMED(CV_OP_ALLREDUCE, w->tp->allreduce(w->tp->ctx, out, (size_t)T * (size_t)w->out_proj.parts[0].w.rows));
}
