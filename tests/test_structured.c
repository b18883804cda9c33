/*
 * test_structured.c — structured outputs end to end through the C API: every completed output of a
 * corpus of constraints (tests/data/structured/corpus.json: JSON schemas, json_object, regexes,
 * choices, grammars) is valid by an independent validator (tests/tools/check_structured.py: ajv for
 * JSON Schema, Python's re for regexes).
 *
 * The model has random weights and Qwen3's real vocabulary: it spreads its probability over the whole
 * vocabulary, so sampling at temperature 1 tries tokens a trained model would rarely pick — the
 * hardest case for a mask. Each constraint runs with n = 2 at two seeds, greedily, and again on an
 * engine with n-gram speculative decoding (a draft the grammar refuses must be rejected). Around it:
 * the compile cache, invalid constraints, the constraint starting after a reasoning section, and a
 * request whose own allowed_token_ids leave the grammar nothing.
 */
#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "check.h"
#include "cvllm.h"
#include "engine_drain.h"
#include "testutil.h"

#define MAX_TOKENS 384
#define MAX_CASES 64

static char *model_dir;

/* A tiny Qwen3 with the full 151,936-row vocabulary, random weights and the real tokenizer. */
static char *make_model_dir(void) {
    char *dir = tu_make_temp_dir();
    char *src = tu_strdupf("%s/vectors/%s/config.json", CVLLM_TEST_DATA, "qwen3-dense-f32");
    json_t *cfg = json_load_file(src, 0, NULL);
    CHECK(cfg != NULL);
    json_object_set_new(cfg, "vocab_size", json_integer(151936));
    char *text = json_dumps(cfg, 0);
    tu_write_file(dir, "config.json", text, strlen(text));
    free(text);
    json_decref(cfg);
    free(src);
    src = tu_strdupf("%s/vectors/%s/generation_config.json", CVLLM_TEST_DATA, "qwen3-dense-f32");
    tu_link(src, dir, "generation_config.json");
    free(src);
    static const char *tok[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < 2; i++) {
        char *t = tu_strdupf("%s/models/qwen3-tokenizer/%s", CVLLM_SOURCE_DIR, tok[i]);
        tu_link(t, dir, tok[i]);
        free(t);
    }
    return dir;
}

static cvllm_engine *make_engine(const char *spec) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = model_dir;
    o.load_format = "dummy";
    o.dtype = "float32";
    o.kv_cache_memory_bytes = 64 << 20;
    o.max_model_len = 1024;
    o.num_threads = 2;
    o.speculative_config = spec;
    o.seed = 7;
    cvllm_engine *e = NULL;
    int rc = cvllm_engine_create(&o, &e);
    CHECK_MSG(rc == 0, "engine create: %s", cvllm_last_error());
    return e;
}

/* ---- the corpus --------------------------------------------------------------------------------- */

typedef struct test_case {
    const char *name;
    cvllm_constraint c;
    char *spec;                    /* owned text of c.spec */
    const char **choices;          /* owned array of c.choices (strings owned by the corpus) */
} test_case;

static int kind_of(const char *k) {
    if (!strcmp(k, "json")) return CVLLM_CONSTRAINT_JSON;
    if (!strcmp(k, "json_object")) return CVLLM_CONSTRAINT_JSON_OBJECT;
    if (!strcmp(k, "regex")) return CVLLM_CONSTRAINT_REGEX;
    if (!strcmp(k, "choice")) return CVLLM_CONSTRAINT_CHOICE;
    if (!strcmp(k, "grammar")) return CVLLM_CONSTRAINT_GRAMMAR;
    if (!strcmp(k, "structural_tag")) return CVLLM_CONSTRAINT_STRUCTURAL_TAG;
    return 0;
}

static size_t load_corpus(json_t *corpus, test_case *cases) {
    json_t *arr = json_object_get(corpus, "cases"), *v;
    size_t i;
    json_array_foreach(arr, i, v) {
        assert(i < MAX_CASES);
        test_case *t = &cases[i];
        memset(t, 0, sizeof *t);
        t->name = json_string_value(json_object_get(v, "name"));
        t->c.kind = kind_of(json_string_value(json_object_get(v, "kind")));
        json_t *schema = json_object_get(v, "schema"), *spec = json_object_get(v, "spec"), *ch = json_object_get(v, "choices");
        if (schema) t->spec = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (spec) t->spec = strdup(json_string_value(spec));
        t->c.spec = t->spec;
        t->c.disable_any_whitespace = json_is_true(json_object_get(v, "compact"));
        t->c.whitespace_pattern = json_string_value(json_object_get(v, "whitespace_pattern"));
        if (ch) {
            t->choices = calloc(json_array_size(ch), sizeof *t->choices);
            for (size_t k = 0; k < json_array_size(ch); k++) t->choices[k] = json_string_value(json_array_get(ch, k));
            t->c.choices = t->choices;
            t->c.n_choices = json_array_size(ch);
        }
    }
    return json_array_size(arr);
}

/* ---- running it ------------------------------------------------------------------------------- */

typedef struct run_state {
    uint64_t ids[512];
    int case_of[512];
    size_t n_requests;
    json_t *outputs;               /* [{case, text}] of completed outputs */
    const test_case *cases;
    size_t completed, cut, errors;
    const int32_t *eos;
    size_t n_eos;
} run_state;

static void on_output(void *ctx, const cvllm_request_output *out) {
    run_state *rs = ctx;
    if (!out->finished) return;
    int c = -1;
    for (size_t i = 0; i < rs->n_requests; i++)
        if (rs->ids[i] == out->request_id) c = rs->case_of[i];
    CHECK(c >= 0);
    if (c < 0) return;
    for (int32_t k = 0; k < out->n_outputs; k++) {
        const cvllm_completion_output *o = &out->outputs[k];
        if (o->finish_reason == CVLLM_FINISH_LENGTH) {
            rs->cut++;
            continue;
        }
        CHECK_MSG(o->finish_reason == CVLLM_FINISH_STOP, "%s: finish %s", rs->cases[c].name,
                  cvllm_finish_reason_name(o->finish_reason));
        if (o->finish_reason != CVLLM_FINISH_STOP) {
            rs->errors++;
            continue;
        }
        /* a constrained output ends with an eos the grammar allowed (Qwen3's <|im_end|> or <|endoftext|>) */
        int32_t last = o->n_token_ids ? o->token_ids[o->n_token_ids - 1] : -1;
        CHECK_MSG(last == 151645 || last == 151643, "%s: last token %d", rs->cases[c].name, last);
        rs->completed++;
        json_array_append_new(rs->outputs,
                              json_pack("{s:s, s:s%}", "case", rs->cases[c].name, "text", o->text, o->text_len));
    }
}

static void submit(cvllm_engine *e, run_state *rs, int c, cvllm_grammar *g, int32_t n, float temperature, int64_t seed) {
    static const char prompt[] = "Example: {\"name\": \"Ann\", \"age\": 31, \"tags\": [\"a\", \"b\"]} and "
                                 "{\"name\": \"Ann\", \"age\": 31, \"tags\": [\"a\", \"b\"]}. Now yours:";
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    p.n = n;
    p.temperature = temperature;
    p.max_tokens = MAX_TOKENS;
    p.has_seed = true;
    p.seed = seed;
    p.grammar = g;
    cvllm_prompt pr = {.text = prompt};
    int rc = cvllm_engine_add_request(e, &pr, &p, &rs->ids[rs->n_requests]);
    CHECK_MSG(rc == 0, "add_request: %s", cvllm_last_error());
    rs->case_of[rs->n_requests++] = c;
}

/* Runs every case on `e` and checks the completed outputs with the validators. */
static void run_corpus(cvllm_engine *e, json_t *corpus, const test_case *cases, size_t n_cases, const char *label) {
    run_state rs = {.outputs = json_array(), .cases = cases};
    cvllm_grammar *grammars[MAX_CASES] = {0};
    for (size_t c = 0; c < n_cases; c++) {
        int rc = cvllm_grammar_compile(e, &cases[c].c, &grammars[c]);
        CHECK_MSG(rc == 0, "%s: compile: %s", cases[c].name, cvllm_last_error());
        if (rc) continue;
        submit(e, &rs, (int)c, grammars[c], 2, 1.0f, 1000 + (int64_t)c);
        submit(e, &rs, (int)c, grammars[c], 2, 1.0f, 2000 + (int64_t)c);
        submit(e, &rs, (int)c, grammars[c], 1, 0.0f, 0);
    }
    /* the requests hold their own references from here on */
    for (size_t c = 0; c < n_cases; c++) cvllm_grammar_release(grammars[c]);
    tu_engine_drain(e, on_output, &rs);
    printf("%s: %zu completed outputs, %zu cut at max_tokens, %zu errors\n", label, rs.completed, rs.cut, rs.errors);
    /* every case completes at least once, so none passes by never finishing */
    for (size_t c = 0; c < n_cases; c++) {
        size_t k, seen = 0;
        json_t *o;
        json_array_foreach(rs.outputs, k, o) seen += !strcmp(json_string_value(json_object_get(o, "case")), cases[c].name);
        CHECK_MSG(seen > 0, "%s: %s never completed", label, cases[c].name);
    }

    char *tmp = tu_make_temp_dir();
    json_t *doc = json_pack("{s:O, s:O}", "cases", json_object_get(corpus, "cases"), "outputs", rs.outputs);
    char *path = tu_strdupf("%s/%s", tmp, "outputs.json");
    CHECK(json_dump_file(doc, path, 0) == 0);
    char *cmd = tu_strdupf("python3 %s/tests/tools/check_structured.py %s", CVLLM_SOURCE_DIR, path);
    int st = system(cmd);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: invalid outputs (see above), exit %d", label,
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    free(cmd);
    free(path);
    json_decref(doc);
    json_decref(rs.outputs);
    tu_remove_tree(tmp);
    free(tmp);
}

/* ---- around it ---------------------------------------------------------------------------------- */

static void test_cache_and_errors(cvllm_engine *e) {
    cvllm_constraint c = {.kind = CVLLM_CONSTRAINT_REGEX, .spec = "[0-9]+"};
    cvllm_grammar *a = NULL, *b = NULL;
    CHECK(cvllm_grammar_compile(e, &c, &a) == CVLLM_OK);
    CHECK(cvllm_grammar_compile(e, &c, &b) == CVLLM_OK);
    CHECK(a != NULL && a == b); /* the same constraint compiles once */
    cvllm_grammar_release(a);
    cvllm_grammar_release(b);

    static const struct { int kind; const char *spec; const char *says; } bad[] = {
        {CVLLM_CONSTRAINT_JSON, "{\"type\": \"object\",", "JSON schema"},
        {CVLLM_CONSTRAINT_JSON, "{\"type\": \"strin\"}", "strin"},
        {CVLLM_CONSTRAINT_REGEX, "(?<=a)b", "regex"},
        {CVLLM_CONSTRAINT_REGEX, "(ab", "regex"},
        {CVLLM_CONSTRAINT_GRAMMAR, "root ::= value", "value"},
        {CVLLM_CONSTRAINT_GRAMMAR, "root ::= \"a", "grammar"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cvllm_constraint x = {.kind = bad[i].kind, .spec = bad[i].spec};
        cvllm_grammar *g = (cvllm_grammar *)1;
        int rc = cvllm_grammar_compile(e, &x, &g);
        CHECK_MSG(rc == CVLLM_ERR_INVALID_ARGUMENT && g == NULL, "%s compiled", bad[i].spec);
        CHECK_MSG(strstr(cvllm_last_error(), bad[i].says) != NULL, "%s: message '%s'", bad[i].spec, cvllm_last_error());
    }
    /* the two converters without messages of their own still say why */
    cvllm_constraint ws = {.kind = CVLLM_CONSTRAINT_JSON_OBJECT, .whitespace_pattern = "[a ]*"};
    cvllm_grammar *w = NULL;
    CHECK(cvllm_grammar_compile(e, &ws, &w) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(cvllm_last_error(), "whitespace") != NULL, "message '%s'", cvllm_last_error());
    cvllm_constraint utf8 = {.kind = CVLLM_CONSTRAINT_CHOICE, .choices = (const char *[]){"ok", "\xff"}, .n_choices = 2};
    CHECK(cvllm_grammar_compile(e, &utf8, &w) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(cvllm_last_error(), "UTF-8") != NULL, "message '%s'", cvllm_last_error());
    cvllm_constraint none = {.kind = CVLLM_CONSTRAINT_CHOICE};
    cvllm_grammar *g = NULL;
    CHECK(cvllm_grammar_compile(e, &none, &g) == CVLLM_ERR_INVALID_ARGUMENT);
}

typedef struct one_output {
    char text[4096];
    cvllm_finish_reason finish;
} one_output;

static void keep_output(void *ctx, const cvllm_request_output *out) {
    one_output *o = ctx;
    if (!out->finished) return;
    snprintf(o->text, sizeof o->text, "%.*s", (int)out->outputs[0].text_len, out->outputs[0].text);
    o->finish = out->outputs[0].finish_reason;
}

/* With a reasoning section the constraint starts after </think>: a bias makes the model write it at
 * once, and what follows it must match. */
static void test_after_reasoning(cvllm_engine *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(cvllm_tokenize(cvllm_engine_tokenizer(e), "</think>", 8, &ids, &n) == CVLLM_OK && n == 1);
    cvllm_constraint c = {.kind = CVLLM_CONSTRAINT_REGEX, .spec = "\\d{3}-\\d{4}"};
    cvllm_grammar *g = NULL;
    CHECK(cvllm_grammar_compile(e, &c, &g) == CVLLM_OK);
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    p.max_tokens = 64;
    p.has_seed = true;
    p.seed = 3;
    p.grammar = g;
    p.grammar_after_token_id = ids[0];
    p.skip_special_tokens = false;
    float bias = 30.0f;
    p.logit_bias_ids = ids;
    p.logit_bias_values = &bias;
    p.n_logit_bias = 1;
    cvllm_prompt pr = {.text = "Think first."};
    CHECK(cvllm_engine_add_request(e, &pr, &p, NULL) == CVLLM_OK);
    cvllm_grammar_release(g);
    one_output o = {0};
    tu_engine_drain(e, keep_output, &o);
    CHECK_EQ_INT(o.finish, CVLLM_FINISH_STOP);
    CHECK_MSG(strncmp(o.text, "</think>", 8) == 0, "text '%s'", o.text);
    const char *rest = o.text + 8;
    CHECK_MSG(strlen(rest) == 8 && rest[3] == '-', "after </think>: '%s'", rest);
    cvllm_free(ids);
}

/* allowed_token_ids that the grammar refuses leave nothing: the sequence ends with an error, and the
 * token the sampler fell back on is not part of the output. */
static void test_empty_mask(cvllm_engine *e) {
    cvllm_constraint c = {.kind = CVLLM_CONSTRAINT_CHOICE, .choices = (const char *[]){"yes"}, .n_choices = 1};
    cvllm_grammar *g = NULL;
    CHECK(cvllm_grammar_compile(e, &c, &g) == CVLLM_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(cvllm_tokenize(cvllm_engine_tokenizer(e), "no", 2, &ids, &n) == CVLLM_OK);
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    p.max_tokens = 8;
    p.grammar = g;
    p.allowed_token_ids = ids;
    p.n_allowed_token_ids = n;
    cvllm_prompt pr = {.text = "Say yes."};
    CHECK(cvllm_engine_add_request(e, &pr, &p, NULL) == CVLLM_OK);
    cvllm_grammar_release(g);
    one_output o = {0};
    tu_engine_drain(e, keep_output, &o);
    CHECK_EQ_INT(o.finish, CVLLM_FINISH_ERROR);
    CHECK_MSG(o.text[0] == '\0', "the refused token reached the text: '%s'", o.text);
    cvllm_free(ids);
}

int main(void) {
    model_dir = make_model_dir();
    char *path = tu_strdupf("%s/%s", CVLLM_TEST_DATA, "structured/corpus.json");
    json_t *corpus = json_load_file(path, JSON_PRESERVE_ORDER, NULL);
    free(path);
    CHECK(corpus != NULL);
    static test_case cases[MAX_CASES];
    size_t n_cases = load_corpus(corpus, cases);

    cvllm_engine *e = make_engine(NULL);
    if (e) {
        test_cache_and_errors(e);
        run_corpus(e, corpus, cases, n_cases, "plain");
        test_after_reasoning(e);
        test_empty_mask(e);
        cvllm_engine_destroy(e);
    }
    e = make_engine("{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 3, "
                    "\"prompt_lookup_min\": 1}");
    if (e) {
        run_corpus(e, corpus, cases, n_cases, "ngram speculative decoding");
        cvllm_spec_decode_stats st;
        cvllm_engine_spec_decode_stats(e, &st);
        printf("ngram: %llu drafts, %llu of %llu draft tokens accepted\n", (unsigned long long)st.num_drafts,
               (unsigned long long)st.num_accepted_tokens, (unsigned long long)st.num_draft_tokens);
        CHECK(st.num_drafts > 0); /* the drafts were there to be verified against the grammar */
        cvllm_engine_destroy(e);
    }
    for (size_t c = 0; c < n_cases; c++) {
        free(cases[c].spec);
        free(cases[c].choices);
    }
    json_decref(corpus);
    tu_remove_tree(model_dir);
    free(model_dir);
    return cv_check_summary("test_structured");
}
