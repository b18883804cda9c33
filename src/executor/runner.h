/*
 * runner.h — the executor seam: what runs a batch on the model, below the engine.
 *
 * The engine decides what runs (scheduling, KV block and state slot bookkeeping, sampling, outputs);
 * a runner owns what it runs on: the loaded model, its threads, the KV cache memory and the
 * recurrent-state memory. The engine hands it plain data — a cv_batch (token ids, positions, KV slots,
 * block tables, state slots and checkpoints, the rows whose logits are wanted) and the state copies
 * its bookkeeping asked for since the last batch — and gets logits back. Nothing the engine keeps
 * points into model memory, so a runner whose model is spread over several processes (tensor
 * parallelism: every rank executes the same batch on its shard) can replace this one without a
 * change above it.
 *
 * State copies are deferred to the next execute and applied in order before its forward pass: every
 * reader of a state slot is a forward pass, and a copy queued after a step (a speculative rollback)
 * must land before the slot is read again, which this order guarantees. Copying bytes is all a runner
 * does with them; what they mean is the model's.
 *
 * Tensor parallelism (tp_size > 1, comm.h): every rank of the MPI job creates a runner with the same
 * options and allocates its caches; rank 0's runner belongs to the engine, the others serve it
 * (cv_runner_serve). Each rank holds its shard (model.h cv_tp), and only rank 0 gets logits.
 *
 * Ownership: cv_runner_create borrows the config and the weight source (both must outlive the
 * runner); everything else the runner allocates it frees in cv_runner_free.
 */
#ifndef CV_RUNNER_H
#define CV_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "models/model.h"

typedef struct cv_runner cv_runner;

typedef struct cv_runner_options {
    const cv_model_config *config;  /* borrowed */
    cv_weight_source *weights;      /* borrowed */
    int num_threads;                /* 0: one per core */
    int32_t max_num_batched_tokens;
    bool load_mtp;
    bool bf16_compute;
    int tp_size;                    /* > 1: tensor parallelism over an MPI job of that many ranks */
    int dp_size, dp_rank;           /* with it: data-parallel replicas, this one's index (comm.h) */
    bool expert_parallel;           /* with it: routed experts placed whole on the ranks (cv_tp) */
    bool lora;                      /* LoRA on (model.h): only with tp_size 1 */
    bool pooling;                   /* the engine pools hidden states (model.h) */
} cv_runner_options;

/* What the engine needs to know of the model it runs (sizes, never memory). */
typedef struct cv_runner_info {
    cv_kv_spec kv_spec;
    size_t state_bytes_per_seq;     /* 0 for pure attention models */
    bool state_checkpoints;         /* the model honours cv_batch.checkpoints */
    bool has_mtp;                   /* cv_runner_execute_mtp is available */
    int32_t vocab_size;
    char head_tensor[160];          /* the checkpoint tensor whose rows are the logits' rows (lm_head.weight,
                                     * or the embedding when tied): a classifier's label rows come from it */
    size_t weight_bytes;
    int threads;
    int tp_rank, tp_size;           /* {0, 1}: one process */
} cv_runner_info;

/* One recurrent-state slot copied over another. */
typedef struct cv_state_copy {
    int32_t dst, src;
} cv_state_copy;

/* What cv_runner_create and cv_runner_alloc_cache return on a worker (tensor-parallel rank ≠ 0)
 * when the step failed on some rank of its group (rank 0's call returns that rank's error and
 * reason, for its caller to report once), and cv_runner_create when an earlier data-parallel
 * replica failed to start (cv_runner_release_unstarted): the worker has nothing left to do. Not a
 * cvllm_status. */
enum { CV_RUNNER_GROUP_FAILED = -100 };

/* Loads the model. */
int cv_runner_create(const cv_runner_options *o, cv_runner **out);
void cv_runner_free(cv_runner *r);
const cv_runner_info *cv_runner_get_info(const cv_runner *r);

/* cv_model_lora_bind on the runner's model (loaded with lora); any thread, while batches run. */
int cv_runner_lora_bind(const cv_runner *r, const cv_lora_adapter *a, cv_lora_binding **out);

/* Bytes one recurrent-state slot takes in memory (the model's state, aligned). */
size_t cv_runner_state_slot_bytes(size_t state_bytes_per_seq);
/* Allocates the KV cache (num_blocks × block_size slots per layer of kv_dtype, F32 or BF16) and
 * state_slots recurrent-state slots (0 for models without state). Once, before the first execute. */
int cv_runner_alloc_cache(cv_runner *r, int32_t num_blocks, int32_t block_size, cv_dtype kv_dtype,
                          int32_t state_slots);
const cv_kv_cache *cv_runner_kv(const cv_runner *r);

/* Applies copies[0..n_copies) in order, then runs the batch: logits of batch->logit_rows into
 * logits[n_logits][vocab] (and batch->hidden_out when set). */
int cv_runner_execute(cv_runner *r, const cv_batch *batch, const cv_state_copy *copies, int32_t n_copies,
                      float *logits);
/* The MTP draft step over the same KV cache (see cv_model_ops.mtp_forward); only when has_mtp. */
int cv_runner_execute_mtp(cv_runner *r, const cv_batch *batch, const float *hidden, float *logits);

/* Tensor parallelism: ranks other than 0 are workers. Once the caches are allocated a worker runs
 * cv_runner_serve, executing every batch rank 0's runner sends until rank 0's runner is freed
 * (then 0) or a batch fails on it (its error; the job should end, as rank 0 cannot go on). */
bool cv_runner_is_worker(const cv_runner *r);
int cv_runner_serve(cv_runner *r);
/* On rank 0: every replica's group of the job was freed with its workers let go
 * (cvllm_job_workers_released). */
bool cv_runner_workers_released(void);
/* On rank 0, when replica i of dp_size failed to start (data parallelism starts them in order): lets
 * the workers of replicas i+1… go, which wait to start with it, so the job ends at once. */
void cv_runner_release_unstarted(int tp_size, int dp_size);

/* For tests that drive the model beside the engine: the loaded model and its state memory. */
cv_model *cv_runner_model(cv_runner *r);
cv_state_cache *cv_runner_state(cv_runner *r);

#endif
