/*
 * sonnet.c — vLLM's SonnetDataset (vllm/benchmarks/datasets.py), its arithmetic kept: the mean token
 * count of a line (each line with its newline, counted as the tokenizer's __call__ counts it), the
 * token count of the chat template's rendering of the bare instruction (base_offset), then
 * round((input_len − base_offset) / mean) lines a prompt, of which the first
 * max(round((prefix_len − base_offset) / mean), 0) are the file's own first lines, shared by every
 * prompt, and the rest drawn with random.choices. Python rounds halves to even, as rint() does in
 * the default rounding mode. vLLM draws again until a prompt fits input_len, forever if none can;
 * here the draws stop after a bound with an error that says so.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bench/dataset.h"
#include "bench/pyrandom.h"
#include "chat/chat.h"

enum { DRAWS_PER_PROMPT = 100 };

static const char BASE_PROMPT[] = "Pick as many lines as you can from these poem lines:\n";

/* The file's lines, each with its newline (Python's readlines). */
static int read_lines(const char *path, char ***lines, size_t *n) {
    *lines = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return cv_fail(CVLLM_ERR_IO, "sonnet dataset %s: cannot open it", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) >= 0) {
        *lines = cv_xrealloc(*lines, (*n + 1) * sizeof **lines);
        (*lines)[(*n)++] = cv_xstrndup(line, (size_t)got);
    }
    free(line);
    fclose(f);
    return *n ? 0 : cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "sonnet dataset %s: no line in it", path);
}

static int count_tokens(const cvllm_tokenizer *tok, const char *text, size_t *n) {
    int32_t *ids = NULL;
    const int rc = cv_bench_encode(tok, text, &ids, n);
    cvllm_free(ids);
    return rc;
}

/* BASE_PROMPT, the prefix lines, then `k` lines drawn with random.choices. */
static char *draw_prompt(cv_pyrandom *r, char **lines, size_t n_lines, size_t n_prefix, size_t k) {
    size_t len = strlen(BASE_PROMPT), cap = len + 1;
    char *p = cv_xmalloc(cap);
    memcpy(p, BASE_PROMPT, len + 1);
    for (size_t i = 0; i < n_prefix + k; i++) {
        const char *line = i < n_prefix ? lines[i] : lines[cv_pyrandom_choice(r, n_lines)];
        const size_t n = strlen(line);
        if (len + n + 1 > cap) {
            cap = 2 * (len + n + 1);
            p = cv_xrealloc(p, cap);
        }
        memcpy(p + len, line, n + 1);
        len += n;
    }
    return p;
}

int cv_sonnet_dataset(const cvllm_tokenizer *tok, const cv_sonnet_options *o, cv_bench_sample **out) {
    *out = NULL;
    char **lines = NULL;
    size_t n_lines = 0, total = 0, base_offset = 0;
    cv_chat_template *tmpl = NULL;
    char *base = NULL;
    int rc = read_lines(o->path, &lines, &n_lines);
    for (size_t i = 0; i < n_lines && !rc; i++) {
        size_t n;
        rc = count_tokens(tok, lines[i], &n);
        total += n;
    }
    if (!rc && (rc = cv_bench_chat_template(o->model, &tmpl)))
        cv_fail_prefix(rc, "sonnet dataset (vLLM's needs the model's chat template)");
    if (!rc) rc = cv_bench_chat_text(tmpl, BASE_PROMPT, &base);
    if (!rc) rc = count_tokens(tok, base, &base_offset);
    if (!rc && o->input_len <= (int64_t)base_offset)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "'input_len' must be higher than the base prompt length (%zu).",
                     base_offset);
    cv_bench_sample *s = cv_xcalloc((size_t)o->num_prompts, sizeof *s);
    size_t got = 0;
    if (!rc) {
        const double mean = (double)total / (double)n_lines;
        const double input_lines = rint(((double)o->input_len - (double)base_offset) / mean);
        const double prefix_lines = fmax(rint(((double)o->prefix_len - (double)base_offset) / mean), 0.0);
        const size_t n_prefix = prefix_lines < (double)n_lines ? (size_t)prefix_lines : n_lines; /* data[:k] */
        const size_t k = input_lines > prefix_lines ? (size_t)(input_lines - prefix_lines) : 0;
        cv_pyrandom r;
        cv_pyrandom_seed(&r, o->seed);
        for (size_t draw = 0; got < (size_t)o->num_prompts && !rc; draw++) {
            if (draw == (size_t)o->num_prompts * DRAWS_PER_PROMPT) {
                rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "sonnet dataset: %zu of %d prompts fit --sonnet-input-len %d "
                             "after %zu draws; raise it", got, o->num_prompts, o->input_len, draw);
                break;
            }
            char *prompt = draw_prompt(&r, lines, n_lines, n_prefix, k), *formatted = NULL;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            rc = cv_bench_chat_text(tmpl, prompt, &formatted);
            if (!rc) rc = cv_bench_encode(tok, formatted, &ids, &n_ids);
            if (!rc && n_ids <= (size_t)o->input_len) {
                char **sent = o->chat_endpoint ? &prompt : &formatted;
                cv_bench_sample_take(&s[got++], *sent, ids, n_ids, o->output_len);
                *sent = NULL;
            }
            cvllm_free(ids);
            free(formatted);
            free(prompt);
        }
    }
    for (size_t i = 0; i < n_lines; i++) free(lines[i]);
    free(lines);
    free(base);
    cv_chat_template_free(tmpl);
    if (rc) {
        cv_bench_samples_free(s, (size_t)o->num_prompts);
        return rc;
    }
    *out = s;
    return 0;
}
