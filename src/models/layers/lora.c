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
    if (!p->lora) return;
    assert(b->tp.size == 1 && p->max_num_batched_tokens > 0);
    b->lora_sites = nn_own(b, sizeof *b->lora_sites);
    b->lora_tokens = nn_own(b, sizeof *b->lora_tokens);
    if (b->rc) return;
    nn_lora_tokens *t = b->lora_tokens;
    t->cap = p->max_num_batched_tokens;
    t->of_token = nn_own(b, (size_t)t->cap * sizeof *t->of_token);
    t->used = nn_own(b, (size_t)t->cap * sizeof *t->used);
    t->work = nn_own(b, sizeof *t->work);
}

void nn_lora_site(nn_binder *b, nn_linear *l, int j) {
    cv_lora_sites *s = b->lora_sites;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->site = cv_xrealloc(s->site, (size_t)s->cap * sizeof *s->site);
    }
    const nn_linear_part *part = &l->parts[j];
    s->site[s->n++] = (cv_lora_site){part->name, part->w.cols, part->w.rows, b->adapters_off};
    if (b->adapters_off) return;
    l->lora_site[j] = s->n_on++;
    l->lora_tokens = b->lora_tokens;
}

void nn_lora_release(nn_binder *b) {
    if (b->lora_sites) free(b->lora_sites->site);
    nn_lora_work *w = b->lora_tokens ? b->lora_tokens->work : NULL;
    if (!w) return;
    free(w->rows);
    free(w->xa);
    free(w->mid);
}

/* Site i's module of a, checked against its linear; *rc set on a mismatch. */
static const cv_lora_module *site_module(const cv_lora_adapter *a, const cv_lora_site *site, int *rc) {
    const cv_lora_module *m = cv_lora_adapter_find(a, site->name);
    if (!m) return NULL;
    if (site->off)
        *rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "LoRA adapter %s (%s) targets %s: adapters on routed experts, the "
                      "lm_head and MTP layers are not supported", a->name, a->path, site->name);
    else if (m->in != site->in || m->out != site->out)
        *rc = cv_fail(CVLLM_ERR_FORMAT, "LoRA adapter %s (%s): %s maps %lld inputs to %lld outputs, but the "
                      "model's %s.weight maps %lld to %lld", a->name, a->path, m->name, (long long)m->in,
                      (long long)m->out, site->name, (long long)site->in, (long long)site->out);
    return m;
}

int cv_model_lora_bind(const cv_model *model, const cv_lora_adapter *a, cv_lora_binding **out) {
    *out = NULL;
    const cv_lora_sites *s = model->lora_sites;
    if (!s) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "LoRA adapter %s: the model was loaded without LoRA", a->name);
    cv_lora_binding *bnd = cv_xcalloc(1, sizeof *bnd);
    bnd->adapter = a;
    bnd->n_sites = s->n_on;
    bnd->module = cv_xcalloc((size_t)s->n_on + 1, sizeof *bnd->module);
    bool *bound = cv_xcalloc(a->n_modules + 1, sizeof *bound);
    int rc = 0;
    for (int32_t i = 0, on = 0; i < s->n && !rc; i++) {
        const cv_lora_module *m = site_module(a, &s->site[i], &rc);
        if (m) bound[m - a->modules] = true;
        if (!s->site[i].off) bnd->module[on++] = m;
    }
    for (size_t i = 0; i < a->n_modules && !rc; i++)
        if (!bound[i])
            rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "LoRA adapter %s (%s) targets %s, which is not a linear layer of this "
                         "model that adapters run on", a->name, a->path, a->modules[i].name);
    free(bound);
    if (rc) {
        cv_lora_binding_free(bnd);
        return rc;
    }
    *out = bnd;
    return 0;
}

void cv_lora_binding_free(cv_lora_binding *b) {
    if (!b) return;
    free(b->module);
    free(b);
}

/* Grows t to n tokens: the old tables stay the binder's until it is freed. */
static void grow_tokens(nn_binder *b, nn_lora_tokens *t, int64_t n) {
    int32_t *of_token = nn_own(b, (size_t)n * sizeof *of_token);
    const cv_lora_binding **used = nn_own(b, (size_t)n * sizeof *used);
    if (!of_token || !used) abort(); /* as cv_xmalloc: the forward pass has no way to fail here */
    t->of_token = of_token;
    t->used = used;
    t->cap = n;
}

void nn_lora_set_batch(nn_binder *b, const cv_batch *batch) {
    nn_lora_tokens *t = b->lora_tokens;
    if (!t) return;
    if (batch->n_tokens > t->cap) grow_tokens(b, t, batch->n_tokens);
    t->n_tokens = batch->n_tokens;
    t->n_used = 0;
    for (int32_t s = 0; s < batch->n_seqs; s++) {
        const cv_lora_binding *a = batch->loras ? batch->loras[s] : NULL;
        int32_t k = 0;
        if (a) {
            assert(a->n_sites == b->lora_sites->n_on);
            while (k < t->n_used && t->used[k] != a) k++;
            if (k == t->n_used) t->used[t->n_used++] = a;
            k++;
        }
        for (int32_t i = batch->seq_start[s]; i < batch->seq_start[s + 1]; i++) t->of_token[i] = k;
    }
}

/* Whether adapter a has a module on some part of l. */
static bool targets(const cv_lora_binding *a, const nn_linear *l) {
    for (int j = 0; j < l->n_parts; j++)
        if (a->module[l->lora_site[j]]) return true;
    return false;
}

bool nn_lora_active(const nn_linear *l) {
    const nn_lora_tokens *tok = l->lora_tokens;
    for (int32_t k = 0; tok && k < tok->n_used; k++)
        if (targets(tok->used[k], l)) return true;
    return false;
}

/* p grown to hold n items of `size` bytes (its capacity in *cap). */
static void *reserve(void *p, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return p;
    *cap = n;
    return cv_xrealloc(p, n * size);
}

typedef struct gather_arg {
    nn_input x;
    int64_t cols;
    const int64_t *rows;
    float *out;
} gather_arg;

/* Rows rows[i] of x as f32 into out[i] (cols values), i in [begin, end). */
static void gather(const void *p, int64_t begin, int64_t end) {
    const gather_arg *g = p;
    for (int64_t i = begin; i < end; i++) {
        float *out = g->out + i * g->cols;
        if (g->x.f32) memcpy(out, g->x.f32 + g->rows[i] * g->cols, (size_t)g->cols * sizeof *out);
        else cv_convert_to_f32(out, g->x.bf16 + g->rows[i] * cv_act_bf16_stride(g->cols), CV_DTYPE_BF16, (size_t)g->cols);
    }
}

void nn_lora_forward(cv_threadpool *pool, const nn_linear *l, nn_input x, int64_t T, float *const *ys) {
    if (!nn_lora_active(l)) return;
    const nn_lora_tokens *tok = l->lora_tokens;
    assert(tok->n_tokens == T && (x.f32 || x.bf16));
    const int64_t cols = l->parts[0].w.cols;
    nn_lora_work *w = tok->work;
    w->rows = reserve(w->rows, &w->cap_rows, (size_t)T, sizeof *w->rows);
    for (int32_t k = 1; k <= tok->n_used; k++) {
        const cv_lora_binding *a = tok->used[k - 1];
        if (!targets(a, l)) continue;
        int64_t n = 0;
        for (int64_t i = 0; i < T; i++)
            if (tok->of_token[i] == k) w->rows[n++] = i;
        if (!n) continue;
        const float *xa = x.f32; /* every token's: the rows as they are */
        if (n < T || !x.f32) {
            w->xa = reserve(w->xa, &w->cap_xa, (size_t)(n * cols), sizeof *w->xa);
            const gather_arg g = {x, cols, w->rows, w->xa};
            cv_threadpool_run_range(pool, gather, &g, n, n * cols >= 16384);
            xa = w->xa;
        }
        for (int j = 0; j < l->n_parts; j++) {
            const cv_lora_module *m = a->module[l->lora_site[j]];
            if (!m) continue;
            w->mid = reserve(w->mid, &w->cap_mid, (size_t)(n * m->rank), sizeof *w->mid);
            const cv_weight A = cv_weight_view(&(cv_matrix){m->a, CV_DTYPE_F32, m->rank, m->in});
            cv_linear(pool, &A, &(cv_act){.f32 = xa}, n, 1, &m->rank, &w->mid);
            cv_lowrank_add(pool, ys[j], m->out, w->rows, w->mid, n, m->rank, m->bt, m->out);
        }
    }
}
