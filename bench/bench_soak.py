#!/usr/bin/env python3
"""Soak benchmark: bounded closed-loop mixed traffic against `paged serve`
for a given time, sampling the server's RSS, open file descriptors, KV
cache usage and running/waiting requests, then printing their trend and
writing a plot.

Traffic: --clients closed-loop clients; each request is a completion or a
chat, streamed or not (half and half), with a random prompt of 5-300 words
and 4-64 output tokens; --disconnect of them leave early (streams after a
few events, others right after sending). Every answer is checked (200 with
the right shape, or 503 when a queue is full). With --input-len and
--output-len the requests are W4-shaped instead (issue 30's GPU soak): a
completion of that many random token ids, exactly --output-len tokens out
(ignore_eos), streamed or not.

  bench/bench_soak.py --duration 600 --out bench/results/cpu_soak.json --plot bench/results/cpu_soak.png
  # issue 30's soak on a GPU (docs/gpu_checklist.md): W4 at 200 clients, a third leaving early
  bench/bench_soak.py --binary build/gpu-pack/paged --no-cpu-defaults --duration 540 --clients 200 \
      --disconnect 0.33 --input-len 1000 --output-len 256 --vocab-size 128000 --interval 10 --out /tmp/soak.json -- \
      --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192

Starts the server itself (extra flags after --; the default model with
--max-model-len 2048 and --kv-cache-memory 256M unless given, none of them
with --no-cpu-defaults); the server's pid is what is sampled,
and its /metrics: device memory (free, other) on a GPU, KV and host KV
blocks. Standard library, plus matplotlib for the plot. Exit code 1 when a
request got a wrong answer or no answer at all (every request started ends
counted once), the server died, or it was not idle (no KV block held on
the device or the host, nothing running) after the traffic stopped.
"""
import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import server_util as su  # noqa: E402  (free_port)

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
WORDS = ("the of and to in is was for on that with as by at from it his an were are which this be or has "
         "had not first one their its new after but who they have her she two been other when there all "
         "during into school time may years more most only over city some world would where later up such "
         "used many can state about national out known university united then made").split()


def get(port, path, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def parse_metrics(text):
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        name = k.split("{")[0]
        if name in ("paged:kv_cache_usage_perc", "paged:num_requests_running", "paged:num_requests_waiting",
                    "paged:http_connections", "paged:http_requests_in_progress"):
            out[name] = out.get(name, 0.0) + float(v)
        if name == "paged:kv_cache_blocks" and 'state="used"' in k:
            out["kv_blocks_used"] = float(v)
        if name == "paged:host_kv_cache_blocks" and 'state="used"' in k:
            out["host_kv_blocks_used"] = float(v)
        if name == "paged:device_memory_bytes" and 'device="cpu"' not in k:
            for cat in ("free", "other"):
                if f'category="{cat}"' in k:
                    out[f"device_{cat}_mib"] = out.get(f"device_{cat}_mib", 0.0) + float(v) / 2**20
    return out


def proc_sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])  # KiB
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.bad = []
        self.started = 0

    def start(self):
        with self.lock:
            self.started += 1

    def add(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def fail(self, msg):
        with self.lock:
            self.bad.append(msg)


def one_request(port, rnd, stats, disconnect_p, shape=None):
    """One request; shape = (input_len, output_len, vocab) for W4-shaped ones."""
    stats.start()
    chat = shape is None and rnd.random() < 0.5
    stream = rnd.random() < 0.5
    leave = rnd.random() < disconnect_p
    if shape:
        n_in, n_out, vocab = shape
        body = {"prompt": [rnd.randrange(vocab) for _ in range(n_in)], "max_tokens": n_out,
                "ignore_eos": True, "temperature": 0, "stream": stream}
        path = "/v1/completions"
    else:
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(5, 300)))
        body = {"max_tokens": rnd.randint(4, 64), "temperature": rnd.choice([0, 0.8]), "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = text
            path = "/v1/completions"
    kind = ("chat" if chat else "cmpl") + ("-stream" if stream else "") + ("-leave" if leave else "")
    data = json.dumps(body).encode()
    if leave and not stream:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), len(data)) + data)
        time.sleep(rnd.random() * 0.5)
        s.close()
        stats.add(kind)
        return
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status == 503:
            r.read()
            stats.add("503")
            return
        if r.status != 200:
            stats.fail(f"{kind}: status {r.status}: {r.read()[:200]!r}")
            return
        if not stream:
            j = json.loads(r.read())
            if not j.get("choices"):
                stats.fail(f"{kind}: no choices: {j}")
                return
            if shape and j.get("usage", {}).get("completion_tokens") != shape[1]:
                stats.fail(f"{kind}: {j.get('usage')} for max_tokens {shape[1]} with ignore_eos")
                return
        else:
            n, done = 0, False
            stop_after = rnd.randint(1, 4) if leave else None
            for line in r:
                if line.startswith(b"data: "):
                    if line.strip() == b"data: [DONE]":
                        done = True
                        break
                    n += 1
                    if stop_after and n >= stop_after:
                        break
            if not leave and not done:
                stats.fail(f"{kind}: stream without [DONE] after {n} events")
                return
        stats.add(kind)
    except (OSError, http.client.HTTPException, ValueError) as e:
        stats.fail(f"{kind}: {e!r}")
    finally:
        c.close()


def slope_per_hour(ts, ys):
    n = len(ts)
    if n < 2:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den * 3600 if den else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1800, help="seconds of traffic")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--disconnect", type=float, default=0.15, help="share of requests that leave early")
    ap.add_argument("--interval", type=float, default=5, help="seconds between samples")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "paged"), help="the paged binary")
    ap.add_argument("--no-cpu-defaults", action="store_true",
                    help="pass neither --model nor the CPU's --max-model-len 2048 / --kv-cache-memory 256M")
    ap.add_argument("--input-len", type=int, default=0, help="W4-shaped requests: prompt token ids")
    ap.add_argument("--output-len", type=int, default=0, help="W4-shaped requests: output tokens (ignore_eos)")
    ap.add_argument("--vocab-size", type=int, default=32000, help="random prompt ids are below this")
    ap.add_argument("--out", help="JSON with every sample and the summary")
    ap.add_argument("--plot", help="PNG of the samples")
    ap.add_argument("server_args", nargs="*", help="extra paged serve flags (after --)")
    args = ap.parse_args()

    port = su.free_port()
    cmd = [args.binary, "serve", "--port", str(port)]
    if not args.no_cpu_defaults:
        cmd += ["--model", args.model]
        for flag, default in (("--max-model-len", "2048"), ("--kv-cache-memory", "256M")):
            if not any(a == flag or a.startswith(flag + "=") for a in args.server_args):
                cmd += [flag, default]
    cmd += args.server_args
    shape = (args.input_len, args.output_len, args.vocab_size) if args.input_len > 0 and args.output_len > 0 else None
    log = open("/tmp/bench_soak_server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while True:
        try:
            if get(port, "/health", 2)[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            print("bench_soak: the server did not start (see /tmp/bench_soak_server.log)", file=sys.stderr)
            return 1
        time.sleep(0.1)

    stats = Stats()
    stop = threading.Event()
    t_start = time.time()

    def client(i):
        rnd = random.Random(1000 + i)
        while not stop.is_set():
            one_request(port, rnd, stats, args.disconnect, shape)

    samples = []

    def sample():
        rss, fds = proc_sample(proc.pid)
        st, text = get(port, "/metrics")
        m = parse_metrics(text) if st == 200 else {}
        with stats.lock:
            done = sum(v for k, v in stats.counts.items())
        samples.append({"t": round(time.time() - t_start, 2), "rss_kib": rss, "fds": fds,
                        "kv_usage": m.get("paged:kv_cache_usage_perc", 0.0),
                        "kv_blocks_used": m.get("kv_blocks_used", 0.0),
                        "running": m.get("paged:num_requests_running", 0.0),
                        "waiting": m.get("paged:num_requests_waiting", 0.0),
                        "connections": m.get("paged:http_connections", 0.0),
                        "host_kv_blocks_used": m.get("host_kv_blocks_used", 0.0),
                        "device_free_mib": m.get("device_free_mib"), "device_other_mib": m.get("device_other_mib"),
                        "requests_done": done, "failures": len(stats.bad)})

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    next_print = t_start
    while time.time() - t_start < args.duration and proc.poll() is None:
        sample()
        s = samples[-1]
        if time.time() >= next_print:
            print(f"t={s['t']:7.0f}s rss={s['rss_kib'] / 1024:7.1f} MiB fds={s['fds']:4d} kv={s['kv_usage']:.2f} "
                  f"running={s['running']:3.0f} waiting={s['waiting']:3.0f} done={s['requests_done']} "
                  f"failures={s['failures']}", flush=True)
            next_print += 60
        time.sleep(args.interval)
    stop.set()
    for t in threads:
        t.join(timeout=330)
    ok = proc.poll() is None
    # After the traffic: idle, every block back (the prefix cache may keep some).
    idle = None
    if ok:
        end = time.time() + 120
        while time.time() < end:
            sample()
            s = samples[-1]
            if s["running"] == 0 and s["waiting"] == 0 and s["kv_blocks_used"] == 0 and \
                    s["host_kv_blocks_used"] == 0:
                idle = s
                break
            time.sleep(1)
    with stats.lock:
        lost = stats.started - sum(stats.counts.values()) - len(stats.bad)
    ts = [s["t"] for s in samples]
    q = max(1, len(samples) // 4)
    head, tail = samples[:q], samples[-q:]

    def mean(xs, k):
        return sum(x[k] for x in xs) / len(xs)

    summary = {
        "duration_s": round(time.time() - t_start, 1), "clients": args.clients, "disconnect": args.disconnect,
        "requests": dict(sorted(stats.counts.items())), "failures": stats.bad[:20], "n_failures": len(stats.bad),
        "server_alive": ok, "idle_after": idle is not None,
        "rss_mib_first_quarter": mean(head, "rss_kib") / 1024, "rss_mib_last_quarter": mean(tail, "rss_kib") / 1024,
        "rss_mib_max": max(s["rss_kib"] for s in samples) / 1024,
        "rss_mib_slope_per_hour": slope_per_hour(ts, [s["rss_kib"] / 1024 for s in samples]),
        # The KV cache and the allocator's arenas are touched in the first
        # minutes (pages fault in lazily): the second half is the trend.
        "rss_mib_slope_per_hour_second_half": slope_per_hour(
            ts[len(ts) // 2:], [s["rss_kib"] / 1024 for s in samples[len(samples) // 2:]]),
        "fds_slope_per_hour_second_half": slope_per_hour(ts[len(ts) // 2:], [s["fds"] for s in samples[len(samples) // 2:]]),
        "fds_first_quarter": mean(head, "fds"), "fds_last_quarter": mean(tail, "fds"),
        "fds_max": max(s["fds"] for s in samples), "fds_after": idle["fds"] if idle else None,
        "kv_usage_mean": mean(samples, "kv_usage"), "kv_usage_max": max(s["kv_usage"] for s in samples),
        "running_mean": mean(samples, "running"), "running_max": max(s["running"] for s in samples),
        "host_kv_blocks_used_max": max(s["host_kv_blocks_used"] for s in samples),
        # Every request started ended counted once (an answer checked, a 503,
        # a planned early leave, or a failure); a client thread still stuck
        # after the traffic stopped leaves its request here.
        "requests_started": stats.started, "requests_lost": lost,
        "server_cmd": " ".join(cmd),
    }
    dev = [s for s in samples if s["device_free_mib"] is not None]
    if dev:  # a GPU: its memory must stay flat too (free = total - everything the process holds)
        dq = max(1, len(dev) // 4)
        summary.update({
            "device_free_mib_first_quarter": mean(dev[:dq], "device_free_mib"),
            "device_free_mib_last_quarter": mean(dev[-dq:], "device_free_mib"),
            "device_free_mib_min": min(s["device_free_mib"] for s in dev),
            "device_other_mib_first_quarter": mean(dev[:dq], "device_other_mib"),
            "device_other_mib_last_quarter": mean(dev[-dq:], "device_other_mib"),
            "device_other_mib_slope_per_hour_second_half": slope_per_hour(
                [s["t"] for s in dev[len(dev) // 2:]], [s["device_other_mib"] for s in dev[len(dev) // 2:]]),
        })
    print("--- soak summary ---")
    print(f"{summary['duration_s']:.0f} s, {args.clients} clients, {sum(stats.counts.values())} requests "
          f"{summary['requests']}, failures {len(stats.bad)}")
    print(f"RSS MiB: first quarter {summary['rss_mib_first_quarter']:.1f}, last quarter "
          f"{summary['rss_mib_last_quarter']:.1f}, max {summary['rss_mib_max']:.1f}, "
          f"trend {summary['rss_mib_slope_per_hour']:+.1f} MiB/h overall, "
          f"{summary['rss_mib_slope_per_hour_second_half']:+.1f} MiB/h over the second half")
    print(f"fds: first quarter {summary['fds_first_quarter']:.1f}, last quarter {summary['fds_last_quarter']:.1f}, "
          f"max {summary['fds_max']}, after {summary['fds_after']}")
    print(f"KV usage mean {summary['kv_usage_mean']:.2f} max {summary['kv_usage_max']:.2f}; running mean "
          f"{summary['running_mean']:.1f} max {summary['running_max']:.0f}; idle after: {summary['idle_after']}")
    print(f"requests started {stats.started}, lost {lost}; host KV blocks used at most "
          f"{summary['host_kv_blocks_used_max']:.0f}")
    if dev:
        print(f"device MiB: free first quarter {summary['device_free_mib_first_quarter']:.0f}, last quarter "
              f"{summary['device_free_mib_last_quarter']:.0f}, min {summary['device_free_mib_min']:.0f}; other "
              f"{summary['device_other_mib_first_quarter']:.0f} -> {summary['device_other_mib_last_quarter']:.0f} "
              f"({summary['device_other_mib_slope_per_hour_second_half']:+.1f} MiB/h over the second half)")
    for b in stats.bad[:5]:
        print("failure:", b)
    proc.terminate()
    try:
        rc = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    summary["server_exit"] = rc
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bench": "soak", "summary": summary, "samples": samples}, f, indent=1)
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
            m = [s["t"] / 60 for s in samples]
            ax[0].plot(m, [s["rss_kib"] / 1024 for s in samples]); ax[0].set_ylabel("RSS (MiB)")
            ax[1].plot(m, [s["fds"] for s in samples]); ax[1].set_ylabel("open fds")
            ax[2].plot(m, [s["kv_usage"] for s in samples]); ax[2].set_ylabel("KV usage")
            ax[3].plot(m, [s["running"] for s in samples], label="running")
            ax[3].plot(m, [s["waiting"] for s in samples], label="waiting"); ax[3].legend()
            ax[3].set_ylabel("requests"); ax[3].set_xlabel("minutes")
            fig.suptitle(f"paged soak: {args.clients} clients, {args.disconnect:.0%} leave early")
            fig.tight_layout()
            fig.savefig(args.plot, dpi=80)
        except ImportError:
            print("bench_soak: matplotlib missing, no plot", file=sys.stderr)
    good = ok and idle is not None and not stats.bad and lost == 0 and rc == 0
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
