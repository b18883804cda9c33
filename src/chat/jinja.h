/*
 * jinja.h — a Jinja2 interpreter for chat templates.
 *
 * It covers the subset real chat templates use (Qwen3, Qwen3.5/3.6, Llama 3, Mistral, ChatML and
 * friends): output, if/elif/else, for with loop.* and else, break/continue, set (also on namespace
 * attributes and as a block), macros, filter blocks, the common filters, tests, string and dict
 * methods, slicing, Python operators and raise_exception(). It renders as transformers does:
 * Jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, default Undefined,
 * and tojson = json.dumps(x, ensure_ascii=False). Output is byte-for-byte what Python produces
 * for the same template and variables (see tests/data/chat/README.md for what is checked).
 *
 * Not supported (a parse error names them): template inheritance and includes (extends, block,
 * include, import), call blocks, recursive loops. Markup (autoescape) semantics are not modelled:
 * `safe` and `escape` return plain strings.
 *
 * A parsed template is immutable and may be rendered by many threads at once; each render has its
 * own arena. Errors follow error.h: parse errors read "chat template: line L column C: ...", a
 * raise_exception() error carries exactly the template's message, other render errors read
 * "chat template: line L: ...".
 */
#ifndef CV_JINJA_H
#define CV_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct jinja_template jinja_template;

/* Parses a template. Line endings are normalised (\r\n, \r → \n) and one trailing newline is
 * dropped, as Jinja2 does. */
int jinja_parse(const char *src, size_t len, jinja_template **out);
void jinja_free(jinja_template *t);

typedef struct jinja_render_options {
    size_t max_memory;    /* bytes of values and output per render (0 = 256 MiB) */
    uint64_t max_steps;   /* loop iterations, macro calls and output statements (0 = 50 M) */
    int64_t now;          /* strftime_now()'s clock in seconds since the epoch, read in local time
                           * as Python's datetime.now() is (0 = the current time) */
} jinja_render_options;

/* Renders with the members of `vars` (a JSON object) as template variables. *out is cv_xmalloc'd
 * and NUL-terminated. When the error came from raise_exception(), *raised (if not NULL) is set. */
int jinja_render(const jinja_template *t, const json_t *vars, const jinja_render_options *opts,
                 char **out, size_t *out_len, bool *raised);

/* True when vLLM's content-format detection (vllm/renderers/hf.py, _detect_content_format) finds
 * "openai" for this template: a for loop over a message's content (`X.content` / `X['content']`,
 * X a loop variable over `messages` or over a variable set from it), over a macro parameter that a
 * call fills with a message's content, or, outside macros, over a variable named `content`. The
 * rules, and where vLLM falls back to "string", are spelled out in jinja_parse.c. */
bool jinja_loops_over_message_content(const jinja_template *t);

/* json.dumps(v, ensure_ascii=False) as Python writes it (", " and ": " separators, floats in
 * repr() form, insertion order): the form vLLM gives tool-call arguments. cv_xmalloc'd. */
char *jinja_json_dumps(const json_t *v, size_t *len);
/* Python's repr() of a JSON value (quotes picked as repr picks them, True, None), the form vLLM's log
 * lines print values in. cv_xmalloc'd. */
char *jinja_py_repr(const json_t *v);

#endif
