#!/usr/bin/env python3
"""tp_scaling.py — tensor parallelism's cost on one machine: TP=2 × 1 thread against TP=1 × 2 threads.

On this 2-core machine both arms use the same two cores and the same memory, so their ratio is the
price of running the model as two OpenMPI ranks instead of one process with two threads: the
all-reduces after o_proj and down_proj, the logits gather and the batch broadcast. Rows (`cvllm bench
latency`, interleaved repetitions, medians):
  decode   batch-1 decode tok/s (1-token prompt, --tokens decode steps)
  prefill  512-token prompt tok/s
and, from the model's shape, the bytes each rank sends per token and layer in the all-reduces (ring
all-reduce: 2·(n-1)/n of the f32 hidden row each, twice a layer), plus the time share of the
collectives in rank 0's --profile.

Usage: bench/tp_scaling.py --model DIR [--cvllm build/cvllm] [--reps 3] [--tokens 128] [--prompt-len 512]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def latency(args, tp, input_len, output_len, profile=False):
    """tok/s of the measured iterations (decode or prefill, as the lengths say) and the profile text."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [args.cvllm, "bench", "latency", "--model", args.model, "--input-len", str(input_len),
               "--output-len", str(output_len), "--batch-size", "1", "--num-iters-warmup", "1", "--num-iters",
               "3", "--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30), "-tp", str(tp),
               "--output-json", out.name]
        if tp == 1:
            cmd += ["--num-threads", "2"]
        if profile:
            cmd.append("--profile")
        print("[tp_scaling]", " ".join(cmd), file=sys.stderr, flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"tp_scaling: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        res = json.load(open(out.name))
    key = "decode_tokens_per_second" if output_len > 1 else "prefill_tokens_per_second"
    return res[key], r.stdout


def collective_share(profile_text):
    """The share of the collectives (the profile's allreduce row) in rank 0's forward passes."""
    ops = dict(re.findall(r"^\s+(\w+)\s+([\d.]+)\b", profile_text, re.M))
    total = float(ops.get("total", 0) or 0)
    return 100 * float(ops.get("allreduce", 0)) / total if total else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--cvllm", default=os.path.join(REPO, "build", "cvllm"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=512)
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    rows = {"decode": (1, args.tokens + 1), "prefill": (args.prompt_len, 1)}
    res = {name: {1: [], 2: []} for name in rows}
    for rep in range(args.reps):
        for name, (inp, outp) in rows.items():
            for tp in (1, 2):
                res[name][tp].append(latency(args, tp, inp, outp)[0])
    _, prof = latency(args, 2, *rows["decode"], profile=True)
    share_decode = collective_share(prof)
    _, prof = latency(args, 2, *rows["prefill"], profile=True)
    share_prefill = collective_share(prof)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    sent = 2 * 2 * (2 - 1) / 2 * hidden * 4  # two all-reduces a layer, ring, f32
    print(f"\ncvllm {commit}; {os.uname().nodename} ({os.cpu_count()} CPUs); model {args.model} "
          f"(hidden {hidden}, {layers} layers); medians of {args.reps}")
    print("| workload | TP=1 × 2 threads | TP=2 × 1 thread | ratio (TP=2 / TP=1) | collectives' share of TP=2 (rank 0 profile) |")
    print("|---|---|---|---|---|")
    for name, share in (("decode", share_decode), ("prefill", share_prefill)):
        a, b = statistics.median(res[name][1]), statistics.median(res[name][2])
        unit = "tok/s"
        print(f"| {name} {unit} | {a:.2f} | {b:.2f} | {b / a:.2f}× | {share:.1f} % |" if share is not None else
              f"| {name} {unit} | {a:.2f} | {b:.2f} | {b / a:.2f}× | n/a |")
    print(f"bytes each rank sends per token and layer in the all-reduces: {sent:.0f} "
          f"({sent * layers / 1024:.1f} KiB per token over {layers} layers)")
    print("raw:", json.dumps(res))


if __name__ == "__main__":
    main()
