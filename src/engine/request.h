/*
 * request.h — a request and its sequences, as the engine tracks them.
 *
 * A request owns a copy of everything the caller passed (prompt, parameters, stop strings) and one
 * sequence per completion (n > 1 gives n sequences that share the prompt but sample independently,
 * each with its own seed stream, as vLLM's parallel sampling does). A sequence's `tokens` are the
 * prompt followed by its output; `num_computed` counts those whose K/V are in the cache, and the
 * scheduler moves it towards n_tokens (chunked prefill and decode are the same thing here).
 *
 * The public cvllm_request_output / cvllm_completion_output views live inside these structs and
 * point into their arrays, so reporting a step copies nothing.
 */
#ifndef CV_REQUEST_H
#define CV_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "engine/block_pool.h"
#include "engine/lora_registry.h"
#include "sample/sampler.h"
#include "engine/spec_decode.h"
#include "tokenizer/tokenizer.h"

typedef enum cv_seq_status { CV_SEQ_WAITING, CV_SEQ_RUNNING, CV_SEQ_FINISHED } cv_seq_status;

typedef struct cv_request cv_request;

typedef struct cv_seq {
    cv_request *req;
    int32_t index;                 /* completion index within the request */
    cv_seq_status status;
    int32_t *tokens;               /* prompt + output */
    size_t n_tokens, cap_tokens;
    size_t num_computed;           /* tokens whose K/V are in the cache */
    int32_t *block_table;
    int32_t n_blocks, cap_blocks;
    int32_t num_scheduled;         /* tokens given to it in the current step */
    int32_t num_preemptions;
    cv_block_hash *block_hashes;   /* chained hashes of the full blocks of tokens (prefix caching) */
    int32_t n_block_hashes, cap_block_hashes;
    int32_t n_cached_blocks;       /* leading blocks already registered in the prefix cache */
    int32_t state_slot;            /* recurrent-state slot while running, -1 otherwise */
    int32_t restore_slot;          /* checkpoint to start from (prefix-cache hit), -1 otherwise */
    int32_t draft[CV_MAX_SPEC_TOKENS]; /* speculative tokens to verify after tokens[] */
    int32_t n_draft;
    cv_sampler_state sampler;
    cv_detok detok;
    char *text;                    /* decoded output so far */
    size_t text_len, text_cap;
    size_t visible_len;            /* bytes of text reported (stop-string hold-back excluded) */
    size_t reported_tokens, reported_text; /* what the previous output showed */
    char hidden_byte;              /* see engine.c: hide_text_tail */
    bool has_hidden_byte;
    cvllm_position_logprobs *logprobs; /* one per output token, when requested */
    bool touched;                  /* changed in this step */
    cvllm_completion_output out;
} cv_seq;

struct cv_request {
    uint64_t id;                   /* engine-unique, increasing: FCFS order */
    cvllm_sampling_params params;  /* arrays inside point to the copies below */
    int32_t *stop_token_ids;
    char **stop;
    size_t max_stop_len;
    int32_t *bias_ids;
    float *bias_values;
    int32_t *allowed_ids;          /* allowed_token_ids ascending without repeats; NULL = any */
    size_t n_allowed;
    cv_token_seqs bad_words;       /* the bad words' token sequences (params.bad_words is not kept) */
    int32_t *stop_ids;             /* what min_tokens masks: eos ids (unless ignore_eos) + stop_token_ids */
    size_t n_stop_ids;
    int32_t *eos_ids;              /* the model's eos ids, empty when ignore_eos */
    size_t n_eos_ids;
    cv_sampler_params sampler_params;
    cvllm_grammar *grammar;        /* params.grammar, a reference of the request's own; NULL = none */
    int32_t max_tokens;            /* resolved: never past max_model_len */
    int32_t *prompt;
    size_t n_prompt;
    char *cache_salt;              /* NULL = none */
    cv_lora_entry *lora;           /* the LoRA adapter it runs with, a reference of its own; NULL: the base model */
    size_t n_cached_tokens;        /* prefix-cache hit of the first admission */
    bool admitted;                 /* seq 0 (the first of its request to run) was scheduled once:
                                    * n_cached_tokens is set and the queue time is over */
    cvllm_position_logprobs *prompt_logprobs; /* n_prompt entries when requested */
    size_t n_prompt_logprobs_done; /* positions filled (entry 0 counts once the prompt starts) */
    bool pooling;                  /* a pooling request (engine/pooler.h): one sequence, nothing sampled */
    cvllm_pooling_params pool;     /* its parameters, resolved */
    float *pooled;                 /* [hidden]: what the pooler kept so far, then the vector */
    size_t n_pooled;               /* the vector's length once finished, 0 before */
    cv_seq *seqs;
    int32_t n_seqs;
    int32_t n_finished;
    bool touched;
    cvllm_completion_output *outs;
    cvllm_request_output out;
};

/* Makes a request with copies of prompt and params; `eos` are the model's eos ids, `bad_words` the
 * token sequences of params->bad_words (taken over; NULL = none). */
cv_request *cv_request_create(uint64_t id, const int32_t *prompt, size_t n_prompt, const char *cache_salt,
                              const cvllm_sampling_params *params, int32_t max_tokens,
                              const int32_t *eos, size_t n_eos, cv_token_seqs *bad_words);
void cv_token_seqs_free(cv_token_seqs *seqs);
void cv_request_free(cv_request *req);
/* The id of the request's adapter load (lora_registry.h), 0 for the base model: the prefix cache's key. */
static inline int32_t cv_request_lora_id(const cv_request *req) { return req->lora ? req->lora->id : 0; }

void cv_seq_append_token(cv_seq *seq, int32_t token);
/* Ensures seq has blocks for n_tokens tokens of block_size each; returns how many it lacks. */
int32_t cv_seq_blocks_needed(const cv_seq *seq, size_t n_tokens, int32_t block_size);
void cv_seq_add_blocks(cv_seq *seq, const int32_t *ids, int32_t n);
size_t cv_seq_num_output(const cv_seq *seq);
bool cv_request_wants_prompt_logprobs(const cv_request *req);
void cv_free_position_logprobs(cvllm_position_logprobs *lp, size_t n);

#endif
