/*
 * engine_loop.h — the engine on its own thread, for callers on many threads (the HTTP server).
 *
 * The loop thread owns the cvllm_engine and steps it while there is work. Other threads submit and
 * abort requests through a locked inbox that the loop drains before each step, so a submitter never
 * waits for a forward pass. Validation and tokenization happen on the submitting thread (they read
 * only immutable engine state), so a bad request fails synchronously with vLLM's message.
 *
 * Results flow back as events: after each step, every request that changed gets one event holding
 * copies of what is new (tokens, text, logprobs, finish reason). Events are delivered on a separate
 * output thread through the request's callback; with async scheduling the next step's forward pass
 * runs while the previous step's events are being delivered (and turned into JSON / SSE by the
 * server), which is the overlap vLLM's --async-scheduling buys.
 *
 * Every submitted request gets exactly one event with finished = true (normal end or abort); after
 * it the callback is never called again for that request, so its `user` data may be freed then.
 */
#ifndef CV_ENGINE_LOOP_H
#define CV_ENGINE_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/histogram.h"
#include "engine/spec_decode.h"
#include "loader/lora.h"
#include "cvllm.h"

typedef struct cv_engine_loop cv_engine_loop;
typedef struct cv_request cv_request; /* engine/request.h */

typedef struct cv_loop_options {
    bool async_scheduling;      /* deliver events on the output thread while the next step runs */
    double log_stats_interval;  /* seconds between "Avg prompt throughput ..." lines; 0 = never */
    int engine_index;           /* the data-parallel replica this loop runs ("Engine 001: ..."), 0 alone */
} cv_loop_options;

/* What changed in one completion during one step. All memory is owned by the event. */
typedef struct cv_completion_delta {
    int32_t index;
    int32_t *token_ids;         /* new tokens */
    size_t n_token_ids;
    char *text;                 /* new text (NUL-terminated) */
    size_t text_len;
    cvllm_position_logprobs *logprobs; /* n_token_ids entries, or NULL when not requested */
    size_t n_total_tokens;      /* output tokens so far, including these */
    cvllm_finish_reason finish_reason;
    int32_t stop_token_id;      /* -1 unless a stop_token_ids entry finished it */
    char *stop_str;             /* the stop string that finished it, or NULL */
} cv_completion_delta;

typedef struct cv_request_event {
    uint64_t request_id;
    cv_completion_delta *outputs; /* only the completions that changed */
    int32_t n_outputs;
    int32_t *prompt_token_ids;  /* in the first event only (NULL later) */
    size_t n_prompt_token_ids;  /* always set */
    cvllm_position_logprobs *prompt_logprobs; /* in the event that completes them, else NULL */
    size_t n_cached_tokens;     /* prompt tokens served from the prefix cache */
    bool finished;
    float *embedding;           /* a pooling request's vector, in its final event (NULL otherwise) */
    size_t n_embedding;
} cv_request_event;

void cv_request_event_free(cv_request_event *ev);

/* Called on the output thread; takes ownership of ev. Must not block for long. */
typedef void (*cv_event_fn)(void *user, cv_request_event *ev);

/* Takes ownership of the engine (destroyed by cv_engine_loop_stop). */
int cv_engine_loop_start(cvllm_engine *engine, const cv_loop_options *opts, cv_engine_loop **out);
/* Aborts everything in flight (each gets its final event), joins the threads, destroys the engine. */
void cv_engine_loop_stop(cv_engine_loop *loop);
/* Waits up to `seconds` until every submitted request has finished and its final event has been
 * delivered (SIGTERM drain); true when none is left. */
bool cv_engine_loop_drain(cv_engine_loop *loop, double seconds);

typedef struct cv_submit {
    const cvllm_prompt *prompt;
    const cvllm_sampling_params *params;
    const cvllm_pooling_params *pooling; /* non-NULL: a pooling request (params unused) */
    cv_event_fn on_event;
    void *user;
    double arrival_time;        /* cv_now() when the request arrived (TTFT/E2E start); 0 = at submit */
} cv_submit;

/* Thread-safe. On success *request_id identifies the request (for abort). The same as
 * cv_engine_loop_prepare then cv_engine_loop_enqueue. */
int cv_engine_loop_submit(cv_engine_loop *loop, const cv_submit *req, uint64_t *request_id);
/* The two halves of a submit, for a caller that looks at the tokenized request before it picks a loop
 * (engine_group.c). Prepare validates and tokenizes s->prompt and s->params on the calling thread;
 * the request may be enqueued on this loop or on any loop whose engine was created with the same
 * options. Enqueue takes ownership of req, also when it fails (the loop is stopping); s->on_event,
 * s->user and s->arrival_time apply. */
int cv_engine_loop_prepare(cv_engine_loop *loop, const cv_submit *s, cv_request **req);
int cv_engine_loop_enqueue(cv_engine_loop *loop, cv_request *req, const cv_submit *s, uint64_t *request_id);
/* Thread-safe; unknown or finished ids are ignored. */
void cv_engine_loop_abort(cv_engine_loop *loop, uint64_t request_id);

/* What a router weighs (engine_group.c): the requests submitted and not yet finished, counted from the
 * submit on so that a burst spreads before any step has run, and the KV-cache usage after the last
 * step. Thread-safe. */
void cv_engine_loop_load(cv_engine_loop *loop, size_t *requests, double *kv_cache_usage);

/* cvllm_engine_load_lora and cvllm_engine_unload_lora on the loop's engine: thread-safe, as they are. */
int cv_engine_loop_load_lora(cv_engine_loop *loop, const cvllm_lora_module *m, bool replace);
int cv_engine_loop_unload_lora(cv_engine_loop *loop, const char *name);

/* Read-only engine facts for the server (immutable after start). */
const cvllm_engine *cv_engine_loop_engine(const cv_engine_loop *loop);

enum { CV_FINISHED_STOP, CV_FINISHED_LENGTH, CV_FINISHED_ABORT, CV_FINISHED_ERROR, CV_FINISHED_KINDS };

/* A consistent snapshot for /metrics and the periodic log line (vLLM's names in comments). */
typedef struct cv_engine_stats {
    int32_t num_running;               /* vllm:num_requests_running */
    int32_t num_waiting;               /* vllm:num_requests_waiting */
    double kv_cache_usage;             /* vllm:kv_cache_usage_perc (0..1) */
    uint64_t prompt_tokens;            /* vllm:prompt_tokens_total */
    uint64_t generation_tokens;        /* vllm:generation_tokens_total */
    uint64_t prefix_cache_queries;     /* vllm:prefix_cache_queries_total (tokens) */
    uint64_t prefix_cache_hits;        /* vllm:prefix_cache_hits_total (tokens) */
    uint64_t num_preemptions;          /* vllm:num_preemptions_total */
    uint64_t request_success[CV_FINISHED_KINDS]; /* vllm:request_success_total{finished_reason} */
    cv_histogram time_to_first_token;  /* vllm:time_to_first_token_seconds */
    cv_histogram inter_token_latency;  /* vllm:inter_token_latency_seconds */
    cv_histogram e2e_request_latency;  /* vllm:e2e_request_latency_seconds */
    /* Per finished request, with vLLM's intervals: queued = first scheduled - queued into the engine,
     * prefill = first token - first scheduled, decode = last token - first token, inference =
     * prefill + decode, time per output token = decode / (output tokens - 1). */
    cv_histogram request_queue_time;      /* vllm:request_queue_time_seconds */
    cv_histogram request_prefill_time;    /* vllm:request_prefill_time_seconds */
    cv_histogram request_decode_time;     /* vllm:request_decode_time_seconds */
    cv_histogram request_inference_time;  /* vllm:request_inference_time_seconds */
    cv_histogram request_time_per_output_token; /* vllm:request_time_per_output_token_seconds */
    cv_histogram request_prompt_tokens;   /* vllm:request_prompt_tokens */
    cv_histogram request_generation_tokens; /* vllm:request_generation_tokens (all completions) */
    cv_histogram request_max_num_generation_tokens; /* vllm:request_max_num_generation_tokens (longest) */
    cv_histogram request_params_n;        /* vllm:request_params_n */
    cv_histogram request_params_max_tokens; /* vllm:request_params_max_tokens */
    cv_histogram iteration_tokens;        /* vllm:iteration_tokens_total, per step with outputs */
    uint64_t spec_num_drafts;          /* vllm:spec_decode_num_drafts_total */
    uint64_t spec_num_draft_tokens;    /* vllm:spec_decode_num_draft_tokens_total */
    uint64_t spec_num_accepted_tokens; /* vllm:spec_decode_num_accepted_tokens_total */
    uint64_t spec_accepted_per_pos[CV_MAX_SPEC_TOKENS]; /* vllm:spec_decode_num_accepted_tokens_per_pos_total{position} */
    int32_t spec_num_positions;        /* num_speculative_tokens (0 = speculation off) */
    int64_t kv_cache_tokens;           /* capacity, for cache_config_info */
    int32_t block_size;
    /* vllm:lora_requests_info: max_loras (0: LoRA off) and, for the adapter in slot i of the table
     * that prepared the requests (lora_registry.h), lora_state[i] = 1 when a request of it runs, | 2
     * when one waits */
    int32_t max_loras;
    uint8_t lora_state[CV_MAX_LORA_MODULES];
} cv_engine_stats;

void cv_engine_loop_stats(cv_engine_loop *loop, cv_engine_stats *out);

#endif
