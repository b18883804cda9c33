/*
 * quant_recipe.h — which tensors of a Qwen3-family checkpoint `cvllm quantize` turns into int8, by
 * name, for msModelSlim's two recipes:
 *
 *   dense  every linear of attention and MLP: self_attn.{q,k,v,o}_proj and every mlp
 *          {gate,up,down}_proj (a dense MLP's, and on an MoE model the routed experts' and the shared
 *          expert's). msModelSlim's Qwen3 / Qwen3.6-dense W8A8 recipes.
 *   moe    msModelSlim's Qwen3.5/3.6-MoE lab-practice recipe: self_attn.{q,k,v}_proj (o_proj excluded)
 *          and the routed experts, mlp.experts.*.
 *
 * Both leave FLOAT: embeddings, lm_head, norms, the Gated DeltaNet layers (linear_attn.*), the
 * router (mlp.gate) and the shared expert's gate, and everything under mtp.* (the MTP head) and
 * model.visual.* (the vision tower), which are copied as they are.
 *
 * Routed experts are written one linear per expert, as msModelSlim stores them
 * (…mlp.experts.{e}.{gate,up,down}_proj.*): Qwen3-MoE / Qwen3-Next checkpoints already store them
 * so; Qwen3.5/3.6-MoE checkpoints fuse them into mlp.experts.gate_up_proj [E][2I][H] (per expert the
 * gate rows first, then the up rows) and mlp.experts.down_proj [E][H][I], which are split.
 */
#ifndef CV_QUANT_RECIPE_H
#define CV_QUANT_RECIPE_H

typedef enum cv_quant_recipe { CV_RECIPE_DENSE, CV_RECIPE_MOE } cv_quant_recipe;

/* "dense", "moe". */
const char *cv_quant_recipe_name(cv_quant_recipe r);

/* What a recipe does with one tensor of the source checkpoint. */
typedef enum cv_quant_action {
    CV_QACT_FLOAT,          /* copied as it is */
    CV_QACT_LINEAR,         /* PREFIX.weight [N][K]: quantized as the linear PREFIX */
    CV_QACT_FUSED_GATE_UP,  /* PREFIX.gate_up_proj [E][2I][H] → PREFIX.{e}.gate_proj, PREFIX.{e}.up_proj */
    CV_QACT_FUSED_DOWN      /* PREFIX.down_proj [E][H][I] → PREFIX.{e}.down_proj */
} cv_quant_action;

/* The action for tensor `name`; for the fused ones PREFIX is the name without its last component
 * ("…mlp.experts"), for a linear the name without ".weight". */
cv_quant_action cv_quant_recipe_action(cv_quant_recipe r, const char *name);

/* For a routed expert's linear "….experts.E.PROJ", the name of its group "….experts.*.PROJ" (every
 * expert of that layer and projection; cv_xmalloc'd); NULL for any other linear. Calibration folds
 * each expert's inputs into its group too, so an expert that no calibration token was routed to
 * takes its group's range. */
char *cv_quant_recipe_expert_group(const char *linear);

#endif
