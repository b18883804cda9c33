#!/usr/bin/env python3
"""test_tutorials.py — the command lines of vLLM's Qwen tutorials, pasted as users paste them, with
`cvllm` in place of `vllm`, against the real server.

TUTORIALS below holds the lines exactly as the tutorials print them (shell continuations, the
underscore spelling `--speculative_config`, the abbreviation `--random-input`, Ascend-only environment
variables). The test changes only what cannot work on a machine without the weights or without a
fixed free port, and says so in REPLACEMENTS:
  - the model id of `serve` becomes a small checkpoint folder of the same architecture (a reference
    fixture's config.json at the real Qwen vocabulary, with the tokenizer and chat template cvllm
    ships), and `--load-format dummy` is appended: the weights cannot be fetched here;
  - `--port N` becomes a free port (added to `bench serve` lines that rely on the default 8000);
  - the stand-ins of the W8A8 models are the msModelSlim reference fixtures of their architecture
    (quant_model_description.json: W8A8 static for Qwen3 dense, the W8A8_DYNAMIC MoE recipe for
    Qwen3.6), so `--quantization ascend` stays and the dummy weights are int8 in those schemes; on an
    unquantized stand-in the flag is refused with vLLM's message (checked);
  - `bench serve` keeps the tutorial's model id, whose tokenizer cvllm ships, and runs fewer prompts
    (--num-prompts 200 -> 4) at a higher --request-rate so the test takes seconds, not minutes.
Then the tutorials' functional checks (the curl requests) are sent as written, and `bench serve` must
complete every prompt and write its --save-result file into --result-dir.

The real widths of Qwen3.6-35B-A3B cut to 4 layers (bench/configs/qwen3.6-35b-a3b-4layers) in its
W8A8 recipe must also serve as the tutorial's command line runs it (dummy int8 weights).

Each serve line is also run with its real model id, unchanged but for HF_HUB_OFFLINE=1: cvllm must
say in one line that the weights cannot be fetched and print the same command with
`--load-format dummy`; and that command, run, must refuse the 32B/35B model for size at once with
the numbers, before making any weight (where the machine's memory is too small for it, as on the
project's 24 GiB machines).

Usage: test_tutorials.py CVLLM_BINARY SOURCE_DIR   (ctest runs it as test_tutorials)
Prints "N passed, N failed"; exits 0 when nothing failed.
"""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BINARY, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TIMEOUT_S = 120

# The tutorials' environment, as pasted (only the lines a process can take: `export`).
TUTORIAL_ENV = {
    "VLLM_USE_MODELSCOPE": "True",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "HCCL_OP_EXPANSION_MODE": "AIV",
    "HCCL_BUFFSIZE": "1024",
    "OMP_NUM_THREADS": "1",
    "TASK_QUEUE_ENABLE": "1",
    "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3",
    "VLLM_ASCEND_ENABLE_FLASHCOMM1": "1",
}

TUTORIALS = {
    "qwen3.6 single node": r"""vllm serve Eco-Tech/Qwen3.6-35B-A3B-w8a8 \
--host 0.0.0.0 \
--port 8000 \
--data-parallel-size 1 \
--tensor-parallel-size 2 \
--enable-expert-parallel \
--seed 1024 \
--quantization ascend \
--served-model-name qwen3.6 \
--max-num-seqs 128 \
--max-model-len 262144 \
--max-num-batched-tokens 16384 \
--trust-remote-code \
--gpu-memory-utilization 0.90 \
--enable-prefix-caching \
--compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' \
--additional-config '{"enable_cpu_binding":true, "enable_flashcomm1":true, "multistream_overlap_shared_expert": true}' \
--async-scheduling""",
    "qwen3.6 300I DUO with MTP": r"""vllm serve Eco-Tech/Qwen3.6-35B-A3B-w8a8 \
--host 127.0.0.1 \
--port 8080 \
--tensor-parallel-size 2 \
--gpu-memory-utilization 0.90 \
--max-num-seqs 16 \
--served-model-name qwen3.6 \
--dtype float16 \
--additional-config '{"ascend_compilation_config": {"enable_npugraph_ex":false}}' \
--compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1,8]}' \
--quantization ascend \
--max-model-len 20480 \
--no-enable-prefix-caching \
--speculative_config '{"method": "mtp", "num_speculative_tokens": 1}'""",
    "qwen3.6 tuning-table MTP": r"""vllm serve Eco-Tech/Qwen3.6-35B-A3B-w8a8 \
--host 127.0.0.1 \
--port 8080 \
--tensor-parallel-size 2 \
--served-model-name qwen3.6 \
--quantization ascend \
--max-model-len 20480 \
--speculative-config '{"method": "qwen3_5_mtp", "num_speculative_tokens": 3, "enforce_eager": true}'""",
    "qwen3-32b multi-card": r"""vllm serve vllm-ascend/Qwen3-32B-W8A8 \
  --served-model-name qwen3 \
  --trust-remote-code \
  --quantization ascend \
  --distributed-executor-backend mp \
  --tensor-parallel-size 4 \
  --max-model-len 5500 \
  --max-num-batched-tokens 40960 \
  --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
  --additional-config '{"pa_shape_list":[48,64,72,80], "weight_prefetch_config":{"enabled":true}}' \
  --port 8113 \
  --block-size 128 \
  --gpu-memory-utilization 0.9""",
}

CHECKS = {
    "qwen3.6": ("/v1/completions", r"""{
"model": "qwen3.6",
"prompt": "The future of AI is",
"max_tokens": 50,
"temperature": 0
}"""),
    "qwen3": ("/v1/chat/completions", r"""{
  "model": "qwen3",
  "messages": [
    {"role": "user", "content": "Give me a short introduction to large language models."}
  ],
  "temperature": 0.6,
  "top_p": 0.95,
  "top_k": 20,
  "max_completion_tokens": 4096
}"""),
}

BENCH = {
    "qwen3.6": r"""vllm bench serve \
--model Eco-Tech/Qwen3.6-35B-A3B-w8a8 \
--served-model-name qwen3.6 \
--dataset-name random \
--random-input 200 \
--num-prompts 200 \
--request-rate 1 \
--save-result \
--result-dir ./""",
    "qwen3": "vllm bench serve --model vllm-ascend/Qwen3-32B-W8A8 --served-model-name qwen3 --port 8113 "
             "--dataset-name random --random-input 200 --num-prompts 200 --request-rate 1 --save-result --result-dir ./",
}

# The stand-in checkpoint for each tutorial model: a reference fixture of the same architecture and
# quantization; UNQUANTIZED: a float fixture of the same architecture, for the refusal of the flag.
STAND_INS = {
    "Eco-Tech/Qwen3.6-35B-A3B-w8a8": ("qwen3.5-moe-w8a8-dynamic", "models/Qwen/Qwen3.6-35B-A3B"),
    "vllm-ascend/Qwen3-32B-W8A8": ("qwen3-dense-w8a8", "models/qwen3-tokenizer"),
}
UNQUANTIZED = {
    "Eco-Tech/Qwen3.6-35B-A3B-w8a8": ("qwen3.5-moe-bf16", "models/Qwen/Qwen3.6-35B-A3B"),
    "vllm-ascend/Qwen3-32B-W8A8": ("qwen3-dense-bf16", "models/qwen3-tokenizer"),
}
REPLACEMENTS = ["serve MODEL -> stand-in folder + --load-format dummy", "--port -> a free port",
                "bench: --num-prompts 200 -> 4, --request-rate 1 -> 20"]

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}", file=sys.stderr)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stand_in(workdir, model_id, table=STAND_INS):
    fixture, tokenizer_dir = table[model_id]
    out = os.path.join(workdir, fixture)
    if os.path.isdir(out):
        return out
    os.makedirs(out)
    src = os.path.join(SOURCE, "tests/data/vectors", fixture)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    if os.path.exists(os.path.join(src, "quant_model_description.json")):
        os.symlink(os.path.join(src, "quant_model_description.json"), os.path.join(out, "quant_model_description.json"))
    # The real tokenizer's ids reach past the fixture's 4096-token vocabulary; dummy weights at the
    # real vocabulary size take any id.
    text = config.get("text_config", config)
    text["vocab_size"] = 151936
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    for name in os.listdir(os.path.join(SOURCE, tokenizer_dir)):
        if name.startswith("tokenizer") or name == "chat_template.jinja":
            os.symlink(os.path.join(SOURCE, tokenizer_dir, name), os.path.join(out, name))
    return out


def argv_of(line):
    args = shlex.split(line.replace("\\\n", " "))
    assert args[0] == "vllm"
    return [BINARY] + args[1:]


def replace_port(args, port):
    for i, a in enumerate(args):
        if a == "--port":
            args[i + 1] = str(port)
            return args
    return args + ["--port", str(port)]


def four_layer_w8a8(workdir):
    """Qwen3.6-35B-A3B's real widths cut to 4 layers, with the W8A8 description of its recipe."""
    config_dir = os.path.join(SOURCE, "bench/configs/qwen3.6-35b-a3b-4layers")
    out = os.path.join(workdir, "qwen3.6-35b-a3b-4layers-w8a8")
    os.makedirs(out)
    for name in os.listdir(config_dir):
        os.symlink(os.path.join(config_dir, name), os.path.join(out, name))
    subprocess.run([sys.executable, os.path.join(SOURCE, "tools/gen_quant_description.py"), "qwen3_5-moe-w8a8",
                    os.path.join(config_dir, "config.json"), os.path.join(out, "quant_model_description.json")],
                   check=True)
    return out


def serve_argv(line, workdir, port, model=None):
    args = argv_of(line)
    model_id = args[2]
    args[2] = model or stand_in(workdir, model_id)
    return replace_port(args, port) + ["--load-format", "dummy"]


def http(port, path, body=None, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body.encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_ready(proc, port, log_path, timeout=TIMEOUT_S):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if http(port, "/health", timeout=2)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def run_quantization_check(name, line, workdir):
    """`--quantization ascend` on the unquantized stand-in: vLLM's error, not a silent bf16 run."""
    args = argv_of(line)
    args[2] = stand_in(workdir, args[2], UNQUANTIZED)
    out = subprocess.run(replace_port(args, free_port()) + ["--load-format", "dummy"], cwd=workdir,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    check(out.returncode == 1 and last == "cvllm serve: Cannot find the config file for ascend",
          f"{name}: --quantization ascend on an unquantized checkpoint: {out.returncode} {last}")


def run_tutorial(name, line, workdir, model=None, start_timeout=TIMEOUT_S):
    log_path = os.path.join(workdir, re.sub(r"\W+", "_", name) + ".log")
    env = dict(os.environ, **TUTORIAL_ENV)
    # A port found free can be taken by another test before the server binds it: then another one.
    for attempt in range(3):
        port = free_port()
        args = serve_argv(line, workdir, port, model)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
        ready = wait_ready(proc, port, log_path, start_timeout)
        if ready or "cannot listen on" not in open(log_path).read() or attempt == 2:
            break
        proc.wait()
    if not check(ready, f"{name}: server did not start:\n{open(log_path).read()}"):
        proc.kill()
        proc.wait()
        return
    try:
        served = args[args.index("--served-model-name") + 1]
        path, body = CHECKS[served]
        status, text = http(port, path, body)
        reply = json.loads(text)
        check(status == 200 and reply["choices"][0]["finish_reason"] in ("stop", "length"), f"{name}: {text[:300]}")
        check(reply["model"] == served and reply["usage"]["completion_tokens"] > 0, f"{name}: usage/model {text[:300]}")
        if "mtp" in line:
            _, metrics = http(port, "/metrics")
            drafts = re.search(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} (\S+)", metrics, re.M)
            check(drafts and float(drafts.group(1)) > 0, f"{name}: MTP drafted nothing")
        bench_line = BENCH[served]
        if name.endswith("single node") or name.startswith("qwen3-32b"):
            run_bench(name, bench_line, port, workdir, env)
        log = open(log_path).read()
        check("Traceback" not in log and "ERROR" not in log, f"{name}: errors in the log:\n{log}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
            check(rc == 0, f"{name}: cvllm serve did not exit 0 on SIGTERM (status {rc}); its log ends:\n"
                  + open(log_path).read()[-4000:])
        except subprocess.TimeoutExpired:
            proc.kill()
            check(False, f"{name}: cvllm serve did not stop on SIGTERM")


def run_bench(name, line, port, workdir, env):
    args = replace_port(argv_of(line), port)
    args[args.index("--num-prompts") + 1] = "4"
    args[args.index("--request-rate") + 1] = "20"
    result_dir = os.path.join(workdir, re.sub(r"\W+", "_", name) + "_bench")
    os.makedirs(result_dir)
    out = subprocess.run(args, cwd=result_dir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    check(out.returncode == 0, f"{name}: bench serve exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    check("Successful requests:                     4" in out.stdout, f"{name}: bench serve report:\n{out.stdout}")
    files = [f for f in os.listdir(result_dir) if f.endswith(".json")]
    if check(len(files) == 1, f"{name}: --save-result wrote {files}"):
        with open(os.path.join(result_dir, files[0])) as f:
            result = json.load(f)
        check(result.get("completed") == 4 and result.get("num_prompts") == 4, f"{name}: result {str(result)[:300]}")


def ram_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def run_as_pasted(name, line, workdir):
    env = dict(os.environ, **TUTORIAL_ENV, HF_HUB_OFFLINE="1")
    out = subprocess.run(argv_of(line), cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    check(out.returncode != 0 and "--load-format dummy" in last and last.startswith("cvllm serve: "),
          f"{name}: offline, as pasted: {out.returncode} {last}")
    hint = last[last.find(BINARY):] if BINARY in last else ""
    if not check(hint.endswith("--load-format dummy"), f"{name}: the hint is not a command: {last}"):
        return
    if ram_bytes() * 0.9 >= 80 << 30:
        print(f"skipped: {name}: this machine may hold the full model; not starting it", file=sys.stderr)
        return
    # "At once" = before any weight is made: the refused process peaks far below the model's size
    # (memory, not time, so a busy machine cannot fail it).
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(shlex.split(hint), cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().strip()
    last = text.splitlines()[-1] if text else ""
    check(proc.returncode != 0 and "GiB" in last and usage.ru_maxrss < (1 << 20),
          f"{name}: the dummy command should be refused for size before loading: {proc.returncode} "
          f"peak {usage.ru_maxrss >> 10} MiB: {last}")


def main():
    workdir = tempfile.mkdtemp(prefix="cvllm-tutorials-")
    try:
        for name, line in TUTORIALS.items():
            run_as_pasted(name, line, workdir)
            run_quantization_check(name, line, workdir)
            run_tutorial(name, line, workdir)
        run_tutorial("qwen3.6 single node, 4 layers of the real widths in W8A8", TUTORIALS["qwen3.6 single node"],
                     workdir, four_layer_w8a8(workdir), start_timeout=600)  # makes ~5 GB of dummy weights
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"test_tutorials: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
