#!/usr/bin/env python3
"""hf_to_gguf.py — convert a Qwen3 dense (Qwen3ForCausalLM) safetensors folder to a bf16 GGUF.

llama.cpp's own converter needs torch and transformers; this one needs only numpy and gguf-py
(the `gguf-py` folder of a llama.cpp checkout, passed with --gguf-py or found through PYTHONPATH),
so the comparison in bench/compare.sh runs llama.cpp on exactly the weights cvllm loads.

What it writes: the qwen3 hyper-parameters (context, embedding, feed-forward length, blocks, heads,
KV heads, key/value length, rope base, RMS eps), a gpt2-style BPE tokenizer with the qwen2
pre-tokenizer (tokens, token types, merges and the bos/eos/pad ids from config.json and
tokenizer.json; vocab rows beyond the tokenizer are [PAD<i>] unused tokens, as the reference
converter does), and every tensor renamed to llama.cpp's names, bf16 as stored (no re-rounding;
f32/f16 tensors are rounded to bf16, norm gains are kept f32).

Usage: hf_to_gguf.py MODEL_DIR OUT.gguf [--gguf-py PATH]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf):
    if hf in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf]
    parts = hf.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[3] in LAYER_NAMES:
        return f"blk.{parts[2]}.{LAYER_NAMES[parts[3]]}"
    sys.exit(f"hf_to_gguf: no llama.cpp name for tensor {hf}")


def safetensors_files(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def read_tensors(path):
    """(name, dtype, shape, memmap view) of every tensor in one safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        yield name, info["dtype"], tuple(info["shape"]), raw[8 + n + begin: 8 + n + end]


def to_numpy(dtype, shape, data, keep_f32):
    if dtype == "BF16":
        bits = data.view(np.uint16).reshape(shape)
        return np.left_shift(bits.astype(np.uint32), 16).view(np.float32) if keep_f32 else bits
    if dtype in ("F32", "F16"):
        f = data.view(np.float32 if dtype == "F32" else np.float16).reshape(shape).astype(np.float32)
        if keep_f32:
            return f
        u = f.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    sys.exit(f"hf_to_gguf: unsupported dtype {dtype}")


def add_tokenizer(w, gguf, model_dir, cfg):
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = dict(tok["model"]["vocab"])
    special = set()
    for t in tok.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
        if t.get("special"):
            special.add(t["id"])
    added = {t["id"] for t in tok.get("added_tokens", [])}
    size = max(cfg["vocab_size"], max(vocab.values()) + 1)
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special
                         else gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    bos = cfg.get("bos_token_id", eos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if bos is not None:
        w.add_bos_token_id(bos)
        w.add_pad_token_id(bos)  # <|endoftext|>, as Qwen's tokenizer_config pads
    w.add_add_bos_token(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", help="path to llama.cpp's gguf-py folder")
    args = ap.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402 (after the path is known)

    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("architectures") != ["Qwen3ForCausalLM"]:
        sys.exit(f"hf_to_gguf: {args.model_dir} is not Qwen3ForCausalLM")
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w = gguf.GGUFWriter(args.out, "qwen3")
    w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    add_tokenizer(w, gguf, args.model_dir, cfg)
    tied = cfg.get("tie_word_embeddings", False)
    count = 0
    for file in safetensors_files(args.model_dir):
        for name, dtype, shape, data in read_tensors(os.path.join(args.model_dir, file)):
            if tied and name == "lm_head.weight":
                continue  # llama.cpp reuses token_embd when output is absent, as HF ties them
            keep_f32 = len(shape) == 1
            arr = to_numpy(dtype, shape, data, keep_f32)
            w.add_tensor(gguf_name(name), arr, raw_dtype=None if keep_f32 else gguf.GGMLQuantizationType.BF16)
            count += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: {count} tensors")


if __name__ == "__main__":
    main()
