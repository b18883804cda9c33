#!/usr/bin/env python3
"""make_random_lora.py — a random PEFT LoRA adapter for a checkpoint, to benchmark serving with one.

Reads the safetensors header(s) of MODEL_DIR (no weights) and writes OUT_DIR/adapter_config.json and
OUT_DIR/adapter_model.safetensors with a bf16 lora_A [r, in] and lora_B [out, r] for every 2-D weight
whose name ends in one of --targets (PEFT's target_modules; default the seven projections of
attention and the MLP), named as PEFT saves them (base_model.model.<module>.lora_A.weight). MTP
weights are left out, as PEFT adapts the model only.

Values are uniform in [-scale, scale] (--scale, default 0.01); the adapter's effect does not matter
for speed, only its shapes.

Usage: make_random_lora.py MODEL_DIR OUT_DIR [--rank 16] [--alpha 32] [--targets q_proj,k_proj,...]
Needs numpy.
"""
import argparse
import json
import os
import struct

import numpy as np


def headers(model_dir):
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            yield json.loads(f.read(n))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("out_dir")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32)
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    args = p.parse_args()
    targets = args.targets.split(",")
    rng = np.random.default_rng(args.seed)
    tensors = {}
    for header in headers(args.model_dir):
        for name, info in header.items():
            if name == "__metadata__" or name.startswith("mtp.") or len(info["shape"]) != 2:
                continue
            module = name[: -len(".weight")] if name.endswith(".weight") else None
            if not module or module.rsplit(".", 1)[-1] not in targets:
                continue
            out, inp = info["shape"]
            tensors[f"base_model.model.{module}.lora_A.weight"] = (args.rank, inp)
            tensors[f"base_model.model.{module}.lora_B.weight"] = (out, args.rank)
    if not tensors:
        raise SystemExit(f"no weight of {args.model_dir} ends in one of {targets}")
    os.makedirs(args.out_dir, exist_ok=True)
    header, offset = {}, 0
    for name, shape in sorted(tensors.items()):
        size = shape[0] * shape[1] * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(args.out_dir, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in sorted(tensors.items()):
            values = rng.uniform(-args.scale, args.scale, size=shape).astype(np.float32)
            f.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    config = {"peft_type": "LORA", "r": args.rank, "lora_alpha": args.alpha, "target_modules": targets,
              "bias": "none", "use_rslora": False, "use_dora": False, "modules_to_save": None,
              "base_model_name_or_path": os.path.abspath(args.model_dir), "task_type": "CAUSAL_LM"}
    with open(os.path.join(args.out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{len(tensors) // 2} modules, rank {args.rank}, {offset / 2**20:.1f} MiB -> {args.out_dir}")


if __name__ == "__main__":
    main()
