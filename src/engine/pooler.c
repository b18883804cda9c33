/*
 * pooler.c — see pooler.h.
 */
#include "engine/pooler.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "loader/fileutil.h"

static const char *const TYPE_NAMES[] = {[CV_POOL_LAST] = "LAST", [CV_POOL_CLS] = "CLS", [CV_POOL_MEAN] = "MEAN",
                                         [CV_POOL_ALL] = "ALL"};

const char *cv_pooling_type_name(cv_pooling_type t) { return TYPE_NAMES[t]; }

/* ---- configuration ---------------------------------------------------------------------------- */

static json_t *load_json(const char *path, int *rc) {
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    *rc = j ? 0 : cv_fail(CVLLM_ERR_FORMAT, "%s: %s (line %d)", path, err.text, err.line);
    return j;
}

/* modules.json's module of sentence-transformers type `type` (e.g. "Pooling"), or NULL. */
static const json_t *st_module(const json_t *modules, const char *type) {
    char full[96];
    snprintf(full, sizeof full, "sentence_transformers.models.%s", type);
    size_t i;
    const json_t *m;
    json_array_foreach(modules, i, m) {
        const char *t = json_string_value(json_object_get(m, "type"));
        if (t && !strcmp(t, full)) return m;
    }
    return NULL;
}

static json_t *folder_modules(const char *model_dir, int *rc) {
    *rc = 0;
    char *path = cv_xasprintf("%s/modules.json", model_dir);
    json_t *modules = cv_path_exists(path) ? load_json(path, rc) : NULL;
    if (modules && !json_is_array(modules)) {
        *rc = cv_fail(CVLLM_ERR_FORMAT, "%s: expected a list of modules", path);
        json_decref(modules);
        modules = NULL;
    }
    free(path);
    return modules;
}

bool cv_pooler_folder_pools(const char *model_dir) {
    int rc;
    json_t *modules = folder_modules(model_dir, &rc);
    bool pools = modules && st_module(modules, "Pooling");
    json_decref(modules);
    return pools;
}

static int parse_type(const char *name, const char *origin, cv_pooling_type *out) {
    for (int t = 0; t < (int)(sizeof TYPE_NAMES / sizeof *TYPE_NAMES); t++)
        if (!strcmp(name, TYPE_NAMES[t])) {
            *out = (cv_pooling_type)t;
            return 0;
        }
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: pooling type %s is not supported; cvllm pools LAST, CLS or MEAN, and ALL "
                   "for the token tasks", origin, name);
}

/* The sentence-transformers Pooling module's config.json: vLLM takes each pooling_mode_X that is true,
 * X up to its first '_' ("lasttoken" read as LAST), and uses the last one it knows. */
static int st_pooling(const char *model_dir, const json_t *module, cv_pooler *p) {
    const char *sub = json_string_value(json_object_get(module, "path"));
    char *path = cv_xasprintf("%s/%s/config.json", model_dir, sub ? sub : "");
    int rc = 0;
    json_t *cfg = cv_path_exists(path) ? load_json(path, &rc) : NULL;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)cfg, key, v) {
        if (rc || !json_is_true(v) || strncmp(key, "pooling_mode_", 13)) continue;
        char mode[32];
        snprintf(mode, sizeof mode, "%s", key + 13);
        mode[strcspn(mode, "_")] = '\0';
        if (!strcmp(mode, "lasttoken")) p->type = CV_POOL_LAST;
        else if (!strcmp(mode, "cls")) p->type = CV_POOL_CLS;
        else if (!strcmp(mode, "mean")) p->type = CV_POOL_MEAN;
        else rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: %s pooling is not supported; cvllm pools LAST, CLS or MEAN", path, key);
    }
    json_decref(cfg);
    free(path);
    return rc;
}

static int from_folder(cv_pooler *p, const char *model_dir) {
    int rc;
    json_t *modules = folder_modules(model_dir, &rc);
    if (modules) {
        const json_t *pooling = st_module(modules, "Pooling");
        p->normalize = st_module(modules, "Normalize") != NULL;
        if (pooling) rc = st_pooling(model_dir, pooling, p);
        if (!rc && st_module(modules, "Dense"))
            rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s/modules.json: a Dense projection after pooling is not supported",
                         model_dir);
    }
    json_decref(modules);
    return rc;
}

/* The prompt prefixes of the input types (Cohere's input_type): config.json's task_instructions, else
 * the prompts of config_sentence_transformers.json (Qwen3-Embedding's "query" instruction); only
 * string values count, as vLLM keeps them. A malformed file is an error. */
static int input_prompts(cv_pooler *p, const char *model_dir, const cv_model_config *cfg) {
    const json_t *table = json_object_get(cfg->root, "task_instructions");
    json_t *st = NULL;
    int rc = 0;
    if (!json_is_object(table) || !json_object_size(table)) {
        char *path = cv_xasprintf("%s/config_sentence_transformers.json", model_dir);
        st = cv_path_exists(path) ? load_json(path, &rc) : NULL;
        free(path);
        table = json_object_get(st, "prompts");
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)(json_is_object(table) ? table : NULL), key, v) {
        if (!json_is_string(v)) continue;
        p->prompt_names = cv_xrealloc(p->prompt_names, (size_t)(p->n_prompts + 1) * sizeof *p->prompt_names);
        p->prompt_texts = cv_xrealloc(p->prompt_texts, (size_t)(p->n_prompts + 1) * sizeof *p->prompt_texts);
        p->prompt_names[p->n_prompts] = cv_xstrdup(key);
        p->prompt_texts[p->n_prompts++] = cv_xstrdup(json_string_value(v));
    }
    json_decref(st);
    return rc;
}

/* --pooler-config: vLLM's PoolerConfig keys cvllm acts on; the rest are refused by name rather than
 * ignored, since each would change the vectors. */
static int from_option(cv_pooler *p, const char *text) {
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config must be a JSON object%s%s", j ? "" : ": ",
                       j ? "" : err.text);
    }
    int rc = 0;
    const char *key;
    json_t *v;
    const char *origin = "pooler_config";
    bool type_given = false;
    if (json_object_get(j, "pooling_type") && json_object_get(j, "seq_pooling_type"))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Cannot set both `pooling_type` and `seq_pooling_type`");
    json_object_foreach(j, key, v) {
        if (rc || json_is_null(v)) continue;
        if (!strcmp(key, "pooling_type") || !strcmp(key, "seq_pooling_type")) {
            type_given = true;
            rc = json_is_string(v) ? parse_type(json_string_value(v), origin, &p->type)
                                   : cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: %s must be a string", key);
        } else if (!strcmp(key, "use_activation")) {
            if (!json_is_boolean(v)) rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: use_activation must be a boolean");
            p->normalize = json_is_true(v);
        } else if (!strcmp(key, "dimensions")) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
                rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: dimensions must be a positive integer");
            else p->dimensions = (int32_t)json_integer_value(v);
        } else if (!strcmp(key, "task")) { /* the model's own task, or its token-level form */
            const char *own = p->task == CV_TASK_CLASSIFY ? "classify" : "embed", *t = json_string_value(v);
            p->tokenwise = t && !strncmp(t, "token_", 6) && !strcmp(t + 6, own);
            if (!t || (strcmp(t, own) && !p->tokenwise))
                rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "pooler_config: task must be \"%s\" or \"token_%s\", the ones this "
                             "model runs (embed for an embedding model, classify for a *ForSequenceClassification one)",
                             own, own);
        } else if (!strcmp(key, "logit_mean") || !strcmp(key, "logit_sigma")) {
            const bool sigma = key[6] == 's';
            if (!json_is_number(v) || (sigma && json_number_value(v) == 0))
                rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: %s must be a number%s", key, sigma ? " other than 0" : "");
            else if (sigma) p->logit_sigma = (float)json_number_value(v);
            else p->logit_mean = (float)json_number_value(v);
        } else if (!strcmp(key, "enable_chunked_processing")) {
            if (!json_is_boolean(v))
                rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: enable_chunked_processing must be a boolean");
            p->chunked = json_is_true(v);
        } else if (!strcmp(key, "max_embed_len")) {
            if (!json_is_integer(v) || json_integer_value(v) < 1)
                rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: max_embed_len must be a positive integer");
            else p->max_embed_len = (int64_t)json_integer_value(v);
        } else if (!strcmp(key, "normalize")) {
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Parameter `normalize` was removed; use `use_activation` instead.");
        } else {
            rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "pooler_config: %s is not supported (cvllm reads pooling_type, "
                         "seq_pooling_type, use_activation, dimensions, task, logit_mean, logit_sigma, "
                         "enable_chunked_processing and max_embed_len)", key);
        }
    }
    json_decref(j);
    /* the token tasks pool ALL (whatever the folder's sequence pooling), and only they do */
    if (!rc && (p->tokenwise ? type_given && p->type != CV_POOL_ALL : p->type == CV_POOL_ALL))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, p->tokenwise ? "pooler_config: the token tasks pool every token (ALL), "
                     "not %s" : "pooler_config: ALL pooling is for the token tasks (task token_embed or token_classify)",
                     cv_pooling_type_name(p->type));
    if (!rc && p->tokenwise) p->type = CV_POOL_ALL;
    return rc;
}

/* config.json's matryoshka keys (vLLM's ModelConfig.is_matryoshka). */
static int matryoshka(cv_pooler *p, const cv_model_config *cfg) {
    const json_t *root = cfg->root ? cfg->root : NULL;
    if (!root) return 0;
    const json_t *dims = json_object_get(root, "matryoshka_dimensions");
    p->matryoshka = json_is_true(json_object_get(root, "is_matryoshka"));
    if (!dims || json_is_null(dims)) return 0;
    if (!json_is_array(dims))
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: matryoshka_dimensions must be a list of integers");
    size_t i;
    const json_t *d;
    p->matryoshka_dims = cv_xcalloc(json_array_size(dims) + 1, sizeof *p->matryoshka_dims);
    json_array_foreach(dims, i, d) {
        if (!json_is_integer(d) || json_integer_value(d) < 1 || json_integer_value(d) > p->hidden)
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: matryoshka_dimensions must be integers in [1, %d]", p->hidden);
        p->matryoshka_dims[p->n_matryoshka_dims++] = (int32_t)json_integer_value(d);
    }
    p->matryoshka = p->matryoshka || p->n_matryoshka_dims > 0;
    return 0;
}

/* ---- classification --------------------------------------------------------------------------- */

/* A sentence-transformers cross-encoder's activation_fn (vLLM loads only torch.nn.modules classes,
 * and runs Sigmoid and Softmax as its classify activation). */
static int parse_act_fn(const char *name, const char *origin, cv_pool_act *out) {
    static const struct {
        const char *name;
        cv_pool_act act;
    } known[] = {{"torch.nn.modules.activation.Sigmoid", CV_ACT_CLASSIFY},
                 {"torch.nn.modules.activation.Softmax", CV_ACT_CLASSIFY},
                 {"torch.nn.modules.linear.Identity", CV_ACT_IDENTITY},
                 {"torch.nn.modules.activation.Tanh", CV_ACT_TANH}};
    if (strncmp(name, "torch.nn.modules.", 17))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: activation function %s: loading of activation functions is "
                       "restricted to torch.nn.modules for security reasons", origin, name);
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(name, known[i].name)) {
            *out = known[i].act;
            return 0;
        }
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: activation function %s is not supported; cvllm runs Sigmoid, Softmax, "
                   "Identity and Tanh", origin, name);
}

/* The activations: the classify task's from problem_type (transformers' loss for it), the score
 * task's from the cross-encoder's activation_fn, each else a sigmoid or softmax by the label count. */
static int activations(cv_pooler *p, const json_t *root) {
    const char *problem = json_string_value(json_object_get(root, "problem_type"));
    p->act_classify = !problem                                        ? CV_ACT_CLASSIFY
                      : !strcmp(problem, "regression")                ? CV_ACT_IDENTITY
                      : !strcmp(problem, "multi_label_classification") ? CV_ACT_SIGMOID
                                                                       : CV_ACT_CLASSIFY;
    const json_t *st = json_object_get(root, "sentence_transformers");
    const char *fn = json_string_value(json_object_get(st, "activation_fn"));
    if (!fn) fn = json_string_value(json_object_get(root, "sbert_ce_default_activation_function"));
    p->act_score = CV_ACT_CLASSIFY;
    return fn ? parse_act_fn(fn, "config.json", &p->act_score) : 0;
}

/* The labels' names: id2label where it names num_labels of them, else transformers' LABEL_i. */
static void label_names(cv_pooler *p, const json_t *root) {
    const json_t *names = json_object_get(root, "id2label");
    const bool given = json_is_object(names) && json_object_size(names) == (size_t)p->num_labels;
    p->labels = cv_xcalloc((size_t)p->num_labels, sizeof *p->labels);
    for (int32_t i = 0; i < p->num_labels; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        const char *name = given ? json_string_value(json_object_get(names, key)) : NULL;
        p->labels[i] = name ? cv_xstrdup(name) : cv_xasprintf("LABEL_%d", i);
    }
}

/* *ForSequenceClassification: where the head comes from and how many labels it has, as vLLM's
 * SequenceClassificationConfig decides (is_original_qwen3_reranker is Qwen3's way to ask for
 * from_2_way_softmax). */
static int classifier(cv_pooler *p, const cv_model_config *cfg) {
    const json_t *root = cfg->root;
    p->task = CV_TASK_CLASSIFY;
    const json_t *method = json_object_get(root, "method"), *tokens = json_object_get(root, "classifier_from_token");
    if (method && !json_is_null(method)) {
        if (!json_is_string(method) || (strcmp(json_string_value(method), "from_2_way_softmax") &&
                                        strcmp(json_string_value(method), "no_post_processing")))
            return cv_fail(CVLLM_ERR_UNSUPPORTED, "config.json: method %s not supported; choose from_2_way_softmax "
                           "or no_post_processing", json_is_string(method) ? json_string_value(method) : "(not a string)");
        p->method = cv_xstrdup(json_string_value(method));
    } else if (json_is_true(json_object_get(root, "is_original_qwen3_reranker"))) {
        p->method = cv_xstrdup("from_2_way_softmax");
    }
    if (p->method) {
        const bool two_way = !strcmp(p->method, "from_2_way_softmax");
        size_t n = json_array_size(tokens), i;
        const json_t *t;
        json_array_foreach(tokens, i, t) if (!json_is_string(t)) n = 0;
        if (n == 0 || (two_way && n != 2))
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%s: method %s needs config.json's classifier_from_token as %s, "
                           "e.g. [\"no\", \"yes\"]", cfg->architecture, p->method, two_way ? "two tokens" : "a list of tokens");
        p->label_tokens = cv_xcalloc(n, sizeof *p->label_tokens);
        json_array_foreach(tokens, i, t) p->label_tokens[i] = cv_xstrdup(json_string_value(t));
        p->n_label_tokens = (int32_t)n;
        p->num_labels = two_way ? 1 : (int32_t)n;
    } else {
        /* transformers: id2label's size, else num_labels, else its default of 2 */
        const json_t *names = json_object_get(root, "id2label"), *num = json_object_get(root, "num_labels");
        p->num_labels = json_is_object(names) && json_object_size(names) ? (int32_t)json_object_size(names)
                        : json_is_integer(num)                           ? (int32_t)json_integer_value(num)
                                                                         : 2;
        if (p->num_labels < 1 || p->num_labels > (1 << 20))
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: num_labels must be in [1, 1048576], got %d", p->num_labels);
    }
    label_names(p, root);
    return activations(p, root);
}

/* Row `id` of head_tensor [vocab][hidden] as f32 into out. */
static int head_row(cv_weight_source *w, const char *head_tensor, int64_t vocab, int64_t hidden, int32_t id, float *out) {
    cv_tensor t;
    const int64_t shape[2] = {vocab, hidden};
    int rc = cv_weights_get(w, head_tensor, 2, shape, "vocab_size, hidden_size", &t);
    if (rc) return rc;
    const size_t width = cv_dtype_size(t.dtype);
    cv_convert_to_f32(out, (const char *)t.data + (size_t)id * (size_t)hidden * width, t.dtype, (size_t)hidden);
    return 0;
}

int cv_pooler_load_head(cv_pooler *p, cv_weight_source *w, const char *head_tensor, const cv_tokenizer *tok) {
    if (p->task != CV_TASK_CLASSIFY) return 0;
    const size_t H = (size_t)p->hidden, L = (size_t)p->num_labels;
    p->head = cv_xcalloc(L * H, sizeof *p->head);
    if (!p->method) {
        cv_tensor t;
        const int64_t shape[2] = {p->num_labels, p->hidden};
        int rc = cv_weights_get(w, "score.weight", 2, shape, "num_labels (id2label), hidden_size", &t);
        if (rc == CVLLM_ERR_NOT_FOUND) {
            char why[512];
            snprintf(why, sizeof why, "%s", cvllm_last_error());
            return cv_fail(rc, "%s: a sequence classifier needs its score head, or config.json's method and "
                           "classifier_from_token to make one of the lm_head (for the original Qwen3-Reranker: "
                           "is_original_qwen3_reranker and classifier_from_token [\"no\", \"yes\"])", why);
        }
        if (!rc) cv_convert_to_f32(p->head, t.data, t.dtype, L * H);
        return rc;
    }
    float *rows = cv_xmalloc((size_t)p->n_label_tokens * H * sizeof *rows);
    int rc = 0;
    for (int32_t i = 0; i < p->n_label_tokens && !rc; i++) {
        const int32_t id = cv_tokenizer_token_to_id(tok, p->label_tokens[i]);
        rc = id < 0 || id >= p->vocab
                 ? cv_fail(CVLLM_ERR_FORMAT, "classifier_from_token: '%s' is not a token of the tokenizer", p->label_tokens[i])
                 : head_row(w, head_tensor, p->vocab, p->hidden, id, rows + (size_t)i * H);
    }
    if (!rc && L == 1 && p->n_label_tokens == 2) /* from_2_way_softmax: logit(yes) − logit(no) */
        for (size_t i = 0; i < H; i++) p->head[i] = rows[H + i] - rows[i];
    else if (!rc)
        memcpy(p->head, rows, L * H * sizeof *rows);
    free(rows);
    return rc;
}

bool cv_pooler_config_classifies(const cv_model_config *cfg) {
    static const char suffix[] = "ForSequenceClassification";
    const size_t n = strlen(cfg->architecture), k = sizeof suffix - 1;
    return n > k && !strcmp(cfg->architecture + n - k, suffix);
}

int cv_pooler_init(cv_pooler *p, const char *model_dir, const char *pooler_config, const cv_model_config *cfg,
                   bool classify) {
    *p = (cv_pooler){.type = CV_POOL_LAST, .normalize = true, .hidden = cfg->hidden_size, .vocab = cfg->vocab_size,
                     .logit_sigma = 1};
    int rc;
    if (classify) {
        rc = classifier(p, cfg);
        if (!rc && pooler_config) rc = from_option(p, pooler_config);
        if (!rc && p->dimensions)
            rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "pooler_config: dimensions apply to embeddings; a classifier returns "
                         "one score a label");
    } else {
        rc = from_folder(p, model_dir);
        if (!rc && pooler_config) rc = from_option(p, pooler_config);
        if (!rc && p->tokenwise && p->dimensions)
            rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "pooler_config: dimensions do not apply to the token tasks");
        if (!rc) rc = matryoshka(p, cfg);
        if (!rc) rc = input_prompts(p, model_dir, cfg);
    }
    if (rc) cv_pooler_free(p);
    return rc;
}

static void free_strings(char **v, int32_t n) {
    for (int32_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

void cv_pooler_free(cv_pooler *p) {
    free_strings(p->labels, p->num_labels);
    free_strings(p->label_tokens, p->n_label_tokens);
    free_strings(p->prompt_names, p->n_prompts);
    free_strings(p->prompt_texts, p->n_prompts);
    free(p->method);
    free(p->head);
    free(p->matryoshka_dims);
    *p = (cv_pooler){0};
}

/* ---- requests --------------------------------------------------------------------------------- */

/* The request's task as one of the static names: the engine's own, or score on a one-label
 * classifier (vLLM enables its Scoring API only there). */
static int resolve_task(const cv_pooler *p, const char *asked, const char **out) {
    const bool scores = p->task == CV_TASK_CLASSIFY && !p->tokenwise && p->num_labels == 1;
    *out = cv_pooler_task_name(p);
    if (!asked || !strcmp(asked, *out)) return 0;
    if (scores && !strcmp(asked, "score")) {
        *out = "score";
        return 0;
    }
    return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Unsupported task: '%s' Supported tasks: ('%s'%s)", asked, *out,
                   scores ? ", 'score'" : ",");
}

const char *cv_pooler_task_name(const cv_pooler *p) {
    if (p->task == CV_TASK_CLASSIFY) return p->tokenwise ? "token_classify" : "classify";
    return p->tokenwise ? "token_embed" : "embed";
}

int cv_pooler_resolve(const cv_pooler *p, const cvllm_pooling_params *in, const char *model, cvllm_pooling_params *out) {
    if (in->normalize < -1 || in->normalize > 1)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "normalize must be -1 (the default), 0 or 1, got %d", in->normalize);
    *out = (cvllm_pooling_params){
        .dimensions = in->dimensions ? in->dimensions : p->dimensions,
        .normalize = in->normalize >= 0 ? in->normalize : p->normalize,
    };
    int rc = resolve_task(p, in->task, &out->task);
    if (rc) return rc;
    int32_t d = out->dimensions;
    if (!d) return 0;
    if (p->task == CV_TASK_CLASSIFY || p->tokenwise)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Task %s only supports ['use_activation'] parameters, does not "
                       "support ['dimensions'] parameters", out->task);
    if (!p->matryoshka)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Model \"%s\" does not support matryoshka representation, changing "
                       "output dimensions will lead to poor results.", model);
    if (p->n_matryoshka_dims) {
        for (int32_t i = 0; i < p->n_matryoshka_dims; i++)
            if (p->matryoshka_dims[i] == d) return 0;
        char list[256] = "[";
        for (int32_t i = 0; i < p->n_matryoshka_dims && strlen(list) < sizeof list - 16; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? ", " : "", p->matryoshka_dims[i]);
        strcat(list, "]");
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Model '%s' only supports %s matryoshka dimensions, use other output "
                       "dimensions will lead to poor results.", model, list);
    }
    if (d < 1) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Dimensions must be greater than 0");
    if (d > p->hidden)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Dimensions must not exceed the embedding size %d, got %d", p->hidden, d);
    return 0;
}

void cv_pooler_take(const cv_pooler *p, float *acc, const float *rows, size_t first, size_t n, size_t n_prompt) {
    const size_t H = (size_t)p->hidden;
    switch (p->type) {
    case CV_POOL_LAST:
        if (first + n == n_prompt) memcpy(acc, rows + (n - 1) * H, H * sizeof *acc);
        break;
    case CV_POOL_CLS:
        if (first == 0 && n > 0) memcpy(acc, rows, H * sizeof *acc);
        break;
    case CV_POOL_MEAN:
        for (size_t t = 0; t < n; t++)
            for (size_t i = 0; i < H; i++) acc[i] += rows[t * H + i];
        break;
    case CV_POOL_ALL: { /* row by row at the accumulator's stride */
        const size_t stride = cv_pooler_acc_size(p, 1);
        for (size_t t = 0; t < n; t++) memcpy(acc + (first + t) * stride, rows + t * H, H * sizeof *acc);
        break;
    }
    }
}

static void activate(cv_pool_act act, float *x, size_t n) {
    if (act == CV_ACT_IDENTITY) return;
    if (act == CV_ACT_CLASSIFY && n >= 2) { /* softmax */
        float max = x[0];
        for (size_t i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += exp((double)x[i] - max);
        for (size_t i = 0; i < n; i++) x[i] = (float)(exp((double)x[i] - max) / sum);
        return;
    }
    for (size_t i = 0; i < n; i++) x[i] = act == CV_ACT_TANH ? tanhf(x[i]) : 1.0f / (1.0f + expf(-x[i]));
}

/* out[l] = (head[l] · h − logit_mean) / logit_sigma for every label (out may be h). */
static void head_scores(const cv_pooler *p, const float *h, float *out) {
    const size_t H = (size_t)p->hidden, L = (size_t)p->num_labels;
    double *scores = cv_xmalloc(L * sizeof *scores);
    for (size_t l = 0; l < L; l++) {
        double dot = 0;
        for (size_t i = 0; i < H; i++) dot += (double)p->head[l * H + i] * h[i];
        scores[l] = dot;
    }
    for (size_t l = 0; l < L; l++) out[l] = (float)((scores[l] - p->logit_mean) / p->logit_sigma);
    free(scores);
}

/* F.normalize: x / max(‖x‖₂, 1e-12), over n values. */
static void l2_normalize(float *x, size_t n) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double norm = sqrt(ss) > 1e-12 ? sqrt(ss) : 1e-12;
    for (size_t i = 0; i < n; i++) x[i] = (float)(x[i] / norm);
}

int32_t cv_pooler_width(const cv_pooler *p) { return p->task == CV_TASK_CLASSIFY ? p->num_labels : p->hidden; }

size_t cv_pooler_acc_size(const cv_pooler *p, size_t n_prompt) {
    const size_t row = (size_t)(p->num_labels > p->hidden ? p->num_labels : p->hidden);
    return p->tokenwise ? row * n_prompt : row;
}

size_t cv_pooler_finish(const cv_pooler *p, float *acc, size_t n_prompt, const cvllm_pooling_params *params) {
    const bool classify = p->task == CV_TASK_CLASSIFY;
    const cv_pool_act act = params->task && !strcmp(params->task, "score") ? p->act_score : p->act_classify;
    if (p->tokenwise) { /* each row from its stride to the output's (never past a row not yet read) */
        const size_t stride = cv_pooler_acc_size(p, 1), width = (size_t)cv_pooler_width(p);
        for (size_t t = 0; t < n_prompt; t++) {
            float *in = acc + t * stride, *out = acc + t * width;
            if (classify) {
                head_scores(p, in, out);
                if (params->normalize) activate(act, out, width);
            } else {
                memmove(out, in, width * sizeof *out);
                if (params->normalize) l2_normalize(out, width);
            }
        }
        return n_prompt * width;
    }
    if (p->type == CV_POOL_MEAN)
        for (size_t i = 0; i < (size_t)p->hidden; i++) acc[i] /= (float)n_prompt;
    if (classify) {
        const size_t n = (size_t)p->num_labels;
        head_scores(p, acc, acc);
        if (params->normalize) activate(act, acc, n);
        return n;
    }
    size_t n = params->dimensions ? (size_t)params->dimensions : (size_t)p->hidden;
    if (params->normalize) l2_normalize(acc, n);
    return n;
}
