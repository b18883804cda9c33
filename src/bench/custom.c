/*
 * custom.c — vLLM's CustomDataset (vllm/benchmarks/datasets.py): prompts of one's own, a JSON object
 * {"prompt": text} a line of a .jsonl file (other keys are kept by vLLM and unused, so ignored here),
 * sampled as the other file datasets are (cv_file_sampling: Python's shuffle, num_prompts taken,
 * random.choices to fill up). Unless --skip-chat-template, each prompt becomes the user message of
 * the model's chat template, rendered with the generation prompt as transformers'
 * apply_chat_template(tokenize=False) renders it, and that text is what the request sends; its
 * token count (special tokens added as the tokenizer's __call__ adds them) is the prompt length.
 *
 * vLLM's SpecBench, Spec-Bench's question.jsonl, is the same with the first of each line's "turns" as
 * the prompt, the lines of one "category" only when one is given.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bench/dataset.h"
#include "bench/pyrandom.h"
#include "chat/chat.h"
#include "loader/resolve.h"

/* A line's prompt: "prompt", or for Spec-Bench the first of "turns" when the line is of the category
 * asked (*skip otherwise). NULL when the line has none. */
static const json_t *line_prompt(const cv_custom_options *o, const json_t *row, bool *skip) {
    *skip = false;
    if (!o->spec_bench) return json_object_get(row, "prompt");
    const char *category = json_string_value(json_object_get(row, "category"));
    *skip = o->category && (!category || strcmp(category, o->category));
    return json_array_get(json_object_get(row, "turns"), 0);
}

/* The prompts of the file's lines, in file order (*n of them; blank lines skipped). */
static int read_prompts(const cv_custom_options *o, char ***prompts, size_t *n) {
    *prompts = NULL;
    *n = 0;
    const char *path = o->from.path, *what = o->spec_bench ? "spec_bench" : "custom";
    const size_t len = strlen(path);
    if (!o->spec_bench && (len < 6 || strcmp(path + len - 6, ".jsonl")))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "custom dataset %s: Only JSONL format is supported for CustomDataset.",
                       path);
    FILE *f = fopen(path, "r");
    if (!f) return cv_fail(CVLLM_ERR_IO, "%s dataset %s: cannot open it", what, path);
    char *line = NULL;
    size_t cap = 0, line_no = 0;
    ssize_t got;
    int rc = 0;
    while (!rc && (got = getline(&line, &cap, f)) >= 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == (size_t)got) continue;
        json_error_t err;
        json_t *row = json_loadb(line, (size_t)got, 0, &err);
        bool skip;
        const json_t *prompt = line_prompt(o, row, &skip);
        if (!row)
            rc = cv_fail(CVLLM_ERR_FORMAT, "%s dataset %s line %zu: %s", what, path, line_no, err.text);
        else if (!json_is_string(prompt))
            rc = cv_fail(CVLLM_ERR_FORMAT, "%s dataset %s line %zu: JSONL file must contain a '%s' column (%s on every "
                         "line).", what, path, line_no, o->spec_bench ? "turns" : "prompt",
                         o->spec_bench ? "a list of strings" : "a string");
        else if (!skip) {
            *prompts = cv_xrealloc(*prompts, (*n + 1) * sizeof **prompts);
            (*prompts)[(*n)++] = cv_xstrndup(json_string_value(prompt), json_string_length(prompt));
        }
        json_decref(row);
    }
    free(line);
    fclose(f);
    if (!rc && *n == 0)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%s dataset %s: no prompt in it%s%s", what, path,
                     o->category ? " of category " : "", o->category ? o->category : "");
    return rc;
}

int cv_bench_chat_text(const cv_chat_template *tmpl, const char *prompt, char **text) {
    if (!tmpl) {
        *text = cv_xstrdup(prompt);
        return 0;
    }
    json_t *messages = json_pack("[{s:s, s:s}]", "role", "user", "content", prompt);
    const cv_chat_request req = {.messages = messages, .add_generation_prompt = true};
    const int rc = cv_chat_render(tmpl, &req, text, NULL);
    json_decref(messages);
    return rc;
}

int cv_bench_chat_template(const char *model, cv_chat_template **out) {
    char *dir = NULL;
    int rc = cv_resolve_model(model, NULL, false, &dir);
    if (!rc) rc = cv_chat_template_load(dir, NULL, out);
    free(dir);
    if (rc) cv_fail_prefix(rc, "the chat template of %s", model);
    return rc;
}

int cv_bench_encode(const cvllm_tokenizer *tok, const char *text, int32_t **ids, size_t *n) {
    int rc = cvllm_tokenize(tok, text, strlen(text), ids, n);
    if (!rc) rc = cvllm_tokenizer_add_special_tokens(tok, ids, n);
    return rc;
}

int cv_custom_dataset(const cvllm_tokenizer *tok, const cv_custom_options *o, cv_bench_sample **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (o->output_len < 1)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%s dataset: the output length must be at least 1, got %d",
                       o->spec_bench ? "spec_bench" : "custom", o->output_len);
    char **prompts;
    size_t n;
    int rc = read_prompts(o, &prompts, &n);
    cv_chat_template *tmpl = NULL;
    if (!rc && !o->skip_chat_template && (rc = cv_bench_chat_template(o->model, &tmpl)))
        cv_fail_prefix(rc, "%s dataset (--skip-chat-template sends the prompts as they are)",
                       o->spec_bench ? "spec_bench" : "custom");
    size_t *order = cv_xmalloc((n ? n : 1) * sizeof *order);
    for (size_t i = 0; i < n; i++) order[i] = i;
    if (!o->from.disable_shuffle) {
        cv_pyrandom r;
        cv_pyrandom_seed(&r, o->from.seed);
        cv_pyrandom_shuffle(&r, order, n);
    }
    const size_t want = (size_t)o->from.num_prompts, take = n < want ? n : want;
    cv_bench_sample *s = cv_xcalloc(want ? want : 1, sizeof *s);
    for (size_t i = 0; i < take && !rc; i++) {
        char *text = NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        rc = cv_bench_chat_text(tmpl, prompts[order[i]], &text);
        if (!rc) rc = cv_bench_encode(tok, text, &ids, &n_ids);
        if (!rc) cv_bench_sample_take(&s[i], text, ids, n_ids, o->output_len);
        else free(text);
        cvllm_free(ids);
    }
    for (size_t i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    free(order);
    cv_chat_template_free(tmpl);
    if (rc) {
        cv_bench_samples_free(s, want);
        return rc;
    }
    *out = s;
    *n_out = cv_bench_oversample(&o->from, s, take);
    return 0;
}
