#!/usr/bin/env python3
"""compare.py — cvllm against llama.cpp on the same CPU, weights and thread count; prints the table.

Rows (the issue's targets):
  decode   batch-1 decode tok/s: `cvllm bench latency` (1-token prompt, 128 new tokens) vs
           `llama-bench -p 0 -n 128` (tg128), plus the memory-bandwidth bound: weight bytes read per
           token ÷ the STREAM triad bandwidth on the same threads (bench/triad.c).
  prefill  512-token prompt tok/s: `cvllm bench latency --input-len 512 --output-len 1` vs pp512.
  serve    `cvllm bench serve` (random 512 in / 128 out, max concurrency 16, 64 prompts) against
           `cvllm serve` and against `llama-server --parallel 16 --cont-batching`: output tok/s and
           p99 TPOT; also cvllm's start-to-ready time and peak resident memory.
  8b       Qwen3-8B shape batch-1 decode: cvllm --load-format dummy vs llama.cpp on a random 8B GGUF.

Both engines run the same random bf16 checkpoint (tools/make_random_checkpoint.py; llama.cpp reads
it converted by bench/hf_to_gguf.py), made once under the work folder. Runs of the two engines are
interleaved and repeated (--reps) and medians are reported, since shared machines are noisy.

llama.cpp: a source checkout at --llama-dir (or $LLAMA_CPP_DIR) is built there once (llama-bench,
llama-server) if it has no build; without a checkout the llama.cpp columns say "n/a" and why.

Usage: bench/compare.py [--threads 2] [--reps 5] [--work DIR] [--llama-dir DIR] [--cvllm BIN]
                        [--serve-prompts 64] [--serve-reps 1] [--eight-b-tokens 16]
                        [--rows decode,prefill,serve,8b]
Stdlib only; the checkpoint tools need a python3 with numpy (found automatically).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log(" ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def numpy_python():
    for py in (sys.executable, "/usr/bin/python3", "python3"):
        if py and subprocess.run([py, "-c", "import numpy"], capture_output=True).returncode == 0:
            return py
    sys.exit("compare: no python3 with numpy (Debian: apt-get install python3-numpy)")


def git_commit(path):
    r = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


# ---- builds -----------------------------------------------------------------------------------

def build_cvllm(args):
    if args.cvllm:
        return args.cvllm
    build = os.path.join(args.work, "build-cvllm")
    run(["cmake", "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DCVLLM_TESTS=OFF"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", build, "--target", "cvllm", "-j", str(os.cpu_count() or 2)], stdout=subprocess.DEVNULL)
    return os.path.join(build, "cvllm")


def build_triad(args):
    out = os.path.join(args.work, "triad")
    run(["cc", "-O3", "-march=native", os.path.join(REPO, "bench", "triad.c"), "-lpthread", "-o", out])
    return out


def find_llama(args, rows):
    """(bin dir, None) or (None, reason)."""
    d = args.llama_dir
    if not d or not os.path.isfile(os.path.join(d, "CMakeLists.txt")):
        return None, f"no llama.cpp checkout at {d or '(unset)'}; set --llama-dir or LLAMA_CPP_DIR"
    bindir = os.path.join(d, "build", "bin")
    need = ["llama-bench"] + (["llama-server"] if "serve" in rows else [])
    if not all(os.path.exists(os.path.join(bindir, b)) for b in need):
        log(f"building llama.cpp in {d}/build")
        run(["cmake", "-S", d, "-B", os.path.join(d, "build"), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
             "-DLLAMA_CURL=OFF"], stdout=subprocess.DEVNULL)
        run(["cmake", "--build", os.path.join(d, "build"), "--target", *need, "-j", str(os.cpu_count() or 2)],
            stdout=subprocess.DEVNULL)
    return bindir, None


def checkpoint(args, shape):
    """The random checkpoint folder of a shipped config and its GGUF, made once."""
    folder = os.path.join(args.work, f"qwen3-{shape}-random")
    gguf = folder + ".gguf"
    py = None
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        py = py or numpy_python()
        run([py, os.path.join(REPO, "tools", "make_random_checkpoint.py"),
             os.path.join(REPO, "models", "Qwen", f"Qwen3-{shape}"), folder])
    if args.llama_bin and not os.path.exists(gguf):
        py = py or numpy_python()
        run([py, os.path.join(REPO, "bench", "hf_to_gguf.py"), folder, gguf, "--gguf-py",
             os.path.join(args.llama_dir, "gguf-py")])
    return folder, gguf


def weight_bytes_per_token(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    h, i, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i
    return 2 * (layers * per_layer + c["vocab_size"] * h)  # bf16; lm_head streamed every token


def checkpoint_bytes(folder):
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))


def kv_bytes_per_token(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * hd * 4  # K and V, f32


# ---- measurements -----------------------------------------------------------------------------

def cvllm_latency(args, model, input_len, output_len, extra=()):
    with tempfile.NamedTemporaryFile(suffix=".json", dir=args.work) as out:
        run([args.cvllm, "bench", "latency", "--model", model, "--input-len", input_len, "--output-len", output_len,
             "--batch-size", 1, "--num-iters-warmup", 1, "--num-iters", 3, "--num-threads", args.threads,
             "--max-model-len", 2048, "--kv-cache-memory-bytes", 1 << 30, "--output-json", out.name, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out.name) as f:
            r = json.load(f)
    return r["decode_tokens_per_second"] if output_len > 1 else r["prefill_tokens_per_second"]


def llama_bench(args, gguf, n_prompt, n_gen):
    out = run([os.path.join(args.llama_bin, "llama-bench"), "-m", gguf, "-t", args.threads, "-p", n_prompt, "-n",
               n_gen, "-r", 3, "-o", "json"], capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]


def triad(args, exe):
    out = run([exe, args.threads], capture_output=True, text=True).stdout
    return float(out.split("best=")[1].split()[0])


def wait_ready(url, proc, timeout):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError("server not ready in time")


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bench_serve(args, url, tokenizer, served):
    with tempfile.TemporaryDirectory(dir=args.work) as d:
        run([args.cvllm, "bench", "serve", "--base-url", url, "--model", served, "--tokenizer", tokenizer,
             "--dataset-name", "random", "--random-input-len", 512, "--random-output-len", 128, "--num-prompts",
             args.serve_prompts, "--max-concurrency", 16, "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl",
             "--metric-percentiles", 99, "--save-result", "--result-dir", d, "--result-filename", "r.json"],
            stdout=subprocess.DEVNULL)
        with open(os.path.join(d, "r.json")) as f:
            r = json.load(f)
    return r["output_throughput"], r["p99_tpot_ms"]


def start_cvllm_serve(cmd, env):
    log(" ".join(str(c) for c in cmd))
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait()


def serve_row(args, folder, gguf):
    port = 18000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    kv = 16 * (512 + 128 + 32)  # tokens: every concurrent request's prompt and output
    kv_bytes = kv * kv_bytes_per_token(folder)
    cmd = [args.cvllm, "serve", folder, "--port", port, "--num-threads", args.threads, "--max-model-len", 1024,
           "--max-num-seqs", 16, "--served-model-name", "m", "--kv-cache-memory-bytes", kv_bytes,
           "--disable-log-stats"]
    # Start-up twice with a packed-weight cache of its own: cold (packs and writes the cache), then
    # warm (maps it) — the second server is the one benchmarked.
    with tempfile.TemporaryDirectory(dir=args.work) as cache:
        env = dict(os.environ, CVLLM_CACHE_ROOT=cache)
        proc = start_cvllm_serve(cmd, env)
        try:
            ready_cold = wait_ready(url, proc, 120)
        finally:
            stop(proc)
        proc = start_cvllm_serve(cmd, env)
        try:
            ready = wait_ready(url, proc, 120)
            cv = bench_serve(args, url, folder, "m")
            rss = peak_rss_mib(proc.pid)
        finally:
            stop(proc)
    rss_bound = (checkpoint_bytes(folder) + kv_bytes) * 1.1 / 2**20
    ll, ll_ready = None, None
    if args.llama_bin:
        lcmd = [os.path.join(args.llama_bin, "llama-server"), "-m", gguf, "-t", args.threads, "--parallel", 16,
                "--cont-batching", "-c", kv, "--port", port + 1, "--alias", "m"]
        log(" ".join(str(c) for c in lcmd))
        lproc = subprocess.Popen([str(c) for c in lcmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ll_ready = wait_ready(f"http://127.0.0.1:{port + 1}", lproc, 300)
            ll = bench_serve(args, f"http://127.0.0.1:{port + 1}", folder, "m")
        finally:
            stop(lproc)
    return cv, ll, (ready_cold, ready, ll_ready), (rss, rss_bound)


# ---- report -----------------------------------------------------------------------------------

def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, digits=2):
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def common_args(doc, cvllm_help):
    """The options every comparison script shares (engines, threads, repetitions, work folder)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default=os.environ.get("CVLLM_BENCH_WORK", "/tmp/cvllm-bench"))
    ap.add_argument("--llama-dir", default=os.environ.get("LLAMA_CPP_DIR", "/work/ext/llama.cpp"))
    ap.add_argument("--cvllm", help=cvllm_help)
    return ap


def main():
    ap = common_args(__doc__, "a built cvllm binary (default: build one under --work)")
    ap.add_argument("--serve-prompts", type=int, default=64)
    ap.add_argument("--serve-reps", type=int, default=1, help="serve runs per engine (each ~5-10 min here)")
    ap.add_argument("--eight-b-tokens", type=int, default=16, help="tokens generated per 8B decode run")
    ap.add_argument("--rows", default="decode,prefill,serve,8b")
    args = ap.parse_args()
    rows = set(args.rows.split(","))
    os.makedirs(args.work, exist_ok=True)
    args.cvllm = build_cvllm(args)
    args.llama_bin, why = find_llama(args, rows)
    if why:
        log(f"llama.cpp not available: {why}")
    small, small_gguf = checkpoint(args, "0.6B")
    res = {k: [] for k in ("cv_tg", "ll_tg", "cv_pp", "ll_pp", "triad", "cv_8b", "ll_8b")}
    for rep in range(args.reps):
        log(f"repetition {rep + 1}/{args.reps}")
        if "decode" in rows:
            res["triad"].append(triad(args, build_triad(args) if rep == 0 else os.path.join(args.work, "triad")))
            res["cv_tg"].append(cvllm_latency(args, small, 1, 129))
            if args.llama_bin:
                res["ll_tg"].append(llama_bench(args, small_gguf, 0, 128))
        if "prefill" in rows:
            res["cv_pp"].append(cvllm_latency(args, small, 512, 1))
            if args.llama_bin:
                res["ll_pp"].append(llama_bench(args, small_gguf, 512, 0))
    serve = None
    if "serve" in rows:  # each repetition runs cvllm then llama-server, so load drifts hit both
        runs = [serve_row(args, small, small_gguf) for _ in range(args.serve_reps)]
        cv = (med([r[0][0] for r in runs]), med([r[0][1] for r in runs]))
        ll = (med([r[1][0] for r in runs]), med([r[1][1] for r in runs])) if runs[0][1] else None
        ready = tuple(med([r[2][i] for r in runs]) if runs[0][2][i] is not None else None for i in range(3))
        serve = (cv, ll, ready, (max(r[3][0] for r in runs), runs[0][3][1]))
        res["serve"] = [[r[0][0], r[1][0] if r[1] else None] for r in runs]
    if "8b" in rows:
        big, big_gguf = checkpoint(args, "8B") if args.llama_bin else (os.path.join(REPO, "models/Qwen/Qwen3-8B"), None)
        for rep in range(max(1, args.reps // 2)):
            res["cv_8b"].append(cvllm_latency(args, os.path.join(REPO, "models/Qwen/Qwen3-8B"), 1,
                                              args.eight_b_tokens + 1, ("--load-format", "dummy")))
            if args.llama_bin:
                res["ll_8b"].append(llama_bench(args, big_gguf, 0, args.eight_b_tokens))

    m = {k: med(v) for k, v in res.items() if k != "serve"}
    bound = m["triad"] * 1e9 / weight_bytes_per_token(small) if res["triad"] else float("nan")
    print(f"\ncvllm {git_commit(REPO)} vs llama.cpp {git_commit(args.llama_dir) if args.llama_bin else 'n/a'}; "
          f"{args.threads} threads; {os.uname().nodename}; {time.strftime('%Y-%m-%d %H:%M')}; medians of {args.reps}")
    if why:
        print(f"llama.cpp columns n/a: {why}")
    print(f"| workload | cvllm | llama.cpp | ratio | target |")
    print(f"|---|---|---|---|---|")
    ratio = lambda a, b: a / b if b and b == b and a == a else float("nan")  # noqa: E731
    if "decode" in rows:
        print(f"| 0.6B decode tok/s (tg128) | {fmt(m['cv_tg'])} | {fmt(m['ll_tg'])} | "
              f"{fmt(ratio(m['cv_tg'], m['ll_tg']))}× | ≥ 1.2× |")
        print(f"| 0.6B decode vs bandwidth bound ({fmt(m['triad'])} GB/s triad → {fmt(bound)} tok/s) | "
              f"{fmt(100 * ratio(m['cv_tg'], bound), 0)} % | {fmt(100 * ratio(m['ll_tg'], bound), 0)} % | | ≥ 80 % |")
    if "prefill" in rows:
        print(f"| 0.6B prefill tok/s (pp512) | {fmt(m['cv_pp'])} | {fmt(m['ll_pp'])} | "
              f"{fmt(ratio(m['cv_pp'], m['ll_pp']))}× | ≥ 1.2× |")
    if serve:
        cv, ll, ready, rss = serve
        print(f"| serve output tok/s (512/128, conc. 16, {args.serve_prompts} prompts) | {fmt(cv[0])} | "
              f"{fmt(ll[0] if ll else None)} | {fmt(ratio(cv[0], ll[0]) if ll else None)}× | ≥ 2× |")
        print(f"| serve p99 TPOT ms | {fmt(cv[1])} | {fmt(ll[1] if ll else None)} | | reported |")
        print(f"| serve start to ready s: packed-weight cache cold / warm | {fmt(ready[0])} / {fmt(ready[1])} | "
              f"{fmt(ready[2])} | | ≤ 2 s |")
        print(f"| cvllm serve peak RSS MiB (bound: 1.1 × (weights + KV budget)) | {fmt(rss[0], 0)} ({fmt(rss[1], 0)}) "
              f"| | | ≤ bound |")
    if "8b" in rows:
        print(f"| 8B decode tok/s (tg{args.eight_b_tokens}) | {fmt(m['cv_8b'], 3)} | {fmt(m['ll_8b'], 3)} | "
              f"{fmt(ratio(m['cv_8b'], m['ll_8b']))}× | ≥ 1.1× |")
    print("raw:", json.dumps({k: v for k, v in res.items() if v}))


if __name__ == "__main__":
    main()
