/*
 * beam_driver.c — use_beam_search in the server: the search of engine/beam_search.h run over the
 * engine group, whose loops deliver each step request's events on their own threads.
 *
 * Locking: a driver's state is under its mutex, which is never held while the caller's callback runs
 * (the callback writes to the HTTP connection, whose lock an abort may hold while it takes this one).
 * Submitting and aborting engine requests under it is fine: the engine loops take only their own
 * locks there and deliver events outside them.
 */
#include "server/beam_driver.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static cv_request_event *event_new(const int32_t *prompt, size_t n_prompt, int32_t n_outputs) {
    cv_request_event *ev = cv_xcalloc(1, sizeof *ev);
    ev->outputs = cv_xcalloc(n_outputs ? (size_t)n_outputs : 1, sizeof *ev->outputs);
    ev->n_outputs = n_outputs;
    ev->prompt_token_ids = cv_xmalloc((n_prompt ? n_prompt : 1) * sizeof *ev->prompt_token_ids);
    if (n_prompt) memcpy(ev->prompt_token_ids, prompt, n_prompt * sizeof *prompt);
    ev->n_prompt_token_ids = n_prompt;
    ev->finished = true;
    return ev;
}

cv_request_event *cv_beam_result_event(const cv_beam_search *bs, const cvllm_tokenizer *tok, const int32_t *prompt) {
    const cv_beam_config *cfg = cv_beam_search_config(bs);
    const cv_beam_hyp **best = cv_xmalloc((size_t)cfg->width * sizeof *best);
    const int32_t n_out = (int32_t)cv_beam_search_best(bs, prompt, best);
    cv_request_event *ev = event_new(prompt, cfg->n_prompt, n_out);
    for (int32_t i = 0; i < n_out; i++) {
        const cv_beam_hyp *h = best[i];
        cv_completion_delta *d = &ev->outputs[i];
        d->index = i;
        d->n_token_ids = h->n;
        d->token_ids = cv_xmalloc((h->n ? h->n : 1) * sizeof *d->token_ids);
        if (h->n) memcpy(d->token_ids, h->tokens, h->n * sizeof *h->tokens);
        d->n_total_tokens = h->n;
        d->text = cv_beam_hyp_text(bs, h, tok);
        d->text_len = strlen(d->text);
        d->finish_reason = h->eos ? CVLLM_FINISH_STOP : CVLLM_FINISH_LENGTH;
        d->stop_token_id = h->eos ? cfg->eos_token_id : -1; /* vLLM's stop_reason of an eos-finished beam */
        d->logprobs = cv_beam_hyp_logprobs(h);
    }
    free(best);
    return ev;
}

/* ---- the driver ------------------------------------------------------------------------------- */

typedef struct step_slot {
    cv_beam_driver *d;
    size_t beam;
} step_slot;

struct cv_beam_driver {
    pthread_mutex_t mu;
    cv_engine_group *group;
    const cvllm_tokenizer *tok;
    cv_beam_search *bs;
    int32_t *prompt;              /* cv_beam_search_config(bs)->n_prompt ids */
    char *cache_salt, *lora_name; /* the prompt's, copied */
    double arrival;               /* the first step's (the HTTP request's); later steps arrive when submitted,
                                   * so that their TTFT and queue time in /metrics are their own */
    cv_event_fn done;
    void *user;
    cvllm_sampling_params params; /* of every step request */
    /* the step in flight: one request a live beam */
    step_slot *slots;             /* [width] */
    uint64_t *ids;                /* [width] */
    bool *open;                   /* [width]: submitted, final event not yet in */
    cvllm_position_logprobs *results; /* [width]: each beam's position, its top copied */
    bool *have;                   /* [width]: results[i] is set */
    size_t n_step, n_open;
    cvllm_finish_reason failure;  /* ABORT or ERROR once a step request ended so, or an abort came */
    size_t n_cached_tokens;       /* the first step's */
    bool first_step;
    int submit_rc;                /* of the last refused submit */
};

static void on_step_event(void *user, cv_request_event *ev);

static void clear_results(cv_beam_driver *d) {
    for (size_t i = 0; i < d->n_step; i++)
        if (d->have[i]) cv_beam_result_free(&d->results[i]);
    memset(d->have, 0, (size_t)cv_beam_search_config(d->bs)->width * sizeof *d->have);
}

/* Submits one request a live beam; the caller holds d->mu. Returns how many are in. A refused
 * submit is a failure of the search (the engine is stopping, or it refused the prompt). */
static size_t submit_step(cv_beam_driver *d) {
    const cv_beam_config *cfg = cv_beam_search_config(d->bs);
    clear_results(d);
    d->n_step = cv_beam_search_live(d->bs);
    int32_t *ids = cv_xmalloc((cfg->n_prompt + (size_t)cfg->max_tokens + 1) * sizeof *ids);
    memcpy(ids, d->prompt, cfg->n_prompt * sizeof *ids);
    for (size_t i = 0; i < d->n_step && d->failure == CVLLM_FINISH_NONE; i++) {
        size_t n;
        const int32_t *tokens = cv_beam_search_tokens(d->bs, i, &n);
        if (n) memcpy(ids + cfg->n_prompt, tokens, n * sizeof *ids);
        cvllm_prompt prompt = {.token_ids = ids, .n_token_ids = cfg->n_prompt + n, .cache_salt = d->cache_salt,
                               .lora_name = d->lora_name};
        d->slots[i] = (step_slot){d, i};
        const cv_submit sub = {.prompt = &prompt, .params = &d->params, .on_event = on_step_event,
                               .user = &d->slots[i], .arrival_time = d->first_step ? d->arrival : 0};
        d->submit_rc = cv_engine_group_submit(d->group, &sub, &d->ids[i]);
        if (d->submit_rc != 0) {
            d->failure = CVLLM_FINISH_ERROR;
            break;
        }
        d->open[i] = true;
        d->n_open++;
    }
    free(ids);
    return d->n_open;
}

/* Every choice finished `reason`, no tokens: a step request failed or the search was aborted. */
static cv_request_event *failure_event(const cv_beam_driver *d) {
    const cv_beam_config *cfg = cv_beam_search_config(d->bs);
    cv_request_event *ev = event_new(d->prompt, cfg->n_prompt, cfg->width);
    for (int32_t i = 0; i < ev->n_outputs; i++) {
        ev->outputs[i].index = i;
        ev->outputs[i].text = cv_xstrdup("");
        ev->outputs[i].finish_reason = d->failure;
        ev->outputs[i].stop_token_id = -1;
    }
    return ev;
}

/* The step is complete (no request open): folds it in and submits the next, or returns the final
 * event. The caller holds d->mu. */
static cv_request_event *advance(cv_beam_driver *d) {
    for (;;) {
        if (d->failure != CVLLM_FINISH_NONE) return failure_event(d);
        cv_beam_search_step(d->bs, d->results);
        d->first_step = false;
        if (cv_beam_search_live(d->bs) == 0) {
            cv_request_event *ev = cv_beam_result_event(d->bs, d->tok, d->prompt);
            ev->n_cached_tokens = d->n_cached_tokens;
            return ev;
        }
        submit_step(d);
        if (d->n_open == 0) continue; /* nothing went in: the failure above */
        if (d->failure != CVLLM_FINISH_NONE) /* some went in: they end early, then the failure is reported */
            for (size_t i = 0; i < d->n_step; i++)
                if (d->open[i]) cv_engine_group_abort(d->group, d->ids[i]);
        return NULL;
    }
}

static void on_step_event(void *user, cv_request_event *ev) {
    const step_slot *slot = user;
    cv_beam_driver *d = slot->d;
    const size_t i = slot->beam;
    cv_request_event *final = NULL;
    pthread_mutex_lock(&d->mu);
    assert(i < d->n_step && d->open[i]);
    if (d->first_step && ev->n_cached_tokens > d->n_cached_tokens) d->n_cached_tokens = ev->n_cached_tokens;
    cvllm_finish_reason finish = CVLLM_FINISH_NONE;
    for (int32_t k = 0; k < ev->n_outputs; k++) {
        const cv_completion_delta *o = &ev->outputs[k];
        if (o->n_token_ids > 0 && o->logprobs && !d->have[i]) {
            d->results[i] = cv_beam_result_copy(&o->logprobs[0]);
            d->have[i] = true;
        }
        if (o->finish_reason != CVLLM_FINISH_NONE) finish = o->finish_reason;
    }
    if (ev->finished) {
        d->open[i] = false;
        d->n_open--;
        if (d->failure == CVLLM_FINISH_NONE && (finish == CVLLM_FINISH_ABORT || finish == CVLLM_FINISH_ERROR || !d->have[i]))
            d->failure = finish == CVLLM_FINISH_ABORT ? CVLLM_FINISH_ABORT : CVLLM_FINISH_ERROR;
        if (d->n_open == 0) final = advance(d);
    }
    pthread_mutex_unlock(&d->mu);
    cv_request_event_free(ev);
    if (final) d->done(d->user, final);
}

cv_beam_driver *cv_beam_driver_start(cv_engine_group *group, const cvllm_tokenizer *tok, const cv_beam_config *cfg,
                                     const cvllm_prompt *prompt, double arrival, cv_event_fn done, void *user, int *rc) {
    assert(prompt->token_ids && prompt->n_token_ids == cfg->n_prompt);
    cv_beam_driver *d = cv_xcalloc(1, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    d->group = group;
    d->tok = tok;
    d->bs = cv_beam_search_new(cfg);
    d->prompt = cv_xmalloc((cfg->n_prompt ? cfg->n_prompt : 1) * sizeof *d->prompt);
    if (cfg->n_prompt) memcpy(d->prompt, prompt->token_ids, cfg->n_prompt * sizeof *d->prompt);
    d->cache_salt = prompt->cache_salt ? cv_xstrdup(prompt->cache_salt) : NULL;
    d->lora_name = prompt->lora_name ? cv_xstrdup(prompt->lora_name) : NULL;
    d->arrival = arrival;
    d->done = done;
    d->user = user;
    d->first_step = true;
    cv_beam_step_params(cv_engine_group_engine(group), d->bs, &d->params);
    const size_t w = (size_t)cfg->width;
    d->slots = cv_xcalloc(w, sizeof *d->slots);
    d->ids = cv_xcalloc(w, sizeof *d->ids);
    d->open = cv_xcalloc(w, sizeof *d->open);
    d->results = cv_xcalloc(w, sizeof *d->results);
    d->have = cv_xcalloc(w, sizeof *d->have);
    pthread_mutex_lock(&d->mu);
    const size_t in = cv_beam_search_live(d->bs) ? submit_step(d) : 0;
    pthread_mutex_unlock(&d->mu);
    if (in == 0) { /* nothing is open, so no event will come */
        *rc = d->submit_rc ? d->submit_rc : cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "beam search needs max_tokens >= 1");
        cv_beam_driver_free(d);
        return NULL;
    }
    return d;
}

void cv_beam_driver_abort(cv_beam_driver *d) {
    pthread_mutex_lock(&d->mu);
    if (d->failure == CVLLM_FINISH_NONE) d->failure = CVLLM_FINISH_ABORT;
    for (size_t i = 0; i < d->n_step; i++)
        if (d->open[i]) cv_engine_group_abort(d->group, d->ids[i]);
    pthread_mutex_unlock(&d->mu);
}

void cv_beam_driver_free(cv_beam_driver *d) {
    if (!d) return;
    clear_results(d);
    cv_beam_search_free(d->bs);
    free(d->prompt);
    free(d->cache_salt);
    free(d->lora_name);
    free(d->slots);
    free(d->ids);
    free(d->open);
    free(d->results);
    free(d->have);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
