#!/usr/bin/python3
"""The attack of issue 20 against one or more `diffucoder serve` binaries, side by side, loopback only.

For each binary: start `serve` on a free port, open SLOW connections that send a partial request head and
then one byte every 2 s, IDLE kept-alive connections (one answered /health each, then silence), and STREAMS
streaming completions (max_tokens 1024, blocks of 8) whose clients never read; then for SECONDS probe
GET /health once a second from a fresh, well-behaved client (1 s timeout) and post one small completion
(10 s timeout). Prints per binary: probes answered within 1 s, the slowest probe, the completion's status
and latency, and how many slow connections the server had closed by the end.

usage: bench/slow_clients.py MODEL_DIR BINARY [BINARY ...] [--slow 300] [--idle 50] [--streams 0]
       [--http-threads 128] [--seconds 20]
"""
import argparse
import http.client
import re
import socket
import subprocess
import threading
import time


def start(binary, model, http_threads):
    proc = subprocess.Popen([binary, "serve", "--model", model, "--port", "0", "--threads", "2",
                             "--http-threads", str(http_threads)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    raise RuntimeError(f"{binary} did not start")


def probe(port, timeout):
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", "/health")
        ok = c.getresponse().status == 200
        c.close()
    except OSError:
        ok = False
    return ok, time.monotonic() - t0


def closed_by_server(s):
    """True when the server closed the connection (end-of-file or reset after whatever it sent)."""
    s.setblocking(False)
    while True:
        try:
            if s.recv(65536) == b"":
                return True
        except BlockingIOError:
            return False
        except OSError:
            return True


def trickle(slow, stop):
    """One byte every 2 s on every slow connection until `stop` is set."""
    while not stop.wait(2.0):
        for s in slow:
            try:
                s.send(b"X", socket.MSG_DONTWAIT)
            except OSError:
                pass


def open_stream(port, i):
    """A streaming completion whose client never reads (sent whole, then silence)."""
    body = ('{"prompt": "s%d", "max_tokens": 1024, "block_length": 8, "stream": true}' % i).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return s


def run(binary, model, n_slow, n_idle, n_streams, http_threads, seconds):
    proc, port = start(binary, model, http_threads)
    time.sleep(0.5)
    slow, idle = [], []
    streams = [open_stream(port, i) for i in range(n_streams)]
    for _ in range(n_slow):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    stop = threading.Event()
    sender = threading.Thread(target=trickle, args=(slow, stop))
    sender.start()
    for _ in range(n_idle):  # kept alive after one answered request (sent, not awaited: a stalled server
        s = socket.create_connection(("127.0.0.1", port))  # would not answer)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        idle.append(s)
    answered, slowest, completion, took_completion = 0, 0.0, None, None
    start_t = time.monotonic()
    for second in range(seconds):
        ok, took = probe(port, 1.0)
        answered += ok and took < 1.0
        slowest = max(slowest, took)
        if completion is None:
            t0 = time.monotonic()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c.request("POST", "/v1/completions", '{"prompt": "x", "max_tokens": 8}',
                          {"Content-Type": "application/json"})
                completion = c.getresponse().status
            except OSError as e:
                completion = type(e).__name__
            took_completion = time.monotonic() - t0

        time.sleep(max(0.0, start_t + second + 1 - time.monotonic()))
    stop.set()
    sender.join()
    closed = sum(closed_by_server(s) for s in slow)
    for s in slow + idle + streams:
        s.close()
    proc.terminate()
    proc.wait(timeout=30)
    return answered, slowest, completion, took_completion, closed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--slow", type=int, default=300)
    ap.add_argument("--idle", type=int, default=50)
    ap.add_argument("--streams", type=int, default=0)
    ap.add_argument("--http-threads", type=int, default=128)
    ap.add_argument("--seconds", type=int, default=20)
    a = ap.parse_args()
    print(f"{a.slow} slow + {a.idle} idle connections + {a.streams} unread streams for {a.seconds} s, "
          f"--http-threads {a.http_threads}; /health probed once a second")
    print("| binary | /health answered within 1 s | slowest probe | completion | its latency | "
          "slow connections closed by the server |")
    print("|---|---|---|---|---|---|")
    for b in a.binaries:
        answered, slowest, completion, took, closed = run(b, a.model, a.slow, a.idle, a.streams, a.http_threads,
                                                          a.seconds)
        print(f"| {b} | {answered} / {a.seconds} | {slowest:.3f} s | {completion} | {took:.3f} s | "
              f"{closed} / {a.slow} |", flush=True)


if __name__ == "__main__":
    main()
