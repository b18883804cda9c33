#!/usr/bin/env python3
"""hf_server.py — a tiny stand-in for the Hugging Face Hub (and ModelScope) for download tests.

Serves one repository, whose files are those under --root, on 127.0.0.1 at an ephemeral port, and
prints the port on stdout (one line) once it is listening. Endpoints, as the real services spell
them:

  GET /api/models/REPO/revision/REV                      {"id", "sha", "siblings": [{"rfilename"}]}
  GET /REPO/resolve/REV/FILE                              the file; honours "Range: bytes=N-"
  GET /api/v1/models/REPO/repo/files?Revision=R&Recursive=true   {"Code", "Data": {"Files": [...]}}
  GET /api/v1/models/REPO/repo?Revision=R&FilePath=FILE  the file (ModelScope)

REV must be "main", "master" or the --sha. Options:
  --token T       answer 401 unless "Authorization: Bearer T" is sent
  --cut-once F    the first full (non-range) GET of file F sends the headers and half of the body,
                  then drops the connection (to exercise resuming)
  --log PATH      append one line per request: "GET /path range=bytes=N-" (or range=-)
  --lifetime S    exit after S seconds whatever happens (a test that dies cannot leave it running)

Standard library only.
"""
import argparse
import json
import os
import re
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def list_files(root):
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return sorted(out)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hf_server/1"

    def log_message(self, fmt, *args):  # keep the test's output clean
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        opts = self.server.opts
        if opts.log:
            with open(opts.log, "a") as f:
                f.write("GET %s range=%s\n" % (self.path, self.headers.get("Range", "-")))
        if opts.token and self.headers.get("Authorization") != "Bearer " + opts.token:
            return self.send_json(401, {"error": "Invalid credentials in Authorization header"})
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        repo = re.escape(opts.repo)
        m = re.fullmatch(r"/api/models/%s/revision/(.+)" % repo, path)
        if m:
            if not self.revision_ok(m.group(1)):
                return self.send_json(404, {"error": "Revision Not Found"})
            siblings = [{"rfilename": f} for f in list_files(opts.root)]
            return self.send_json(200, {"id": opts.repo, "sha": opts.sha, "siblings": siblings})
        m = re.fullmatch(r"/%s/resolve/([^/]+)/(.+)" % repo, path)
        if m:
            return self.send_file(m.group(1), m.group(2))
        if path == "/api/v1/models/%s/repo/files" % opts.repo:
            if not self.revision_ok(query.get("Revision", "")):
                return self.send_json(404, {"Code": 404, "Message": "revision not found"})
            files = [{"Path": f, "Name": os.path.basename(f), "Type": "blob"} for f in list_files(opts.root)]
            files.append({"Path": "subdir", "Name": "subdir", "Type": "tree"})
            return self.send_json(200, {"Code": 200, "Data": {"Files": files}})
        if path == "/api/v1/models/%s/repo" % opts.repo:
            return self.send_file(query.get("Revision", ""), query.get("FilePath", ""))
        return self.send_json(404, {"error": "Repository not found"})

    def revision_ok(self, rev):
        return rev in ("main", "master", self.server.opts.sha)

    def send_file(self, rev, name):
        opts = self.server.opts
        full = os.path.realpath(os.path.join(opts.root, name))
        if not self.revision_ok(rev) or not full.startswith(os.path.realpath(opts.root) + os.sep) \
                or not os.path.isfile(full):
            return self.send_json(404, {"error": "Entry not found"})
        with open(full, "rb") as f:
            data = f.read()
        start = 0
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-", rng)
            if not m:
                return self.send_json(400, {"error": "unsupported range"})
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % len(data))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("X-Repo-Commit", opts.sha)
        self.end_headers()
        cut = False
        with self.server.lock:
            if opts.cut_once == name and not rng and not self.server.cut_done:
                self.server.cut_done = cut = True
        if cut:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(data[start:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--sha", default="0123456789abcdef0123456789abcdef01234567")
    ap.add_argument("--token")
    ap.add_argument("--cut-once")
    ap.add_argument("--log")
    ap.add_argument("--lifetime", type=float, default=120.0)
    opts = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.opts = opts
    server.lock = threading.Lock()
    server.cut_done = False
    timer = threading.Timer(opts.lifetime, lambda: os._exit(3))
    timer.daemon = True
    timer.start()
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
