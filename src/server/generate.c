/*
 * generate.c — /v1/completions and /v1/chat/completions over the engine group (engine_group.h: one
 * engine loop, or the replicas of data parallelism, which route each engine request themselves).
 *
 * One HTTP request becomes a session: one engine request per prompt (n choices each), all feeding
 * one cv_api_response under the session's mutex. A worker thread parses, tokenizes, compiles the
 * request's structured-output constraint and submits, then returns (compiling on the worker keeps a
 * new schema from stalling the engine loop; the engine caches grammars by constraint); engine events arrive on the loop's output thread, which folds them into the
 * response and, for a stream, pushes each new SSE chunk straight to the client. Whoever sees the
 * last prompt finish writes the end of the reply, so no thread ever waits for a generation.
 *
 * Lifetime is a reference count: one for the HTTP reply (dropped by the thread that finishes it)
 * and one per engine request that has not had its final event yet. The engine loop guarantees
 * that final event for every submitted request, also after an abort, so the session is freed
 * exactly once, by whichever side lets go last.
 *
 * A background Responses API request is answered as soon as it is submitted (the "queued" response,
 * or its stream's first bytes from the response store's event log); its client may then go without
 * aborting it, and its end is written to the response store instead of a connection.
 *
 * A beam search request (use_beam_search) runs one cv_beam_driver per prompt instead of one engine
 * request (beam_driver.h); the driver's final event arrives through the same callback, as the prompt's
 * only event, so the reply is built the same way.
 *
 * Aborts come from the HTTP layer (the client hung up: on_gone, on the HTTP loop thread) or from
 * shutdown (cv_generate_abort_all). They must not take the session's mutex, which the output
 * thread holds while it writes to the connection (the HTTP layer calls on_gone under the
 * connection's lock), so they only raise `aborted` and abort the ids published so far; the
 * submitter publishes each id before it looks at `aborted`, so between the two every id is
 * aborted (twice at worst, which the loop ignores).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "server/beam_driver.h"
#include "server/embed_chunks.h"
#include "server/request_log.h"
#include "server/server_internal.h"

typedef struct gen_slot {
    gen_session *g;
    size_t prompt;
} gen_slot;

struct gen_session {
    pthread_mutex_t mu;
    int refs;
    cv_server *s;
    cv_http_req *http;          /* until `replied` */
    cv_api_request req;
    cvllm_grammar *grammar;     /* req.params.grammar's reference, or NULL */
    const char *lora;           /* the LoRA adapter it names (the server's), or NULL */
    cv_api_response resp;
    gen_slot *slots;            /* an engine request's prompt */
    size_t n_requests;          /* engine requests: one a prompt, or a chunk of a long embeddings input */
    cv_embed_chunks *chunks;    /* a prompt each when an input runs in chunks, else NULL */
    uint64_t *ids;              /* engine request ids; the first n_submitted are valid */
    atomic_size_t n_submitted;
    cv_beam_driver **beams;     /* beam search: a driver a prompt; the first n_beams are valid */
    atomic_size_t n_beams;
    size_t n_open;              /* engine requests without their final event (or never submitted) */
    double arrival;             /* when the body was complete, before tokenization (TTFT start) */
    atomic_bool aborted;
    bool replied;               /* the HTTP reply is finished */
    char *sse;                  /* a stream's bytes not yet pushed */
    cv_anthropic_stream *anthropic; /* an Anthropic stream: rewrites them into its events, else NULL */
    cv_responses_stream *responses; /* a Responses API stream: the same for its events, else NULL */
    size_t sse_len, sse_cap;
    char *response_id;          /* a background Responses API request's: answered at once, its reply
                                 * is the stored response (http is NULL after the answer) */
    gen_session *prev, *next;   /* cv_server.sessions */
};

static gen_session *session_new(cv_server *s, cv_http_req *r, cv_api_request *req, cvllm_grammar *grammar,
                                const char *lora, double arrival) {
    gen_session *g = cv_xcalloc(1, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    g->s = s;
    g->lora = lora;
    g->http = r;
    g->arrival = arrival;
    g->grammar = grammar;
    g->req = *req;
    memset(req, 0, sizeof *req);
    if (s->load_tracking) atomic_fetch_add(&s->load, 1);
    g->n_requests = g->req.n_prompts;
    /* vLLM's chunked processing: an embeddings input past max_model_len, in chunks of it */
    const size_t chunk_len = g->req.kind == CV_API_EMBEDDING && s->limits.embed_chunked ? (size_t)s->limits.max_model_len : 0;
    for (size_t i = 0; i < g->req.n_prompts; i++)
        g->n_requests += cv_embed_chunk_count(g->req.prompts[i].n_ids, chunk_len) - 1;
    if (g->n_requests > g->req.n_prompts) {
        g->chunks = cv_xcalloc(g->req.n_prompts, sizeof *g->chunks);
        for (size_t i = 0; i < g->req.n_prompts; i++) cv_embed_chunks_init(&g->chunks[i], g->req.prompts[i].n_ids, chunk_len);
    }
    g->refs = 1 + (int)g->n_requests;
    g->n_open = g->n_requests;
    g->slots = cv_xcalloc(g->n_requests, sizeof *g->slots);
    g->ids = cv_xcalloc(g->n_requests, sizeof *g->ids);
    if (g->req.beam_search) g->beams = cv_xcalloc(g->req.n_prompts, sizeof *g->beams);
    if (g->req.anthropic && g->req.stream) g->anthropic = cv_anthropic_stream_new();
    if (g->req.responses && g->req.stream) g->responses = cv_responses_stream_new(&g->req);
    /* vLLM names the adapter in the replies of a LoRA request, the first served name otherwise */
    cv_api_response_init(&g->resp, &g->req, s->tok, lora ? lora : s->names[0], s->cached_details);
    pthread_mutex_lock(&s->sessions_mu);
    g->next = s->sessions;
    if (s->sessions) s->sessions->prev = g;
    s->sessions = g;
    if (s->stopping) atomic_store(&g->aborted, true);
    pthread_mutex_unlock(&s->sessions_mu);
    return g;
}

static void release(gen_session *g, int n) {
    if (n == 0) return;
    pthread_mutex_lock(&g->mu);
    g->refs -= n;
    int left = g->refs;
    pthread_mutex_unlock(&g->mu);
    assert(left >= 0);
    if (left > 0) return;
    cv_server *s = g->s;
    if (s->load_tracking) atomic_fetch_sub(&s->load, 1);
    /* the last touch of s: once the list is empty, cv_server_stop may return and free it */
    pthread_mutex_lock(&s->sessions_mu);
    if (g->prev) g->prev->next = g->next;
    else s->sessions = g->next;
    if (g->next) g->next->prev = g->prev;
    pthread_cond_broadcast(&s->sessions_cv);
    pthread_mutex_unlock(&s->sessions_mu);
    for (size_t i = 0; g->chunks && i < g->req.n_prompts; i++) cv_embed_chunks_free(&g->chunks[i]);
    free(g->chunks);
    cv_api_response_free(&g->resp);
    cv_api_request_free(&g->req);
    cvllm_grammar_release(g->grammar);
    for (size_t i = 0; i < atomic_load(&g->n_beams); i++) cv_beam_driver_free(g->beams[i]);
    free(g->beams);
    free(g->slots);
    free(g->ids);
    free(g->sse);
    cv_anthropic_stream_free(g->anthropic);
    cv_responses_stream_free(g->responses);
    free(g->response_id);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Aborts every engine request of the session once; see the top for why no lock is taken. */
static void abort_session(gen_session *g, const char *why) {
    if (atomic_exchange(&g->aborted, true)) return;
    cv_info("server", "aborted request %s (%s)", g->resp.id, why);
    size_t n = atomic_load(&g->n_submitted);
    for (size_t i = 0; i < n; i++) cv_engine_group_abort(g->s->group, g->ids[i]);
    size_t n_beams = atomic_load(&g->n_beams);
    for (size_t i = 0; i < n_beams; i++) cv_beam_driver_abort(g->beams[i]);
}

static void on_gone(void *arg) { abort_session(arg, "client disconnected"); }

void cv_generate_abort_response(cv_server *s, const char *response_id) {
    pthread_mutex_lock(&s->sessions_mu);
    for (gen_session *g = s->sessions; g; g = g->next)
        if (g->response_id && !strcmp(g->response_id, response_id)) abort_session(g, "cancelled");
    pthread_mutex_unlock(&s->sessions_mu);
}

void cv_generate_abort_all(cv_server *s) {
    pthread_mutex_lock(&s->sessions_mu);
    s->stopping = true;
    for (gen_session *g = s->sessions; g; g = g->next) abort_session(g, "server shutting down");
    pthread_mutex_unlock(&s->sessions_mu);
}

/* An error reply in the shape of the request's API. */
static void reply_error(cv_http_req *r, const cv_api_error *err, bool anthropic) {
    if (anthropic) cv_server_reply_anthropic_error(r, err);
    else cv_server_reply_error(r, err);
}

/* Hands the stream bytes gathered so far to the connection (an Anthropic stream's as its events);
 * the caller holds g->mu. */
static void push_sse(gen_session *g) {
    if (g->anthropic && g->sse_len) cv_anthropic_stream_convert(g->anthropic, &g->sse, &g->sse_len, &g->sse_cap);
    if (g->responses && g->sse_len) cv_responses_stream_convert(g->responses, &g->sse, &g->sse_len, &g->sse_cap);
    if (g->sse_len == 0) return;
    if (!g->response_id) cv_http_stream_push(g->http, g->sse, g->sse_len);
    else if (!atomic_load(&g->aborted)) /* a cancelled background stream ends where it was cancelled */
        cv_response_store_events_add(g->s->responses, g->response_id, g->sse, g->sse_len);
    g->sse_len = 0;
}

void cv_generate_fail_all(cv_server *s, const char *why) {
    cv_api_error err;
    cv_api_fail(&err, 500, NULL, "%s", why);
    pthread_mutex_lock(&s->sessions_mu);
    s->stopping = true;
    for (gen_session *g = s->sessions; g; g = g->next) {
        pthread_mutex_lock(&g->mu);
        if (!g->replied) { /* the reply has begun: cv_generate holds g->mu until then */
            if (g->response_id) {
                cv_response_store_fail(s->responses, g->response_id);
                cv_response_store_events_end(s->responses, g->response_id);
            } else if (g->req.stream) {
                cv_api_stream_error(&err, &g->sse, &g->sse_len, &g->sse_cap);
                push_sse(g);
                cv_http_stream_end(g->http);
            } else {
                reply_error(g->http, &err, g->req.anthropic);
            }
            g->replied = true; /* the session stays: the process ends without the engine's last events */
        }
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_unlock(&s->sessions_mu);
}

/* vLLM's request id in its logs: the reply's, with the prompt's index for completions. */
static void log_id(const gen_session *g, size_t i, char *out, size_t cap) {
    if (g->req.kind == CV_API_CHAT) snprintf(out, cap, "%s", g->resp.id);
    else snprintf(out, cap, "%s-%zu", g->resp.id, i);
}

/* params NULL: an embedding request, whose PoolingParams vLLM logs; chunk k of a prompt in chunks
 * (n_chunks > 1) is logged under vLLM's chunk id. */
static void log_received(const gen_session *g, size_t i, size_t k, size_t n_chunks, const cvllm_sampling_params *params) {
    char id[160];
    if (n_chunks > 1) snprintf(id, sizeof id, "%s-prompt-%zu-chunk-%zu", g->resp.id, i, k);
    else log_id(g, i, id, sizeof id);
    if (!params) {
        char repr[160], dims[16];
        const cvllm_pooling_params *p = &g->req.pooling;
        snprintf(dims, sizeof dims, "%d", p->dimensions);
        snprintf(repr, sizeof repr, "PoolingParams(task='%.40s', dimensions=%s, use_activation=%s)",
                 p->task ? p->task : g->s->limits.pooling_task, p->dimensions ? dims : "None",
                 p->normalize < 0 ? "None" : p->normalize ? "True" : "False");
        cv_log_request_received(id, repr, g->lora);
        return;
    }
    cvllm_sampling_params shown = *params;
    shown.max_tokens = g->req.prompts[i].max_tokens; /* as vLLM's params carry it, resolved */
    char *repr = cv_sampling_params_repr(&shown, g->req.truncate_prompt_tokens,
                                         g->req.constraint.kind ? &g->req.constraint : NULL);
    cv_log_request_received(id, repr, g->lora);
    free(repr);
}

/* --enable-log-outputs: each choice of prompt i, once it is through. */
static void log_generated(const gen_session *g, size_t i) {
    char id[128];
    log_id(g, i, id, sizeof id);
    if (g->req.stream) snprintf(id + strlen(id), sizeof id - strlen(id), " (streaming complete)");
    const size_t n = (size_t)g->req.params.n;
    for (size_t c = i * n; c < (i + 1) * n && c < g->resp.n_choices; c++) {
        const cv_api_choice *ch = &g->resp.choices[c];
        cv_log_response_generated(id, ch->text ? ch->text : "", ch->text_len, ch->token_ids, ch->n_tokens,
                                  cvllm_finish_reason_name(ch->finish), g->s->max_log_len);
    }
}

/* A stored response's conversation, for previous_response_id. */
static json_t *history(void *store, const char *id) { return cv_response_store_history(store, id); }

/* A finished Responses API reply, kept when the server stores them and the request did not say
 * store false. */
static void store_response(gen_session *g, const json_t *response) {
    if (g->s->responses && g->req.responses_store && response)
        cv_response_store_put(g->s->responses, response, g->req.responses_messages);
}

/* A background request's answer: the response "queued", which the store keeps "in_progress" (the
 * generation is submitted) from before the client can ask for it; with stream, the event stream,
 * which the request's connection follows from the store's event log as any GET of it would. The
 * caller holds g->mu, so the generation cannot finish first. */
static void answer_background(gen_session *g) {
    json_t *queued = cv_api_responses_queued(&g->resp), *stored = json_deep_copy(queued);
    g->response_id = cv_xstrdup(json_string_value(json_object_get(queued, "id")));
    json_object_set_new(stored, "status", json_string("in_progress"));
    cv_response_store_put(g->s->responses, stored, g->req.responses_messages);
    if (g->req.stream) {
        cv_response_store_events_open(g->s->responses, g->response_id);
        cv_response_store_events_follow(g->s->responses, g->response_id, g->http, -1);
    } else {
        char *json = json_dumps(queued, JSON_COMPACT);
        cv_http_respond(g->http, 200, "application/json", json, strlen(json));
        free(json);
    }
    g->http = NULL;
    cv_info("server", "response %s runs in the background", g->response_id);
    json_decref(stored);
    json_decref(queued);
}

/* A background request's end: the finished response (a stream's as response.completed carried it)
 * replaces the stored one unless it was cancelled; a generation aborted otherwise (the server
 * stopping) leaves it "failed". A stream's log ends, and with it its followers' streams. */
static void finish_background(gen_session *g) {
    cv_response_store *st = g->s->responses;
    if (atomic_load(&g->aborted)) {
        cv_response_store_fail(st, g->response_id);
    } else if (g->responses) {
        const json_t *final = cv_responses_stream_final(g->responses);
        if (final) cv_response_store_finish(st, final, g->req.responses_messages);
        else cv_response_store_fail(st, g->response_id);
    } else {
        json_t *response = cv_api_responses_object(&g->resp);
        cv_response_store_finish(st, response, g->req.responses_messages);
        json_decref(response);
    }
    if (g->req.stream) cv_response_store_events_end(st, g->response_id);
}

/* The whole non-streaming reply: JSON, or an embeddings or /pooling request's raw bytes
 * (encoding_format bytes, with vLLM's metadata header; bytes_only without it). */
static void reply(gen_session *g) {
    const cv_api_request *req = &g->req;
    if (g->response_id) {
        finish_background(g);
        return;
    }
    if ((req->kind == CV_API_EMBEDDING || req->kind == CV_API_POOLING) &&
        (req->encoding == CV_ENC_BYTES || req->encoding == CV_ENC_BYTES_ONLY)) {
        size_t len;
        char *metadata;
        char *body = cv_api_embedding_bytes(&g->resp, &len, &metadata);
        if (req->encoding == CV_ENC_BYTES) cv_http_set_header(g->http, "metadata", metadata);
        cv_http_respond(g->http, 200, "application/octet-stream", body, len);
        free(metadata);
        free(body);
        return;
    }
    cv_api_error err;
    json_t *response = req->responses ? cv_api_responses_object(&g->resp) : NULL;
    store_response(g, response);
    char *json = req->kind == CV_API_COHERE_EMBED ? cv_api_cohere_json(&g->resp, &err)
                 : req->anthropic             ? cv_api_anthropic_json(&g->resp, &err)
                 : response                   ? json_dumps(response, JSON_COMPACT)
                                              : cv_api_response_json(&g->resp);
    json_decref(response);
    if (!json) {
        reply_error(g->http, &err, req->anthropic);
        return;
    }
    cv_http_respond(g->http, 200, "application/json", json, strlen(json));
    free(json);
}

/* The loop's callback, on its output thread. */
static void on_event(void *user, cv_request_event *ev) {
    gen_slot *slot = user;
    gen_session *g = slot->g;
    bool finished = ev->finished;
    int drop = finished ? 1 : 0;
    pthread_mutex_lock(&g->mu);
    cv_embed_chunks *chunks = g->chunks && g->chunks[slot->prompt].n_chunks > 1 ? &g->chunks[slot->prompt] : NULL;
    /* a chunk counts for its prompt once the prompt's last chunk has folded them all into ev */
    const bool whole = !chunks || cv_embed_chunks_fold(chunks, ev);
    if (!g->replied) {
        bool stream = g->req.stream;
        if (whole) cv_api_response_apply(&g->resp, slot->prompt, ev, stream ? &g->sse : NULL, &g->sse_len, &g->sse_cap);
        if (finished && g->s->log_outputs && !cv_api_kind_pools(g->req.kind)) log_generated(g, slot->prompt);
        bool last = finished && --g->n_open == 0;
        if (stream) {
            if (last) cv_api_response_stream_end(&g->resp, &g->sse, &g->sse_len, &g->sse_cap);
            push_sse(g);
            if (last && g->response_id) {
                finish_background(g);
            } else if (last) {
                if (g->responses) store_response(g, cv_responses_stream_final(g->responses));
                cv_http_stream_end(g->http);
            }
        } else if (last) {
            /* Sent even to a client that left: the HTTP layer drops it, and the request is over. */
            reply(g);
        }
        if (last) {
            g->replied = true;
            drop++;
        }
    }
    pthread_mutex_unlock(&g->mu);
    cv_request_event_free(ev);
    release(g, drop);
}

/* Prompt i's beam search driver, published before checking for an abort; 0 or the submit's code. */
static int start_beams(gen_session *g, size_t i) {
    const cv_api_request *req = &g->req;
    const cv_api_prompt *p = &req->prompts[i];
    const cv_beam_config cfg = {.width = req->params.n, .max_tokens = p->max_tokens, .ignore_eos = req->params.ignore_eos,
                                .include_stop_str_in_output = req->params.include_stop_str_in_output,
                                .length_penalty = req->length_penalty, .temperature = req->params.temperature,
                                .eos_token_id = cv_beam_eos_token_id(g->s->tok), .top_logprobs = req->top_logprobs,
                                .n_prompt = p->n_ids};
    int rc = 0;
    const cvllm_prompt prompt = {.token_ids = p->ids, .n_token_ids = p->n_ids, .cache_salt = req->cache_salt,
                                 .lora_name = g->lora};
    cv_beam_driver *d = cv_beam_driver_start(g->s->group, g->s->tok, &cfg, &prompt, g->arrival, on_event, &g->slots[i],
                                             &rc);
    if (!d) return rc;
    g->beams[i] = d;
    atomic_fetch_add(&g->n_beams, 1);
    if (atomic_load(&g->aborted)) cv_beam_driver_abort(d);
    return 0;
}

/* Submits one engine request per prompt (per chunk of a long embeddings input), or starts its beam
 * search, publishing each id before checking for an abort. On failure the ones already in are
 * aborted, the rest are written off, and *err says why. The caller holds g->mu, so no event is
 * folded before the reply has begun. */
static int submit_all(gen_session *g, cv_api_error *err) {
    const cv_api_request *req = &g->req;
    const bool pooling = cv_api_kind_pools(req->kind);
    const size_t chunk_len = (size_t)g->s->limits.max_model_len;
    size_t j = 0; /* the engine request */
    for (size_t i = 0; i < req->n_prompts; i++) {
        const cv_api_prompt *p = &req->prompts[i];
        cvllm_sampling_params params = cv_api_prompt_params(req, i);
        const size_t n_chunks = g->chunks ? g->chunks[i].n_chunks : 1;
        for (size_t k = 0; k < n_chunks; k++, j++) {
            const size_t begin = k * chunk_len, n = n_chunks > 1 && p->n_ids - begin > chunk_len ? chunk_len : p->n_ids - begin;
            cvllm_prompt prompt = {.token_ids = p->ids + begin, .n_token_ids = n, .cache_salt = req->cache_salt,
                                   .lora_name = g->lora};
            g->slots[j] = (gen_slot){g, i};
            if (g->s->log_requests) log_received(g, i, k, n_chunks, pooling ? NULL : &params);
            cv_submit sub = {.prompt = &prompt,
                             .params = &params,
                             .pooling = pooling ? &req->pooling : NULL,
                             .on_event = on_event,
                             .user = &g->slots[j],
                             .arrival_time = g->arrival};
            /* completions echo with max_tokens 0 generates nothing either way */
            const bool beams = req->beam_search && !req->echo_only;
            int rc = beams ? start_beams(g, i) : cv_engine_group_submit(g->s->group, &sub, &g->ids[j]);
            if (rc == 0 && beams) continue;
            if (rc == 0) {
                atomic_fetch_add(&g->n_submitted, 1);
                if (atomic_load(&g->aborted)) cv_engine_group_abort(g->s->group, g->ids[j]);
                continue;
            }
            int status = rc == CVLLM_ERR_INVALID_ARGUMENT || rc == CVLLM_ERR_CAPACITY ? 400
                         : rc == CVLLM_ERR_UNAVAILABLE                                ? 503
                                                                                      : 500;
            if (rc == CVLLM_ERR_NOT_FOUND && g->lora) /* its adapter was unloaded since the name was looked up */
                cv_api_fail(err, 404, "model", "The model `%.200s` does not exist.", g->lora);
            else
                cv_api_fail(err, status, NULL, "%s", cvllm_last_error());
            size_t unsent = g->n_requests - j;
            g->n_open -= unsent;
            g->refs -= (int)unsent; /* the HTTP reference keeps refs above zero */
            size_t n_in = atomic_load(&g->n_submitted), n_beams = atomic_load(&g->n_beams);
            for (size_t m = 0; m < n_in; m++) cv_engine_group_abort(g->s->group, g->ids[m]);
            for (size_t m = 0; m < n_beams; m++) cv_beam_driver_abort(g->beams[m]);
            return -1;
        }
    }
    return 0;
}

/* The request's constraint compiled against the engine's vocabulary, into its params. The group
 * hands out replica 0's engine read-only, which prepares every request of the group;
 * cvllm_grammar_compile is the call documented safe on any thread while the loop steps it. A
 * constraint the engine refuses is a 400 with its message. */
static int compile_constraint(cv_server *s, cv_api_request *req, cvllm_grammar **out, cv_api_error *err) {
    *out = NULL;
    if (!req->has_constraint) return 0;
    int rc = cvllm_grammar_compile(cv_engine_group_engine(s->group), &req->constraint, out);
    if (rc != CVLLM_OK)
        return cv_api_fail(err, rc == CVLLM_ERR_INVALID_ARGUMENT || rc == CVLLM_ERR_UNSUPPORTED || rc == CVLLM_ERR_CAPACITY ? 400 : 500,
                           NULL, "%s", cvllm_last_error());
    req->params.grammar = *out;
    return 0;
}

static int parse_and_prepare(cv_server *s, cv_api_kind kind, const char *body, size_t len, cv_api_request *req,
                             cvllm_grammar **grammar, const char **lora, cv_api_error *err) {
    *grammar = NULL;
    *lora = NULL;
    int rc = kind == CV_API_CHAT         ? cv_api_parse_chat(body, len, &s->limits, req, err)
             : kind == CV_API_INVOCATION ? cv_api_parse_invocation(body, len, &s->limits, req, err)
             : kind == CV_API_EMBEDDING  ? cv_api_parse_embedding(body, len, &s->limits, req, err)
             : kind == CV_API_SCORE      ? cv_api_parse_score(body, len, &s->limits, req, err)
             : kind == CV_API_RERANK     ? cv_api_parse_rerank(body, len, &s->limits, req, err)
             : kind == CV_API_CLASSIFY   ? cv_api_parse_classify(body, len, &s->limits, req, err)
             : kind == CV_API_POOLING    ? cv_api_parse_pooling(body, len, &s->limits, req, err)
             : kind == CV_API_COHERE_EMBED ? cv_api_parse_cohere_embed(body, len, &s->limits, req, err)
             : kind == CV_API_MESSAGES   ? cv_api_parse_anthropic(body, len, &s->limits, false, req, err)
             : kind == CV_API_RESPONSES  ? cv_api_parse_responses(body, len, &s->limits, s->responses ? history : NULL,
                                                              s->responses, req, err)
                                         : cv_api_parse_completion(body, len, &s->limits, req, err);
    if (rc) return rc;
    if (!cv_server_model_name(s, req->model, lora, err)) return -1;
    if (atomic_load(&s->failed)) return cv_api_fail(err, 503, NULL, "%s", s->failure);
    if (atomic_load(&s->draining)) return cv_api_fail(err, 503, NULL, "The server is shutting down");
    if (req->stream && s->force_usage) req->include_usage = true;
    return cv_api_prepare(req, s->tok, &s->limits, err) || compile_constraint(s, req, grammar, err);
}

void cv_generate(cv_server *s, cv_http_req *r, cv_api_kind kind) {
    cv_api_request req;
    cv_api_error err;
    cvllm_grammar *grammar;
    double arrival = cv_now();
    const char *lora;
    if (parse_and_prepare(s, kind, cv_http_body(r), cv_http_body_len(r), &req, &grammar, &lora, &err)) {
        cv_api_request_free(&req);
        reply_error(r, &err, kind == CV_API_MESSAGES);
        return;
    }
    /* vLLM's _base_request_id: an X-Request-Id header names the reply (cmpl-ID) over the body's request_id */
    const char *header_id = cv_http_get_header(r, "X-Request-Id");
    if (header_id) {
        free(req.request_id);
        req.request_id = cv_xstrdup(header_id);
    }
    gen_session *g = session_new(s, r, &req, grammar, lora, arrival);
    /* OpenAI's `user` identifies the end user for abuse monitoring: it goes to the log only. */
    if (g->req.user) cv_info("server", "request %s from user '%.200s'", g->resp.id, g->req.user);
    const bool background = g->req.responses_background; /* runs on when its client has gone */
    if (!background) cv_http_on_gone(r, on_gone, g);
    pthread_mutex_lock(&g->mu);
    if (submit_all(g, &err)) {
        g->replied = true;
        reply_error(r, &err, g->req.anthropic);
        pthread_mutex_unlock(&g->mu);
        release(g, 1);
        return;
    }
    if (background) answer_background(g);
    else if (g->req.stream) cv_http_stream_begin(r, 200, "text/event-stream; charset=utf-8");
    pthread_mutex_unlock(&g->mu);
    /* The HTTP reference now belongs to whichever event finishes the reply. */
}
