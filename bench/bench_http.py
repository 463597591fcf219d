#!/usr/bin/env python3
"""Benchmarks of the `paged serve` front end.

  1. /health requests per second with wrk (keep-alive connections): the
     cost of the HTTP layer alone (accept, llhttp, routing, writes).
  2. The time the front end adds per streamed token, with real streams on
     the default model:
       - latency: engine publish -> SSE chunk queued on the socket (the
         paged:frontend_token_latency_seconds histogram: wake-up through
         uv_async, detokenization, stop strings, JSON, SSE framing, write);
       - CPU: the loop thread's CPU time divided by the tokens streamed
         (from /proc/<pid>/task/<pid>/stat; the engine runs on other threads).

Usage: bench/bench_http.py [--wrk-seconds 10] [--connections 64] [--streams 16]
                           [--tokens 128] [--engine-threads N] [--binary build/paged]
"""
import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import server_util as su  # noqa: E402


def cpu_seconds(pid):
    """CPU seconds the process's main (loop) thread has run (schedstat, ns)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) * 1e-9


def histogram(m, name):
    """(count, sum, [(le, cumulative)]) of a histogram in parsed metrics."""
    buckets = []
    for key, v in m.items():
        if key.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', key).group(1)
            buckets.append((float("inf") if le == "+Inf" else float(le), v))
    buckets.sort()
    return su.metric(m, name + "_count"), su.metric(m, name + "_sum"), buckets


def quantile(buckets, count, q):
    """Upper bound of the bucket holding quantile q (Prometheus-style, coarse)."""
    target = q * count
    for le, cum in buckets:
        if cum >= target:
            return le
    return float("inf")


def diff_hist(a, b):
    ca, sa, ba = a
    cb, sb, bb = b
    return cb - ca, sb - sa, [(le, vb - va) for (le, va), (_, vb) in zip(ba, bb)]


def bench_wrk(port, seconds, connections, threads):
    wrk = shutil.which("wrk")
    if not wrk:
        print("wrk not installed (apt-get install wrk): skipping /health")
        return None
    cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", f"http://127.0.0.1:{port}/health"]
    print("$ " + " ".join(cmd[0:1] + [c for c in cmd[1:]]), flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    print(out)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    return {"requests_per_s": rps, "p50": p50.group(1) if p50 else None, "p99": p99.group(1) if p99 else None}


def bench_stream(srv, streams, tokens):
    port = srv.port
    pid = srv.proc.pid
    # Warm up (first allocations, caches).
    su.sse_stream(port, "/v1/completions", {"prompt": "warm up", "max_tokens": 8, "stream": True})
    m0 = su.metrics(port)
    h0 = histogram(m0, "paged:frontend_token_latency_seconds")
    cpu0 = cpu_seconds(pid)
    counts = []
    lock = threading.Lock()

    def one(i):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/completions", body=json.dumps({
            "prompt": f"Story {i}: once upon a time", "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0.8, "seed": i, "stream": True}), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        n = 0
        for line in r:
            if line.startswith(b"data: {"):
                n += 1
        c.close()
        with lock:
            counts.append(n)

    t0 = time.time()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    cpu = cpu_seconds(pid) - cpu0
    m1 = su.metrics(port)
    count, total, buckets = diff_hist(h0, histogram(m1, "paged:frontend_token_latency_seconds"))
    chunks = sum(counts)
    return {
        "streams": streams, "tokens_per_stream": tokens, "chunks": chunks, "wall_s": wall,
        "tokens_per_s": chunks / wall,
        "frontend_latency_mean_us": 1e6 * total / count if count else None,
        "frontend_latency_p50_le_us": 1e6 * quantile(buckets, count, 0.5),
        "frontend_latency_p99_le_us": 1e6 * quantile(buckets, count, 0.99),
        "loop_cpu_s": cpu,
        "loop_cpu_per_token_us": 1e6 * cpu / chunks if chunks else None,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrk-seconds", type=int, default=10)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--binary", default=None)
    ap.add_argument("--engine-threads", type=int, default=0,
                    help="--threads for the engine (0: all cores; 1 leaves a core to the loop)")
    args = ap.parse_args()
    if args.binary:
        os.environ["PAGED_BIN"] = args.binary
    su.require_model_and_binary()
    extra = ["--threads", str(args.engine_threads)] if args.engine_threads else []
    with su.Server(*extra) as srv:
        print(f"paged serve on port {srv.port} ({su.binary()}), {os.cpu_count()} CPUs\n", flush=True)
        health = bench_wrk(srv.port, args.wrk_seconds, args.connections, args.wrk_threads)
        stream = bench_stream(srv, args.streams, args.tokens)
    print("=== results ===")
    if health:
        print(f"/health: {health['requests_per_s']:.0f} requests/s "
              f"(wrk -t{args.wrk_threads} -c{args.connections}, p50 {health['p50']}, p99 {health['p99']})")
    s = stream
    print(f"streaming: {s['streams']} streams x {s['tokens_per_stream']} tokens = {s['chunks']} chunks in "
          f"{s['wall_s']:.1f}s ({s['tokens_per_s']:.0f} tokens/s from the engine)")
    print(f"front end per streamed token: latency mean {s['frontend_latency_mean_us']:.1f} us "
          f"(p50 <= {s['frontend_latency_p50_le_us']:.0f} us, p99 <= {s['frontend_latency_p99_le_us']:.0f} us, "
          f"engine publish -> socket), loop-thread CPU {s['loop_cpu_per_token_us']:.1f} us/token")
    print(json.dumps({"health": health, "stream": stream}))


if __name__ == "__main__":
    main()
