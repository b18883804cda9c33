/*
 * model.h — the contract between the engine and an architecture.
 *
 * The engine never knows which architecture it runs: it loads a model through the registry (keyed by
 * config.json "architectures"), asks it what KV cache it needs, and calls forward() with a flat batch
 * of tokens from many sequences. A model file expresses one forward pass in kernels and owns no
 * scheduling; all per-request state lives in the paged KV cache the engine hands in.
 *
 * Paged KV cache (vLLM's layout): for every attention layer l, K and V are arrays of
 * num_blocks × block_size slots of [num_kv_heads × head_dim] elements of the cache's dtype (f32, or
 * bf16 rounded to nearest even when written: half the bytes a token). A token's K/V go to slot
 * `slot_mapping[t]` (= block_id·block_size + offset); sequence s reads its context through
 * block_tables[s][0 .. ceil(context_len/block_size)).
 *
 * Recurrent state (linear-attention layers of the hybrid models): a model that needs per-sequence
 * state declares state_bytes_per_seq; the engine owns a pool of such slots, opaque to it, and gives
 * each sequence of a batch its slot in state_slots. A sequence whose first token in the batch is at
 * position 0 starts from zero state (the model clears the slot); otherwise the slot holds the state
 * after the token before it. The engine may copy a slot's bytes (prefix-cache checkpoints,
 * speculative-decoding rollback) without knowing what they mean.
 *
 * State checkpoints: a batch may ask for copies of a sequence's state as it stood right after the
 * token at a given position (inside the tokens of this batch), written into another slot. The engine
 * uses them to keep the state at block boundaries of cached prefixes, so a later request sharing the
 * prefix can start from there (prefix caching for hybrid models), and to roll the state back to the
 * last accepted token after speculative decoding rejected drafts.
 *
 * Multi-token prediction (MTP, Qwen3.5/3.6 and Qwen3-Next): when loaded with load_mtp, a model that
 * has an `mtp.*` module sets ops->mtp_forward and keeps one more KV layer for it (the last kv layer).
 * The engine asks forward() for the final-normed hidden states of every token (batch->hidden_out),
 * then runs mtp_forward over the same positions with the *next* token of each position as input,
 * as vLLM's proposer does (vllm/v1/spec_decode/eagle.py, which also runs the MTP methods).
 *
 * LoRA adapters (vLLM's --enable-lora): a model loaded with LoRA on lays an adapter out over its
 * linears when asked (cv_model_lora_bind), at load or long after, without changing itself; each
 * sequence of a batch names the binding it runs with (loras), so one forward pass mixes adapters
 * and the base model, as vLLM's punica kernels do. They adapt the linears whose rows are the batch's
 * tokens (attention, the dense MLP and shared expert, the linear-attention projections, the
 * router); the MTP module, the lm_head and routed experts run without them.
 */
#ifndef CV_MODEL_H
#define CV_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "loader/config.h"
#include "loader/lora.h"
#include "loader/weights.h"

typedef struct cv_threadpool cv_threadpool;
typedef struct cv_lora_sites cv_lora_sites;     /* the linears adapters may target (layers/lora.h) */
typedef struct cv_lora_binding cv_lora_binding; /* an adapter laid out over them */

/* What the model needs from the KV cache, per token, for each of its attention layers. */
typedef struct cv_kv_spec {
    int32_t num_layers;      /* attention layers that keep K/V */
    int32_t num_kv_heads;
    int32_t head_dim;
} cv_kv_spec;

typedef struct cv_state_cache {
    int32_t num_slots;
    size_t slot_bytes;       /* = the model's state_bytes_per_seq */
    uint8_t *data;           /* num_slots × slot_bytes, 64-byte aligned slots */
} cv_state_cache;

typedef struct cv_kv_cache {
    int32_t num_blocks;
    int32_t block_size;
    cv_dtype dtype;          /* of k and v: CV_DTYPE_F32 (0, the default) or CV_DTYPE_BF16 */
    void **k;                /* [num_layers] → [num_blocks·block_size][num_kv_heads·head_dim] of dtype */
    void **v;
} cv_kv_cache;

typedef struct cv_state_checkpoint {
    int32_t seq;             /* batch sequence index */
    int32_t position;        /* absolute position of the token after which the state is copied */
    int32_t slot;            /* destination state slot */
} cv_state_checkpoint;

/* One forward call: n_tokens tokens from n_seqs sequences, each sequence's tokens contiguous and in
 * position order. */
typedef struct cv_batch {
    int32_t n_tokens;
    const int32_t *token_ids;     /* [n_tokens] */
    const int32_t *positions;     /* [n_tokens] absolute position within its sequence */
    const int64_t *slot_mapping;  /* [n_tokens] KV slot this token writes */
    int32_t n_seqs;
    const int32_t *seq_start;     /* [n_seqs+1]: sequence s owns tokens [seq_start[s], seq_start[s+1]) */
    const int32_t *context_lens;  /* [n_seqs]: tokens in the cache for s after this step (incl. new) */
    const int32_t *const *block_tables; /* [n_seqs] → block ids */
    const int32_t *state_slots;   /* [n_seqs] state slot of each sequence; NULL when the model has none */
    const cv_state_checkpoint *checkpoints; /* sorted by (seq, position); only for models with state */
    int32_t n_checkpoints;
    float *hidden_out;            /* optional [n_tokens][hidden]: final-normed hidden state of every token */
    int32_t n_logits;
    const int32_t *logit_rows;    /* [n_logits] token indices whose logits are wanted */
    const cv_lora_binding *const *loras; /* [n_seqs]: the adapter each sequence runs with (bound to this
                                   * model, or one loaded from the same config and parameters), NULL for
                                   * the base model; loras NULL: every sequence runs the base model */
} cv_batch;

typedef struct cv_model cv_model;

typedef struct cv_model_ops {
    /* Logits of batch->logit_rows into logits[n_logits][vocab]. */
    int (*forward)(cv_model *m, const cv_batch *batch, cv_kv_cache *kv, cv_state_cache *state, float *logits);
    /* MTP draft step (NULL when absent): batch->token_ids are the next tokens x_{i+1}, positions i;
     * hidden[t] is the main model's hidden for token t (or the MTP output of the previous draft
     * step). Writes logits of batch->logit_rows, and into batch->hidden_out (if set) the MTP output
     * m of every token, to feed the next draft step. */
    int (*mtp_forward)(cv_model *m, const cv_batch *batch, const float *hidden, cv_kv_cache *kv, float *logits);
    void (*destroy)(cv_model *m);
} cv_model_ops;

struct cv_model {
    const cv_model_ops *ops;
    const cv_model_config *config; /* borrowed; outlives the model */
    cv_kv_spec kv_spec;
    size_t state_bytes_per_seq;    /* 0 for pure attention models */
    bool state_checkpoints;        /* forward() honours batch->checkpoints */
    int32_t vocab_size;            /* rows of the logits */
    const char *head_tensor;       /* the checkpoint tensor of the logits' rows (nn_vocab.head_tensor) */
    size_t weight_bytes;           /* bytes of weights read per token (for sizing and benchmarks) */
    cv_threadpool *pool;           /* borrowed */
    const cv_lora_sites *lora_sites; /* loaded with LoRA on; else NULL */
};

/* Tensor parallelism: this process is rank `rank` of `size`, each holding a shard of every layer —
 * attention heads (and their KV cache) and MLP columns split evenly, the projections that leave a
 * block (o_proj, down_proj) split along their input, so each rank's output is a partial sum that
 * allreduce adds over the ranks, in place, identically on every rank. How the sums travel is the
 * executor's (OpenMPI there; a failed collective ends every rank of the job, so it returns nothing);
 * a model only calls these. The lm_head is split by vocabulary rows too: each rank computes its
 * slice of every logit row and gather collects the slices at rank 0, the only rank given logits. */
typedef struct cv_tp {
    int rank, size;
    bool expert_parallel;    /* routed MoE experts placed whole on the ranks rather than split (layers/moe.h) */
    void *ctx;
    void (*allreduce)(void *ctx, float *x, size_t n);
    /* every rank's n floats, in rank order, into rank 0's all[size·n] (all is NULL elsewhere) */
    void (*gather)(void *ctx, const float *part, size_t n, float *all);
} cv_tp;

/* Calibration (cvllm quantize): called before each linear layer runs with its input rows — f32,
 * as the layer would see them unquantized — and the linear's name, its weight's prefix (e.g.
 * "model.layers.0.self_attn.q_proj"). Projections computed together (q|k|v) are reported once each. */
typedef void (*cv_linear_observer)(void *ctx, const char *linear, const float *x, int64_t rows, int64_t cols);

typedef struct cv_model_load_params {
    const cv_model_config *config;
    cv_weight_source *weights;
    cv_threadpool *pool;
    int32_t max_num_batched_tokens; /* largest n_tokens a forward call will get (scratch sizing) */
    bool load_mtp;                  /* bind mtp.* and provide ops->mtp_forward (when the model has one) */
    bool bf16_compute;              /* bf16 GEMM inputs for bf16 weights (where cv_linear_bf16_input) */
    const cv_tp *tp;                /* NULL: the whole model in this process */
    cv_linear_observer observe;     /* NULL: none */
    void *observe_ctx;
    bool lora;                      /* LoRA on: adapters may be bound (cv_model_lora_bind) and batches ask
                                    * for them; only without tensor parallelism */
    bool pooling;                   /* the engine pools hidden states (batch->hidden_out) and asks for no
                                    * logits: an untied lm_head.weight is neither read nor required, as
                                    * vLLM's pooling runner drops it (embedding checkpoints lack it) */
} cv_model_load_params;

/* Picks the architecture from config->architecture. Unknown: CVLLM_ERR_UNSUPPORTED naming it and
 * listing the supported ones. */
int cv_model_load(const cv_model_load_params *p, cv_model **out);
void cv_model_free(cv_model *m);

/* Lays adapter a (borrowed: it must outlive the binding) out over the linears of m, loaded with LoRA
 * on, for batches to name (cv_batch.loras). Reads only what the load fixed, so any thread may bind
 * while m runs. Errors, in one line naming the adapter and its module: CVLLM_ERR_UNSUPPORTED for a
 * module that is no linear of m adapters run on (routed experts, the lm_head, MTP, a name m lacks),
 * CVLLM_ERR_FORMAT for a module of another shape than its linear, CVLLM_ERR_INVALID_ARGUMENT when m
 * was loaded without LoRA. */
int cv_model_lora_bind(const cv_model *m, const cv_lora_adapter *a, cv_lora_binding **out);
void cv_lora_binding_free(cv_lora_binding *b); /* NULL is allowed */

/* Comma-separated list of supported architecture names (static string). */
const char *cv_model_supported_architectures(void);
/* 0 when the registry has `architecture`, else cv_model_load's CVLLM_ERR_UNSUPPORTED: for checks
 * made before any weight is read. */
int cv_model_check_architecture(const char *architecture);
/* 0 when the model splits over tp_size tensor-parallel ranks (with expert_parallel, its routed
 * experts whole), else the error its loader would give on every rank: the attention heads, the
 * linear-attention key heads and the experts, from config.json alone. */
int cv_model_check_split(const cv_model_config *cfg, int tp_size, bool expert_parallel);

#endif
