/*
 * quant.c — what a model folder declares about quantization (see quant.h): the choice between
 * msModelSlim, FP8 and nothing, checked against --quantization, and each linear's scheme.
 *
 * The choice follows vLLM where vLLM decides: a quantization_config's quant_method in config.json
 * is the method (a different --quantization is vLLM's mismatch error, word for word);
 * `--quantization ascend` needs quant_model_description.json (vLLM's "Cannot find the config file
 * for ascend", and its "Found multiple config files" for two), and a quantization_config without a
 * quant_method beside it is vllm-ascend's own marker, not a second method. cvllm adds what vLLM on a
 * CPU cannot do: an msModelSlim folder is recognised by its description file alone, with a log line
 * saying so.
 *
 * Everything the description or quantization_config says that cvllm does not run is refused here,
 * when the folder is opened, so neither the memory estimate nor the model ever sees it: the whole
 * description is scanned once (tensor entries have a dot in their names, metadata keys do not).
 */
#include "loader/quant.h"

#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "loader/fileutil.h"

#define DESCRIPTION_PREFIX "quant_model_description"

struct cv_quant_config {
    cv_quant_method method;
    char *origin;            /* the description's path, or config.json's, for messages */
    json_t *desc;            /* ascend: tensor name → type */
    bool float16_model;      /* config.json's dtype is float16 (int64 deq_scale is then valid) */
    int32_t block;           /* fp8 */
    json_t *not_convert;     /* fp8: modules_to_not_convert (an array of strings) */
};

const char *cv_linear_scheme_name(cv_linear_scheme s) {
    static const char *const names[] = {"FLOAT", "W8A8", "W8A8_DYNAMIC", "FP8_BLOCK"};
    return (unsigned)s < CV_ARRAY_LEN(names) ? names[s] : "?";
}

static int scheme_of_type(const char *type, cv_linear_scheme *out) {
    for (cv_linear_scheme s = CV_SCHEME_FLOAT; s <= CV_SCHEME_W8A8_DYNAMIC; s++)
        if (!strcmp(type, cv_linear_scheme_name(s))) {
            *out = s;
            return 0;
        }
    return -1;
}

void cv_quant_config_free(cv_quant_config *q) {
    if (!q) return;
    json_decref(q->desc);
    json_decref(q->not_convert);
    free(q->origin);
    free(q);
}

cv_quant_method cv_quant_config_method(const cv_quant_config *q) { return q ? q->method : CV_QUANT_NONE; }

int32_t cv_quant_config_block(const cv_quant_config *q) { return q ? q->block : 0; }

const char *cv_quant_config_origin(const cv_quant_config *q) { return q ? q->origin : ""; }

bool cv_quant_config_int64_deq_scale(const cv_quant_config *q) { return q && q->float16_model; }

/* ------------------------------------------------------------------------------------------------ */
/* msModelSlim's description                                                                         */

static int check_metadata(const char *path, const char *key, json_t *v) {
    if (!strcmp(key, "kv_cache_type") || !strcmp(key, "fa_quant_type")) {
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        int rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: %s %s (a quantized %s) is not supported", path, key,
                         text ? text : "?", key[0] == 'k' ? "KV cache" : "attention");
        free(text);
        return rc;
    }
    if (!strcmp(key, "group_size") && !(json_is_integer(v) && json_integer_value(v) == 0))
        return cv_fail(CVLLM_ERR_UNSUPPORTED,
                       "%s: group_size %lld (per-group weights) is not supported; cvllm runs per-channel weights "
                       "(group_size 0)",
                       path, json_is_integer(v) ? (long long)json_integer_value(v) : -1LL);
    if ((!strcmp(key, "optional") || !strcmp(key, "metadata")) && json_object_get(v, "quarot"))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: QuaRot rotations (%s.quarot) are not supported", path, key);
    return 0;
}

static int check_description(const char *path, json_t *desc) {
    if (!json_is_object(desc)) return cv_fail(CVLLM_ERR_FORMAT, "%s: not a JSON object", path);
    const char *key;
    json_t *v;
    json_object_foreach(desc, key, v) {
        int rc;
        if (!strchr(key, '.')) {
            if ((rc = check_metadata(path, key, v))) return rc;
            continue;
        }
        if (!json_is_string(v)) return cv_fail(CVLLM_ERR_FORMAT, "%s: the entry of tensor %s is not a string", path, key);
        cv_linear_scheme s;
        if (scheme_of_type(json_string_value(v), &s))
            return cv_fail(CVLLM_ERR_UNSUPPORTED,
                           "%s: tensor %s is %s, a scheme cvllm does not run (it runs W8A8, W8A8_DYNAMIC and FLOAT)",
                           path, key, json_string_value(v));
    }
    return 0;
}

static int load_description(const char *dir, const char *file, cv_quant_config *q) {
    q->origin = cv_xasprintf("%s/%s", dir, file);
    json_error_t jerr;
    q->desc = json_load_file(q->origin, JSON_REJECT_DUPLICATES, &jerr);
    if (!q->desc)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: invalid JSON (line %d column %d: %s)", q->origin, jerr.line, jerr.column,
                       jerr.text);
    q->method = CV_QUANT_ASCEND;
    return check_description(q->origin, q->desc);
}

static const char *model_quant_type(const cv_quant_config *q) {
    const char *t = json_string_value(json_object_get(q->desc, "model_quant_type"));
    return t ? t : "quantized";
}

/* ------------------------------------------------------------------------------------------------ */
/* config.json's quantization_config (fp8)                                                           */

static int load_fp8(const char *path, json_t *qc, cv_quant_config *q) {
    q->origin = cv_xstrdup(path);
    q->method = CV_QUANT_FP8;
    const char *fmt = json_string_value(json_object_get(qc, "fmt"));
    if (fmt && strcmp(fmt, "e4m3"))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: quantization_config.fmt \"%s\" is not supported (cvllm runs e4m3)",
                       path, fmt);
    const char *act = json_string_value(json_object_get(qc, "activation_scheme"));
    if (act && strcmp(act, "dynamic"))
        return cv_fail(CVLLM_ERR_UNSUPPORTED,
                       "%s: quantization_config.activation_scheme \"%s\" is not supported (cvllm runs FP8 weights "
                       "with the dynamic scheme's checkpoints)",
                       path, act);
    json_t *bs = json_object_get(qc, "weight_block_size");
    if (!bs || json_is_null(bs))
        return cv_fail(CVLLM_ERR_UNSUPPORTED,
                       "%s: quantization_config has no weight_block_size: per-tensor FP8 is not supported (cvllm "
                       "runs block-wise FP8)",
                       path);
    json_t *b0 = json_array_get(bs, 0), *b1 = json_array_get(bs, 1);
    if (json_array_size(bs) != 2 || !json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 1 ||
        json_integer_value(b1) < 1)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: quantization_config.weight_block_size is not a pair of positive integers",
                       path);
    json_int_t rows = json_integer_value(b0), cols = json_integer_value(b1);
    if (rows != cols || rows % 16 || rows > 1 << 20)
        return cv_fail(CVLLM_ERR_UNSUPPORTED,
                       "%s: quantization_config.weight_block_size [%lld, %lld] is not supported (square blocks whose "
                       "edge is a multiple of 16)",
                       path, (long long)rows, (long long)cols);
    q->block = (int32_t)rows;
    json_t *skip = json_object_get(qc, "modules_to_not_convert");
    if (skip && !json_is_null(skip)) {
        size_t i;
        json_t *m;
        bool ok = json_is_array(skip);
        json_array_foreach(skip, i, m) ok = ok && json_is_string(m);
        if (!ok) return cv_fail(CVLLM_ERR_FORMAT, "%s: quantization_config.modules_to_not_convert is not a list of names", path);
        q->not_convert = json_incref(skip);
    }
    return 0;
}

/* Whether `entry` names module `prefix` or a module above it. */
static bool names_module(const char *entry, const char *prefix) {
    size_t n = strlen(entry);
    return !strncmp(prefix, entry, n) && (prefix[n] == '\0' || prefix[n] == '.');
}

/* ------------------------------------------------------------------------------------------------ */
/* The choice                                                                                        */

/* config.json of dir, or NULL when there is none. */
static int read_config(const char *path, json_t **out) {
    *out = NULL;
    if (!cv_path_exists(path)) return 0;
    json_error_t jerr;
    *out = json_load_file(path, 0, &jerr);
    if (!*out)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: invalid JSON (line %d column %d: %s)", path, jerr.line, jerr.column,
                       jerr.text);
    return 0;
}

/* A field of the config's root, else of its text_config (the multimodal wrappers nest the model). */
static json_t *config_field(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : json_object_get(json_object_get(root, "text_config"), key);
}

static bool is_float16(json_t *root) {
    const char *t = json_string_value(config_field(root, "torch_dtype"));
    if (!t) t = json_string_value(config_field(root, "dtype"));
    return t && (!strcmp(t, "float16") || !strcmp(t, "half"));
}

static int choose(const char *dir, const char *flag, json_t *config, char **descs, size_t n_desc,
                  cv_quant_config *q) {
    char *config_path = cv_xasprintf("%s/config.json", dir);
    json_t *qc = config_field(config, "quantization_config");
    const char *method = json_string_value(json_object_get(qc, "quant_method"));
    int rc = 0;
    if (n_desc > 1) {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Found multiple config files for ascend: %s/%s, %s/%s", dir, descs[0],
                     dir, descs[1]);
    } else if (method && n_desc) {
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s declares two quantizations: %s's quantization_config (%s) and %s", dir,
                     "config.json", method, descs[0]);
    } else if (qc && !method && !n_desc) {
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s: quantization_config has no quant_method", config_path);
    } else if (method && flag && strcmp(flag, method)) {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                     "Quantization method specified in the model config (%s) does not match the quantization method "
                     "specified in the `quantization` argument (%s).",
                     method, flag);
    } else if (method && strcmp(method, "fp8")) {
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED,
                     "%s: quantization method '%s' is not supported by cvllm (it loads fp8 and msModelSlim's ascend "
                     "checkpoints)",
                     config_path, method);
    } else if (method) {
        rc = load_fp8(config_path, qc, q);
    } else if (n_desc && flag && strcmp(flag, "ascend")) {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                     "--quantization %s does not match %s: it is an msModelSlim checkpoint (%s); use --quantization "
                     "ascend",
                     flag, dir, descs[0]);
    } else if (n_desc) {
        rc = load_description(dir, descs[0], q);
        if (!rc && !flag)
            cv_info("loader", "%s found: loading an msModelSlim %s checkpoint (as --quantization ascend)", descs[0],
                    model_quant_type(q));
    } else if (flag && !strcmp(flag, "ascend")) {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Cannot find the config file for ascend");
    } else if (flag && !strcmp(flag, "fp8")) {
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED,
                     "--quantization fp8 on an unquantized checkpoint (%s has no quantization_config) asks for online "
                     "quantization, which cvllm does not do: load an FP8 checkpoint (Qwen/Qwen3-*-FP8) or leave out "
                     "the flag",
                     config_path);
    } else if (flag) {
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED,
                     "--quantization %s is not supported by cvllm (it loads fp8 and msModelSlim's ascend checkpoints)",
                     flag);
    }
    free(config_path);
    return rc;
}

int cv_quant_config_load(const char *dir, const char *quantization, cv_quant_config **out) {
    *out = NULL;
    char *config_path = cv_xasprintf("%s/config.json", dir);
    json_t *config;
    int rc = read_config(config_path, &config);
    free(config_path);
    if (rc) return rc;
    size_t n_desc;
    char **descs = cv_list_names(dir, DESCRIPTION_PREFIX, ".json", &n_desc);
    cv_quant_config *q = cv_xcalloc(1, sizeof *q);
    q->float16_model = is_float16(config);
    rc = choose(dir, quantization, config, descs, n_desc, q);
    cv_free_names(descs);
    json_decref(config);
    if (rc || q->method == CV_QUANT_NONE) {
        cv_quant_config_free(q);
        return rc;
    }
    *out = q;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Per linear                                                                                        */

const char *cv_quant_config_tensor_type(const cv_quant_config *q, const char *tensor) {
    return q ? json_string_value(json_object_get(q->desc, tensor)) : NULL;
}

int cv_quant_config_scheme(const cv_quant_config *q, const char *prefix, cv_linear_scheme *out) {
    *out = CV_SCHEME_FLOAT;
    if (!q) return 0;
    if (q->method == CV_QUANT_FP8) {
        size_t i;
        json_t *m;
        json_array_foreach(q->not_convert, i, m) {
            if (names_module(json_string_value(m), prefix)) return 0;
        }
        *out = CV_SCHEME_FP8_BLOCK;
        return 0;
    }
    char name[512];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const char *type = cv_quant_config_tensor_type(q, name);
    if (!type) return cv_fail(CVLLM_ERR_FORMAT, "%s has no entry for tensor %s", q->origin, name);
    int rc = scheme_of_type(type, out);
    assert(rc == 0); /* check_description refused every other type */
    (void)rc;
    return 0;
}

uint64_t cv_linear_scheme_bytes(cv_linear_scheme s, int64_t rows, int64_t cols, int32_t block) {
    const uint64_t codes = (uint64_t)rows * (uint64_t)cols, f32 = sizeof(float);
    switch (s) {
    case CV_SCHEME_W8A8: return codes + (uint64_t)rows * (f32 + sizeof(int32_t)) + 2 * f32;
    case CV_SCHEME_W8A8_DYNAMIC: return codes + (uint64_t)rows * 2 * f32;
    case CV_SCHEME_FP8_BLOCK:
        return codes + (uint64_t)((rows + block - 1) / block) * (uint64_t)((cols + block - 1) / block) * f32;
    default: return 0;
    }
}
