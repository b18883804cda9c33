/*
 * test_chat_render.c — chat templates rendered byte for byte as Python Jinja2 renders them.
 *
 * tests/data/chat/corpus.jsonl holds chat requests (system/user/assistant/tool turns, reasoning in
 * history, tools with nested schemas, unicode, empty and null contents, enable_thinking on/off,
 * add_generation_prompt on/off, continue_final_message) and, for each template listed in
 * templates.json, what transformers-style Jinja2 produced: the prompt, or the message the template
 * raised, or the fact that rendering failed. tools/gen_chat_corpus.py wrote them; nothing is
 * regenerated here. On a mismatch the test prints the first differing byte with some context.
 *
 * "expected" is rendered in the content format vLLM detects for the template (Qwen3.6's is "openai":
 * it loops over message content inside a macro), and is checked with CV_CHAT_CONTENT_AUTO. Requests
 * whose messages carry content-part lists (user, system, assistant and tool turns, mixed with plain
 * strings) also hold "by_format": the renderings with --chat-template-content-format string and
 * openai, checked with those settings.
 *
 * Templates that print the date (strftime_now) render with the generator's fixed clock, stored in
 * templates.json, in UTC as the generator did: the test gives the same answer on any day and machine.
 */
#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "chat/chat.h"
#include "check.h"

#define MAX_TEMPLATES 16

typedef struct named_template {
    const char *name;
    cv_chat_template *t;
} named_template;

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    *len = got;
    return buf;
}

static void show_difference(const char *id, const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s: first difference at byte %zu\n  want: ...%.80s\n  got:  ...%.80s\n", id, i, want + from,
            got + from);
}

static int load_templates(json_t *meta, named_template *out) {
    int n = 0;
    const char *name;
    json_t *spec;
    json_object_foreach(meta, name, spec) {
        char path[512];
        snprintf(path, sizeof path, "%s/chat/%s", CVLLM_TEST_DATA, json_string_value(json_object_get(spec, "file")));
        size_t len;
        char *src = read_file(path, &len);
        CHECK_MSG(src != NULL, "cannot read %s", path);
        if (!src)
            continue;
        cv_chat_template *t = NULL;
        int rc = cv_chat_template_from_string(src, len, json_object_get(spec, "special_tokens"), &t);
        CHECK_MSG(rc == 0, "%s: %s", name, cv_error_message());
        free(src);
        if (rc)
            continue;
        const char *fmt = json_string_value(json_object_get(spec, "content_format"));
        cv_chat_content_format want = strcmp(fmt, "openai") == 0 ? CV_CHAT_CONTENT_OPENAI : CV_CHAT_CONTENT_STRING;
        CHECK_MSG(cv_chat_template_content_format(t) == want, "%s: content format should be %s", name, fmt);
        assert(n < MAX_TEMPLATES);
        out[n++] = (named_template){name, t};
    }
    return n;
}

static void check_case(const named_template *nt, const json_t *req, cv_chat_content_format format,
                       const json_t *expected, int64_t clock, int id, int *compared) {
    cv_chat_request r = {
        .content_format = format,
        .now = clock,
        .messages = json_object_get(req, "messages"),
        .tools = json_object_get(req, "tools"),
        .documents = json_object_get(req, "documents"),
        .kwargs = json_object_get(req, "chat_template_kwargs"),
        .add_generation_prompt = json_is_true(json_object_get(req, "add_generation_prompt")),
        .continue_final_message = json_is_true(json_object_get(req, "continue_final_message")),
    };
    char *prompt = NULL;
    size_t len = 0;
    int rc = cv_chat_render(nt->t, &r, &prompt, &len);
    char label[128];
    snprintf(label, sizeof label, "case %d, template %s, content format %s", id, nt->name,
             cv_chat_content_format_name(format));
    if (json_is_string(expected)) {
        (*compared)++;
        CHECK_MSG(rc == 0, "%s: %s", label, cv_error_message());
        if (rc == 0) {
            bool same = len == json_string_length(expected) && memcmp(prompt, json_string_value(expected), len) == 0;
            CHECK_MSG(same, "%s: rendering differs", label);
            if (!same)
                show_difference(label, json_string_value(expected), prompt);
        }
    } else if (json_object_get(expected, "raises")) {
        CHECK_MSG(rc != 0, "%s: should raise", label);
        if (rc)
            CHECK_STR_EQ(cv_error_message(), json_string_value(json_object_get(expected, "raises")));
    } else {
        CHECK_MSG(rc != 0, "%s: should fail like Python (%s)", label,
                  json_string_value(json_object_get(expected, "fails")));
    }
    free(prompt);
}

static void test_corpus(void) {
    json_error_t err;
    json_t *meta = json_load_file(CVLLM_TEST_DATA "/chat/templates.json", 0, &err);
    CHECK_MSG(meta != NULL, "templates.json: %s", err.text);
    if (!meta)
        return;
    int64_t clock = json_integer_value(json_object_get(meta, "clock"));
    CHECK_MSG(clock > 0, "templates.json has no clock");
    named_template templates[MAX_TEMPLATES];
    int nt = load_templates(json_object_get(meta, "templates"), templates);
    FILE *f = fopen(CVLLM_TEST_DATA "/chat/corpus.jsonl", "rb");
    CHECK(f != NULL);
    int requests = 0, compared = 0, by_format = 0, qwen36_parts_differ = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_t *c = json_loadb(line, (size_t)n, 0, &err);
        CHECK_MSG(c != NULL, "corpus line %d: %s", requests + 1, err.text);
        if (!c)
            continue;
        int id = (int)json_integer_value(json_object_get(c, "id"));
        const json_t *req = json_object_get(c, "request"), *expected = json_object_get(c, "expected");
        const json_t *formats = json_object_get(c, "by_format");
        for (int i = 0; i < nt; i++) {
            const json_t *e = json_object_get(expected, templates[i].name);
            CHECK_MSG(e != NULL, "case %d has no result for %s", id, templates[i].name);
            if (e)
                check_case(&templates[i], req, CV_CHAT_CONTENT_AUTO, e, clock, id, &compared);
            if (!formats)
                continue;
            const json_t *both = json_object_get(formats, templates[i].name);
            const json_t *as_string = json_object_get(both, "string"), *as_openai = json_object_get(both, "openai");
            CHECK_MSG(as_string && as_openai, "case %d has no by_format results for %s", id, templates[i].name);
            if (!as_string || !as_openai)
                continue;
            check_case(&templates[i], req, CV_CHAT_CONTENT_STRING, as_string, clock, id, &compared);
            check_case(&templates[i], req, CV_CHAT_CONTENT_OPENAI, as_openai, clock, id, &compared);
            by_format++;
            qwen36_parts_differ += !strcmp(templates[i].name, "qwen3.6") && !json_equal(as_string, as_openai);
        }
        json_decref(c);
        requests++;
    }
    free(line);
    if (f)
        fclose(f);
    CHECK_MSG(requests >= 200, "only %d requests in the corpus", requests);
    CHECK_MSG(compared >= 1000, "only %d renderings compared", compared);
    /* The part-list requests are there, and on Qwen3.6 the format changes the prompt for most. */
    CHECK_MSG(by_format >= 100 * 6, "only %d template renderings with an explicit content format", by_format);
    CHECK_MSG(qwen36_parts_differ >= 50, "only %d part-list requests render differently as string and openai "
              "on qwen3.6", qwen36_parts_differ);
    printf("corpus: %d requests, %d renderings compared byte for byte, %d templates, %d by explicit content "
           "format\n", requests, compared, nt, by_format);
    for (int i = 0; i < nt; i++)
        cv_chat_template_free(templates[i].t);
    json_decref(meta);
}

/* The clock reaches strftime_now(): another pinned day prints that day. */
static void test_clock(void) {
    static const char src[] = "{{ strftime_now('%d %b %Y %H:%M') }}";
    cv_chat_template *t = NULL;
    CHECK(cv_chat_template_from_string(src, sizeof src - 1, NULL, &t) == 0);
    if (!t)
        return;
    json_t *messages = json_array();
    cv_chat_request r = {.messages = messages, .now = 951782400}; /* 2000-02-29 00:00:00 UTC */
    char *prompt = NULL;
    CHECK(cv_chat_render(t, &r, &prompt, NULL) == 0);
    CHECK_STR_EQ(prompt ? prompt : "", "29 Feb 2000 00:00");
    free(prompt);
    json_decref(messages);
    cv_chat_template_free(t);
}

int main(void) {
    setenv("TZ", "UTC", 1); /* the generator formatted its clock in UTC */
    tzset();
    test_clock();
    test_corpus();
    return cv_check_summary("test_chat_render");
}
