/*
 * fuzz_request.c — libFuzzer target for the server's request parser and response builder
 * (src/server/api*.c).
 *
 * Each input is parsed as a completions, a chat, a /tokenize and a /detokenize body, and as the
 * pooling routes' (/v1/embeddings, /pooling and /v2/embed on an embedding model, /classify and /pooling on a
 * classifier of three labels, /pooling and /score on a token_embed model, /score and /rerank on an embedding model and on a reranker with the chat
 * template as its score template; the route /invocations picks is a pooling one). A rejected
 * request must yield an error whose JSON serialises (the message is cut to valid UTF-8); an accepted
 * completions or chat request is prepared against the real Qwen3 tokenizer with a small context,
 * must then satisfy the context-length rules (truncate_prompt_tokens included), and is answered with
 * one synthetic event per prompt, both as a non-streaming body and as SSE, each of which must be
 * valid JSON; an accepted pooling request must fit the context and is answered with a synthetic vector
 * (scores for the classifiers), as JSON (or, for encoding_format bytes, raw bytes of the right length
 * and a metadata header that is JSON).
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "server/api.h"
#include "server/embed_chunks.h"

enum { MAX_MODEL_LEN = 64, VOCAB = 151936 };

static const cvllm_tokenizer *tokenizer(void) {
    static cvllm_tokenizer *tok;
    if (!tok && cvllm_tokenizer_create(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", &tok) != CVLLM_OK) abort();
    return tok;
}

/* The chat template the Qwen3 tokenizer ships, with hermes tool calls and the qwen3 reasoning parser. */
static const cv_api_chat_config *chat_config(void) {
    /* <think> and </think> are ids 151667 and 151668 in the Qwen3 tokenizer, as the server finds them */
    static cv_api_chat_config cfg = {.reasoning_parser = true, .has_tool_parser = true, .auto_tool_choice = true,
                                     .think_start_id = 151667, .think_end_id = 151668};
    static cv_chat_template *tmpl;
    if (!tmpl && cv_chat_template_load(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", NULL, &tmpl) != 0) abort();
    cfg.tmpl = tmpl;
    return &cfg;
}

static void require(int cond) {
    if (!cond) abort();
}

static void require_json(const char *s, size_t len) {
    json_t *j = json_loadb(s, len, 0, NULL);
    require(j != NULL);
    json_decref(j);
}

static void check_error(const cv_api_error *err) {
    require(err->status >= 400 && err->status < 600 && err->message[0]);
    char *s = cv_api_error_json(err);
    require(s != NULL);
    require_json(s, strlen(s));
    free(s);
}

/* The prepared request obeys the context rules; answer it with one token per choice. */
static void answer(const cv_api_request *req) {
    for (size_t i = 0; i < req->n_prompts; i++) {
        const cv_api_prompt *p = &req->prompts[i];
        require(p->n_ids > 0 && p->n_ids < MAX_MODEL_LEN);
        require(p->max_tokens >= 1 && p->max_tokens <= MAX_MODEL_LEN - (int32_t)p->n_ids);
        for (size_t t = 0; t < p->n_ids; t++) require(p->ids[t] >= 0 && p->ids[t] < VOCAB);
        require(req->truncate_prompt_tokens < 0 || p->n_ids <= (size_t)req->truncate_prompt_tokens);
    }
    cv_api_response resp;
    cv_api_response_init(&resp, req, tokenizer(), "fuzz", true);
    char *sse = NULL;
    size_t len = 0, cap = 0;
    int32_t id = 40;
    cvllm_logprob top = {40, -0.5f, 1};
    cvllm_position_logprobs lp = {.chosen = top, .top = &top, .n_top = 1};
    cv_completion_delta *d = calloc((size_t)req->params.n, sizeof *d);
    for (int32_t k = 0; k < req->params.n; k++)
        d[k] = (cv_completion_delta){.index = k, .token_ids = &id, .n_token_ids = 1, .text = "I", .text_len = 1,
                                     .logprobs = req->params.logprobs >= 0 ? &lp : NULL,
                                     .finish_reason = CVLLM_FINISH_LENGTH, .stop_token_id = -1};
    for (size_t i = 0; i < req->n_prompts; i++) {
        cv_request_event ev = {.outputs = d, .n_outputs = req->params.n, .n_prompt_token_ids = req->prompts[i].n_ids,
                               .finished = true};
        cv_api_response_apply(&resp, i, &ev, req->stream ? &sse : NULL, &len, &cap);
    }
    require(cv_api_response_done(&resp));
    if (req->stream) {
        cv_api_response_stream_end(&resp, &sse, &len, &cap);
        if (req->anthropic || req->responses) {
            /* their events: "event: NAME\ndata: JSON\n\n"; Anthropic's then vLLM's data: [DONE] */
            if (req->anthropic) {
                cv_anthropic_stream *st = cv_anthropic_stream_new();
                cv_anthropic_stream_convert(st, &sse, &len, &cap);
                cv_anthropic_stream_free(st);
            } else {
                cv_responses_stream *st = cv_responses_stream_new(req);
                cv_responses_stream_convert(st, &sse, &len, &cap);
                cv_responses_stream_free(st);
            }
            cv_buf_append(&sse, &len, &cap, "", 1);
            char *p = sse;
            for (; !strncmp(p, "event: ", 7); p += 2) {
                char *data = strstr(p, "\ndata: "), *end = data ? strstr(data, "\n\n") : NULL;
                require(end != NULL);
                require_json(data + 7, (size_t)(end - data - 7));
                p = end;
            }
            require(!strcmp(p, req->anthropic ? "data: [DONE]\n\n" : ""));
            *sse = 0;
        }
        /* Each event is "data: " PAYLOAD "\n\n"; the next one starts after the blank line, not at the next
         * "data: ", which an echoed prompt may hold inside a JSON string. */
        for (char *p = sse; p && *p; p += 2) {
            require(strncmp(p, "data: ", 6) == 0);
            char *end = strstr(p, "\n\n");
            require(end != NULL);
            if (strncmp(p + 6, "[DONE]", 6)) require_json(p + 6, (size_t)(end - p - 6));
            p = end;
        }
    }
    char *body = cv_api_response_json(&resp);
    require_json(body, strlen(body));
    free(body);
    if (req->anthropic) {
        cv_api_error err;
        body = cv_api_anthropic_json(&resp, &err);
        if (body) require_json(body, strlen(body));
        else check_error(&err);
        free(body);
    }
    if (req->responses) {
        json_t *o = cv_api_responses_object(&resp);
        require(json_is_object(o) && json_is_array(json_object_get(o, "output")));
        json_decref(o);
    }
    free(sse);
    free(d);
    cv_api_response_free(&resp);
}

/* A prepared pooling request fits the context, or for embeddings with chunked processing on,
 * max_embed_len; answer each prompt with a vector of `width` (one a chunk, folded as the server does). */
static void answer_pooling(const cv_api_request *req, const cv_api_limits *lim, size_t width) {
    const bool chunked = req->kind == CV_API_EMBEDDING && lim->embed_chunked;
    for (size_t i = 0; i < req->n_prompts; i++) {
        const cv_api_prompt *p = &req->prompts[i];
        require(p->n_ids > 0 && (int64_t)p->n_ids <= (chunked ? lim->max_embed_len : MAX_MODEL_LEN));
        for (size_t t = 0; t < p->n_ids; t++) require(p->ids[t] >= 0 && p->ids[t] < VOCAB);
    }
    if (req->kind == CV_API_SCORE || req->kind == CV_API_RERANK)
        require(req->n_texts_2 > 0 && (req->n_texts_1 == 1 || req->n_texts_1 == req->n_texts_2));
    cv_api_response resp;
    cv_api_response_init(&resp, req, tokenizer(), "fuzz", false);
    float v[4] = {0.5f, -0.25f, 0.125f, 1.0f};
    cv_completion_delta d = {.finish_reason = CVLLM_FINISH_STOP, .stop_token_id = -1};
    for (size_t i = 0; i < req->n_prompts; i++) {
        cv_embed_chunks c;
        cv_embed_chunks_init(&c, req->prompts[i].n_ids, chunked ? MAX_MODEL_LEN : 0);
        for (size_t k = 0; k < c.n_chunks; k++) {
            const size_t n = k + 1 < c.n_chunks ? MAX_MODEL_LEN : req->prompts[i].n_ids - k * MAX_MODEL_LEN;
            cv_request_event ev = {.outputs = &d, .n_outputs = 1, .n_prompt_token_ids = n, .finished = true,
                                   .embedding = cv_xmalloc(sizeof v), .n_embedding = width};
            memcpy(ev.embedding, v, sizeof v);
            if (c.n_chunks == 1 || cv_embed_chunks_fold(&c, &ev)) {
                require(ev.n_prompt_token_ids == req->prompts[i].n_ids && ev.n_embedding == width);
                for (size_t m = 0; m < width; m++) require(fabsf(ev.embedding[m] - v[m]) < 1e-6f);
                cv_api_response_apply(&resp, i, &ev, NULL, NULL, NULL);
            }
            free(ev.embedding);
        }
        cv_embed_chunks_free(&c);
    }
    require(cv_api_response_done(&resp));
    if ((req->kind == CV_API_EMBEDDING || req->kind == CV_API_POOLING) &&
        (req->encoding == CV_ENC_BYTES || req->encoding == CV_ENC_BYTES_ONLY)) {
        size_t len;
        char *metadata;
        char *bytes = cv_api_embedding_bytes(&resp, &len, &metadata);
        const size_t value_bytes = req->embed_dtype == CV_EMBED_F32 ? 4 : req->embed_dtype <= CV_EMBED_BF16 ? 2 : 1;
        require(len == req->n_prompts * width * value_bytes);
        require_json(metadata, strlen(metadata));
        free(bytes);
        free(metadata);
    } else if (req->kind == CV_API_COHERE_EMBED) {
        cv_api_error err = {0};
        char *body = cv_api_cohere_json(&resp, &err);
        if (body) require_json(body, strlen(body));
        else check_error(&err);
        free(body);
    } else {
        char *body = cv_api_response_json(&resp);
        require_json(body, strlen(body));
        free(body);
    }
    cv_api_response_free(&resp);
}

typedef int (*pooling_parser)(const char *, size_t, const cv_api_limits *, cv_api_request *, cv_api_error *);

/* A classifier's labels ("reranker": one, scored with the chat template), else an embedder. */
static void parse_pooling(const char *body, size_t size, cv_api_limits lim, const char *model, pooling_parser parse) {
    static const char *const labels[] = {"neg", "neutral", "pos"}, *const input_types[] = {"query", "document"},
                             *const input_prompts[] = {"Instruct: find\nQuery:", ""};
    const bool reranker = !strcmp(model, "reranker"), classifier = !strcmp(model, "classifier"),
               tokens = !strcmp(model, "token-embedder");
    lim.pooling_task = reranker || classifier ? "classify" : tokens ? "token_embed" : "embed";
    lim.scores = !classifier; /* the token embedder's by late interaction */
    lim.token_width = tokens ? 2 : 0; /* two rows of the 4 values answered */
    lim.class_labels = reranker || classifier ? labels : NULL;
    lim.score_template = reranker ? chat_config()->tmpl : NULL;
    const bool embedder = !reranker && !classifier && !tokens;
    lim.input_types = embedder ? input_types : NULL;
    lim.input_prompts = embedder ? input_prompts : NULL;
    lim.n_input_types = embedder ? 2 : 0;
    lim.embed_chunked = embedder; /* long embeddings inputs in chunks, up to max_embed_len */
    lim.max_embed_len = embedder ? 3 * MAX_MODEL_LEN : 0;
    require(cv_api_kind_pools(cv_api_pooling_invocation(body, size, &lim)));
    cv_api_request req;
    cv_api_error err = {0};
    int rc = parse(body, size, &lim, &req, &err);
    if (rc == 0) rc = cv_api_prepare(&req, tokenizer(), &lim, &err);
    if (rc == 0) answer_pooling(&req, &lim, reranker ? 1 : classifier ? 3 : 4);
    else check_error(&err);
    cv_api_request_free(&req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cv_api_limits lim = {.max_model_len = MAX_MODEL_LEN, .vocab_size = VOCAB, .max_n = 4, .max_prompts = 4,
                         .gen_max_tokens = -1, .chat = chat_config()};
    cvllm_sampling_params_default(NULL, &lim.defaults);
    const char *body = (const char *)data;
    for (int kind = 0; kind < 4; kind++) { /* completion, chat, Anthropic messages, Responses */
        cv_api_request req;
        cv_api_error err = {0};
        int rc = kind == 3   ? cv_api_parse_responses(body, size, &lim, NULL, NULL, &req, &err)
                 : kind == 2 ? cv_api_parse_anthropic(body, size, &lim, false, &req, &err)
                 : kind    ? cv_api_parse_chat(body, size, &lim, &req, &err)
                           : cv_api_parse_completion(body, size, &lim, &req, &err);
        if (rc == 0) rc = cv_api_prepare(&req, tokenizer(), &lim, &err);
        if (rc == 0) answer(&req);
        else check_error(&err);
        cv_api_request_free(&req);
    }
    cv_api_request req;
    cv_api_error err = {0};
    if (cv_api_parse_tokenize(body, size, &lim, &req, &err) == 0) require(req.n_prompts == 1 && req.prompts[0].text);
    else check_error(&err);
    cv_api_request_free(&req);
    if (cv_api_parse_detokenize(body, size, &req, &err) == 0) require(req.n_prompts == 1);
    else check_error(&err);
    cv_api_request_free(&req);
    parse_pooling(body, size, lim, "embedder", cv_api_parse_embedding);
    parse_pooling(body, size, lim, "embedder", cv_api_parse_pooling);
    parse_pooling(body, size, lim, "embedder", cv_api_parse_cohere_embed);
    parse_pooling(body, size, lim, "embedder", cv_api_parse_score);
    parse_pooling(body, size, lim, "reranker", cv_api_parse_score);
    parse_pooling(body, size, lim, "reranker", cv_api_parse_rerank);
    parse_pooling(body, size, lim, "classifier", cv_api_parse_classify);
    parse_pooling(body, size, lim, "classifier", cv_api_parse_pooling);
    parse_pooling(body, size, lim, "token-embedder", cv_api_parse_pooling);
    parse_pooling(body, size, lim, "token-embedder", cv_api_parse_score);
    return 0;
}
