/*
 * chat.h — OpenAI chat requests to prompt text, the way vLLM does it.
 *
 * A cv_chat_template is a parsed Jinja chat template plus what rendering needs besides the
 * request: the tokenizer's special-token strings (bos_token, eos_token, ... become template
 * variables, as transformers passes them) and the content format vLLM detects for the template.
 * Load it once at startup (a template that does not parse is a startup error naming line and
 * column) and share it between threads: rendering does not modify it.
 *
 * Rendering a request = vLLM's pre-processing (chat_utils.py: parse_chat_messages,
 * _postprocess_messages) + transformers' apply_chat_template:
 *   - content: a string is one text part, null is none; text parts are "text", "input_text",
 *     "output_text", "refusal" and "thinking" (other part types are rejected: this is a text-only
 *     server). In the "openai" content format the template receives [{"type": "text", "text": ...}]
 *     for every part, empty ones included; in the "string" format, the non-empty texts joined with
 *     "\n". The format is the request's content_format, or with AUTO the one vLLM detects from the
 *     template's syntax tree (jinja.h, jinja_loops_over_message_content).
 *   - assistant messages: `reasoning` (or, when absent, the older `reasoning_content`) is passed
 *     under both names; tool_calls[].function.arguments given as a JSON string is parsed (empty
 *     or invalid → {}); an empty tool_calls list is dropped. tool messages keep tool_call_id and
 *     always get their text joined into a string. A string `name` is kept.
 *   - variables: special tokens, then default kwargs (--default-chat-template-kwargs), then the
 *     request's chat_template_kwargs, then messages, tools and documents (null when absent) and
 *     add_generation_prompt. Request kwargs named chat_template or tokenize are a 400 as in vLLM.
 *   - continue_final_message: transformers ≥ 4.57's method — a marker is appended to the final
 *     message's text, the rendering is cut at the marker.
 * Errors are CVLLM_ERR_INVALID_ARGUMENT (HTTP 400) with the reason in cv_error_message(); an
 * error raised by the template's raise_exception() carries exactly the template's message.
 */
#ifndef CV_CHAT_H
#define CV_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* How message content reaches the template: vLLM's --chat-template-content-format. */
typedef enum cv_chat_content_format {
    CV_CHAT_CONTENT_AUTO,   /* a setting, never a result: the format detected from the template */
    CV_CHAT_CONTENT_STRING, /* message content is a string */
    CV_CHAT_CONTENT_OPENAI, /* message content is a list of {"type": "text", "text": ...} */
} cv_chat_content_format;

/* "auto", "string" or "openai"; anything else fails with argparse's wording for a bad choice. */
int cv_chat_content_format_parse(const char *name, cv_chat_content_format *out);
const char *cv_chat_content_format_name(cv_chat_content_format f);

typedef struct cv_chat_template cv_chat_template;

/* Loads the template a model directory ships: template_file when not NULL (--chat-template; as in
 * vLLM, a value that names no file but holds a '{', '}' or newline is the template itself), else
 * DIR/chat_template.jinja, else the "chat_template" of DIR/tokenizer_config.json (a string,
 * or a list of {"name", "template"} of which "default" is used). Special tokens are read from
 * DIR/tokenizer_config.json when it exists. No template at all is CVLLM_ERR_NOT_FOUND. */
int cv_chat_template_load(const char *model_dir, const char *template_file, cv_chat_template **out);

/* From template text; special_tokens is a JSON object of name → string (or {"content": s}, or a
 * list of those for additional_special_tokens), may be NULL. */
int cv_chat_template_from_string(const char *src, size_t len, const json_t *special_tokens,
                                 cv_chat_template **out);
/* A template from text with base's special tokens (none when base is NULL): a request's own
 * chat_template, under --trust-request-chat-template. */
int cv_chat_template_with_text(const cv_chat_template *base, const char *src, size_t len, cv_chat_template **out);
void cv_chat_template_free(cv_chat_template *t);

/* The format vLLM's auto-detection picks for the template (STRING or OPENAI). */
cv_chat_content_format cv_chat_template_content_format(const cv_chat_template *t);
/* The template text as loaded (for /v1/models-style introspection and logging). */
const char *cv_chat_template_source(const cv_chat_template *t);

typedef struct cv_chat_request {
    const json_t *messages;        /* required: the request's "messages" array */
    const json_t *tools;           /* "tools" array or NULL */
    const json_t *documents;       /* "documents" or NULL */
    const json_t *default_kwargs;  /* object or NULL: --default-chat-template-kwargs */
    const json_t *kwargs;          /* object or NULL: the request's chat_template_kwargs */
    bool add_generation_prompt;
    bool continue_final_message;
    cv_chat_content_format content_format; /* AUTO (0): the template's detected format */
    int64_t now;                   /* the template's strftime_now() clock, seconds since the epoch
                                    * (0 = the current time; tests pin it to stay day-independent) */
} cv_chat_request;

/* The conversation the template sees (pre-processing above), as a new JSON array; `format` is
 * STRING or OPENAI. */
int cv_chat_conversation(const json_t *messages, cv_chat_content_format format, json_t **out);

/* Renders the prompt. *prompt is cv_xmalloc'd and NUL-terminated; *len may be NULL. */
int cv_chat_render(const cv_chat_template *t, const cv_chat_request *req, char **prompt, size_t *len);

#endif
