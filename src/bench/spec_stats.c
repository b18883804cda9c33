/*
 * spec_stats.c — see spec_stats.h. As vLLM's serve.py: the counters are read before the timed run and
 * after it, and the statistics are those of the difference, so what warmups or earlier runs drafted
 * does not count: acceptance rate = accepted / draft tokens, acceptance length = 1 + accepted /
 * drafts, and per position the share of drafts whose token at that position was accepted.
 */
#include "bench/spec_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bench/client.h"

/* The value of a sample line "NAME{labels} VALUE" or "NAME VALUE" whose name is `name`, or false. */
static bool sample_value(const char *line, const char *name, const char **labels, double *v) {
    const size_t n = strlen(name);
    if (strncmp(line, name, n) != 0 || (line[n] != '{' && line[n] != ' ')) return false;
    const char *p = line + n;
    *labels = NULL;
    if (*p == '{') {
        *labels = p;
        p = strchr(p, '}');
        if (!p) return false;
        p++;
    }
    char *end;
    *v = strtod(p, &end);
    return end != p;
}

void cv_spec_counters_parse(const char *text, cv_spec_counters *out) {
    *out = (cv_spec_counters){0};
    for (const char *line = text; line && *line;) {
        const char *nl = strchr(line, '\n'), *labels;
        double v;
        if (sample_value(line, "vllm:spec_decode_num_drafts_total", &labels, &v)) out->drafts += v, out->found = true;
        else if (sample_value(line, "vllm:spec_decode_num_draft_tokens_total", &labels, &v)) out->draft_tokens += v;
        else if (sample_value(line, "vllm:spec_decode_num_accepted_tokens_total", &labels, &v)) out->accepted += v;
        else if (sample_value(line, "vllm:spec_decode_num_accepted_tokens_per_pos_total", &labels, &v) && labels) {
            const char *pos = strstr(labels, "position=\"");
            const long i = pos ? strtol(pos + 10, NULL, 10) : -1;
            if (i >= 0 && i < CV_SPEC_MAX_POSITIONS) {
                out->accepted_per_pos[i] += v;
                if (i + 1 > out->n_pos) out->n_pos = (int)i + 1;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
}

void cv_spec_counters_read(const char *base_url, const char *const *headers, size_t n_headers, cv_spec_counters *out) {
    char *url = cv_xasprintf("%s/metrics", base_url), *body = NULL;
    *out = (cv_spec_counters){0};
    if (cv_bench_http_get(url, headers, n_headers, &body) == 0) cv_spec_counters_parse(body, out);
    free(body);
    free(url);
}

bool cv_spec_stats_between(const cv_spec_counters *before, const cv_spec_counters *after, cv_spec_stats *out) {
    if (!before->found || !after->found) return false;
    const double drafts = after->drafts - before->drafts, draft_tokens = after->draft_tokens - before->draft_tokens;
    if (draft_tokens <= 0) return false; /* vLLM's condition for the section */
    *out = (cv_spec_stats){.drafts = drafts, .draft_tokens = draft_tokens, .accepted = after->accepted - before->accepted,
                           .n_pos = drafts > 0 ? after->n_pos : 0};
    out->acceptance_rate = out->accepted / draft_tokens * 100.0;
    out->acceptance_length = drafts > 0 ? 1.0 + out->accepted / drafts : 0.0;
    for (int i = 0; i < out->n_pos; i++)
        out->per_position[i] = (after->accepted_per_pos[i] - (i < before->n_pos ? before->accepted_per_pos[i] : 0)) / drafts;
    return true;
}

void cv_spec_stats_print(const cv_spec_stats *s) {
    printf("%s\n", "---------------Speculative Decoding---------------");
    printf("%-40s %-10.2f\n", "Acceptance rate (%):", s->acceptance_rate);
    printf("%-40s %-10.2f\n", "Acceptance length:", s->acceptance_length);
    printf("%-40s %-10lld\n", "Drafts:", (long long)s->drafts);
    printf("%-40s %-10lld\n", "Draft tokens:", (long long)s->draft_tokens);
    printf("%-40s %-10lld\n", "Accepted tokens:", (long long)s->accepted);
    if (s->n_pos == 0) return;
    printf("Per-position acceptance (%%):\n");
    for (int i = 0; i < s->n_pos; i++) {
        char label[32];
        snprintf(label, sizeof label, "  Position %d:", i);
        printf("%-40s %-10.2f\n", label, s->per_position[i] * 100.0);
    }
}

void cv_spec_stats_json(const cv_spec_stats *s, json_t *result) {
    json_object_set_new(result, "spec_decode_acceptance_rate", json_real(s->acceptance_rate));
    json_object_set_new(result, "spec_decode_acceptance_length", json_real(s->acceptance_length));
    json_object_set_new(result, "spec_decode_num_drafts", json_integer((json_int_t)s->drafts));
    json_object_set_new(result, "spec_decode_draft_tokens", json_integer((json_int_t)s->draft_tokens));
    json_object_set_new(result, "spec_decode_accepted_tokens", json_integer((json_int_t)s->accepted));
    json_t *pos = json_array();
    for (int i = 0; i < s->n_pos; i++) json_array_append_new(pos, json_real(s->per_position[i]));
    json_object_set_new(result, "spec_decode_per_position_acceptance_rates", pos);
}
