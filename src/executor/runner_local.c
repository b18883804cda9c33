/*
 * runner_local.c — the runner of one process: the whole model, its thread pool and its caches in
 * this address space (design in runner.h).
 */
#include "executor/runner.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/bigmem.h"
#include "base/error.h"
#include "base/threadpool.h"

struct cv_runner {
    cv_runner_info info;
    cv_threadpool *pool;
    cv_model *model;
    cv_kv_cache kv;
    size_t kv_layer_bytes;
    cv_state_cache state;
};

size_t cv_runner_state_slot_bytes(size_t state_bytes_per_seq) { return (state_bytes_per_seq + 63) / 64 * 64; }

int cv_runner_create(const cv_runner_options *o, cv_runner **out) {
    *out = NULL;
    cv_runner *r = cv_xcalloc(1, sizeof *r);
    r->pool = cv_threadpool_create(o->num_threads);
    cv_model_load_params p = {
        .config = o->config,
        .weights = o->weights,
        .pool = r->pool,
        .max_num_batched_tokens = o->max_num_batched_tokens,
        .load_mtp = o->load_mtp,
        .bf16_compute = o->bf16_compute,
    };
    int rc = cv_model_load(&p, &r->model);
    if (rc) {
        cv_runner_free(r);
        return rc;
    }
    const cv_model *m = r->model;
    r->info = (cv_runner_info){
        .kv_spec = m->kv_spec,
        .state_bytes_per_seq = m->state_bytes_per_seq,
        .state_checkpoints = m->state_checkpoints,
        .has_mtp = m->ops->mtp_forward != NULL,
        .vocab_size = m->vocab_size,
        .weight_bytes = m->weight_bytes,
        .threads = cv_threadpool_size(r->pool),
    };
    *out = r;
    return 0;
}

void cv_runner_free(cv_runner *r) {
    if (!r) return;
    for (int32_t l = 0; r->kv.k && l < r->info.kv_spec.num_layers; l++) {
        cv_big_free(r->kv.k[l], r->kv_layer_bytes);
        cv_big_free(r->kv.v[l], r->kv_layer_bytes);
    }
    free(r->kv.k);
    free(r->kv.v);
    cv_big_free(r->state.data, (size_t)r->state.num_slots * r->state.slot_bytes);
    cv_model_free(r->model);
    cv_threadpool_free(r->pool);
    free(r);
}

const cv_runner_info *cv_runner_get_info(const cv_runner *r) { return &r->info; }

int cv_runner_alloc_cache(cv_runner *r, int32_t num_blocks, int32_t block_size, cv_dtype kv_dtype,
                          int32_t state_slots) {
    assert(!r->kv.k && !r->state.data && "the caches are allocated once");
    assert(kv_dtype == CV_DTYPE_F32 || kv_dtype == CV_DTYPE_BF16);
    const cv_kv_spec *spec = &r->info.kv_spec;
    if (state_slots > 0) {
        r->state.slot_bytes = cv_runner_state_slot_bytes(r->info.state_bytes_per_seq);
        r->state.data = cv_big_alloc((size_t)state_slots * r->state.slot_bytes);
        if (!r->state.data)
            return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %d recurrent-state slots of %zu bytes", state_slots,
                           r->info.state_bytes_per_seq);
        r->state.num_slots = state_slots;
    }
    r->kv = (cv_kv_cache){.num_blocks = num_blocks, .block_size = block_size, .dtype = kv_dtype};
    r->kv_layer_bytes = (size_t)num_blocks * (size_t)block_size * (size_t)spec->num_kv_heads * (size_t)spec->head_dim *
                        cv_dtype_size(kv_dtype);
    r->kv.k = cv_xcalloc((size_t)spec->num_layers, sizeof(void *));
    r->kv.v = cv_xcalloc((size_t)spec->num_layers, sizeof(void *));
    for (int32_t l = 0; l < spec->num_layers; l++) {
        r->kv.k[l] = cv_big_alloc(r->kv_layer_bytes);
        r->kv.v[l] = cv_big_alloc(r->kv_layer_bytes);
        if (!r->kv.k[l] || !r->kv.v[l])
            return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate the KV cache (%.2f GiB)",
                           (double)r->kv_layer_bytes * 2 * spec->num_layers / (1 << 30));
    }
    return 0;
}

const cv_kv_cache *cv_runner_kv(const cv_runner *r) { return &r->kv; }

int cv_runner_execute(cv_runner *r, const cv_batch *batch, const cv_state_copy *copies, int32_t n_copies,
                      float *logits) {
    for (int32_t i = 0; i < n_copies; i++) {
        const cv_state_copy *c = &copies[i];
        assert(c->dst >= 0 && c->src >= 0 && c->dst < r->state.num_slots && c->src < r->state.num_slots);
        if (c->dst != c->src)
            memcpy(r->state.data + (size_t)c->dst * r->state.slot_bytes,
                   r->state.data + (size_t)c->src * r->state.slot_bytes, r->state.slot_bytes);
    }
    return r->model->ops->forward(r->model, batch, &r->kv, &r->state, logits);
}

int cv_runner_execute_mtp(cv_runner *r, const cv_batch *batch, const float *hidden, float *logits) {
    assert(r->info.has_mtp);
    return r->model->ops->mtp_forward(r->model, batch, hidden, &r->kv, logits);
}

cv_model *cv_runner_model(cv_runner *r) { return r->model; }
cv_state_cache *cv_runner_state(cv_runner *r) { return &r->state; }
