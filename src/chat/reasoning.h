/*
 * reasoning.h — `--reasoning-parser qwen3`: split model output into reasoning and content.
 *
 * Qwen3-family output looks like "<think>\nreasoning\n</think>\n\ncontent". Text inside the think
 * block is reasoning (message.reasoning, delta.reasoning), the rest is content. Two template styles
 * exist and the parser handles both from where the prompt left off:
 *   - Qwen3 (original): the prompt ends with "<|im_start|>assistant\n" and the model opens
 *     <think> itself. The output is reasoning only if it starts (after optional whitespace) with
 *     <think>; otherwise it is all content (e.g. enable_thinking=false, where the template already
 *     closed an empty think block in the prompt).
 *   - Qwen3.5/3.6 and Qwen3-*-Thinking-2507: the prompt ends inside an open <think>, so the output
 *     starts as reasoning and the model only emits </think>. A repeated <think> at the very start is
 *     dropped, as vLLM does.
 * cv_reasoning_prompt_opens() tells which case a rendered prompt is in. While in reasoning,
 * "</think>" ends it; so does a "<tool_call>" followed (after whitespace) by "<function" — Qwen3.5+
 * sometimes call a tool without closing the block, and vLLM treats that as an implicit end (the
 * <tool_call> then starts the content, for the tool parser). Everything after the end is content,
 * kept verbatim (usually starting with "\n\n", as vLLM returns it). Output that ends while still in
 * reasoning is all reasoning (a truncated answer).
 *
 * Streaming gives exactly the same split for any way the text is cut into deltas: a tag, or the
 * beginning of one, is held back until it is complete or ruled out, so "<thi" is never emitted as
 * content. include_reasoning=false is the server's business: run the parser and drop the reasoning.
 */
#ifndef CV_REASONING_H
#define CV_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* True when the prompt's last think tag is an opening "<think>" (the output starts in reasoning). */
bool cv_reasoning_prompt_opens(const char *prompt, size_t len);

typedef struct cv_reasoning_stream {
    int state;                 /* internal */
    bool saw_reasoning;        /* a reasoning section was entered */
    char *pending;             /* bytes held back: a possible tag or a leading run of whitespace */
    size_t n_pending, cap_pending;
} cv_reasoning_stream;

/* The output of one step: text to append to reasoning and to content (either may be empty). */
typedef struct cv_reasoning_delta {
    char *reasoning, *content; /* cv_xmalloc'd, NUL-terminated, never NULL */
    size_t reasoning_len, content_len;
} cv_reasoning_delta;

void cv_reasoning_stream_init(cv_reasoning_stream *s, bool starts_in_reasoning);
/* Feeds the next piece of output text. */
void cv_reasoning_stream_push(cv_reasoning_stream *s, const char *text, size_t len, cv_reasoning_delta *out);
/* End of output: releases what was held back. */
void cv_reasoning_stream_finish(cv_reasoning_stream *s, cv_reasoning_delta *out);
void cv_reasoning_stream_free(cv_reasoning_stream *s);
void cv_reasoning_delta_free(cv_reasoning_delta *d);

/* Non-streaming: *reasoning is NULL when the output had no reasoning section, *content is NULL
 * when no content followed (vLLM then returns "content": null). Both cv_xmalloc'd. */
void cv_reasoning_extract(const char *text, size_t len, bool starts_in_reasoning, char **reasoning, char **content);

/* Sets "reasoning" (and, when legacy_name, also the pre-2026 "reasoning_content") on a response
 * message or stream delta object. */
void cv_reasoning_set_fields(json_t *message, const char *reasoning, size_t len, bool legacy_name);

#endif
