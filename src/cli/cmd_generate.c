/*
 * cmd_generate.c — `cvllm generate MODEL`: offline batch inference through the public API.
 *
 * All prompts are submitted at once and the engine is stepped until every request finished, so they
 * are batched exactly as the server would batch them. Output is either readable text or one JSON
 * object per prompt (a line each) shaped like vLLM's RequestOutput.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/prompts_file.h"
#include "cvllm.h"

typedef struct prompt_list {
    cvllm_prompt *items;
    char **owned;                  /* strings and id arrays to free */
    size_t n, n_owned, cap;
} prompt_list;

typedef struct generate_args {
    cvllm_engine_options engine;
    cvllm_sampling_params sampling; /* fields set on the command line, applied over the defaults */
    bool set_temperature, set_top_p, set_top_k, set_max_tokens, set_min_p, set_repetition_penalty;
    bool json_output;
    prompt_list prompts;
    const char **stops;
    size_t n_stops;
    int32_t *stop_token_ids;
    size_t n_stop_token_ids;
    int32_t *bias_ids;
    float *bias_values;
    size_t n_bias;
} generate_args;

static const char usage[] =
    "usage: cvllm generate MODEL [--prompt TEXT]... [--prompts-file FILE] [--prompt-token-ids 1,2,3]...\n"
    "                      [sampling options] [engine options] [--output text|json]\n"
    "sampling options (vLLM's SamplingParams):\n"
    "  --temperature F --top-p F --top-k N --min-p F --repetition-penalty F --presence-penalty F\n"
    "  --frequency-penalty F --max-tokens N (16) --min-tokens N --n N --ignore-eos --stop STR (repeatable)\n"
    "  --stop-token-ids 1,2 --logprobs N --prompt-logprobs N --logit-bias '{\"id\": bias}'\n"
    "  --include-stop-str-in-output --skip-special-tokens / --no-skip-special-tokens\n"
    "Defaults for temperature/top-k/top-p/min-p/repetition-penalty come from the model's\n"
    "generation_config.json (see --generation-config), as in vLLM.\n";

static void own(prompt_list *l, void *p) {
    l->owned = cv_xrealloc(l->owned, (l->n_owned + 1) * sizeof *l->owned);
    l->owned[l->n_owned++] = p;
}

static void add_prompt(prompt_list *l, cvllm_prompt p) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 8;
        l->items = cv_xrealloc(l->items, l->cap * sizeof *l->items);
    }
    l->items[l->n++] = p;
}

static void free_prompts(prompt_list *l) {
    for (size_t i = 0; i < l->n_owned; i++) free(l->owned[i]);
    free(l->owned);
    free(l->items);
}

/* "1,2,3" → ids; every id must be a non-negative integer. */
static bool parse_id_list(cv_args *a, const char *flag, const char *s, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!s) return false;
    char *copy = cv_xstrdup(s), *save = NULL;
    bool ok = true;
    for (char *tok = strtok_r(copy, ", ", &save); tok && ok; tok = strtok_r(NULL, ", ", &save)) {
        int64_t v;
        ok = cv_args_int(a, flag, tok, 0, INT32_MAX, &v);
        if (ok) {
            *ids = cv_xrealloc(*ids, (*n + 1) * sizeof **ids);
            (*ids)[(*n)++] = (int32_t)v;
        }
    }
    free(copy);
    if (ok && *n == 0) ok = !cv_args_error(a, "%s needs at least one token id", flag);
    if (!ok) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return ok;
}

/* The prompts of a prompts file (cli/prompts_file.h), owned by the list. */
static bool read_prompts_file(cv_args *a, const char *path, prompt_list *l) {
    char **texts;
    size_t n;
    if (cv_read_prompts_file(path, &texts, &n)) return !cv_args_error(a, "--prompts-file: %s", cv_error_message());
    for (size_t i = 0; i < n; i++) {
        own(l, texts[i]);
        add_prompt(l, (cvllm_prompt){.text = texts[i], .text_len = strlen(texts[i])});
    }
    free(texts);
    return true;
}

static bool parse_logit_bias(cv_args *a, const char *s, generate_args *g) {
    json_error_t err;
    json_t *j = s ? json_loads(s, 0, &err) : NULL;
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return !cv_args_error(a, "--logit-bias expects a JSON object {\"token_id\": bias}");
    }
    const char *key;
    json_t *val;
    bool ok = true;
    json_object_foreach(j, key, val) {
        int64_t id;
        if (!cv_args_int(a, "--logit-bias", key, 0, INT32_MAX, &id) || !json_is_number(val)) {
            ok = a->failed || !cv_args_error(a, "--logit-bias values must be numbers");
            ok = false;
            break;
        }
        g->bias_ids = cv_xrealloc(g->bias_ids, (g->n_bias + 1) * sizeof *g->bias_ids);
        g->bias_values = cv_xrealloc(g->bias_values, (g->n_bias + 1) * sizeof *g->bias_values);
        g->bias_ids[g->n_bias] = (int32_t)id;
        g->bias_values[g->n_bias++] = (float)json_number_value(val);
    }
    json_decref(j);
    return ok;
}

static bool float_flag(cv_args *a, const char *name, double min, double max, float *out, bool *set) {
    const char *v;
    double d;
    if (!cv_args_value(a, name, &v)) return false;
    if (cv_args_float(a, name, v, min, max, &d)) {
        *out = (float)d;
        if (set) *set = true;
    }
    return true;
}

static bool int_flag(cv_args *a, const char *name, int64_t min, int64_t max, int32_t *out, bool *set) {
    const char *v;
    int64_t n;
    if (!cv_args_value(a, name, &v)) return false;
    if (cv_args_int(a, name, v, min, max, &n)) {
        *out = (int32_t)n;
        if (set) *set = true;
    }
    return true;
}

/* Sampling flags: the range checks that matter are the engine's (vLLM's messages); here only what
 * is needed to parse. */
static bool sampling_flag(cv_args *a, generate_args *g) {
    cvllm_sampling_params *p = &g->sampling;
    const char *v;
    if (float_flag(a, "--temperature", -1e30, 1e30, &p->temperature, &g->set_temperature)) return true;
    if (float_flag(a, "--top-p", -1e30, 1e30, &p->top_p, &g->set_top_p)) return true;
    if (int_flag(a, "--top-k", INT32_MIN, INT32_MAX, &p->top_k, &g->set_top_k)) return true;
    if (float_flag(a, "--min-p", -1e30, 1e30, &p->min_p, &g->set_min_p)) return true;
    if (float_flag(a, "--repetition-penalty", -1e30, 1e30, &p->repetition_penalty, &g->set_repetition_penalty)) return true;
    if (float_flag(a, "--presence-penalty", -1e30, 1e30, &p->presence_penalty, NULL)) return true;
    if (float_flag(a, "--frequency-penalty", -1e30, 1e30, &p->frequency_penalty, NULL)) return true;
    if (int_flag(a, "--max-tokens", INT32_MIN, INT32_MAX, &p->max_tokens, &g->set_max_tokens)) return true;
    if (int_flag(a, "--min-tokens", INT32_MIN, INT32_MAX, &p->min_tokens, NULL)) return true;
    if (int_flag(a, "--n", INT32_MIN, 1 << 16, &p->n, NULL)) return true;
    if (int_flag(a, "--logprobs", INT32_MIN, INT32_MAX, &p->logprobs, NULL)) return true;
    if (int_flag(a, "--prompt-logprobs", INT32_MIN, INT32_MAX, &p->prompt_logprobs, NULL)) return true;
    if (cv_args_flag(a, "--ignore-eos")) return p->ignore_eos = true;
    if (cv_args_flag(a, "--include-stop-str-in-output")) return p->include_stop_str_in_output = true;
    if (cv_args_flag(a, "--skip-special-tokens")) return p->skip_special_tokens = true;
    if (cv_args_flag(a, "--no-skip-special-tokens")) return !(p->skip_special_tokens = false);
    if (cv_args_value(a, "--stop", &v)) {
        g->stops = cv_xrealloc(g->stops, (g->n_stops + 1) * sizeof *g->stops);
        g->stops[g->n_stops++] = v;
        return true;
    }
    if (cv_args_value(a, "--stop-token-ids", &v)) {
        free(g->stop_token_ids);
        parse_id_list(a, "--stop-token-ids", v, &g->stop_token_ids, &g->n_stop_token_ids);
        return true;
    }
    if (cv_args_value(a, "--logit-bias", &v)) {
        parse_logit_bias(a, v, g);
        return true;
    }
    return false;
}

static bool prompt_flag(cv_args *a, generate_args *g) {
    const char *v;
    if (cv_args_value(a, "--prompt", &v)) {
        if (v) add_prompt(&g->prompts, (cvllm_prompt){.text = v, .text_len = strlen(v)});
        return true;
    }
    if (cv_args_value(a, "--prompts-file", &v)) {
        if (v) read_prompts_file(a, v, &g->prompts);
        return true;
    }
    if (cv_args_value(a, "--prompt-token-ids", &v)) {
        int32_t *ids;
        size_t n;
        if (parse_id_list(a, "--prompt-token-ids", v, &ids, &n)) {
            own(&g->prompts, ids);
            add_prompt(&g->prompts, (cvllm_prompt){.token_ids = ids, .n_token_ids = n});
        }
        return true;
    }
    return false;
}

static int parse_generate_args(cv_args *a, generate_args *g) {
    cvllm_engine_options_default(&g->engine);
    g->sampling.n = 1;
    g->sampling.logprobs = g->sampling.prompt_logprobs = -1;
    g->sampling.skip_special_tokens = true;
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i], *v;
        if (cv_args_flag(a, "--help|-h")) {
            fputs(usage, stdout);
            fputs(cv_args_engine_help, stdout);
            return -1;
        }
        if (prompt_flag(a, g) || sampling_flag(a, g) || cv_args_engine(a, &g->engine)) continue;
        if (cv_args_value(a, "--output", &v)) {
            if (v && strcmp(v, "text") && strcmp(v, "json")) return cv_args_error(a, "--output must be text or json, got '%s'", v);
            g->json_output = v && !strcmp(v, "json");
        } else if (arg[0] == '-' && arg[1]) {
            if (!cv_args_unknown(a)) return 2;
        } else if (!g->engine.model) {
            g->engine.model = arg;
            a->i++;
        } else {
            return cv_args_error(a, "unexpected argument '%s'", arg);
        }
    }
    if (a->failed) return 2;
    if (!g->engine.model) return cv_args_error(a, "no MODEL given (see cvllm generate --help)");
    if (g->prompts.n == 0) return cv_args_error(a, "no prompt given: use --prompt, --prompts-file or --prompt-token-ids");
    return 0;
}

/* Command-line sampling values go over the engine's defaults (which include generation_config). */
static cvllm_sampling_params request_params(const cvllm_engine *e, const generate_args *g) {
    cvllm_sampling_params p, c = g->sampling;
    cvllm_sampling_params_default(e, &p);
    if (g->set_temperature) p.temperature = c.temperature;
    if (g->set_top_p) p.top_p = c.top_p;
    if (g->set_top_k) p.top_k = c.top_k;
    if (g->set_min_p) p.min_p = c.min_p;
    if (g->set_repetition_penalty) p.repetition_penalty = c.repetition_penalty;
    if (g->set_max_tokens) p.max_tokens = c.max_tokens;
    p.presence_penalty = c.presence_penalty;
    p.frequency_penalty = c.frequency_penalty;
    p.min_tokens = c.min_tokens;
    p.n = c.n;
    p.ignore_eos = c.ignore_eos;
    p.include_stop_str_in_output = c.include_stop_str_in_output;
    p.skip_special_tokens = c.skip_special_tokens;
    p.logprobs = c.logprobs;
    p.prompt_logprobs = c.prompt_logprobs;
    p.stop = g->stops;
    p.n_stop = g->n_stops;
    p.stop_token_ids = g->stop_token_ids;
    p.n_stop_token_ids = g->n_stop_token_ids;
    p.logit_bias_ids = g->bias_ids;
    p.logit_bias_values = g->bias_values;
    p.n_logit_bias = g->n_bias;
    return p;
}

/* {"<id>": logprob, ...}: the top entries plus the chosen token, as vLLM reports them. */
static json_t *position_json(const cvllm_position_logprobs *lp) {
    json_t *o = json_object();
    char key[16];
    for (int32_t k = 0; k < lp->n_top; k++) {
        snprintf(key, sizeof key, "%d", lp->top[k].token_id);
        json_object_set_new(o, key, json_real(lp->top[k].logprob));
    }
    snprintf(key, sizeof key, "%d", lp->chosen.token_id);
    json_object_set_new(o, key, json_real(lp->chosen.logprob));
    return o;
}

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *completion_json(const cvllm_completion_output *c) {
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(c->index));
    json_object_set_new(o, "token_ids", ids_json(c->token_ids, c->n_token_ids));
    json_object_set_new(o, "text", json_stringn(c->text, c->text_len));
    if (c->logprobs) {
        json_t *lps = json_array();
        for (size_t t = 0; t < c->n_token_ids; t++) json_array_append_new(lps, position_json(&c->logprobs[t]));
        json_object_set_new(o, "logprobs", lps);
    } else {
        json_object_set_new(o, "logprobs", json_null());
    }
    const char *reason = cvllm_finish_reason_name(c->finish_reason);
    json_object_set_new(o, "finish_reason", reason ? json_string(reason) : json_null());
    if (c->stop_str) json_object_set_new(o, "stop_reason", json_string(c->stop_str));
    else if (c->stop_token_id >= 0) json_object_set_new(o, "stop_reason", json_integer(c->stop_token_id));
    else json_object_set_new(o, "stop_reason", json_null());
    return o;
}

static char *render_json(const cvllm_request_output *r) {
    json_t *o = json_object();
    json_object_set_new(o, "prompt_token_ids", ids_json(r->prompt_token_ids, r->n_prompt_token_ids));
    if (r->prompt_logprobs) {
        json_t *lps = json_array();
        json_array_append_new(lps, json_null());
        for (size_t t = 1; t < r->n_prompt_token_ids; t++) json_array_append_new(lps, position_json(&r->prompt_logprobs[t]));
        json_object_set_new(o, "prompt_logprobs", lps);
    } else {
        json_object_set_new(o, "prompt_logprobs", json_null());
    }
    json_t *outs = json_array();
    for (int32_t i = 0; i < r->n_outputs; i++) json_array_append_new(outs, completion_json(&r->outputs[i]));
    json_object_set_new(o, "outputs", outs);
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    char *line = cv_xasprintf("%s\n", s);
    free(s);
    return line;
}

/* Strings are shown JSON-quoted so that whitespace and control characters stay visible. */
static char *quoted(json_t *j) {
    char *s = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    return s;
}

static char *render_text(const cvllm_request_output *r, const cvllm_prompt *prompt) {
    char *ps = quoted(prompt->text ? json_stringn(prompt->text, prompt->text_len)
                                   : ids_json(prompt->token_ids, prompt->n_token_ids));
    char *out = cv_xasprintf("Prompt: %s\n", ps);
    free(ps);
    for (int32_t i = 0; i < r->n_outputs; i++) {
        char *ts = quoted(json_stringn(r->outputs[i].text, r->outputs[i].text_len));
        char *label = r->n_outputs > 1 ? cv_xasprintf("Generated text [%d]", i) : cv_xstrdup("Generated text");
        char *more = cv_xasprintf("%s%s: %s\n", out, label, ts);
        free(out);
        free(label);
        free(ts);
        out = more;
    }
    return out;
}

/* Steps the engine until all requests finish. Results are rendered when their request finishes (the
 * engine's outputs do not outlive the next step) and printed in prompt order, as vLLM returns them. */
static int run_requests(cvllm_engine *e, const generate_args *g, const uint64_t *ids) {
    size_t n = g->prompts.n, next = 0;
    char **rendered = cv_xcalloc(n, sizeof *rendered);
    int rc = 0;
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n_outs;
        if ((rc = cvllm_engine_step(e, &outs, &n_outs))) break;
        for (size_t k = 0; k < n_outs; k++) {
            if (!outs[k]->finished) continue;
            size_t i = 0;
            while (ids[i] != outs[k]->request_id) i++;
            rendered[i] = g->json_output ? render_json(outs[k]) : render_text(outs[k], &g->prompts.items[i]);
        }
        for (; next < n && rendered[next]; next++) fputs(rendered[next], stdout);
        fflush(stdout);
    }
    for (size_t i = 0; i < n; i++) free(rendered[i]);
    free(rendered);
    return rc;
}

static void free_generate_args(generate_args *g) {
    free_prompts(&g->prompts);
    free(g->stops);
    free(g->stop_token_ids);
    free(g->bias_ids);
    free(g->bias_values);
}

int cmd_generate(int argc, char **argv) {
    generate_args g = {0};
    cv_args a;
    int status = cv_args_init(&a, "generate", argc, argv);
    if (status == 0) status = parse_generate_args(&a, &g);
    cvllm_engine *e = NULL;
    uint64_t *ids = NULL;
    if (status || !(e = cv_launch_engine(&a, &g.engine, &status))) goto out;
    if (cvllm_engine_is_pooling(e)) { /* an embedding model (runner pooling, or auto on its folder) */
        fprintf(stderr, "cvllm generate: %s runs on the pooling runner, which generates nothing; serve it and ask "
                        "/v1/embeddings, or pass --runner generate\n", g.engine.model);
        status = 1;
        goto out;
    }
    cvllm_sampling_params params = request_params(e, &g);
    ids = cv_xcalloc(g.prompts.n, sizeof *ids);
    for (size_t i = 0; i < g.prompts.n; i++) {
        if (cvllm_engine_add_request(e, &g.prompts.items[i], &params, &ids[i])) {
            fprintf(stderr, "cvllm generate: prompt %zu: %s\n", i + 1, cvllm_last_error());
            status = 1;
            goto out;
        }
    }
    if (run_requests(e, &g, ids)) {
        fprintf(stderr, "cvllm generate: %s\n", cvllm_last_error());
        status = 1;
    }
out:
    free(ids);
    cvllm_engine_destroy(e);
    free_generate_args(&g);
    cv_args_free(&a);
    return status < 0 ? 0 : status;
}
