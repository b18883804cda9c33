/*
 * fuzz_chat_template.c — libFuzzer target for the Jinja parser and renderer, and for the output
 * parsers on the same bytes.
 *
 * Input: template source, optionally followed by a NUL byte and a JSON object of variables; when
 * there is none (or it does not parse) a small conversation with tools is used, so that mutated
 * templates reach the message loops. Renders run under small memory and step budgets: a template
 * may fail, but it must do so with a message, within the budget, and without leaking. The whole
 * input is then fed to the reasoning parser and both tool-call parsers, whole and cut in two, and
 * the streamed results must match.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "chat/jinja.h"
#include "chat/reasoning.h"
#include "chat/tool_parser.h"

static void require(int cond) {
    if (!cond)
        abort();
}

static const char DEFAULT_VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi <think>\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"r\", \"tool_calls\": [{\"id\": \"c1\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
    " {\"role\": \"tool\", \"content\": \"ok\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"array\"}}}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"eos_token\": \"</s>\"}";

static void fuzz_render(const char *src, size_t len, const json_t *vars) {
    jinja_template *t = NULL;
    if (jinja_parse(src, len, &t) != 0) {
        require(t == NULL && cv_error_message()[0] != '\0');
        return;
    }
    (void)jinja_loops_over_message_content(t);
    jinja_render_options lim = {.max_memory = 8u << 20, .max_steps = 20000};
    char *out = NULL;
    size_t n = 0;
    bool raised;
    if (jinja_render(t, vars, &lim, &out, &n, &raised) == 0)
        require(out != NULL && strlen(out) <= n);
    else
        require(out == NULL && (raised || cv_error_message()[0] != '\0'));
    free(out);
    jinja_free(t);
}

static void fuzz_reasoning(const char *text, size_t len, bool starts) {
    char *r, *c;
    cv_reasoning_extract(text, len, starts, &r, &c);
    cv_reasoning_stream s;
    cv_reasoning_stream_init(&s, starts);
    cv_reasoning_delta a, b, f;
    size_t cut = len / 2;
    cv_reasoning_stream_push(&s, text, cut, &a);
    cv_reasoning_stream_push(&s, text + cut, len - cut, &b);
    cv_reasoning_stream_finish(&s, &f);
    size_t rl = a.reasoning_len + b.reasoning_len + f.reasoning_len, cl = a.content_len + b.content_len + f.content_len;
    require(rl == (r ? strlen(r) : 0)); /* the template part never holds a NUL */
    require(cl == (c ? strlen(c) : 0));
    cv_reasoning_delta_free(&a);
    cv_reasoning_delta_free(&b);
    cv_reasoning_delta_free(&f);
    cv_reasoning_stream_free(&s);
    free(r);
    free(c);
}

static void fuzz_tools(cv_tool_parser_kind kind, const char *text, size_t len, const json_t *tools) {
    cv_tool_result r;
    cv_tool_parse(kind, text, len, tools, &r);
    for (size_t i = 0; i < r.n_calls; i++)
        require(r.calls[i].name && r.calls[i].arguments);
    cv_tool_result_free(&r);
    cv_tool_stream *s = cv_tool_stream_new(kind, tools);
    cv_tool_delta d;
    size_t cut = len / 3;
    cv_tool_stream_push(s, text, cut, &d);
    cv_tool_delta_free(&d);
    cv_tool_stream_push(s, text + cut, len - cut, &d);
    cv_tool_delta_free(&d);
    cv_tool_stream_finish(s, &d);
    cv_tool_delta_free(&d);
    cv_tool_stream_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    const char *nul = memchr(src, 0, size);
    size_t tlen = nul ? (size_t)(nul - src) : size;
    json_t *vars = NULL;
    if (nul)
        vars = json_loadb(nul + 1, size - tlen - 1, 0, NULL);
    if (!json_is_object(vars)) {
        json_decref(vars);
        vars = json_loads(DEFAULT_VARS, 0, NULL);
    }
    fuzz_render(src, tlen, vars);
    fuzz_reasoning(src, tlen, false);
    fuzz_reasoning(src, tlen, true);
    fuzz_tools(CV_TOOL_PARSER_HERMES, src, tlen, json_object_get(vars, "tools"));
    fuzz_tools(CV_TOOL_PARSER_QWEN3_CODER, src, tlen, json_object_get(vars, "tools"));
    json_decref(vars);
    return 0;
}
