#!/usr/bin/env python3
"""test_tp_failure.py — a tensor-parallel server whose worker rank dies or hangs fails cleanly in bounded time.

`cvllm serve MODEL -tp 2` (cvllm starts both ranks under mpirun) on a small reference checkpoint
answers a completion; then, while a streamed request is in flight, its worker rank (rank 1) is
  - killed with SIGKILL (mpirun then sends rank 0 SIGTERM, which in a job means the job is ending), or
  - stopped with SIGSTOP (rank 0's watchdog gives up on it after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS,
    set to 2 here).
Either way the in-flight stream ends with vLLM's error chunk naming the failed rank, a new request
gets 503 (as does /health), and the `cvllm serve` process exits non-zero within BOUND_S, leaving no
rank behind. A third server is stopped with SIGTERM and must drain and exit 0.

Usage: test_tp_failure.py CVLLM_BINARY SOURCE_DIR   (ctest runs it as test_tp_failure)
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BINARY, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
BOUND_S = 30
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir(tmp):
    d = os.path.join(tmp, "qwen3-dense-f32")
    os.makedirs(d)
    src = os.path.join(SOURCE, "tests/data/vectors/qwen3-dense-f32")
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.join(src, f), os.path.join(d, f))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        os.symlink(os.path.join(SOURCE, "models/qwen3-tokenizer", f), os.path.join(d, f))
    return d


def start(model, port, log, env=None):
    cmd = [BINARY, "serve", model, "-tp", "2", "--port", str(port), "--host", "127.0.0.1", "--max-model-len", "256",
           "--dtype", "float32"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))


def wait_ready(proc, port, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def post(port, path, body, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def complete(port, max_tokens=8, timeout=60):
    body = {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    with post(port, "/v1/completions", body, timeout) as r:
        return r.status, json.loads(r.read())


def status_of(port, method, path):
    """The HTTP status of a request (a refused connection: None)."""
    try:
        if method == "GET":
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        with post(port, path, {"prompt": [1, 2, 3], "max_tokens": 2}, 10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def rank_pids(rank, port):
    """The pids of the cvllm processes that are rank `rank` of the job serving on `port`."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
            argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and str(port).encode() in argv:
            pids.append(int(p))
    return pids


@contextlib.contextmanager
def served(model, tmp, name, env=None):
    """A -tp 2 server that answered one completion: (process, port); killed at the end if still there,
    its log printed when something failed."""
    port = free_port()
    with open(os.path.join(tmp, f"{name}.log"), "w+") as log:
        proc = start(model, port, log, env)
        try:
            check(wait_ready(proc, port), f"{name}: the -tp 2 server did not become ready")
            status, out = complete(port)
            check(status == 200 and out["usage"]["completion_tokens"] == 8, f"{name}: a first completion: {out}")
            yield proc, port
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.seek(0)
            if failures:
                print(log.read()[-3000:])


def exit_status(proc):
    """The process's exit status within BOUND_S, or None."""
    try:
        return proc.wait(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        return None


def failed_worker(model, tmp, name, sig, env=None):
    """Rank 1 gets `sig` while a stream is in flight; see the top for what must follow."""
    with served(model, tmp, name, env) as (proc, port):
        workers = rank_pids(1, port)
        check(len(workers) == 1, f"{name}: one worker rank expected, found {workers}")
        body = {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 240, "temperature": 0, "ignore_eos": True,
                "stream": True}
        stream = post(port, "/v1/completions", body, BOUND_S)
        first = stream.readline()
        check(first.startswith(b"data: {"), f"{name}: the stream's first chunk: {first!r}")
        start_fail = time.time()
        for w in workers:
            os.kill(w, sig)
        try:
            rest = stream.read().decode()
        except Exception as e:  # a closed connection would be an answer too, but the error chunk is wanted
            rest = repr(e)
        stream.close()
        check("tensor-parallel rank died or stopped answering" in rest and rest.rstrip().endswith("data: [DONE]"),
              f"{name}: the in-flight stream did not end with the error chunk: {rest[-400:]!r}")
        new, text = status_of(port, "POST", "/v1/completions")
        check(new == 503 and "tensor-parallel rank" in text, f"{name}: a new request got {new} {text!r}, want 503")
        health, _ = status_of(port, "GET", "/health")
        check(health == 503, f"{name}: /health got {health}, want 503")
        rc = exit_status(proc)
        elapsed = time.time() - start_fail
        check(rc is not None and rc != 0, f"{name}: serve exit status {rc} after its worker failed (want non-zero "
                                          f"within {BOUND_S} s)")
        print(f"{name}: serve exited {rc} {elapsed:.1f} s after the worker got signal {sig}", flush=True)
        check(not rank_pids(0, port) and not rank_pids(1, port), f"{name}: ranks left running after the job ended")


def drained(model, tmp):
    with served(model, tmp, "drained") as (proc, port):
        proc.send_signal(signal.SIGTERM)
        rc = exit_status(proc)
        check(rc == 0, f"serve -tp 2 exit status {rc} on SIGTERM (want 0)")
        check(not rank_pids(0, port) and not rank_pids(1, port), "ranks left running after SIGTERM")


def main():
    tmp = tempfile.mkdtemp(prefix="cvllm-tp-failure-")
    try:
        model = model_dir(tmp)
        drained(model, tmp)
        failed_worker(model, tmp, "killed", signal.SIGKILL)
        failed_worker(model, tmp, "hung", signal.SIGSTOP, {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "2"})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_tp_failure: {'FAILED' if failures else 'passed'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
