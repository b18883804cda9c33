#!/usr/bin/env python3
"""Writes the quant_model_description.json that cvllm ships beside the configs of the msModelSlim
W8A8 checkpoints the tutorials use (models/vllm-ascend/Qwen3-32B-W8A8,
models/Eco-Tech/Qwen3.6-35B-A3B-w8a8), from their config.json.

The file is msModelSlim's flat map: metadata keys, then one entry per stored
tensor naming its scheme, "FLOAT" for the tensors left unquantized. The recipes:
  qwen3-w8a8      Qwen3 dense, W8A8 static for every linear of attention and MLP: each carries
                  weight, input_scale, input_offset, deq_scale, quant_bias; embeddings, norms and
                  lm_head stay FLOAT.
  qwen3_5-moe-w8a8  Qwen3.5/3.6-MoE lab-practice recipe: W8A8_DYNAMIC (weight, weight_scale,
                  weight_offset) for self_attn q/k/v (o_proj excluded) and the routed experts,
                  stored per expert (gate/up un-fused); everything else FLOAT (Gated DeltaNet,
                  shared expert and its gate, router, o_proj, embeddings, lm_head, norms) and the
                  whole MTP module (mtp.*), whose experts are stored per expert too.
The text model and the MTP module are described; a vision tower is not (the shipped config is the
text config). Tensors are listed in the checkpoint's module order.

usage: tools/gen_quant_description.py RECIPE CONFIG_JSON OUT_JSON
"""
import json
import sys

STATIC = ("weight", "input_scale", "input_offset", "deq_scale", "quant_bias")
DYNAMIC = ("weight", "weight_scale", "weight_offset")


def linear(desc, prefix, scheme):
    """A linear layer's tensors: the quantized set of its scheme, or its float weight."""
    if scheme == "FLOAT":
        desc[prefix + ".weight"] = "FLOAT"
        return
    for suffix in STATIC if scheme == "W8A8" else DYNAMIC:
        desc[prefix + "." + suffix] = scheme


def qwen3_w8a8(cfg):
    desc = {"model_quant_type": "W8A8", "version": "1.0.0", "group_size": 0}
    desc["model.embed_tokens.weight"] = "FLOAT"
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        desc[p + "input_layernorm.weight"] = "FLOAT"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            linear(desc, p + "self_attn." + proj, "W8A8")
        desc[p + "self_attn.q_norm.weight"] = "FLOAT"
        desc[p + "self_attn.k_norm.weight"] = "FLOAT"
        desc[p + "post_attention_layernorm.weight"] = "FLOAT"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            linear(desc, p + "mlp." + proj, "W8A8")
    desc["model.norm.weight"] = "FLOAT"
    if not cfg.get("tie_word_embeddings", False):
        desc["lm_head.weight"] = "FLOAT"
    return desc


def qwen3_5_layer(desc, p, text, full_attention, expert_scheme, attention_scheme):
    desc[p + "input_layernorm.weight"] = "FLOAT"
    if full_attention:
        for proj in ("q_proj", "k_proj", "v_proj"):
            linear(desc, p + "self_attn." + proj, attention_scheme)
        linear(desc, p + "self_attn.o_proj", "FLOAT")
        desc[p + "self_attn.q_norm.weight"] = "FLOAT"
        desc[p + "self_attn.k_norm.weight"] = "FLOAT"
    else:
        for name in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                     "conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"):
            desc[p + "linear_attn." + name] = "FLOAT"
    desc[p + "post_attention_layernorm.weight"] = "FLOAT"
    desc[p + "mlp.gate.weight"] = "FLOAT"
    for e in range(text["num_experts"]):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            linear(desc, "%smlp.experts.%d.%s" % (p, e, proj), expert_scheme)
    for proj in ("gate_proj", "up_proj", "down_proj"):
        linear(desc, p + "mlp.shared_expert." + proj, "FLOAT")
    desc[p + "mlp.shared_expert_gate.weight"] = "FLOAT"


def qwen3_5_moe_w8a8(cfg):
    text = cfg.get("text_config", cfg)
    desc = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0", "group_size": 0}
    root = "model.language_model."
    desc[root + "embed_tokens.weight"] = "FLOAT"
    for l, kind in enumerate(text["layer_types"]):
        qwen3_5_layer(desc, "%slayers.%d." % (root, l), text, kind == "full_attention", "W8A8_DYNAMIC",
                      "W8A8_DYNAMIC")
    desc[root + "norm.weight"] = "FLOAT"
    desc["lm_head.weight"] = "FLOAT"
    mtp_layers = text.get("mtp_num_hidden_layers", 0)
    if mtp_layers:
        for name in ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
            desc["mtp." + name] = "FLOAT"
    for l in range(mtp_layers):
        qwen3_5_layer(desc, "mtp.layers.%d." % l, text, True, "FLOAT", "FLOAT")
    return desc


RECIPES = {"qwen3-w8a8": qwen3_w8a8, "qwen3_5-moe-w8a8": qwen3_5_moe_w8a8}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in RECIPES:
        sys.exit("usage: gen_quant_description.py {%s} CONFIG_JSON OUT_JSON" % ",".join(RECIPES))
    with open(sys.argv[2]) as f:
        cfg = json.load(f)
    desc = RECIPES[sys.argv[1]](cfg)
    with open(sys.argv[3], "w") as f:
        json.dump(desc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
