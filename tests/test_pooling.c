/*
 * test_pooling.c — the pooling runner (engine/pooler.h) through the C API, held to Hugging Face's
 * reference logits: a pooled vector h is the final-normed hidden state the reference's logits came
 * from, so W·h (W the lm_head, or embed_tokens when tied) must give the reference's logits at the
 * pooled position (LAST, CLS), or their mean over the prompt (MEAN: the head is linear). Also the
 * defaults a folder's sentence-transformers files set, an embedding checkpoint in the inner model's
 * layout (no "model.", no lm_head), matryoshka dimensions, and every refusal.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "cvllm.h"
#include "loader/safetensors.h"
#include "loader/safetensors_write.h"
#include "testutil.h"

#define TOLERANCE 1e-4

typedef struct engine_setup {
    const char *runner, *pooler_config, *hf_overrides, *convert;
    int32_t budget, max_model_len;
    bool prefix_caching;
} engine_setup;

/* The options of `s` over the test's small defaults. */
static cvllm_engine_options setup_options(const char *dir, const engine_setup *s) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.runner = s->runner;
    o.pooler_config = s->pooler_config;
    o.hf_overrides = s->hf_overrides;
    o.convert = s->convert;
    o.max_num_batched_tokens = s->budget ? s->budget : 256;
    o.max_model_len = s->max_model_len ? s->max_model_len : 256;
    o.kv_cache_memory_bytes = 8u << 20;
    o.max_num_seqs = 8; /* the hybrid model's recurrent state per sequence shares that budget */
    o.num_threads = 2;
    o.dtype = "float32";
    o.enable_prefix_caching = s->prefix_caching;
    return o;
}

static cvllm_engine *make_engine(const char *dir, const engine_setup *s) {
    cvllm_engine_options o = setup_options(dir, s);
    cvllm_engine *e = NULL;
    int rc = cvllm_engine_create(&o, &e);
    CHECK_MSG(rc == 0, "engine create (%s): %s", s->runner ? s->runner : "auto", cvllm_last_error());
    return e;
}

/* The reference prompts of a vector folder and their logits. */
typedef struct reference {
    int32_t ids[2][256];
    size_t n[2];
    float *logits[2]; /* [n][vocab] */
    size_t vocab;
} reference;

static void load_reference(const char *folder, reference *r) {
    static const char *cases[] = {"short", "long150"};
    for (int c = 0; c < 2; c++) {
        json_t *j = tu_load_ref(folder, cases[c]);
        json_t *prompt = json_object_get(j, "prompt");
        r->n[c] = json_array_size(prompt);
        for (size_t i = 0; i < r->n[c]; i++) r->ids[c][i] = (int32_t)json_integer_value(json_array_get(prompt, i));
        json_decref(j);
        char *file = tu_strdupf("ref.%s.logits.npy", cases[c], "");
        size_t rows;
        r->logits[c] = tu_load_ref_npy(folder, file, &rows, &r->vocab);
        free(file);
        CHECK_EQ_INT((int)rows, (int)r->n[c]);
    }
}

static void free_reference(reference *r) {
    for (int c = 0; c < 2; c++) free(r->logits[c]);
}

/* The output head of a vector folder as f32 [vocab][hidden]: lm_head.weight, else embed_tokens. */
static float *head_of(const char *folder, size_t *hidden) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, folder);
    cv_checkpoint *ck = NULL;
    CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
    const cv_tensor *t = cv_checkpoint_find(ck, "lm_head.weight");
    if (!t) t = cv_checkpoint_find(ck, "model.embed_tokens.weight");
    CHECK(t && t->dtype == CV_DTYPE_F32 && t->ndim == 2);
    *hidden = (size_t)t->shape[1];
    float *w = malloc(t->nbytes);
    memcpy(w, t->data, t->nbytes);
    cv_checkpoint_close(ck);
    free(dir);
    return w;
}

/* A temporary model folder with the config and tokenizer of a vector folder and its checkpoint
 * rewritten: each tensor under rename(name) (NULL: left out), then `extra` when given. */
static char *rewritten_folder(const char *folder, const char *(*rename)(const char *), const cv_tensor *extra) {
    char *src = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, folder);
    cv_checkpoint *ck = NULL;
    CHECK_EQ_INT(cv_checkpoint_open(src, &ck), 0);
    char *dir = tu_make_temp_dir();
    cv_st_writer *wr = cv_st_writer_create();
    for (size_t i = 0; ck && i < cv_checkpoint_count(ck); i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        const char *name = rename(t->name);
        if (name) cv_st_writer_add(wr, name, t->dtype, t->ndim, t->shape, t->data, NULL, NULL);
    }
    if (extra) cv_st_writer_add(wr, extra->name, extra->dtype, extra->ndim, extra->shape, extra->data, NULL, NULL);
    int shards = 0;
    CHECK_EQ_INT(cv_st_writer_write(wr, dir, "model", 1u << 30, &shards), 0);
    cv_st_writer_free(wr);
    cv_checkpoint_close(ck);
    char *cfg = tu_strdupf("%s/%s", src, "config.json");
    tu_link(cfg, dir, "config.json");
    tu_link_tokenizer(dir);
    free(cfg);
    free(src);
    return dir;
}

/* max|W·h − want| / max|want| */
static double head_error(const float *w, size_t vocab, size_t hidden, const float *h, const float *want) {
    double worst = 0, scale = 0;
    for (size_t v = 0; v < vocab; v++) {
        double dot = 0;
        for (size_t i = 0; i < hidden; i++) dot += (double)w[v * hidden + i] * h[i];
        worst = fmax(worst, fabs(dot - want[v]));
        scale = fmax(scale, fabs(want[v]));
    }
    return worst / scale;
}

typedef struct pooled {
    float v[2][1024];
    size_t n[2];
    int done;
} pooled;

/* Runs both reference prompts as pooling requests in one engine (batched, chunked by its budget). */
static void pool_both(cvllm_engine *e, const reference *r, const cvllm_pooling_params *params, pooled *out) {
    uint64_t ids[2];
    memset(out, 0, sizeof *out);
    for (int c = 0; c < 2; c++) {
        cvllm_prompt p = {.token_ids = r->ids[c], .n_token_ids = r->n[c]};
        CHECK_MSG(cvllm_engine_add_pooling_request(e, &p, params, &ids[c]) == CVLLM_OK, "%s", cvllm_last_error());
    }
    for (int steps = 0; cvllm_engine_has_unfinished(e) && steps < 1000; steps++) {
        const cvllm_request_output *const *outs;
        size_t n;
        CHECK_EQ_INT(cvllm_engine_step(e, &outs, &n), CVLLM_OK);
        for (size_t k = 0; k < n; k++) {
            const cvllm_request_output *o = outs[k];
            int c = o->request_id == ids[0] ? 0 : 1;
            CHECK_EQ_INT(o->n_outputs, 1);
            CHECK_EQ_INT((int)o->outputs[0].n_token_ids, 0);
            if (!o->finished) {
                CHECK(o->embedding == NULL);
                continue;
            }
            CHECK_EQ_INT(o->outputs[0].finish_reason, CVLLM_FINISH_STOP);
            CHECK(o->embedding != NULL && o->n_embedding <= 1024);
            if (!o->embedding) continue;
            memcpy(out->v[c], o->embedding, o->n_embedding * sizeof(float));
            out->n[c] = o->n_embedding;
            out->done++;
        }
    }
    CHECK_EQ_INT(out->done, 2);
}

static double norm2(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return sqrt(s);
}

/* LAST, CLS and MEAN against the reference, unnormalized and in one-shot, chunked and batched steps;
 * then the default (normalized) vector is the unnormalized one scaled to length 1. */
static void test_pooling_types(const char *folder) {
    char *dir = tu_model_dir(folder);
    reference r;
    load_reference(folder, &r);
    size_t hidden;
    float *w = head_of(folder, &hidden);
    cvllm_pooling_params raw;
    cvllm_pooling_params_default(&raw);
    raw.normalize = 0;
    static const struct {
        const char *config;
        int32_t budget;
    } runs[] = {
        {NULL, 256},                            /* LAST, both prompts in one step */
        {NULL, 24},                             /* LAST, chunked over many steps */
        {"{\"pooling_type\": \"CLS\"}", 40},
        {"{\"seq_pooling_type\": \"MEAN\"}", 24},
    };
    pooled last = {0};
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        cvllm_engine *e = make_engine(dir, &(engine_setup){.runner = "pooling", .pooler_config = runs[k].config,
                                                            .budget = runs[k].budget, .prefix_caching = true});
        if (!e) continue;
        CHECK(cvllm_engine_is_pooling(e));
        CHECK_EQ_INT(cvllm_engine_embedding_size(e), (int)hidden);
        pooled p;
        pool_both(e, &r, &raw, &p);
        for (int c = 0; c < 2 && p.done == 2; c++) {
            CHECK_EQ_INT((int)p.n[c], (int)hidden);
            float *want = malloc(r.vocab * sizeof *want);
            const bool mean = runs[k].config && strstr(runs[k].config, "MEAN");
            const size_t row = runs[k].config && strstr(runs[k].config, "CLS") ? 0 : r.n[c] - 1;
            for (size_t v = 0; v < r.vocab; v++) {
                double s = 0;
                if (mean)
                    for (size_t t = 0; t < r.n[c]; t++) s += r.logits[c][t * r.vocab + v];
                want[v] = mean ? (float)(s / (double)r.n[c]) : r.logits[c][row * r.vocab + v];
            }
            double err = head_error(w, r.vocab, hidden, p.v[c], want);
            CHECK_MSG(err <= TOLERANCE, "%s %s run %zu prompt %d: head(pooled) vs reference %.3g", folder,
                      runs[k].config ? runs[k].config : "LAST", k, c, err);
            free(want);
        }
        if (k == 0) last = p;
        if (k == 0) { /* the engine's default: normalized */
            pooled unit;
            cvllm_pooling_params def;
            cvllm_pooling_params_default(&def);
            pool_both(e, &r, &def, &unit);
            for (int c = 0; c < 2 && unit.done == 2; c++) {
                CHECK(fabs(norm2(unit.v[c], hidden) - 1) < 1e-5);
                double len = norm2(last.v[c], hidden), worst = 0;
                for (size_t i = 0; i < hidden; i++) worst = fmax(worst, fabs(unit.v[c][i] - last.v[c][i] / len));
                CHECK_MSG(worst < 1e-6, "normalized vector differs from h/|h| by %.3g", worst);
            }
        }
        cvllm_engine_destroy(e);
    }
    free(w);
    free_reference(&r);
    tu_remove_tree(dir);
    free(dir);
}

/* A folder as sentence-transformers and Qwen3-Embedding lay it out: the inner model's tensors (no
 * "model." prefix) and no lm_head, modules.json with Pooling (last token) and Normalize. With
 * runner auto it pools, normalized, and gives the tied reference's vector. */
/* The inner model's name of a tensor: without "model." (every one of the tied folder has it). */
static const char *inner_name(const char *name) {
    CHECK(!strncmp(name, "model.", 6));
    return name + 6;
}

static void test_embedding_folder(void) {
    const char *folder = "qwen3-dense-tied-f32";
    char *dir = rewritten_folder(folder, inner_name, NULL);
    tu_write_sentence_transformers(dir, "lasttoken");

    reference r;
    load_reference(folder, &r);
    size_t hidden;
    float *w = head_of(folder, &hidden);
    cvllm_engine *e = make_engine(dir, &(engine_setup){.budget = 64, .prefix_caching = true});
    if (e) {
        CHECK(cvllm_engine_is_pooling(e));
        cvllm_pooling_params def;
        cvllm_pooling_params_default(&def);
        pooled p;
        pool_both(e, &r, &def, &p);
        for (int c = 0; c < 2 && p.done == 2; c++) {
            CHECK(fabs(norm2(p.v[c], hidden) - 1) < 1e-5);
            /* W·(h/|h|) is the reference row scaled by 1/|h|: compare directions */
            float *want = r.logits[c] + (r.n[c] - 1) * r.vocab;
            double dot = 0, n_want = 0, n_got = 0;
            float *got = malloc(r.vocab * sizeof *got);
            for (size_t v = 0; v < r.vocab; v++) {
                double s = 0;
                for (size_t i = 0; i < hidden; i++) s += (double)w[v * hidden + i] * p.v[c][i];
                got[v] = (float)s;
                dot += s * want[v], n_want += (double)want[v] * want[v], n_got += s * s;
            }
            CHECK_MSG(1 - dot / sqrt(n_want * n_got) < 1e-8, "embedding folder: cosine to the reference row %.10f",
                      dot / sqrt(n_want * n_got));
            free(got);
        }
        /* the same prompt again is a prefix-cache hit: the vector must not change */
        pooled again;
        pool_both(e, &r, &def, &again);
        for (int c = 0; c < 2 && again.done == 2; c++)
            CHECK(!memcmp(again.v[c], p.v[c], hidden * sizeof(float)));
        /* a pooling engine generates nothing */
        cvllm_sampling_params sp;
        cvllm_sampling_params_default(e, &sp);
        cvllm_prompt prompt = {.token_ids = r.ids[0], .n_token_ids = r.n[0]};
        CHECK(cvllm_engine_add_request(e, &prompt, &sp, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
        CHECK(strstr(cvllm_last_error(), "runner pooling") != NULL);
        cvllm_engine_destroy(e);
    }
    /* runner generate on the same folder: no lm_head, tied config, so it loads and generates */
    e = make_engine(dir, &(engine_setup){.runner = "generate"});
    if (e) {
        CHECK(!cvllm_engine_is_pooling(e));
        cvllm_prompt prompt = {.token_ids = r.ids[0], .n_token_ids = r.n[0]};
        CHECK(cvllm_engine_add_pooling_request(e, &prompt, NULL, NULL) == CVLLM_ERR_INVALID_ARGUMENT);
        CHECK(strstr(cvllm_last_error(), "runner generate") != NULL);
        cvllm_engine_destroy(e);
    }
    free(w);
    free_reference(&r);
    tu_remove_tree(dir);
    free(dir);
}

static void expect_add_error(cvllm_engine *e, const int32_t *ids, size_t n, int32_t dimensions, int status,
                             const char *message) {
    cvllm_pooling_params p;
    cvllm_pooling_params_default(&p);
    p.dimensions = dimensions;
    cvllm_prompt prompt = {.token_ids = ids, .n_token_ids = n};
    CHECK_EQ_INT(cvllm_engine_add_pooling_request(e, &prompt, &p, NULL), status);
    CHECK_MSG(strstr(cvllm_last_error(), message), "expected '%s', got '%s'", message, cvllm_last_error());
}

/* cvllm_engine_create refuses the setup with `message`, making nothing. */
static void expect_create_error(const char *dir, const engine_setup *s, const char *message) {
    cvllm_engine_options o = setup_options(dir, s);
    cvllm_engine *e = NULL;
    CHECK(cvllm_engine_create(&o, &e) != CVLLM_OK && e == NULL);
    CHECK_MSG(strstr(cvllm_last_error(), message), "expected '%s', got '%s'", message, cvllm_last_error());
}

/* Matryoshka dimensions (config.json's keys, here through hf_overrides), context length, options. */
static void test_dimensions_and_errors(void) {
    const char *folder = "qwen3-dense-tied-f32";
    char *dir = tu_model_dir(folder);
    reference r;
    load_reference(folder, &r);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = r.ids[1][i];

    cvllm_engine *e = make_engine(dir, &(engine_setup){.runner = "pooling", .max_model_len = 32});
    if (e) {
        expect_add_error(e, ids, 8, 16, CVLLM_ERR_INVALID_ARGUMENT, "does not support matryoshka representation");
        expect_add_error(e, ids, 33, 0, CVLLM_ERR_CAPACITY, "You passed 33 input tokens and requested 0 output tokens");
        expect_add_error(e, ids, 0, 0, CVLLM_ERR_INVALID_ARGUMENT, "cannot be empty");
        int32_t bad[2] = {1, 1 << 20};
        expect_add_error(e, bad, 2, 0, CVLLM_ERR_INVALID_ARGUMENT, "out of vocabulary");
        /* a prompt may fill the whole context: nothing is generated after it (NULL params: the defaults) */
        cvllm_prompt full = {.token_ids = ids, .n_token_ids = 32};
        CHECK_MSG(cvllm_engine_add_pooling_request(e, &full, NULL, NULL) == CVLLM_OK, "%s", cvllm_last_error());
        int finished = 0;
        while (cvllm_engine_has_unfinished(e)) {
            const cvllm_request_output *const *outs;
            size_t n;
            CHECK_EQ_INT(cvllm_engine_step(e, &outs, &n), CVLLM_OK);
            for (size_t k = 0; k < n; k++) finished += outs[k]->finished && outs[k]->n_embedding == 64;
        }
        CHECK_EQ_INT(finished, 1);
        cvllm_engine_destroy(e);
    }

    e = make_engine(dir, &(engine_setup){.runner = "pooling", .hf_overrides = "{\"is_matryoshka\": true}"});
    if (e) {
        expect_add_error(e, ids, 8, 65, CVLLM_ERR_INVALID_ARGUMENT, "must not exceed the embedding size 64");
        expect_add_error(e, ids, 8, -3, CVLLM_ERR_INVALID_ARGUMENT, "Dimensions must be greater than 0");
        cvllm_pooling_params p;
        cvllm_pooling_params_default(&p);
        p.dimensions = 16;
        cvllm_prompt prompt = {.token_ids = r.ids[0], .n_token_ids = r.n[0]};
        CHECK(cvllm_engine_add_pooling_request(e, &prompt, &p, NULL) == CVLLM_OK);
        p.normalize = 0;
        p.dimensions = 0;
        CHECK(cvllm_engine_add_pooling_request(e, &prompt, &p, NULL) == CVLLM_OK);
        float cut[16] = {0}, whole[64] = {0};
        size_t n_cut = 0, n_whole = 0;
        while (cvllm_engine_has_unfinished(e)) {
            const cvllm_request_output *const *outs;
            size_t n;
            CHECK_EQ_INT(cvllm_engine_step(e, &outs, &n), CVLLM_OK);
            for (size_t k = 0; k < n; k++) {
                if (!outs[k]->embedding) continue;
                if (outs[k]->n_embedding == 16) memcpy(cut, outs[k]->embedding, sizeof cut), n_cut = 16;
                if (outs[k]->n_embedding == 64) memcpy(whole, outs[k]->embedding, sizeof whole), n_whole = 64;
            }
        }
        CHECK(n_cut == 16 && n_whole == 64);
        /* truncated first, then normalized: the first 16 values of h scaled to length 1 */
        double len = norm2(whole, 16), worst = 0;
        for (int i = 0; i < 16; i++) worst = fmax(worst, fabs(cut[i] - whole[i] / len));
        CHECK_MSG(worst < 1e-6, "matryoshka: %.3g", worst);
        cvllm_engine_destroy(e);
    }

    e = make_engine(dir, &(engine_setup){.runner = "pooling", .hf_overrides = "{\"matryoshka_dimensions\": [16, 32]}"});
    if (e) {
        expect_add_error(e, ids, 8, 8, CVLLM_ERR_INVALID_ARGUMENT, "only supports [16, 32] matryoshka dimensions");
        cvllm_engine_destroy(e);
    }

    static const struct {
        const char *runner, *pooler_config, *message;
    } bad_options[] = {
        {"pooling", "{\"normalize\": true}", "Parameter `normalize` was removed; use `use_activation` instead."},
        {"pooling", "{\"pooling_type\": \"ALL\"}", "ALL pooling is for the token tasks"},
        {"pooling", "{\"pooling_type\": \"STEP\"}", "pooling type STEP is not supported"},
        {"pooling", "{\"task\": \"token_embed\", \"pooling_type\": \"MEAN\"}", "the token tasks pool every token (ALL), not MEAN"},
        {"pooling", "{\"task\": \"token_classify\"}", "task must be \"embed\" or \"token_embed\""},
        {"pooling", "{\"task\": \"token_embed\", \"dimensions\": 8}", "dimensions do not apply to the token tasks"},
        {"pooling", "{\"pooling_type\": \"LAST\", \"seq_pooling_type\": \"LAST\"}", "Cannot set both"},
        {"pooling", "{\"step_tag_id\": 1}", "step_tag_id is not supported"},
        {"pooling", "{\"enable_chunked_processing\": 1}", "enable_chunked_processing must be a boolean"},
        {"pooling", "{\"max_embed_len\": 0}", "max_embed_len must be a positive integer"},
        {"pooling", "[1]", "pooler_config must be a JSON object"},
        {"generate", "{\"pooling_type\": \"LAST\"}", "pooler_config needs the pooling runner"},
        {"embed", NULL, "invalid runner 'embed'"},
    };
    for (size_t k = 0; k < sizeof bad_options / sizeof *bad_options; k++)
        expect_create_error(dir, &(engine_setup){.runner = bad_options[k].runner,
                                                 .pooler_config = bad_options[k].pooler_config}, bad_options[k].message);
    free_reference(&r);
    tu_remove_tree(dir);
    free(dir);
}

/* The original Qwen3-Reranker as vLLM serves it (hf_overrides naming Qwen3ForSequenceClassification
 * and classifier_from_token): its score is logit(yes) − logit(no) at the last prompt token, through a
 * sigmoid unless normalize is 0. Here the two tokens are "!" and "a" (ids 0 and 64 of the reference
 * models' 4096), and the logits are the reference's, through the untied and the tied head. */
static void test_classify(const char *folder) {
    char *dir = tu_model_dir(folder);
    reference r;
    load_reference(folder, &r);
    static const char overrides[] = "{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
                                    "\"classifier_from_token\": [\"!\", \"a\"], \"is_original_qwen3_reranker\": true}";
    cvllm_engine *e = make_engine(dir, &(engine_setup){.hf_overrides = overrides, .budget = 40, .prefix_caching = true});
    if (e) {
        CHECK(cvllm_engine_is_pooling(e));
        CHECK(!strcmp(cvllm_engine_pooling_task(e), "classify"));
        CHECK_EQ_INT(cvllm_engine_embedding_size(e), 1);
        cvllm_pooling_params raw, def;
        cvllm_pooling_params_default(&def);
        raw = def;
        raw.normalize = 0;
        pooled p, q;
        pool_both(e, &r, &raw, &p);
        pool_both(e, &r, &def, &q);
        for (int c = 0; c < 2 && p.done == 2 && q.done == 2; c++) {
            CHECK_EQ_INT((int)p.n[c], 1);
            const float *row = r.logits[c] + (r.n[c] - 1) * r.vocab;
            double scale = 0;
            for (size_t v = 0; v < r.vocab; v++) scale = fmax(scale, fabs(row[v]));
            const double want = (double)row[64] - row[0];
            CHECK_MSG(fabs(p.v[c][0] - want) <= TOLERANCE * scale, "%s prompt %d: score %.7g, reference %.7g", folder, c,
                      p.v[c][0], want);
            CHECK_MSG(fabs(q.v[c][0] - 1 / (1 + exp(-(double)p.v[c][0]))) < 1e-6, "sigmoid %.7g of %.7g", q.v[c][0],
                      p.v[c][0]);
        }
        cvllm_pooling_params dims = def;
        dims.dimensions = 1;
        cvllm_prompt prompt = {.token_ids = r.ids[0], .n_token_ids = r.n[0]};
        CHECK_EQ_INT(cvllm_engine_add_pooling_request(e, &prompt, &dims, NULL), CVLLM_ERR_INVALID_ARGUMENT);
        CHECK(strstr(cvllm_last_error(), "Task classify only supports ['use_activation'] parameters") != NULL);
        cvllm_engine_destroy(e);
    }
    static const struct {
        const char *runner, *overrides, *message;
    } bad[] = {
        {"generate", overrides, "is a classification model: it runs on the pooling runner"},
        {"pooling", "{\"architectures\": [\"Qwen3ForSequenceClassification\"]}",
         "missing tensor score.weight in"},
        {"pooling", "{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"is_original_qwen3_reranker\": true, "
                    "\"classifier_from_token\": [\"no\", \"zzzqqq\"]}",
         "classifier_from_token: 'zzzqqq' is not a token of the tokenizer"},
        {"pooling", "{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"is_original_qwen3_reranker\": true, "
                    "\"classifier_from_token\": [\"no\", \"yes\", \"maybe\"]}",
         "method from_2_way_softmax needs config.json's classifier_from_token as two tokens"},
        {"pooling", "{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"method\": \"two_way\"}",
         "config.json: method two_way not supported"},
        {"pooling", "{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"method\": \"no_post_processing\"}",
         "method no_post_processing needs config.json's classifier_from_token as a list of tokens"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        expect_create_error(dir, &(engine_setup){.runner = bad[k].runner, .hf_overrides = bad[k].overrides},
                            bad[k].message);
    free_reference(&r);
    tu_remove_tree(dir);
    free(dir);
}

/* A classifier has no lm_head. */
static const char *without_lm_head(const char *name) { return strcmp(name, "lm_head.weight") ? name : NULL; }

/* A copy of a vector folder's checkpoint with a classifier head: score.weight's rows are the output
 * head's rows of `ids`, so the class logits of a prompt are the reference logits at those ids. */
static char *seq_cls_dir(const char *folder, const int32_t *ids, size_t n_ids) {
    size_t hidden;
    float *w = head_of(folder, &hidden);
    float *rows = malloc(n_ids * hidden * sizeof *rows);
    for (size_t i = 0; i < n_ids; i++) memcpy(rows + i * hidden, w + (size_t)ids[i] * hidden, hidden * sizeof *rows);
    const cv_tensor score = {.name = "score.weight", .dtype = CV_DTYPE_F32, .ndim = 2,
                             .shape = {(int64_t)n_ids, (int64_t)hidden}, .data = rows};
    char *dir = rewritten_folder(folder, without_lm_head, &score);
    free(rows);
    free(w);
    return dir;
}

/* The activations of the class logits x[n] as vLLM applies them. */
static void expected_scores(const char *act, const double *x, size_t n, double *out) {
    double max = x[0], sum = 0;
    for (size_t i = 0; i < n; i++) max = fmax(max, x[i]);
    for (size_t i = 0; i < n; i++) sum += exp(x[i] - max);
    for (size_t i = 0; i < n; i++)
        out[i] = !strcmp(act, "identity") ? x[i]
                 : !strcmp(act, "softmax") ? exp(x[i] - max) / sum
                 : !strcmp(act, "tanh")    ? tanh(x[i])
                                           : 1 / (1 + exp(-x[i]));
}

typedef struct cls_case {
    const char *overrides, *pooler_config, *task;
    int32_t normalize;
    const char *act;                /* what the scores go through */
    double logit_mean, logit_sigma; /* what pooler_config says of them (sigma 0: not given) */
    const char *convert;            /* the engine's convert option */
} cls_case;

/* Runs both reference prompts through a classifier whose labels are the reference logits at ids
 * (averaged over the prompt for MEAN) and checks every score after `act`. */
static void check_classifier(const char *folder, const char *dir, const int32_t *ids, size_t n_ids, const cls_case *k) {
    reference r;
    load_reference(folder, &r);
    cvllm_engine *e = make_engine(dir, &(engine_setup){.hf_overrides = k->overrides, .pooler_config = k->pooler_config,
                                                        .convert = k->convert,
                                                        .budget = 40, .prefix_caching = true});
    if (!e) {
        free_reference(&r);
        return;
    }
    CHECK(!strcmp(cvllm_engine_pooling_task(e), "classify"));
    CHECK_EQ_INT(cvllm_engine_embedding_size(e), (int)n_ids);
    cvllm_pooling_params params;
    cvllm_pooling_params_default(&params);
    params.normalize = k->normalize;
    params.task = k->task;
    pooled p;
    pool_both(e, &r, &params, &p);
    const bool mean = k->pooler_config && strstr(k->pooler_config, "MEAN");
    const double logit_sigma = k->logit_sigma ? k->logit_sigma : 1;
    for (int c = 0; c < 2 && p.done == 2; c++) {
        CHECK_EQ_INT((int)p.n[c], (int)n_ids);
        double logits[8], want[8], scale = 0;
        for (size_t l = 0; l < n_ids; l++) {
            logits[l] = 0;
            for (size_t t = mean ? 0 : r.n[c] - 1; t < r.n[c]; t++) logits[l] += r.logits[c][t * r.vocab + (size_t)ids[l]];
            logits[l] = (logits[l] / (mean ? (double)r.n[c] : 1) - k->logit_mean) / logit_sigma;
        }
        for (size_t v = 0; v < r.vocab; v++) scale = fmax(scale, fabs(r.logits[c][(r.n[c] - 1) * r.vocab + v]));
        expected_scores(k->act, logits, n_ids, want);
        for (size_t l = 0; l < n_ids; l++)
            CHECK_MSG(fabs(p.v[c][l] - want[l]) <= TOLERANCE * fmax(scale, 1), "%s %s prompt %d label %zu: %.7g, want %.7g",
                      folder, k->overrides, c, l, p.v[c][l], want[l]);
    }
    cvllm_engine_destroy(e);
    free_reference(&r);
}

/* A classifier with its own score.weight head (a *ForSequenceClassification checkpoint, such as the
 * Qwen3-Reranker-seq-cls conversions), and one made of lm_head rows by method no_post_processing:
 * vLLM's activations (problem_type, a cross-encoder's activation_fn), label names, MEAN pooling,
 * the score task, and the refusals. */
static void test_seq_cls(const char *folder) {
    static const int32_t three[] = {0, 64, 100}, one[] = {64};
    char *dir = seq_cls_dir(folder, three, 3);
    static const char arch[] = "{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
                               "\"id2label\": {\"0\": \"neg\", \"1\": \"neutral\", \"2\": \"pos\"}";
    char *plain = tu_strdupf("%s}", arch, "");
    const cls_case cases[] = {
        {plain, NULL, NULL, -1, "softmax", 0, 0, NULL},
        {plain, NULL, "classify", 0, "identity", 0, 0, NULL},
        {plain, "{\"seq_pooling_type\": \"MEAN\"}", NULL, -1, "softmax", 0, 0, NULL},
        {plain, "{\"logit_mean\": 0.25, \"logit_sigma\": -2.5}", NULL, -1, "softmax", 0.25, -2.5, NULL},
        {tu_strdupf("%s, \"problem_type\": \"multi_label_classification\"}", arch, ""), NULL, NULL, -1, "sigmoid", 0, 0, NULL},
        {tu_strdupf("%s, \"problem_type\": \"regression\"}", arch, ""), NULL, NULL, 1, "identity", 0, 0, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) check_classifier(folder, dir, three, 3, &cases[k]);
    cvllm_engine *e = make_engine(dir, &(engine_setup){.hf_overrides = plain});
    if (e) {
        CHECK(!strcmp(cvllm_engine_class_label(e, 0), "neg") && !strcmp(cvllm_engine_class_label(e, 2), "pos"));
        CHECK(cvllm_engine_class_label(e, 3) == NULL && cvllm_engine_class_label(e, -1) == NULL);
        cvllm_pooling_params params;
        cvllm_pooling_params_default(&params);
        cvllm_prompt prompt = {.token_ids = three, .n_token_ids = 3};
        static const char *const refused[][2] = {{"score", "Unsupported task: 'score' Supported tasks: ('classify',)"},
                                                 {"embed", "Unsupported task: 'embed'"}};
        for (size_t k = 0; k < 2; k++) {
            params.task = refused[k][0];
            CHECK_EQ_INT(cvllm_engine_add_pooling_request(e, &prompt, &params, NULL), CVLLM_ERR_INVALID_ARGUMENT);
            CHECK_MSG(strstr(cvllm_last_error(), refused[k][1]), "got '%s'", cvllm_last_error());
        }
        cvllm_engine_destroy(e);
    }
    /* id2label (num_labels) against the head's rows; a pooler_config that embeds */
    expect_create_error(dir, &(engine_setup){.hf_overrides = "{\"architectures\": [\"Qwen3ForSequenceClassification\"]}"},
                        "score.weight");
    expect_create_error(dir, &(engine_setup){.hf_overrides = plain, .pooler_config = "{\"dimensions\": 2}"},
                        "dimensions apply to embeddings");
    expect_create_error(dir, &(engine_setup){.hf_overrides = plain, .pooler_config = "{\"task\": \"embed\"}"},
                        "task must be \"classify\"");
    expect_create_error(dir, &(engine_setup){.hf_overrides = plain, .pooler_config = "{\"logit_sigma\": 0}"},
                        "logit_sigma must be a number other than 0");
    for (size_t k = 4; k < sizeof cases / sizeof *cases; k++) free((char *)cases[k].overrides); /* the tu_strdupf ones */
    free(plain);
    tu_remove_tree(dir);
    free(dir);

    /* one label: the score task takes the cross-encoder's activation_fn, classify stays a sigmoid */
    dir = seq_cls_dir(folder, one, 1);
    static const char one_label[] = "{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"id2label\": "
                                    "{\"0\": \"LABEL_0\"}, \"sentence_transformers\": {\"activation_fn\": "
                                    "\"torch.nn.modules.%s\"}}";
    char *identity = tu_strdupf(one_label, "linear.Identity", ""), *tanh_fn = tu_strdupf(one_label, "activation.Tanh", "");
    check_classifier(folder, dir, one, 1, &(cls_case){identity, NULL, "score", -1, "identity", 0, 0, NULL});
    check_classifier(folder, dir, one, 1, &(cls_case){identity, NULL, NULL, -1, "sigmoid", 0, 0, NULL});
    check_classifier(folder, dir, one, 1, &(cls_case){tanh_fn, NULL, "score", -1, "tanh", 0, 0, NULL});
    char *bad_fn = tu_strdupf(one_label, "activation.GELU", "");
    expect_create_error(dir, &(engine_setup){.hf_overrides = bad_fn}, "activation function torch.nn.modules.activation.GELU "
                                                                      "is not supported");
    free(bad_fn);
    bad_fn = tu_strdupf("{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"id2label\": {\"0\": \"x\"}, "
                        "\"sbert_ce_default_activation_function\": \"os.system\"}", "", "");
    expect_create_error(dir, &(engine_setup){.hf_overrides = bad_fn}, "restricted to torch.nn.modules");
    free(bad_fn);
    free(identity);
    free(tanh_fn);
    tu_remove_tree(dir);
    free(dir);

    /* no_post_processing: the head is the lm_head's rows of the tokens "!", "a" and "b" (ids 0, 64, 65) */
    static const int32_t tokens[] = {0, 64, 65};
    dir = tu_model_dir(folder);
    check_classifier(folder, dir, tokens, 3,
                     &(cls_case){"{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"method\": "
                                 "\"no_post_processing\", \"classifier_from_token\": [\"!\", \"a\", \"b\"]}",
                                 NULL, NULL, -1, "softmax", 0, 0, NULL});
    tu_remove_tree(dir);
    free(dir);
}

/* Both reference prompts as pooling requests in one engine; each finished output's values copied
 * into out[c] (n[c] of them). */
static void pool_tokens(cvllm_engine *e, const reference *r, const cvllm_pooling_params *params, float *out[2],
                        size_t n[2]) {
    uint64_t ids[2];
    for (int c = 0; c < 2; c++) {
        cvllm_prompt p = {.token_ids = r->ids[c], .n_token_ids = r->n[c]};
        CHECK_MSG(cvllm_engine_add_pooling_request(e, &p, params, &ids[c]) == CVLLM_OK, "%s", cvllm_last_error());
        out[c] = NULL;
        n[c] = 0;
    }
    for (int steps = 0; cvllm_engine_has_unfinished(e) && steps < 1000; steps++) {
        const cvllm_request_output *const *outs;
        size_t count;
        CHECK_EQ_INT(cvllm_engine_step(e, &outs, &count), CVLLM_OK);
        for (size_t k = 0; k < count; k++) {
            if (!outs[k]->finished || !outs[k]->embedding) continue;
            const int c = outs[k]->request_id == ids[0] ? 0 : 1;
            n[c] = outs[k]->n_embedding;
            out[c] = malloc(n[c] * sizeof **out);
            memcpy(out[c], outs[k]->embedding, n[c] * sizeof **out);
        }
    }
    CHECK(out[0] && out[1]);
}

/* vLLM's token tasks (--pooler-config task token_embed / token_classify): one row a prompt token,
 * through chunked and batched steps. token_embed's rows are the final-normed states, so W·row is the
 * reference's logits row at that position (normalized: unit rows); token_classify's rows are the
 * scores of a score.weight made of reference head rows, through the softmax. */
static void test_token_tasks(const char *folder) {
    char *dir = tu_model_dir(folder);
    reference r;
    load_reference(folder, &r);
    size_t hidden;
    float *w = head_of(folder, &hidden);
    cvllm_engine *e = make_engine(dir, &(engine_setup){.runner = "pooling", .pooler_config = "{\"task\": \"token_embed\"}",
                                                        .budget = 40, .prefix_caching = true});
    float *out[2];
    size_t n[2];
    if (e) {
        CHECK(!strcmp(cvllm_engine_pooling_task(e), "token_embed"));
        CHECK_EQ_INT(cvllm_engine_embedding_size(e), (int)hidden);
        cvllm_pooling_params raw, def;
        cvllm_pooling_params_default(&def);
        raw = def;
        raw.normalize = 0;
        pool_tokens(e, &r, &raw, out, n);
        for (int c = 0; c < 2 && out[c]; c++) {
            CHECK_EQ_INT((int)n[c], (int)(r.n[c] * hidden));
            double worst = 0;
            for (size_t t = 0; t < r.n[c] && n[c] == r.n[c] * hidden; t++)
                worst = fmax(worst, head_error(w, r.vocab, hidden, out[c] + t * hidden, r.logits[c] + t * r.vocab));
            CHECK_MSG(worst < TOLERANCE, "%s token_embed prompt %d: W·row off the reference by %.3g", folder, c, worst);
            free(out[c]);
        }
        pool_tokens(e, &r, &def, out, n);
        for (int c = 0; c < 2 && out[c]; c++) {
            for (size_t t = 0; t < n[c] / hidden; t++) CHECK(fabs(norm2(out[c] + t * hidden, hidden) - 1) < 1e-5);
            free(out[c]);
        }
        cvllm_prompt prompt = {.token_ids = r.ids[0], .n_token_ids = r.n[0]};
        cvllm_pooling_params bad = def;
        bad.task = "embed";
        CHECK_EQ_INT(cvllm_engine_add_pooling_request(e, &prompt, &bad, NULL), CVLLM_ERR_INVALID_ARGUMENT);
        CHECK(strstr(cvllm_last_error(), "Unsupported task: 'embed' Supported tasks: ('token_embed',)") != NULL);
        expect_add_error(e, r.ids[0], r.n[0], 8, CVLLM_ERR_INVALID_ARGUMENT, "does not support ['dimensions']");
        cvllm_engine_destroy(e);
    }
    tu_remove_tree(dir);
    free(dir);

    static const int32_t ids[] = {0, 64, 100};
    dir = seq_cls_dir(folder, ids, 3);
    e = make_engine(dir, &(engine_setup){.hf_overrides = "{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
                                                         "\"id2label\": {\"0\": \"a\", \"1\": \"b\", \"2\": \"c\"}}",
                                         .pooler_config = "{\"task\": \"token_classify\"}", .budget = 40});
    if (e) {
        CHECK(!strcmp(cvllm_engine_pooling_task(e), "token_classify"));
        CHECK_EQ_INT(cvllm_engine_embedding_size(e), 3);
        cvllm_pooling_params def;
        cvllm_pooling_params_default(&def);
        pool_tokens(e, &r, &def, out, n);
        for (int c = 0; c < 2 && out[c]; c++) {
            CHECK_EQ_INT((int)n[c], (int)(r.n[c] * 3));
            int wrong = 0;
            for (size_t t = 0; t < r.n[c] && n[c] == r.n[c] * 3; t++) {
                double x[3], want[3], scale = 0;
                for (size_t l = 0; l < 3; l++) x[l] = r.logits[c][t * r.vocab + (size_t)ids[l]];
                for (size_t v = 0; v < r.vocab; v++) scale = fmax(scale, fabs(r.logits[c][t * r.vocab + v]));
                expected_scores("softmax", x, 3, want);
                for (size_t l = 0; l < 3; l++) wrong += fabs(out[c][t * 3 + l] - want[l]) > TOLERANCE * fmax(scale, 1);
            }
            CHECK_MSG(wrong == 0, "%s token_classify prompt %d: %d scores off", folder, c, wrong);
            free(out[c]);
        }
        cvllm_engine_destroy(e);
    }
    free(w);
    free_reference(&r);
    tu_remove_tree(dir);
    free(dir);
}

/* --convert classify on the hybrid stack (its architecture stays its own, the classifier is made on
 * it): a score.weight head, and one of lm_head rows (no_post_processing). */
static void test_convert_classify(const char *folder) {
    static const int32_t ids[] = {0, 64, 65};
    char *dir = seq_cls_dir(folder, ids, 3);
    check_classifier(folder, dir, ids, 3, &(cls_case){.overrides = "{\"id2label\": {\"0\": \"x\", \"1\": \"y\", \"2\": \"z\"}}",
                                                      .normalize = -1, .act = "softmax", .convert = "classify"});
    tu_remove_tree(dir);
    free(dir);
    dir = tu_model_dir(folder);
    check_classifier(folder, dir, ids, 3, &(cls_case){.overrides = "{\"method\": \"no_post_processing\", "
                                                                    "\"classifier_from_token\": [\"!\", \"a\", \"b\"]}",
                                                      .normalize = 0, .act = "identity", .convert = "classify"});
    expect_create_error(dir, &(engine_setup){.convert = "reward"}, "convert reward is not supported");
    tu_remove_tree(dir);
    free(dir);
}

int main(void) {
    test_pooling_types("qwen3-dense-tied-f32");
    test_pooling_types("qwen3-dense-f32");
    test_pooling_types("qwen3.5-dense-f32"); /* the hybrid stack: recurrent state across the chunks */
    test_embedding_folder();
    test_dimensions_and_errors();
    test_classify("qwen3-dense-f32");
    test_classify("qwen3-dense-tied-f32");
    test_seq_cls("qwen3-dense-f32");
    test_seq_cls("qwen3-dense-tied-f32");
    test_convert_classify("qwen3.5-dense-f32");
    test_token_tasks("qwen3-dense-f32");
    return cv_check_summary("test_pooling");
}
