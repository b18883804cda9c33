/*
 * beam_search.c — vLLM's beam search (its frontends' beam_search, online and LLM.beam_search): each
 * step asks the engine for one token of every live beam, as a request of its own whose prompt is the
 * original prompt followed by the beam's tokens, with the top 2 × width logprobs. The candidates of a
 * step are each beam's top entries and its sampled token; an eos candidate becomes a finished
 * hypothesis, the best `width` others by cumulative logprob become the next beams. After max_tokens
 * steps (or when no beam is left) the finished hypotheses and the live beams are ranked by cumulative
 * logprob over (prompt + output length) ** length_penalty and the best `width` are the result.
 *
 * Why requests and not forked sequences inside the engine: it is how vLLM runs beam search, so the
 * results are the ones vLLM returns for the same logprobs; the scheduler stays unaware of beams; and
 * the prefix cache makes a step cost about one token a beam — a beam's prompt is the previous
 * step's prompt plus one token, so all of it but the last block's tail is found cached.
 *
 * The search itself (cv_beam_search) is fed one step's results at a time and knows no engine; the
 * server drives it over its engine loops (server/beam_driver.c), cvllm_engine_beam_search below over
 * a cvllm_engine it steps itself. A hypothesis's positions keep the step's top entries (shared between
 * the hypotheses a step's result fed, reference counted) only when logprobs were asked for.
 */
#include "engine/beam_search.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/tokenizer.h"

/* One step result's top entries, shared by the hypotheses that took a token from it. */
struct cv_beam_top {
    int refs;
    cvllm_logprob *top;
    int32_t n_top;
};

struct cv_beam_search {
    cv_beam_config cfg;
    cv_beam_hyp *live;
    size_t n_live;
    cv_beam_hyp *done;
    size_t n_done, cap_done;
    int32_t steps;
};

static void top_release(cv_beam_top *t) {
    if (t && --t->refs == 0) {
        free(t->top);
        free(t);
    }
}

static void hyp_free(cv_beam_hyp *h) {
    for (size_t i = 0; h->tops && i < h->n; i++) top_release(h->tops[i]);
    free(h->tokens);
    free(h->chosen);
    free(h->tops);
}

/* parent's positions, then `entry` from step result `top` (NULL: no logprobs) unless `add` is false */
static cv_beam_hyp hyp_extend(const cv_beam_hyp *parent, const cvllm_logprob *entry, cv_beam_top *top, bool add,
                              bool eos) {
    const size_t n = parent->n + (add ? 1 : 0);
    cv_beam_hyp h = {.tokens = cv_xmalloc((n ? n : 1) * sizeof *h.tokens), .n = n, .cum = parent->cum + entry->logprob,
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

const cv_beam_config *cv_beam_search_config(const cv_beam_search *bs) { return &bs->cfg; }

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
    cv_beam_top *top;
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
    cv_beam_top **tops = cv_xcalloc(bs->n_live, sizeof *tops);
    size_t n_cands = 0;
    for (size_t i = 0; i < bs->n_live; i++) {
        const cvllm_position_logprobs *r = &results[i];
        const int32_t n_top = r->n_top < k ? r->n_top : k;
        if (c->top_logprobs >= 0) { /* the step's own reference, dropped below */
            tops[i] = cv_xmalloc(sizeof *tops[i]);
            *tops[i] = (cv_beam_top){.refs = 1, .n_top = r->n_top,
                                     .top = cv_xmalloc((r->n_top ? (size_t)r->n_top : 1) * sizeof *tops[i]->top)};
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
    cv_beam_hyp *next = cv_xcalloc(n_next ? n_next : 1, sizeof *next);
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
static double score(const cv_beam_search *bs, const cv_beam_hyp *h, const int32_t *prompt) {
    const cv_beam_config *c = &bs->cfg;
    size_t len = c->n_prompt + h->n;
    const int32_t last = h->n ? h->tokens[h->n - 1] : c->n_prompt ? prompt[c->n_prompt - 1] : -1;
    if (last == c->eos_token_id && len > 1) len--;
    return h->cum / pow((double)len, (double)c->length_penalty);
}

typedef struct ranked {
    const cv_beam_hyp *h;
    double score;
    size_t order; /* finished first, then live, each in its order: vLLM's stable sort */
} ranked;

static int by_score(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

size_t cv_beam_search_best(const cv_beam_search *bs, const int32_t *prompt, const cv_beam_hyp **best) {
    const size_t total = bs->n_done + bs->n_live;
    ranked *all = cv_xmalloc((total ? total : 1) * sizeof *all);
    for (size_t i = 0; i < total; i++) {
        const cv_beam_hyp *h = i < bs->n_done ? &bs->done[i] : &bs->live[i - bs->n_done];
        all[i] = (ranked){h, score(bs, h, prompt), i};
    }
    qsort(all, total, sizeof *all, by_score);
    const size_t n = total < (size_t)bs->cfg.width ? total : (size_t)bs->cfg.width;
    for (size_t i = 0; i < n; i++) best[i] = all[i].h;
    free(all);
    return n;
}

char *cv_beam_hyp_text(const cv_beam_search *bs, const cv_beam_hyp *h, const cvllm_tokenizer *tok) {
    const cv_beam_config *c = &bs->cfg;
    const size_t n = h->n - (!c->ignore_eos && h->n && h->tokens[h->n - 1] == c->eos_token_id ? 1 : 0);
    char *text = NULL;
    if (cvllm_detokenize(tok, h->tokens, n, false, &text) != CVLLM_OK) return cv_xstrdup("");
    char *copy = cv_xstrdup(text);
    cvllm_free(text);
    return copy;
}

cvllm_position_logprobs *cv_beam_hyp_logprobs(const cv_beam_hyp *h) {
    if (!h->chosen) return NULL;
    cvllm_position_logprobs *lp = cv_xmalloc((h->n ? h->n : 1) * sizeof *lp);
    for (size_t p = 0; p < h->n; p++) {
        const cv_beam_top *t = h->tops[p];
        cvllm_logprob *top = cv_xmalloc((t->n_top ? (size_t)t->n_top : 1) * sizeof *top);
        if (t->n_top) memcpy(top, t->top, (size_t)t->n_top * sizeof *top);
        lp[p] = (cvllm_position_logprobs){.chosen = h->chosen[p], .top = top, .n_top = t->n_top};
    }
    return lp;
}

cvllm_position_logprobs cv_beam_result_copy(const cvllm_position_logprobs *src) {
    cvllm_logprob *top = cv_xmalloc((src->n_top ? (size_t)src->n_top : 1) * sizeof *top);
    if (src->n_top) memcpy(top, src->top, (size_t)src->n_top * sizeof *top);
    return (cvllm_position_logprobs){.chosen = src->chosen, .top = top, .n_top = src->n_top};
}

void cv_beam_result_free(cvllm_position_logprobs *r) {
    free((void *)r->top);
    *r = (cvllm_position_logprobs){0};
}

int32_t cv_beam_eos_token_id(const cvllm_tokenizer *tok) {
    if (!tok) return -1;
    const cv_tokenizer *t = (const cv_tokenizer *)tok; /* the public handle is the internal object */
    const char *eos = cv_tokenizer_special_string(t, "eos_token");
    return eos ? cv_tokenizer_token_to_id(t, eos) : -1;
}

void cv_beam_step_params(const cvllm_engine *engine, const cv_beam_search *bs, cvllm_sampling_params *p) {
    /* vLLM's step requests: SamplingParams(logprobs=2·width, max_tokens=1, temperature), its neutral
     * defaults otherwise, not generation_config's (they would change the sampled candidate) */
    cvllm_sampling_params_default(engine, p);
    p->n = 1;
    p->max_tokens = 1;
    p->temperature = bs->cfg.temperature;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->logprobs = cv_beam_search_step_logprobs(bs);
}

/* ---- over a cvllm_engine ------------------------------------------------------------------------ */

/* Where a step request's result goes: prompt p's beam b. */
typedef struct step_request {
    uint64_t id;
    size_t prompt, beam;
} step_request;

static const step_request *find_request(const step_request *reqs, size_t n, uint64_t id) {
    size_t lo = 0, hi = n; /* ids ascend in the order the requests were added */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (reqs[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && reqs[lo].id == id ? &reqs[lo] : NULL;
}

/* One step of every search with live beams: their requests added, the engine stepped until they
 * finish, each beam's position logprobs folded in. */
static cvllm_status run_step(cvllm_engine *e, cv_beam_search **searches, int32_t *const *ids, const cvllm_prompt *prompts,
                             size_t n_prompts, const cvllm_sampling_params *sp, step_request *reqs,
                             cvllm_position_logprobs **results) {
    size_t n_reqs = 0;
    cvllm_status rc = CVLLM_OK;
    for (size_t p = 0; p < n_prompts && rc == CVLLM_OK; p++) {
        const size_t n_prompt = searches[p] ? prompts[p].n_token_ids : 0;
        for (size_t b = 0; searches[p] && b < cv_beam_search_live(searches[p]) && rc == CVLLM_OK; b++) {
            size_t n;
            const int32_t *tokens = cv_beam_search_tokens(searches[p], b, &n);
            if (n) memcpy(ids[p] + n_prompt, tokens, n * sizeof *tokens);
            const cvllm_prompt pr = {.token_ids = ids[p], .n_token_ids = n_prompt + n, .cache_salt = prompts[p].cache_salt,
                                     .lora_name = prompts[p].lora_name};
            reqs[n_reqs] = (step_request){0, p, b};
            rc = cvllm_engine_add_request(e, &pr, sp, &reqs[n_reqs].id);
            if (rc == CVLLM_OK) n_reqs++;
        }
    }
    size_t seen = 0;
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n_outs;
        cvllm_status step_rc = cvllm_engine_step(e, &outs, &n_outs);
        if (step_rc != CVLLM_OK) { /* the engine failed: nothing more to hand back */
            rc = step_rc;
            break;
        }
        for (size_t k = 0; k < n_outs; k++) {
            const step_request *r = find_request(reqs, n_reqs, outs[k]->request_id);
            const cvllm_completion_output *o = outs[k]->n_outputs ? &outs[k]->outputs[0] : NULL;
            if (!r || !o || o->n_token_ids == 0 || !o->logprobs) continue;
            cvllm_position_logprobs *dst = &results[r->prompt][r->beam];
            if (dst->top) continue; /* already taken */
            *dst = cv_beam_result_copy(&o->logprobs[0]);
            seen++;
        }
    }
    if (rc == CVLLM_OK && seen != n_reqs) rc = cv_fail(CVLLM_ERR_INTERNAL, "beam search: a step request ended without a token");
    for (size_t p = 0; p < n_prompts; p++) {
        if (!searches[p] || !cv_beam_search_live(searches[p])) continue;
        const size_t live = cv_beam_search_live(searches[p]);
        if (rc == CVLLM_OK) cv_beam_search_step(searches[p], results[p]);
        for (size_t b = 0; b < live; b++) cv_beam_result_free(&results[p][b]);
    }
    return rc;
}

cvllm_status cvllm_engine_beam_search(cvllm_engine *engine, const cvllm_prompt *prompts, size_t n_prompts,
                                      const cvllm_beam_search_params *params, cvllm_beam_search_output *outputs) {
    if (!engine || !params || (n_prompts && (!prompts || !outputs)))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_engine_beam_search: NULL argument");
    if (params->beam_width < 1 || params->max_tokens < 1)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "beam search needs beam_width >= 1 and max_tokens >= 1 (got %d and %d)",
                       params->beam_width, params->max_tokens);
    if (cvllm_engine_has_unfinished(engine))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_engine_beam_search steps the engine itself: it must have no "
                                                   "unfinished requests");
    for (size_t p = 0; p < n_prompts; p++)
        if (!prompts[p].token_ids || prompts[p].n_token_ids == 0)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "beam search: prompt %zu has no token ids", p);
    const cvllm_tokenizer *tok = cvllm_engine_tokenizer(engine);
    const int32_t eos = cv_beam_eos_token_id(tok), width = params->beam_width;
    cv_beam_search **searches = cv_xcalloc(n_prompts ? n_prompts : 1, sizeof *searches);
    int32_t **ids = cv_xcalloc(n_prompts ? n_prompts : 1, sizeof *ids);
    cvllm_position_logprobs **results = cv_xcalloc(n_prompts ? n_prompts : 1, sizeof *results);
    step_request *reqs = cv_xmalloc((n_prompts ? n_prompts : 1) * (size_t)width * sizeof *reqs);
    for (size_t p = 0; p < n_prompts; p++) {
        const cv_beam_config cfg = {.width = width, .max_tokens = params->max_tokens, .ignore_eos = params->ignore_eos,
                                    .include_stop_str_in_output = params->include_stop_str_in_output,
                                    .length_penalty = params->length_penalty, .temperature = params->temperature,
                                    .eos_token_id = eos, .top_logprobs = -1, .n_prompt = prompts[p].n_token_ids};
        searches[p] = cv_beam_search_new(&cfg);
        ids[p] = cv_xmalloc((prompts[p].n_token_ids + (size_t)params->max_tokens) * sizeof *ids[p]);
        memcpy(ids[p], prompts[p].token_ids, prompts[p].n_token_ids * sizeof *ids[p]);
        results[p] = cv_xcalloc((size_t)width, sizeof *results[p]);
    }
    cvllm_sampling_params sp;
    cvllm_status rc = CVLLM_OK;
    if (n_prompts) cv_beam_step_params(engine, searches[0], &sp);
    for (bool live = n_prompts > 0; live && rc == CVLLM_OK;) {
        rc = run_step(engine, searches, ids, prompts, n_prompts, &sp, reqs, results);
        live = false;
        for (size_t p = 0; p < n_prompts; p++) live |= cv_beam_search_live(searches[p]) > 0;
    }
    const cv_beam_hyp **best = cv_xmalloc((size_t)width * sizeof *best);
    for (size_t p = 0; p < n_prompts; p++) {
        outputs[p] = (cvllm_beam_search_output){0};
        if (rc != CVLLM_OK) continue;
        const size_t n = cv_beam_search_best(searches[p], prompts[p].token_ids, best);
        outputs[p].sequences = cv_xcalloc(n ? n : 1, sizeof *outputs[p].sequences);
        outputs[p].n_sequences = (int32_t)n;
        for (size_t i = 0; i < n; i++) {
            cvllm_beam_sequence *q = &outputs[p].sequences[i];
            q->token_ids = cv_xmalloc((best[i]->n ? best[i]->n : 1) * sizeof *q->token_ids);
            if (best[i]->n) memcpy(q->token_ids, best[i]->tokens, best[i]->n * sizeof *q->token_ids);
            q->n_token_ids = best[i]->n;
            q->text = cv_beam_hyp_text(searches[p], best[i], tok);
            q->cumulative_logprob = best[i]->cum;
            q->finish_reason = best[i]->eos ? CVLLM_FINISH_STOP : CVLLM_FINISH_LENGTH;
        }
    }
    free(best);
    for (size_t p = 0; p < n_prompts; p++) {
        cv_beam_search_free(searches[p]);
        free(ids[p]);
        free(results[p]);
    }
    free(searches);
    free(ids);
    free(results);
    free(reqs);
    return rc;
}

void cvllm_beam_search_output_free(cvllm_beam_search_output *outputs, size_t n_prompts) {
    for (size_t p = 0; outputs && p < n_prompts; p++) {
        for (int32_t i = 0; i < outputs[p].n_sequences; i++) {
            free(outputs[p].sequences[i].token_ids);
            free(outputs[p].sequences[i].text);
        }
        free(outputs[p].sequences);
        outputs[p] = (cvllm_beam_search_output){0};
    }
}
