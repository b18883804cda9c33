#!/usr/bin/env python3
"""compare.py — cvllm against llama.cpp on the same CPU, weights and thread count; prints the table.

Rows (the issues' targets):
  decode   batch-1 decode tok/s: `cvllm bench latency` (1-token prompt, --tokens + 1 tokens: 128 decode
           steps by default) vs `llama-bench -p 0 -n 128` (tg128), plus the weight bytes each engine
           streams per second and their share of the STREAM triad bandwidth and of the read bandwidth
           (loads only, as a decode's weight stream) of the same threads (bench/triad.c), measured
           just before and just after each decode run: a run's share is of the mean of the two, and
           the table gives the median share over the runs (the shared VMs' bandwidth moves 2x within
           a minute, so a reading taken once per repetition put shares above 100 %). Shares are of the
           best triad and read passes (STREAM's convention) and of the median read pass: a decode
           run lasts seconds while the best pass is the luckiest 0.02 s of ten, and on these VMs
           the two read figures differ by 10-35 %. cvllm runs with --no-enable-prefix-caching, as
           the prefill rows do: a 1-token prompt never hits, and with caching on every repetition
           keeps its generated blocks cached and writes the next one into never-used KV memory, whose
           first touch (the VM backs guest pages lazily) cost 4-5 % of a 0.6B W8A8 decode token
           here (35-48 µs a layer, against 1.5-2 µs writing into reused blocks); llama-bench
           reuses its context's KV memory, as a long-running server does.
  prefill  512-token prompt tok/s: `cvllm bench latency --input-len 512 --output-len 1
           --no-enable-prefix-caching` vs pp512. llama-bench has no prefix cache and reuses its
           context's KV memory every repetition; with prefix caching on, cvllm keeps each measured
           random prompt's blocks for later hits (vLLM's LRU), so the next prompt is written into
           never-used KV memory, whose first touch is what such a run would time on a VM that backs
           guest pages lazily (0.5 GB/s here). apc-prefill reports that run (cvllm's default) too.
  ttft     the same for a 3,500-token prompt (the Qwen3 tutorial's input length): its TTFT is 3500 / tok/s.
  deep, w8a8-deep
           batch-1 decode after that prompt: `cvllm bench latency --input-len 3500 --output-len 129
           --block-size 128` (the Qwen3 tutorial's blocks) vs `llama-bench -p 0 -n 128 -d 3500`: a 0.6B
           token's attention then reads 0.4 GB of KV cache (bf16 in cvllm, f16 in llama.cpp), against
           1.2 GB of bf16 weights or 0.75 GB of W8A8 ones.
  f32-decode, f32-prefill, f32-ttft
           the bf16 rows with cvllm computing in f32 (--dtype float32: exact f32 FMA on the bf16 weights)
           where the unprefixed rows run cvllm's default for a bf16 checkpoint, bf16 compute (bf16 GEMM
           inputs where the CPU's bf16 dot product beats f32 FMA).
  serve    `cvllm bench serve` (random 512 in / 128 out, max concurrency 16, 64 prompts) against
           `cvllm serve` and against `llama-server --parallel 16 --cont-batching`: output tok/s and
           p99 TPOT; also cvllm's start-to-ready time and peak resident memory.
  8b       Qwen3-8B shape batch-1 decode: cvllm --load-format dummy vs llama.cpp on a random 8B GGUF.
  w8a8-decode, w8a8-prefill, w8a8-8b
           the same rows 8-bit: cvllm on the W8A8_DYNAMIC checkpoint `cvllm quantize --scheme
           w8a8_dynamic --recipe dense` writes from the bf16 checkpoint (--quantization ascend), llama.cpp
           on `llama-quantize … Q8_0` of the bf16 GGUF. The 8B one: cvllm --load-format dummy on the
           8B config with a W8A8_DYNAMIC quant_model_description.json (every attention and MLP linear,
           as the dense recipe writes it). cvllm's W8A8 keeps the lm_head bf16 (msModelSlim's recipe)
           where Q8_0 has an int8 one, so each engine's bandwidth share is of its own bytes.
  fp8-decode
           cvllm only: batch-1 decode of the 0.6B config as Qwen's block-wise FP8 (config.json
           quantization_config, e4m3 weights, 128×128 scales) vs as W8A8_DYNAMIC, both --load-format
           dummy (the same loader path for both, so the ratio is the kernels').

Both engines run the same random bf16 checkpoint (tools/make_random_checkpoint.py; llama.cpp reads
it converted by bench/hf_to_gguf.py), made once under the work folder, as are the quantized
checkpoints made from it. Runs of the two engines are interleaved and repeated (--reps; the 8B rows
take part in every other repetition) and medians are reported, since shared machines are noisy.
Weight bytes per token are read from each engine's own files (safetensors and GGUF headers): every
tensor but the embedding, which a token only gathers from, unless it is also the lm_head (tied).

llama.cpp: a source checkout at --llama-dir (or $LLAMA_CPP_DIR) is built there once (llama-bench,
llama-server, llama-quantize) if it has no build; without a checkout the llama.cpp columns say "n/a"
and why. The last column says which of its paths ran: the backend, the buffer types its weights
were loaded into (CPU_REPACK or AMX when it repacks them for its own kernels) and the CPU features
ggml was built for.

Usage: bench/compare.py [--threads 2] [--reps 5] [--work DIR] [--llama-dir DIR] [--cvllm BIN]
                        [--serve-prompts 64] [--serve-reps 1] [--tokens 128] [--prompt-len 512]
                        [--eight-b-tokens 16]
                        [--rows decode,prefill,ttft,serve,8b,f32-decode,f32-prefill,f32-ttft,
                                w8a8-decode,w8a8-prefill,w8a8-8b,fp8-decode,deep,w8a8-deep]
Stdlib only; the checkpoint tools need a python3 with numpy (found automatically).
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def run(cmd, quiet=False, **kw):
    """Runs cmd (logged); a non-zero exit raises. quiet: its stdout and stderr are captured and their
    last lines logged only if it fails, and the result carries its peak resident memory (peak_rss_mib,
    from wait4)."""
    cmd = [str(c) for c in cmd]
    log(" ".join(cmd))
    if not quiet:
        return subprocess.run(cmd, check=True, **kw)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", **kw)
    out = proc.stdout.read()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: the Popen must not wait again
    if proc.returncode:
        log("its last lines:\n" + "\n".join(out.splitlines()[-20:]))
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    r = subprocess.CompletedProcess(cmd, 0, out)
    r.peak_rss_mib = usage.ru_maxrss / 1024
    return r


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


def find_llama(args, tools):
    """(bin dir, None) or (None, reason); the llama.cpp tools named (llama-bench, ...) are built if missing."""
    d = args.llama_dir
    if not d or not os.path.isfile(os.path.join(d, "CMakeLists.txt")):
        return None, f"no llama.cpp checkout at {d or '(unset)'}; set --llama-dir or LLAMA_CPP_DIR"
    bindir = os.path.join(d, "build", "bin")
    missing = [t for t in tools if not os.path.exists(os.path.join(bindir, t))]
    if missing:
        log(f"building llama.cpp in {d}/build")
        run(["cmake", "-S", d, "-B", os.path.join(d, "build"), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
             "-DLLAMA_CURL=OFF"], stdout=subprocess.DEVNULL)
        run(["cmake", "--build", os.path.join(d, "build"), "--target", *missing, "-j", str(os.cpu_count() or 2)],
            stdout=subprocess.DEVNULL)
    return bindir, None


def remove(path):
    """Removes a file or a folder tree, if there."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def made_once(out, make, maker=None):
    """out (a file or folder), made by make(path) under a temporary name and renamed when complete, so
    that an interrupted run leaves nothing that looks made; kept from earlier runs unless the program
    that makes it (maker) has been rebuilt since."""
    if os.path.exists(out) and maker and os.path.getmtime(maker) > os.path.getmtime(out):
        log(f"{out} predates {maker}: made again")
        remove(out)
    if not os.path.exists(out):
        part = out + ".part"
        remove(part)
        make(part)
        os.rename(part, out)
    return out


def shipped(shape):
    """The shipped config folder of a Qwen3 size ("0.6B", "8B")."""
    return os.path.join(REPO, "models", "Qwen", f"Qwen3-{shape}")


def checkpoint(args, config_dir, name, scale=1, edit=None, tokenizer=None, keep=True):
    """The random bf16 checkpoint folder `name` under --work of the config in config_dir (changed by
    edit(folder) once written) and, when llama.cpp is there, its GGUF (else None); each made once.
    keep=False: the folder only feeds the GGUF (cvllm runs that shape --load-format dummy), so it is
    removed once converted and None is returned for it."""
    def make(out):
        run(["nice", "-n", "19", numpy_python(), os.path.join(REPO, "tools", "make_random_checkpoint.py"), config_dir,
             out, "--scale", scale])
        if edit:
            edit(out)
    folder, gguf = os.path.join(args.work, name), None
    if keep or (args.llama_bin and not os.path.exists(folder + ".gguf")):
        made_once(folder, make)
    if args.llama_bin:
        gguf = made_once(folder + ".gguf", lambda out: run(
            ["nice", "-n", "19", numpy_python(), os.path.join(REPO, "bench", "hf_to_gguf.py"), folder, out,
             "--gguf-py", os.path.join(args.llama_dir, "gguf-py"), *(["--tokenizer", tokenizer] if tokenizer else [])]))
    if keep:
        return folder, gguf
    remove(folder)
    return None, gguf


def quantized(args, folder, recipe):
    """The W8A8_DYNAMIC checkpoint `cvllm quantize` writes from a bf16 checkpoint folder, made once per
    cvllm build."""
    return made_once(f"{folder}-w8a8-dynamic", lambda out: run(
        [args.cvllm, "quantize", folder, out, "--scheme", "w8a8_dynamic", "--recipe", recipe], quiet=True), args.cvllm)


def q8_0(args, gguf):
    """llama-quantize's Q8_0 of a bf16 GGUF, made once."""
    return made_once(gguf[:-len(".gguf")] + "-q8_0.gguf", lambda out: run(
        [os.path.join(args.llama_bin, "llama-quantize"), gguf, out, "Q8_0", os.cpu_count() or 2], quiet=True))


FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def dense_dynamic_description(cfg):
    """quant_model_description.json of a dense Qwen3 with every attention and MLP linear in W8A8_DYNAMIC,
    as `cvllm quantize --scheme w8a8_dynamic --recipe dense` writes it: tools/gen_quant_description.py's
    dense W8A8 layout with each linear's static tensors swapped for the dynamic ones."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import gen_quant_description as recipes  # noqa: E402 (tools/, next to bench/)
    desc = {}
    for name, scheme in recipes.qwen3_w8a8(cfg).items():
        if name == "model_quant_type":
            desc[name] = "W8A8_DYNAMIC"
        elif scheme != "W8A8":
            desc[name] = scheme
        elif name.endswith(".weight"):  # the linear's other static tensors are left out
            recipes.linear(desc, name[:-len(".weight")], "W8A8_DYNAMIC")
    return desc


def dummy_model(args, shape, quant):
    """A model folder for --load-format dummy: the shipped Qwen3-{shape} one as is (bf16), or a copy
    made anew with a W8A8_DYNAMIC description of the dense recipe (w8a8) or Qwen's block-wise FP8
    quantization_config (fp8)."""
    src = shipped(shape)
    if quant == "bf16":
        return src
    d = os.path.join(args.work, f"qwen3-{shape}-{quant}-dummy")
    remove(d)
    shutil.copytree(src, d)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if quant == "w8a8":
        out, doc = "quant_model_description.json", dense_dynamic_description(cfg)
    else:
        out, doc = "config.json", dict(cfg, quantization_config=FP8_CONFIG)
    with open(os.path.join(d, out), "w") as f:
        json.dump(doc, f, indent=2)
    return d


# ---- weight bytes -----------------------------------------------------------------------------

GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


def gguf_tensor_bytes(path):
    """{tensor: bytes} from a GGUF's header: each tensor's size is the distance from its data to the
    next tensor's (so its alignment padding, under 32 bytes, counts), which needs no table of types."""
    with open(path, "rb") as f:
        def read(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def string():
            return f.read(read("Q")).decode("utf-8", "replace")

        def value(kind):
            if kind == GGUF_STRING:
                return string()
            if kind == GGUF_ARRAY:
                item, n = read("I"), read("Q")
                return [value(item) for _ in range(n)]
            return read(GGUF_SCALARS[kind])

        if f.read(4) != b"GGUF":
            sys.exit(f"compare: {path} is not a GGUF file")
        _, n_tensors, n_kv = read("I"), read("Q"), read("Q")
        meta = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(read("I"))
        infos = []
        for _ in range(n_tensors):
            name = string()
            for _ in range(read("I")):
                read("Q")  # dimensions
            read("I")  # ggml type
            infos.append((read("Q"), name))
        align = meta.get("general.alignment", 32)
        data_bytes = os.path.getsize(path) - -(-f.tell() // align) * align
    infos.sort()
    ends = [offset for offset, _ in infos[1:]] + [data_bytes]
    return {name: end - offset for (offset, name), end in zip(infos, ends)}


def safetensors_tensor_bytes(folder):
    """{tensor: bytes} from the headers of every .safetensors file in a checkpoint folder."""
    sizes = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            with open(os.path.join(folder, file), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            sizes.update({k: v["data_offsets"][1] - v["data_offsets"][0]
                          for k, v in header.items() if k != "__metadata__"})
    return sizes


def streamed_bytes(path, expert_share=1.0):
    """Weight bytes one decode token reads, from the tensors as stored in path (a checkpoint folder or
    a GGUF): all of them but the token embedding, which a token only gathers a row of (unless there is
    no separate lm_head: then it is the lm_head), with routed experts counted at expert_share (top-k of
    the experts). Scales and norms count; they are a fraction of a percent."""
    sizes = gguf_tensor_bytes(path) if path.endswith(".gguf") else safetensors_tensor_bytes(path)
    tied = "lm_head.weight" not in sizes and "output.weight" not in sizes
    total = 0
    for name, size in sizes.items():
        if name.endswith("embed_tokens.weight") or name == "token_embd.weight":
            total += size if tied else 0
        elif ".mlp.experts." in name or "_exps." in name:
            total += size * expert_share
        else:
            total += size
    return total


def checkpoint_bytes(folder):
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))


def kv_bytes_per_token(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * hd * 4  # K and V, f32


# ---- measurements -----------------------------------------------------------------------------

def cvllm_latency(args, model, input_len, output_len, extra=()):
    """(tok/s, peak resident MiB) of `cvllm bench latency`: decode tok/s, or prefill's for output_len 1."""
    # Warm-up of about the wall time llama-bench's own (one whole run: ~2.7 s for its pp512 here): the
    # first seconds after the page-cache drop run slow (cvllm pp512, 3 iterations right after a drop:
    # 1136-1290 tok/s, the next launch 1375-1444; 12 iterations: 1440 both), and one 0.35 s warm-up
    # iteration left the timed ones in that window.
    warmup = 1 if output_len > 1 else max(1, 4096 // input_len)
    with tempfile.NamedTemporaryFile(suffix=".json", dir=args.work) as out:
        r = run([args.cvllm, "bench", "latency", "--model", model, "--input-len", input_len, "--output-len",
                 output_len, "--batch-size", 1, "--num-iters-warmup", warmup, "--num-iters", 3, "--num-threads",
                 args.threads, "--max-model-len", 4096, "--kv-cache-memory-bytes", 1 << 30, "--output-json", out.name,
                 *extra], quiet=True)
        with open(out.name) as f:
            j = json.load(f)
    return j["decode_tokens_per_second"] if output_len > 1 else j["prefill_tokens_per_second"], r.peak_rss_mib


def llama_bench(args, gguf, n_prompt, n_gen, depth=0):
    out = run([os.path.join(args.llama_bin, "llama-bench"), "-m", gguf, "-t", args.threads, "-p", n_prompt, "-n",
               n_gen, "-d", depth, "-r", 3, "-o", "json"], capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]


def llama_path(args, gguf):
    """Which of llama.cpp's paths runs a GGUF: the backends llama-bench reports and the buffer types the
    weights are loaded into — CPU_Mapped runs them from the file as stored, CPU_REPACK and AMX are
    copies repacked for those kernels (read from its verbose log of a one-token run)."""
    r = run([os.path.join(args.llama_bin, "llama-bench"), "-m", gguf, "-t", args.threads, "-p", 0, "-n", 1, "-r", 1,
             "-o", "json", "-v"], capture_output=True, text=True, errors="replace")
    buffers = sorted({line.split("model buffer size")[0].split(":")[-1].strip()
                      for line in r.stderr.splitlines() if "model buffer size" in line})
    return f"{json.loads(r.stdout)[0]['backends']}, weights in {'+'.join(buffers) or '?'}"


def ggml_features(args):
    """The CPU features ggml was compiled for (llama_print_system_info of the build's libllama), or why not."""
    try:
        lib = ctypes.CDLL(os.path.join(args.llama_bin, "libllama.so"))
    except OSError as e:
        return f"unknown ({e})"
    lib.llama_print_system_info.restype = ctypes.c_char_p
    return lib.llama_print_system_info().decode().strip(" |")


def cpu_isa():
    """The CPU's model and whether it has the int8 instructions the 8-bit kernels use (/proc/cpuinfo)."""
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    has = lambda f: "yes" if f in flags else "no"  # noqa: E731
    return f"{model}; AVX-512 VNNI {has('avx512_vnni')}, AMX-INT8 {has('amx_int8')}"


def triad(args, exe):
    """(triad GB/s, read GB/s, read GB/s): the best triad and read passes of bench/triad.c, then the
    median read pass."""
    lines = run([exe, args.threads], capture_output=True, text=True).stdout.splitlines()
    best = {line.split()[0]: float(line.split("best=")[1].split()[0]) for line in lines if "best=" in line}
    median = {line.split()[0]: float(line.split("median=")[1].split()[0]) for line in lines if "median=" in line}
    return best["triad"], best["read"], median["read"]


class Bracket:
    """Decode runs with the bandwidth of the seconds around them: around(measure) runs bench/triad.c
    before and after measure() and returns measure()'s result with the mean of the two readings,
    (triad, read) GB/s. Back-to-back runs share a reading (one run's after is the next one's before);
    break_chain() after anything else ran, so that a stale reading is not reused."""

    def __init__(self, args, exe):
        self.args, self.exe, self.last = args, exe, None

    def around(self, measure):
        before = self.last or triad(self.args, self.exe)
        result = measure()
        self.last = triad(self.args, self.exe)
        return result, tuple((b + a) / 2 for b, a in zip(before, self.last))

    def break_chain(self):
        self.last = None


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


# ---- rows -------------------------------------------------------------------------------------

ROWS = ("decode", "f32-decode", "w8a8-decode", "fp8-decode", "deep", "w8a8-deep", "prefill", "apc-prefill",
        "f32-prefill", "w8a8-prefill", "ttft", "f32-ttft", "8b", "w8a8-8b", "serve")
DUMMY, ASCEND, F32 = ("--load-format", "dummy"), ("--quantization", "ascend"), ("--dtype", "float32")
NO_APC = ("--no-enable-prefix-caching",)  # all rows but apc-prefill: see the docstring's prefill and decode
TUTORIAL_BLOCKS = ("--block-size", "128")  # the Qwen3 tutorial's serve command
TTFT_TOKENS = 3500  # the Qwen3 tutorial's workload: 3.5K in


class Row:
    """A table line but serve's: cvllm's tok/s against another engine's (`other`: llama.cpp's, or for
    fp8-decode cvllm's W8A8), each a function measuring it (other None: n/a) that returns (tok/s,
    cvllm's peak resident MiB or None), run in every `every`-th repetition; `path`: which llama.cpp path ran. The 0.6B decode rows carry `files`, (cvllm's
    checkpoint folder, llama.cpp's GGUF or None), for a second line, of the bytes they stream
    (titled `title`, its target `bw_target`)."""

    def __init__(self, title, label, target, cv, other, every=1, files=None, bw_target="", path=""):
        self.title, self.label, self.target, self.cv, self.other = title, label, target, cv, other
        self.every, self.files, self.bw_target, self.path = every, files, bw_target, path


def plan_row(args, name, small):
    """The Row of a --rows name (quantization-what, bf16 when unprefixed: cvllm's default compute
    dtype for a bf16 checkpoint; f32: cvllm --dtype float32 on the same bf16 weights); small: the 0.6B
    checkpoint and its GGUF."""
    quant, _, what = name.rpartition("-")
    quant = quant or "bf16"
    n = args.eight_b_tokens if what == "8b" else args.tokens
    if what == "prefill":
        cv_io, ll_io, kind = (args.prompt_len, 1), (args.prompt_len, 0), f"pp{args.prompt_len}"
    elif what == "ttft":  # a prompt's prefill tok/s; its time to first token is TTFT_TOKENS / that
        cv_io, ll_io, kind = (TTFT_TOKENS, 1), (TTFT_TOKENS, 0), f"pp{TTFT_TOKENS}; TTFT = {TTFT_TOKENS} / tok/s"
    elif what == "deep":  # decode after the TTFT prompt: attention reads as many bytes as the weights
        cv_io, ll_io = (TTFT_TOKENS, n + 1), (0, n, TTFT_TOKENS)
        kind = f"tg{n} @ depth {TTFT_TOKENS}; cvllm in 128-slot blocks"
    else:
        cv_io, ll_io, kind = (1, n + 1), (0, n), f"tg{n}"
    if quant == "fp8":
        fp8, w8a8 = dummy_model(args, "0.6B", "fp8"), dummy_model(args, "0.6B", "w8a8")
        return Row("0.6B FP8 decode", f"0.6B FP8 vs W8A8_DYNAMIC decode tok/s ({kind}): cvllm FP8 (128×128 "
                   f"blocks), cvllm W8A8_DYNAMIC in the llama.cpp column, both --load-format dummy", "≥ 0.9×",
                   lambda: cvllm_latency(args, fp8, *cv_io, DUMMY + NO_APC),
                   lambda: cvllm_latency(args, w8a8, *cv_io, DUMMY + ASCEND + NO_APC), path="(cvllm)")
    shape, step = ("8B", "decode") if what == "8b" else ("0.6B", what)
    if what == "8b":
        model, extra = dummy_model(args, "8B", quant), DUMMY
        gguf = checkpoint(args, shipped("8B"), "qwen3-8B-random", keep=False)[1]
        note = ", cvllm --load-format dummy vs a random GGUF"
    else:
        model, extra, gguf, note = small[0], (), small[1], ""
    if quant == "w8a8":
        model = model if what == "8b" else quantized(args, model, "dense")
        extra += ASCEND
        gguf = gguf and q8_0(args, gguf)
    if quant == "f32":
        extra += F32
    if quant != "apc":
        extra += NO_APC
    if what == "deep":
        extra += TUTORIAL_BLOCKS
    label = {"bf16": "", "f32": " (cvllm --dtype float32)", "w8a8": " W8A8_DYNAMIC vs Q8_0",
             "apc": " (cvllm prefix caching on)"}[quant]
    title = f"{shape}{label} {'decode at depth ' + str(TTFT_TOKENS) if step == 'deep' else step}"
    targets = {"decode": ("≥ 1.2×", "reported"), "prefill": ("≥ 1.3× (AVX512-BF16), ≥ 8× (AMX)", "≥ 2×"),
               "ttft": ("reported", "reported"), "deep": ("reported", "reported"), "8b": ("≥ 1.1×", "≥ 1.2×")}
    target = "reported" if quant in ("f32", "apc") else targets[what][quant == "w8a8"]  # the tok/s ratio's: (bf16, w8a8)
    return Row(title, f"{title} tok/s ({kind}{note})", target,
               lambda: cvllm_latency(args, model, *cv_io, extra),
               gguf and (lambda: (llama_bench(args, gguf, *ll_io), None)), every=2 if what == "8b" else 1,
               files=(model, gguf) if what == "decode" else None,
               bw_target="≥ 1× and cvllm ≥ 85 %" if quant == "w8a8" else "cvllm ≥ 80 %",
               path=llama_path(args, gguf) if gguf else "")


# ---- report -----------------------------------------------------------------------------------

def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, digits=2):
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def ratio(a, b):
    return a / b if b and b == b and a == a else float("nan")


def print_header(args, why, what):
    """Who ran against whom, where and when (what: e.g. the number of repetitions)."""
    print(f"\ncvllm {git_commit(REPO)} vs llama.cpp {git_commit(args.llama_dir) if args.llama_bin else 'n/a'}; "
          f"{args.threads} threads; {os.uname().nodename} ({os.cpu_count()} CPUs); {time.strftime('%Y-%m-%d %H:%M')}; "
          f"{what}{'; page cache dropped before each repetition' if args.drop_caches else ''}")
    print(f"CPU: {cpu_isa()}")
    if args.llama_bin:
        print(f"llama.cpp's ggml built for: {ggml_features(args)}")
    if why:
        print(f"llama.cpp columns n/a: {why}")


def streamed(runs, nbytes):
    """The table cell of an engine's decode runs, [(tok/s, Bracket's readings around the run)], at
    nbytes of weights a token: the median GB/s and the medians of the runs' shares of each reading
    (the best triad, the best read, the median read)."""
    gbs = [t * nbytes / 1e9 for t, _ in runs]
    share = [med([100 * g / bw[i] for g, (_, bw) in zip(gbs, runs)]) for i in range(3)]
    return f"{fmt(med(gbs))} GB/s ({' / '.join(f'{fmt(x, 0)} %' for x in share)})"


def bandwidth_line(label, runs, nbytes, target, path=""):
    """The table line of each engine's weight bytes streamed per second, of its own bytes per token
    (runs, nbytes: (cvllm, llama.cpp); runs as streamed() takes them, possibly empty)."""
    mib = " / ".join(fmt(b / 2**20, 0) if b else "n/a" for b in nbytes)
    cells = [streamed(r, b) if b and r else "n/a" for r, b in zip(runs, nbytes)]
    gbs = [med([t for t, _ in r]) * b if b and r else float("nan") for r, b in zip(runs, nbytes)]
    bws = [bw for r in runs for _, bw in r]
    return (f"| {label}: weights streamed (MiB/token {mib}), median share of the best triad / best read / "
            f"median read around each run (medians {' / '.join(fmt(med([b[i] for b in bws])) for i in range(3))} "
            f"GB/s) | {cells[0]} | "
            f"{cells[1]} | {fmt(ratio(*gbs))}× | {target} | {path} |")


def common_args(doc, cvllm_help):
    """The options every comparison script shares (engines, threads, repetitions, work folder)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default=os.environ.get("CVLLM_BENCH_WORK", "/tmp/cvllm-bench"))
    ap.add_argument("--llama-dir", default=os.environ.get("LLAMA_CPP_DIR", "/work/ext/llama.cpp"))
    ap.add_argument("--cvllm", help=cvllm_help)
    ap.add_argument("--drop-caches", action="store_true",
                    help="before each repetition, write back and drop the page cache (root only), so both "
                         "engines map weight files read into fresh pages")
    return ap


def drop_caches(args):
    """Both engines stream their weights from file mappings (cvllm's packed-weight cache, llama.cpp's
    GGUF), so the page cache's pages are what decode reads. On the shared VMs this project measures on,
    pages that had sat in the cache for hours streamed ~1.5x slower than the same files read into fresh
    pages (cvllm bf16 decode 15.5 vs 22-24 tok/s, llama.cpp alike, the triad unchanged), which no engine
    controls; dropping the cache before each repetition puts both on fresh pages."""
    if not args.drop_caches:
        return
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as e:
        sys.exit(f"--drop-caches: {e} (it needs root)")


def main():
    ap = common_args(__doc__, "a built cvllm binary (default: build one under --work)")
    ap.add_argument("--serve-prompts", type=int, default=64)
    ap.add_argument("--serve-reps", type=int, default=1, help="serve runs per engine (each ~5-10 min here)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per 0.6B decode run")
    ap.add_argument("--prompt-len", type=int, default=512, help="prompt tokens of the prefill rows")
    ap.add_argument("--eight-b-tokens", type=int, default=16, help="tokens generated per 8B decode run")
    ap.add_argument("--rows", default="decode,prefill,serve,8b", help=f"a comma-separated subset of {','.join(ROWS)}")
    args = ap.parse_args()
    rows = [r for r in ROWS if r in args.rows.split(",")]
    unknown = set(args.rows.split(",")) - set(ROWS)
    if unknown:
        ap.error(f"unknown --rows {','.join(sorted(unknown))} (rows: {','.join(ROWS)})")
    os.makedirs(args.work, exist_ok=True)
    args.work = os.path.abspath(args.work)
    args.cvllm = build_cvllm(args)
    tools = ["llama-bench"] + ["llama-server"] * ("serve" in rows) + ["llama-quantize"] * any("w8a8" in r for r in rows)
    args.llama_bin, why = find_llama(args, tools)
    if why:
        log(f"llama.cpp not available: {why}")
    small = checkpoint(args, shipped("0.6B"), "qwen3-0.6B-random")
    plan = {name: plan_row(args, name, small) for name in rows if name != "serve"}
    bracket = Bracket(args, build_triad(args)) if any(row.files for row in plan.values()) else None
    res = {name: {"cv": [], "other": [], "cv_rss": [], "other_rss": [], "cv_bw": [], "other_bw": []} for name in plan}
    for rep in range(args.reps):
        log(f"repetition {rep + 1}/{args.reps}")
        drop_caches(args)
        if bracket:
            bracket.break_chain()
        for name, row in plan.items():
            for side, measure in (("cv", row.cv), ("other", row.other)):
                if measure and rep % row.every == 0:
                    if row.files:
                        (tok_s, rss), bw = bracket.around(measure)
                        res[name][side + "_bw"].append(bw)
                    else:
                        tok_s, rss = measure()
                        if bracket:
                            bracket.break_chain()
                    res[name][side].append(tok_s)
                    res[name][side + "_rss"] += [rss] if rss else []
    serve = None
    if "serve" in rows:  # each repetition runs cvllm then llama-server, so load drifts hit both
        runs = [serve_row(args, *small) for _ in range(args.serve_reps)]
        cv = (med([r[0][0] for r in runs]), med([r[0][1] for r in runs]))
        ll = (med([r[1][0] for r in runs]), med([r[1][1] for r in runs])) if runs[0][1] else None
        ready = tuple(med([r[2][i] for r in runs]) if runs[0][2][i] is not None else None for i in range(3))
        serve = (cv, ll, ready, (max(r[3][0] for r in runs), runs[0][3][1]))
        res["serve"] = [[r[0][0], r[1][0] if r[1] else None] for r in runs]

    print_header(args, why, f"medians of {args.reps} (8B rows: of every other one)")
    print("| workload | cvllm | llama.cpp | ratio | target | llama.cpp path |")
    print("|---|---|---|---|---|---|")
    for name, row in plan.items():
        cv, other = med(res[name]["cv"]), med(res[name]["other"])
        print(f"| {row.label} | {fmt(cv)} | {fmt(other)} | {fmt(ratio(cv, other))}× | {row.target} | {row.path} |")
        if row.files:
            nbytes = (streamed_bytes(row.files[0]), row.files[1] and streamed_bytes(row.files[1]))
            runs = [list(zip(res[name][side], res[name][side + "_bw"])) for side in ("cv", "other")]
            print(bandwidth_line(row.title, runs, nbytes, row.bw_target, row.path))
    if serve:
        cv, ll, ready, rss = serve
        path = llama_path(args, small[1]) if ll else ""
        print(f"| serve output tok/s (512/128, conc. 16, {args.serve_prompts} prompts) | {fmt(cv[0])} | "
              f"{fmt(ll[0] if ll else None)} | {fmt(ratio(cv[0], ll[0]) if ll else None)}× | ≥ 4× | {path} |")
        print(f"| serve p99 TPOT ms | {fmt(cv[1])} | {fmt(ll[1] if ll else None)} | | reported | {path} |")
        print(f"| serve start to ready s: packed-weight cache cold / warm | {fmt(ready[0])} / {fmt(ready[1])} | "
              f"{fmt(ready[2])} | | ≤ 2 s | {path} |")
        print(f"| cvllm serve peak RSS MiB (bound: 1.1 × (weights + KV budget)) | {fmt(rss[0], 0)} ({fmt(rss[1], 0)}) "
              f"| | | ≤ bound | |")
    footprints = []  # a quantized row whose weights cvllm ignored would show a bf16-sized footprint
    for name in plan:
        r = res[name]
        footprints.append(f"{name} {fmt(med(r['cv_rss']), 0)}" +
                          (f" (its W8A8 {fmt(med(r['other_rss']), 0)})" if r["other_rss"] else ""))
    if footprints:
        print(f"cvllm peak RSS MiB, medians (KV budget 1024 MiB, not all of it touched): {', '.join(footprints)}")
    print("raw:", json.dumps(res))


def exit_on_failure(main):
    """main() with a failed command ending the benchmark in one line (its output was shown above)."""
    try:
        return main()
    except subprocess.CalledProcessError as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {os.path.basename(e.cmd[0])} exited with {e.returncode} "
                 f"(its command and output are above)")


if __name__ == "__main__":
    exit_on_failure(main)
