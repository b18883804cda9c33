#!/usr/bin/env python3
"""Black-box probe of an HTTP/1.1 server's handling of malformed and hostile requests.

Why this exists: a library's parser is judged by what goes over the wire, not by its documentation.
Each case below is sent as raw bytes on a fresh connection, so nothing between the probe and the
server (a client library, a proxy) can normalise the request first. For every case the probe records
what came back: the first bytes, how many status lines (more than one means a garbled reply), the
status, whether the server closed the connection, and the time to the first byte. Two further probes
look at resource exhaustion: many idle connections (can one client lock others out?) and a request
head sent one byte a second (does the server ever give up on it?).

The expectations follow RFC 9110/9112: a malformed request gets exactly one well-formed 4xx (5xx
where the RFC says so) and no hang; framing that could be read two ways (conflicting Content-Length,
Content-Length with Transfer-Encoding) is refused, never guessed at.

The POST framing cases go to --post-path (default /v1/echo, a route the evaluation's test servers
echo on). Against cvllm serve, which has no such route, a request whose framing was accepted gets a
404, so a 404 there still marks a framing error let through.

Usage:
  http_cases.py HOST PORT [--name NAME] [--json FILE] [--post-path PATH] [--lockout-n N ...] [--no-dribble]
  http_cases.py --merge A.json B.json ...     one table, one column per saved run

Progress goes to stderr, the Markdown table to stdout; the exit status is 1 if any case failed.
Standard library only, so it runs anywhere the server does.
"""

import argparse
import json
import re
import resource
import select
import socket
import sys
import time

DEADLINE_S = 3.0     # per case: no reply within this is reported as a hang
SETTLE_S = 0.5       # after a complete reply: time allowed for a second status line or the close
PROMPT_S = 1.0       # lock-out probe: a normal request answered later than this counts as locked out
STATUS_LINE = re.compile(rb'(?:^|\r\n)HTTP/\d\.\d (\d{3})')


def request(method, path, headers, body=b'', version=b'HTTP/1.1'):
    head = method + b' ' + path + b' ' + version + b'\r\n'
    return head + b''.join(h + b'\r\n' for h in headers) + b'\r\n' + body


def post(headers, body, path):
    # A JSON content type, so that an API server's content-type check (done on the head, before the
    # body) does not answer first and hide how the framing is handled.
    return request(b'POST', path, [b'Host: probe', b'Content-Type: application/json'] + headers, body)


def build_cases(post_path):
    """(name, bytes, expectation) triples. An expectation is a set of acceptable statuses; the
    marker 'close' requires the server to close after the reply (framing it must not reuse)."""
    p = post_path.encode()
    get = request(b'GET', b'/v1/models', [b'Host: probe'])
    chunked = [b'Transfer-Encoding: chunked']
    big = b'a' * 100_000
    return [
        ('control GET /v1/models', get, {200}),
        ('request line GARBAGE', b'GARBAGE\r\n\r\n', {400}),
        ('request line GET (no target)', b'GET\r\n\r\n', {400}),
        ('binary first bytes 0x80..0x9f', bytes(range(0x80, 0xa0)), {400}),
        ('TLS ClientHello start 0x16 0x03 0x01', b'\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03' + bytes(32), {400}),
        ('HTTP/2.0 version', request(b'GET', b'/v1/models', [b'Host: probe'], version=b'HTTP/2.0'), {505, 400}),
        ('unknown method FOO', request(b'FOO', b'/v1/models', [b'Host: probe']), {501, 405, 400}),
        ('HTTP/1.1 without Host', request(b'GET', b'/v1/models', []), {400}),
        ('space in header name', request(b'GET', b'/v1/models', [b'Host: probe', b'Bad Name: x']), {400}),
        ('whitespace before colon', request(b'GET', b'/v1/models', [b'Host: probe', b'X-A : x']), {400}),
        ('obs-fold header', request(b'GET', b'/v1/models', [b'Host: probe', b'X-A: a', b' b']), {400, 200}),
        ('20 KB header', request(b'GET', b'/v1/models', [b'Host: probe', b'X-Big: ' + b'a' * 20_000]),
         {431, 400, 200}),
        ('10 KB request line', request(b'GET', b'/' + b'a' * 10_000, [b'Host: probe']), {414, 400, 404}),
        ('raw NUL in path', request(b'GET', b'/v1/models\x00', [b'Host: probe']), {400}),
        ('%00 in path /v1/models%00', request(b'GET', b'/v1/models%00', [b'Host: probe']), {404, 400}),
        ('Transfer-Encoding: gzip', post([b'Transfer-Encoding: gzip'], b'5\r\nhello\r\n0\r\n\r\n', p),
         {501, 400, 'close'}),
        ('Transfer-Encoding: chunked, gzip', post([b'Transfer-Encoding: chunked, gzip'], b'5\r\nhello\r\n0\r\n\r\n', p),
         {400, 'close'}),
        ('Transfer-Encoding: identity', post([b'Transfer-Encoding: identity'], b'hello', p), {501, 400, 'close'}),
        ('Transfer-Encoding: bogus', post([b'Transfer-Encoding: bogus'], b'hello', p), {501, 400, 'close'}),
        ('Transfer-Encoding: (empty)', post([b'Transfer-Encoding:'], b'hello', p), {400, 501, 'close'}),
        ('Content-Length: abc', post([b'Content-Length: abc'], b'hello', p), {400, 'close'}),
        ('Content-Length: -1', post([b'Content-Length: -1'], b'hello', p), {400, 'close'}),
        ('Content-Length: 1.5', post([b'Content-Length: 1.5'], b'hello', p), {400, 'close'}),
        ('Content-Length: 0x10', post([b'Content-Length: 0x10'], b'hello', p), {400, 'close'}),
        ('Content-Length: (empty)', post([b'Content-Length:'], b'hello', p), {400, 'close'}),
        ('Content-Length: 2^64+5 (overflow)', post([b'Content-Length: 18446744073709551621'], b'hello', p),
         {400, 413, 'close'}),
        ('Content-Length 5 and 6 (conflict)', post([b'Content-Length: 5', b'Content-Length: 6'], b'hello!', p),
         {400, 'close'}),
        ('Content-Length 5 twice (equal)', post([b'Content-Length: 5', b'Content-Length: 5'], b'hello', p),
         {400, 200, 404}),
        ('Content-Length 5 + chunked', post([b'Content-Length: 5'] + chunked, b'5\r\nhello\r\n0\r\n\r\n', p),
         {400, 'close'}),
        ('100 KB chunk extension', post(chunked, b'5;x=' + big + b'\r\nhello\r\n0\r\n\r\n', p),
         {400, 413, 'close'}),
        ('100 KB chunk-size line', post(chunked, b'0' * 100_000 + b'5\r\nhello\r\n0\r\n\r\n', p),
         {400, 413, 'close'}),
        ('control GET /v1/models (still up)', get, {200}),
    ]


def reply_complete(data):
    """True once data holds one whole response (so the probe need not wait for a close)."""
    end = data.find(b'\r\n\r\n')
    if end < 0:
        return False
    head = data[:end].lower()
    body = data[end + 4:]
    m = re.search(rb'\r\ncontent-length:\s*(\d+)', head)
    if m:
        return len(body) >= int(m.group(1))
    if re.search(rb'\r\ntransfer-encoding:[^\r]*chunked', head):
        return body.startswith(b'0\r\n\r\n') or b'\r\n0\r\n\r\n' in body
    return re.match(rb'http/\d\.\d (1\d\d|204|304)', head) is not None


def exchange(host, port, payload, deadline=DEADLINE_S):
    """Send payload on a new connection; collect the reply until close, deadline, or a complete
    reply followed by SETTLE_S of silence."""
    r = {'reply': b'', 'ttfb': None, 'end': 'hang'}
    t0 = time.monotonic()
    try:
        s = socket.create_connection((host, port), timeout=deadline)
    except OSError as e:
        r['end'] = 'connect failed: %s' % e.strerror
        return r
    try:
        s.settimeout(deadline)
        try:
            s.sendall(payload)
        except OSError:
            pass  # the server stopped reading (it refused early): its reply, if any, is still readable
        until = t0 + deadline
        while True:
            now = time.monotonic()
            if now >= until:
                break
            s.settimeout(until - now)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                r['end'] = 'reset'
                break
            if not chunk:
                r['end'] = 'closed'
                break
            if r['ttfb'] is None:
                r['ttfb'] = time.monotonic() - t0
            r['reply'] += chunk
            if reply_complete(r['reply']):
                until = min(until, time.monotonic() + SETTLE_S)
        if r['end'] == 'hang' and r['reply']:
            r['end'] = 'open'
    finally:
        s.close()
    return r


def extra_replies(data, n):
    """Names what a second status line means: the same head sent twice (a garbled reply), or a
    second response, i.e. the server read part of the request as another request (smuggling)."""
    if n < 2:
        return ''
    end = data.find(b'\r\n\r\n') + 4
    if end >= 4 and data[end:].startswith(data[:end]):
        return ' head sent twice (garbled)'
    return ' +%d more repl%s (body read as a request)' % (n - 1, 'y' if n == 2 else 'ies')


def judge(r, expect):
    statuses = [int(m.group(1)) for m in STATUS_LINE.finditer(r['reply'])]
    codes = {e for e in expect if isinstance(e, int)}
    ok = (len(statuses) == 1 and statuses[0] in codes
          and (r['end'] in ('closed', 'reset') or 'close' not in expect))
    if not statuses:
        what = 'no reply, ' + r['end']
    else:
        what = '%d%s %s' % (statuses[0], extra_replies(r['reply'], len(statuses)), r['end'])
    if r['ttfb'] is not None:
        what += ' %.0f ms' % (r['ttfb'] * 1000)
    return {'cell': ('ok ' if ok else 'FAIL ') + what, 'ok': ok, 'statuses': statuses, 'end': r['end'],
            'ttfb': r['ttfb'], 'first_bytes': r['reply'][:300].decode('latin-1')}


def expect_text(expect):
    codes = '/'.join(str(e) for e in sorted(e for e in expect if isinstance(e, int)))
    return codes + (' + close' if 'close' in expect else '')


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def lockout(host, port, n, partial, source):
    """Hold n connections (idle, or each with half a request head) from source, then time one normal
    request from the default address. A server that gives each connection a thread or a slot it will
    not reclaim makes the normal client wait or refuses it."""
    raise_nofile(n)
    held, failed = [], 0
    t_open = time.monotonic()
    for _ in range(n):
        if time.monotonic() - t_open > 30:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            if source:
                s.bind((source, 0))
            s.connect((host, port))
            if partial:
                s.sendall(b'GET /v1/models HTTP/1.1\r\nHost: probe\r\n')
            held.append(s)
        except OSError:
            failed += 1
            s.close()
    time.sleep(1.0)  # give the server time to accept (or refuse) the flood before the real client
    r = exchange(host, port, request(b'GET', b'/v1/models', [b'Host: probe']), deadline=10.0)
    j = judge(r, {200})
    ok = j['ok'] and r['ttfb'] < PROMPT_S
    poller = select.poll()  # not select(): the held descriptors run past FD_SETSIZE
    for s in held:
        poller.register(s, select.POLLIN)
    dropped = len(poller.poll(0))  # readable: closed, reset or answered (a 408/503); the server let go of it
    for s in held:
        s.close()
    cell = '%s; held %d (failed %d, server dropped %d)' % (j['cell'], len(held), failed, dropped)
    return {'cell': ('ok ' if ok else 'FAIL ') + cell.split(' ', 1)[1], 'ok': ok}


def dribble(host, port, cap_s=30.0):
    """Send a valid request head one byte per second; report when (if ever) the server cuts it."""
    head = request(b'GET', b'/v1/models', [b'Host: probe', b'X-Pad: ' + b'a' * 64])
    s = socket.create_connection((host, port), timeout=5)
    t0 = time.monotonic()
    try:
        for i in range(len(head)):
            elapsed = time.monotonic() - t0
            if elapsed >= cap_s:
                return {'cell': 'FAIL not cut after %.0f s (%d bytes sent)' % (elapsed, i), 'ok': False}
            try:
                s.sendall(head[i:i + 1])
            except OSError:
                return {'cell': 'ok cut at %.1f s (send failed)' % elapsed, 'ok': True}
            poller = select.poll()
            poller.register(s, select.POLLIN)
            if poller.poll(1000):
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b''
                m = STATUS_LINE.search(data)
                how = 'status %s' % m.group(1).decode() if m else 'closed'
                return {'cell': 'ok cut at %.1f s (%s)' % (time.monotonic() - t0, how), 'ok': True}
        return {'cell': 'FAIL whole head sent, never cut', 'ok': False}
    finally:
        s.close()


def run(args):
    results = {'name': args.name or '%s:%d' % (args.host, args.port), 'cases': {}, 'expect': {}}
    for name, payload, expect in build_cases(args.post_path):
        j = judge(exchange(args.host, args.port, payload), expect)
        results['cases'][name] = j
        results['expect'][name] = expect_text(expect)
        print('%-40s %s' % (name, j['cell']), file=sys.stderr, flush=True)
    source = args.idle_source
    if source == 'auto':
        source = '127.0.0.2' if args.host.startswith('127.') else None
    for n in args.lockout_n:
        for partial in (False, True):
            label = 'lock-out: %d %s connections' % (n, 'half-sent' if partial else 'idle')
            results['cases'][label] = lockout(args.host, args.port, n, partial, source)
            results['expect'][label] = '200 within %.0f s' % PROMPT_S
            print('%-40s %s' % (label, results['cases'][label]['cell']), file=sys.stderr, flush=True)
            time.sleep(2.0)  # let the server reap the flood before the next probe
    if args.dribble:
        label = 'dribble: head at 1 byte/s'
        results['cases'][label] = dribble(args.host, args.port)
        results['expect'][label] = 'cut within 30 s'
        print('%-40s %s' % (label, results['cases'][label]['cell']), file=sys.stderr, flush=True)
    return results


def table(runs):
    names = list(runs[0]['cases'])
    for r in runs[1:]:
        names += [n for n in r['cases'] if n not in names]
    lines = ['| case | expected | ' + ' | '.join(r['name'] for r in runs) + ' |',
             '|---|---|' + '---|' * len(runs)]
    for n in names:
        expect = next((r['expect'][n] for r in runs if n in r['expect']), '')
        cells = [r['cases'][n]['cell'] if n in r['cases'] else 'n/a' for r in runs]
        lines.append('| %s | %s | %s |' % (n, expect, ' | '.join(c.replace('|', '/') for c in cells)))
    passed = ['%d/%d' % (sum(r['cases'][n]['ok'] for n in r['cases']), len(r['cases'])) for r in runs]
    lines.append('| **passed** | | ' + ' | '.join(passed) + ' |')
    return '\n'.join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('host', nargs='?')
    ap.add_argument('port', nargs='?', type=int)
    ap.add_argument('--name', help='column title (default HOST:PORT)')
    ap.add_argument('--json', help='save the results here (for --merge)')
    ap.add_argument('--merge', nargs='+', metavar='FILE', help='print one table from saved runs')
    ap.add_argument('--post-path', default='/v1/echo', help='target of the POST framing cases')
    ap.add_argument('--lockout-n', type=int, nargs='*', default=[1000],
                    help='connections held by each lock-out probe (none given: skip)')
    ap.add_argument('--idle-source', default='auto',
                    help="source address of the held connections ('auto': 127.0.0.2 for a loopback host, so "
                         "a per-address limit does not also refuse the probe's own client)")
    ap.add_argument('--no-dribble', dest='dribble', action='store_false', help='skip the 30 s slow-head probe')
    args = ap.parse_args()
    if args.merge:
        runs = []
        for f in args.merge:
            with open(f) as fh:
                runs.append(json.load(fh))
        print(table(runs))
        return
    if not args.host or not args.port:
        ap.error('HOST and PORT are required unless --merge is given')
    results = run(args)
    if args.json:
        with open(args.json, 'w') as fh:
            json.dump(results, fh, indent=1)
    print(table([results]))
    sys.exit(0 if all(c['ok'] for c in results['cases'].values()) else 1)


if __name__ == '__main__':
    main()
