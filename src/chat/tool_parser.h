/*
 * tool_parser.h — tool calls in model output (`--tool-call-parser hermes | qwen3_coder`) and the
 * request-side rules for `tool_choice`.
 *
 * hermes (Qwen2.5/Qwen3): <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one JSON object
 * per call. qwen3_coder (Qwen3-Coder, Qwen3.5/3.6):
 *   <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>
 * where each V is converted to the JSON-schema type the request's tools declare for parameter K of
 * NAME (string/integer/number/boolean/object/array; "null" is null; unknown → string), as vLLM's
 * qwen3coder_tool_parser.py does. In both, a call's arguments come out as JSON text written the
 * way Python's json.dumps(ensure_ascii=False) writes it, which is what vLLM returns.
 *
 * Non-streaming follows vLLM: content is the text before the first call (NULL when empty); text
 * between or after calls is dropped; if any call is malformed (bad JSON, no name, no '>' after the
 * function name) nothing is a tool call and the whole output is content.
 * Streaming emits content up to the first call, holding back anything that could be the start of
 * a call tag, then one delta per call when the call is complete (name and full arguments at once,
 * a valid OpenAI stream). A malformed call is emitted as content at the point it ends. The deltas
 * do not depend on how the output was cut, and for well-formed output they add up to exactly the
 * non-streaming result. Parsing never fails: worst case everything is content.
 */
#ifndef CV_TOOL_PARSER_H
#define CV_TOOL_PARSER_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

typedef enum cv_tool_parser_kind { CV_TOOL_PARSER_HERMES, CV_TOOL_PARSER_QWEN3_CODER } cv_tool_parser_kind;

/* "hermes" or "qwen3_coder"; anything else is CVLLM_ERR_INVALID_ARGUMENT naming the choices. */
int cv_tool_parser_from_name(const char *name, cv_tool_parser_kind *out);

typedef struct cv_tool_call {
    char *name;
    char *arguments; /* JSON text */
} cv_tool_call;

typedef struct cv_tool_result {
    char *content;   /* NULL when there is none */
    cv_tool_call *calls;
    size_t n_calls;
} cv_tool_result;

/* tools: the request's "tools" array (for qwen3_coder's parameter types), may be NULL. */
void cv_tool_parse(cv_tool_parser_kind kind, const char *text, size_t len, const json_t *tools, cv_tool_result *out);
void cv_tool_result_free(cv_tool_result *r);

typedef struct cv_tool_stream cv_tool_stream;

typedef struct cv_tool_delta {
    char *content;          /* never NULL; content_len may be 0 */
    size_t content_len;
    cv_tool_call *calls;    /* calls completed by this step, numbered from first_index */
    size_t n_calls;
    size_t first_index;
} cv_tool_delta;

cv_tool_stream *cv_tool_stream_new(cv_tool_parser_kind kind, const json_t *tools);
void cv_tool_stream_push(cv_tool_stream *s, const char *text, size_t len, cv_tool_delta *out);
void cv_tool_stream_finish(cv_tool_stream *s, cv_tool_delta *out);
size_t cv_tool_stream_calls(const cv_tool_stream *s); /* calls emitted so far */
void cv_tool_stream_free(cv_tool_stream *s);
void cv_tool_delta_free(cv_tool_delta *d);

/* ---- tool_choice ----------------------------------------------------------------------------- */

typedef enum cv_tool_choice { CV_TOOL_CHOICE_NONE, CV_TOOL_CHOICE_AUTO, CV_TOOL_CHOICE_REQUIRED, CV_TOOL_CHOICE_NAMED } cv_tool_choice;

/* vLLM's request validation of tools/tool_choice (ChatCompletionRequest.check_tool_usage in
 * vllm/entrypoints/openai/chat_completion/protocol.py; each failure a 400 with vLLM's message):
 * an empty tools array is refused; tool_choice defaults to "auto" when tools are given and to
 * "none" otherwise; a named choice must name one of the tools; "auto" needs auto_tool_choice_enabled
 * (--enable-auto-tool-choice with a --tool-call-parser). *named points into tool_choice. On failure
 * *param is the field vLLM's error names ("tools", "tool_choice", "tool_choice.function",
 * "tool_choice.function.name") or NULL. */
int cv_tool_choice_resolve(const json_t *tools, const json_t *tool_choice, bool auto_tool_choice_enabled,
                           cv_tool_choice *choice, const char **named, const char **param);

/* finish_reason: "tool_calls" when calls were made under auto or required, else `otherwise`
 * ("stop"/"length"); a named tool choice reports "stop", as vLLM does. */
const char *cv_tool_finish_reason(cv_tool_choice choice, size_t n_calls, const char *otherwise);

#endif
