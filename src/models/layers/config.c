/*
 * config.c — see config.h. Integers must fit int32 and be positive, booleans must be JSON booleans
 * and layer lists must name existing layers: a wrong type is an error, never read as the default.
 */
#include "models/layers/config.h"

#include <jansson.h>
#include <string.h>

#include "base/error.h"

int nn_cfg_int(const cv_model_config *cfg, const char *key, int32_t def, int32_t *out) {
    json_t *v = json_object_get(cfg->text, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return cv_fail(CVLLM_ERR_FORMAT, "config.json: missing required field \"%s\" for %s", key,
                                    cfg->architecture);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX)
        return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" must be a positive integer", key);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

int nn_cfg_bool(const cv_model_config *cfg, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(cfg->text, key);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

int nn_cfg_layer_list(const cv_model_config *cfg, const char *key, int32_t n_layers, bool *in) {
    memset(in, 0, (size_t)n_layers * sizeof *in);
    json_t *v = json_object_get(cfg->text, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" must be a list of layer indices", key);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= n_layers)
            return cv_fail(CVLLM_ERR_FORMAT, "config.json: field \"%s\" entry %zu is not a layer index in [0, %d)", key,
                           i, n_layers);
        in[json_integer_value(e)] = true;
    }
    return 0;
}

static cv_rope_kind rope_kind(cv_rope_type t) {
    switch (t) {
    case CV_ROPE_LINEAR: return CV_ROPE_KIND_LINEAR;
    case CV_ROPE_DYNAMIC: return CV_ROPE_KIND_DYNAMIC;
    case CV_ROPE_YARN: return CV_ROPE_KIND_YARN;
    default: return CV_ROPE_KIND_DEFAULT;
    }
}

int nn_init_rope(cv_rope *r, const cv_rope_config *rc, int32_t head_dim) {
    cv_rope_params p = {
        .kind = rope_kind(rc->type),
        .theta = rc->theta,
        .factor = rc->factor,
        .original_max_position = rc->original_max_position,
        .beta_fast = rc->beta_fast,
        .beta_slow = rc->beta_slow,
        .attention_factor = rc->attention_factor,
        .rot_dim = (int32_t)(head_dim * rc->partial_rotary_factor),
    };
    int rc_ = cv_rope_init(r, &p);
    return rc_ ? cv_fail_prefix(rc_, "config.json rope") : 0;
}
