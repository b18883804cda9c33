/*
 * api_response.c — engine events → vLLM's response JSON and SSE chunks (see api.h).
 *
 * One accumulator serves both modes. Every event is folded into per-choice state (text, token ids,
 * logprobs, finish reason); a streaming request additionally turns what is new into chunks at once,
 * so nothing waits for the end. Choices are numbered prompt × n + completion, as vLLM numbers them
 * for a list of prompts.
 *
 * Shapes follow vLLM: non-streaming replies print unset fields as null; stream chunks carry only
 * the fields vLLM sets; the usage chunk has "choices":[]; a logprob of -inf prints as -9999.0;
 * completion logprobs use the legacy {text_offset, token_logprobs, tokens, top_logprobs} form, chat
 * logprobs the {content:[{token, logprob, bytes, top_logprobs}]} form. A chat choice's text becomes
 * content, reasoning and tool_calls in api_chat_output.c.
 */
#define _GNU_SOURCE /* memmem */
#include <assert.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/utf8.h"
#include "server/api_internal.h"
#include "tokenizer/tokenizer.h"

/* ------------------------------------------------------------------------------------------------ */
/* Setup                                                                                             */

void cv_api_random_hex(char *out, size_t n_bytes) {
    unsigned char raw[32];
    assert(n_bytes <= sizeof raw);
    if (getrandom(raw, n_bytes, 0) != (ssize_t)n_bytes) {
        /* getrandom on Linux only fails without entropy at early boot; time still keeps ids apart. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        for (size_t i = 0; i < n_bytes; i++) raw[i] = (unsigned char)((uint64_t)ts.tv_nsec >> (i % 8 * 8));
    }
    for (size_t i = 0; i < n_bytes; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

void cv_api_response_init(cv_api_response *r, const cv_api_request *req, const cvllm_tokenizer *tok,
                          const char *model, bool cached_tokens_details) {
    memset(r, 0, sizeof *r);
    r->req = req;
    r->tok = tok;
    r->model = model;
    r->cached_tokens_details = cached_tokens_details;
    r->created = (int64_t)time(NULL);
    const char *prefix = req->kind == CV_API_CHAT        ? "chatcmpl-"
                         : req->kind == CV_API_EMBEDDING || req->kind == CV_API_COHERE_EMBED ? "embd-"
                         : req->kind == CV_API_CLASSIFY  ? "classify-"
                         : req->kind == CV_API_POOLING   ? "pooling-"
                         : cv_api_kind_pools(req->kind)  ? "score-" /* /score's and, in current vLLM, /rerank's */
                                                         : "cmpl-";
    if (req->request_id) {
        snprintf(r->id, sizeof r->id, "%s%s", prefix, req->request_id);
    } else {
        char hex[33];
        cv_api_random_hex(hex, 16);
        snprintf(r->id, sizeof r->id, "%s%s", prefix, hex);
    }
    r->n_choices = req->n_prompts * (size_t)req->params.n;
    r->choices = cv_xcalloc(r->n_choices ? r->n_choices : 1, sizeof *r->choices);
    for (size_t i = 0; i < r->n_choices; i++) {
        r->choices[i].stop_token_id = -1;
        cv_api_chat_choice_init(req, &r->choices[i]);
    }
    r->prompts = cv_xcalloc(req->n_prompts ? req->n_prompts : 1, sizeof *r->prompts);
}

static void free_positions(cvllm_position_logprobs *lp, size_t n) {
    if (!lp) return;
    for (size_t i = 0; i < n; i++) free((void *)lp[i].top);
    free(lp);
}

void cv_api_response_free(cv_api_response *r) {
    for (size_t i = 0; i < r->n_choices; i++) {
        cv_api_choice *c = &r->choices[i];
        free(c->text);
        free(c->token_ids);
        free_positions(c->logprobs, c->n_tokens);
        free(c->stop_str);
        cv_api_chat_choice_free(r->req, c);
    }
    free(r->choices);
    for (size_t i = 0; i < r->req->n_prompts; i++) {
        free_positions(r->prompts[i].prompt_logprobs, r->prompts[i].n_prompt_tokens);
        free(r->prompts[i].embedding);
    }
    free(r->prompts);
    memset(r, 0, sizeof *r);
}

bool cv_api_response_done(const cv_api_response *r) {
    for (size_t i = 0; i < r->req->n_prompts; i++)
        if (!r->prompts[i].finished) return false;
    return true;
}

/* ------------------------------------------------------------------------------------------------ */
/* Tokens and logprobs                                                                               */

char *cv_api_token_string(const cvllm_tokenizer *tok, int32_t id, bool as_id) {
    if (as_id) return cv_xasprintf("token_id:%d", id);
    char *text = NULL;
    /* Ids past the tokenizer's vocabulary (padding rows of the embedding) decode to nothing. */
    if (cvllm_detokenize(tok, &id, 1, false, &text) != CVLLM_OK) return cv_xstrdup("");
    return text;
}

json_t *cv_api_token_strs(const cvllm_tokenizer *tok, const int32_t *ids, size_t n_ids) {
    const cv_tokenizer *t = (const cv_tokenizer *)tok; /* the public handle is the internal object */
    json_t *strs = json_array();
    for (size_t i = 0; i < n_ids; i++) {
        char *s = cv_tokenizer_id_to_token(t, ids[i]);
        json_array_append_new(strs, s ? json_string(s) : json_null());
        free(s);
    }
    return strs;
}

static double clamp_logprob(float lp) {
    return isfinite(lp) ? lp : (lp > 0 ? 0.0 : -9999.0);
}

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static void copy_positions(cvllm_position_logprobs *dst, const cvllm_position_logprobs *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dst[i] = src[i];
        cvllm_logprob *top = NULL;
        if (src[i].n_top > 0) {
            top = cv_xmalloc((size_t)src[i].n_top * sizeof *top);
            memcpy(top, src[i].top, (size_t)src[i].n_top * sizeof *top);
        }
        dst[i].top = top;
    }
}

typedef struct legacy_logprobs {
    json_t *text_offset, *token_logprobs, *tokens, *top_logprobs;
} legacy_logprobs;

static legacy_logprobs legacy_new(void) {
    return (legacy_logprobs){json_array(), json_array(), json_array(), json_array()};
}

static void legacy_free(legacy_logprobs *l) {
    json_decref(l->text_offset);
    json_decref(l->token_logprobs);
    json_decref(l->tokens);
    json_decref(l->top_logprobs);
}

static json_t *legacy_json(legacy_logprobs *l) {
    return json_pack("{s:o, s:o, s:o, s:o}", "text_offset", l->text_offset, "token_logprobs", l->token_logprobs,
                     "tokens", l->tokens, "top_logprobs", l->top_logprobs);
}

/* One position of the legacy form; `lp` NULL is the first prompt token (no distribution). Returns
 * the token's length in characters, which moves the next text_offset. */
static size_t legacy_add(const cv_api_response *r, legacy_logprobs *l, int32_t id, const cvllm_position_logprobs *lp,
                         size_t offset) {
    bool as_id = r->req->tokens_as_ids;
    char *token = cv_api_token_string(r->tok, id, as_id);
    json_array_append_new(l->text_offset, json_integer((json_int_t)offset));
    json_array_append_new(l->tokens, json_string(token));
    if (!lp) {
        json_array_append_new(l->token_logprobs, json_null());
        json_array_append_new(l->top_logprobs, json_null());
    } else {
        json_array_append_new(l->token_logprobs, json_real(clamp_logprob(lp->chosen.logprob)));
        json_t *top = json_object();
        json_object_set_new(top, token, json_real(clamp_logprob(lp->chosen.logprob)));
        for (int32_t k = 0; k < lp->n_top && k < r->req->top_logprobs; k++) {
            char *t = cv_api_token_string(r->tok, lp->top[k].token_id, as_id);
            json_object_set_new(top, t, json_real(clamp_logprob(lp->top[k].logprob)));
            free(t);
        }
        json_array_append_new(l->top_logprobs, top);
    }
    size_t chars = utf8_chars(token);
    free(token);
    return chars;
}

static json_t *chat_token_json(const cv_api_response *r, int32_t id, float logprob) {
    char *token = cv_api_token_string(r->tok, id, r->req->tokens_as_ids);
    json_t *bytes = json_array();
    for (const unsigned char *p = (const unsigned char *)token; *p; p++) json_array_append_new(bytes, json_integer(*p));
    json_t *o = json_pack("{s:s, s:f, s:o}", "token", token, "logprob", clamp_logprob(logprob), "bytes", bytes);
    free(token);
    return o;
}

static json_t *chat_logprobs(const cv_api_response *r, const int32_t *ids, const cvllm_position_logprobs *lps, size_t n) {
    json_t *content = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *e = chat_token_json(r, ids[i], lps[i].chosen.logprob);
        json_t *top = json_array();
        for (int32_t k = 0; k < lps[i].n_top && k < r->req->top_logprobs; k++)
            json_array_append_new(top, chat_token_json(r, lps[i].top[k].token_id, lps[i].top[k].logprob));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(content, e);
    }
    return json_pack("{s:o}", "content", content);
}

/* vLLM's prompt_logprobs: [null, {"id": {"logprob", "rank", "decoded_token"}}, ...]. */
static json_t *prompt_logprobs_json(const cv_api_response *r, const cvllm_position_logprobs *lps, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        if (i == 0) {
            json_array_append_new(a, json_null());
            continue;
        }
        json_t *pos = json_object();
        for (int32_t k = -1; k < lps[i].n_top; k++) {
            const cvllm_logprob *e = k < 0 ? &lps[i].chosen : &lps[i].top[k];
            char key[16];
            snprintf(key, sizeof key, "%d", e->token_id);
            char *t = cv_api_token_string(r->tok, e->token_id, r->req->tokens_as_ids);
            json_object_set_new(pos, key, json_pack("{s:f, s:i, s:s}", "logprob", clamp_logprob(e->logprob), "rank",
                                                    e->rank, "decoded_token", t));
            free(t);
        }
        json_array_append_new(a, pos);
    }
    return a;
}

/* ------------------------------------------------------------------------------------------------ */
/* Folding events in                                                                                 */

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static void append_tokens(cv_api_choice *c, const cv_completion_delta *d) {
    if (c->n_tokens + d->n_token_ids > c->cap_tokens) {
        c->cap_tokens = (c->n_tokens + d->n_token_ids) * 2;
        c->token_ids = cv_xrealloc(c->token_ids, c->cap_tokens * sizeof *c->token_ids);
        if (d->logprobs || c->logprobs) c->logprobs = cv_xrealloc(c->logprobs, c->cap_tokens * sizeof *c->logprobs);
    }
    if (d->n_token_ids) memcpy(c->token_ids + c->n_tokens, d->token_ids, d->n_token_ids * sizeof *d->token_ids);
    if (d->logprobs) copy_positions(c->logprobs + c->n_tokens, d->logprobs, d->n_token_ids);
    c->n_tokens += d->n_token_ids;
    cv_buf_append(&c->text, &c->text_len, &c->text_cap, d->text ? d->text : "", d->text ? d->text_len : 0);
}

static void apply_finish(cv_api_choice *c, const cv_completion_delta *d) {
    if (d->finish_reason == CVLLM_FINISH_NONE) return;
    c->finish = d->finish_reason;
    c->stop_token_id = d->stop_token_id;
    free(c->stop_str);
    c->stop_str = d->stop_str ? cv_xstrdup(d->stop_str) : NULL;
}

static json_t *stop_reason_json(const cv_api_choice *c) {
    if (c->stop_str) return json_string(c->stop_str);
    if (c->stop_token_id >= 0) return json_integer(c->stop_token_id);
    return json_null();
}

static json_t *finish_json(cvllm_finish_reason f) {
    const char *name = cvllm_finish_reason_name(f);
    return name ? json_string(name) : json_null();
}

static json_t *usage_json(const cv_api_response *r) {
    size_t prompt = 0, completion = 0, cached = 0;
    for (size_t i = 0; i < r->req->n_prompts; i++) {
        prompt += r->prompts[i].n_prompt_tokens;
        cached += r->prompts[i].n_cached_tokens;
    }
    for (size_t i = 0; i < r->n_choices; i++) completion += r->choices[i].n_tokens;
    json_t *u = json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)prompt, "total_tokens",
                          (json_int_t)(prompt + completion), "completion_tokens", (json_int_t)completion);
    json_object_set_new(u, "prompt_tokens_details",
                        r->cached_tokens_details ? json_pack("{s:I}", "cached_tokens", (json_int_t)cached) : json_null());
    return u;
}

static void append_chunk(cv_api_response *r, json_t *choice, char **sse, size_t *len, size_t *cap) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object",
                          r->req->kind == CV_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)r->created, "model", r->model, "choices", choice);
    if (r->req->continuous_usage) json_object_set_new(o, "usage", usage_json(r));
    /* return_prompt_text: the rendered prompt rides on the stream's first chunk (vLLM). */
    if (r->req->return_prompt_text && !r->prompt_text_sent) {
        const cv_api_prompt *p = &r->req->prompts[0];
        json_object_set_new(o, "prompt_text", json_stringn(p->text ? p->text : "", p->text ? p->text_len : 0));
        r->prompt_text_sent = true;
    }
    cv_api_sse_event(sse, len, cap, NULL, o);
}

/* The prompt as text, for completions echo (token prompts are decoded). */
static char *prompt_text(const cv_api_response *r, size_t pi) {
    const cv_api_prompt *p = &r->req->prompts[pi];
    if (p->text) return cv_xstrndup(p->text, p->text_len);
    char *text = NULL;
    if (cvllm_detokenize(r->tok, p->ids, p->n_ids, false, &text) != CVLLM_OK) return cv_xstrdup("");
    return text;
}

/* Echoed prompt tokens for completion logprobs: the first has no distribution. */
static size_t legacy_add_prompt(const cv_api_response *r, legacy_logprobs *l, size_t pi, size_t offset) {
    const cv_api_prompt *p = &r->req->prompts[pi];
    const cvllm_position_logprobs *lps = r->prompts[pi].prompt_logprobs;
    for (size_t t = 0; t < p->n_ids; t++) offset += legacy_add(r, l, p->ids[t], t && lps ? &lps[t] : NULL, offset);
    return offset;
}

static void stream_completion_delta(cv_api_response *r, size_t pi, cv_api_choice *c, size_t ci,
                                    const cv_completion_delta *d, char **sse, size_t *len, size_t *cap) {
    const cv_api_request *req = r->req;
    bool first = !c->started, finished = d->finish_reason != CVLLM_FINISH_NONE;
    size_t n_new = req->echo_only ? 0 : d->n_token_ids;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    legacy_logprobs l = legacy_new();
    if (first && req->echo) {
        char *pt = prompt_text(r, pi);
        cv_buf_append(&text, &text_len, &text_cap, pt, strlen(pt));
        free(pt);
        if (req->top_logprobs >= 0) c->text_chars = legacy_add_prompt(r, &l, pi, c->text_chars);
    }
    if (!req->echo_only) cv_buf_append(&text, &text_len, &text_cap, d->text ? d->text : "", d->text ? d->text_len : 0);
    if (req->top_logprobs >= 0 && d->logprobs)
        for (size_t t = 0; t < n_new; t++) c->text_chars += legacy_add(r, &l, d->token_ids[t], &d->logprobs[t], c->text_chars);
    c->started = true;
    if (text_len == 0 && n_new == 0 && !finished && !(first && req->echo)) {
        legacy_free(&l);
        free(text);
        return;
    }
    json_t *choice = json_pack("{s:I, s:s, s:o, s:o, s:o}", "index", (json_int_t)ci, "text", text ? text : "", "logprobs",
                               req->top_logprobs >= 0 ? legacy_json(&l) : json_null(), "finish_reason",
                               finish_json(d->finish_reason), "stop_reason", finished ? stop_reason_json(c) : json_null());
    if (req->top_logprobs < 0) legacy_free(&l);
    if (req->return_token_ids) json_object_set_new(choice, "token_ids", ids_json(d->token_ids, n_new));
    free(text);
    append_chunk(r, choice, sse, len, cap);
}

static void stream_chat_delta(cv_api_response *r, cv_api_choice *c, size_t ci, const cv_completion_delta *d, char **sse,
                              size_t *len, size_t *cap) {
    const cv_api_request *req = r->req;
    bool finished = d->finish_reason != CVLLM_FINISH_NONE;
    if (!c->started) {
        c->started = true;
        append_chunk(r,
                     json_pack("{s:I, s:{s:s, s:s}, s:n, s:n}", "index", (json_int_t)ci, "delta", "role", "assistant",
                               "content", "", "logprobs", "finish_reason"),
                     sse, len, cap);
        if (req->echo_text && *req->echo_text)
            append_chunk(r,
                         json_pack("{s:I, s:{s:s}, s:n, s:n}", "index", (json_int_t)ci, "delta", "content", req->echo_text,
                                   "logprobs", "finish_reason"),
                         sse, len, cap);
    }
    json_t *delta = cv_api_chat_stream_delta(req, c, d->text ? d->text : "", d->text ? d->text_len : 0, finished);
    /* Text the parsers hold back still sends its tokens' logprobs and ids, never an empty chunk. */
    bool token_data = d->n_token_ids && (req->top_logprobs >= 0 || req->return_token_ids);
    if (json_object_size(delta) == 0 && !finished && !token_data) {
        json_decref(delta);
        return;
    }
    if (json_object_size(delta) == 0 && !finished) json_object_set_new(delta, "content", json_string(""));
    json_t *lp = req->top_logprobs >= 0 && d->logprobs ? chat_logprobs(r, d->token_ids, d->logprobs, d->n_token_ids)
                                                       : json_null();
    const char *reason = cv_api_chat_finish_reason(req, d->finish_reason, c->n_tool_calls);
    json_t *choice = json_pack("{s:I, s:o, s:o, s:o}", "index", (json_int_t)ci, "delta", delta, "logprobs", lp,
                               "finish_reason", reason ? json_string(reason) : json_null());
    if (finished) json_object_set_new(choice, "stop_reason", stop_reason_json(c));
    if (req->return_token_ids) json_object_set_new(choice, "token_ids", ids_json(d->token_ids, d->n_token_ids));
    append_chunk(r, choice, sse, len, cap);
}

void cv_api_response_apply(cv_api_response *r, size_t pi, const cv_request_event *ev, char **sse, size_t *sse_len,
                           size_t *sse_cap) {
    assert(pi < r->req->n_prompts);
    cv_api_prompt_result *pr = &r->prompts[pi];
    pr->n_prompt_tokens = ev->n_prompt_token_ids;
    pr->n_cached_tokens = ev->n_cached_tokens;
    if (ev->prompt_logprobs && !pr->prompt_logprobs) {
        pr->prompt_logprobs = cv_xmalloc((ev->n_prompt_token_ids ? ev->n_prompt_token_ids : 1) * sizeof *pr->prompt_logprobs);
        copy_positions(pr->prompt_logprobs, ev->prompt_logprobs, ev->n_prompt_token_ids);
    }
    if (ev->embedding && !pr->embedding) {
        pr->embedding = cv_xmalloc(ev->n_embedding * sizeof *pr->embedding);
        memcpy(pr->embedding, ev->embedding, ev->n_embedding * sizeof *pr->embedding);
        pr->n_embedding = ev->n_embedding;
    }
    size_t n = (size_t)r->req->params.n;
    for (int32_t k = 0; k < ev->n_outputs; k++) {
        const cv_completion_delta *d = &ev->outputs[k];
        if (d->index < 0 || (size_t)d->index >= n) continue;
        size_t ci = pi * n + (size_t)d->index;
        cv_api_choice *c = &r->choices[ci];
        if (!r->req->echo_only) append_tokens(c, d);
        apply_finish(c, d);
        if (!sse) continue;
        if (r->req->kind == CV_API_CHAT) stream_chat_delta(r, c, ci, d, sse, sse_len, sse_cap);
        else stream_completion_delta(r, pi, c, ci, d, sse, sse_len, sse_cap);
    }
    if (ev->finished) pr->finished = true;
}

void cv_api_sse_translate(char **sse, size_t *len, size_t *cap, void (*fn)(void *user, const json_t *payload), void *user,
                          char **out, size_t *out_len, size_t *out_cap) {
    static const char prefix[] = "data: ";
    *out_len = 0;
    for (const char *p = *sse, *end = *sse + *len; p < end;) {
        const char *stop = memmem(p, (size_t)(end - p), "\n\n", 2), *rec_end = stop ? stop : end;
        assert(!strncmp(p, prefix, strlen(prefix))); /* the chat stream writes whole data: records */
        const char *data = p + strlen(prefix);
        const size_t n = (size_t)(rec_end - data);
        if (n == 6 && !memcmp(data, "[DONE]", 6)) {
            fn(user, NULL);
        } else {
            json_t *payload = json_loadb(data, n, 0, NULL);
            assert(payload); /* written by append_chunk or cv_api_stream_error */
            fn(user, payload);
            json_decref(payload);
        }
        p = stop ? stop + 2 : end;
    }
    *len = 0;
    cv_buf_append(sse, len, cap, *out ? *out : "", *out_len);
}

void cv_api_sse_event(char **buf, size_t *len, size_t *cap, const char *name, json_t *data) {
    char *s = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    char *rec = name ? cv_xasprintf("event: %s\ndata: %s\n\n", name, s) : cv_xasprintf("data: %s\n\n", s);
    cv_buf_append(buf, len, cap, rec, strlen(rec));
    free(rec);
    free(s);
}

void cv_api_response_stream_end(cv_api_response *r, char **sse, size_t *len, size_t *cap) {
    if (r->req->include_usage) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object",
                              r->req->kind == CV_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)r->created, "model", r->model, "choices", "usage", usage_json(r));
        cv_api_sse_event(sse, len, cap, NULL, o);
    }
    cv_buf_append(sse, len, cap, "data: [DONE]\n\n", 14);
}

void cv_api_stream_error(const cv_api_error *err, char **sse, size_t *len, size_t *cap) {
    char *s = cv_api_error_json(err);
    cv_buf_append(sse, len, cap, "data: ", 6);
    cv_buf_append(sse, len, cap, s, strlen(s));
    cv_buf_append(sse, len, cap, "\n\ndata: [DONE]\n\n", 16);
    free(s);
}

/* ------------------------------------------------------------------------------------------------ */
/* Non-streaming bodies                                                                              */

static json_t *completion_choice(const cv_api_response *r, size_t pi, size_t ci) {
    const cv_api_request *req = r->req;
    const cv_api_choice *c = &r->choices[ci];
    const cv_api_prompt *p = &req->prompts[pi];
    char *text = NULL;
    size_t len = 0, cap = 0;
    json_t *logprobs = json_null();
    if (req->echo) {
        char *pt = prompt_text(r, pi);
        cv_buf_append(&text, &len, &cap, pt, strlen(pt));
        free(pt);
    }
    cv_buf_append(&text, &len, &cap, c->text ? c->text : "", c->text_len);
    if (req->top_logprobs >= 0) {
        legacy_logprobs l = legacy_new();
        size_t offset = req->echo ? legacy_add_prompt(r, &l, pi, 0) : 0;
        for (size_t t = 0; t < c->n_tokens && c->logprobs; t++) offset += legacy_add(r, &l, c->token_ids[t], &c->logprobs[t], offset);
        logprobs = legacy_json(&l);
    }
    json_t *o = json_pack("{s:I, s:s%, s:o, s:o, s:o}", "index", (json_int_t)ci, "text", text ? text : "", len, "logprobs",
                          logprobs, "finish_reason", finish_json(c->finish), "stop_reason", stop_reason_json(c));
    free(text);
    json_object_set_new(o, "prompt_logprobs",
                        r->prompts[pi].prompt_logprobs
                            ? prompt_logprobs_json(r, r->prompts[pi].prompt_logprobs, p->n_ids)
                            : json_null());
    json_object_set_new(o, "prompt_token_ids", req->return_token_ids ? ids_json(p->ids, p->n_ids) : json_null());
    json_object_set_new(o, "token_ids", req->return_token_ids ? ids_json(c->token_ids, c->n_tokens) : json_null());
    return o;
}

static json_t *chat_choice(const cv_api_response *r, size_t ci) {
    const cv_api_request *req = r->req;
    const cv_api_choice *c = &r->choices[ci];
    size_t n_calls = 0;
    json_t *message = cv_api_chat_message(req, c, &n_calls);
    const char *reason = cv_api_chat_finish_reason(req, c->finish, n_calls);
    json_t *lp = req->top_logprobs >= 0 && c->logprobs ? chat_logprobs(r, c->token_ids, c->logprobs, c->n_tokens)
                                                       : json_null();
    json_t *o = json_pack("{s:I, s:o, s:o, s:o, s:o}", "index", (json_int_t)ci, "message", message, "logprobs", lp,
                          "finish_reason", reason ? json_string(reason) : json_null(), "stop_reason", stop_reason_json(c));
    json_object_set_new(o, "token_ids", req->return_token_ids ? ids_json(c->token_ids, c->n_tokens) : json_null());
    return o;
}

/* ---- embeddings ---------------------------------------------------------------------------------- */

static size_t embed_width(const cv_api_request *req) {
    return req->embed_dtype == CV_EMBED_F32 ? 4 : req->embed_dtype <= CV_EMBED_BF16 ? 2 : 1;
}

/* vLLM's tensor2binary: the vector cast to embed_dtype (rounded to nearest even as torch casts, fp8
 * included), its bytes in the asked order, into raw[n · width]. */
static void embedding_raw(const cv_api_request *req, const float *v, size_t n, uint8_t *raw) {
    const size_t width = embed_width(req);
    const bool swap = req->endianness == CV_ENDIAN_BIG; /* the machines cvllm runs on are little-endian */
    for (size_t i = 0; i < n; i++) {
        uint32_t u = 0;
        switch (req->embed_dtype) {
        case CV_EMBED_F32: memcpy(&u, &v[i], 4); break;
        case CV_EMBED_F16: u = cv_f32_to_f16(v[i]); break;
        case CV_EMBED_BF16: u = cv_f32_to_bf16(v[i]); break;
        case CV_EMBED_FP8_E4M3: u = cv_f32_to_fp8_e4m3(v[i]); break;
        case CV_EMBED_FP8_E5M2: u = cv_f32_to_fp8_e5m2(v[i]); break;
        }
        for (size_t b = 0; b < width; b++) raw[i * width + (swap ? width - 1 - b : b)] = (uint8_t)(u >> (8 * b));
    }
}

/* The raw bytes as standard base64 with padding. */
static json_t *embedding_base64(const cv_api_request *req, const float *v, size_t n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t bytes = n * embed_width(req);
    uint8_t *raw = cv_xmalloc(bytes ? bytes : 1);
    embedding_raw(req, v, n, raw);
    char *out = cv_xmalloc((bytes + 2) / 3 * 4 + 1), *o = out;
    for (size_t i = 0; i < bytes; i += 3) {
        uint32_t w = (uint32_t)raw[i] << 16 | (i + 1 < bytes ? (uint32_t)raw[i + 1] << 8 : 0) |
                     (i + 2 < bytes ? raw[i + 2] : 0);
        *o++ = digits[w >> 18 & 63];
        *o++ = digits[w >> 12 & 63];
        *o++ = i + 1 < bytes ? digits[w >> 6 & 63] : '=';
        *o++ = i + 2 < bytes ? digits[w & 63] : '=';
    }
    *o = '\0';
    json_t *s = json_string(out);
    free(out);
    free(raw);
    return s;
}

/* vLLM's EmbeddingResponse, or its PoolingResponse: the same list with each vector's item named
 * `object` and the vector under `key`. */
static char *embedding_json(const cv_api_response *r, const char *object, const char *key) {
    const cv_api_request *req = r->req;
    json_t *data = json_array();
    for (size_t i = 0; i < req->n_prompts; i++) {
        const cv_api_prompt_result *pr = &r->prompts[i];
        json_t *vec;
        if (req->encoding == CV_ENC_BASE64) {
            vec = embedding_base64(req, pr->embedding, pr->n_embedding);
        } else if (req->token_width) { /* a token task: one list a prompt token */
            vec = json_array();
            for (size_t t = 0; t + (size_t)req->token_width <= pr->n_embedding; t += (size_t)req->token_width) {
                json_t *row = json_array();
                for (size_t k = t; k < t + (size_t)req->token_width; k++) json_array_append_new(row, json_real(pr->embedding[k]));
                json_array_append_new(vec, row);
            }
        } else {
            vec = json_array();
            for (size_t k = 0; k < pr->n_embedding; k++) json_array_append_new(vec, json_real(pr->embedding[k]));
        }
        json_array_append_new(data, json_pack("{s:I, s:s, s:o}", "index", (json_int_t)i, "object", object, key, vec));
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object", "list", "created",
                          (json_int_t)r->created, "model", r->model, "data", data, "usage", usage_json(r));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Cohere's packed bits of a vector: one bit a value (>= 0), eight to a byte, the first value the
 * high bit; binary shifts each byte by −128 into a signed int8. NULL when the length is not a
 * multiple of 8. */
static json_t *cohere_bits(const float *v, size_t n, bool is_signed) {
    if (n % 8) return NULL;
    json_t *out = json_array();
    for (size_t i = 0; i < n; i += 8) {
        int byte = 0;
        for (size_t b = 0; b < 8; b++) byte |= (v[i + b] >= 0) << (7 - b);
        json_array_append_new(out, json_integer(is_signed ? byte - 128 : byte));
    }
    return out;
}

/* The vectors under each asked type (base64: little-endian float32), the texts when they were the
 * input, meta's token count. */
char *cv_api_cohere_json(const cv_api_response *r, cv_api_error *err) {
    const cv_api_request *req = r->req;
    static const char *const names[] = {"float", "binary", "ubinary", "base64"};
    json_t *by_type = json_object();
    size_t tokens = 0;
    for (size_t i = 0; i < req->n_prompts; i++) tokens += r->prompts[i].n_prompt_tokens;
    for (int k = 0; k < 4; k++) {
        if (!(req->embedding_types & (1u << k))) continue;
        json_t *list = json_array();
        for (size_t i = 0; i < req->n_prompts; i++) {
            const cv_api_prompt_result *pr = &r->prompts[i];
            json_t *v;
            if (k == 0) {
                v = json_array();
                for (size_t j = 0; j < pr->n_embedding; j++) json_array_append_new(v, json_real(pr->embedding[j]));
            } else if (k == 3) {
                v = embedding_base64(req, pr->embedding, pr->n_embedding); /* float32, little-endian */
            } else if (!(v = cohere_bits(pr->embedding, pr->n_embedding, k == 1))) {
                cv_api_fail(err, 400, NULL, "Embedding dimension must be a multiple of 8 for binary embedding types, "
                            "but got %zu.", pr->n_embedding);
                json_decref(list);
                json_decref(by_type);
                return NULL;
            }
            json_array_append_new(list, v);
        }
        json_object_set_new(by_type, names[k], list);
    }
    json_t *o = json_pack("{s:s, s:o, s:{s:{s:s}, s:{s:I}}}", "id", r->id, "embeddings", by_type, "meta",
                          "api_version", "version", "2", "tokens", "input_tokens", (json_int_t)tokens);
    if (req->n_texts_1) {
        json_t *texts = json_array();
        for (size_t i = 0; i < req->n_texts_1; i++) json_array_append_new(texts, json_string(req->texts_1[i]));
        json_object_set_new(o, "texts", texts);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* vLLM's ClassificationResponse: each prompt's probabilities (its scores after the activation) and
 * the name of the most likely label, the first of equals (numpy's argmax). */
static char *classify_json(const cv_api_response *r) {
    const cv_api_request *req = r->req;
    json_t *data = json_array();
    for (size_t i = 0; i < req->n_prompts; i++) {
        const cv_api_prompt_result *pr = &r->prompts[i];
        json_t *probs = json_array();
        size_t best = 0;
        for (size_t k = 0; k < pr->n_embedding; k++) {
            json_array_append_new(probs, json_real(pr->embedding[k]));
            if (pr->embedding[k] > pr->embedding[best]) best = k;
        }
        const char *label = pr->n_embedding && req->class_labels ? req->class_labels[best] : NULL;
        json_array_append_new(data, json_pack("{s:I, s:o, s:o, s:I}", "index", (json_int_t)i, "label",
                                              label ? json_string(label) : json_null(), "probs", probs, "num_classes",
                                              (json_int_t)pr->n_embedding));
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object", "list", "created",
                          (json_int_t)r->created, "model", r->model, "data", data, "usage", usage_json(r));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- scores ------------------------------------------------------------------------------------- */

/* ColBERT's MaxSim of two texts' token rows (width w): over the query's rows, the largest dot
 * product with any of the document's, summed (vLLM's late interaction for token_embed models). */
static double maxsim(const cv_api_prompt_result *q, const cv_api_prompt_result *d, size_t w) {
    double sum = 0;
    for (size_t i = 0; i + w <= q->n_embedding; i += w) {
        double best = -INFINITY;
        for (size_t j = 0; j + w <= d->n_embedding; j += w) {
            double dot = 0;
            for (size_t k = 0; k < w; k++) dot += (double)q->embedding[i + k] * d->embedding[j + k];
            best = fmax(best, dot);
        }
        sum += best;
    }
    return sum;
}

/* The score of pair i: a reranker's own (one value a prompt), else the cosine similarity of the two
 * texts' embeddings (torch's cosine_similarity, eps 1e-8) or their token rows' MaxSim, the query's
 * repeated for 1:N. */
static double pair_score(const cv_api_response *r, size_t i) {
    const cv_api_request *req = r->req;
    if (req->n_prompts == req->n_texts_2) return r->prompts[i].n_embedding ? r->prompts[i].embedding[0] : 0;
    const cv_api_prompt_result *a = &r->prompts[req->n_texts_1 == 1 ? 0 : i], *b = &r->prompts[req->n_texts_1 + i];
    if (req->token_width) return maxsim(a, b, (size_t)req->token_width);
    double dot = 0, na = 0, nb = 0;
    for (size_t k = 0; k < a->n_embedding && k < b->n_embedding; k++) {
        dot += (double)a->embedding[k] * b->embedding[k];
        na += (double)a->embedding[k] * a->embedding[k];
        nb += (double)b->embedding[k] * b->embedding[k];
    }
    return dot / fmax(sqrt(na) * sqrt(nb), 1e-8);
}

typedef struct ranked {
    size_t index;
    double score;
} ranked;

/* Descending score, ties in document order (Python's stable sort). */
static int by_score(const void *x, const void *y) {
    const ranked *a = x, *b = y;
    if (a->score != b->score) return a->score < b->score ? 1 : -1;
    return (a->index > b->index) - (a->index < b->index);
}

/* vLLM's ScoreResponse, or its RerankResponse: results best first, cut to top_n, each with its
 * document's text. */
static char *score_json(const cv_api_response *r) {
    const cv_api_request *req = r->req;
    const size_t n = req->n_texts_2;
    json_t *o;
    if (req->kind == CV_API_SCORE) {
        json_t *data = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(data, json_pack("{s:I, s:s, s:f}", "index", (json_int_t)i, "object", "score", "score",
                                                  (double)(float)pair_score(r, i)));
        o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object", "list", "created", (json_int_t)r->created,
                      "model", r->model, "data", data, "usage", usage_json(r));
    } else {
        ranked *order = cv_xmalloc(n * sizeof *order);
        for (size_t i = 0; i < n; i++) order[i] = (ranked){i, (double)(float)pair_score(r, i)};
        qsort(order, n, sizeof *order, by_score);
        const size_t keep = req->top_n > 0 && (size_t)req->top_n < n ? (size_t)req->top_n : n;
        json_t *results = json_array();
        for (size_t k = 0; k < keep; k++)
            json_array_append_new(results, json_pack("{s:I, s:{s:s, s:n}, s:f}", "index", (json_int_t)order[k].index,
                                                     "document", "text", req->texts_2[order[k].index], "multi_modal",
                                                     "relevance_score", order[k].score));
        free(order);
        json_t *u = usage_json(r);
        o = json_pack("{s:s, s:s, s:{s:O, s:O}, s:o}", "id", r->id, "model", r->model, "usage", "prompt_tokens",
                      json_object_get(u, "prompt_tokens"), "total_tokens", json_object_get(u, "total_tokens"),
                      "results", results);
        json_decref(u);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

char *cv_api_embedding_bytes(const cv_api_response *r, size_t *len, char **metadata) {
    static const char *const dtypes[] = {[CV_EMBED_F32] = "float32", [CV_EMBED_F16] = "float16", [CV_EMBED_BF16] = "bfloat16",
                                         [CV_EMBED_FP8_E4M3] = "fp8_e4m3", [CV_EMBED_FP8_E5M2] = "fp8_e5m2"};
    static const char *const endians[] = {[CV_ENDIAN_NATIVE] = "native", [CV_ENDIAN_BIG] = "big", [CV_ENDIAN_LITTLE] = "little"};
    const cv_api_request *req = r->req;
    size_t total = 0;
    for (size_t i = 0; i < req->n_prompts; i++) total += r->prompts[i].n_embedding * embed_width(req);
    char *body = cv_xmalloc(total ? total : 1);
    json_t *items = json_array();
    size_t offset = 0;
    for (size_t i = 0; i < req->n_prompts; i++) {
        const cv_api_prompt_result *pr = &r->prompts[i];
        const size_t size = pr->n_embedding * embed_width(req);
        embedding_raw(req, pr->embedding, pr->n_embedding, (uint8_t *)body + offset);
        /* shape: [n], or a token task's [rows, width] */
        json_t *shape = req->token_width ? json_pack("[I, I]", (json_int_t)(pr->n_embedding / (size_t)req->token_width),
                                                     (json_int_t)req->token_width)
                                         : json_pack("[I]", (json_int_t)pr->n_embedding);
        json_array_append_new(items, json_pack("{s:I, s:s, s:s, s:I, s:I, s:o}", "index", (json_int_t)i, "embed_dtype",
                                               dtypes[req->embed_dtype], "endianness", endians[req->endianness], "start",
                                               (json_int_t)offset, "end", (json_int_t)(offset + size), "shape", shape));
        offset += size;
    }
    json_t *u = usage_json(r), *o = json_pack("{s:s, s:I, s:s, s:o, s:{s:O, s:O}}", "id", r->id, "created",
                                             (json_int_t)r->created, "model", r->model, "data", items, "usage",
                                             "prompt_tokens", json_object_get(u, "prompt_tokens"), "total_tokens",
                                             json_object_get(u, "total_tokens"));
    json_decref(u);
    *metadata = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    *len = total;
    return body;
}

char *cv_api_response_json(const cv_api_response *r) {
    const cv_api_request *req = r->req;
    if (req->kind == CV_API_EMBEDDING) return embedding_json(r, "embedding", "embedding");
    if (req->kind == CV_API_POOLING) return embedding_json(r, "pooling", "data");
    if (req->kind == CV_API_CLASSIFY) return classify_json(r);
    assert(req->kind != CV_API_COHERE_EMBED); /* cv_api_cohere_json, which may refuse */
    if (cv_api_kind_pools(req->kind)) return score_json(r);
    json_t *o = cv_api_generation_object(r);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

json_t *cv_api_generation_object(const cv_api_response *r) {
    const cv_api_request *req = r->req;
    bool chat = req->kind == CV_API_CHAT;
    json_t *choices = json_array();
    size_t n = (size_t)req->params.n;
    for (size_t ci = 0; ci < r->n_choices; ci++)
        json_array_append_new(choices, chat ? chat_choice(r, ci) : completion_choice(r, ci / n, ci));
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:n, s:n, s:o}", "id", r->id, "object",
                          chat ? "chat.completion" : "text_completion", "created", (json_int_t)r->created, "model",
                          r->model, "choices", choices, "service_tier", "system_fingerprint", "usage", usage_json(r));
    if (chat) {
        const cv_api_prompt *p = &req->prompts[0];
        json_object_set_new(o, "prompt_logprobs",
                            r->prompts[0].prompt_logprobs ? prompt_logprobs_json(r, r->prompts[0].prompt_logprobs, p->n_ids)
                                                          : json_null());
        json_object_set_new(o, "prompt_token_ids", req->return_token_ids ? ids_json(p->ids, p->n_ids) : json_null());
        json_object_set_new(o, "prompt_text", req->return_prompt_text && p->text ? json_stringn(p->text, p->text_len) : json_null());
    }
    json_object_set_new(o, "kv_transfer_params", json_null());
    return o;
}
