/*
 * test_chat_parsers.c — reasoning and tool-call parsing of model output, and tool_choice rules.
 *
 * Every output string is parsed whole and also streamed: cut in two at every byte boundary and fed
 * one byte at a time. The streamed pieces must add up to the same result in all cuts (so no
 * partial tag ever escapes as text), and for well-formed output to the non-streaming result.
 * Malformed calls must come back as content, never crash.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "chat/reasoning.h"
#include "chat/tool_parser.h"
#include "check.h"

/* ---- reasoning ------------------------------------------------------------------------------- */

typedef struct rcase {
    const char *text;
    bool starts_in_reasoning;
    const char *reasoning, *content; /* NULL = none */
} rcase;

static const rcase RCASES[] = {
    {"<think>\nLet me think.\n</think>\n\nThe answer is 4.", false, "\nLet me think.\n", "\n\nThe answer is 4."},
    {"Just an answer.", false, NULL, "Just an answer."},
    {"  \n<think>x</think>y", false, "x", "y"},
    {"  \nno think", false, NULL, "  \nno think"},
    {"reasoning only...</think>\n\ncontent", true, "reasoning only...", "\n\ncontent"},
    {"<think>\nrepeated</think>c", true, "\nrepeated", "c"},
    {"\n\nleading newlines</think>c", true, "\n\nleading newlines", "c"},
    {"truncated reasoning", true, "truncated reasoning", NULL},
    {"<think>unclosed", false, "unclosed", NULL},
    {"thinking <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", true,
     "thinking ", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"},
    {"I could write <tool_call> here</think>ok", true, "I could write <tool_call> here", "ok"},
    {"mention <tool_call>\n<functional> stuff", true, "mention <tool_call>\n<functional> stuff", NULL},
    {"ends on <tool_call>\n", true, "ends on <tool_call>\n", NULL},
    {"<thinking>not a tag", false, NULL, "<thinking>not a tag"},
    {"", false, NULL, NULL},
    {"", true, "", NULL},
    {"a</think>b</think>c", true, "a", "b</think>c"},
    {"<think></think>", false, "", NULL},
    {"<thi", false, NULL, "<thi"},
    {"x</thi", true, "x</thi", NULL},
    {"<think>思考中…</think>答案是 4。", false, "思考中…", "答案是 4。"},
    {"after content <think>late</think>", false, NULL, "after content <think>late</think>"},
};

static void append(char **buf, size_t *len, const char *s, size_t n) {
    *buf = realloc(*buf, *len + n + 1);
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
}

/* Streams text cut at the given points (sorted, 0 < cut < len); returns the concatenations. */
static void stream_reasoning(const char *text, bool starts, const size_t *cuts, size_t ncuts, char **r, char **c,
                             bool *saw) {
    cv_reasoning_stream s;
    cv_reasoning_stream_init(&s, starts);
    size_t rl = 0, cl = 0, prev = 0, len = strlen(text);
    *r = calloc(1, 1);
    *c = calloc(1, 1);
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        cv_reasoning_delta d;
        cv_reasoning_stream_push(&s, text + prev, end - prev, &d);
        append(r, &rl, d.reasoning, d.reasoning_len);
        append(c, &cl, d.content, d.content_len);
        cv_reasoning_delta_free(&d);
        prev = end;
    }
    cv_reasoning_delta d;
    cv_reasoning_stream_finish(&s, &d);
    append(r, &rl, d.reasoning, d.reasoning_len);
    append(c, &cl, d.content, d.content_len);
    cv_reasoning_delta_free(&d);
    *saw = s.saw_reasoning;
    cv_reasoning_stream_free(&s);
}

static void check_reasoning_stream(const rcase *k, const size_t *cuts, size_t ncuts) {
    char *r, *c;
    bool saw;
    stream_reasoning(k->text, k->starts_in_reasoning, cuts, ncuts, &r, &c, &saw);
    CHECK_MSG(strcmp(r, k->reasoning ? k->reasoning : "") == 0 && saw == (k->reasoning != NULL),
              "%s (%zu cuts): reasoning \"%s\"", k->text, ncuts, r);
    CHECK_MSG(strcmp(c, k->content ? k->content : "") == 0, "%s (%zu cuts): content \"%s\"", k->text, ncuts, c);
    free(r);
    free(c);
}

static void test_reasoning(void) {
    for (size_t i = 0; i < CV_ARRAY_LEN(RCASES); i++) {
        const rcase *k = &RCASES[i];
        char *r, *c;
        cv_reasoning_extract(k->text, strlen(k->text), k->starts_in_reasoning, &r, &c);
        CHECK_MSG((r == NULL) == (k->reasoning == NULL) && (!r || strcmp(r, k->reasoning) == 0),
                  "%s: reasoning %s", k->text, r ? r : "(none)");
        CHECK_MSG((c == NULL) == (k->content == NULL) && (!c || strcmp(c, k->content) == 0),
                  "%s: content %s", k->text, c ? c : "(none)");
        free(r);
        free(c);
        size_t len = strlen(k->text);
        check_reasoning_stream(k, NULL, 0);
        for (size_t cut = 1; cut < len; cut++)
            check_reasoning_stream(k, &cut, 1);
        size_t *bytes = malloc((len + 1) * sizeof *bytes);
        for (size_t b = 1; b < len; b++)
            bytes[b - 1] = b;
        check_reasoning_stream(k, bytes, len ? len - 1 : 0);
        free(bytes);
    }
}

static void test_prompt_opens(void) {
    const char *p36 = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    const char *off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const char *q3 = "<|im_start|>assistant\n<think>\nold\n</think>\n\nx<|im_end|>\n<|im_start|>assistant\n";
    CHECK(cv_reasoning_prompt_opens(p36, strlen(p36)));
    CHECK(!cv_reasoning_prompt_opens(off, strlen(off)));
    CHECK(!cv_reasoning_prompt_opens(q3, strlen(q3)));
    CHECK(!cv_reasoning_prompt_opens("", 0));
    json_t *msg = json_object();
    cv_reasoning_set_fields(msg, "why", 3, true);
    char *s = json_dumps(msg, JSON_COMPACT);
    CHECK_STR_EQ(s, "{\"reasoning\":\"why\",\"reasoning_content\":\"why\"}");
    free(s);
    json_decref(msg);
}

/* ---- tool calls ---------------------------------------------------------------------------------- */

typedef struct tcase {
    cv_tool_parser_kind kind;
    const char *text;
    const char *content;              /* non-streaming content, NULL = none */
    const char *calls[3][2];          /* name, arguments */
    bool well_formed;                 /* streaming must equal non-streaming */
    const char *stream_content;       /* for malformed output: what streaming leaves as content */
} tcase;

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"temp\": {\"type\": \"number\"},"
    "\"metric\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"}, \"tags\": {\"type\": \"array\"},"
    "\"mixed\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"object\"}]}, \"nullable\": {\"type\": [\"integer\", \"null\"]},"
    "\"plain\": {}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"run\", \"parameters\": {\"properties\": {\"code\": {\"type\": \"string\"}}}}}]";

static const tcase TCASES[] = {
    {CV_TOOL_PARSER_HERMES,
     "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
     "Sure.", {{"get_weather", "{\"city\": \"Paris\", \"days\": 3}"}}, true, NULL},
    {CV_TOOL_PARSER_HERMES,
     "<tool_call>\n{\"name\":\"a\",\"arguments\":{\"x\":0.1,\"s\":\"日本\",\"n\":null,\"l\":[1,{\"k\":true}]}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n",
     NULL, {{"a", "{\"x\": 0.1, \"s\": \"日本\", \"n\": null, \"l\": [1, {\"k\": true}]}"}, {"b", "{}"}}, true, NULL},
    {CV_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"a\\\"b\"}}", NULL,
     {{"f", "{\"q\": \"a\\\"b\"}"}}, true, NULL},
    {CV_TOOL_PARSER_HERMES, "No tools needed. <tool_cal", "No tools needed. <tool_cal", {{0}}, true, NULL},
    {CV_TOOL_PARSER_HERMES, "x<tool_call>{\"name\": \"f\", \"arguments\": {bad json}}</tool_call>",
     "x<tool_call>{\"name\": \"f\", \"arguments\": {bad json}}</tool_call>", {{0}}, false,
     "x<tool_call>{\"name\": \"f\", \"arguments\": {bad json}}</tool_call>"},
    {CV_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": 1}</tool_call>",
     "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": 1}</tool_call>", {{0}}, false,
     "<tool_call>{\"name\": \"f\"}</tool_call>"},
    {CV_TOOL_PARSER_QWEN3_CODER,
     "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n 3 \n</parameter>\n"
     "<parameter=temp>\n21.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n"
     "<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n<parameter=extra>\nkept as text\n</parameter>\n</function>\n</tool_call>",
     "Let me check.\n",
     {{"get_weather", "{\"city\": \"São Paulo\", \"days\": 3, \"temp\": 21.5, \"metric\": true, \"opts\": {\"a\": [1, 2]}, "
                      "\"tags\": [\"x\", \"y\"], \"extra\": \"kept as text\"}"}}, true, NULL},
    {CV_TOOL_PARSER_QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=temp>\n3.0\n</parameter>\n"
     "<parameter=metric>\nyes\n</parameter>\n<parameter=city>\nnull\n</parameter>\n<parameter=mixed>\n{\"k\": 1}\n</parameter>\n"
     "<parameter=nullable>\n7\n</parameter>\n<parameter=plain>\n[1, true]\n</parameter>\n</function>\n</tool_call>\n"
     "<tool_call>\n<function=run>\n<parameter=code>\nprint(1)\n\nprint(2)\n</parameter>\n</function>\n</tool_call>",
     NULL,
     {{"get_weather", "{\"days\": \"three\", \"temp\": 3, \"metric\": false, \"city\": null, \"mixed\": {\"k\": 1}, "
                      "\"nullable\": 7, \"plain\": \"[1, true]\"}"},
      {"run", "{\"code\": \"print(1)\\n\\nprint(2)\"}"}}, true, NULL},
    {CV_TOOL_PARSER_QWEN3_CODER,
     "<function=unknown_tool>\n<parameter=a>\n1\n<parameter=b>\nx\n</function>",
     NULL, {{"unknown_tool", "{\"a\": \"1\", \"b\": \"x\"}"}}, true, NULL},
    {CV_TOOL_PARSER_QWEN3_CODER,
     "<tool_call>\n<function=run>\n<parameter=code>\nunterminated\n", NULL, {{"run", "{\"code\": \"unterminated\"}"}}, true, NULL},
    {CV_TOOL_PARSER_QWEN3_CODER, "plain answer with <b>tags</b>", "plain answer with <b>tags</b>", {{0}}, true, NULL},
    {CV_TOOL_PARSER_QWEN3_CODER, "<tool_call>\n<function=no_close_bracket\n</function>\n</tool_call>",
     "<tool_call>\n<function=no_close_bracket\n</function>\n</tool_call>", {{0}}, false,
     "<function=no_close_bracket\n</function>"},
    {CV_TOOL_PARSER_QWEN3_CODER, "<tool_call>\n<function=run>\n<parameter=code no bracket</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=run>\n<parameter=code no bracket</parameter>\n</function>\n</tool_call>", {{0}}, false,
     "<function=run>\n<parameter=code no bracket</parameter>\n</function>"},
};

typedef struct collected {
    char *content;
    size_t content_len;
    char *names[8], *args[8];
    size_t n;
} collected;

static void collect(collected *c, cv_tool_delta *d) {
    append(&c->content, &c->content_len, d->content, d->content_len);
    CHECK(d->first_index == c->n);
    for (size_t i = 0; i < d->n_calls && c->n < 8; i++) {
        c->names[c->n] = strdup(d->calls[i].name);
        c->args[c->n] = strdup(d->calls[i].arguments);
        c->n++;
    }
    cv_tool_delta_free(d);
}

static collected stream_tools(const tcase *k, const json_t *tools, const size_t *cuts, size_t ncuts) {
    collected c = {calloc(1, 1), 0, {0}, {0}, 0};
    cv_tool_stream *s = cv_tool_stream_new(k->kind, tools);
    size_t prev = 0, len = strlen(k->text);
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        cv_tool_delta d;
        cv_tool_stream_push(s, k->text + prev, end - prev, &d);
        collect(&c, &d);
        prev = end;
    }
    cv_tool_delta d;
    cv_tool_stream_finish(s, &d);
    collect(&c, &d);
    CHECK_EQ_INT(cv_tool_stream_calls(s), c.n);
    cv_tool_stream_free(s);
    return c;
}

static void free_collected(collected *c) {
    free(c->content);
    for (size_t i = 0; i < c->n; i++) {
        free(c->names[i]);
        free(c->args[i]);
    }
}

static bool same_collected(const collected *a, const collected *b) {
    if (strcmp(a->content, b->content) != 0 || a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->names[i], b->names[i]) != 0 || strcmp(a->args[i], b->args[i]) != 0)
            return false;
    return true;
}

static void test_tool_parsers(void) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    CHECK(tools != NULL);
    for (size_t i = 0; i < CV_ARRAY_LEN(TCASES); i++) {
        const tcase *k = &TCASES[i];
        cv_tool_result r;
        cv_tool_parse(k->kind, k->text, strlen(k->text), tools, &r);
        CHECK_MSG((r.content == NULL) == (k->content == NULL) && (!r.content || strcmp(r.content, k->content) == 0),
                  "case %zu: content %s", i, r.content ? r.content : "(none)");
        size_t want_calls = 0;
        while (want_calls < 3 && k->calls[want_calls][0])
            want_calls++;
        CHECK_MSG(r.n_calls == want_calls, "case %zu: %zu calls", i, r.n_calls);
        for (size_t c = 0; c < r.n_calls && c < want_calls; c++) {
            CHECK_STR_EQ(r.calls[c].name, k->calls[c][0]);
            CHECK_STR_EQ(r.calls[c].arguments, k->calls[c][1]);
        }
        /* streaming: the same result whatever the cuts */
        collected whole = stream_tools(k, tools, NULL, 0);
        if (k->well_formed) {
            CHECK_MSG(strcmp(whole.content, r.content ? r.content : "") == 0, "case %zu: streamed content %s", i, whole.content);
            CHECK_MSG(whole.n == r.n_calls, "case %zu: streamed %zu calls", i, whole.n);
            for (size_t c = 0; c < whole.n && c < r.n_calls; c++) {
                CHECK_STR_EQ(whole.names[c], r.calls[c].name);
                CHECK_STR_EQ(whole.args[c], r.calls[c].arguments);
            }
        } else {
            CHECK_MSG(strstr(whole.content, k->stream_content) != NULL, "case %zu: streamed content %s", i, whole.content);
        }
        size_t len = strlen(k->text);
        for (size_t cut = 1; cut < len; cut++) {
            collected part = stream_tools(k, tools, &cut, 1);
            CHECK_MSG(same_collected(&part, &whole), "case %zu: cut at %zu changes the result", i, cut);
            free_collected(&part);
        }
        size_t *bytes = malloc(len * sizeof *bytes + 1);
        for (size_t b = 1; b < len; b++)
            bytes[b - 1] = b;
        collected one = stream_tools(k, tools, bytes, len ? len - 1 : 0);
        CHECK_MSG(same_collected(&one, &whole), "case %zu: byte-by-byte streaming changes the result", i);
        free_collected(&one);
        free(bytes);
        free_collected(&whole);
        cv_tool_result_free(&r);
    }
    json_decref(tools);
    cv_tool_parser_kind kind;
    CHECK(cv_tool_parser_from_name("hermes", &kind) == 0 && kind == CV_TOOL_PARSER_HERMES);
    CHECK(cv_tool_parser_from_name("qwen3_coder", &kind) == 0 && kind == CV_TOOL_PARSER_QWEN3_CODER);
    CHECK(cv_tool_parser_from_name("pythonic", &kind) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "unknown tool call parser 'pythonic' (supported: hermes, qwen3_coder)");
}

/* ---- tool_choice ------------------------------------------------------------------------------------ */

/* A failure also names the field vLLM's VLLMValidationError names (want_param, "" for none). */
static void expect_choice(const char *tools_json, const char *choice_json, bool auto_ok, int want_rc,
                          cv_tool_choice want, const char *want_text, const char *want_param) {
    json_t *tools = tools_json ? json_loads(tools_json, JSON_DECODE_ANY, NULL) : NULL;
    json_t *choice = choice_json ? json_loads(choice_json, JSON_DECODE_ANY, NULL) : NULL;
    cv_tool_choice got;
    const char *named, *param;
    int rc = cv_tool_choice_resolve(tools, choice, auto_ok, &got, &named, &param);
    CHECK_MSG(rc == want_rc, "tools %s, tool_choice %s: rc %d", tools_json, choice_json, rc);
    if (rc == 0) {
        CHECK_EQ_INT(got, want);
        if (want == CV_TOOL_CHOICE_NAMED)
            CHECK_STR_EQ(named, want_text);
    } else {
        CHECK_STR_EQ(cv_error_message(), want_text);
        CHECK_STR_EQ(param ? param : "", want_param);
    }
    json_decref(tools);
    json_decref(choice);
}

static void test_tool_choice(void) {
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]";
    const char *usage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";
    char msg[512];
    expect_choice(NULL, NULL, false, 0, CV_TOOL_CHOICE_NONE, NULL, "");
    expect_choice(tools, NULL, true, 0, CV_TOOL_CHOICE_AUTO, NULL, "");
    expect_choice(tools, "\"none\"", false, 0, CV_TOOL_CHOICE_NONE, NULL, "");
    expect_choice(NULL, "\"none\"", false, 0, CV_TOOL_CHOICE_NONE, NULL, "");
    expect_choice(tools, "\"required\"", false, 0, CV_TOOL_CHOICE_REQUIRED, NULL, "");
    expect_choice(tools, "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}", false, 0,
                  CV_TOOL_CHOICE_NAMED, "get_weather", "");
    expect_choice(tools, NULL, false, CVLLM_ERR_INVALID_ARGUMENT, 0,
                  "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set", "");
    expect_choice("[]", NULL, true, CVLLM_ERR_INVALID_ARGUMENT, 0,
                  "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.", "tools");
    expect_choice(NULL, "\"auto\"", true, CVLLM_ERR_INVALID_ARGUMENT, 0, "When using `tool_choice`, `tools` must be set.", "tool_choice");
    expect_choice("null", "\"required\"", true, CVLLM_ERR_INVALID_ARGUMENT, 0, "When using `tool_choice`, `tools` must be set.", "tool_choice");
    expect_choice(tools, "\"sometimes\"", true, CVLLM_ERR_INVALID_ARGUMENT, 0,
                  "Invalid value for `tool_choice`: sometimes! Only named tools, \"none\", \"auto\" or \"required\" are supported.", "tool_choice");
    snprintf(msg, sizeof msg, "Invalid value for `function`: `None` in `tool_choice`! %s", usage);
    expect_choice(tools, "{\"type\": \"function\"}", true, CVLLM_ERR_INVALID_ARGUMENT, 0, msg, "tool_choice.function");
    snprintf(msg, sizeof msg, "Expected field `name` in `function` in `tool_choice`! %s", usage);
    expect_choice(tools, "{\"type\": \"function\", \"function\": {}}", true, CVLLM_ERR_INVALID_ARGUMENT, 0, msg, "tool_choice.function.name");
    snprintf(msg, sizeof msg, "Invalid `name` in `function`: `` in `tool_choice`! %s", usage);
    expect_choice(tools, "{\"type\": \"function\", \"function\": {\"name\": \"\"}}", true, CVLLM_ERR_INVALID_ARGUMENT, 0, msg, "tool_choice.function.name");
    expect_choice(tools, "{\"type\": \"function\", \"function\": {\"name\": \"other\"}}", true, CVLLM_ERR_INVALID_ARGUMENT, 0,
                  "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice");
    expect_choice("[{\"type\": \"function\"}]", NULL, true, CVLLM_ERR_INVALID_ARGUMENT, 0,
                  "tools[0]: expected {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools");
    CHECK_STR_EQ(cv_tool_finish_reason(CV_TOOL_CHOICE_AUTO, 1, "stop"), "tool_calls");
    CHECK_STR_EQ(cv_tool_finish_reason(CV_TOOL_CHOICE_REQUIRED, 2, "length"), "tool_calls");
    CHECK_STR_EQ(cv_tool_finish_reason(CV_TOOL_CHOICE_NAMED, 1, "stop"), "stop");
    CHECK_STR_EQ(cv_tool_finish_reason(CV_TOOL_CHOICE_AUTO, 0, "length"), "length");
}

int main(void) {
    test_reasoning();
    test_prompt_opens();
    test_tool_parsers();
    test_tool_choice();
    return cv_check_summary("test_chat_parsers");
}
