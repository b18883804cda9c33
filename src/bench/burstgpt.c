/*
 * burstgpt.c — vLLM's BurstGPTDataset (vllm/benchmarks/datasets.py): the request and response token
 * counts of the BurstGPT trace (a CSV of Azure OpenAI calls: Timestamp, Model, Request tokens,
 * Response tokens, Total tokens, Log Type), GPT-4's successful rows only, num_prompts of them drawn
 * (without replacement while there are enough rows, with it otherwise). Request i's prompt is
 * synthetic, as vLLM makes it: the ids (i + j) mod the vocabulary for j below its request tokens,
 * decoded, with that count as its length; its output length is the row's response tokens. The ids
 * walk the tokenizer's ordinary tokens (its special tokens left out, which would end or frame the
 * prompt), below the model's vocabulary when that is smaller. The draw is cvllm's generator seeded
 * with --seed, not pandas' (the same rows' distribution, not the same rows).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "bench/dataset.h"
#include "tokenizer/tokenizer.h"

/* Column `name`'s index in the CSV header line, or -1. */
static int column(const char *header, const char *name) {
    int k = 0;
    for (const char *p = header; *p; k++) {
        const size_t len = strcspn(p, ",\r\n");
        if (len == strlen(name) && !strncmp(p, name, len)) return k;
        p += len;
        if (*p != ',') break;
        p++;
    }
    return -1;
}

/* Field k of a CSV line (no quoting: the trace has none), copied into out. */
static bool field(const char *line, int k, char *out, size_t cap) {
    const char *p = line;
    for (int i = 0; i < k; i++) {
        p = strchr(p, ',');
        if (!p) return false;
        p++;
    }
    const size_t len = strcspn(p, ",\r\n");
    snprintf(out, cap, "%.*s", (int)(len < cap ? len : cap - 1), p);
    return true;
}

/* The GPT-4 rows with a response: their request and response token counts. */
static int read_rows(const char *path, int32_t **in, int32_t **out, size_t *n) {
    *in = *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return cv_fail(CVLLM_ERR_IO, "burstgpt dataset %s: cannot open it", path);
    char *line = NULL;
    size_t cap = 0, rows_cap = 0;
    int rc = 0, model = -1, request = -1, response = -1;
    if (getline(&line, &cap, f) >= 0) {
        model = column(line, "Model");
        request = column(line, "Request tokens");
        response = column(line, "Response tokens");
    }
    if (model < 0 || request < 0 || response < 0)
        rc = cv_fail(CVLLM_ERR_FORMAT, "burstgpt dataset %s: the header lacks a Model, Request tokens or Response "
                     "tokens column", path);
    for (size_t line_no = 2; !rc && getline(&line, &cap, f) >= 0; line_no++) {
        char name[64], req[32], resp[32], *end_req, *end_resp;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        if (!field(line, model, name, sizeof name) || !field(line, request, req, sizeof req) ||
            !field(line, response, resp, sizeof resp)) {
            rc = cv_fail(CVLLM_ERR_FORMAT, "burstgpt dataset %s line %zu: fewer fields than the header", path, line_no);
            break;
        }
        const double r_in = strtod(req, &end_req), r_out = strtod(resp, &end_resp);
        if (end_req == req || end_resp == resp || r_in < 0 || r_in > 1e7 || r_out > 1e7) {
            rc = cv_fail(CVLLM_ERR_FORMAT, "burstgpt dataset %s line %zu: token counts '%s' and '%s' are not counts",
                         path, line_no, req, resp);
            break;
        }
        if (strcmp(name, "GPT-4") || r_out <= 0) continue; /* vLLM keeps GPT-4's successful calls */
        if (*n == rows_cap) {
            rows_cap = rows_cap ? 2 * rows_cap : 256;
            *in = cv_xrealloc(*in, rows_cap * sizeof **in);
            *out = cv_xrealloc(*out, rows_cap * sizeof **out);
        }
        (*in)[*n] = (int32_t)r_in;
        (*out)[(*n)++] = (int32_t)r_out;
    }
    free(line);
    fclose(f);
    if (!rc && *n == 0) rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "burstgpt dataset %s: no GPT-4 row with a response", path);
    return rc;
}

int cv_burstgpt_dataset(const cvllm_tokenizer *tok, const cv_burstgpt_options *o, cv_bench_sample **out) {
    *out = NULL;
    int32_t *in_lens, *out_lens;
    size_t n_rows;
    int rc = read_rows(o->path, &in_lens, &out_lens, &n_rows);
    if (rc) return rc;
    const cv_tokenizer *t = (const cv_tokenizer *)tok; /* the public handle is the internal object */
    const int32_t vocab = cvllm_tokenizer_vocab_size(tok);
    const int32_t limit = o->vocab_limit > 0 && o->vocab_limit < vocab ? o->vocab_limit : vocab;
    int32_t *ordinary = cv_xmalloc((size_t)limit * sizeof *ordinary), n_ordinary = 0;
    for (int32_t id = 0; id < limit; id++)
        if (!cv_tokenizer_is_special(t, id)) ordinary[n_ordinary++] = id;
    if (n_ordinary == 0) rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "burstgpt dataset: the vocabulary has no ordinary token");
    /* the rows drawn: a partial Fisher-Yates shuffle while there are enough, else independent draws */
    const size_t want = (size_t)o->num_prompts;
    size_t *rows = cv_xmalloc((n_rows > want ? n_rows : want) * sizeof *rows);
    cv_rng rng;
    cv_rng_seed(&rng, o->seed);
    for (size_t i = 0; i < n_rows; i++) rows[i] = i;
    for (size_t i = 0; i < want; i++) {
        if (want <= n_rows) {
            const size_t j = i + (size_t)(cv_rng_next(&rng) % (n_rows - i));
            const size_t swap = rows[i];
            rows[i] = rows[j];
            rows[j] = swap;
        } else {
            rows[i] = (size_t)(cv_rng_next(&rng) % n_rows);
        }
    }
    cv_bench_sample *s = cv_xcalloc(want, sizeof *s);
    for (size_t i = 0; i < want && !rc; i++) {
        const size_t len = (size_t)in_lens[rows[i]];
        int32_t *ids = cv_xmalloc((len + 1) * sizeof *ids);
        for (size_t j = 0; j < len; j++) ids[j] = ordinary[(i + j) % (size_t)n_ordinary];
        char *text = NULL;
        rc = cvllm_detokenize(tok, ids, len, false, &text);
        if (!rc) cv_bench_sample_take(&s[i], cv_xstrdup(text), ids, len, out_lens[rows[i]]);
        cvllm_free(text);
        free(ids);
    }
    free(rows);
    free(ordinary);
    free(in_lens);
    free(out_lens);
    if (rc) {
        cv_bench_samples_free(s, want);
        return rc;
    }
    *out = s;
    return 0;
}
