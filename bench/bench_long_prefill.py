#!/usr/bin/env python3
"""Short requests beside a long prefill (issue 18): TTFT of a 1-token
request sent during an 8,000-token prefill, and how long a client that
leaves during a prefill keeps it running.

For each server configuration (`--config NAME=FLAGS`, repeatable) it starts
build/paged serve, then:

  1. sends L, a prompt of --long-len random token ids (streamed, max_tokens 1);
  2. --delay seconds later sends S, a 1-token prompt (max_tokens --short-out),
     and records S's TTFT and its end-to-end time;
  3. then sends A, another long prompt, and closes A's connection --abort-after
     seconds later; the abort latency is the time from the close until the
     server counts A as finished with reason "abort";
  4. records L's TTFT (what the cap costs the long prompt).

The abort latency counts until the server reports A finished: its event
comes with the update after the next step, so it is up to two steps (the
device is free of A one step earlier).

Standard library only. Prints one line per configuration and writes JSON:

  bench/bench_long_prefill.py --out bench/results/cpu_long_prefill.json \\
      --config "no-cap-2048=--max-num-batched-tokens 2048 --long-prefill-token-threshold 0" \\
      --config "cap-2048=--max-num-batched-tokens 2048" \\
      --config "cap-256=--max-num-batched-tokens 256"
"""
import argparse
import http.client
import json
import os
import random
import shlex
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import server_util as su  # noqa: E402  (free_port)

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def metric(port, name, label=""):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def stream(port, prompt, max_tokens, out, key, t_send):
    """POSTs a streamed completion; records TTFT and end time in out[key]."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                       "temperature": 0})
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    ttft = None
    for line in r:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]" and ttft is None:
            ttft = time.time() - t_send
    out[key] = {"status": r.status, "ttft_s": ttft, "e2e_s": time.time() - t_send}
    c.close()


def run_config(name, flags, args):
    port = su.free_port()
    # PAGED: another binary (the GPU machine's pack, build/gpu-pack/paged).
    cmd = [os.environ.get("PAGED", os.path.join(ROOT, "build", "paged")), "serve", "--model", args.model, "--port", str(port),
           "--max-model-len", str(args.long_len + 64), "--kv-cache-memory", args.kv_cache_memory] + flags
    log = open(f"/tmp/bench_long_prefill_{name}.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or p.poll() is not None:
                raise RuntimeError(f"{name}: server did not start (see {log.name})")
            time.sleep(0.1)
        rnd = random.Random(1)
        long_a = [rnd.randrange(1000, 40000) for _ in range(args.long_len)]
        long_b = [rnd.randrange(1000, 40000) for _ in range(args.long_len)]
        out = {}
        t0 = time.time()
        tl = threading.Thread(target=stream, args=(port, long_a, 1, out, "long", t0))
        tl.start()
        time.sleep(args.delay)
        t1 = time.time()
        stream(port, [rnd.randrange(1000, 40000)], args.short_out, out, "short", t1)
        # A client that leaves during a prefill.
        aborts0 = metric(port, "paged:request_success_total", 'finished_reason="abort"')
        s = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"prompt": long_b, "max_tokens": 1}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(args.abort_after)
        s.close()
        t_close = time.time()
        while metric(port, "paged:request_success_total", 'finished_reason="abort"') <= aborts0:
            if time.time() - t_close > 600:
                raise RuntimeError(f"{name}: the abort was not counted in 600 s")
            time.sleep(0.02)
        abort_latency = time.time() - t_close
        tl.join()
        res = {
            "config": name, "flags": " ".join(flags), "long_len": args.long_len, "delay_s": args.delay,
            "short_ttft_s": out["short"]["ttft_s"], "short_e2e_s": out["short"]["e2e_s"],
            "short_out": args.short_out, "long_ttft_s": out["long"]["ttft_s"],
            "abort_latency_s": abort_latency, "abort_after_s": args.abort_after,
            "load_avg_1m_at_end": os.getloadavg()[0],  # a shared machine: how busy it was
        }
        print(f"{name:14s} short TTFT {res['short_ttft_s']:7.2f} s  short e2e ({args.short_out} tok) "
              f"{res['short_e2e_s']:7.2f} s  long TTFT {res['long_ttft_s']:7.2f} s  "
              f"abort latency {abort_latency:6.2f} s", flush=True)
        return res
    finally:
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--config", action="append", required=True, help="NAME=FLAGS for paged serve")
    ap.add_argument("--long-len", type=int, default=8000)
    ap.add_argument("--delay", type=float, default=1.0, help="seconds between the long and the short request")
    ap.add_argument("--short-out", type=int, default=8)
    ap.add_argument("--abort-after", type=float, default=2.0)
    ap.add_argument("--kv-cache-memory", default="1G")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = []
    for c in args.config:
        name, _, flags = c.partition("=")
        results.append(run_config(name, shlex.split(flags), args))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bench": "long_prefill", "host_cpus": os.cpu_count(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
