/*
 * test_chat_template.c — the chat layer around the interpreter: where templates come from, the
 * special-token variables, vLLM's conversation pre-processing field by field, and the request
 * errors (each a 400 with a readable message). Byte equality of whole prompts is test_chat_render's
 * job; here the expectations are small and written out.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "chat/chat.h"
#include "check.h"
#include "testutil.h"

static void write_file(const char *dir, const char *name, const char *text) {
    char *path = tu_strdupf("%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    free(path);
}

static char *render_simple(const cv_chat_template *t, const char *messages_json, bool add_gen) {
    json_t *messages = json_loads(messages_json, 0, NULL);
    cv_chat_request r = {.messages = messages, .add_generation_prompt = add_gen};
    char *out = NULL;
    int rc = cv_chat_render(t, &r, &out, NULL);
    CHECK_MSG(rc == 0, "%s", cv_error_message());
    json_decref(messages);
    return out;
}

static void test_loading(void) {
    char *dir = tu_make_temp_dir();
    cv_chat_template *t = NULL;

    CHECK(cv_chat_template_load(dir, NULL, &t) == CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cv_error_message(), "no chat template");

    write_file(dir, "tokenizer_config.json",
               "{\"eos_token\": \"<|im_end|>\", \"bos_token\": null, \"pad_token\": {\"content\": \"<pad>\"},"
               " \"additional_special_tokens\": [\"<a>\", {\"content\": \"<b>\"}],"
               " \"chat_template\": \"cfg:{{ eos_token }}|{{ bos_token is defined }}|{{ pad_token }}|{{ additional_special_tokens|join(',') }}\"}");
    CHECK(cv_chat_template_load(dir, NULL, &t) == 0);
    char *out = render_simple(t, "[]", true);
    CHECK_STR_EQ(out, "cfg:<|im_end|>|False|<pad>|<a>,<b>");
    free(out);
    cv_chat_template_free(t);

    /* chat_template.jinja wins over tokenizer_config.json, special tokens still come from the config */
    write_file(dir, "chat_template.jinja", "file:{{ eos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}\n");
    CHECK(cv_chat_template_load(dir, NULL, &t) == 0);
    out = render_simple(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", true);
    CHECK_STR_EQ(out, "file:<|im_end|>[hi]");
    free(out);
    CHECK(cv_chat_template_content_format(t) == CV_CHAT_CONTENT_STRING);
    CHECK_CONTAINS(cv_chat_template_source(t), "file:");
    cv_chat_template_free(t);

    /* --chat-template FILE wins over both */
    char *override = tu_strdupf("%s/%s", dir, "override.jinja");
    write_file(dir, "override.jinja", "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}");
    CHECK(cv_chat_template_load(dir, override, &t) == 0);
    CHECK(cv_chat_template_content_format(t) == CV_CHAT_CONTENT_OPENAI);
    out = render_simple(t, "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"b\"}, {\"type\": \"text\", \"text\": \"\"}]}]", true);
    CHECK_STR_EQ(out, "<a><b><>");
    free(out);
    cv_chat_template_free(t);
    free(override);

    /* a value that names no file: vLLM's error when it reads like a path, else the template itself */
    CHECK(cv_chat_template_load(dir, "/nonexistent/template.jinja", &t) == CVLLM_ERR_IO);
    CHECK_STR_EQ(cv_error_message(), "The supplied chat template (/nonexistent/template.jinja) looks like a file "
                                     "path, but it failed to be opened. Reason: [Errno 2] No such file or directory: "
                                     "'/nonexistent/template.jinja'");
    CHECK(cv_chat_template_load(dir, "{% for m in messages %}({{ m.content }}){% endfor %}{{ eos_token }}", &t) == 0);
    out = render_simple(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", true);
    CHECK_STR_EQ(out, "(hi)<|im_end|>"); /* the folder's special tokens still apply */
    free(out);
    cv_chat_template_free(t);
    CHECK(cv_chat_template_load(dir, "line one\n{{ m.content }", &t) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "the --chat-template string: chat template: line 2 column");

    /* a template that does not parse names the file, the line and the column */
    write_file(dir, "chat_template.jinja", "ok\n{% for m in messages %}\n{{ m.content }");
    CHECK(cv_chat_template_load(dir, NULL, &t) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "chat_template.jinja: chat template: line 3 column");

    /* named templates in tokenizer_config.json: "default" is used */
    char *jinja = tu_strdupf("%s/%s", dir, "chat_template.jinja");
    remove(jinja);
    free(jinja);
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tools\"}, {\"name\": \"default\", \"template\": \"plain\"}]}");
    CHECK(cv_chat_template_load(dir, NULL, &t) == 0);
    out = render_simple(t, "[]", true);
    CHECK_STR_EQ(out, "plain");
    free(out);
    cv_chat_template_free(t);

    write_file(dir, "tokenizer_config.json", "{not json");
    CHECK(cv_chat_template_load(dir, NULL, &t) == CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "tokenizer_config.json");
    tu_remove_tree(dir);
    free(dir);
}

static void test_shipped_qwen3(void) {
    cv_chat_template *t = NULL;
    CHECK(cv_chat_template_load(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", NULL, &t) == 0);
    if (!t)
        return;
    char *out = render_simple(t, "[{\"role\": \"user\", \"content\": \"Hello\"}]", true);
    CHECK_STR_EQ(out, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    json_t *messages = json_loads("[{\"role\": \"user\", \"content\": \"Hello\"}]", 0, NULL);
    json_t *kwargs = json_pack("{s:b}", "enable_thinking", 0);
    json_t *defaults = json_pack("{s:b}", "enable_thinking", 1);
    cv_chat_request r = {.messages = messages, .kwargs = kwargs, .default_kwargs = defaults, .add_generation_prompt = true};
    size_t len;
    CHECK(cv_chat_render(t, &r, &out, &len) == 0);
    CHECK_STR_EQ(out, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    CHECK_EQ_INT(len, strlen(out));
    free(out);
    r.kwargs = NULL; /* the server default applies when the request says nothing */
    CHECK(cv_chat_render(t, &r, &out, NULL) == 0);
    CHECK_STR_EQ(out, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    json_decref(messages);
    json_decref(kwargs);
    json_decref(defaults);
    cv_chat_template_free(t);
}

static void test_conversation(void) {
    json_t *messages = json_loads(
        "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, \"b\", {\"type\": \"text\", \"text\": \"\"},"
        "  {\"type\": \"refusal\", \"refusal\": \"r\"}, {\"type\": \"text\", \"text\": null}], \"name\": \"bob\", \"extra\": 1},"
        " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"why\","
        "  \"tool_calls\": [{\"id\": \"c1\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [1, 2.5]}\"}},"
        "                  {\"id\": \"c2\", \"function\": {\"name\": \"g\", \"arguments\": \"\"}},"
        "                  {\"id\": \"c3\", \"function\": {\"name\": \"h\", \"arguments\": 7}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": [{\"type\": \"text\", \"text\": \"r1\"}, {\"type\": \"text\", \"text\": \"r2\"}]},"
        " {\"role\": \"assistant\", \"content\": \"x\", \"reasoning\": \"new\", \"reasoning_content\": \"old\", \"tool_calls\": []},"
        " {\"role\": \"developer\", \"content\": \"d\"}]", 0, NULL);
    json_t *conv;
    CHECK(cv_chat_conversation(messages, CV_CHAT_CONTENT_STRING, &conv) == 0);
    char *s = json_dumps(conv, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK_STR_EQ(s, "[{\"role\":\"user\",\"content\":\"a\\nb\\nr\",\"name\":\"bob\"},"
                    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":[1,2.5]}}},"
                    "{\"id\":\"c2\",\"function\":{\"name\":\"g\",\"arguments\":{}}},{\"id\":\"c3\",\"function\":{\"name\":\"h\",\"arguments\":{}}}],"
                    "\"reasoning\":\"why\",\"reasoning_content\":\"why\"},"
                    "{\"role\":\"tool\",\"content\":\"r1\\nr2\",\"tool_call_id\":\"c1\"},"
                    "{\"role\":\"assistant\",\"content\":\"x\",\"reasoning\":\"new\",\"reasoning_content\":\"new\"},"
                    "{\"role\":\"developer\",\"content\":\"d\",\"tools\":null}]");
    free(s);
    json_decref(conv);
    CHECK(cv_chat_conversation(messages, CV_CHAT_CONTENT_OPENAI, &conv) == 0);
    s = json_dumps(json_array_get(conv, 0), JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK_STR_EQ(s, "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"},"
                    "{\"type\":\"text\",\"text\":\"\"},{\"type\":\"text\",\"text\":\"r\"}],\"name\":\"bob\"}");
    free(s);
    s = json_dumps(json_object_get(json_array_get(conv, 1), "content"), JSON_ENCODE_ANY | JSON_COMPACT);
    CHECK_STR_EQ(s, "[]");
    free(s);
    json_decref(conv);
    /* the request itself is left untouched */
    CHECK(json_is_string(json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(messages, 1), "tool_calls"), 0), "function"), "arguments")));
    json_decref(messages);
}

static void expect_conversation_error(const char *messages_json, const char *want) {
    json_t *messages = json_loads(messages_json, JSON_DECODE_ANY, NULL);
    json_t *conv = NULL;
    CHECK_MSG(cv_chat_conversation(messages, CV_CHAT_CONTENT_STRING, &conv) == CVLLM_ERR_INVALID_ARGUMENT, "%s", messages_json);
    CHECK_STR_EQ(cv_error_message(), want);
    CHECK(conv == NULL);
    json_decref(messages);
}

static void test_request_errors(void) {
    expect_conversation_error("{}", "'messages' must be an array");
    expect_conversation_error("[1]", "messages[0] must be an object");
    expect_conversation_error("[{\"content\": \"x\"}]", "messages[0] has no 'role' string");
    expect_conversation_error("[{\"role\": \"user\", \"content\": 5}]", "messages[0].content must be a string, an array or null");
    expect_conversation_error("[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]",
                              "messages[0].content[0]: content part type 'image_url' is not supported by this text-only "
                              "server (supported: text, input_text, output_text, refusal, thinking)");
    expect_conversation_error("[{\"role\": \"user\", \"content\": [{\"text\": \"x\"}]}]",
                              "messages[0].content[0]: missing 'type' field in content part");
    expect_conversation_error("[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 1}]}]",
                              "messages[0].content[0].text must be a string");
    expect_conversation_error("[{\"role\": \"assistant\", \"tool_calls\": {}}]", "messages[0].tool_calls must be an array");
    expect_conversation_error("[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"x\"}]}]",
                              "messages[0].tool_calls[0] has no 'function' object");

    cv_chat_template *t;
    const char *src = "{% for m in messages %}{{ m.content }}|{% endfor %}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &t) == 0);
    json_t *messages = json_loads("[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"The answer is  \"}]", 0, NULL);
    json_t *kwargs = json_pack("{s:b}", "tokenize", 1);
    cv_chat_request r = {.messages = messages, .kwargs = kwargs};
    char *out = NULL;
    CHECK(cv_chat_render(t, &r, &out, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "Found unexpected chat template kwargs from request: {'tokenize'}");
    json_decref(kwargs);
    r.kwargs = NULL;
    r.continue_final_message = r.add_generation_prompt = true;
    CHECK(cv_chat_render(t, &r, &out, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    /* continue_final_message cuts where the final message ends (the template kept its spaces) */
    r.add_generation_prompt = false;
    CHECK(cv_chat_render(t, &r, &out, NULL) == 0);
    CHECK_STR_EQ(out, "q|The answer is  ");
    free(out);
    cv_chat_template_free(t);
    /* ... or, when the template trimmed it, at the trimmed end */
    src = "{% for m in messages %}{{ m.content | trim }}|{% endfor %}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &t) == 0);
    CHECK(cv_chat_render(t, &r, &out, NULL) == 0);
    CHECK_STR_EQ(out, "q|The answer is");
    free(out);
    cv_chat_template_free(t);
    /* a template that drops the final message cannot be continued */
    src = "{% for m in messages[:-1] %}{{ m.content }}{% endfor %}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &t) == 0);
    CHECK(cv_chat_render(t, &r, &out, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "the final message does not appear in the chat");
    cv_chat_template_free(t);
    src = "{% for m in messages %}{{ m['text'] }}{% endfor %}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &t) == 0);
    CHECK(cv_chat_render(t, &r, &out, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cv_error_message(), "not an accepted field in the chat_template");
    cv_chat_template_free(t);
    json_decref(messages);
    /* errors inside the template are 400s too */
    src = "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &t) == 0);
    messages = json_array();
    r = (cv_chat_request){.messages = messages};
    CHECK(cv_chat_render(t, &r, &out, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "Conversation roles must alternate user/assistant/user/assistant/...");
    CHECK(out == NULL);
    json_decref(messages);
    cv_chat_template_free(t);
    src = "{% if %}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &t) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "chat template: line 1 column 7: expected an expression, got end of statement block");
}

static void test_variables(void) {
    /* tools and documents are null when absent; kwargs override the server defaults */
    const char *src = "{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ a }}{{ b }}|{{ eos_token }}";
    json_t *special = json_pack("{s:s}", "eos_token", "</s>");
    cv_chat_template *t;
    CHECK(cv_chat_template_from_string(src, strlen(src), special, &t) == 0);
    json_t *messages = json_array(), *defaults = json_pack("{s:i,s:i}", "a", 1, "b", 2), *kwargs = json_pack("{s:i,s:s}", "b", 3, "eos_token", "E");
    json_t *docs = json_pack("[{s:s}]", "title", "t");
    cv_chat_request r = {.messages = messages, .default_kwargs = defaults, .kwargs = kwargs, .documents = docs, .add_generation_prompt = true};
    char *out;
    CHECK(cv_chat_render(t, &r, &out, NULL) == 0);
    CHECK_STR_EQ(out, "None|[{'title': 't'}]|True|13|E");
    free(out);
    json_decref(messages);
    json_decref(defaults);
    json_decref(kwargs);
    json_decref(docs);
    json_decref(special);
    cv_chat_template_free(t);
}

/* --chat-template-content-format: auto takes the detected format, string joins the text parts with
 * "\n" (skipping empty ones), openai hands the template the parts — vLLM's three settings
 * (vllm/renderers/hf.py resolve_chat_template_content_format, chat_utils._parse_chat_message_content). */
static char *render_in_format(const cv_chat_template *t, const char *messages_json, cv_chat_content_format f) {
    json_t *messages = json_loads(messages_json, 0, NULL);
    cv_chat_request r = {.messages = messages, .add_generation_prompt = true, .content_format = f};
    char *out = NULL;
    CHECK_MSG(cv_chat_render(t, &r, &out, NULL) == 0, "%s", cv_error_message());
    json_decref(messages);
    return out;
}

static void test_content_format_setting(void) {
    static const char two_parts[] =
        "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Describe it.\"},"
        " {\"type\": \"text\", \"text\": \"\"}, {\"type\": \"text\", \"text\": \"Briefly.\"}]}]";
    /* Qwen3.6 loops over content inside its render_content macro: detected "openai", so by default
     * its parts are concatenated as transformers renders a part list, not joined with newlines. */
    cv_chat_template *q = NULL;
    CHECK(cv_chat_template_load(CVLLM_SOURCE_DIR "/models/Qwen/Qwen3.6-35B-A3B", NULL, &q) == 0);
    if (q) {
        CHECK(cv_chat_template_content_format(q) == CV_CHAT_CONTENT_OPENAI);
        static const char joined[] = "<|im_start|>user\nDescribe it.\nBriefly.<|im_end|>\n<|im_start|>assistant\n<think>\n";
        static const char concatenated[] = "<|im_start|>user\nDescribe it.Briefly.<|im_end|>\n<|im_start|>assistant\n<think>\n";
        char *a = render_in_format(q, two_parts, CV_CHAT_CONTENT_AUTO);
        char *s = render_in_format(q, two_parts, CV_CHAT_CONTENT_STRING);
        char *o = render_in_format(q, two_parts, CV_CHAT_CONTENT_OPENAI);
        CHECK_STR_EQ(a ? a : "", concatenated);
        CHECK_STR_EQ(s ? s : "", joined);
        CHECK_STR_EQ(o ? o : "", concatenated);
        free(a);
        free(s);
        free(o);
        cv_chat_template_free(q);
    }
    /* A template that prints content as it is: detected "string"; forced "openai" shows the list. */
    cv_chat_template *t = NULL;
    const char *src = "{% for m in messages %}[{{ m.content }}]{% endfor %}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &t) == 0);
    if (t) {
        CHECK(cv_chat_template_content_format(t) == CV_CHAT_CONTENT_STRING);
        char *a = render_in_format(t, two_parts, CV_CHAT_CONTENT_AUTO);
        char *s = render_in_format(t, two_parts, CV_CHAT_CONTENT_STRING);
        char *o = render_in_format(t, two_parts, CV_CHAT_CONTENT_OPENAI);
        CHECK_STR_EQ(a ? a : "", "[Describe it.\nBriefly.]");
        CHECK_STR_EQ(s ? s : "", "[Describe it.\nBriefly.]");
        CHECK_STR_EQ(o ? o : "", "[[{'type': 'text', 'text': 'Describe it.'}, {'type': 'text', 'text': ''}, "
                                 "{'type': 'text', 'text': 'Briefly.'}]]");
        free(a);
        free(s);
        free(o);
        cv_chat_template_free(t);
    }
    /* The flag's values, and argparse's wording for another. */
    static const char *const names[] = {"auto", "string", "openai"};
    static const cv_chat_content_format values[] = {CV_CHAT_CONTENT_AUTO, CV_CHAT_CONTENT_STRING, CV_CHAT_CONTENT_OPENAI};
    for (size_t i = 0; i < 3; i++) {
        cv_chat_content_format f = CV_CHAT_CONTENT_OPENAI;
        CHECK(cv_chat_content_format_parse(names[i], &f) == 0);
        CHECK(f == values[i]);
        CHECK_STR_EQ(cv_chat_content_format_name(f), names[i]);
    }
    cv_chat_content_format f;
    CHECK(cv_chat_content_format_parse("OpenAI", &f) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "invalid choice: 'OpenAI' (choose from auto, string, openai)");
}

int main(void) {
    test_loading();
    test_shipped_qwen3();
    test_conversation();
    test_request_errors();
    test_variables();
    test_content_format_setting();
    return cv_check_summary("test_chat_template");
}
