#!/usr/bin/env python3
"""A bounded load test: 300 requests from 32 concurrent clients (completions
and chat, streamed and not), a fifth of them disconnecting early (mid-prefill
or mid-stream). Afterwards every request has finished or been aborted,
nothing runs or waits, and every KV block is free (or held only by the prefix
cache)."""
import http.client
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()

N_REQUESTS = int(os.environ.get("PAGED_LOAD_REQUESTS", "300"))
CONCURRENCY = int(os.environ.get("PAGED_LOAD_CONCURRENCY", "32"))
DISCONNECT_FRACTION = 0.2
TIME_LIMIT = 600


def main():
    with su.Server("--max-num-seqs", "64") as srv:
        port = srv.port
        rng = random.Random(1234)
        plan = []
        for i in range(N_REQUESTS):
            kind = rng.choice(["cmpl", "cmpl_stream", "chat", "chat_stream"])
            disconnect = rng.random() < DISCONNECT_FRACTION
            when = rng.choice(["prefill", "stream"]) if disconnect else None
            if when == "stream" and not kind.endswith("stream"):
                kind += "_stream"
            plan.append((i, kind, when, rng.randint(1, 6)))
        lock = threading.Lock()
        stats = {"ok": 0, "disconnected": 0, "finish": {}, "errors": []}
        next_i = [0]

        def worker():
            while True:
                with lock:
                    if next_i[0] >= len(plan):
                        return
                    i, kind, when, max_tokens = plan[next_i[0]]
                    next_i[0] += 1
                try:
                    run_one(i, kind, when, max_tokens)
                except Exception as e:  # recorded, reported below
                    with lock:
                        stats["errors"].append(f"{i} {kind} {when}: {e!r}")

        def run_one(i, kind, when, max_tokens):
            stream = kind.endswith("stream")
            if kind.startswith("chat"):
                path = "/v1/chat/completions"
                body = {"messages": [{"role": "user", "content": f"Question {i}: name a color."}]}
            else:
                path = "/v1/completions"
                body = {"prompt": f"Request number {i} says"}
            body.update({"max_tokens": max_tokens, "temperature": 0.7, "seed": i, "stream": stream})
            if when == "stream":
                body["max_tokens"] = 64
                body["ignore_eos"] = True
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            if when == "prefill":
                c.sock.close()  # gone before the first token
                with lock:
                    stats["disconnected"] += 1
                return
            r = c.getresponse()
            assert r.status == 200, (r.status, r.read()[:300])
            if when == "stream":
                seen = 0
                for line in r:
                    if line.startswith(b"data: "):
                        seen += 1
                        if seen == 2:
                            break
                c.sock.close()  # mid-stream
                with lock:
                    stats["disconnected"] += 1
                return
            if stream:
                finish, done = None, False
                for line in r:
                    line = line.strip()
                    if line == b"data: [DONE]":
                        done = True
                    elif line.startswith(b"data: "):
                        ev = json.loads(line[6:])
                        for ch in ev["choices"]:
                            finish = ch.get("finish_reason") or finish
                assert done and finish in ("stop", "length"), (done, finish)
            else:
                res = json.loads(r.read())
                finish = res["choices"][0]["finish_reason"]
                assert finish in ("stop", "length") and res["usage"]["completion_tokens"] <= max_tokens, res
            c.close()
            with lock:
                stats["ok"] += 1
                stats["finish"][finish] = stats["finish"].get(finish, 0) + 1

        m0 = su.metrics(port)
        t0 = time.time()
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(CONCURRENCY)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1, TIME_LIMIT - (time.time() - t0)))
        elapsed = time.time() - t0
        assert not any(t.is_alive() for t in threads), f"load did not finish in {TIME_LIMIT}s"
        assert not stats["errors"], stats["errors"][:10]
        assert stats["ok"] + stats["disconnected"] == N_REQUESTS, stats

        m = su.wait_idle(port, timeout=120)
        assert su.metric(m, "paged:num_requests_running") == 0
        assert su.metric(m, "paged:num_requests_waiting") == 0
        assert su.metric(m, "paged:kv_cache_blocks", state="used") == 0
        assert su.metric(m, "paged:http_requests_in_progress") == 0

        def delta(name, **labels):
            return su.metric(m, name, **labels) - su.metric(m0, name, **labels)

        finished = {r: delta("paged:request_success_total", finished_reason=r)
                    for r in ("stop", "length", "abort", "error")}
        # Every request ended exactly once: as stop/length, or aborted.
        assert sum(finished.values()) == N_REQUESTS, finished
        assert finished["error"] == 0, finished
        assert finished["stop"] + finished["length"] >= stats["ok"], (finished, stats)
        assert finished["abort"] <= stats["disconnected"], (finished, stats)
        gen = delta("paged:generation_tokens_total")
        print(f"     {N_REQUESTS} requests, {CONCURRENCY} concurrent, {stats['disconnected']} disconnected early, "
              f"in {elapsed:.1f}s; finished {finished}; {gen:.0f} tokens generated "
              f"({gen / elapsed:.0f} tok/s)")
    print("test_server_load: all passed")


if __name__ == "__main__":
    main()
