/*
 * quant_recipe.c — see quant_recipe.h. A tensor is classified by the last components of its name
 * (its module path), whatever prefix the architecture puts in front of the layers
 * ("model.layers.N." or "model.language_model.layers.N.").
 */
#include "loader/quant_recipe.h"

#include <stdbool.h>
#include <string.h>

#include "base/error.h"

const char *cv_quant_recipe_name(cv_quant_recipe r) { return r == CV_RECIPE_DENSE ? "dense" : "moe"; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static bool starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* The module path holds ".experts.<digits>." right before the projection: a routed expert. */
static bool routed_expert(const char *name, const char *proj_start) {
    const char *p = proj_start - 1; /* the '.' before the projection */
    const char *digits_end = p;
    while (p > name && p[-1] >= '0' && p[-1] <= '9') p--;
    if (p == digits_end) return false;
    return (size_t)(p - name) >= strlen(".experts.") && !strncmp(p - strlen(".experts."), ".experts.", strlen(".experts."));
}

char *cv_quant_recipe_expert_group(const char *linear) {
    const char *proj = strrchr(linear, '.');
    if (!proj || !routed_expert(linear, proj + 1)) return NULL;
    const char *digits = proj;
    while (digits[-1] != '.') digits--;
    return cv_xasprintf("%.*s*%s", (int)(digits - linear), linear, proj);
}

cv_quant_action cv_quant_recipe_action(cv_quant_recipe r, const char *name) {
    if (starts_with(name, "mtp.") || starts_with(name, "model.visual.")) return CV_QACT_FLOAT;
    if (ends_with(name, ".mlp.experts.gate_up_proj")) return CV_QACT_FUSED_GATE_UP;
    if (ends_with(name, ".mlp.experts.down_proj")) return CV_QACT_FUSED_DOWN;
    if (!ends_with(name, ".weight")) return CV_QACT_FLOAT;
    static const char *const attention[] = {".self_attn.q_proj.weight", ".self_attn.k_proj.weight",
                                            ".self_attn.v_proj.weight"};
    for (size_t i = 0; i < sizeof attention / sizeof *attention; i++)
        if (ends_with(name, attention[i])) return CV_QACT_LINEAR;
    if (ends_with(name, ".self_attn.o_proj.weight")) return r == CV_RECIPE_DENSE ? CV_QACT_LINEAR : CV_QACT_FLOAT;
    static const char *const mlp[] = {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"};
    for (size_t i = 0; i < sizeof mlp / sizeof *mlp; i++) {
        if (!ends_with(name, mlp[i])) continue;
        const char *proj = name + strlen(name) - strlen(mlp[i]) + 1;
        if (routed_expert(name, proj)) return CV_QACT_LINEAR;
        /* A dense MLP ("….mlp.gate_proj") or the shared expert ("….mlp.shared_expert.gate_proj"). */
        bool in_mlp = strstr(name, ".mlp.") != NULL;
        return in_mlp && r == CV_RECIPE_DENSE ? CV_QACT_LINEAR : CV_QACT_FLOAT;
    }
    return CV_QACT_FLOAT;
}
