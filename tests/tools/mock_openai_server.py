#!/usr/bin/env python3
"""mock_openai_server.py — a stand-in OpenAI-compatible server with known timing, for `bench serve`.

Listens on 127.0.0.1 at an ephemeral port and prints the port on stdout (one line) once ready.

  GET  /v1/models             {"object":"list","data":[{"id": --model-name, "root": --model-root}]}
  GET  /metrics               with --spec-metrics: vLLM's vllm:spec_decode_* counters, two engines'
                              series, grown by every completed request (2 drafts of 3 tokens, 3
                              accepted: 2 at position 0, 1 at position 1, 0 at position 2)
  POST /v1/completions        streams max_tokens chunks {"choices":[{"text": --text}]} as SSE
  POST /v1/chat/completions   the same with {"choices":[{"delta":{"content": --text}}]}, preceded
                              by vLLM's role-only chunk {"delta":{"role":"assistant","content":""}}

Timing: the first text chunk leaves --ttft-ms after the request was read, then one chunk every
--itl-ms. With stream_options.include_usage, a usage chunk {"choices":[],"usage":{...}} follows
(completion_tokens = max_tokens, prompt_tokens = --prompt-tokens when given), then "data: [DONE]".
Responses use chunked transfer encoding on kept-alive HTTP/1.1 connections, and each SSE event is
written in two halves with a pause between them, so clients see events split across reads.

Options:
  --no-usage            never send usage (clients must count tokens themselves)
  --fail-every N        every Nth request (1-based) gets HTTP 500 with an OpenAI error body
  --stream-error-every N  every Nth request streams one chunk, then a data: {"error": ...} event
  --ping                send an SSE comment ": ping" before the first chunk (as llama.cpp does)
  --log PATH            append each request's JSON body as one line
  --lifetime S          exit after S seconds whatever happens
  --spec-metrics        serve /metrics as above

Standard library only.
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
LOCK = threading.Lock()
COUNTER = [0]
COMPLETED = [0]


def spec_metrics():
    """Two engines, the requests split between them: the client must sum the series."""
    lines = []
    with LOCK:
        done = COMPLETED[0]
    halves = (done // 2, done - done // 2)
    for name, per_request in (("vllm:spec_decode_num_drafts_total", 2),
                              ("vllm:spec_decode_num_draft_tokens_total", 6),
                              ("vllm:spec_decode_num_accepted_tokens_total", 3)):
        lines.append("# TYPE %s counter" % name)
        for engine, n in enumerate(halves):
            lines.append('%s{engine="%d",model_name="%s"} %.1f' % (name, engine, ARGS.model_name, n * per_request))
    lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
    for engine, n in enumerate(halves):
        for pos, per_request in enumerate((2, 1, 0)):
            lines.append('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="%d",model_name="%s",position="%d"} %.1f'
                         % (engine, ARGS.model_name, pos, n * per_request))
    return ("\n".join(lines) + "\n").encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock_openai/1"

    def log_message(self, fmt, *args):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/metrics" and ARGS.spec_metrics:
            body = spec_metrics()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path != "/v1/models":
            self.send_json(404, {"error": {"message": "not found", "type": "NotFoundError", "code": 404}})
            return
        self.send_json(200, {"object": "list", "data": [
            {"id": ARGS.model_name, "object": "model", "root": ARGS.model_root}]})

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def send_event(self, obj):
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        half = len(data) // 2
        self.write_chunk(data[:half])
        time.sleep(0.001)
        self.write_chunk(data[half:])

    def chunk(self, chat, text, finish=None):
        if chat:
            return {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": ARGS.model_name,
                    "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
        return {"id": "cmpl-mock", "object": "text_completion", "model": ARGS.model_name,
                "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

    def do_POST(self):
        t_read = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with LOCK:
            COUNTER[0] += 1
            number = COUNTER[0]
            if ARGS.log:
                with open(ARGS.log, "a") as f:
                    f.write(body.decode() + "\n")
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(404, {"error": {"message": "no such endpoint", "type": "NotFoundError", "code": 404}})
            return
        if ARGS.fail_every and number % ARGS.fail_every == 0:
            self.send_json(500, {"error": {"message": "mock failure", "type": "InternalServerError", "code": 500}})
            return
        req = json.loads(body)
        n = req.get("max_completion_tokens", req.get("max_tokens", 16)) if chat else req.get("max_tokens", 16)
        usage = (req.get("stream_options") or {}).get("include_usage") and not ARGS.no_usage
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if chat:
            self.send_event({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": ARGS.model_name,
                             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        if ARGS.ping:
            self.write_chunk(b": ping\n\n")
        for k in range(n):
            due = t_read + (ARGS.ttft_ms + k * ARGS.itl_ms) / 1000.0
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if ARGS.stream_error_every and number % ARGS.stream_error_every == 0 and k == 1:
                self.send_event({"error": {"message": "mock stream error", "type": "InternalServerError",
                                           "code": 500}})
                break
            self.send_event(self.chunk(chat, ARGS.text, "length" if k == n - 1 else None))
        if usage:
            u = {"completion_tokens": n}
            if ARGS.prompt_tokens is not None:
                u["prompt_tokens"] = ARGS.prompt_tokens
                u["total_tokens"] = ARGS.prompt_tokens + n
            self.send_event({"id": "cmpl-mock", "object": "text_completion", "model": ARGS.model_name,
                             "choices": [], "usage": u})
        # counted before the last bytes go out, as a server counts a request when it finishes: a client
        # that reads /metrics as soon as its stream ends must find it there
        with LOCK:
            COMPLETED[0] += 1
        self.send_event(b"[DONE]")
        self.write_chunk(b"")


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--ttft-ms", type=float, default=40)
    p.add_argument("--itl-ms", type=float, default=10)
    p.add_argument("--text", default=" hello")
    p.add_argument("--model-name", default="mock-model")
    p.add_argument("--model-root", default="mock-model")
    p.add_argument("--prompt-tokens", type=int, default=None)
    p.add_argument("--no-usage", action="store_true")
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--stream-error-every", type=int, default=0)
    p.add_argument("--ping", action="store_true")
    p.add_argument("--log", default=None)
    p.add_argument("--lifetime", type=float, default=120)
    p.add_argument("--spec-metrics", action="store_true")
    ARGS = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Timer(ARGS.lifetime, lambda: os._exit(0)).start()
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
