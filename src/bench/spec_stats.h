/*
 * spec_stats.h — `bench serve`'s speculative-decoding section: the server's vllm:spec_decode_*
 * counters read from /metrics before and after the run, and vLLM's statistics of their difference.
 */
#ifndef CV_BENCH_SPEC_STATS_H
#define CV_BENCH_SPEC_STATS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

enum { CV_SPEC_MAX_POSITIONS = 64 };

/* One reading, every series of a family summed (one per engine under data parallelism). */
typedef struct cv_spec_counters {
    bool found;                /* the server exposes the spec-decode families */
    double drafts, draft_tokens, accepted;
    double accepted_per_pos[CV_SPEC_MAX_POSITIONS];
    int n_pos;                 /* positions seen (1 + the largest position label) */
} cv_spec_counters;

typedef struct cv_spec_stats {
    double acceptance_rate;    /* accepted / draft tokens, % */
    double acceptance_length;  /* 1 + accepted / drafts */
    double drafts, draft_tokens, accepted;
    double per_position[CV_SPEC_MAX_POSITIONS]; /* accepted at position i / drafts */
    int n_pos;
} cv_spec_stats;

/* Reads BASE_URL/metrics. A server that cannot be read or has no such families gives found = false;
 * nothing is an error here, as in vLLM, where the section is simply left out. */
void cv_spec_counters_read(const char *base_url, const char *const *headers, size_t n_headers, cv_spec_counters *out);
/* Parses Prometheus text (the part of cv_spec_counters_read that needs no server). */
void cv_spec_counters_parse(const char *text, cv_spec_counters *out);
/* The run's statistics; false (no section) unless both readings exist and draft tokens were made. */
bool cv_spec_stats_between(const cv_spec_counters *before, const cv_spec_counters *after, cv_spec_stats *out);
/* The section as vLLM prints it, before the closing line of the result block. */
void cv_spec_stats_print(const cv_spec_stats *s);
/* vLLM's result-JSON keys for it. */
void cv_spec_stats_json(const cv_spec_stats *s, json_t *result);

#endif
