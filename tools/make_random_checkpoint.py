#!/usr/bin/env python3
"""make_random_checkpoint.py — a random bf16 safetensors checkpoint of a shipped Qwen3 dense config.

Benchmarks compare cvllm with llama.cpp on the *same* weights: this writes a checkpoint folder that
cvllm loads with its real loader (mmap, safetensors), and bench/hf_to_gguf.py converts the same
folder to GGUF for llama.cpp. Values are random bf16 bit patterns of magnitude 2^-7..2^-6 with a
random sign (cheap to draw at 8B scale, and far from f32 denormals, which would slow either engine
for reasons that have nothing to do with its kernels); norm gains are 1.

Usage: make_random_checkpoint.py CONFIG_DIR OUT_DIR [--seed N]
  CONFIG_DIR: a folder with config.json (e.g. models/Qwen/Qwen3-0.6B); its json files are copied.
Needs numpy. Writes one model.safetensors (shards are not needed for a benchmark).
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np


def tensor_plan(cfg):
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


def random_bf16(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(0x3C00)  # sign, 7 mantissa bits, exponent 2^-7


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(os.path.join(args.config_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("architectures") != ["Qwen3ForCausalLM"]:
        sys.exit(f"{args.config_dir}: not a Qwen3ForCausalLM config")
    os.makedirs(args.out_dir, exist_ok=True)
    for name in os.listdir(args.config_dir):
        if name.endswith(".json"):
            shutil.copy(os.path.join(args.config_dir, name), args.out_dir)
    plan = tensor_plan(cfg)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in plan:
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
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
            if kind == "gain":
                f.write(np.full(n, 0x3F80, dtype=np.uint16).tobytes())
                continue
            for start in range(0, n, 1 << 26):  # 128 MiB pieces keep memory flat at 8B scale
                f.write(random_bf16(rng, min(1 << 26, n - start)).tobytes())
    print(f"wrote {path}: {len(plan)} tensors, {offset / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
