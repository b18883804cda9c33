#!/usr/bin/env python3
"""make_random_checkpoint.py — a random bf16 safetensors checkpoint of a shipped Qwen3 config.

Benchmarks compare cvllm with llama.cpp on the *same* weights: this writes a checkpoint folder that
cvllm loads with its real loader (mmap, safetensors), and bench/hf_to_gguf.py converts the same
folder to GGUF for llama.cpp. One tensor plan per architecture (config.json "architectures"):

  Qwen3ForCausalLM                    dense Qwen3 (model.*).
  Qwen3_5MoeForConditionalGeneration  Qwen3.5/3.6-MoE text tower as Hugging Face publishes it:
                                      model.language_model.*, a top-level lm_head,
                                      Gated-DeltaNet layers with the four contiguous input
                                      projections, gated attention, routed experts fused into 3-D
                                      experts.gate_up_proj / experts.down_proj, shared expert. No
                                      mtp.* or model.visual.* tensors: nothing here runs them.
  Qwen3_5ForConditionalGeneration     Qwen3.5/3.6 dense: the same, with a SwiGLU mlp.gate_proj /
                                      up_proj / down_proj of intermediate_size in every layer.
  Qwen3_5ForCausalLM                  the same dense text model saved text-only: model.*, flat
                                      config.

Values: matrices are random bf16 bit patterns of magnitude 2^-7..2^-6 (times --scale, a power of
two) with a random sign — cheap to draw at 35B scale, and far from f32 denormals, which would slow
either engine for reasons that have nothing to do with its kernels. Norm gains are identity in the
convention the model uses: stored 1 for Qwen3 and for the DeltaNet output norm (plain w), stored 0
for Qwen3.5's zero-centred (1+w) norms. The DeltaNet decay parameters follow the usual Mamba-style
initialisation so that the recurrence is stable and neither forgets everything nor nothing:
A_log = log(U[1,16]) (stored f32, as some releases do), dt_bias = softplus⁻¹(dt) with dt
log-uniform in [1e-3, 1e-1].

Usage: make_random_checkpoint.py CONFIG_DIR OUT_DIR [--seed N] [--scale S]
  CONFIG_DIR: a folder with config.json (e.g. models/Qwen/Qwen3-0.6B); its json files are copied.
Needs numpy. Writes one model.safetensors (shards are not needed for a benchmark), tensor by
tensor in bounded pieces, so memory stays flat whatever the model size.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

PIECE = 1 << 26  # elements written at a time (128 MiB of bf16)


def qwen3_plan(cfg):
    """(name, shape, kind) of every tensor of Qwen3ForCausalLM, in file order."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    plan = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "matrix")]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        plan += [
            (p + "input_layernorm.weight", (h,), "gain"),
            (p + "self_attn.q_proj.weight", (q, h), "matrix"),
            (p + "self_attn.k_proj.weight", (kv, h), "matrix"),
            (p + "self_attn.v_proj.weight", (kv, h), "matrix"),
            (p + "self_attn.o_proj.weight", (h, q), "matrix"),
            (p + "self_attn.q_norm.weight", (hd,), "gain"),
            (p + "self_attn.k_norm.weight", (hd,), "gain"),
            (p + "post_attention_layernorm.weight", (h,), "gain"),
            (p + "mlp.gate_proj.weight", (i, h), "matrix"),
            (p + "mlp.up_proj.weight", (i, h), "matrix"),
            (p + "mlp.down_proj.weight", (h, i), "matrix"),
        ]
    plan.append(("model.norm.weight", (h,), "gain"))
    if not cfg.get("tie_word_embeddings", False):
        plan.append(("lm_head.weight", (cfg["vocab_size"], h), "matrix"))
    return plan


def layer_kinds(cfg):
    """"linear_attention" / "full_attention" per layer: layer_types, else every interval-th is full."""
    n = cfg["num_hidden_layers"]
    kinds = cfg.get("layer_types")
    if kinds is None:
        every = cfg.get("full_attention_interval", 4)
        kinds = ["full_attention" if (l + 1) % every == 0 else "linear_attention" for l in range(n)]
    if len(kinds) != n or any(k not in ("linear_attention", "full_attention") for k in kinds):
        sys.exit("make_random_checkpoint: layer_types must name linear_attention or full_attention for each layer")
    return kinds


def qwen3_5_mlp_plan(cfg, m, moe):
    """(name, shape, kind) of one Qwen3.5 MLP at prefix m: the MoE block, or the dense SwiGLU."""
    h = cfg["hidden_size"]
    if not moe:
        i = cfg["intermediate_size"]
        return [(m + "gate_proj.weight", (i, h), "matrix"), (m + "up_proj.weight", (i, h), "matrix"),
                (m + "down_proj.weight", (h, i), "matrix")]
    e, ei, si = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    return [
        (m + "gate.weight", (e, h), "matrix"),
        (m + "experts.gate_up_proj", (e, 2 * ei, h), "matrix"),
        (m + "experts.down_proj", (e, h, ei), "matrix"),
        (m + "shared_expert.gate_proj.weight", (si, h), "matrix"),
        (m + "shared_expert.up_proj.weight", (si, h), "matrix"),
        (m + "shared_expert.down_proj.weight", (h, si), "matrix"),
        (m + "shared_expert_gate.weight", (1, h), "matrix"),
    ]


def qwen3_5_plan(cfg, moe, root):
    """(name, shape, kind) of a Qwen3.5 text model (MoE or dense, under root), in file order."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, kernel = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg.get("linear_conv_kernel_dim", 4)
    key_dim, value_dim = nk * dk, nv * dv
    plan = [(root + "embed_tokens.weight", (v, h), "matrix")]
    for layer, kind in enumerate(layer_kinds(cfg)):
        p = f"{root}layers.{layer}."
        plan.append((p + "input_layernorm.weight", (h,), "zero"))
        if kind == "linear_attention":
            a = p + "linear_attn."
            plan += [
                (a + "in_proj_qkv.weight", (2 * key_dim + value_dim, h), "matrix"),
                (a + "in_proj_z.weight", (value_dim, h), "matrix"),
                (a + "in_proj_b.weight", (nv, h), "matrix"),
                (a + "in_proj_a.weight", (nv, h), "matrix"),
                (a + "conv1d.weight", (2 * key_dim + value_dim, 1, kernel), "matrix"),
                (a + "dt_bias", (nv,), "dt_bias"),
                (a + "A_log", (nv,), "a_log"),
                (a + "norm.weight", (dv,), "gain"),
                (a + "out_proj.weight", (h, value_dim), "matrix"),
            ]
        else:
            a = p + "self_attn."
            plan += [
                (a + "q_proj.weight", (2 * nh * hd, h), "matrix"),  # query and gate, interleaved per head
                (a + "k_proj.weight", (nkv * hd, h), "matrix"),
                (a + "v_proj.weight", (nkv * hd, h), "matrix"),
                (a + "o_proj.weight", (h, nh * hd), "matrix"),
                (a + "q_norm.weight", (hd,), "zero"),
                (a + "k_norm.weight", (hd,), "zero"),
            ]
        plan.append((p + "post_attention_layernorm.weight", (h,), "zero"))
        plan += qwen3_5_mlp_plan(cfg, p + "mlp.", moe)
    plan.append((root + "norm.weight", (h,), "zero"))
    plan.append(("lm_head.weight", (v, h), "matrix"))
    return plan


PLANS = {  # architecture: (plan of the config's text fields, whether they are nested in text_config)
    "Qwen3ForCausalLM": (qwen3_plan, False),
    "Qwen3_5MoeForConditionalGeneration": (lambda cfg: qwen3_5_plan(cfg, True, "model.language_model."), True),
    "Qwen3_5ForConditionalGeneration": (lambda cfg: qwen3_5_plan(cfg, False, "model.language_model."), True),
    "Qwen3_5ForCausalLM": (lambda cfg: qwen3_5_plan(cfg, False, "model."), False),
}


def random_bf16(rng, n, exponent_shift):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    # sign and 7 mantissa bits random, exponent 2^-7 (0x3C00) moved by log2(scale)
    return (bits & np.uint16(0x807F)) | np.uint16(0x3C00 + (exponent_shift << 7))


def bf16_of(values):
    """Round f32 values to bf16 bits (nearest even); the draws below are small vectors."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def draw(kind, rng, n):
    """The bytes of one small (non-matrix) tensor."""
    if kind == "gain":
        return np.full(n, 0x3F80, dtype=np.uint16)  # bf16 1.0
    if kind == "zero":
        return np.zeros(n, dtype=np.uint16)
    if kind == "a_log":
        return np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)
    if kind == "dt_bias":
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), n))
        return bf16_of(np.log(np.expm1(dt)))
    raise AssertionError(kind)


DTYPES = {"a_log": ("F32", 4)}  # every other kind is BF16


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the random matrix magnitudes by this power of two (1/64..64), e.g. to make a "
                         "small test model's logits less uniform")
    args = ap.parse_args()
    shift = round(math.log2(args.scale)) if args.scale > 0 else None
    if shift is None or 2.0 ** shift != args.scale or not -6 <= shift <= 6:
        sys.exit(f"make_random_checkpoint: --scale {args.scale} is not a power of two in [1/64, 64]")
    with open(os.path.join(args.config_dir, "config.json")) as f:
        top = json.load(f)
    arch = (top.get("architectures") or [None])[0]
    if arch not in PLANS:
        sys.exit(f"make_random_checkpoint: {args.config_dir}: architecture {arch} is not one of {', '.join(PLANS)}")
    make_plan, nested = PLANS[arch]
    cfg = {**top, **top.get("text_config", {})} if nested else top
    try:
        plan = make_plan(cfg)
    except KeyError as e:
        sys.exit(f"make_random_checkpoint: {args.config_dir}/config.json lacks {e.args[0]} needed for {arch}")
    os.makedirs(args.out_dir, exist_ok=True)
    for name in os.listdir(args.config_dir):
        if name.endswith(".json"):
            shutil.copy(os.path.join(args.config_dir, name), args.out_dir)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, kind in plan:
        dtype, size = DTYPES.get(kind, ("BF16", 2))
        nbytes = int(np.prod(shape)) * size
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(args.seed)
    path = os.path.join(args.out_dir, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, kind in plan:
            n = int(np.prod(shape))
            if kind != "matrix":
                f.write(draw(kind, rng, n).tobytes())
                continue
            for start in range(0, n, PIECE):
                f.write(random_bf16(rng, min(PIECE, n - start), shift).tobytes())
    print(f"wrote {path}: {len(plan)} tensors, {offset / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
