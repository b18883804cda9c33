#!/usr/bin/env python3
"""hybrid_compare.py — cvllm against llama.cpp on the Qwen3.6-35B-A3B shape (hybrid GDN + MoE).

Benchmark (default): both engines run the same random bf16 weights of the Qwen3.6-35B-A3B shape cut
to 4 layers (bench/configs/qwen3.6-35b-a3b-4layers: 3 Gated-DeltaNet layers + 1 gated-attention
layer, 256 experts top-8 + shared expert, vocabulary 248320). tools/make_random_checkpoint.py
writes the checkpoint once under --work (8.8 GB), bench/hf_to_gguf.py converts it (another
8.8 GB). Batch-1 decode: `cvllm bench latency` (1-token prompt, 129 tokens: 128 decode steps) vs
`llama-bench -p 0 -n 128` (tg128), and prefill of a --prompt-len prompt (pp512 by default; cvllm
`--input-len 512 --output-len 1`), interleaved --reps times, medians reported with the ratio, and
each engine's weight bytes streamed per second (from its own files: every projection, the router,
top-k of the routed experts, the shared expert and the lm_head) with their share of the STREAM
triad and of the read bandwidth measured just before and after each run (bench/triad.c; see
compare.py's Bracket).

--quant w8a8: the same comparison 8-bit. cvllm runs the W8A8_DYNAMIC checkpoint `cvllm quantize
--scheme w8a8_dynamic --recipe moe` writes from the random bf16 one (msModelSlim's Qwen3.5/3.6-MoE
recipe: attention q/k/v and the routed experts int8, the rest bf16; --quantization ascend),
llama.cpp `llama-quantize … Q8_0` of the bf16 GGUF (every matrix int8 but those it keeps f32).

Check (--check): before trusting a speed ratio, show that the two engines compute the same model
from these files. A tiny model of the same structure (hidden 256, 3 GDN + 1 attention layer,
2 key / 4 value heads so the value-head reordering matters, 8 experts + shared expert, the Qwen3
vocabulary) is made with --scale (larger weights give peaked, informative distributions instead
of near-uniform ones), converted, and both engines decode the same random prompts (1, 7 and 70
tokens: the last spans two 64-token DeltaNet chunks) greedily: `cvllm generate` with top
logprobs, llama-server's /completion with n_probs (f32 KV cache, like cvllm). Per prompt it
prints whether the greedy tokens agree, the largest |Δ logprob| over the top-k ids both report and
the top-k overlap; it exits 1 when Δ exceeds --tolerance or the decodes part anywhere but at a
near-tie (both choices within --tolerance in both engines). llama.cpp rounds activations to bf16
before its bf16 matmuls and cvllm keeps them f32, so small differences are expected; a layout
error is not small (a converter without the value-head reordering, or without the +1 on the
gains, disagrees from the first token with no top-k overlap). By default every token is routed
to all 8 experts: with top-k routing, a near-tie between router logits lets rounding pick a
different expert in each engine now and then, which moves the logprobs by ~0.1-0.3 at that
step — real, but noise for this purpose. The router, the order and the weights of every expert
are exercised either way; --experts-per-token 2 runs the top-k path.

Helpers (process running, builds, checkpoints and their quantized forms, llama-bench, bytes
streamed, medians, the table's header) come from bench/compare.py.

Usage: bench/hybrid_compare.py [--threads 2] [--reps 5] [--work DIR] [--llama-dir DIR] [--cvllm BIN]
                               [--config DIR] [--tokenizer DIR] [--quant bf16|w8a8]
       bench/hybrid_compare.py --check [--scale 4] [--experts-per-token 8] [--tokens 16] [--top 5]
                               [--tolerance 0.05] ...
Stdlib only; the checkpoint tools need a python3 with numpy (found automatically).
"""
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402 (bench/compare.py, next to this file)

REPO = compare.REPO
TINY = {  # the tiny check model: same structure, small dimensions, Qwen3 tokenizer ids
    "hidden_size": 256, "head_dim": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "num_experts": 8, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
    "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645,
}
TINY_MROPE = [3, 3, 2]  # sums to the rotary half-width: 64 · 0.25 / 2


def expert_share(folder):
    """The fraction of the routed experts one token uses (top-k of all)."""
    with open(os.path.join(folder, "config.json")) as f:
        top = json.load(f)
    c = {**top, **top.get("text_config", {})}
    return c["num_experts_per_tok"] / c["num_experts"]


# ---- benchmark ----------------------------------------------------------------------------------

def bench(args):
    args.cvllm = compare.build_cvllm(args)
    args.llama_bin, why = compare.find_llama(args, ["llama-bench"] + ["llama-quantize"] * (args.quant == "w8a8"))
    if why:
        sys.exit(f"hybrid_compare: {why}")
    name = os.path.basename(os.path.normpath(args.config))
    folder, gguf = compare.checkpoint(args, args.config, f"{name}-random", tokenizer=args.tokenizer)
    cv_extra = ("--tokenizer", args.tokenizer, "--max-num-seqs", 1) + compare.NO_APC  # as compare.py's rows
    if args.quant == "w8a8":
        folder, gguf = compare.quantized(args, folder, "moe"), compare.q8_0(args, gguf)
        cv_extra += compare.ASCEND
    path = compare.llama_path(args, gguf)
    res = {"cv": [], "ll": [], "cv_bw": [], "ll_bw": [], "cv_rss": [], "cv_pp": [], "ll_pp": []}
    bracket = compare.Bracket(args, compare.build_triad(args))
    for rep in range(args.reps):
        compare.log(f"repetition {rep + 1}/{args.reps}")
        compare.drop_caches(args)
        bracket.break_chain()
        (tok_s, rss), bw = bracket.around(lambda: compare.cvllm_latency(args, folder, 1, 129, cv_extra))
        res["cv"].append(tok_s)
        res["cv_bw"].append(bw)
        res["cv_rss"].append(rss)
        tok_s, bw = bracket.around(lambda: compare.llama_bench(args, gguf, 0, 128))
        res["ll"].append(tok_s)
        res["ll_bw"].append(bw)
        res["cv_pp"].append(compare.cvllm_latency(args, folder, args.prompt_len, 1, cv_extra)[0])
        res["ll_pp"].append(compare.llama_bench(args, gguf, args.prompt_len, 0))
    m = {k: compare.med(v) for k, v in res.items() if not k.endswith("_bw")}
    share = expert_share(folder)
    nbytes = (compare.streamed_bytes(folder, share), compare.streamed_bytes(gguf, share))
    title = {"bf16": "bf16", "w8a8": "W8A8_DYNAMIC vs Q8_0"}[args.quant]
    compare.print_header(args, why, f"medians of {args.reps}")
    print(f"model: {name}, random bf16 weights{', quantized' if args.quant == 'w8a8' else ''}")
    print("| workload | cvllm | llama.cpp | ratio | target | llama.cpp path |")
    print("|---|---|---|---|---|---|")
    print(f"| {title} batch-1 decode tok/s (tg128) | {compare.fmt(m['cv'])} | {compare.fmt(m['ll'])} | "
          f"{compare.fmt(compare.ratio(m['cv'], m['ll']))}× | reported | {path} |")
    runs = [list(zip(res[side], res[side + "_bw"])) for side in ("cv", "ll")]
    print(compare.bandwidth_line(f"{title} decode", runs, nbytes, "reported", path))
    print(f"| {title} prefill tok/s (pp{args.prompt_len}) | {compare.fmt(m['cv_pp'])} | {compare.fmt(m['ll_pp'])} | "
          f"{compare.fmt(compare.ratio(m['cv_pp'], m['ll_pp']))}× | reported | {path} |")
    print(f"cvllm peak RSS MiB (median): {compare.fmt(m['cv_rss'], 0)}")
    print("raw:", json.dumps(res))


# ---- agreement check ----------------------------------------------------------------------------

def tiny_config(args):
    with open(os.path.join(args.config, "config.json")) as f:
        cfg = json.load(f)
    cfg["text_config"].update(TINY, num_experts_per_tok=args.experts_per_token)
    cfg["text_config"]["rope_parameters"]["mrope_section"] = TINY_MROPE
    d = os.path.join(args.work, f"hybrid-tiny-config-k{args.experts_per_token}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return d


def plain_text_tokens(tokenizer_dir):
    """Ids of the vocabulary entries that are printable ASCII (byte-level BPE writes a space as Ġ and
    a newline as Ċ), so any sequence of them is valid UTF-8."""
    with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    return {i for s, i in vocab.items() if all(" " < ch <= "~" or ch in "ĠĊ" for ch in s)}


def plain_text_lm_head(tokenizer_dir):
    """An edit of a checkpoint: lm_head rows of every other token set to zero. Random weights
    otherwise often make a greedy decode emit bytes that are not UTF-8, and llama-server then
    answers 500 ("output does not match the expected Content-only format") instead of the
    logprobs. A zero row gives logit 0, far below the top of a random model's logits, so such
    tokens are never chosen, in either engine (the GGUF is converted from the edited folder)."""
    def edit(folder):
        keep = plain_text_tokens(tokenizer_dir)
        path = os.path.join(folder, "model.safetensors")
        with open(path, "r+b") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            info = json.loads(f.read(n))["lm_head.weight"]
            assert info["dtype"] == "BF16"
            rows, cols = info["shape"]
            base = 8 + n + info["data_offsets"][0]
            zero = bytes(2 * cols)
            for i in range(rows):
                if i not in keep:
                    f.seek(base + i * 2 * cols)
                    f.write(zero)
        compare.log(f"{path}: lm_head rows of {rows - len(keep)} non-ASCII or special tokens set to zero")
    return edit


def cvllm_decode(args, folder, prompts):
    """[(tokens, [{id: logprob}] per step)] of greedy decoding each prompt with cvllm generate."""
    cmd = [args.cvllm, "generate", folder, "--tokenizer", args.tokenizer, "--temperature", 0, "--max-tokens",
           args.tokens, "--ignore-eos", "--logprobs", args.top, "--output", "json", "--num-threads", args.threads,
           "--max-model-len", 512, "--max-num-seqs", len(prompts), "--kv-cache-memory-bytes", 1 << 28]
    for p in prompts:
        cmd += ["--prompt-token-ids", ",".join(map(str, p))]
    out = compare.run(cmd, capture_output=True, text=True).stdout
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(results) == len(prompts), out
    return [(r["outputs"][0]["token_ids"], [{int(k): v for k, v in step.items()} for step in r["outputs"][0]["logprobs"]])
            for r in results]


def llama_decode(args, gguf, prompts):
    port = 18500 + os.getpid() % 1000
    cmd = [os.path.join(args.llama_bin, "llama-server"), "-m", gguf, "-t", args.threads, "-c", 512, "--port", port,
           "--cache-type-k", "f32", "--cache-type-v", "f32"]  # as cvllm: no f16 rounding of K and V
    compare.log(" ".join(str(c) for c in cmd))
    with tempfile.TemporaryFile() as logf:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=logf, stderr=subprocess.STDOUT)
        try:
            compare.wait_ready(f"http://127.0.0.1:{port}", proc, 120)
            out = []
            for p in prompts:
                body = {"prompt": p, "n_predict": args.tokens, "temperature": 0, "n_probs": args.top,
                        "ignore_eos": True, "cache_prompt": False}
                req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as r:
                    steps = json.load(r)["completion_probabilities"]
                out.append(([s["id"] for s in steps], [{t["id"]: t["logprob"] for t in s["top_logprobs"]} for s in steps]))
            return out
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()


def agreement(cv, ll, tolerance):
    """Compares one prompt's greedy decodes up to their first difference. Returns (verdict, steps
    compared, largest |Δ logprob| over the ids both engines list, least top-k overlap). Verdict:
    "same" tokens; "tie" when they part at a step where the two choices lie within `tolerance` of
    each other in both engines (a near-tie that rounding may flip; later contexts differ, so
    later steps are not compared); "DIFFERENT" otherwise."""
    n = min(len(cv[0]), len(ll[0]))
    part = next((i for i in range(n) if cv[0][i] != ll[0][i]), None)
    steps = n if part is None else part + 1
    worst, overlap = 0.0, 1.0
    for a, b in zip(cv[1][:steps], ll[1][:steps]):
        common = set(a) & set(b)
        overlap = min(overlap, len(common) / max(len(a), 1))
        worst = max([worst] + [abs(a[t] - b[t]) for t in common])
    if part is None:
        return ("same" if len(cv[0]) == len(ll[0]) else "DIFFERENT"), steps, worst, overlap
    a, b, x, y = cv[1][part], ll[1][part], cv[0][part], ll[0][part]
    tie = all(t in a and t in b for t in (x, y)) and abs(a[x] - a[y]) <= tolerance and abs(b[x] - b[y]) <= tolerance
    return ("tie" if tie else "DIFFERENT"), steps, worst, overlap


def check(args):
    args.cvllm = args.cvllm or os.path.join(REPO, "build-rel", "cvllm")
    args.llama_bin, why = compare.find_llama(args, ["llama-server"])
    if why:
        sys.exit(f"hybrid_compare: {why}")
    name = f"hybrid-tiny-x{args.scale:g}-k{args.experts_per_token}"
    folder, gguf = compare.checkpoint(args, tiny_config(args), name, args.scale, plain_text_lm_head(args.tokenizer),
                                      args.tokenizer)
    rng = random.Random(7)
    prompts = [[rng.randrange(151643) for _ in range(n)] for n in (1, 7, 70)]  # 70 > one 64-token GDN chunk
    cv, ll = cvllm_decode(args, folder, prompts), llama_decode(args, gguf, prompts)
    ok = True
    print(f"\ntiny hybrid model (scale {args.scale:g}, top-{args.experts_per_token} of 8 experts), greedy {args.tokens} "
          f"tokens, top-{args.top} logprobs; cvllm {compare.git_commit(REPO)} vs llama.cpp "
          f"{compare.git_commit(args.llama_dir)}")
    print("| prompt tokens | greedy tokens | steps compared | max abs Δ logprob | min top-k overlap "
          "| mean top-1 logprob |")
    print("|---|---|---|---|---|---|")
    for p, c, l in zip(prompts, cv, ll):
        verdict, n, worst, overlap = agreement(c, l, args.tolerance)
        ok = ok and verdict != "DIFFERENT" and worst <= args.tolerance
        top1 = sum(max(s.values()) for s in c[1][:n]) / n
        print(f"| {len(p)} | {verdict} | {n} | {worst:.4f} | {overlap:.2f} | {top1:.3f} |")
        if verdict != "same":
            print(f"  cvllm:     {c[0]}\n  llama.cpp: {l[0]}")
    print("agreement: " + ("OK" if ok else "FAILED") + f" (tolerance {args.tolerance} on |Δ logprob| and on near-ties)")
    return 0 if ok else 1


def main():
    ap = compare.common_args(__doc__, "a built cvllm binary (default: build one under --work; --check: build-rel)")
    ap.add_argument("--config", default=os.path.join(REPO, "bench", "configs", "qwen3.6-35b-a3b-4layers"))
    ap.add_argument("--tokenizer", default=os.path.join(REPO, "models", "qwen3-tokenizer"))
    ap.add_argument("--quant", choices=("bf16", "w8a8"), default="bf16",
                    help="the benchmark's weights: bf16 as made, or W8A8_DYNAMIC (cvllm quantize) vs Q8_0")
    ap.add_argument("--prompt-len", type=int, default=512, help="prompt tokens of the prefill row")
    ap.add_argument("--check", action="store_true", help="the tiny-model agreement check instead of the benchmark")
    ap.add_argument("--scale", type=float, default=4, help="--check: weight magnitude multiplier (power of two)")
    ap.add_argument("--experts-per-token", type=int, default=8, choices=range(1, 9), metavar="1..8",
                    help="--check: routed experts per token of the tiny model's 8 (default all: see above)")
    ap.add_argument("--tokens", type=int, default=16, help="--check: tokens decoded per prompt")
    ap.add_argument("--top", type=int, default=5, help="--check: top logprobs compared per step")
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="--check: largest |Δ logprob| accepted, and widest near-tie")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    args.work = os.path.abspath(args.work)
    sys.exit(check(args) if args.check else bench(args))


if __name__ == "__main__":
    compare.exit_on_failure(main)
