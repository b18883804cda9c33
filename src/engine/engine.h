/*
 * engine.h — the engine's internal state (the public face is cvllm_engine in include/cvllm.h).
 *
 * The engine wires the layers together: a runner (executor/runner.h: the model, its threads and
 * the memory of its KV cache and recurrent state), the block and state-slot bookkeeping, the
 * scheduler, the tokenizer and the sampler. One step is nano-vllm's three calls: schedule, run the
 * flattened batch on the runner, then post-process each sequence (sample, detokenize, check stop
 * conditions, build outputs). It never knows which architecture it runs, nor where.
 */
#ifndef CV_ENGINE_H
#define CV_ENGINE_H

#include "cvllm.h"
#include "engine/block_pool.h"
#include "engine/grammar_cache.h"
#include "engine/pooler.h"
#include "models/footprint.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/spec_decode.h"
#include "engine/state_pool.h"
#include "executor/runner.h"
#include "loader/config.h"
#include "loader/weights.h"
#include "tokenizer/tokenizer.h"

/* Reusable arrays for building one forward batch. */
typedef struct cv_batch_buf {
    int32_t *token_ids, *positions, *seq_start, *context_lens, *logit_rows, *state_slots;
    const cv_lora_binding **loras; /* [cap_seqs] */
    int64_t *slot_mapping;
    const int32_t **block_tables;
    int32_t cap_tokens, cap_seqs;
    float *logits;
    size_t cap_logits;             /* rows */
    cv_state_checkpoint *checkpoints;
    int32_t n_checkpoints, cap_checkpoints;
    cv_block_hash *new_ckpt_hashes; /* prefix checkpoints requested in this batch (forgotten if it fails) */
    int32_t n_new_ckpts;
} cv_batch_buf;

/* Scratch of the MTP proposer (mtp.c). */
typedef struct cv_mtp_work {
    int32_t *token_ids, *positions, *seq_start, *context_lens, *logit_rows;
    int64_t *slot_mapping;
    int32_t **block_tables;
    float *hidden_in, *hidden_out, *logits;
    cv_seq **drafting;
    size_t cap_rows, cap_seqs, vocab;
} cv_mtp_work;

/* A sequence of the last forward pass, as the MTP proposer needs it. */
typedef struct cv_mtp_seq {
    cv_seq *seq;
    size_t before;                 /* num_computed before the step */
    int32_t main_row;              /* its first row in the forward batch (position `before`) */
} cv_mtp_seq;

struct cvllm_engine {
    cvllm_engine_options opts;     /* strings not kept; see model_dir */
    char *model_dir;
    char *tokenizer_dir; /* --tokenizer's folder, or model_dir's copy */
    cv_model_config config;
    cv_generation_config gen;
    bool use_generation_defaults;
    cv_tokenizer *tokenizer;
    cv_weight_source *weights;
    cv_runner *runner;
    const cv_runner_info *model;   /* the runner's: sizes of the model it runs */
    cv_dtype compute_dtype;        /* F32, or BF16 (GEMM inputs bf16): --dtype resolved against the checkpoint */
    cv_dtype kv_dtype;             /* F32 or BF16: --kv-cache-dtype resolved against compute_dtype */
    int32_t kv_blocks;             /* KV cache blocks, the pool's reserved block 0 included */
    cv_block_pool blocks;
    cv_scheduler sched;
    cv_schedule schedule;
    cv_batch_buf batch;
    float *sample_scratch;         /* 2 × vocab */
    cv_logprob_entry *top_scratch; /* max_logprobs entries */
    cv_state_pool states;          /* recurrent state slots (hybrid models), else empty */
    bool state_prefix_caching;     /* prefix caching restores checkpointed recurrent state */
    bool state_ckpt_align;         /* mamba_cache_mode align: a step checkpoints its last boundary only */
    int32_t state_ckpt_blocks;     /* KV blocks between checkpointed boundaries (mamba_block_size) */
    int32_t vocab_size;
    int32_t max_model_len;
    int32_t max_logprobs;
    bool logprobs_as_logits;       /* logprobs_mode *_logits: sampled tokens' values are logits */
    bool logprobs_processed;       /* logprobs_mode processed_*: of the row as the sampler drew from it */
    _Atomic uint64_t next_request_id; /* requests may be prepared on other threads */
    uint64_t seed_counter;
    cv_request **requests;         /* live requests */
    size_t n_requests, cap_requests;
    cv_request **finished;         /* finished in the last step, freed at the start of the next */
    size_t n_finished, cap_finished;
    const cvllm_request_output **outputs;
    size_t n_outputs, cap_outputs;
    cv_spec_config spec;
    cv_spec_stats spec_stats;
    cv_mtp_work mtp;
    cv_mtp_seq *mtp_seqs;
    bool pooling;                  /* runner pooling: requests are pooled, never sampled */
    cv_pooler pooler;
    float *hidden;                 /* [batch tokens][hidden] from forward(), for the MTP or the pooler */
    size_t cap_hidden;
    cv_grammar_cache *grammars;    /* compiled constraints (cvllm_grammar_compile; any thread) */
    cv_lora_adapter **lora_modules; /* [n_lora_modules] read before the model loads, listed once it has */
    int32_t n_lora_modules;
    cv_lora_registry *loras;       /* enable_lora: the adapters served (any thread); NULL: LoRA off */
    /* Counters for logs and metrics. */
    uint64_t prompt_tokens_total, generation_tokens_total;
};

/* Validates and tokenizes a request and builds it, without touching the engine's mutable state:
 * safe to call from any thread while another thread steps the engine (engine_loop.c does). */
int cv_engine_prepare_request(cvllm_engine *e, const cvllm_prompt *prompt, const cvllm_sampling_params *params,
                              cv_request **out);
/* The same for a pooling request (cvllm_engine_add_pooling_request). */
int cv_engine_prepare_pooling(cvllm_engine *e, const cvllm_prompt *prompt, const cvllm_pooling_params *params,
                              cv_request **out);
/* Queues a prepared request; the stepping thread only. */
void cv_engine_enqueue_request(cvllm_engine *e, cv_request *req);

/* Ends every live request with finish reason "error" (after a failed step); their final outputs come
 * with the next step. */
void cv_engine_fail_all(cvllm_engine *e);

/* Drafts from the model's MTP module for the sequences of the last forward pass (mtp.c). */
int cv_mtp_propose(cvllm_engine *e, cv_mtp_work *w, const cv_mtp_seq *seqs, int32_t n, const float *main_hidden);
void cv_mtp_work_free(cv_mtp_work *w);

/* The memory plan (engine/kv_cache.c). check_fit refuses, before anything is allocated, a model
 * whose estimated footprint cannot fit the memory budget; create sizes the KV cache and recurrent
 * state pool from the budget once the model is loaded (its own KV and state sizes replace the
 * estimate's), has the runner allocate them and sets up the block and state-slot bookkeeping. */
int cv_kv_cache_check_fit(const cvllm_engine *e, const cv_footprint *estimate);
int cv_kv_cache_create(cvllm_engine *e, const cv_footprint *estimate);

#endif
