/*
 * test_chat_jinja.c — the Jinja interpreter on its own.
 *
 * tests/data/chat/jinja_cases.jsonl holds small templates with the output Python Jinja2 gave (or
 * the fact that it failed, with raise_exception's message); they cover whitespace control, str()
 * and repr() of every type, operators, slicing, string methods, filters, tests, scoping of
 * loops/macros/namespaces, loop.*, break/continue and the block statements. Beyond those this
 * file checks what Python cannot tell us byte for byte: our parse-error messages with line and
 * column, render-error messages, the memory and step budgets, vLLM's content-format detection and
 * the render speed.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "chat/jinja.h"
#include "check.h"

static int render_src(const char *src, const char *vars_json, const jinja_render_options *lim, char **out, bool *raised) {
    jinja_template *t;
    *out = NULL;
    int rc = jinja_parse(src, strlen(src), &t);
    if (rc)
        return rc;
    json_error_t err;
    json_t *vars = json_loads(vars_json ? vars_json : "{}", 0, &err);
    size_t len;
    rc = jinja_render(t, vars, lim, out, &len, raised);
    json_decref(vars);
    jinja_free(t);
    return rc;
}

static void test_python_cases(void) {
    FILE *f = fopen(CVLLM_TEST_DATA "/chat/jinja_cases.jsonl", "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t err;
        json_t *c = json_loads(line, 0, &err);
        CHECK_MSG(c != NULL, "%s", err.text);
        if (!c)
            continue;
        const char *src = json_string_value(json_object_get(c, "src"));
        jinja_template *t;
        int rc = jinja_parse(src, strlen(src), &t);
        CHECK_MSG(rc == 0, "%s: %s", src, cv_error_message());
        if (rc == 0) {
            char *out = NULL;
            size_t len = 0;
            bool raised;
            rc = jinja_render(t, json_object_get(c, "vars"), NULL, &out, &len, &raised);
            const json_t *want = json_object_get(c, "want");
            if (want) {
                CHECK_MSG(rc == 0, "%s: %s", src, cv_error_message());
                if (rc == 0)
                    CHECK_MSG(len == json_string_length(want) && memcmp(out, json_string_value(want), len) == 0,
                              "%s\n  want: %s\n  got:  %s", src, json_string_value(want), out);
            } else {
                CHECK_MSG(rc != 0, "%s should fail, rendered %s", src, out);
                const json_t *msg = json_object_get(c, "error");
                if (rc && json_is_string(msg)) {
                    CHECK(raised);
                    CHECK_STR_EQ(cv_error_message(), json_string_value(msg));
                } else if (rc) {
                    CHECK(!raised);
                    CHECK_CONTAINS(cv_error_message(), "chat template: line 1: ");
                }
            }
            free(out);
            jinja_free(t);
        }
        json_decref(c);
        n++;
    }
    free(line);
    fclose(f);
    CHECK(n >= 60);
}

static void expect_parse_error(const char *src, const char *want) {
    jinja_template *t = NULL;
    int rc = jinja_parse(src, strlen(src), &t);
    CHECK_MSG(rc == CVLLM_ERR_INVALID_ARGUMENT, "should not parse: %s", src);
    if (rc)
        CHECK_STR_EQ(cv_error_message(), want);
    jinja_free(t);
}

static void test_parse_errors(void) {
    expect_parse_error("{% if x %}\nabc",
                       "chat template: line 2 column 4: Unexpected end of template. Jinja was looking for the "
                       "following tags: 'elif' or 'else' or 'endif'.");
    expect_parse_error("line1\n  {{ x | nosuch }}", "chat template: line 2 column 10: No filter named 'nosuch'.");
    expect_parse_error("{{ x is frobbed }}", "chat template: line 1 column 9: No test named 'frobbed'.");
    expect_parse_error("a\nb\n  {% foo %}", "chat template: line 3 column 6: Encountered unknown tag 'foo'.");
    expect_parse_error("{% extends 'base.jinja' %}", "chat template: line 1 column 4: Encountered unknown tag 'extends'.");
    expect_parse_error("{{ 'abc }}", "chat template: line 1 column 4: unexpected char ' (unterminated string)");
    expect_parse_error("{{ (1 }}", "chat template: line 1 column 7: unexpected '}'");
    expect_parse_error("{{ (1", "chat template: line 1 column 1: unexpected end of template, expected '}}'");
    expect_parse_error("{{ (1, 2 ] }}", "chat template: line 1 column 10: unexpected ']'");
    expect_parse_error("{{ 1 + }}", "chat template: line 1 column 8: unexpected end of print statement");
    expect_parse_error("{# never closed", "chat template: line 1 column 1: Missing end of comment tag");
    expect_parse_error("{% raw %}x", "chat template: line 1 column 1: Missing end of raw directive");
    expect_parse_error("{% endif %}", "chat template: line 1 column 4: Encountered unknown tag 'endif'.");
    expect_parse_error("{% break %}", "chat template: line 1 column 4: 'break' outside of a loop");
    expect_parse_error("{% for x in y %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}",
                       "chat template: line 1 column 35: 'continue' outside of a loop");
    expect_parse_error("{% for x in y recursive %}{% endfor %}",
                       "chat template: line 1 column 15: recursive loops are not supported");
    expect_parse_error("{% set 1 = 2 %}", "chat template: line 1 column 8: can't assign to a literal");
    expect_parse_error("{{ f(a=1, 2) }}", "chat template: line 1 column 11: positional argument follows keyword argument");
    expect_parse_error("{{ 'é' ~ @ }}", "chat template: line 1 column 10: unexpected char '@'");
    expect_parse_error("{{ 99999999999999999999 }}",
                       "chat template: line 1 column 4: integer literal '99999999999999999999' is invalid or too large");
    /* nesting is bounded, so a hostile template cannot exhaust the stack */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 600; i++)
        deep[k++] = '(';
    deep[k] = '\0';
    jinja_template *t;
    CHECK(jinja_parse(deep, k, &t) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "nested too deeply");
    k = 0;
    for (int i = 0; i < 300; i++)
        k += (size_t)snprintf(deep + k, sizeof deep - k, "{%%if 1%%}");
    CHECK(jinja_parse(deep, k, &t) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "nested too deeply");
}

static void test_render_errors(void) {
    char *out;
    bool raised;
    CHECK(render_src("{{ x.y }}", NULL, NULL, &out, &raised) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "chat template: line 1: 'x' is undefined");
    CHECK(!raised);
    CHECK(render_src("a\n\n{{ {}.y.z }}", NULL, NULL, &out, &raised) != 0);
    CHECK_STR_EQ(cv_error_message(), "chat template: line 3: 'dict object' has no attribute 'y'");
    CHECK(render_src("{{ m[0].role }}", "{\"m\": []}", NULL, &out, &raised) != 0);
    CHECK_STR_EQ(cv_error_message(), "chat template: line 1: list object has no element 0");
    CHECK(render_src("{%- if true %}\n{{- raise_exception('System message must be at the beginning.') }}\n{% endif %}",
                     NULL, NULL, &out, &raised) != 0);
    CHECK(raised);
    CHECK_STR_EQ(cv_error_message(), "System message must be at the beginning.");
    CHECK(render_src("{{ 'a' + 1 }}", NULL, NULL, &out, &raised) != 0);
    CHECK_STR_EQ(cv_error_message(), "chat template: line 1: can only concatenate str (not \"int\") to str");
    CHECK(render_src("{{ [].append(1) }}", NULL, NULL, &out, &raised) != 0);
    CHECK_STR_EQ(cv_error_message(), "chat template: line 1: access to attribute 'append' of 'list' object is unsafe.");
    CHECK(render_src("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, NULL, &out, &raised) != 0);
    CHECK_CONTAINS(cv_error_message(), "macro calls nested more than");
    /* the variables must be an object */
    jinja_template *t;
    CHECK(jinja_parse("x", 1, &t) == 0);
    json_t *arr = json_array();
    CHECK(jinja_render(t, arr, NULL, &out, NULL, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
    json_decref(arr);
    jinja_free(t);
}

static void test_budgets(void) {
    char *out;
    jinja_render_options small = {.max_memory = 1 << 20, .max_steps = 100000}, steps = {.max_memory = 64 << 20, .max_steps = 100000};
    CHECK(render_src("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL, &steps,
                     &out, NULL) != 0);
    CHECK_STR_EQ(cv_error_message(), "chat template: line 1: rendering took more than 100000 steps");
    CHECK(render_src("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}{{ ns.s|length }}", NULL, &small, &out, NULL) != 0);
    CHECK_CONTAINS(cv_error_message(), "rendering used more than 1 MiB of memory");
    CHECK(render_src("{{ 'ab' * 100000000 }}", NULL, &small, &out, NULL) != 0);
    CHECK_CONTAINS(cv_error_message(), "memory");
    /* within budget the same shape works */
    CHECK(render_src("{% set ns = namespace(s='x') %}{% for i in range(10) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}{{ ns.s|length }}", NULL, &small, &out, NULL) == 0);
    CHECK_STR_EQ(out, "1024");
    free(out);
}

static void expect_format(const char *src, bool openai) {
    jinja_template *t;
    CHECK_MSG(jinja_parse(src, strlen(src), &t) == 0, "%s: %s", src, cv_error_message());
    CHECK_MSG(jinja_loops_over_message_content(t) == openai, "%s should be %s", src, openai ? "openai" : "string");
    jinja_free(t);
}

static void test_content_format(void) {
    expect_format("{% for m in messages %}{{ m.content }}{% endfor %}", false);
    expect_format("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}", true);
    expect_format("{% for m in messages %}{% for p in m['content'] | default([]) %}{% endfor %}{% endfor %}", true);
    expect_format("{% set ms = messages[1:] %}{% for m in ms %}{% for p in m.content[:2] %}{% endfor %}{% endfor %}", true);
    expect_format("{% set a = messages %}{% set b = a|list %}{% for m in b %}{% for p in m.content %}{% endfor %}{% endfor %}", true);
    expect_format("{% for m in other %}{% for p in m.content %}{% endfor %}{% endfor %}", false);
    expect_format("{% for m in messages %}{% for p in m.parts %}{% endfor %}{% endfor %}", false);
    /* vLLM PR #53824 (vllm/renderers/hf.py, _iter_nodes_assign_content_item): a loop over a macro
     * parameter that a call fills with a message's content, whatever the parameter's name, by
     * position or by keyword; the content of something that is not a message does not count. */
    expect_format("{% macro r(c) %}{% for p in c %}{% endfor %}{% endmacro %}{% for m in messages %}{{ r(m.content) }}{% endfor %}", true);
    expect_format("{% macro r(x, c) %}{% for p in c %}{% endfor %}{% endmacro %}"
                  "{% for m in messages %}{{ r(1, c=m['content']|trim) }}{% endfor %}", true);
    expect_format("{% macro r(c) %}{% for p in c %}{% endfor %}{% endmacro %}{% for m in messages %}{{ r(m.name) }}{% endfor %}", false);
    expect_format("{% macro r(c) %}{% for p in c %}{% endfor %}{% endmacro %}{{ r(messages[0].content) }}", false);
    expect_format("{% macro r(c, d) %}{% for p in d %}{% endfor %}{% endmacro %}{% for m in messages %}{{ r(m.content, []) }}{% endfor %}", false);
    /* Qwen3.5/3.6: render_content(content, ...) loops `for item in content`, called with message.content. */
    expect_format("{% macro render_content(content, do_vision_count) %}{% if content is string %}{{ content }}"
                  "{% else %}{% for item in content %}{{ item.text }}{% endfor %}{% endif %}{% endmacro %}"
                  "{% for message in messages %}{{ render_content(message.content, true)|trim }}{% endfor %}", true);
    /* vLLM PR #42660: outside macros a loop over a variable named `content` counts; inside a macro
     * only a parameter fed with message content does. */
    expect_format("{% for m in messages %}{% set content = m.content %}{% for p in content %}{% endfor %}{% endfor %}", true);
    expect_format("{% macro r(content) %}{% for p in content %}{% endfor %}{% endmacro %}{{ r(tools) }}", false);
    /* Where vLLM's walk meets a target that is not a plain name it raises, and the format is "string". */
    expect_format("{% set ns = namespace(m=none) %}{% set ns.m = messages %}"
                  "{% for m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}", false);
    expect_format("{% for m in messages %}{% for a, b in m.content %}{% endfor %}{% endfor %}", false);
    /* The first matching loop in document order decides. */
    expect_format("{% for m in messages %}{% for p in m.content %}{% endfor %}{% for a, b in m.content %}{% endfor %}"
                  "{% endfor %}", true);
}

static void test_strftime_now(void) {
    char *out;
    CHECK(render_src("{{ strftime_now('%Y') }}", NULL, NULL, &out, NULL) == 0);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char year[16];
    snprintf(year, sizeof year, "%d", tm.tm_year + 1900);
    CHECK_STR_EQ(out, year);
    free(out);
}

static void test_shared_template(void) {
    /* One parsed template renders many times with different variables and keeps no state. */
    jinja_template *t;
    const char *src = "{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}";
    CHECK(jinja_parse(src, strlen(src), &t) == 0);
    for (int i = 0; i < 3; i++) {
        json_t *vars = json_pack("{s:[i,i]}", "xs", i, 10);
        char *out;
        CHECK(jinja_render(t, vars, NULL, &out, NULL, NULL) == 0);
        char want[8];
        snprintf(want, sizeof want, "%d", i + 10);
        CHECK_STR_EQ(out, want);
        free(out);
        json_decref(vars);
    }
    jinja_free(t);
}

static void test_speed(void) {
    size_t len;
    FILE *f = fopen(CVLLM_TEST_DATA "/chat/qwen3.6.jinja", "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    char src[16384];
    len = fread(src, 1, sizeof src - 1, f);
    fclose(f);
    src[len] = '\0';
    jinja_template *t;
    CHECK(jinja_parse(src, len, &t) == 0);
    json_t *vars = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"},"
        "{\"role\": \"user\", \"content\": \"What's the weather in Paris?\"},"
        "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"Use the tool.\","
        " \"tool_calls\": [{\"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}}]},"
        "{\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 21}\"},"
        "{\"role\": \"assistant\", \"content\": \"It is 21 degrees.\"},"
        "{\"role\": \"user\", \"content\": \"Thanks! And tomorrow?\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
        " \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}}}}],"
        "\"add_generation_prompt\": true}", 0, NULL);
    CHECK(vars != NULL);
    int iters = 200;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < iters; i++) {
        char *out;
        CHECK(jinja_render(t, vars, NULL, &out, NULL, NULL) == 0);
        free(out);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3 / iters;
    printf("qwen3.6 template, 6 messages + 1 tool: %.1f us per render\n", us);
    CHECK_MSG(us < 20000, "rendering takes %.0f us", us); /* generous: sanitizer builds are slow */
    json_decref(vars);
    jinja_free(t);
}

int main(void) {
    test_python_cases();
    test_parse_errors();
    test_render_errors();
    test_budgets();
    test_content_format();
    test_strftime_now();
    test_shared_template();
    test_speed();
    return cv_check_summary("test_chat_jinja");
}
