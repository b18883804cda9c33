/*
 * config.c — config.json and generation_config.json into plain structs.
 *
 * Hugging Face configs drift between transformers versions, so every field is looked up the way the
 * newest files spell it and then the older way:
 *   - the text model's fields live at the root, or in "text_config" for multimodal wrappers
 *     (Qwen3.5); a field missing from text_config is looked for at the root, because wrappers keep
 *     some (tie_word_embeddings, eos_token_id) there;
 *   - RoPE is "rope_parameters" {rope_theta, rope_type, ...} (transformers >= 5) or the older
 *     top-level "rope_theta" plus "rope_scaling" (null or {type|rope_type, factor, ...});
 *   - the weight type is "dtype" (new) or "torch_dtype" (old);
 *   - eos_token_id is an integer or a list of them;
 *   - head_dim is explicit for Qwen3 (and NOT hidden_size / heads there), derived otherwise.
 * Only the fields every architecture needs are required; a missing or ill-typed one is an error
 * naming the field and the file. Architecture-specific fields are read by the model files from
 * cfg->text, so this file does not grow with every new model.
 */
#include "loader/config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "loader/fileutil.h"

/* A field from the text model's object, else from the root (for multimodal wrappers). */
static json_t *field(const cv_model_config *cfg, const char *key) {
    json_t *v = json_object_get(cfg->text, key);
    if (!v && cfg->text != cfg->root) v = json_object_get(cfg->root, key);
    return v;
}

static int missing(const char *origin, const char *key) {
    return cv_fail(CVLLM_ERR_FORMAT, "%s: missing required field \"%s\"", origin, key);
}

static int bad_type(const char *origin, const char *key, const char *want) {
    return cv_fail(CVLLM_ERR_FORMAT, "%s: field \"%s\" must be %s", origin, key, want);
}

/* A positive int32; `required` decides whether absence (or null) is an error or keeps *out. */
static int get_positive_int(const cv_model_config *cfg, const char *origin, const char *key,
                            bool required, int32_t *out) {
    json_t *v = field(cfg, key);
    if (!v || json_is_null(v)) return required ? missing(origin, key) : 0;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX)
        return bad_type(origin, key, "a positive integer");
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static int get_number(json_t *obj, const char *origin, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad_type(origin, key, "a number");
    *out = json_number_value(v);
    return 0;
}

static int get_bool(const cv_model_config *cfg, const char *origin, const char *key, bool *out) {
    json_t *v = field(cfg, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad_type(origin, key, "true or false");
    *out = json_is_true(v);
    return 0;
}

/* A token id field that may be absent, null, an integer or a list of integers. */
static int parse_token_ids(json_t *v, const char *origin, const char *key, int32_t *ids, int *n) {
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad_type(origin, key, "a token id (non-negative integer) or a list of them");
        ids[(*n)++] = (int32_t)json_integer_value(v);
        return 0;
    }
    if (!json_is_array(v)) return bad_type(origin, key, "an integer or a list of integers");
    if (json_array_size(v) > CV_MAX_EOS)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: field \"%s\" lists %zu ids (at most %d supported)", origin,
                       key, json_array_size(v), CV_MAX_EOS);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return bad_type(origin, key, "an integer or a list of integers");
        ids[(*n)++] = (int32_t)json_integer_value(e);
    }
    return 0;
}

static int parse_dtype(const cv_model_config *cfg, const char *origin, cv_dtype *out) {
    const char *key = "dtype";
    json_t *v = field(cfg, key);
    if (!v || json_is_null(v)) v = field(cfg, key = "torch_dtype");
    *out = CV_DTYPE_BF16;
    if (!v || json_is_null(v)) return 0;
    static const struct {
        const char *name;
        cv_dtype dtype;
    } names[] = {{"bfloat16", CV_DTYPE_BF16}, {"float16", CV_DTYPE_F16}, {"half", CV_DTYPE_F16},
                 {"float32", CV_DTYPE_F32},   {"float", CV_DTYPE_F32}};
    if (!json_is_string(v)) return bad_type(origin, key, "a string");
    for (size_t i = 0; i < CV_ARRAY_LEN(names); i++)
        if (!strcmp(json_string_value(v), names[i].name)) {
            *out = names[i].dtype;
            return 0;
        }
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: field \"%s\" is \"%s\" (expected bfloat16, float16 or "
                   "float32)", origin, key, json_string_value(v));
}

static int parse_rope_type(json_t *scaling, const char *origin, cv_rope_type *out) {
    json_t *t = json_object_get(scaling, "rope_type");
    if (!t) t = json_object_get(scaling, "type");
    if (!t || json_is_null(t)) {
        *out = CV_ROPE_DEFAULT;
        return 0;
    }
    if (!json_is_string(t)) return bad_type(origin, "rope_type", "a string");
    const char *s = json_string_value(t);
    /* "mrope" (Qwen2-VL's spelling) is plain RoPE for text-only positions. */
    if (!strcmp(s, "default") || !strcmp(s, "mrope")) *out = CV_ROPE_DEFAULT;
    else if (!strcmp(s, "linear")) *out = CV_ROPE_LINEAR;
    else if (!strcmp(s, "dynamic")) *out = CV_ROPE_DYNAMIC;
    else if (!strcmp(s, "yarn")) *out = CV_ROPE_YARN;
    else return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: rope_type \"%s\" is not supported", origin, s);
    return 0;
}

/* The scaling fields shared by rope_scaling and rope_parameters. */
static int parse_rope_scaling(json_t *obj, const char *origin, cv_rope_config *rope) {
    if (!json_is_object(obj)) return bad_type(origin, "rope_scaling", "an object or null");
    int rc = parse_rope_type(obj, origin, &rope->type);
    if (!rc) rc = get_number(obj, origin, "factor", &rope->factor);
    if (!rc) rc = get_number(obj, origin, "beta_fast", &rope->beta_fast);
    if (!rc) rc = get_number(obj, origin, "beta_slow", &rope->beta_slow);
    if (!rc) rc = get_number(obj, origin, "attention_factor", &rope->attention_factor);
    if (!rc) rc = get_number(obj, origin, "partial_rotary_factor", &rope->partial_rotary_factor);
    json_t *omp = json_object_get(obj, "original_max_position_embeddings");
    if (!rc && omp && !json_is_null(omp)) {
        if (!json_is_integer(omp) || json_integer_value(omp) <= 0 || json_integer_value(omp) > INT32_MAX)
            return bad_type(origin, "original_max_position_embeddings", "a positive integer");
        rope->original_max_position = (int32_t)json_integer_value(omp);
    }
    return rc;
}

static int parse_rope(cv_model_config *cfg, const char *origin) {
    cv_rope_config *rope = &cfg->rope;
    *rope = (cv_rope_config){.type = CV_ROPE_DEFAULT, .theta = 10000.0, .factor = 1.0, .beta_fast = 32.0,
                             .beta_slow = 1.0, .partial_rotary_factor = 1.0};
    /* Top-level partial_rotary_factor (Qwen3-Next); rope_parameters may override it. */
    json_t *prf = field(cfg, "partial_rotary_factor");
    if (prf && !json_is_null(prf)) {
        if (!json_is_number(prf)) return bad_type(origin, "partial_rotary_factor", "a number");
        rope->partial_rotary_factor = json_number_value(prf);
    }
    int rc;
    json_t *params = field(cfg, "rope_parameters");
    if (params && !json_is_null(params)) {
        rc = parse_rope_scaling(params, origin, rope);
        if (!rc) rc = get_number(params, origin, "rope_theta", &rope->theta);
    } else {
        json_t *theta = field(cfg, "rope_theta");
        rc = 0;
        if (theta && !json_is_null(theta)) {
            if (!json_is_number(theta)) return bad_type(origin, "rope_theta", "a number");
            rope->theta = json_number_value(theta);
        }
        json_t *scaling = field(cfg, "rope_scaling");
        if (scaling && !json_is_null(scaling)) rc = parse_rope_scaling(scaling, origin, rope);
    }
    if (rc) return rc;
    if (!(rope->theta > 0) || !isfinite(rope->theta)) return bad_type(origin, "rope_theta", "positive");
    if (!(rope->factor > 0) || !isfinite(rope->factor)) return bad_type(origin, "factor", "positive");
    if (!(rope->partial_rotary_factor > 0 && rope->partial_rotary_factor <= 1))
        return bad_type(origin, "partial_rotary_factor", "in (0, 1]");
    if (rope->type == CV_ROPE_YARN && rope->original_max_position == 0)
        rope->original_max_position = cfg->max_position_embeddings;
    return 0;
}

static void copy_string(json_t *v, char *dst, size_t cap) {
    if (json_is_string(v)) snprintf(dst, cap, "%s", json_string_value(v));
}

static int parse_identity(cv_model_config *cfg, const char *origin) {
    json_t *archs = json_object_get(cfg->root, "architectures");
    if (!json_is_array(archs) || json_array_size(archs) == 0 || !json_is_string(json_array_get(archs, 0)))
        return archs ? bad_type(origin, "architectures", "a non-empty list of strings")
                     : missing(origin, "architectures");
    copy_string(json_array_get(archs, 0), cfg->architecture, sizeof cfg->architecture);
    copy_string(json_object_get(cfg->root, "model_type"), cfg->model_type, sizeof cfg->model_type);
    return 0;
}

static int parse_sizes(cv_model_config *cfg, const char *origin) {
    int rc = get_positive_int(cfg, origin, "hidden_size", true, &cfg->hidden_size);
    if (!rc) rc = get_positive_int(cfg, origin, "num_hidden_layers", true, &cfg->num_hidden_layers);
    if (!rc) rc = get_positive_int(cfg, origin, "num_attention_heads", true, &cfg->num_attention_heads);
    if (!rc) rc = get_positive_int(cfg, origin, "vocab_size", true, &cfg->vocab_size);
    if (!rc) rc = get_positive_int(cfg, origin, "max_position_embeddings", true,
                                   &cfg->max_position_embeddings);
    /* MoE text configs (Qwen3.5) have no dense intermediate_size: 0 means "none". */
    if (!rc) rc = get_positive_int(cfg, origin, "intermediate_size", false, &cfg->intermediate_size);
    cfg->num_key_value_heads = cfg->num_attention_heads;
    if (!rc) rc = get_positive_int(cfg, origin, "num_key_value_heads", false, &cfg->num_key_value_heads);
    if (rc) return rc;
    cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    rc = get_positive_int(cfg, origin, "head_dim", false, &cfg->head_dim);
    if (rc) return rc;
    if (cfg->head_dim == 0)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: hidden_size %d is smaller than num_attention_heads %d and "
                       "there is no head_dim", origin, cfg->hidden_size, cfg->num_attention_heads);
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        return cv_fail(CVLLM_ERR_FORMAT,
                       "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", origin,
                       cfg->num_attention_heads, cfg->num_key_value_heads);
    cfg->rms_norm_eps = 1e-6;
    rc = get_number(cfg->text, origin, "rms_norm_eps", &cfg->rms_norm_eps);
    if (!rc && !(cfg->rms_norm_eps > 0)) rc = bad_type(origin, "rms_norm_eps", "positive");
    return rc;
}

static int parse_tokens(cv_model_config *cfg, const char *origin) {
    int32_t bos[CV_MAX_EOS];
    int n_bos;
    int rc = parse_token_ids(field(cfg, "bos_token_id"), origin, "bos_token_id", bos, &n_bos);
    if (rc) return rc;
    cfg->bos_token_id = n_bos ? bos[0] : -1;
    return parse_token_ids(field(cfg, "eos_token_id"), origin, "eos_token_id", cfg->eos_token_ids,
                           &cfg->n_eos_token_ids);
}

int cv_model_config_parse(const char *json, size_t len, const char *origin, cv_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    cfg->root = json_loadb(json, len, 0, &jerr);
    if (!cfg->root)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: invalid JSON (line %d column %d: %s)", origin, jerr.line,
                       jerr.column, jerr.text);
    int rc = 0;
    if (!json_is_object(cfg->root)) rc = bad_type(origin, "(top level)", "a JSON object");
    if (!rc) {
        json_t *text = json_object_get(cfg->root, "text_config");
        if (text && !json_is_null(text) && !json_is_object(text))
            rc = bad_type(origin, "text_config", "an object");
        cfg->text = json_is_object(text) ? text : cfg->root;
    }
    if (!rc) rc = parse_identity(cfg, origin);
    if (!rc) rc = parse_sizes(cfg, origin);
    if (!rc) rc = parse_rope(cfg, origin);
    if (!rc) rc = get_bool(cfg, origin, "tie_word_embeddings", &cfg->tie_word_embeddings);
    if (!rc) rc = get_bool(cfg, origin, "attention_bias", &cfg->attention_bias);
    if (!rc) rc = parse_dtype(cfg, origin, &cfg->torch_dtype);
    if (!rc) rc = parse_tokens(cfg, origin);
    if (rc) cv_model_config_free(cfg);
    return rc;
}

void cv_model_config_free(cv_model_config *cfg) {
    json_decref(cfg->root);
    cfg->root = cfg->text = NULL;
}

/* config.json's text with the overrides laid over it (see cv_model_config_load) into *out. */
static int overridden(const char *text, size_t len, const char *path, const char *overrides, char **out) {
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err), *over = json_loads(overrides, 0, &err);
    int rc = 0;
    *out = NULL;
    if (!json_is_object(over)) {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--hf-overrides must be a JSON object: %s", over ? overrides : err.text);
    } else if (!json_is_object(root)) {
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s: not a JSON object", path);
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(over, key, v) {
            json_t *sub = json_object_get(root, key);
            if (!strcmp(key, "text_config") && json_is_object(sub) && json_is_object(v)) json_object_update(sub, v);
            else json_object_set(root, key, v);
        }
        *out = json_dumps(root, JSON_COMPACT);
    }
    json_decref(root);
    json_decref(over);
    return rc;
}

int cv_model_config_load(const char *dir, const char *overrides, cv_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    char *path = cv_xasprintf("%s/config.json", dir);
    size_t len;
    char *text = cv_read_file(path, &len);
    int rc = 0;
    if (!text) {
        rc = cv_fail(errno == ENOENT ? CVLLM_ERR_NOT_FOUND : CVLLM_ERR_IO, "%s: %s", path,
                     strerror(errno));
    } else if (overrides) {
        char *merged, *origin = cv_xasprintf("%s with --hf-overrides", path);
        if (!(rc = overridden(text, len, path, overrides, &merged)))
            rc = cv_model_config_parse(merged, strlen(merged), origin, cfg);
        free(merged);
        free(origin);
    } else {
        rc = cv_model_config_parse(text, len, path, cfg);
    }
    free(text);
    free(path);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* generation_config.json                                                                           */

static int gen_float(json_t *root, const char *origin, const char *key, bool *has, float *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad_type(origin, key, "a number");
    *has = true;
    *out = (float)json_number_value(v);
    return 0;
}

static int gen_int(json_t *root, const char *origin, const char *key, bool *has, int32_t *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX)
        return bad_type(origin, key, "an integer");
    *has = true;
    *out = (int32_t)json_integer_value(v);
    return 0;
}

int cv_generation_config_parse(const char *json, size_t len, const char *origin,
                               cv_generation_config *gen) {
    memset(gen, 0, sizeof *gen);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: invalid JSON (line %d column %d: %s)", origin, jerr.line,
                       jerr.column, jerr.text);
    int rc = json_is_object(root) ? 0 : bad_type(origin, "(top level)", "a JSON object");
    if (!rc)
        rc = parse_token_ids(json_object_get(root, "eos_token_id"), origin, "eos_token_id",
                             gen->eos_token_ids, &gen->n_eos_token_ids);
    if (!rc) rc = gen_float(root, origin, "temperature", &gen->has_temperature, &gen->temperature);
    if (!rc) rc = gen_float(root, origin, "top_p", &gen->has_top_p, &gen->top_p);
    if (!rc) rc = gen_float(root, origin, "min_p", &gen->has_min_p, &gen->min_p);
    if (!rc)
        rc = gen_float(root, origin, "repetition_penalty", &gen->has_repetition_penalty,
                       &gen->repetition_penalty);
    if (!rc) rc = gen_int(root, origin, "top_k", &gen->has_top_k, &gen->top_k);
    if (!rc) rc = gen_int(root, origin, "max_new_tokens", &gen->has_max_new_tokens, &gen->max_new_tokens);
    json_decref(root);
    if (rc) memset(gen, 0, sizeof *gen);
    return rc;
}

int cv_generation_config_load(const char *dir, cv_generation_config *gen) {
    memset(gen, 0, sizeof *gen);
    char *path = cv_xasprintf("%s/generation_config.json", dir);
    size_t len;
    char *text = cv_read_file(path, &len);
    int rc = 0;
    if (text) {
        rc = cv_generation_config_parse(text, len, path, gen);
        free(text);
    } else if (errno != ENOENT) {
        rc = cv_fail(CVLLM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    free(path);
    return rc;
}
