#!/usr/bin/env python3
"""hf_to_gguf.py — convert a Qwen3 safetensors folder to a bf16 GGUF that llama.cpp runs.

llama.cpp's own converter needs torch and transformers; this one needs only numpy and gguf-py
(the `gguf-py` folder of a llama.cpp checkout, passed with --gguf-py or found through PYTHONPATH),
so the benchmarks (bench/compare.py, bench/hybrid_compare.py) run llama.cpp on exactly the weights
cvllm loads. Architectures (config.json "architectures"); anything else is refused in one line:

  Qwen3ForCausalLM → "qwen3". Every tensor renamed, bf16 as stored.
  Qwen3_5MoeForConditionalGeneration → "qwen35moe" (Qwen3.5/3.6-MoE text tower; model.visual.* and
  mtp.* are left out). llama.cpp's graph wants the checkpoint rearranged, and this is where a
  conversion goes wrong silently, so every change is listed:
    * (1+w) RMSNorm gains (input/post-attention/final norms, q_norm, k_norm) are stored as 1+w in
      f32 — llama.cpp multiplies by the gain as is; the DeltaNet output norm is a plain gain, kept.
    * A_log becomes ssm_a = −exp(A_log) (f32); dt_bias becomes ssm_dt.bias (f32).
    * conv1d [C,1,K] loses its middle axis (f32, as llama.cpp keeps it).
    * DeltaNet value heads: Hugging Face orders them grouped by key head (value head j uses key
      head j // (nv/nk)); ggml broadcasts key heads tiled (j uses j % nk). So every per-value-head
      axis — the v rows of in_proj_qkv and of conv1d, the rows of in_proj_z, in_proj_b, in_proj_a,
      A_log, dt_bias, and the columns of out_proj — is permuted from [k][r] to [r][k] order.
      The q/k rows and the per-head norm gain (shared by all heads) stay.
    * Fused experts gate_up_proj [E, 2I, H] split into ffn_gate_exps and ffn_up_exps [E, I, H]
      (gate rows first); down_proj [E, H, I] is already [out, in] per expert. Per-expert tensors
      (experts.{e}.{gate,up,down}_proj.weight, as some releases store them) are stacked instead.
    * The router and the shared-expert gate are stored f32 (llama.cpp's converter keeps them
      unquantised); values are unchanged, bf16 widens exactly.
    * The gated q_proj ([q_h | gate_h] per head) needs nothing: llama.cpp reads it the same way.
  Hyper-parameters: the qwen3 set plus experts, expert widths, ssm.{conv_kernel, state_size,
  group_count, time_step_rank, inner_size}, full_attention_interval (layer_types must follow it:
  llama.cpp derives the layer kinds from it), rope dimension count (head_dim·partial_rotary_factor)
  and the interleaved-MRoPE sections (text positions are equal in every section, so this is plain
  partial RoPE for text, as cvllm computes it).

Both: a gpt2-style BPE tokenizer with the qwen2 pre-tokenizer from tokenizer.json (of MODEL_DIR or
--tokenizer DIR); vocabulary rows beyond the tokenizer are [PAD<i>] unused tokens, as the reference
converter does; bos/eos/pad ids come from config.json unless the tokenizer lacks them (a random
Qwen3.6-shaped checkpoint run with the Qwen3 tokenizer), then from tokenizer_config.json.

--rerank NO,YES (Qwen3 only) makes llama.cpp's Qwen3 reranker, as its converter does for the original
Qwen3-Reranker: RANK pooling, classifier labels ["yes", "no"] and cls.output.weight, the output
head's rows of YES and NO (token strings of tokenizer.json). llama.cpp scores a pair with the softmax
of those two logits at the last token, p(yes) = sigmoid(logit(yes) − logit(no)): cvllm's score of
the same model served with `--hf-overrides '{"architectures": ["Qwen3ForSequenceClassification"],
"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}'`.

Memory: tensor infos are written first, then each tensor is computed from the memory-mapped
checkpoint and written before the next is touched, so the peak is about one tensor (½ GiB for a
Qwen3.6 expert stack), never the model.

Usage: hf_to_gguf.py MODEL_DIR OUT.gguf [--gguf-py PATH] [--tokenizer DIR] [--rerank NO,YES]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def die(msg):
    sys.exit(f"hf_to_gguf: {msg}")


# ---- reading the checkpoint -------------------------------------------------------------------

class Checkpoint:
    """Every tensor of a (possibly sharded) safetensors folder, memory-mapped, by name."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.tensors = {}  # name -> (dtype, shape, bytes)
        self.order = []
        for file in files:
            path = os.path.join(model_dir, file)
            if not os.path.exists(path):
                die(f"{path} does not exist")
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            raw = np.memmap(path, dtype=np.uint8, mode="r")
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                self.tensors[name] = (info["dtype"], tuple(info["shape"]), raw[8 + n + begin: 8 + n + end])
                self.order.append(name)

    def has(self, name):
        return name in self.tensors

    def expect(self, name, shape):
        """Checks that `name` exists with `shape` (config-derived) before anything is written."""
        if name not in self.tensors:
            die(f"tensor {name} is missing")
        if self.tensors[name][1] != tuple(shape):
            die(f"tensor {name} has shape {list(self.tensors[name][1])}, config.json implies {list(shape)}")
        return tuple(shape)

    def bf16(self, name):
        """bf16 bits; stored bf16 is a view (no copy), f32/f16 are rounded to nearest even."""
        dtype, shape, data = self.tensors[name]
        if dtype == "BF16":
            return data.view(np.uint16).reshape(shape)
        u = self.f32(name).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    def f32(self, name):
        dtype, shape, data = self.tensors[name]
        if dtype == "BF16":
            return np.left_shift(data.view(np.uint16).astype(np.uint32), 16).view(np.float32).reshape(shape)
        if dtype in ("F32", "F16"):
            return data.view(np.float32 if dtype == "F32" else np.float16).reshape(shape).astype(np.float32)
        die(f"tensor {name} has unsupported dtype {dtype}")


# ---- one output tensor -------------------------------------------------------------------------

class Out:
    """A GGUF tensor: its name, numpy-order shape, type ("BF16" or "F32") and how to compute it."""

    def __init__(self, name, shape, kind, make):
        self.name, self.shape, self.kind, self.make = name, tuple(shape), kind, make


def copy_bf16(ck, src, name, shape):
    return Out(name, ck.expect(src, shape), "BF16", lambda: ck.bf16(src))


def as_f32(ck, src, name, shape, fn=lambda a: a):
    return Out(name, shape, "F32", lambda: fn(ck.f32(src)).reshape(shape))


# ---- Qwen3 dense -------------------------------------------------------------------------------

QWEN3_LAYER_NAMES = {
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
QWEN3_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def qwen3_name(hf):
    if hf in QWEN3_GLOBAL_NAMES:
        return QWEN3_GLOBAL_NAMES[hf]
    parts = hf.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[3] in QWEN3_LAYER_NAMES:
        return f"blk.{parts[2]}.{QWEN3_LAYER_NAMES[parts[3]]}"
    die(f"no llama.cpp name for tensor {hf}")


def transformer_params(w, cfg, hd):
    """The hyper-parameters every Qwen3 variant writes the same way."""
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)


def qwen3_params(w, gguf, cfg):
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    transformer_params(w, cfg, hd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))


def qwen3_tensors(ck, cfg):
    tied = cfg.get("tie_word_embeddings", False)
    outs = []
    for name in ck.order:
        if tied and name == "lm_head.weight":
            continue  # llama.cpp reuses token_embd when output is absent, as HF ties them
        shape = ck.tensors[name][1]
        if len(shape) == 1:  # norm gains: llama.cpp wants f32
            outs.append(as_f32(ck, name, qwen3_name(name), shape))
        else:
            outs.append(copy_bf16(ck, name, qwen3_name(name), shape))
    return outs


# ---- Qwen3.5/3.6-MoE ---------------------------------------------------------------------------

def tiled_heads(a, axis, n_k, n_v, width):
    """Value heads along `axis` (each `width` wide) from grouped [k][r] to tiled [r][k] order."""
    shape = a.shape
    grouped = a.reshape(shape[:axis] + (n_k, n_v // n_k, width) + shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(grouped, axis, axis + 1)).reshape(shape)


def tiled_v_rows(a, key_dim, n_k, n_v, dv):
    """[q | k | v] rows (or channels): only the v part is per value head."""
    return np.concatenate([a[:2 * key_dim], tiled_heads(a[2 * key_dim:], 0, n_k, n_v, dv)])


def check_layer_schedule(cfg):
    """llama.cpp derives the layer kinds from full_attention_interval; layer_types must agree."""
    every = cfg.get("full_attention_interval", 4)
    implied = ["full_attention" if (l + 1) % every == 0 else "linear_attention"
               for l in range(cfg["num_hidden_layers"])]
    kinds = cfg.get("layer_types") or implied
    if kinds != implied:
        die(f"layer_types does not follow full_attention_interval={every}, which is all llama.cpp can express")
    return kinds


def qwen35moe_params(w, gguf, cfg):
    rope = cfg.get("rope_parameters") or {}
    hd = cfg["head_dim"]
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    sections = list(rope.get("mrope_section", [11, 11, 10]))[:4]
    transformer_params(w, cfg, hd)
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_rope_dimension_count(int(hd * partial))
    w.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg.get("linear_conv_kernel_dim", 4))
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))


def deltanet_tensors(ck, cfg, hf, blk):
    h = cfg["hidden_size"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, kern = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg.get("linear_conv_kernel_dim", 4)
    kd, vd = nk * dk, nv * dv
    cd = 2 * kd + vd
    ck.expect(hf + "in_proj_qkv.weight", (cd, h))
    ck.expect(hf + "conv1d.weight", (cd, 1, kern))
    for name, shape in (("in_proj_z.weight", (vd, h)), ("in_proj_b.weight", (nv, h)), ("in_proj_a.weight", (nv, h)),
                        ("A_log", (nv,)), ("dt_bias", (nv,)), ("norm.weight", (dv,)), ("out_proj.weight", (h, vd))):
        ck.expect(hf + name, shape)
    per_head = lambda a: tiled_heads(a, 0, nk, nv, 1)  # noqa: E731
    rows = lambda src, width: lambda: tiled_heads(ck.bf16(hf + src), 0, nk, nv, width)  # noqa: E731
    return [
        Out(blk + "attn_qkv.weight", (cd, h), "BF16",
            lambda: tiled_v_rows(ck.bf16(hf + "in_proj_qkv.weight"), kd, nk, nv, dv)),
        Out(blk + "attn_gate.weight", (vd, h), "BF16", rows("in_proj_z.weight", dv)),
        Out(blk + "ssm_beta.weight", (nv, h), "BF16", rows("in_proj_b.weight", 1)),
        Out(blk + "ssm_alpha.weight", (nv, h), "BF16", rows("in_proj_a.weight", 1)),
        as_f32(ck, hf + "conv1d.weight", blk + "ssm_conv1d.weight", (cd, kern),
               lambda a: tiled_v_rows(a.reshape(cd, kern), kd, nk, nv, dv)),
        as_f32(ck, hf + "dt_bias", blk + "ssm_dt.bias", (nv,), per_head),
        as_f32(ck, hf + "A_log", blk + "ssm_a", (nv,), lambda a: per_head(-np.exp(a))),
        as_f32(ck, hf + "norm.weight", blk + "ssm_norm.weight", (dv,)),
        Out(blk + "ssm_out.weight", (h, vd), "BF16",
            lambda: tiled_heads(ck.bf16(hf + "out_proj.weight"), 1, nk, nv, dv)),
    ]


def attention_tensors(ck, cfg, hf, blk):
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    plus_one = lambda a: a + np.float32(1)  # noqa: E731
    ck.expect(hf + "q_norm.weight", (hd,))
    ck.expect(hf + "k_norm.weight", (hd,))
    return [
        copy_bf16(ck, hf + "q_proj.weight", blk + "attn_q.weight", (2 * q, h)),
        copy_bf16(ck, hf + "k_proj.weight", blk + "attn_k.weight", (kv, h)),
        copy_bf16(ck, hf + "v_proj.weight", blk + "attn_v.weight", (kv, h)),
        copy_bf16(ck, hf + "o_proj.weight", blk + "attn_output.weight", (h, q)),
        as_f32(ck, hf + "q_norm.weight", blk + "attn_q_norm.weight", (hd,), plus_one),
        as_f32(ck, hf + "k_norm.weight", blk + "attn_k_norm.weight", (hd,), plus_one),
    ]


def expert_stack(ck, hf, e, which, rows, cols):
    """Per-expert matrices experts.{e}.{which}.weight stacked into [E, rows, cols]."""
    names = [f"{hf}experts.{x}.{which}.weight" for x in range(e)]
    for n in names:
        ck.expect(n, (rows, cols))
    return lambda: np.stack([ck.bf16(n) for n in names])


def moe_tensors(ck, cfg, hf, blk):
    h, e = cfg["hidden_size"], cfg["num_experts"]
    ei, si = cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    ck.expect(hf + "gate.weight", (e, h))
    ck.expect(hf + "shared_expert_gate.weight", (1, h))
    if ck.has(hf + "experts.gate_up_proj"):
        gu, dn = hf + "experts.gate_up_proj", hf + "experts.down_proj"
        ck.expect(gu, (e, 2 * ei, h))
        ck.expect(dn, (e, h, ei))
        gate, up, down = (lambda: ck.bf16(gu)[:, :ei]), (lambda: ck.bf16(gu)[:, ei:]), (lambda: ck.bf16(dn))
    else:
        gate = expert_stack(ck, hf, e, "gate_proj", ei, h)
        up = expert_stack(ck, hf, e, "up_proj", ei, h)
        down = expert_stack(ck, hf, e, "down_proj", h, ei)
    return [
        as_f32(ck, hf + "gate.weight", blk + "ffn_gate_inp.weight", (e, h)),
        Out(blk + "ffn_gate_exps.weight", (e, ei, h), "BF16", gate),
        Out(blk + "ffn_up_exps.weight", (e, ei, h), "BF16", up),
        Out(blk + "ffn_down_exps.weight", (e, h, ei), "BF16", down),
        as_f32(ck, hf + "shared_expert_gate.weight", blk + "ffn_gate_inp_shexp.weight", (h,)),
        copy_bf16(ck, hf + "shared_expert.gate_proj.weight", blk + "ffn_gate_shexp.weight", (si, h)),
        copy_bf16(ck, hf + "shared_expert.up_proj.weight", blk + "ffn_up_shexp.weight", (si, h)),
        copy_bf16(ck, hf + "shared_expert.down_proj.weight", blk + "ffn_down_shexp.weight", (h, si)),
    ]


def qwen35moe_tensors(ck, cfg):
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
        die("linear_key_head_dim != linear_value_head_dim, which llama.cpp's qwen35moe cannot express")
    if cfg["linear_num_value_heads"] % cfg["linear_num_key_heads"]:
        die("linear_num_value_heads is not a multiple of linear_num_key_heads")
    root = "model.language_model."
    plus_one = lambda a: a + np.float32(1)  # noqa: E731
    outs = [copy_bf16(ck, root + "embed_tokens.weight", "token_embd.weight", (v, h))]
    for layer, kind in enumerate(check_layer_schedule(cfg)):
        hf, blk = f"{root}layers.{layer}.", f"blk.{layer}."
        for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            ck.expect(hf + norm, (h,))
        outs.append(as_f32(ck, hf + "input_layernorm.weight", blk + "attn_norm.weight", (h,), plus_one))
        if kind == "linear_attention":
            outs += deltanet_tensors(ck, cfg, hf + "linear_attn.", blk)
        else:
            outs += attention_tensors(ck, cfg, hf + "self_attn.", blk)
        outs.append(as_f32(ck, hf + "post_attention_layernorm.weight", blk + "post_attention_norm.weight", (h,),
                           plus_one))
        outs += moe_tensors(ck, cfg, hf + "mlp.", blk)
    ck.expect(root + "norm.weight", (h,))
    outs.append(as_f32(ck, root + "norm.weight", "output_norm.weight", (h,), plus_one))
    if cfg.get("tie_word_embeddings", False):
        return outs  # llama.cpp reuses token_embd when output is absent
    outs.append(copy_bf16(ck, "lm_head.weight", "output.weight", (v, h)))
    return outs


# (llama.cpp arch, fields nested in text_config, hyper-parameters, tensors)
ARCHS = {
    "Qwen3ForCausalLM": ("qwen3", False, qwen3_params, qwen3_tensors),
    "Qwen3_5MoeForConditionalGeneration": ("qwen35moe", True, qwen35moe_params, qwen35moe_tensors),
}


# ---- tokenizer ---------------------------------------------------------------------------------

def special_id(cfg_id, by_id, tok_cfg, key):
    """config.json's id when the tokenizer defines it, else the tokenizer_config.json token `key`."""
    cfg_id = cfg_id[0] if isinstance(cfg_id, list) else cfg_id
    if cfg_id is not None and cfg_id in by_id:
        return cfg_id
    content = tok_cfg.get(key)
    content = content.get("content") if isinstance(content, dict) else content
    ids = [i for i, s in by_id.items() if s == content]
    return ids[0] if ids else None


def add_tokenizer(w, gguf, tok_dir, cfg):
    path = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.exists(path):
        die(f"{path} does not exist (pass --tokenizer DIR)")
    with open(path) as f:
        tok = json.load(f)
    tok_cfg = {}
    if os.path.exists(os.path.join(tok_dir, "tokenizer_config.json")):
        with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
            tok_cfg = json.load(f)
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
    eos = special_id(cfg.get("eos_token_id"), by_id, tok_cfg, "eos_token")
    bos = special_id(cfg.get("bos_token_id", eos), by_id, tok_cfg, "pad_token")
    if eos is not None:
        w.add_eos_token_id(eos)
    if bos is not None:
        w.add_bos_token_id(bos)
        w.add_pad_token_id(bos)  # <|endoftext|>, as Qwen's tokenizer_config pads
    w.add_add_bos_token(False)


# ---- main --------------------------------------------------------------------------------------

def rerank_head(ck, cfg, tok_dir, tokens):
    """cls.output.weight: the output head's rows of YES then NO, as llama.cpp's converter stacks them."""
    no, yes = tokens.split(",")
    with open(os.path.join(tok_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    for t in (no, yes):
        if t not in vocab:
            die(f"--rerank: '{t}' is not a token of {tok_dir}/tokenizer.json")
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", False) else "lm_head.weight"
    shape = (2, cfg["hidden_size"])
    ck.expect(head, (cfg["vocab_size"], cfg["hidden_size"]))
    return Out("cls.output.weight", shape, "BF16", lambda: np.stack([ck.bf16(head)[vocab[yes]], ck.bf16(head)[vocab[no]]]))


def write(w, gguf, outs):
    for t in outs:
        bf16 = t.kind == "BF16"
        n = int(np.prod(t.shape))
        w.add_tensor_info(t.name, t.shape, np.dtype(np.uint16 if bf16 else np.float32), n * (2 if bf16 else 4),
                          raw_dtype=gguf.GGMLQuantizationType.BF16 if bf16 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in outs:
        arr = np.ascontiguousarray(t.make(), dtype=np.uint16 if t.kind == "BF16" else np.float32)
        assert arr.shape == t.shape, (t.name, arr.shape, t.shape)
        w.write_tensor_data(arr)
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", help="path to llama.cpp's gguf-py folder")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (default: MODEL_DIR)")
    ap.add_argument("--rerank", metavar="NO,YES", help="write llama.cpp's Qwen3 reranker (RANK pooling, cls.output)")
    args = ap.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    try:
        import gguf  # noqa: E402 (after the path is known)
    except ImportError:
        die("cannot import gguf; pass --gguf-py LLAMA_CPP/gguf-py")

    with open(os.path.join(args.model_dir, "config.json")) as f:
        top = json.load(f)
    arch = (top.get("architectures") or [None])[0]
    if arch not in ARCHS:
        die(f"{args.model_dir}: architecture {arch} is not supported (only {', '.join(ARCHS)})")
    ll_arch, nested, params, tensors = ARCHS[arch]
    cfg = {**top, **top.get("text_config", {})} if nested else top
    ck = Checkpoint(args.model_dir)
    try:
        outs = tensors(ck, cfg)  # every name and shape is checked here, before the file exists
        if args.rerank and ll_arch != "qwen3":
            die("--rerank: only Qwen3ForCausalLM checkpoints")
        if args.rerank:
            outs.append(rerank_head(ck, cfg, args.tokenizer or args.model_dir, args.rerank))
        w = gguf.GGUFWriter(args.out, ll_arch)
        w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
        params(w, gguf, cfg)
    except KeyError as e:
        die(f"{args.model_dir}/config.json lacks {e.args[0]} needed for {arch}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    if args.rerank:
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(["yes", "no"])
    add_tokenizer(w, gguf, args.tokenizer or args.model_dir, cfg)
    write(w, gguf, outs)
    print(f"wrote {args.out}: {len(outs)} tensors ({ll_arch})")


if __name__ == "__main__":
    main()
