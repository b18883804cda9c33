/*
 * api.h — the OpenAI/vLLM wire protocol, without any HTTP or engine thread: request JSON in, prompts
 * and cvllm_sampling_params out; engine events in, response JSON and server-sent-event chunks out.
 *
 * Keeping this layer pure (it needs only a tokenizer for prompts and token strings) lets the unit
 * tests cover every field, default and error message without a socket or a model, and lets the
 * fuzzer hammer the parser alone.
 *
 * A request goes through two steps:
 *   1. cv_api_parse_*: strict JSON (jansson), then every field read as vLLM's pydantic models read it
 *      (api_fields.h): a value pydantic's lax mode would refuse is refused with vLLM's validation
 *      error, and a field this backend cannot honour is refused instead of dropped.
 *   2. cv_api_prepare: tokenizes text prompts, truncates them (truncate_prompt_tokens) and applies
 *      vLLM's context-length rules, which decide each prompt's max_tokens. Range checks of sampling
 *      values are left to the engine, which already words them as vLLM does, so there is one source
 *      of truth for them.
 *
 * Chat requests are rendered with the model's own Jinja chat template (src/chat/) at parse time, and
 * the parse also decides how the output is read back: the reasoning parser splits <think> blocks
 * into `reasoning`, the tool-call parser turns <tool_call> blocks into OpenAI `tool_calls`, and a
 * forced tool choice reads the constrained output as the call itself (api_chat_output.c). All run in
 * the response fold, streaming or not, so every way the engine's text is cut into deltas gives the
 * same message.
 *
 * Structured outputs (response_format, structured_outputs, tool_choice "required" or named) end as
 * one cvllm_constraint description in the request, with owned copies of its text. Compiling it
 * needs the engine, so the server does that after cv_api_prepare and puts the grammar into the
 * params; this layer only decides what the constraint is and from which token it applies.
 *
 * Errors are vLLM's {"error":{"message","type","param","code"}} with the HTTP status as code.
 */
#ifndef CV_SERVER_API_H
#define CV_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "chat/chat.h"
#include "chat/reasoning.h"
#include "chat/tool_parser.h"
#include "cvllm.h"
#include "engine/engine_loop.h"

/* ------------------------------------------------------------------------------------------------ */
/* Errors                                                                                            */

typedef struct cv_api_error {
    int status;                 /* HTTP status, also the "code" field */
    const char *type;           /* "BadRequestError", "Bad Request", "NotFoundError", ... (static) */
    char param[128];            /* offending field, "" = null */
    char message[2048];
} cv_api_error;

/* Fills *err and returns -1, for `return cv_api_fail(...)`. The type is the one vLLM sends with the
 * status: its serving errors' names for 400/404/500/501 ("BadRequestError"), else the HTTP reason
 * phrase its HTTPException handler sends ("Method Not Allowed"). */
int cv_api_fail(cv_api_error *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* {"error":{...}} as a NUL-terminated string (free()). */
char *cv_api_error_json(const cv_api_error *err);

/* ------------------------------------------------------------------------------------------------ */
/* Requests                                                                                          */

/* What a generation route takes. CV_API_INVOCATION is SageMaker's /invocations, which takes either:
 * parsed, a request is then a chat completion or a completion (its kind says which). */
typedef enum cv_api_kind {
    CV_API_COMPLETION, CV_API_CHAT, CV_API_INVOCATION,
    CV_API_MESSAGES,  /* /v1/messages: parsed into a CV_API_CHAT request with `anthropic` set */
    CV_API_RESPONSES, /* /v1/responses: parsed into a CV_API_CHAT request with `responses` set */
    /* the pooling routes: one pooling request a prompt */
    CV_API_EMBEDDING, CV_API_SCORE, CV_API_RERANK, CV_API_CLASSIFY, CV_API_POOLING, CV_API_COHERE_EMBED
} cv_api_kind;

/* /v2/embed's embedding_types, as bits. */
enum { CV_COHERE_FLOAT = 1, CV_COHERE_BINARY = 2, CV_COHERE_UBINARY = 4, CV_COHERE_BASE64 = 8 };

static inline bool cv_api_kind_pools(cv_api_kind k) { return k >= CV_API_EMBEDDING; }

/* /v1/embeddings' encoding_format, embed_dtype and endianness. */
typedef enum cv_api_encoding { CV_ENC_FLOAT, CV_ENC_BASE64, CV_ENC_BYTES, CV_ENC_BYTES_ONLY } cv_api_encoding;
typedef enum cv_api_embed_dtype {
    CV_EMBED_F32, CV_EMBED_F16, CV_EMBED_BF16, CV_EMBED_FP8_E4M3, CV_EMBED_FP8_E5M2
} cv_api_embed_dtype;
typedef enum cv_api_endianness { CV_ENDIAN_NATIVE, CV_ENDIAN_BIG, CV_ENDIAN_LITTLE } cv_api_endianness;

/* How chat is rendered and its output parsed: `cvllm serve`'s chat flags. */
typedef struct cv_api_chat_config {
    const cv_chat_template *tmpl;  /* NULL: chat is refused, as vLLM refuses a model without one */
    cv_chat_content_format content_format; /* --chat-template-content-format (AUTO: detected) */
    const json_t *default_kwargs;  /* --default-chat-template-kwargs (an object) or NULL */
    bool trust_request_template;   /* --trust-request-chat-template */
    bool reasoning_parser;         /* --reasoning-parser qwen3 */
    bool reasoning_content;        /* also emit the pre-2026 name reasoning_content */
    bool has_tool_parser;          /* --tool-call-parser given */
    cv_tool_parser_kind tool_parser;
    bool auto_tool_choice;         /* --enable-auto-tool-choice */
    bool exclude_tools_when_none;  /* --exclude-tools-when-tool-choice-none: tool_choice "none" renders no tools */
    int32_t think_start_id, think_end_id; /* "<think>" and "</think>" with a reasoning parser, else -1:
                                           * a constraint waits for the end of the reasoning */
} cv_api_chat_config;

/* The server's structured-output defaults (--structured-outputs-config). */
typedef struct cv_api_structured_config {
    bool disable_any_whitespace;   /* or'ed with each request's own */
    bool disable_additional_properties;
    const char *whitespace_pattern; /* when the request gives none; NULL = the engine's default */
    bool enable_in_reasoning;      /* constrain the reasoning section too (vLLM's default: false) */
} cv_api_structured_config;

/* Engine-wide facts the protocol needs; filled by the server from the engine. */
typedef struct cv_api_limits {
    int32_t max_model_len;
    int32_t vocab_size;
    int32_t max_n;              /* most choices per prompt */
    int32_t max_prompts;        /* most prompts in one completions request */
    int32_t gen_max_tokens;     /* generation_config max_new_tokens, or -1 */
    cvllm_sampling_params defaults; /* server defaults (generation_config applied) */
    const cv_api_chat_config *chat; /* NULL: no chat template (chat requests get vLLM's 400) */
    const char *served_model;   /* the first served model name, which vLLM names when it refuses
                                 * multimodal input; NULL reads as "model" */
    cv_api_structured_config structured;
    bool tokens_as_ids;         /* --return-tokens-as-token-ids: return_tokens_as_token_ids when a request
                                 * leaves it out (or null) */
    const char *pooling_task;   /* the engine's cvllm_engine_pooling_task: "embed", "classify" or NULL */
    bool scores;                /* /score and /rerank are served: an embedding model (token_embed: late
                                 * interaction), or a classifier of one label (vLLM enables its Scoring
                                 * API only for num_labels == 1) */
    bool embed_chunked;         /* --pooler-config enable_chunked_processing: an embeddings input longer
                                 * than max_model_len is embedded in chunks (embed_chunks.h) */
    int64_t max_embed_len;      /* its max_embed_len: the longest embeddings input, 0: not set */
    int32_t token_width;        /* a token task's (token_embed, token_classify) row width, else 0 */
    const char *const *class_labels; /* a classifier's label names (cvllm_engine_class_label), else NULL */
    const char *const *input_types;  /* an embedder's input types and their prefixes (cvllm_engine_input_type) */
    const char *const *input_prompts;
    int32_t n_input_types;
    const cv_chat_template *score_template; /* --chat-template, which renders a reranker's (query, document)
                                 * pairs; NULL: the pair is the two texts one after the other */
} cv_api_limits;

typedef struct cv_api_prompt {
    char *text;                 /* text prompts (chat: the rendered template); NULL for token ids */
    size_t text_len;
    int32_t *ids;               /* given, or filled by cv_api_prepare */
    size_t n_ids;
    int32_t max_tokens;         /* for the engine, set by cv_api_prepare */
    int32_t grammar_after_token_id; /* the params' field, set by cv_api_prepare: -1, or "</think>" when
                                     * the prompt leaves a reasoning section to the output */
} cv_api_prompt;

typedef struct cv_api_request {
    cv_api_kind kind;
    char *model;                /* NULL when the request names none */
    cv_api_prompt *prompts;
    size_t n_prompts;
    cvllm_sampling_params params; /* its arrays point into the fields below */
    char **stop;
    int32_t *stop_token_ids;
    int32_t *bias_ids;
    float *bias_values;
    int32_t *allowed_token_ids; /* NULL when not given; the engine judges the ids (vLLM's checks) */
    char **bad_words;
    int64_t max_tokens;         /* as requested (>= 1, or 0 with completions echo); -1 = not given */
    bool max_completion_tokens; /* chat: max_tokens came from max_completion_tokens */
    bool stream, include_usage, continuous_usage;
    bool echo;
    bool echo_only;             /* completions echo with max_tokens 0: generated tokens are dropped */
    char *echo_text;            /* chat echo: the final assistant message, else NULL */
    int32_t top_logprobs;       /* entries to print per position; -1 = no logprobs */
    int32_t prompt_logprobs;    /* -1 = none */
    bool beam_search;           /* use_beam_search: params.n is the beam width (beam_search.h) */
    float length_penalty;       /* beam search's score: cumulative logprob / length ** length_penalty */
    bool return_token_ids, tokens_as_ids;
    bool return_prompt_text;    /* chat: the rendered prompt goes back as prompt_text */
    char *cache_salt;
    char *request_id;           /* the client's request_id, else NULL */
    char *user;                 /* the client's user, for the request log, else NULL */
    int64_t truncate_prompt_tokens; /* keep this many prompt tokens; -1 = max_model_len - max_tokens;
                                     * -2 = not given */
    bool truncate_right;        /* truncation_side "right": keep the first tokens (default: the last) */
    /* vLLM's add_special_tokens (completions, embeddings and /tokenize prompts: true, chat: false):
     * the tokenizer post-processor's tokens around a text prompt (none for the Qwen3 chat models,
     * whose post-processor is ByteLevel; Qwen3-Embedding's appends <|endoftext|>). */
    bool add_special_tokens;
    bool return_token_strs;     /* /tokenize */
    /* chat output parsing, decided from the request and cv_api_chat_config */
    bool parse_reasoning;       /* split <think> blocks off the content */
    bool starts_in_reasoning;   /* the rendered prompt left a <think> open */
    bool include_reasoning;     /* false: the reasoning is parsed, then dropped */
    bool reasoning_content;     /* also print the legacy field name */
    bool parse_tool_calls;      /* tool_choice auto/required/named with a tool-call parser */
    cv_tool_parser_kind tool_parser;
    cv_tool_choice tool_choice;
    char *forced_tool;          /* named tool choice: the function whose arguments the output is */
    bool parallel_tool_calls;   /* false: at most one call per choice */
    json_t *tools;              /* the request's tools (a reference), for parameter types; or NULL */
    /* structured outputs: the constraint on every choice's output, when has_constraint; its strings
     * point into the copies below. The server compiles it into params.grammar. */
    bool has_constraint;
    cvllm_constraint constraint;
    char *constraint_spec;      /* schema (JSON text), regex or grammar */
    char **constraint_choices;
    char *whitespace_pattern;
    /* the pooling routes: one pooling request a prompt; pooling.task is `task` (/pooling's) or a
     * static name */
    cvllm_pooling_params pooling;
    char *task;
    const char *const *class_labels; /* /classify: the limits' */
    int32_t token_width;        /* /pooling of a token task: each result is rows of this width */
    cv_api_encoding encoding;
    cv_api_embed_dtype embed_dtype;
    cv_api_endianness endianness;
    /* /score and /rerank: the texts paired (n_texts_1 is 1 or n_texts_2); a reranker's prompts are the
     * pairs, an embedding model's the texts of both sides, each embedded once */
    char **texts_1, **texts_2;
    size_t n_texts_1, n_texts_2;
    int64_t top_n;              /* /rerank: the best top_n results; <= 0: all */
    /* /v2/embed: the types of each vector to return; `texts` echoed back (texts_1, n_texts_1) when they
     * were the input; with truncate NONE, the most tokens an input may have (-1: no limit) */
    unsigned embedding_types;
    int64_t input_token_limit;
    bool anthropic;             /* a chat completion made of an Anthropic Messages request: its reply and
                                 * stream are rewritten in that API's shapes (api_anthropic.c) */
    json_t *responses;          /* one made of a Responses API request: the response object's settings
                                 * (api_responses.c), else NULL */
    json_t *responses_messages; /* ... the chat messages it answers, for the response store */
    bool responses_store;       /* ... its `store` (true unless the request says false) */
    bool responses_background;  /* ... its `background`: answered "queued" at once, generated on */
} cv_api_request;

int cv_api_parse_completion(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                            cv_api_error *err);
int cv_api_parse_chat(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                      cv_api_error *err);
/* /invocations, as vLLM routes it: a body that validates as a chat completion is one, else one that
 * validates as a completion is one, else 400 "Cannot find suitable handler for request" (malformed
 * JSON keeps its own error). */
int cv_api_parse_invocation(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                            cv_api_error *err);
/* /tokenize: {prompt} or vLLM's chat form {messages, add_generation_prompt, continue_final_message,
 * chat_template_kwargs, tools, documents}, rendered with lim->chat; one prompt. */
int cv_api_parse_tokenize(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                          cv_api_error *err);
/* /v1/embeddings, vLLM's EmbeddingCompletionRequest: input (a string, strings, ids or lists of ids),
 * dimensions, use_activation, encoding_format float or base64 (embed_dtype, endianness),
 * truncate_prompt_tokens, add_special_tokens (true), user, cache_salt, request_id. */
int cv_api_parse_embedding(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                           cv_api_error *err);
/* /classify (vLLM's ClassificationRequest: the embeddings' input or chat form, use_activation,
 * truncation) and /pooling (PoolingRequest: the embeddings' fields but dimensions, and task). */
int cv_api_parse_classify(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                          cv_api_error *err);
int cv_api_parse_pooling(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                         cv_api_error *err);
/* /v2/embed, vLLM's Cohere embed API: model, texts (prefixed by input_type's prompt) or inputs (text
 * content parts, rendered with the chat template; images are refused), output_dimension,
 * embedding_types (float, binary, ubinary, base64), truncate (NONE, START, END) with max_tokens. */
int cv_api_parse_cohere_embed(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                              cv_api_error *err);
/* /v1/messages (count_only: /v1/messages/count_tokens), vLLM's Anthropic Messages API: the body is
 * translated into a chat completion request and read as one (kind CV_API_CHAT, `anthropic` set). */
int cv_api_parse_anthropic(const char *body, size_t len, const cv_api_limits *lim, bool count_only, cv_api_request *req,
                           cv_api_error *err);
/* The chat messages that continue stored response `id`'s conversation (a new reference), or NULL
 * when none is stored under it (response_store.h). */
typedef json_t *(*cv_api_history_fn)(void *ctx, const char *id);
/* /v1/responses, OpenAI's Responses API as vLLM serves it: the body is translated into a chat
 * completion request and read as one (kind CV_API_CHAT, `responses` set). A previous_response_id is
 * looked up with `history` (NULL: the server stores no responses). */
int cv_api_parse_responses(const char *body, size_t len, const cv_api_limits *lim, cv_api_history_fn history, void *ctx,
                           cv_api_request *req, cv_api_error *err);
/* The route /invocations takes on a pooling server, as vLLM's SageMaker router tries the request types
 * of the model's task in turn: a body with input (or messages) is the task's own (embeddings or
 * classify), else one with query and documents a rerank, else a score where scores are served. */
cv_api_kind cv_api_pooling_invocation(const char *body, size_t len, const cv_api_limits *lim);
/* /score (vLLM's ScoreRequest: queries/documents, queries/items, data_1/data_2 or text_1/text_2, each
 * a string or strings, 1:1, 1:N or N:N) and /rerank (RerankRequest: query, documents, top_n), with
 * use_activation, truncate_prompt_tokens and, for a reranker's template, instruction and
 * chat_template_kwargs. */
int cv_api_parse_score(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req, cv_api_error *err);
int cv_api_parse_rerank(const char *body, size_t len, const cv_api_limits *lim, cv_api_request *req,
                        cv_api_error *err);
/* /detokenize: {tokens:[int]}; the ids land in prompts[0]. */
int cv_api_parse_detokenize(const char *body, size_t len, cv_api_request *req, cv_api_error *err);
void cv_api_request_free(cv_api_request *req);

/* The bodies of /v1/load_lora_adapter (vLLM's LoadLoRAAdapterRequest: lora_name, lora_path,
 * load_inplace) and /v1/unload_lora_adapter (UnloadLoRAAdapterRequest: lora_name, and lora_int_id,
 * read and not used: cvllm knows its adapters by name). */
typedef struct cv_api_lora_request {
    char *lora_name, *lora_path;
    bool load_inplace;
} cv_api_lora_request;
int cv_api_parse_lora_adapter(const char *body, size_t len, bool load, cv_api_lora_request *req, cv_api_error *err);
void cv_api_lora_request_free(cv_api_lora_request *req);

/* Tokenizes text prompts, checks ids and context length, and sets every prompt's max_tokens. */
int cv_api_prepare(cv_api_request *req, const cvllm_tokenizer *tok, const cv_api_limits *lim, cv_api_error *err);

/* The engine parameters for one prompt of a prepared request (params.grammar is the server's). */
cvllm_sampling_params cv_api_prompt_params(const cv_api_request *req, size_t prompt_index);

/* ------------------------------------------------------------------------------------------------ */
/* Responses                                                                                         */

typedef struct cv_api_choice {
    char *text;
    size_t text_len, text_cap;
    size_t text_chars;          /* code points of text, for completion text_offset */
    int32_t *token_ids;
    size_t n_tokens, cap_tokens;
    cvllm_position_logprobs *logprobs; /* deep copies, when logprobs were asked for */
    cvllm_finish_reason finish;
    int32_t stop_token_id;
    char *stop_str;
    bool started;               /* streaming: the first chunk of this choice went out */
    /* chat streaming: output parser states (see cv_api_request.parse_*) */
    cv_reasoning_stream reasoning;
    cv_tool_stream *tool_stream;
    struct cv_forced_stream *forced; /* a forced tool choice's call(s) */
    size_t n_tool_calls;        /* calls sent so far */
} cv_api_choice;

typedef struct cv_api_prompt_result {
    size_t n_prompt_tokens;
    size_t n_cached_tokens;
    cvllm_position_logprobs *prompt_logprobs; /* deep copy, n_prompt_tokens entries, or NULL */
    float *embedding;           /* an embedding request's vector (n_embedding floats), once finished */
    size_t n_embedding;
    bool finished;
} cv_api_prompt_result;

typedef struct cv_api_response {
    const cv_api_request *req;
    const cvllm_tokenizer *tok;
    const char *model;          /* the served name printed in replies */
    char id[96];
    int64_t created;
    bool cached_tokens_details; /* --enable-prompt-tokens-details */
    cv_api_choice *choices;     /* n_prompts × n, index = prompt × n + completion */
    size_t n_choices;
    cv_api_prompt_result *prompts;
    bool prompt_text_sent;      /* streaming return_prompt_text: the first chunk carried it */
} cv_api_response;

/* 2 × n_bytes lowercase hex digits of fresh randomness, NUL-terminated (out has 2n + 1 bytes): reply
 * ids, tool-call ids, X-Request-Id. */
void cv_api_random_hex(char *out, size_t n_bytes);

void cv_api_response_init(cv_api_response *r, const cv_api_request *req, const cvllm_tokenizer *tok,
                          const char *model, bool cached_tokens_details);
void cv_api_response_free(cv_api_response *r);

/* Folds one engine event of prompt `prompt_index` into the response. When `sse` is not NULL (a
 * streaming request), the SSE chunks for what is new are appended to *sse. */
void cv_api_response_apply(cv_api_response *r, size_t prompt_index, const cv_request_event *ev, char **sse,
                           size_t *sse_len, size_t *sse_cap);
/* Streaming epilogue: the usage chunk (when asked for) and "data: [DONE]". */
void cv_api_response_stream_end(cv_api_response *r, char **sse, size_t *sse_len, size_t *sse_cap);
/* An error inside a stream (status already sent): a data: error chunk then [DONE]. */
void cv_api_stream_error(const cv_api_error *err, char **sse, size_t *sse_len, size_t *sse_cap);
/* The non-streaming body (free()). */
char *cv_api_response_json(const cv_api_response *r); /* any kind but CV_API_COHERE_EMBED */
/* An Anthropic request's message (free()), or NULL with *err (500) when a tool call's arguments are
 * not a JSON object, which Anthropic's tool_use input must be. */
char *cv_api_anthropic_json(const cv_api_response *r, cv_api_error *err);
/* vLLM's Anthropic error body: {"type": "error", "error": {"type", "message"}} (free()). */
char *cv_api_anthropic_error_json(const cv_api_error *err);
/* An Anthropic stream: the chat stream's SSE records, as the server is about to send them, rewritten
 * in place into the Messages API's events; the state carries over between calls. */
typedef struct cv_anthropic_stream cv_anthropic_stream;
cv_anthropic_stream *cv_anthropic_stream_new(void);
void cv_anthropic_stream_free(cv_anthropic_stream *st);
void cv_anthropic_stream_convert(cv_anthropic_stream *st, char **sse, size_t *len, size_t *cap);
/* A Responses API request's response object (a new reference): the reply, and what the store keeps. */
json_t *cv_api_responses_object(const cv_api_response *r);
/* A background request's first answer: its response object with status "queued", no output and no
 * usage yet. */
json_t *cv_api_responses_queued(const cv_api_response *r);
/* Its stream: the chat stream's SSE records rewritten in place into the Responses events; the state
 * carries over between calls, and reads the request (which must outlive it). */
typedef struct cv_responses_stream cv_responses_stream;
cv_responses_stream *cv_responses_stream_new(const cv_api_request *req);
void cv_responses_stream_free(cv_responses_stream *st);
void cv_responses_stream_convert(cv_responses_stream *st, char **sse, size_t *len, size_t *cap);
/* The response object response.completed carried, once the stream has ended; NULL before. */
const json_t *cv_responses_stream_final(const cv_responses_stream *st);
/* /v2/embed's reply (vLLM's CohereEmbedResponse), or NULL with *err when a binary type was asked of a
 * vector whose length is not a multiple of 8 (vLLM's 400, known only once the vectors are in). */
char *cv_api_cohere_json(const cv_api_response *r, cv_api_error *err);
/* An embeddings reply with encoding_format bytes: the vectors' raw bytes one after the other (*len of
 * them; free()), and vLLM's "metadata" header (free()): id, created, model, each vector's index,
 * dtype, endianness, byte range and shape, and usage. */
char *cv_api_embedding_bytes(const cv_api_response *r, size_t *len, char **metadata);

/* Whether every prompt has had its final event. */
bool cv_api_response_done(const cv_api_response *r);

/* A token's text for logprobs: the decoded token, or "token_id:N" with return_tokens_as_token_ids. */
char *cv_api_token_string(const cvllm_tokenizer *tok, int32_t id, bool as_id);

/* /tokenize's token_strs: each id as transformers' convert_ids_to_tokens spells it, which is what
 * vLLM's tokenize serving returns (byte-level vocabulary strings such as "Ġworld", added tokens as
 * their content); null for an id the tokenizer does not know. */
json_t *cv_api_token_strs(const cvllm_tokenizer *tok, const int32_t *ids, size_t n_ids);

#endif
