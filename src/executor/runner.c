/*
 * runner.c — the runner (design in runner.h): the model, its thread pool and its caches in this
 * process; under tensor parallelism, this process's shard of them, rank 0 sending every command to
 * the other ranks (comm.h) before running it on its own shard.
 *
 * A command's payload is the batch's arrays back to back (token ids, positions, KV slots, sequence
 * starts, context lengths, state slots, checkpoints, logit rows, the state copies, then each
 * sequence's block table up to its context), which a worker points a cv_batch into; an MTP step's
 * also carries the hidden states it starts from, which only rank 0's forward pass hands out.
 */
#include "executor/runner.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bigmem.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "executor/comm.h"

struct cv_runner {
    cv_runner_info info;
    cv_threadpool *pool;
    cv_model *model;
    cv_kv_cache kv;
    size_t kv_layer_bytes;
    cv_state_cache state;
    cv_tp tp;              /* {0, 1}: one process */
    cv_comm *comm;         /* tensor parallelism: the group's communicator */
    bool serving;          /* every rank allocated its caches: the workers wait for commands */
    void *payload;         /* the last command's payload */
    size_t payload_cap;
    const int32_t **tables; /* a worker's block-table pointers into the payload */
    size_t tables_cap;
};

size_t cv_runner_state_slot_bytes(size_t state_bytes_per_seq) { return (state_bytes_per_seq + 63) / 64 * 64; }

int cv_runner_create(const cv_runner_options *o, cv_runner **out) {
    *out = NULL;
    cv_runner *r = cv_xcalloc(1, sizeof *r);
    r->tp = (cv_tp){.rank = 0, .size = 1};
    int threads = o->num_threads;
    if (o->tp_size > 1) {
        int rc = cv_comm_join(o->tp_size, o->dp_size, o->dp_rank, &r->tp, &r->comm);
        r->tp.expert_parallel = o->expert_parallel;
        if (rc) {
            free(r);
            return rc;
        }
        /* the ranks on this machine share its cores */
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        const int shards = cv_comm_local_shards(o->tp_size, o->dp_size);
        if (!threads) threads = cpus / shards > 1 ? (int)(cpus / shards) : 1;
    }
    r->pool = cv_threadpool_create(threads);
    cv_model_load_params p = {
        .config = o->config,
        .weights = o->weights,
        .pool = r->pool,
        .max_num_batched_tokens = o->max_num_batched_tokens,
        .load_mtp = o->load_mtp,
        .bf16_compute = o->bf16_compute,
        .tp = r->tp.size > 1 ? &r->tp : NULL,
        .lora = o->lora,
        .pooling = o->pooling,
    };
    assert(!o->lora || o->tp_size <= 1); /* the batch a worker gets carries no adapters */
    int rc = cv_model_load(&p, &r->model);
    if (r->tp.size > 1) rc = cv_comm_agree(r->comm, rc, "load the model");
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
        .tp_rank = r->tp.rank,
        .tp_size = r->tp.size,
    };
    snprintf(r->info.head_tensor, sizeof r->info.head_tensor, "%s", m->head_tensor);
    *out = r;
    return 0;
}

void cv_runner_free(cv_runner *r) {
    if (!r) return;
    if (r->serving && r->tp.rank == 0) { /* the workers leave cv_runner_serve */
        cv_comm_header h = {.cmd = CV_CMD_STOP};
        cv_comm_bcast_header(r->comm, &h);
    }
    free(r->payload);
    free(r->tables);
    for (int32_t l = 0; r->kv.k && l < r->info.kv_spec.num_layers; l++) {
        cv_big_free(r->kv.k[l], r->kv_layer_bytes);
        cv_big_free(r->kv.v[l], r->kv_layer_bytes);
    }
    free(r->kv.k);
    free(r->kv.v);
    cv_big_free(r->state.data, (size_t)r->state.num_slots * r->state.slot_bytes);
    cv_model_free(r->model);
    cv_threadpool_free(r->pool);
    cv_comm_free(r->comm);
    free(r);
}

const cv_runner_info *cv_runner_get_info(const cv_runner *r) { return &r->info; }

int cv_runner_lora_bind(const cv_runner *r, const cv_lora_adapter *a, cv_lora_binding **out) {
    return cv_model_lora_bind(r->model, a, out);
}

static int alloc_cache(cv_runner *r, int32_t num_blocks, int32_t block_size, cv_dtype kv_dtype, int32_t state_slots);

int cv_runner_alloc_cache(cv_runner *r, int32_t num_blocks, int32_t block_size, cv_dtype kv_dtype,
                          int32_t state_slots) {
    if (r->tp.size == 1) return alloc_cache(r, num_blocks, block_size, kv_dtype, state_slots);
    /* rank 0's sizes for all: each rank planned from its own memory */
    cv_comm_header h = {CV_CMD_ALLOC, {num_blocks, block_size, kv_dtype, state_slots}};
    cv_comm_bcast_header(r->comm, &h);
    int rc = alloc_cache(r, (int32_t)h.n[0], (int32_t)h.n[1], (cv_dtype)h.n[2], (int32_t)h.n[3]);
    rc = cv_comm_agree(r->comm, rc, "allocate its KV cache");
    r->serving = rc == 0;
    return rc;
}

static int alloc_cache(cv_runner *r, int32_t num_blocks, int32_t block_size, cv_dtype kv_dtype, int32_t state_slots) {
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

static int run(cv_runner *r, const cv_batch *batch, const cv_state_copy *copies, int32_t n_copies, float *logits) {
    for (int32_t i = 0; i < n_copies; i++) {
        const cv_state_copy *c = &copies[i];
        assert(c->dst >= 0 && c->src >= 0 && c->dst < r->state.num_slots && c->src < r->state.num_slots);
        if (c->dst != c->src)
            memcpy(r->state.data + (size_t)c->dst * r->state.slot_bytes,
                   r->state.data + (size_t)c->src * r->state.slot_bytes, r->state.slot_bytes);
    }
    return r->model->ops->forward(r->model, batch, &r->kv, &r->state, logits);
}

/* ---- the payload of an execute command ------------------------------------------------------------ */

/* A walk over the payload: measures it, writes it, or points a batch into it. */
typedef enum { MEASURE, WRITE, READ } walk_mode;

typedef struct cursor {
    char *base;            /* the payload (NULL when measuring) */
    size_t off;
    walk_mode mode;
} cursor;

/* n elements of `size` bytes at *p: copied into the payload, or *p pointed into it; each field
 * starts 8-byte aligned. */
static void field(cursor *c, const void **p, size_t size, int64_t n) {
    const size_t bytes = size * (size_t)n;
    if (c->mode == WRITE && bytes) memcpy(c->base + c->off, *p, bytes);
    if (c->mode == READ) *p = c->base + c->off;
    c->off += (bytes + 7) / 8 * 8;
}

static int64_t table_len(const cv_batch *b, int32_t s, int32_t block_size) {
    return ((int64_t)b->context_lens[s] + block_size - 1) / block_size;
}

/* Walks the batch's arrays in payload order (its state slots when `state`, the MTP step's input
 * hidden states [n_tokens][hidden_size] when hidden_size); returns the bytes they take. */
static size_t walk(cursor *c, cv_batch *b, bool state, const cv_state_copy **copies, int32_t n_copies,
                   const float **hidden, int32_t hidden_size, int32_t block_size, const int32_t **tables) {
    field(c, (const void **)&b->token_ids, 4, b->n_tokens);
    field(c, (const void **)&b->positions, 4, b->n_tokens);
    field(c, (const void **)&b->slot_mapping, 8, b->n_tokens);
    field(c, (const void **)&b->seq_start, 4, b->n_seqs + 1);
    field(c, (const void **)&b->context_lens, 4, b->n_seqs);
    if (state) field(c, (const void **)&b->state_slots, 4, b->n_seqs);
    field(c, (const void **)&b->checkpoints, sizeof *b->checkpoints, b->n_checkpoints);
    field(c, (const void **)&b->logit_rows, 4, b->n_logits);
    field(c, (const void **)copies, sizeof **copies, n_copies);
    if (hidden_size) field(c, (const void **)hidden, sizeof **hidden, (int64_t)b->n_tokens * hidden_size);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const void *t = c->mode == READ ? NULL : b->block_tables[s];
        field(c, &t, 4, table_len(b, s, block_size));
        if (c->mode == READ) tables[s] = t;
    }
    return c->off;
}

static int32_t hidden_size(const cv_runner *r) { return r->model->config->hidden_size; }

/* Rank 0 of several: sends command cmd (EXECUTE or EXECUTE_MTP, which carries `hidden`) for the
 * batch to the workers. hidden_out stays rank 0's: the workers' forward passes need not fill it. */
static void send_batch(cv_runner *r, int64_t cmd, const cv_batch *batch, const cv_state_copy *copies,
                       int32_t n_copies, const float *hidden) {
    assert(r->tp.rank == 0 && r->serving);
    cv_batch b = *batch;
    const bool state = b.state_slots != NULL;
    const int32_t hs = cmd == CV_CMD_EXECUTE_MTP ? hidden_size(r) : 0;
    cursor c = {.mode = MEASURE};
    const size_t bytes = walk(&c, &b, state, &copies, n_copies, &hidden, hs, r->kv.block_size, NULL);
    if (bytes > r->payload_cap) {
        free(r->payload);
        r->payload = cv_xmalloc(bytes);
        r->payload_cap = bytes;
    }
    c = (cursor){.base = r->payload, .mode = WRITE};
    walk(&c, &b, state, &copies, n_copies, &hidden, hs, r->kv.block_size, NULL);
    cv_comm_header h = {cmd, {b.n_tokens, b.n_seqs, b.n_checkpoints, b.n_logits, n_copies, (int64_t)bytes, state}};
    cv_comm_bcast_header(r->comm, &h);
    cv_comm_bcast_payload(r->comm, &r->payload, &r->payload_cap, bytes);
}

int cv_runner_execute(cv_runner *r, const cv_batch *batch, const cv_state_copy *copies, int32_t n_copies,
                      float *logits) {
    if (r->tp.size > 1) send_batch(r, CV_CMD_EXECUTE, batch, copies, n_copies, NULL);
    return run(r, batch, copies, n_copies, logits);
}

int cv_runner_execute_mtp(cv_runner *r, const cv_batch *batch, const float *hidden, float *logits) {
    assert(r->info.has_mtp);
    if (r->tp.size > 1) send_batch(r, CV_CMD_EXECUTE_MTP, batch, NULL, 0, hidden);
    return r->model->ops->mtp_forward(r->model, batch, hidden, &r->kv, logits);
}

bool cv_runner_is_worker(const cv_runner *r) { return r->tp.rank != 0; }

bool cv_runner_workers_released(void) { return cv_comm_workers_released(); }

void cv_runner_release_unstarted(int tp_size, int dp_size) {
    if (tp_size > 1) cv_comm_release_unjoined(tp_size, dp_size);
}

int cv_runner_serve(cv_runner *r) {
    assert(r->tp.rank != 0 && r->serving);
    for (;;) {
        cv_comm_header h;
        cv_comm_bcast_header(r->comm, &h);
        if (h.cmd == CV_CMD_STOP) return 0;
        assert(h.cmd == CV_CMD_EXECUTE || h.cmd == CV_CMD_EXECUTE_MTP);
        const bool mtp = h.cmd == CV_CMD_EXECUTE_MTP;
        cv_comm_bcast_payload(r->comm, &r->payload, &r->payload_cap, (size_t)h.n[5]);
        cv_batch b = {.n_tokens = (int32_t)h.n[0], .n_seqs = (int32_t)h.n[1], .n_checkpoints = (int32_t)h.n[2],
                      .n_logits = (int32_t)h.n[3]};
        if ((size_t)b.n_seqs > r->tables_cap) {
            r->tables_cap = (size_t)b.n_seqs;
            r->tables = cv_xrealloc(r->tables, r->tables_cap * sizeof *r->tables);
        }
        const cv_state_copy *copies = NULL;
        const float *hidden = NULL;
        cursor c = {.base = r->payload, .mode = READ};
        walk(&c, &b, h.n[6] != 0, &copies, (int32_t)h.n[4], &hidden, mtp ? hidden_size(r) : 0, r->kv.block_size,
             r->tables);
        b.block_tables = r->tables;
        int rc = mtp ? r->model->ops->mtp_forward(r->model, &b, hidden, &r->kv, NULL)
                     : run(r, &b, copies, (int32_t)h.n[4], NULL);
        if (rc) return rc; /* rank 0 checked the same batch: a worker's failure is its own, and ends the job */
    }
}

cv_model *cv_runner_model(cv_runner *r) { return r->model; }
cv_state_cache *cv_runner_state(cv_runner *r) { return &r->state; }
