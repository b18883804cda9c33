/*
 * engine_loop.c — the engine on its own thread. See engine_loop.h for the contract.
 *
 * Three kinds of thread meet here:
 *   - submitters (HTTP handlers) prepare requests on their own thread, then push them and abort ids
 *     into the inbox under `mu` and wake the loop;
 *   - the loop thread drains the inbox, steps the engine, turns each changed request output into an
 *     event of copied deltas, updates the statistics, and hands the events on;
 *   - the output thread (async scheduling) delivers events through the callbacks, so the next
 *     forward pass is not held up by JSON building and socket writes. Without async scheduling the
 *     loop delivers them itself between steps.
 * The engine is touched only by the loop thread; the trackers (callback, timings) of live requests
 * likewise. Statistics have their own lock so /metrics never waits for a forward pass.
 */
#include "engine/engine_loop.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "engine/engine.h"

/* vLLM's histogram buckets (vllm/v1/metrics/loggers.py). */
static const double ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                     0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double request_latency_buckets[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                                 5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double n_buckets[] = {1, 2, 5, 10, 20};
static const double iteration_buckets[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

/* What the loop remembers about a live request. */
typedef struct tracker {
    uint64_t id;
    const cv_request *req;     /* the engine's request; alive as long as the tracker */
    cv_event_fn fn;
    void *user;
    double arrival, first_token;
    double queued, scheduled;  /* when it entered the engine, and when it was first scheduled (0: not yet) */
    double *last_token;        /* per completion: time of its latest tokens (for ITL) */
    bool *finished_sent;       /* per completion: its finish was reported */
    int32_t n_seqs;
    bool sent_prompt;          /* prompt ids (first event) and prompt logprobs went out */
} tracker;

typedef struct pending {
    cv_request *req;
    tracker *t;
} pending;

typedef struct queued_event {
    cv_request_event *ev;
    cv_event_fn fn;
    void *user;
    struct queued_event *next;
} queued_event;

struct cv_engine_loop {
    cvllm_engine *e;
    cv_loop_options opts;
    pthread_t loop_thread, output_thread;
    bool output_thread_started;

    pthread_mutex_t mu;        /* inbox, aborts, stopping, in_flight */
    pthread_cond_t wake, idle;
    pending *inbox;
    size_t n_inbox, cap_inbox;
    uint64_t *aborts;
    size_t n_aborts, cap_aborts;
    bool stopping;
    size_t in_flight;          /* submitted requests whose final event has not been delivered yet */

    tracker **live;            /* loop thread only */
    size_t n_live, cap_live;

    pthread_mutex_t out_mu;    /* the output queue */
    pthread_cond_t out_cv;
    queued_event *out_head, *out_tail;
    bool out_stop;

    pthread_mutex_t stats_mu;
    cv_engine_stats stats;
    double size_buckets[CV_HISTOGRAM_MAX_BUCKETS]; /* 1-2-5 up to max_model_len, for the token histograms */
    double last_log;
    uint64_t logged_prompt, logged_generation, logged_queries, logged_hits;
};

/* ------------------------------------------------------------------------------------------------ */
/* Events                                                                                            */

static void free_logprobs(cvllm_position_logprobs *lp, size_t n) { cv_free_position_logprobs(lp, n); }

void cv_request_event_free(cv_request_event *ev) {
    if (!ev) return;
    for (int32_t i = 0; i < ev->n_outputs; i++) {
        cv_completion_delta *d = &ev->outputs[i];
        free(d->token_ids);
        free(d->text);
        free_logprobs(d->logprobs, d->n_token_ids);
        free(d->stop_str);
    }
    free(ev->outputs);
    free(ev->prompt_token_ids);
    free_logprobs(ev->prompt_logprobs, ev->n_prompt_token_ids);
    free(ev->embedding);
    free(ev);
}

static cvllm_position_logprobs *copy_logprobs(const cvllm_position_logprobs *src, size_t n) {
    cvllm_position_logprobs *dst = cv_xmalloc((n ? n : 1) * sizeof *dst);
    for (size_t i = 0; i < n; i++) {
        dst[i] = src[i];
        if (src[i].n_top > 0) {
            cvllm_logprob *top = cv_xmalloc((size_t)src[i].n_top * sizeof *top);
            memcpy(top, src[i].top, (size_t)src[i].n_top * sizeof *top);
            dst[i].top = top;
        } else {
            dst[i].top = NULL;
        }
    }
    return dst;
}

static bool completion_changed(const cvllm_completion_output *c, const tracker *t) {
    return c->n_new_token_ids > 0 || c->new_text_offset < c->text_len ||
           (c->finish_reason != CVLLM_FINISH_NONE && !t->finished_sent[c->index]);
}

static void fill_delta(cv_completion_delta *d, const cvllm_completion_output *c) {
    size_t first = c->n_token_ids - c->n_new_token_ids;
    d->index = c->index;
    d->n_token_ids = c->n_new_token_ids;
    d->token_ids = cv_xmalloc((d->n_token_ids ? d->n_token_ids : 1) * sizeof *d->token_ids);
    memcpy(d->token_ids, c->token_ids + first, d->n_token_ids * sizeof *d->token_ids);
    d->text_len = c->text_len - c->new_text_offset;
    d->text = cv_xstrndup(c->text + c->new_text_offset, d->text_len);
    d->logprobs = c->logprobs ? copy_logprobs(c->logprobs + first, d->n_token_ids) : NULL;
    d->n_total_tokens = c->n_token_ids;
    d->finish_reason = c->finish_reason;
    d->stop_token_id = c->stop_token_id;
    d->stop_str = c->stop_str ? cv_xstrdup(c->stop_str) : NULL;
}

/* Timings for the histograms; called once per changed request per step. Returns what the request
 * adds to the step's vllm:iteration_tokens_total as vLLM counts it: its new tokens, plus its prompt
 * in the step of its first token. */
static uint64_t observe_timings(cv_engine_loop *l, tracker *t, const cvllm_request_output *o, double now) {
    uint64_t tokens = 0;
    for (int32_t i = 0; i < o->n_outputs; i++) {
        const cvllm_completion_output *c = &o->outputs[i];
        if (c->n_new_token_ids == 0) continue;
        tokens += c->n_new_token_ids;
        if (t->first_token == 0) {
            t->first_token = now;
            tokens += o->n_prompt_token_ids;
            cv_histogram_observe(&l->stats.time_to_first_token, now - t->arrival);
        } else if (t->last_token[i] > 0) {
            cv_histogram_observe(&l->stats.inter_token_latency, now - t->last_token[i]);
        }
        t->last_token[i] = now;
    }
    return tokens;
}

/* The per-request histograms of a finished request. An interval whose end never came (a request
 * aborted before it was scheduled or before its first token) counts as zero, as in vLLM; the queue
 * time of one never scheduled runs until it finished. With n > 1 the request counts once: its
 * tokens are all its completions', its time per output token the longest completion's. */
static void observe_finished(cv_engine_loop *l, const tracker *t, const cvllm_request_output *o, double now) {
    cv_engine_stats *st = &l->stats;
    cv_histogram_observe(&st->e2e_request_latency, now - t->arrival);
    int kind = CV_FINISHED_STOP;
    size_t total = 0, longest = 0;
    double last = 0;
    for (int32_t i = 0; i < o->n_outputs; i++) {
        const cvllm_completion_output *c = &o->outputs[i];
        if (c->finish_reason == CVLLM_FINISH_ERROR) kind = CV_FINISHED_ERROR;
        else if (c->finish_reason == CVLLM_FINISH_ABORT && kind != CV_FINISHED_ERROR) kind = CV_FINISHED_ABORT;
        else if (c->finish_reason == CVLLM_FINISH_LENGTH && kind == CV_FINISHED_STOP) kind = CV_FINISHED_LENGTH;
        total += c->n_token_ids;
        if (c->n_token_ids > longest) longest = c->n_token_ids;
        if (t->last_token[i] > last) last = t->last_token[i];
    }
    st->request_success[kind]++;
    bool started = t->first_token > 0;
    double decode = started ? last - t->first_token : 0;
    cv_histogram_observe(&st->request_queue_time, (t->scheduled > 0 ? t->scheduled : now) - t->queued);
    cv_histogram_observe(&st->request_prefill_time, started ? t->first_token - t->scheduled : 0);
    cv_histogram_observe(&st->request_decode_time, decode);
    cv_histogram_observe(&st->request_inference_time, started ? last - t->scheduled : 0);
    cv_histogram_observe(&st->request_time_per_output_token, longest > 1 ? decode / (double)(longest - 1) : 0);
    cv_histogram_observe(&st->request_prompt_tokens, (double)o->n_prompt_token_ids);
    cv_histogram_observe(&st->request_generation_tokens, (double)total);
    cv_histogram_observe(&st->request_max_num_generation_tokens, (double)longest);
    cv_histogram_observe(&st->request_params_n, (double)o->n_outputs);
    cv_histogram_observe(&st->request_params_max_tokens, (double)t->req->max_tokens);
}

static cv_request_event *make_event(tracker *t, const cvllm_request_output *o) {
    cv_request_event *ev = cv_xcalloc(1, sizeof *ev);
    ev->request_id = o->request_id;
    ev->n_prompt_token_ids = o->n_prompt_token_ids;
    ev->n_cached_tokens = o->n_cached_tokens;
    ev->finished = o->finished;
    ev->outputs = cv_xcalloc((size_t)o->n_outputs, sizeof *ev->outputs);
    bool first_tokens = false;
    for (int32_t i = 0; i < o->n_outputs; i++) {
        const cvllm_completion_output *c = &o->outputs[i];
        if (!completion_changed(c, t)) continue;
        fill_delta(&ev->outputs[ev->n_outputs++], c);
        if (c->finish_reason != CVLLM_FINISH_NONE) t->finished_sent[i] = true;
        if (c->n_token_ids > 0) first_tokens = true;
    }
    /* Prompt logprobs are complete once any token was sampled (or the request ended). */
    if (!t->sent_prompt && (first_tokens || o->finished)) {
        t->sent_prompt = true;
        ev->prompt_token_ids = cv_xmalloc(o->n_prompt_token_ids * sizeof *ev->prompt_token_ids);
        memcpy(ev->prompt_token_ids, o->prompt_token_ids, o->n_prompt_token_ids * sizeof *ev->prompt_token_ids);
        if (o->prompt_logprobs) ev->prompt_logprobs = copy_logprobs(o->prompt_logprobs, o->n_prompt_token_ids);
    }
    if (o->embedding) {
        ev->embedding = cv_xmalloc(o->n_embedding * sizeof *ev->embedding);
        memcpy(ev->embedding, o->embedding, o->n_embedding * sizeof *ev->embedding);
        ev->n_embedding = o->n_embedding;
    }
    return ev;
}

/* A request's final event has reached its callback: it is no longer in flight. Counting here, not
 * when the step finishes it, makes cv_engine_loop_drain mean "every answer delivered" also with
 * async scheduling, where delivery trails the step on the output thread. */
static void final_event_delivered(cv_engine_loop *l) {
    pthread_mutex_lock(&l->mu);
    assert(l->in_flight > 0);
    if (--l->in_flight == 0) pthread_cond_broadcast(&l->idle);
    pthread_mutex_unlock(&l->mu);
}

static void deliver(cv_engine_loop *l, cv_request_event *ev, cv_event_fn fn, void *user) {
    if (!l->opts.async_scheduling) {
        bool finished = ev->finished; /* fn takes ev */
        fn(user, ev);
        if (finished) final_event_delivered(l);
        return;
    }
    queued_event *q = cv_xmalloc(sizeof *q);
    *q = (queued_event){ev, fn, user, NULL};
    pthread_mutex_lock(&l->out_mu);
    if (l->out_tail) l->out_tail->next = q;
    else l->out_head = q;
    l->out_tail = q;
    pthread_cond_signal(&l->out_cv);
    pthread_mutex_unlock(&l->out_mu);
}

static void *output_main(void *arg) {
    cv_engine_loop *l = arg;
    pthread_mutex_lock(&l->out_mu);
    for (;;) {
        while (!l->out_head && !l->out_stop) pthread_cond_wait(&l->out_cv, &l->out_mu);
        if (!l->out_head) break;
        queued_event *q = l->out_head;
        l->out_head = q->next;
        if (!l->out_head) l->out_tail = NULL;
        pthread_mutex_unlock(&l->out_mu);
        bool finished = q->ev->finished; /* fn takes ev */
        q->fn(q->user, q->ev);
        free(q);
        if (finished) final_event_delivered(l);
        pthread_mutex_lock(&l->out_mu);
    }
    pthread_mutex_unlock(&l->out_mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* Trackers                                                                                          */

static tracker *tracker_new(const cv_request *req, const cv_submit *s) {
    tracker *t = cv_xcalloc(1, sizeof *t);
    t->id = req->id;
    t->req = req;
    t->fn = s->on_event;
    t->user = s->user;
    t->arrival = s->arrival_time > 0 ? s->arrival_time : cv_now();
    t->n_seqs = req->n_seqs;
    t->last_token = cv_xcalloc((size_t)t->n_seqs, sizeof *t->last_token);
    t->finished_sent = cv_xcalloc((size_t)t->n_seqs, sizeof *t->finished_sent);
    return t;
}

static void tracker_free(tracker *t) {
    free(t->last_token);
    free(t->finished_sent);
    free(t);
}

static void track(cv_engine_loop *l, tracker *t) {
    if (l->n_live == l->cap_live) {
        l->cap_live = l->cap_live ? l->cap_live * 2 : 64;
        l->live = cv_xrealloc(l->live, l->cap_live * sizeof *l->live);
    }
    l->live[l->n_live++] = t;
}

static size_t find_tracker(const cv_engine_loop *l, uint64_t id) {
    for (size_t i = 0; i < l->n_live; i++)
        if (l->live[i]->id == id) return i;
    return SIZE_MAX;
}

/* ------------------------------------------------------------------------------------------------ */
/* The loop                                                                                          */

static void update_gauges(cv_engine_loop *l) {
    const cvllm_engine *e = l->e;
    l->stats.num_running = cv_scheduler_num_running(&e->sched);
    l->stats.num_waiting = cv_scheduler_num_waiting(&e->sched);
    l->stats.kv_cache_usage = cv_block_pool_usage(&e->blocks);
    l->stats.prompt_tokens = e->prompt_tokens_total;
    l->stats.generation_tokens = e->generation_tokens_total;
    l->stats.prefix_cache_queries = e->sched.prefix_queries;
    l->stats.prefix_cache_hits = e->sched.prefix_hits;
    l->stats.num_preemptions = e->sched.num_preemptions;
    l->stats.spec_num_drafts = e->spec_stats.num_drafts;
    l->stats.spec_num_draft_tokens = e->spec_stats.num_draft_tokens;
    l->stats.spec_num_accepted_tokens = e->spec_stats.num_accepted_tokens;
    l->stats.spec_num_positions = e->spec.method == CV_SPEC_NONE ? 0 : e->spec.num_speculative_tokens;
    memcpy(l->stats.spec_accepted_per_pos, e->spec_stats.accepted_per_pos, sizeof l->stats.spec_accepted_per_pos);
    l->stats.max_loras = e->sched.max_loras;
    memset(l->stats.lora_state, 0, sizeof l->stats.lora_state);
    for (int32_t i = 0; e->sched.max_loras && i < e->sched.running.n; i++) {
        const cv_lora_entry *a = e->sched.running.items[i]->req->lora;
        if (a) l->stats.lora_state[a->slot] |= 1;
    }
    for (int32_t i = 0; e->sched.max_loras && i < e->sched.waiting.n; i++) {
        const cv_lora_entry *a = e->sched.waiting.items[i]->req->lora;
        if (a) l->stats.lora_state[a->slot] |= 2;
    }
}

/* vLLM's periodic line (LoggingStatLogger), printed only when something happened since the last. */
static void maybe_log_stats(cv_engine_loop *l, double now) {
    if (l->opts.log_stats_interval <= 0 || now - l->last_log < l->opts.log_stats_interval) return;
    const cv_engine_stats *s = &l->stats;
    double dt = now - l->last_log;
    uint64_t dp = s->prompt_tokens - l->logged_prompt, dg = s->generation_tokens - l->logged_generation;
    uint64_t dq = s->prefix_cache_queries - l->logged_queries, dh = s->prefix_cache_hits - l->logged_hits;
    if (dp || dg || s->num_running || s->num_waiting)
        cv_info("loggers",
                "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                l->opts.engine_index, dp / dt, dg / dt, s->num_running, s->num_waiting, 100.0 * s->kv_cache_usage,
                dq ? 100.0 * (double)dh / (double)dq : 0.0);
    l->last_log = now;
    l->logged_prompt = s->prompt_tokens;
    l->logged_generation = s->generation_tokens;
    l->logged_queries = s->prefix_cache_queries;
    l->logged_hits = s->prefix_cache_hits;
}

/* The end of queue time: the step that first scheduled a request (seq 0 always runs first). */
static void mark_scheduled(cv_engine_loop *l, double step_start) {
    for (size_t i = 0; i < l->n_live; i++)
        if (l->live[i]->scheduled == 0 && l->live[i]->req->admitted) l->live[i]->scheduled = step_start;
}

/* Runs one engine step and hands out the events. */
static void run_step(cv_engine_loop *l) {
    const cvllm_request_output *const *outs;
    size_t n_outs;
    double step_start = cv_now();
    int rc = cvllm_engine_step(l->e, &outs, &n_outs);
    if (rc) {
        /* A failing forward pass is a bug or an exhausted machine: fail what is running, keep serving. */
        cv_error_log("engine_loop", "engine step failed: %s; failing all running requests", cvllm_last_error());
        cv_engine_fail_all(l->e);
        rc = cvllm_engine_step(l->e, &outs, &n_outs);
        if (rc) n_outs = 0;
    }
    double now = cv_now();
    mark_scheduled(l, step_start);
    pthread_mutex_lock(&l->stats_mu);
    cv_request_event **events = cv_xmalloc((n_outs ? n_outs : 1) * sizeof *events);
    tracker **owners = cv_xmalloc((n_outs ? n_outs : 1) * sizeof *owners);
    uint64_t iteration_tokens = 0;
    for (size_t k = 0; k < n_outs; k++) {
        size_t i = find_tracker(l, outs[k]->request_id);
        assert(i != SIZE_MAX);
        tracker *t = l->live[i];
        iteration_tokens += observe_timings(l, t, outs[k], now);
        if (outs[k]->finished) observe_finished(l, t, outs[k], now);
        events[k] = make_event(t, outs[k]);
        owners[k] = t;
    }
    if (n_outs > 0) cv_histogram_observe(&l->stats.iteration_tokens, (double)iteration_tokens);
    update_gauges(l);
    maybe_log_stats(l, now);
    pthread_mutex_unlock(&l->stats_mu);
    for (size_t k = 0; k < n_outs; k++) {
        tracker *t = owners[k];
        bool finished = events[k]->finished;
        deliver(l, events[k], t->fn, t->user);
        if (finished) {
            size_t i = find_tracker(l, t->id);
            l->live[i] = l->live[--l->n_live];
            tracker_free(t);
        }
    }
    free(events);
    free(owners);
}

static bool has_work(const cv_engine_loop *l) {
    return l->n_inbox > 0 || l->n_aborts > 0 || cvllm_engine_has_unfinished(l->e);
}

/* Moves submitted requests into the engine and applies aborts (loop thread, `mu` not held). */
static void admit(cv_engine_loop *l, pending *inbox, size_t n_inbox, const uint64_t *aborts, size_t n_aborts,
                  bool stopping) {
    double now = cv_now();
    for (size_t i = 0; i < n_inbox; i++) {
        inbox[i].t->queued = now;
        track(l, inbox[i].t);
        cv_engine_enqueue_request(l->e, inbox[i].req);
    }
    for (size_t i = 0; i < n_aborts; i++)
        if (find_tracker(l, aborts[i]) != SIZE_MAX) cvllm_engine_abort_request(l->e, aborts[i]);
    if (stopping)
        for (size_t i = 0; i < l->n_live; i++) cvllm_engine_abort_request(l->e, l->live[i]->id);
}

static void wait_for_work(cv_engine_loop *l) {
    while (!l->stopping && !has_work(l)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1; /* wake now and then so the stats line still appears */
        pthread_cond_timedwait(&l->wake, &l->mu, &ts);
    }
}

static void *loop_main(void *arg) {
    cv_engine_loop *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        wait_for_work(l);
        if (l->stopping && !has_work(l)) break;
        pending *inbox = l->inbox;
        size_t n_inbox = l->n_inbox;
        uint64_t *aborts = l->aborts;
        size_t n_aborts = l->n_aborts;
        bool stopping = l->stopping;
        l->inbox = NULL;
        l->n_inbox = l->cap_inbox = 0;
        l->aborts = NULL;
        l->n_aborts = l->cap_aborts = 0;
        pthread_mutex_unlock(&l->mu);

        admit(l, inbox, n_inbox, aborts, n_aborts, stopping);
        free(inbox);
        free(aborts);
        if (cvllm_engine_has_unfinished(l->e)) run_step(l);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* Public functions                                                                                  */

int cv_engine_loop_start(cvllm_engine *engine, const cv_loop_options *opts, cv_engine_loop **out) {
    cv_engine_loop *l = cv_xcalloc(1, sizeof *l);
    l->e = engine;
    l->opts = *opts;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->wake, NULL);
    pthread_cond_init(&l->idle, NULL);
    pthread_mutex_init(&l->out_mu, NULL);
    pthread_cond_init(&l->out_cv, NULL);
    pthread_mutex_init(&l->stats_mu, NULL);
    cv_histogram_init(&l->stats.time_to_first_token, ttft_buckets, CV_ARRAY_LEN(ttft_buckets));
    cv_histogram_init(&l->stats.inter_token_latency, itl_buckets, CV_ARRAY_LEN(itl_buckets));
    cv_engine_stats *st = &l->stats;
    cv_histogram_init(&st->e2e_request_latency, request_latency_buckets, CV_ARRAY_LEN(request_latency_buckets));
    cv_histogram_init(&st->request_queue_time, request_latency_buckets, CV_ARRAY_LEN(request_latency_buckets));
    cv_histogram_init(&st->request_prefill_time, request_latency_buckets, CV_ARRAY_LEN(request_latency_buckets));
    cv_histogram_init(&st->request_decode_time, request_latency_buckets, CV_ARRAY_LEN(request_latency_buckets));
    cv_histogram_init(&st->request_inference_time, request_latency_buckets, CV_ARRAY_LEN(request_latency_buckets));
    cv_histogram_init(&st->request_time_per_output_token, itl_buckets, CV_ARRAY_LEN(itl_buckets));
    size_t n_size = cv_histogram_1_2_5_bounds(cvllm_engine_max_model_len(engine), l->size_buckets,
                                              CV_HISTOGRAM_MAX_BUCKETS);
    cv_histogram_init(&st->request_prompt_tokens, l->size_buckets, n_size);
    cv_histogram_init(&st->request_generation_tokens, l->size_buckets, n_size);
    cv_histogram_init(&st->request_max_num_generation_tokens, l->size_buckets, n_size);
    cv_histogram_init(&st->request_params_max_tokens, l->size_buckets, n_size);
    cv_histogram_init(&st->request_params_n, n_buckets, CV_ARRAY_LEN(n_buckets));
    cv_histogram_init(&st->iteration_tokens, iteration_buckets, CV_ARRAY_LEN(iteration_buckets));
    l->stats.kv_cache_tokens = (int64_t)(engine->kv_blocks - 1) * engine->opts.block_size;
    l->stats.block_size = engine->opts.block_size;
    l->last_log = cv_now();
    update_gauges(l);
    if (l->opts.async_scheduling) {
        if (pthread_create(&l->output_thread, NULL, output_main, l) != 0) {
            free(l);
            return cv_fail(CVLLM_ERR_INTERNAL, "cannot start the output thread");
        }
        l->output_thread_started = true;
    }
    if (pthread_create(&l->loop_thread, NULL, loop_main, l) != 0) {
        l->out_stop = true;
        if (l->output_thread_started) {
            pthread_cond_signal(&l->out_cv);
            pthread_join(l->output_thread, NULL);
        }
        free(l);
        return cv_fail(CVLLM_ERR_INTERNAL, "cannot start the engine thread");
    }
    *out = l;
    return 0;
}

void cv_engine_loop_stop(cv_engine_loop *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stopping = true;
    pthread_cond_signal(&l->wake);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->loop_thread, NULL);
    if (l->output_thread_started) {
        pthread_mutex_lock(&l->out_mu);
        l->out_stop = true;
        pthread_cond_signal(&l->out_cv);
        pthread_mutex_unlock(&l->out_mu);
        pthread_join(l->output_thread, NULL);
    }
    assert(l->n_live == 0 && l->n_inbox == 0);
    free(l->live);
    free(l->inbox);
    free(l->aborts);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->wake);
    pthread_cond_destroy(&l->idle);
    pthread_mutex_destroy(&l->out_mu);
    pthread_cond_destroy(&l->out_cv);
    pthread_mutex_destroy(&l->stats_mu);
    cvllm_engine_destroy(l->e);
    free(l);
}

bool cv_engine_loop_drain(cv_engine_loop *l, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double end = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + seconds;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&l->mu);
    int rc = 0;
    while (l->in_flight > 0 && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&l->idle, &l->mu, &ts);
    bool empty = l->in_flight == 0;
    pthread_mutex_unlock(&l->mu);
    return empty;
}

int cv_engine_loop_prepare(cv_engine_loop *l, const cv_submit *s, cv_request **req) {
    return s->pooling ? cv_engine_prepare_pooling(l->e, s->prompt, s->pooling, req)
                      : cv_engine_prepare_request(l->e, s->prompt, s->params, req);
}

int cv_engine_loop_submit(cv_engine_loop *l, const cv_submit *s, uint64_t *request_id) {
    cv_request *req;
    int rc = cv_engine_loop_prepare(l, s, &req);
    return rc ? rc : cv_engine_loop_enqueue(l, req, s, request_id);
}

int cv_engine_loop_enqueue(cv_engine_loop *l, cv_request *req, const cv_submit *s, uint64_t *request_id) {
    tracker *t = tracker_new(req, s);
    pthread_mutex_lock(&l->mu);
    if (l->stopping) {
        pthread_mutex_unlock(&l->mu);
        cv_request_free(req);
        tracker_free(t);
        return cv_fail(CVLLM_ERR_UNAVAILABLE, "the engine is shutting down");
    }
    if (l->n_inbox == l->cap_inbox) {
        l->cap_inbox = l->cap_inbox ? l->cap_inbox * 2 : 16;
        l->inbox = cv_xrealloc(l->inbox, l->cap_inbox * sizeof *l->inbox);
    }
    l->inbox[l->n_inbox++] = (pending){req, t};
    l->in_flight++;
    if (request_id) *request_id = req->id;
    pthread_cond_signal(&l->wake);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void cv_engine_loop_abort(cv_engine_loop *l, uint64_t request_id) {
    pthread_mutex_lock(&l->mu);
    if (l->n_aborts == l->cap_aborts) {
        l->cap_aborts = l->cap_aborts ? l->cap_aborts * 2 : 16;
        l->aborts = cv_xrealloc(l->aborts, l->cap_aborts * sizeof *l->aborts);
    }
    l->aborts[l->n_aborts++] = request_id;
    pthread_cond_signal(&l->wake);
    pthread_mutex_unlock(&l->mu);
}

void cv_engine_loop_load(cv_engine_loop *l, size_t *requests, double *kv_cache_usage) {
    pthread_mutex_lock(&l->mu);
    *requests = l->in_flight;
    pthread_mutex_unlock(&l->mu);
    pthread_mutex_lock(&l->stats_mu);
    *kv_cache_usage = l->stats.kv_cache_usage;
    pthread_mutex_unlock(&l->stats_mu);
}

const cvllm_engine *cv_engine_loop_engine(const cv_engine_loop *l) { return l->e; }

int cv_engine_loop_load_lora(cv_engine_loop *l, const cvllm_lora_module *m, bool replace) {
    return cvllm_engine_load_lora(l->e, m, replace);
}

int cv_engine_loop_unload_lora(cv_engine_loop *l, const char *name) { return cvllm_engine_unload_lora(l->e, name); }

void cv_engine_loop_stats(cv_engine_loop *l, cv_engine_stats *out) {
    pthread_mutex_lock(&l->stats_mu);
    *out = l->stats;
    pthread_mutex_unlock(&l->stats_mu);
}
