/*
 * spec_decode.h — speculative decoding: what to propose, and how many proposals were accepted.
 *
 * A decoding sequence carries up to num_speculative_tokens draft tokens. The scheduler gives it its
 * next token plus the drafts in one forward pass; the engine then walks the drafts with the
 * rejection sampler (cv_sample_verify), keeps the accepted prefix plus one token sampled at the
 * first rejection (or a bonus token after the last draft), and rewinds num_computed so the K/V of
 * rejected drafts is simply overwritten later. Output distribution is unchanged; greedy output is
 * identical to decoding without speculation.
 *
 * Proposers: "ngram" (prompt lookup, vLLM's prompt_lookup_min/max: the longest suffix n-gram that
 * occurred earlier in the sequence predicts the tokens that followed it) works for every model.
 * The MTP methods ("qwen3_5_mtp", "mtp", "qwen3_next_mtp") need the model's MTP module.
 */
#ifndef CV_SPEC_DECODE_H
#define CV_SPEC_DECODE_H

#include <stddef.h>
#include <stdint.h>

#define CV_MAX_SPEC_TOKENS 16

typedef enum cv_spec_method { CV_SPEC_NONE = 0, CV_SPEC_NGRAM, CV_SPEC_MTP } cv_spec_method;

typedef struct cv_spec_config {
    cv_spec_method method;
    int32_t num_speculative_tokens;
    int32_t prompt_lookup_min, prompt_lookup_max; /* ngram */
} cv_spec_config;

/* Parses vLLM's --speculative-config JSON (NULL or "" = none). Errors name the bad key. */
int cv_spec_config_parse(const char *json, cv_spec_config *out);

/* vLLM's acceptance counters (vllm:spec_decode_*). */
typedef struct cv_spec_stats {
    uint64_t num_drafts;
    uint64_t num_draft_tokens;
    uint64_t num_accepted_tokens;
    uint64_t accepted_per_pos[CV_MAX_SPEC_TOKENS];
} cv_spec_stats;

/* Proposes up to max_draft tokens that continue tokens[0..n) by prompt lookup; returns how many. */
int32_t cv_ngram_propose(const cv_spec_config *cfg, const int32_t *tokens, size_t n, int32_t max_draft,
                         int32_t *draft);

#endif
