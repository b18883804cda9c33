/*
 * chat.c — request pre-processing and template rendering (see chat.h for the rules).
 *
 * The pre-processing builds a new jansson array that borrows the request's strings and objects
 * by reference (json_incref) and deep-copies only what it rewrites (tool_calls, whose arguments
 * get parsed). The same rules are restated in tools/gen_chat_corpus.py, which produced the
 * expected renderings the tests compare against byte for byte.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "chat/chat.h"
#include "chat/jinja.h"
#include "chat/jinja_internal.h"

struct cv_chat_template {
    jinja_template *tmpl;
    char *source;
    json_t *special_tokens; /* object: name → string or list of strings */
    cv_chat_content_format format;
};

static const char CONTINUE_TAG[] = "CONTINUE_FINAL_MESSAGE_TAG ";

/* ---- loading ------------------------------------------------------------------------------------ */

static char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 8192, n = 0;
    char *buf = cv_xmalloc(cap);
    for (;;) {
        if (n + 4096 > cap) {
            cap *= 2;
            buf = cv_xrealloc(buf, cap);
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static const char *token_string(const json_t *v) {
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* transformers' special_tokens_map: the set token strings, additional_special_tokens as a list. */
static json_t *special_token_map(const json_t *src) {
    static const char *const NAMES[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};
    json_t *out = json_object();
    if (!json_is_object(src))
        return out;
    for (size_t i = 0; i < CV_ARRAY_LEN(NAMES); i++) {
        const char *s = token_string(json_object_get(src, NAMES[i]));
        if (s)
            json_object_set_new(out, NAMES[i], json_string(s));
    }
    const json_t *extra = json_object_get(src, "additional_special_tokens");
    if (json_is_array(extra)) {
        json_t *list = json_array();
        size_t i;
        const json_t *v;
        json_array_foreach(extra, i, v) {
            const char *s = token_string(v);
            if (s)
                json_array_append_new(list, json_string(s));
        }
        json_object_set_new(out, "additional_special_tokens", list);
    }
    return out;
}

int cv_chat_template_from_string(const char *src, size_t len, const json_t *special_tokens,
                                 cv_chat_template **out) {
    *out = NULL;
    jinja_template *tmpl;
    int rc = jinja_parse(src, len, &tmpl);
    if (rc)
        return rc;
    cv_chat_template *t = cv_xcalloc(1, sizeof *t);
    t->tmpl = tmpl;
    t->source = cv_xstrndup(src, len);
    t->special_tokens = special_token_map(special_tokens);
    t->format = jinja_loops_over_message_content(tmpl) ? CV_CHAT_CONTENT_OPENAI : CV_CHAT_CONTENT_STRING;
    *out = t;
    return 0;
}

/* tokenizer_config.json's chat_template: a string, or named templates of which "default" wins. */
static const char *config_template(const json_t *config) {
    const json_t *ct = json_object_get(config, "chat_template");
    if (json_is_string(ct))
        return json_string_value(ct);
    if (json_is_array(ct)) {
        size_t i;
        const json_t *v;
        json_array_foreach(ct, i, v) {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (name && strcmp(name, "default") == 0 && json_is_string(json_object_get(v, "template")))
                return json_string_value(json_object_get(v, "template"));
        }
    }
    return NULL;
}

int cv_chat_template_load(const char *model_dir, const char *template_file, cv_chat_template **out) {
    *out = NULL;
    json_t *config = NULL;
    if (model_dir) {
        char *path = cv_xasprintf("%s/tokenizer_config.json", model_dir);
        json_error_t err;
        FILE *f = fopen(path, "rb");
        if (f) {
            config = json_loadf(f, JSON_DECODE_ANY, &err);
            fclose(f);
            if (!config || !json_is_object(config)) {
                json_decref(config);
                int rc = cv_fail(CVLLM_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
                free(path);
                return rc;
            }
        }
        free(path);
    }
    char *text = NULL, *origin = NULL;
    size_t len = 0;
    if (template_file) {
        text = read_text_file(template_file, &len);
        if (text) {
            origin = cv_xstrdup(template_file);
        } else if (strpbrk(template_file, "{}\n")) { /* no such file, and written like a template: the template */
            text = cv_xstrdup(template_file);
            len = strlen(text);
            origin = cv_xstrdup("the --chat-template string");
        } else {
            const int e = errno;
            json_decref(config);
            return cv_fail(CVLLM_ERR_IO, "The supplied chat template (%s) looks like a file path, but it failed to be "
                           "opened. Reason: [Errno %d] %s: '%s'", template_file, e, strerror(e), template_file);
        }
    } else if (model_dir) {
        origin = cv_xasprintf("%s/chat_template.jinja", model_dir);
        text = read_text_file(origin, &len);
        if (!text && config_template(config)) {
            free(origin);
            origin = cv_xasprintf("%s/tokenizer_config.json", model_dir);
            text = cv_xstrdup(config_template(config));
            len = strlen(text);
        }
    }
    if (!text) {
        free(origin);
        json_decref(config);
        return cv_fail(CVLLM_ERR_NOT_FOUND,
                       "no chat template: %s has neither chat_template.jinja nor a chat_template in "
                       "tokenizer_config.json (use --chat-template FILE)", model_dir ? model_dir : "(no model)");
    }
    int rc = cv_chat_template_from_string(text, len, config, out);
    if (rc)
        cv_fail_prefix(rc, "%s", origin);
    free(text);
    free(origin);
    json_decref(config);
    return rc;
}

int cv_chat_template_with_text(const cv_chat_template *base, const char *src, size_t len, cv_chat_template **out) {
    return cv_chat_template_from_string(src, len, base ? base->special_tokens : NULL, out);
}

void cv_chat_template_free(cv_chat_template *t) {
    if (!t)
        return;
    jinja_free(t->tmpl);
    free(t->source);
    json_decref(t->special_tokens);
    free(t);
}

cv_chat_content_format cv_chat_template_content_format(const cv_chat_template *t) { return t->format; }

static const char *const FORMAT_NAMES[] = {"auto", "string", "openai"};

int cv_chat_content_format_parse(const char *name, cv_chat_content_format *out) {
    for (size_t i = 0; i < CV_ARRAY_LEN(FORMAT_NAMES); i++)
        if (strcmp(name, FORMAT_NAMES[i]) == 0) {
            *out = (cv_chat_content_format)i;
            return 0;
        }
    return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid choice: '%s' (choose from auto, string, openai)", name);
}

const char *cv_chat_content_format_name(cv_chat_content_format f) {
    return (size_t)f < CV_ARRAY_LEN(FORMAT_NAMES) ? FORMAT_NAMES[f] : "?";
}
const char *cv_chat_template_source(const cv_chat_template *t) { return t->source; }

/* ---- pre-processing ---------------------------------------------------------------------------------- */

/* The text of one content part, NULL to skip it; < 0 for a part type a text model cannot take. */
static int part_text(const json_t *part, size_t mi, size_t pi, const json_t **text) {
    *text = NULL;
    if (json_is_string(part)) {
        *text = part;
        return 0;
    }
    if (!json_is_object(part))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu].content[%zu] must be a string or an object", mi, pi);
    const char *type = json_string_value(json_object_get(part, "type"));
    if (!type)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu].content[%zu]: missing 'type' field in content part", mi, pi);
    const char *key = strcmp(type, "text") == 0 || strcmp(type, "input_text") == 0 ||
                      strcmp(type, "output_text") == 0 ? "text"
                    : strcmp(type, "refusal") == 0   ? "refusal"
                    : strcmp(type, "thinking") == 0  ? "thinking"
                                                     : NULL;
    if (!key)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "messages[%zu].content[%zu]: content part type '%s' is not supported by this "
                       "text-only server (supported: text, input_text, output_text, refusal, thinking)", mi, pi, type);
    const json_t *t = json_object_get(part, key);
    if (t && !json_is_null(t) && !json_is_string(t))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu].content[%zu].%s must be a string", mi, pi, key);
    *text = json_is_string(t) ? t : NULL;
    return 0;
}

/* Collects the texts of a message's content into a new array of strings. */
static int content_texts(const json_t *content, size_t mi, json_t **out) {
    json_t *texts = json_array();
    *out = texts;
    if (!content || json_is_null(content))
        return 0;
    if (json_is_string(content)) {
        json_array_append(texts, (json_t *)content);
        return 0;
    }
    if (!json_is_array(content))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu].content must be a string, an array or null", mi);
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *t;
        int rc = part_text(part, mi, i, &t);
        if (rc)
            return rc;
        if (t)
            json_array_append(texts, (json_t *)t);
    }
    return 0;
}

static json_t *join_texts(const json_t *texts, bool skip_empty) {
    size_t total = 0, i;
    const json_t *t;
    json_array_foreach(texts, i, t) total += json_string_length(t) + 1;
    char *buf = cv_xmalloc(total + 1);
    size_t n = 0;
    bool first = true;
    json_array_foreach(texts, i, t) {
        size_t len = json_string_length(t);
        if (skip_empty && len == 0)
            continue;
        if (!first)
            buf[n++] = '\n';
        memcpy(buf + n, json_string_value(t), len);
        n += len;
        first = false;
    }
    json_t *s = json_stringn_nocheck(buf, n);
    free(buf);
    return s;
}

static json_t *text_part_list(const json_t *texts) {
    json_t *list = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(texts, i, t)
        json_array_append_new(list, json_pack("{s:s,s:O}", "type", "text", "text", t));
    return list;
}

/* vLLM parses string arguments so templates can iterate them; anything unparsable becomes {}. */
static int normalise_tool_calls(json_t *calls, size_t mi) {
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_object_get(call, "function");
        if (!json_is_object(fn))
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu].tool_calls[%zu] has no 'function' object", mi, i);
        json_t *args = json_object_get(fn, "arguments");
        if (json_is_string(args)) {
            json_error_t err;
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args),
                                        JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
            json_object_set_new(fn, "arguments", parsed ? parsed : json_object());
        } else if (!json_is_object(args) && !json_is_array(args)) {
            json_object_set_new(fn, "arguments", json_object());
        }
    }
    return 0;
}

static int convert_message(const json_t *msg, size_t mi, cv_chat_content_format format, json_t **out) {
    *out = NULL;
    if (!json_is_object(msg))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu] must be an object", mi);
    const json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu] has no 'role' string", mi);
    const char *r = json_string_value(role);
    json_t *texts;
    int rc = content_texts(json_object_get(msg, "content"), mi, &texts);
    if (rc) {
        json_decref(texts);
        return rc;
    }
    bool is_tool = strcmp(r, "tool") == 0;
    json_t *m = json_object();
    json_object_set(m, "role", (json_t *)role);
    if (format == CV_CHAT_CONTENT_OPENAI && !is_tool)
        json_object_set_new(m, "content", text_part_list(texts));
    else /* tool results are always flattened; vLLM's string mode also drops empty texts */
        json_object_set_new(m, "content", join_texts(texts, !(is_tool && format == CV_CHAT_CONTENT_OPENAI)));
    json_decref(texts);
    if (strcmp(r, "assistant") == 0) {
        const json_t *calls = json_object_get(msg, "tool_calls");
        if (calls && !json_is_null(calls)) {
            if (!json_is_array(calls)) {
                json_decref(m);
                return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "messages[%zu].tool_calls must be an array", mi);
            }
            if (json_array_size(calls)) {
                json_t *copy = json_deep_copy(calls);
                rc = normalise_tool_calls(copy, mi);
                if (rc) {
                    json_decref(copy);
                    json_decref(m);
                    return rc;
                }
                json_object_set_new(m, "tool_calls", copy);
            }
        }
        const json_t *reasoning = json_object_get(msg, "reasoning");
        if (!reasoning || json_is_null(reasoning))
            reasoning = json_object_get(msg, "reasoning_content");
        if (reasoning && !json_is_null(reasoning)) {
            json_object_set(m, "reasoning", (json_t *)reasoning);
            json_object_set(m, "reasoning_content", (json_t *)reasoning);
        }
    } else if (is_tool) {
        const json_t *id = json_object_get(msg, "tool_call_id");
        if (id)
            json_object_set(m, "tool_call_id", (json_t *)id);
    }
    const json_t *name = json_object_get(msg, "name");
    if (json_is_string(name))
        json_object_set(m, "name", (json_t *)name);
    if (strcmp(r, "developer") == 0) {
        const json_t *tools = json_object_get(msg, "tools");
        json_object_set_new(m, "tools", tools ? json_incref((json_t *)tools) : json_null());
    }
    *out = m;
    return 0;
}

int cv_chat_conversation(const json_t *messages, cv_chat_content_format format, json_t **out) {
    *out = NULL;
    if (!json_is_array(messages))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "'messages' must be an array");
    json_t *conv = json_array();
    size_t i;
    const json_t *msg;
    json_array_foreach(messages, i, msg) {
        json_t *m;
        int rc = convert_message(msg, i, format, &m);
        if (rc) {
            json_decref(conv);
            return rc;
        }
        json_array_append_new(conv, m);
    }
    *out = conv;
    return 0;
}

/* ---- rendering ---------------------------------------------------------------------------------------- */

/* The span of s that Python's str.strip() keeps: [*start, *end). */
static void py_strip_span(const char *s, size_t n, size_t *start, size_t *end) {
    size_t a = 0, b = 0, i = 0, adv;
    bool seen = false;
    while (i < n) {
        bool sp = ju_py_isspace(ju_decode(s + i, n - i, &adv));
        if (!sp) {
            if (!seen)
                a = i;
            seen = true;
            b = i + adv;
        }
        i += adv;
    }
    *start = seen ? a : 0;
    *end = seen ? b : 0;
}

static const char *last_occurrence(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn)
        return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, n, nn) == 0)
            return h + i;
    return NULL;
}

/* Appends the marker to the final message's (last) text and returns that text, or fails. */
static int mark_final_message(const cv_chat_template *t, json_t *conv, char **final_text) {
    *final_text = NULL;
    json_t *last = json_array_get(conv, json_array_size(conv) - 1);
    json_t *content = json_object_get(last, "content");
    if (!content || json_is_null(content))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "continue_final_message is set but the final message has no \"content\" to continue!");
    if (!strstr(t->source, "content"))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "continue_final_message is set to \"content\" but this is "
                                                   "not an accepted field in the chat_template");
    json_t *holder = last;
    const char *key = "content";
    if (json_is_array(content)) {
        holder = NULL;
        for (size_t i = json_array_size(content); i-- > 0;) {
            json_t *block = json_array_get(content, i);
            if (json_is_object(block) && json_object_get(block, "text")) {
                holder = block;
                key = "text";
                break;
            }
        }
        if (!holder)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "continue_final_message is set but we could not find any "
                                                       "text to continue in the final message!");
    }
    const json_t *text = json_object_get(holder, key);
    if (!json_is_string(text))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "continue_final_message: the final message's text is not a string");
    size_t n = json_string_length(text);
    *final_text = cv_xstrndup(json_string_value(text), n);
    char *marked = cv_xasprintf("%s%s", *final_text, CONTINUE_TAG);
    json_object_set_new(holder, key, json_stringn_nocheck(marked, n + strlen(CONTINUE_TAG)));
    free(marked);
    return 0;
}

/* Cuts the rendering where the marker landed, as transformers does. */
static int cut_at_marker(char *prompt, size_t *len, const char *final_text) {
    size_t fs, fe;
    py_strip_span(final_text, strlen(final_text), &fs, &fe);
    size_t tag_len = strlen(CONTINUE_TAG), tag_stripped = tag_len - 1;
    bool final_found = fe == fs || last_occurrence(prompt, *len, final_text + fs, fe - fs);
    const char *loc = last_occurrence(prompt, *len, CONTINUE_TAG, tag_stripped);
    if (!final_found || !loc)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "continue_final_message is set but the final message does not appear in the chat after "
                       "applying the chat template! This can happen if the chat template deletes portions of "
                       "the final message. Please verify the chat template and final message in your chat to "
                       "ensure they are compatible.");
    size_t cut = (size_t)(loc - prompt);
    if (!(cut + tag_len <= *len && memcmp(loc, CONTINUE_TAG, tag_len) == 0)) {
        /* the template trimmed the marker's space: rstrip what precedes it */
        size_t s, e;
        py_strip_span(prompt, cut, &s, &e);
        cut = e;
    }
    prompt[cut] = '\0';
    *len = cut;
    return 0;
}

static void merge_object(json_t *dst, const json_t *src) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)src, k, v) json_object_set(dst, k, v);
}

int cv_chat_render(const cv_chat_template *t, const cv_chat_request *req, char **prompt, size_t *len) {
    *prompt = NULL;
    if (len)
        *len = 0;
    if (req->kwargs && !json_is_object(req->kwargs))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "chat_template_kwargs must be an object");
    if (req->default_kwargs && !json_is_object(req->default_kwargs))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "default chat template kwargs must be an object");
    if (req->kwargs && (json_object_get(req->kwargs, "chat_template") || json_object_get(req->kwargs, "tokenize"))) {
        bool both = json_object_get(req->kwargs, "chat_template") && json_object_get(req->kwargs, "tokenize");
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Found unexpected chat template kwargs from request: {%s}",
                       both ? "'chat_template', 'tokenize'"
                       : json_object_get(req->kwargs, "tokenize") ? "'tokenize'" : "'chat_template'");
    }
    if (req->continue_final_message && req->add_generation_prompt)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                       "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    json_t *conv;
    int rc = cv_chat_conversation(req->messages, req->content_format == CV_CHAT_CONTENT_AUTO ? t->format
                                                                                         : req->content_format, &conv);
    if (rc)
        return rc;
    char *final_text = NULL;
    if (req->continue_final_message) {
        if (json_array_size(conv) == 0) {
            json_decref(conv);
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "continue_final_message is set but there are no messages");
        }
        rc = mark_final_message(t, conv, &final_text);
        if (rc) {
            json_decref(conv);
            return rc;
        }
    }
    json_t *vars = json_deep_copy(t->special_tokens);
    if (req->default_kwargs)
        merge_object(vars, req->default_kwargs);
    if (req->kwargs)
        merge_object(vars, req->kwargs);
    json_object_set_new(vars, "messages", conv);
    json_object_set_new(vars, "tools", req->tools ? json_incref((json_t *)req->tools) : json_null());
    json_object_set_new(vars, "documents", req->documents ? json_incref((json_t *)req->documents) : json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(req->add_generation_prompt));
    size_t n = 0;
    jinja_render_options ro = {.now = req->now};
    rc = jinja_render(t->tmpl, vars, &ro, prompt, &n, NULL);
    json_decref(vars);
    if (!rc && final_text) {
        rc = cut_at_marker(*prompt, &n, final_text);
        if (rc) {
            free(*prompt);
            *prompt = NULL;
        }
    }
    free(final_text);
    if (!rc && len)
        *len = n;
    return rc;
}
