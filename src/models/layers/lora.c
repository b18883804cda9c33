/*
 * lora.c — see lora.h.
 */
#include "models/layers/lora.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"

void nn_lora_init(nn_binder *b, const cv_model_load_params *p) {
    if (!p->n_loras) return;
    assert(b->tp.size == 1 && p->max_num_batched_tokens > 0);
    b->loras = p->loras;
    b->n_loras = p->n_loras;
    b->lora_tokens = nn_own(b, sizeof *b->lora_tokens);
    b->lora_used = nn_own(b, (size_t)p->n_loras * sizeof *b->lora_used);
    if (b->rc) return;
    b->lora_tokens->cap = p->max_num_batched_tokens;
    b->lora_tokens->of_token = nn_own(b, (size_t)p->max_num_batched_tokens * sizeof(int32_t));
    for (int a = 0; a < p->n_loras && !b->rc; a++) b->lora_used[a] = nn_own(b, p->loras[a]->n_modules + 1);
}

void nn_lora_attach(nn_binder *b, nn_linear *l, int j) {
    const nn_linear_part *part = &l->parts[j];
    for (int a = 0; a < b->n_loras && !b->rc; a++) {
        const cv_lora_adapter *ad = b->loras[a];
        const cv_lora_module *m = cv_lora_adapter_find(ad, part->name);
        if (!m) continue;
        if (b->adapters_off) {
            b->rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "LoRA adapter %s (%s) targets %s: adapters on routed experts, the "
                            "lm_head and MTP layers are not supported", ad->name, ad->path, part->name);
        } else if (m->in != part->w.cols || m->out != part->w.rows) {
            b->rc = cv_fail(CVLLM_ERR_FORMAT, "LoRA adapter %s (%s): %s maps %lld inputs to %lld outputs, but the "
                            "model's %s.weight maps %lld to %lld", ad->name, ad->path, m->name, (long long)m->in,
                            (long long)m->out, part->name, (long long)part->w.cols, (long long)part->w.rows);
        }
        if (b->rc) return;
        if (!l->lora) {
            l->lora = nn_own(b, (size_t)NN_MAX_PARTS * (size_t)b->n_loras * sizeof *l->lora);
            if (b->rc) return;
            l->n_loras = b->n_loras;
            l->lora_tokens = b->lora_tokens;
        }
        l->lora[j * b->n_loras + a] = m;
        b->lora_used[a][m - ad->modules] = true;
    }
}

void nn_lora_check_bound(nn_binder *b) {
    for (int a = 0; a < b->n_loras && !b->rc; a++)
        for (size_t i = 0; i < b->loras[a]->n_modules; i++)
            if (!b->lora_used[a][i]) {
                const cv_lora_adapter *ad = b->loras[a];
                b->rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "LoRA adapter %s (%s) targets %s, which is not a linear layer "
                                "of this model that adapters run on", ad->name, ad->path, ad->modules[i].name);
                return;
            }
}

void nn_lora_set_batch(nn_binder *b, const cv_batch *batch) {
    nn_lora_tokens *t = b->lora_tokens;
    if (!t) return;
    if (batch->n_tokens > t->cap) { /* the old table stays the binder's until it is freed */
        int32_t *grown = nn_own(b, (size_t)batch->n_tokens * sizeof *grown);
        if (!grown) abort(); /* as cv_xmalloc: the forward pass has no way to fail here */
        t->of_token = grown;
        t->cap = batch->n_tokens;
    }
    t->n_tokens = batch->n_tokens;
    t->any = false;
    for (int32_t s = 0; s < batch->n_seqs; s++) {
        const int32_t id = batch->lora_ids ? batch->lora_ids[s] : 0;
        assert(id >= 0 && id <= b->n_loras);
        t->any |= id != 0;
        for (int32_t i = batch->seq_start[s]; i < batch->seq_start[s + 1]; i++) t->of_token[i] = id;
    }
}

/* Row i of x as f32 into out (cols values). */
static void input_row(nn_input x, int64_t cols, int64_t i, float *out) {
    if (x.f32) memcpy(out, x.f32 + i * cols, (size_t)cols * sizeof *out);
    else cv_convert_to_f32(out, x.bf16 + i * cv_act_bf16_stride(cols), CV_DTYPE_BF16, (size_t)cols);
}

void nn_lora_forward(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, float *const *ys) {
    const nn_lora_tokens *tok = l->lora_tokens;
    if (!l->lora || !tok->any) return;
    assert(tok->n_tokens == T && (x.f32 || x.bf16));
    const int64_t cols = l->parts[0].w.cols;
    int64_t *rows = cv_xmalloc((size_t)T * sizeof *rows);
    float *xa = NULL, *mid = NULL;
    for (int a = 1; a <= l->n_loras; a++) {
        bool targeted = false;
        for (int j = 0; j < l->n_parts; j++) targeted |= l->lora[j * l->n_loras + a - 1] != NULL;
        int64_t n = 0;
        for (int64_t i = 0; targeted && i < T; i++)
            if (tok->of_token[i] == a) rows[n++] = i;
        if (!n) continue;
        xa = cv_xrealloc(xa, (size_t)n * (size_t)cols * sizeof *xa);
        for (int64_t i = 0; i < n; i++) input_row(x, cols, rows[i], xa + i * cols);
        for (int j = 0; j < l->n_parts; j++) {
            const cv_lora_module *m = l->lora[j * l->n_loras + a - 1];
            if (!m) continue;
            mid = cv_xrealloc(mid, (size_t)n * (size_t)m->rank * sizeof *mid);
            const cv_weight A = cv_weight_view(&(cv_matrix){m->a, CV_DTYPE_F32, m->rank, m->in});
            cv_linear(pool, &A, &(cv_act){.f32 = xa}, n, 1, &m->rank, &mid);
            cv_lowrank_add(pool, ys[j], m->out, rows, mid, n, m->rank, m->bt, m->out);
        }
    }
    free(rows);
    free(xa);
    free(mid);
}
