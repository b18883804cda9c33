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
#include "models/layers/attention.h"
#include "models/layers/config.h"
#include "models/layers/gdn.h"
#include "models/layers/moe.h"

static const struct {
    const char *name;
    cv_model_loader load;
    cv_model_family family;
} architectures[] = {
    {"Qwen3ForCausalLM", cv_qwen3_load, CV_FAMILY_DENSE},
    /* the original Qwen3-Reranker as vLLM serves it (hf_overrides): the causal model, scored from two
     * of its logits by the pooling runner (engine/pooler.h) */
    {"Qwen3ForSequenceClassification", cv_qwen3_load, CV_FAMILY_DENSE},
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

int cv_model_check_architecture(const char *architecture) {
    cv_model_family family;
    if (cv_model_family_of(architecture, &family)) return 0;
    return cv_fail(CVLLM_ERR_UNSUPPORTED, "unsupported architecture '%s'; supported: %s", architecture,
                   cv_model_supported_architectures());
}

int cv_model_check_split(const cv_model_config *cfg, int tp_size, bool expert_parallel) {
    cv_model_family family;
    if (tp_size <= 1) return 0;
    if (!cv_model_family_of(cfg->architecture, &family)) return cv_model_check_architecture(cfg->architecture);
    int rc;
    nn_attention_dims attention; /* the split does not depend on the gate or the norms' form */
    if ((rc = nn_attention_dims_from_config(cfg, false, false, tp_size, &attention))) return rc;
    nn_gdn_dims gdn;
    if (family >= CV_FAMILY_NEXT && (rc = nn_gdn_dims_from_config(cfg, family == CV_FAMILY_NEXT, tp_size, &gdn)))
        return rc;
    if (!expert_parallel || family == CV_FAMILY_DENSE || family == CV_FAMILY_QWEN3_5_DENSE) return 0;
    int32_t experts;
    if ((rc = nn_cfg_int(cfg, "num_experts", -1, &experts))) return rc;
    return nn_moe_check_expert_split(experts, tp_size);
}

int cv_model_load(const cv_model_load_params *p, cv_model **out) {
    *out = NULL;
    if (!p->config || !p->weights) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "model load needs a config and weights");
    for (size_t i = 0; i < CV_ARRAY_LEN(architectures); i++) {
        if (strcmp(p->config->architecture, architectures[i].name)) continue;
        return architectures[i].load(p, out);
    }
    return cv_model_check_architecture(p->config->architecture);
}

void cv_model_free(cv_model *m) {
    if (m) m->ops->destroy(m);
}
