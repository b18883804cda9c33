/*
 * pooler.c — see pooler.h.
 */
#include "engine/pooler.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "loader/fileutil.h"

static const char *const TYPE_NAMES[] = {[CV_POOL_LAST] = "LAST", [CV_POOL_CLS] = "CLS", [CV_POOL_MEAN] = "MEAN"};

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
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: pooling type %s is not supported; cvllm pools one vector a prompt: LAST, "
                   "CLS or MEAN", origin, name);
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
    if (json_object_get(j, "pooling_type") && json_object_get(j, "seq_pooling_type"))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Cannot set both `pooling_type` and `seq_pooling_type`");
    json_object_foreach(j, key, v) {
        if (rc || json_is_null(v)) continue;
        if (!strcmp(key, "pooling_type") || !strcmp(key, "seq_pooling_type")) {
            rc = json_is_string(v) ? parse_type(json_string_value(v), origin, &p->type)
                                   : cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: %s must be a string", key);
        } else if (!strcmp(key, "use_activation")) {
            if (!json_is_boolean(v)) rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: use_activation must be a boolean");
            p->normalize = json_is_true(v);
        } else if (!strcmp(key, "dimensions")) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
                rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config: dimensions must be a positive integer");
            else p->dimensions = (int32_t)json_integer_value(v);
        } else if (!strcmp(key, "task")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "embed"))
                rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "pooler_config: task must be \"embed\", the one cvllm runs");
        } else if (!strcmp(key, "normalize")) {
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Parameter `normalize` was removed; use `use_activation` instead.");
        } else {
            rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "pooler_config: %s is not supported (cvllm reads pooling_type, "
                         "seq_pooling_type, use_activation, dimensions and task)", key);
        }
    }
    json_decref(j);
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

/* *ForSequenceClassification: the original Qwen3-Reranker's two label tokens (vLLM's from_2_way_softmax
 * method); a checkpoint with its own score head is another model. */
static int classifier(cv_pooler *p, const cv_model_config *cfg) {
    const json_t *tokens = json_object_get(cfg->root, "classifier_from_token");
    if (json_array_size(tokens) != 2 || !json_is_string(json_array_get(tokens, 0)) ||
        !json_is_string(json_array_get(tokens, 1)))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: cvllm runs sequence classification as the original Qwen3-Reranker: "
                       "config.json (or --hf-overrides) must give classifier_from_token as two tokens, e.g. "
                       "[\"no\", \"yes\"], with is_original_qwen3_reranker; a score.weight head is not supported",
                       cfg->architecture);
    p->task = CV_TASK_CLASSIFY;
    for (int i = 0; i < 2; i++) p->label_tokens[i] = cv_xstrdup(json_string_value(json_array_get(tokens, i)));
    return 0;
}

int cv_pooler_bind_labels(cv_pooler *p, const cv_tokenizer *tok) {
    for (int i = 0; p->task == CV_TASK_CLASSIFY && i < 2; i++)
        if ((p->label_ids[i] = cv_tokenizer_token_to_id(tok, p->label_tokens[i])) < 0)
            return cv_fail(CVLLM_ERR_FORMAT, "classifier_from_token: '%s' is not a token of the tokenizer",
                           p->label_tokens[i]);
    return 0;
}

float cv_pooler_score(const cv_pooler *p, const float *logits, bool normalize) {
    const float x = logits[p->label_ids[1]] - logits[p->label_ids[0]];
    return normalize ? 1.0f / (1.0f + expf(-x)) : x;
}

bool cv_pooler_config_classifies(const cv_model_config *cfg) {
    static const char suffix[] = "ForSequenceClassification";
    const size_t n = strlen(cfg->architecture), k = sizeof suffix - 1;
    return n > k && !strcmp(cfg->architecture + n - k, suffix);
}

int cv_pooler_init(cv_pooler *p, const char *model_dir, const char *pooler_config, const cv_model_config *cfg) {
    *p = (cv_pooler){.type = CV_POOL_LAST, .normalize = true, .hidden = cfg->hidden_size};
    if (cv_pooler_config_classifies(cfg)) {
        int rc = classifier(p, cfg);
        if (!rc && pooler_config) rc = from_option(p, pooler_config);
        if (!rc && (p->type != CV_POOL_LAST || p->dimensions))
            rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "pooler_config: the reranker scores the last token (LAST pooling) and "
                         "has no dimensions");
        if (rc) cv_pooler_free(p);
        return rc;
    }
    int rc = from_folder(p, model_dir);
    if (!rc && pooler_config) rc = from_option(p, pooler_config);
    if (!rc) rc = matryoshka(p, cfg);
    if (rc) cv_pooler_free(p);
    return rc;
}

void cv_pooler_free(cv_pooler *p) {
    for (int i = 0; i < 2; i++) {
        free(p->label_tokens[i]);
        p->label_tokens[i] = NULL;
    }
    free(p->matryoshka_dims);
    p->matryoshka_dims = NULL;
    p->n_matryoshka_dims = 0;
}

/* ---- requests --------------------------------------------------------------------------------- */

int cv_pooler_resolve(const cv_pooler *p, const cvllm_pooling_params *in, const char *model, cvllm_pooling_params *out) {
    if (in->normalize < -1 || in->normalize > 1)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "normalize must be -1 (the default), 0 or 1, got %d", in->normalize);
    *out = (cvllm_pooling_params){
        .dimensions = in->dimensions ? in->dimensions : p->dimensions,
        .normalize = in->normalize >= 0 ? in->normalize : p->normalize,
    };
    int32_t d = out->dimensions;
    if (!d) return 0;
    if (p->task == CV_TASK_CLASSIFY)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Task classify only supports ['use_activation'] parameters, does "
                       "not support ['dimensions'] parameters");
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
    }
}

size_t cv_pooler_finish(const cv_pooler *p, float *acc, size_t n_prompt, const cvllm_pooling_params *params) {
    size_t n = params->dimensions ? (size_t)params->dimensions : (size_t)p->hidden;
    if (p->type == CV_POOL_MEAN)
        for (size_t i = 0; i < (size_t)p->hidden; i++) acc[i] /= (float)n_prompt;
    if (params->normalize) {
        double ss = 0; /* F.normalize: x / max(‖x‖₂, 1e-12) */
        for (size_t i = 0; i < n; i++) ss += (double)acc[i] * acc[i];
        double norm = sqrt(ss) > 1e-12 ? sqrt(ss) : 1e-12;
        for (size_t i = 0; i < n; i++) acc[i] = (float)(acc[i] / norm);
    }
    return n;
}
