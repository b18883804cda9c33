/*
 * request_log.c — see request_log.h. Python's reprs, written out: a float as its shortest round-trip
 * digits in repr's layout (1.0, 0.7, 1e-05, 1e+16), a str quoted as repr quotes it, lists as "[a, b]".
 */
#include "server/request_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"

typedef struct text {
    char *s;
    size_t len, cap;
} text;

static void put(text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->s = cv_xrealloc(t->s, t->cap);
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

static void puts_(text *t, const char *s) { put(t, s, strlen(s)); }

/* repr(float(v)): the shortest digits that read back as v, fixed for exponents -4…15, else d.ddde±XX. */
static void py_float(text *t, float v) {
    if (isnan(v)) return puts_(t, "nan");
    if (isinf(v)) return puts_(t, v < 0 ? "-inf" : "inf");
    char e[48];
    for (int p = 1; p <= 9; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, (double)v);
        if (strtof(e, NULL) == v) break;
    }
    const bool neg = e[0] == '-';
    char digits[16];
    size_t nd = 0;
    const char *c = e + neg;
    for (; *c && *c != 'e'; c++)
        if (*c != '.') digits[nd++] = *c;
    int exp = atoi(c + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            o += (size_t)snprintf(out + o, sizeof out - o, "0.");
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (size_t i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 >= nd) out[o++] = '0';
            for (size_t i = (size_t)exp + 1; i < nd; i++) out[o++] = digits[i];
        }
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++) out[o++] = digits[i];
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    }
    put(t, out, o);
}

/* repr(str): single quotes unless the text has one and no double quote; \\, the quote, \n \r \t and
 * other control bytes escaped; everything else (UTF-8 included) as it is. */
static void py_str(text *t, const char *s, size_t n) {
    const bool dq = memchr(s, '\'', n) && !memchr(s, '"', n);
    const char q = dq ? '"' : '\'';
    put(t, &q, 1);
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '\\' || ch == (unsigned char)q) snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (ch == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (ch == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (ch < 0x20 || ch == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", ch);
        else esc[0] = (char)ch, esc[1] = '\0';
        puts_(t, esc);
    }
    put(t, &q, 1);
}

static void py_ints(text *t, const int32_t *v, size_t n) {
    puts_(t, "[");
    for (size_t i = 0; i < n; i++) {
        char b[16];
        snprintf(b, sizeof b, "%s%d", i ? ", " : "", v[i]);
        puts_(t, b);
    }
    puts_(t, "]");
}

static void py_strs(text *t, const char *const *v, size_t n) {
    puts_(t, "[");
    for (size_t i = 0; i < n; i++) {
        if (i) puts_(t, ", ");
        py_str(t, v[i], strlen(v[i]));
    }
    puts_(t, "]");
}

static void field_float(text *t, const char *name, float v) {
    puts_(t, name);
    py_float(t, v);
}

static void field_int(text *t, const char *name, int64_t v, bool none) {
    char b[48];
    snprintf(b, sizeof b, "%s%lld", name, (long long)v);
    puts_(t, none ? name : b);
    if (none) puts_(t, "None");
}

static void field_bool(text *t, const char *name, bool v) {
    puts_(t, name);
    puts_(t, v ? "True" : "False");
}

/* vLLM's StructuredOutputsParams repr of the constraint's one field, or None. */
static void structured(text *t, const cvllm_constraint *c) {
    static const char *const names[] = {"", "json", "json_object", "regex", "choice", "grammar", "structural_tag"};
    if (!c || c->kind <= 0 || (size_t)c->kind >= sizeof names / sizeof *names) return puts_(t, "None");
    puts_(t, "StructuredOutputsParams(");
    puts_(t, names[c->kind]);
    puts_(t, "=");
    if (c->kind == CVLLM_CONSTRAINT_CHOICE) py_strs(t, c->choices, c->n_choices);
    else if (c->kind == CVLLM_CONSTRAINT_JSON_OBJECT) puts_(t, "True");
    else py_str(t, c->spec ? c->spec : "", c->spec ? (c->spec_len ? c->spec_len : strlen(c->spec)) : 0);
    puts_(t, ")");
}

char *cv_sampling_params_repr(const cvllm_sampling_params *p, int64_t truncate, const cvllm_constraint *constraint) {
    text t = {0};
    field_int(&t, "SamplingParams(n=", p->n, false);
    field_float(&t, ", presence_penalty=", p->presence_penalty);
    field_float(&t, ", frequency_penalty=", p->frequency_penalty);
    field_float(&t, ", repetition_penalty=", p->repetition_penalty);
    field_float(&t, ", temperature=", p->temperature);
    field_float(&t, ", top_p=", p->top_p);
    field_int(&t, ", top_k=", p->top_k, false);
    field_float(&t, ", min_p=", p->min_p);
    field_int(&t, ", seed=", p->seed, !p->has_seed);
    puts_(&t, ", stop=");
    py_strs(&t, p->stop, p->n_stop);
    puts_(&t, ", stop_token_ids=");
    py_ints(&t, p->stop_token_ids, p->n_stop_token_ids);
    puts_(&t, ", bad_words=");
    py_strs(&t, p->bad_words, p->n_bad_words);
    field_bool(&t, ", include_stop_str_in_output=", p->include_stop_str_in_output);
    field_bool(&t, ", ignore_eos=", p->ignore_eos);
    field_int(&t, ", max_tokens=", p->max_tokens, p->max_tokens < 0);
    field_int(&t, ", min_tokens=", p->min_tokens, false);
    field_int(&t, ", logprobs=", p->logprobs, p->logprobs < 0);
    field_int(&t, ", prompt_logprobs=", p->prompt_logprobs, p->prompt_logprobs < 0);
    field_bool(&t, ", skip_special_tokens=", p->skip_special_tokens);
    field_bool(&t, ", spaces_between_special_tokens=", p->spaces_between_special_tokens);
    field_int(&t, ", truncate_prompt_tokens=", truncate, truncate == -2);
    puts_(&t, ", structured_outputs=");
    structured(&t, constraint);
    puts_(&t, ", extra_args=None)");
    return t.s;
}

void cv_log_request_received(const char *id, const char *params_repr, const char *lora) {
    text t = {0};
    if (lora) {
        puts_(&t, "LoRARequest(lora_name=");
        py_str(&t, lora, strlen(lora));
        puts_(&t, ")");
    }
    cv_info("logger", "Received request %s: params: %s, lora_request: %s.", id, params_repr, lora ? t.s : "None");
    free(t.s);
}

/* The first `limit` characters (code points) of UTF-8 text: their byte length. */
static size_t utf8_prefix(const char *s, size_t len, int64_t limit) {
    size_t i = 0;
    for (int64_t k = 0; i < len && k < limit; k++)
        do i++;
        while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

void cv_log_response_generated(const char *id, const char *text_, size_t len, const int32_t *ids, size_t n_ids,
                               const char *finish_reason, int64_t max_log_len) {
    text t = {0};
    if (max_log_len >= 0) {
        len = utf8_prefix(text_, len, max_log_len);
        if ((int64_t)n_ids > max_log_len) n_ids = (size_t)max_log_len;
    }
    py_str(&t, text_, len);
    puts_(&t, ", output_token_ids: ");
    py_ints(&t, ids, n_ids);
    cv_info("logger", "Generated response %s: output: %s, finish_reason: %s", id, t.s,
            finish_reason ? finish_reason : "None");
    free(t.s);
}
