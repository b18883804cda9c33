/*
 * registry.c — from config.json "architectures" to the model file that implements it.
 *
 * A static table, searched linearly: there are a handful of architectures and one lookup per
 * model load. The supported-names list for error messages and `cvllm --help` is built from the
 * same table, so it cannot fall out of date.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "models/architectures.h"

static const struct {
    const char *name;
    cv_model_loader load;
    cv_model_family family;
} architectures[] = {
    {"Qwen3ForCausalLM", cv_qwen3_load, CV_FAMILY_DENSE},
    {"Qwen3MoeForCausalLM", cv_qwen3_moe_load, CV_FAMILY_MOE},
    {"Qwen3NextForCausalLM", cv_qwen3_hybrid_load, CV_FAMILY_NEXT},
    {"Qwen3_5MoeForConditionalGeneration", cv_qwen3_hybrid_load, CV_FAMILY_QWEN3_5_MOE},
    {"Qwen3_5ForConditionalGeneration", cv_qwen3_hybrid_load, CV_FAMILY_QWEN3_5_DENSE},
    {"Qwen3_5ForCausalLM", cv_qwen3_hybrid_load, CV_FAMILY_QWEN3_5_DENSE},
};

bool cv_model_family_of(const char *architecture, cv_model_family *out) {
    for (size_t i = 0; i < CV_ARRAY_LEN(architectures); i++)
        if (strcmp(architecture, architectures[i].name) == 0) {
            *out = architectures[i].family;
            return true;
        }
    return false;
}

static char supported_list[512];
static pthread_once_t supported_once = PTHREAD_ONCE_INIT;

static void build_supported_list(void) {
    size_t used = 0;
    for (size_t i = 0; i < CV_ARRAY_LEN(architectures) && used < sizeof supported_list; i++)
        used += (size_t)snprintf(supported_list + used, sizeof supported_list - used, "%s%s", i ? ", " : "",
                                 architectures[i].name);
}

const char *cv_model_supported_architectures(void) {
    pthread_once(&supported_once, build_supported_list);
    return supported_list;
}

int cv_model_load(const cv_model_load_params *p, cv_model **out) {
    *out = NULL;
    if (!p->config || !p->weights) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "model load needs a config and weights");
    for (size_t i = 0; i < CV_ARRAY_LEN(architectures); i++) {
        if (strcmp(p->config->architecture, architectures[i].name)) continue;
        return architectures[i].load(p, out);
    }
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "unsupported architecture '%s'; supported: %s", p->config->architecture,
                   cv_model_supported_architectures());
}

void cv_model_free(cv_model *m) {
    if (m) m->ops->destroy(m);
}
