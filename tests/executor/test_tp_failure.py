#!/usr/bin/env python3
"""test_tp_failure.py — a tensor-parallel server whose worker rank dies ends in bounded time.

`cvllm serve MODEL -tp 2` (cvllm starts both ranks under mpirun) on a small reference checkpoint
answers a completion; then the worker rank (rank 1) is killed with SIGKILL while a request is in
flight. The server must not hang: the in-flight request gets an answer or a closed connection, and the
`cvllm serve` process exits non-zero within BOUND_S (MPI aborts every rank of a job one of whose ranks
died; mpirun then exits non-zero). A second server is stopped with SIGTERM and must drain and exit 0.

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


def start(model, port, log):
    cmd = [BINARY, "serve", model, "-tp", "2", "--port", str(port), "--host", "127.0.0.1", "--max-model-len", "256",
           "--dtype", "float32"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


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


def complete(port, max_tokens=8, timeout=60):
    body = json.dumps({"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read())


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
def served(model, tmp, name):
    """A -tp 2 server that answered one completion: (process, port); killed at the end if still there,
    its log printed when something failed."""
    port = free_port()
    with open(os.path.join(tmp, f"{name}.log"), "w+") as log:
        proc = start(model, port, log)
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


def killed_worker(model, tmp):
    with served(model, tmp, "killed") as (proc, port):
        workers = rank_pids(1, port)
        check(len(workers) == 1, f"one worker rank expected, found {workers}")
        inflight = {}

        def long_request():
            try:
                inflight["status"] = complete(port, max_tokens=240, timeout=BOUND_S)[0]
            except Exception as e:  # a closed connection is an answer too: what matters is no hang
                inflight["error"] = repr(e)

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.1)
        start_kill = time.time()
        for w in workers:
            os.kill(w, signal.SIGKILL)
        rc = exit_status(proc)
        elapsed = time.time() - start_kill
        t.join(timeout=BOUND_S)
        check(not t.is_alive(), "the in-flight request hung after the worker died")
        check(rc is not None and rc != 0, f"serve exit status {rc} after its worker died (want non-zero within "
                                          f"{BOUND_S} s)")
        print(f"worker killed: serve exited {rc} after {elapsed:.1f} s; in-flight request: {inflight}", flush=True)
        check(not rank_pids(0, port) and not rank_pids(1, port), "ranks left running after the job ended")


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
        killed_worker(model, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_tp_failure: {'FAILED' if failures else 'passed'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
