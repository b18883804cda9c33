/*
 * request.c — creation and teardown of requests; small sequence helpers. See request.h.
 */
#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/grammar_cache.h"

static int32_t *copy_ids(const int32_t *ids, size_t n) {
    int32_t *c = cv_xmalloc((n ? n : 1) * sizeof *c);
    if (n) memcpy(c, ids, n * sizeof *c);
    return c;
}

static void copy_stop_strings(cv_request *req, const cvllm_sampling_params *p) {
    req->stop = cv_xcalloc(p->n_stop ? p->n_stop : 1, sizeof *req->stop);
    for (size_t i = 0; i < p->n_stop; i++) {
        req->stop[i] = cv_xstrdup(p->stop[i]);
        size_t len = strlen(p->stop[i]);
        if (len > req->max_stop_len) req->max_stop_len = len;
    }
    req->params.stop = (const char *const *)req->stop;
}

static int compare_ids(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The sampler fills the runs between allowed ids, so it wants them ascending and once each. */
static void copy_allowed_ids(cv_request *req, const cvllm_sampling_params *p) {
    if (!p->allowed_token_ids) return;
    req->allowed_ids = copy_ids(p->allowed_token_ids, p->n_allowed_token_ids);
    qsort(req->allowed_ids, p->n_allowed_token_ids, sizeof *req->allowed_ids, compare_ids);
    for (size_t i = 0; i < p->n_allowed_token_ids; i++)
        if (!req->n_allowed || req->allowed_ids[req->n_allowed - 1] != req->allowed_ids[i])
            req->allowed_ids[req->n_allowed++] = req->allowed_ids[i];
    req->params.allowed_token_ids = req->allowed_ids;
    req->params.n_allowed_token_ids = req->n_allowed;
}

/* min_tokens masks every id that would end the request: eos (unless ignored) and stop_token_ids. */
static void build_stop_ids(cv_request *req, const int32_t *eos, size_t n_eos) {
    const cvllm_sampling_params *p = &req->params;
    req->n_eos_ids = p->ignore_eos ? 0 : n_eos;
    req->eos_ids = copy_ids(eos, req->n_eos_ids);
    req->stop_ids = cv_xmalloc((req->n_eos_ids + p->n_stop_token_ids + 1) * sizeof(int32_t));
    req->n_stop_ids = 0;
    for (size_t i = 0; i < req->n_eos_ids; i++) req->stop_ids[req->n_stop_ids++] = eos[i];
    for (size_t i = 0; i < p->n_stop_token_ids; i++) req->stop_ids[req->n_stop_ids++] = p->stop_token_ids[i];
}

static void fill_sampler_params(cv_request *req) {
    const cvllm_sampling_params *p = &req->params;
    req->sampler_params = (cv_sampler_params){
        .temperature = p->temperature,
        .top_p = p->top_p,
        .top_k = p->top_k,
        .min_p = p->min_p,
        .repetition_penalty = p->repetition_penalty,
        .presence_penalty = p->presence_penalty,
        .frequency_penalty = p->frequency_penalty,
        .min_tokens = p->min_tokens,
        .stop_ids = req->stop_ids,
        .n_stop_ids = req->n_stop_ids,
        .bias_ids = req->bias_ids,
        .bias_values = req->bias_values,
        .n_bias = p->n_logit_bias,
        .allowed_ids = req->allowed_ids,
        .n_allowed = req->n_allowed,
        .bad_words = req->bad_words.n ? &req->bad_words : NULL,
        .logprobs = p->logprobs,
    };
}

cv_request *cv_request_create(uint64_t id, const int32_t *prompt, size_t n_prompt, const char *cache_salt,
                              const cvllm_sampling_params *params, int32_t max_tokens,
                              const int32_t *eos, size_t n_eos, cv_token_seqs *bad_words) {
    cv_request *req = cv_xcalloc(1, sizeof *req);
    req->id = id;
    req->cache_salt = cache_salt ? cv_xstrdup(cache_salt) : NULL;
    req->params = *params;
    req->max_tokens = max_tokens;
    req->prompt = copy_ids(prompt, n_prompt);
    req->n_prompt = n_prompt;
    req->stop_token_ids = copy_ids(params->stop_token_ids, params->n_stop_token_ids);
    req->params.stop_token_ids = req->stop_token_ids;
    copy_stop_strings(req, params);
    req->bias_ids = copy_ids(params->logit_bias_ids, params->n_logit_bias);
    req->bias_values = cv_xmalloc((params->n_logit_bias + 1) * sizeof(float));
    if (params->n_logit_bias)
        memcpy(req->bias_values, params->logit_bias_values, params->n_logit_bias * sizeof(float));
    req->params.logit_bias_ids = req->bias_ids;
    req->params.logit_bias_values = req->bias_values;
    copy_allowed_ids(req, params);
    if (params->grammar) req->grammar = cv_grammar_retain(params->grammar);
    if (bad_words) {
        req->bad_words = *bad_words;
        *bad_words = (cv_token_seqs){0};
    }
    req->params.bad_words = NULL;
    req->params.n_bad_words = 0;
    build_stop_ids(req, eos, n_eos);
    fill_sampler_params(req);
    if (cv_request_wants_prompt_logprobs(req))
        req->prompt_logprobs = cv_xcalloc(n_prompt, sizeof *req->prompt_logprobs);

    req->n_seqs = params->n;
    req->seqs = cv_xcalloc((size_t)req->n_seqs, sizeof *req->seqs);
    req->outs = cv_xcalloc((size_t)req->n_seqs, sizeof *req->outs);
    for (int32_t i = 0; i < req->n_seqs; i++) {
        cv_seq *s = &req->seqs[i];
        s->req = req;
        s->index = i;
        s->status = CV_SEQ_WAITING;
        s->cap_tokens = n_prompt + 16;
        s->tokens = cv_xmalloc(s->cap_tokens * sizeof *s->tokens);
        memcpy(s->tokens, prompt, n_prompt * sizeof *prompt);
        s->n_tokens = n_prompt;
        s->text = cv_xcalloc(1, 1);
        s->text_cap = 1;
        s->out.stop_token_id = -1;
        s->state_slot = -1;
        s->restore_slot = -1;
    }
    return req;
}

void cv_free_position_logprobs(cvllm_position_logprobs *lp, size_t n) {
    if (!lp) return;
    for (size_t i = 0; i < n; i++) free((void *)lp[i].top);
    free(lp);
}

void cv_token_seqs_free(cv_token_seqs *seqs) {
    free(seqs->ids);
    free(seqs->starts);
    *seqs = (cv_token_seqs){0};
}

void cv_request_free(cv_request *req) {
    if (!req) return;
    for (int32_t i = 0; i < req->n_seqs; i++) {
        cv_seq *s = &req->seqs[i];
        free(s->tokens);
        free(s->block_table);
        free(s->text);
        free(s->block_hashes);
        cv_sampler_state_free(&s->sampler);
        cv_detok_free(&s->detok);
        cv_free_position_logprobs(s->logprobs, cv_seq_num_output(s));
    }
    cv_free_position_logprobs(req->prompt_logprobs, req->n_prompt);
    cv_lora_entry_release(req->lora);
    for (size_t i = 0; i < req->params.n_stop; i++) free(req->stop[i]);
    free(req->stop);
    free(req->stop_token_ids);
    free(req->bias_ids);
    free(req->bias_values);
    free(req->allowed_ids);
    cvllm_grammar_release(req->grammar);
    cv_token_seqs_free(&req->bad_words);
    free(req->stop_ids);
    free(req->eos_ids);
    free(req->prompt);
    free(req->pooled);
    free(req->cache_salt);
    free(req->seqs);
    free(req->outs);
    free(req);
}

void cv_seq_append_token(cv_seq *seq, int32_t token) {
    if (seq->n_tokens == seq->cap_tokens) {
        seq->cap_tokens *= 2;
        seq->tokens = cv_xrealloc(seq->tokens, seq->cap_tokens * sizeof *seq->tokens);
        if (seq->req->params.logprobs >= 0)
            seq->logprobs = cv_xrealloc(seq->logprobs, seq->cap_tokens * sizeof *seq->logprobs);
    }
    if (seq->req->params.logprobs >= 0 && !seq->logprobs)
        seq->logprobs = cv_xmalloc(seq->cap_tokens * sizeof *seq->logprobs);
    seq->tokens[seq->n_tokens++] = token;
}

int32_t cv_seq_blocks_needed(const cv_seq *seq, size_t n_tokens, int32_t block_size) {
    int32_t want = (int32_t)((n_tokens + (size_t)block_size - 1) / (size_t)block_size);
    return want > seq->n_blocks ? want - seq->n_blocks : 0;
}

void cv_seq_add_blocks(cv_seq *seq, const int32_t *ids, int32_t n) {
    if (seq->n_blocks + n > seq->cap_blocks) {
        seq->cap_blocks = (seq->n_blocks + n) * 2;
        seq->block_table = cv_xrealloc(seq->block_table, (size_t)seq->cap_blocks * sizeof(int32_t));
    }
    memcpy(seq->block_table + seq->n_blocks, ids, (size_t)n * sizeof(int32_t));
    seq->n_blocks += n;
}

size_t cv_seq_num_output(const cv_seq *seq) { return seq->n_tokens - seq->req->n_prompt; }

bool cv_request_wants_prompt_logprobs(const cv_request *req) { return req->params.prompt_logprobs >= 0; }
