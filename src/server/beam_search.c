/*
 * beam_search.c — vLLM's online beam search (its serving layer's beam_search): each step asks the
 * engine for one token of every live beam, as a request of its own whose prompt is the original
 * prompt followed by the beam's tokens, with the top 2 × width logprobs. The candidates of a step are
 * each beam's top entries and its sampled token; an eos candidate becomes a finished hypothesis, the
 * best `width` others by cumulative logprob become the next beams. After max_tokens steps (or when no
 * beam is left) the finished hypotheses and the live beams are ranked by cumulative logprob over
 * (prompt + output length) ** length_penalty and the best `width` are the choices.
 *
 * Why requests and not forked sequences inside the engine: it is how vLLM serves use_beam_search, so
 * the choices are the ones vLLM returns for the same logprobs; the engine stays unaware of beams; and
 * the prefix cache makes a step cost about one token a beam — a beam's prompt is the previous
 * step's prompt plus one token, so all of it but the last block's tail is found cached.
 *
 * A beam's positions keep the step's top entries (shared between the beams a step's result fed,
 * reference counted) only when the request asked for logprobs; the reply prints them as vLLM prints a
 * beam's per-step logprobs.
 *
 * Locking: a driver's state is under its mutex, which is never held while the caller's callback runs
 * (the callback writes to the HTTP connection, whose lock an abort may hold while it takes this one).
 * Submitting and aborting engine requests under it is fine: the engine loops take only their own
 * locks there and deliver events outside them.
 */
#include "server/beam_search.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* ---- the search ------------------------------------------------------------------------------- */

/* One step result's top entries, shared by the hypotheses that took a token from it. */
typedef struct step_top {
    int refs;
    cvllm_logprob *top;
    int32_t n_top;
} step_top;

typedef struct hyp {
    int32_t *tokens;       /* output tokens */
    size_t n;
    cvllm_logprob *chosen; /* per position, with logprobs asked */
    step_top **tops;       /* per position, with logprobs asked */
    double cum;
    bool eos;              /* finished by eos */
} hyp;

struct cv_beam_search {
    cv_beam_config cfg;
    hyp *live;
    size_t n_live;
    hyp *done;
    size_t n_done, cap_done;
    int32_t steps;
};

static void top_release(step_top *t) {
    if (t && --t->refs == 0) {
        free(t->top);
        free(t);
    }
}

static void hyp_free(hyp *h) {
    for (size_t i = 0; h->tops && i < h->n; i++) top_release(h->tops[i]);
    free(h->tokens);
    free(h->chosen);
    free(h->tops);
}

/* parent's positions, then `entry` from step result `top` (NULL: no logprobs) unless `add` is false */
static hyp hyp_extend(const hyp *parent, const cvllm_logprob *entry, step_top *top, bool add, bool eos) {
    const size_t n = parent->n + (add ? 1 : 0);
    hyp h = {.tokens = cv_xmalloc((n ? n : 1) * sizeof *h.tokens), .n = n, .cum = parent->cum + entry->logprob,
             .eos = eos};
    if (parent->n) memcpy(h.tokens, parent->tokens, parent->n * sizeof *h.tokens);
    if (add) h.tokens[parent->n] = entry->token_id;
    if (top) {
        h.chosen = cv_xmalloc((n ? n : 1) * sizeof *h.chosen);
        h.tops = cv_xmalloc((n ? n : 1) * sizeof *h.tops);
        if (parent->n) {
            memcpy(h.chosen, parent->chosen, parent->n * sizeof *h.chosen);
            memcpy(h.tops, parent->tops, parent->n * sizeof *h.tops);
        }
        for (size_t i = 0; i < parent->n; i++) h.tops[i]->refs++;
        if (add) {
            h.chosen[parent->n] = *entry;
            h.tops[parent->n] = top;
            top->refs++;
        }
    }
    return h;
}

cv_beam_search *cv_beam_search_new(const cv_beam_config *cfg) {
    assert(cfg->width >= 1 && cfg->max_tokens >= 0);
    cv_beam_search *bs = cv_xcalloc(1, sizeof *bs);
    bs->cfg = *cfg;
    bs->live = cv_xcalloc(1, sizeof *bs->live); /* the empty beam: the prompt alone */
    bs->live[0].tokens = cv_xmalloc(sizeof *bs->live[0].tokens);
    if (cfg->top_logprobs >= 0) {
        bs->live[0].chosen = cv_xmalloc(sizeof *bs->live[0].chosen);
        bs->live[0].tops = cv_xmalloc(sizeof *bs->live[0].tops);
    }
    bs->n_live = 1;
    return bs;
}

void cv_beam_search_free(cv_beam_search *bs) {
    if (!bs) return;
    for (size_t i = 0; i < bs->n_live; i++) hyp_free(&bs->live[i]);
    for (size_t i = 0; i < bs->n_done; i++) hyp_free(&bs->done[i]);
    free(bs->live);
    free(bs->done);
    free(bs);
}

int32_t cv_beam_search_step_logprobs(const cv_beam_search *bs) {
    const int32_t k = 2 * bs->cfg.width;
    return bs->cfg.top_logprobs > k ? bs->cfg.top_logprobs : k;
}

size_t cv_beam_search_live(const cv_beam_search *bs) { return bs->steps < bs->cfg.max_tokens ? bs->n_live : 0; }

const int32_t *cv_beam_search_tokens(const cv_beam_search *bs, size_t beam, size_t *n) {
    assert(beam < bs->n_live);
    *n = bs->live[beam].n;
    return bs->live[beam].tokens;
}

typedef struct candidate {
    double cum;
    size_t order; /* ties keep the order candidates were met in */
    size_t parent;
    cvllm_logprob entry;
    step_top *top;
} candidate;

static int by_cum(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->cum != y->cum) return x->cum > y->cum ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

void cv_beam_search_step(cv_beam_search *bs, const cvllm_position_logprobs *results) {
    const cv_beam_config *c = &bs->cfg;
    const int32_t k = 2 * c->width;
    assert(cv_beam_search_live(bs) > 0);
    candidate *cands = cv_xmalloc(bs->n_live * (size_t)(k + 1) * sizeof *cands);
    step_top **tops = cv_xcalloc(bs->n_live, sizeof *tops);
    size_t n_cands = 0;
    for (size_t i = 0; i < bs->n_live; i++) {
        const cvllm_position_logprobs *r = &results[i];
        const int32_t n_top = r->n_top < k ? r->n_top : k;
        if (c->top_logprobs >= 0) { /* the step's own reference, dropped below */
            tops[i] = cv_xmalloc(sizeof *tops[i]);
            *tops[i] = (step_top){.refs = 1, .top = cv_xmalloc((r->n_top ? (size_t)r->n_top : 1) * sizeof *tops[i]->top),
                                  .n_top = r->n_top};
            if (r->n_top) memcpy(tops[i]->top, r->top, (size_t)r->n_top * sizeof *tops[i]->top);
        }
        /* the top entries, then the sampled token where it is not among them (vLLM's logprobs dict) */
        bool sampled_in_top = false;
        for (int32_t e = 0; e < n_top; e++) sampled_in_top |= r->top[e].token_id == r->chosen.token_id;
        for (int32_t e = 0; e < n_top + !sampled_in_top; e++) {
            const cvllm_logprob *entry = e < n_top ? &r->top[e] : &r->chosen;
            if (entry->token_id == c->eos_token_id && !c->ignore_eos) {
                if (bs->n_done == bs->cap_done) {
                    bs->cap_done = bs->cap_done ? 2 * bs->cap_done : 8;
                    bs->done = cv_xrealloc(bs->done, bs->cap_done * sizeof *bs->done);
                }
                bs->done[bs->n_done++] = hyp_extend(&bs->live[i], entry, tops[i], c->include_stop_str_in_output, true);
                continue;
            }
            cands[n_cands] = (candidate){bs->live[i].cum + entry->logprob, n_cands, i, *entry, tops[i]};
            n_cands++;
        }
    }
    qsort(cands, n_cands, sizeof *cands, by_cum);
    const size_t n_next = n_cands < (size_t)c->width ? n_cands : (size_t)c->width;
    hyp *next = cv_xcalloc(n_next ? n_next : 1, sizeof *next);
    for (size_t j = 0; j < n_next; j++)
        next[j] = hyp_extend(&bs->live[cands[j].parent], &cands[j].entry, cands[j].top, true, false);
    for (size_t i = 0; i < bs->n_live; i++) {
        hyp_free(&bs->live[i]);
        top_release(tops[i]);
    }
    free(tops);
    free(cands);
    free(bs->live);
    bs->live = next;
    bs->n_live = n_next;
    bs->steps++;
}

/* vLLM's get_beam_search_score: the sequence counts the prompt, and a last eos does not count. */
static double score(const cv_beam_search *bs, const hyp *h, const int32_t *prompt) {
    const cv_beam_config *c = &bs->cfg;
    size_t len = c->n_prompt + h->n;
    const int32_t last = h->n ? h->tokens[h->n - 1] : c->n_prompt ? prompt[c->n_prompt - 1] : -1;
    if (last == c->eos_token_id && len > 1) len--;
    return h->cum / pow((double)len, (double)c->length_penalty);
}

typedef struct ranked {
    const hyp *h;
    double score;
    size_t order; /* finished first, then live, each in its order: vLLM's stable sort */
} ranked;

static int by_score(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

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

cv_request_event *cv_beam_search_result(const cv_beam_search *bs, const cvllm_tokenizer *tok, const int32_t *prompt) {
    const cv_beam_config *c = &bs->cfg;
    const size_t total = bs->n_done + bs->n_live;
    ranked *all = cv_xmalloc((total ? total : 1) * sizeof *all);
    for (size_t i = 0; i < total; i++) {
        const hyp *h = i < bs->n_done ? &bs->done[i] : &bs->live[i - bs->n_done];
        all[i] = (ranked){h, score(bs, h, prompt), i};
    }
    qsort(all, total, sizeof *all, by_score);
    const int32_t n_out = total < (size_t)c->width ? (int32_t)total : c->width;
    cv_request_event *ev = event_new(prompt, c->n_prompt, n_out);
    for (int32_t i = 0; i < n_out; i++) {
        const hyp *h = all[i].h;
        cv_completion_delta *d = &ev->outputs[i];
        d->index = i;
        d->n_token_ids = h->n;
        d->token_ids = cv_xmalloc((h->n ? h->n : 1) * sizeof *d->token_ids);
        if (h->n) memcpy(d->token_ids, h->tokens, h->n * sizeof *h->tokens);
        d->n_total_tokens = h->n;
        /* the text leaves a final eos out, also where token_ids keep it (include_stop_str_in_output) */
        const size_t n_text = h->n - (!c->ignore_eos && h->n && h->tokens[h->n - 1] == c->eos_token_id ? 1 : 0);
        char *text = NULL;
        if (cvllm_detokenize(tok, h->tokens, n_text, false, &text) != CVLLM_OK) text = NULL;
        d->text = cv_xstrdup(text ? text : "");
        d->text_len = strlen(d->text);
        cvllm_free(text);
        d->finish_reason = h->eos ? CVLLM_FINISH_STOP : CVLLM_FINISH_LENGTH;
        d->stop_token_id = h->eos ? c->eos_token_id : -1;
        if (h->chosen) {
            d->logprobs = cv_xmalloc((h->n ? h->n : 1) * sizeof *d->logprobs);
            for (size_t p = 0; p < h->n; p++) {
                const step_top *t = h->tops[p];
                cvllm_logprob *top = cv_xmalloc((t->n_top ? (size_t)t->n_top : 1) * sizeof *top);
                if (t->n_top) memcpy(top, t->top, (size_t)t->n_top * sizeof *top);
                d->logprobs[p] = (cvllm_position_logprobs){.chosen = h->chosen[p], .top = top, .n_top = t->n_top};
            }
        }
    }
    free(all);
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
    int32_t *prompt;
    size_t n_prompt;
    char *cache_salt;
    double arrival;
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
        if (d->have[i]) free((void *)d->results[i].top);
    memset(d->have, 0, (size_t)d->bs->cfg.width * sizeof *d->have);
}

/* Submits one request a live beam; the caller holds d->mu. Returns how many are in. A refused
 * submit is a failure of the search (the engine is stopping, or it refused the prompt). */
static size_t submit_step(cv_beam_driver *d) {
    clear_results(d);
    d->n_step = cv_beam_search_live(d->bs);
    int32_t *ids = cv_xmalloc((d->n_prompt + (size_t)d->bs->cfg.max_tokens + 1) * sizeof *ids);
    memcpy(ids, d->prompt, d->n_prompt * sizeof *ids);
    for (size_t i = 0; i < d->n_step && d->failure == CVLLM_FINISH_NONE; i++) {
        size_t n;
        const int32_t *tokens = cv_beam_search_tokens(d->bs, i, &n);
        if (n) memcpy(ids + d->n_prompt, tokens, n * sizeof *ids);
        cvllm_prompt prompt = {.token_ids = ids, .n_token_ids = d->n_prompt + n, .cache_salt = d->cache_salt};
        d->slots[i] = (step_slot){d, i};
        const cv_submit sub = {.prompt = &prompt, .params = &d->params, .on_event = on_step_event,
                               .user = &d->slots[i], .arrival_time = d->arrival};
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
    cv_request_event *ev = event_new(d->prompt, d->n_prompt, d->bs->cfg.width);
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
            cv_request_event *ev = cv_beam_search_result(d->bs, d->tok, d->prompt);
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
            const cvllm_position_logprobs *lp = &o->logprobs[0];
            cvllm_logprob *top = cv_xmalloc((lp->n_top ? (size_t)lp->n_top : 1) * sizeof *top);
            if (lp->n_top) memcpy(top, lp->top, (size_t)lp->n_top * sizeof *top);
            d->results[i] = (cvllm_position_logprobs){.chosen = lp->chosen, .top = top, .n_top = lp->n_top};
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
                                     const int32_t *prompt, const char *cache_salt, double arrival, cv_event_fn done,
                                     void *user, int *rc) {
    cv_beam_driver *d = cv_xcalloc(1, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    d->group = group;
    d->tok = tok;
    d->bs = cv_beam_search_new(cfg);
    d->n_prompt = cfg->n_prompt;
    d->prompt = cv_xmalloc((d->n_prompt ? d->n_prompt : 1) * sizeof *d->prompt);
    if (d->n_prompt) memcpy(d->prompt, prompt, d->n_prompt * sizeof *prompt);
    d->cache_salt = cache_salt ? cv_xstrdup(cache_salt) : NULL;
    d->arrival = arrival;
    d->done = done;
    d->user = user;
    d->first_step = true;
    /* vLLM's step requests: SamplingParams(logprobs=2·width, max_tokens=1, temperature), its neutral
     * defaults otherwise, not generation_config's (they would change the sampled candidate) */
    cvllm_sampling_params_default(cv_engine_group_engine(group), &d->params);
    d->params.n = 1;
    d->params.max_tokens = 1;
    d->params.temperature = cfg->temperature;
    d->params.top_p = 1.0f;
    d->params.top_k = 0;
    d->params.min_p = 0.0f;
    d->params.repetition_penalty = 1.0f;
    d->params.logprobs = cv_beam_search_step_logprobs(d->bs);
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
    free(d->slots);
    free(d->ids);
    free(d->open);
    free(d->results);
    free(d->have);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
