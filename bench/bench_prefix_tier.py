#!/usr/bin/env python3
"""Time to first token of a long shared prefix after its device KV blocks
were evicted, against a running `paged serve`: served from the host tier
(the default where there are host blocks) or recomputed (a server started
with --swap-space 0, or --no-host-kv-cache).

Each round sends --evict prompts of --prefix-len fresh random token ids
(max_tokens 1; enough of them to push the prefix out of the device pool),
then the prefix plus a short suffix, streamed, greedy, and takes the time to
its first token. Prints the median of --rounds and the cached tokens the
last request reported. Token ids, so it works with a dummy model too.

  bench/bench_prefix_tier.py --port 8000 --prefix-len 4096 --evict 8 --rounds 3
"""
import argparse
import http.client
import json
import random
import statistics
import time


def post(port, body, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=stream)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    if not stream:
        out = json.loads(r.read())
        c.close()
        return out, time.perf_counter() - t0
    first, usage = None, None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if first is None and ev.get("choices"):
            first = time.perf_counter() - t0
        usage = ev.get("usage") or usage
    c.close()
    return usage, first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefix-len", type=int, default=4096)
    ap.add_argument("--evict", type=int, default=8, help="fresh prompts of prefix-len per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids drawn from [100, vocab)")
    a = ap.parse_args()
    rng = random.Random(1)

    def ids(n):
        return [rng.randrange(100, a.vocab) for _ in range(n)]

    prompt = ids(a.prefix_len) + ids(8)
    post(a.port, {"prompt": prompt, "max_tokens": 1, "temperature": 0})  # fills the cache
    times, usage = [], None
    for _ in range(a.rounds):
        for _ in range(a.evict):
            post(a.port, {"prompt": ids(a.prefix_len), "max_tokens": 1, "temperature": 0})
        usage, t = post(a.port, {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                 "stream_options": {"include_usage": True}}, stream=True)
        times.append(t)
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    print(f"prefix {a.prefix_len} tokens: TTFT median of {a.rounds} {statistics.median(times) * 1000:.1f} ms "
          f"(rounds {', '.join(f'{t * 1000:.1f}' for t in times)} ms); cached_tokens {cached}")


if __name__ == "__main__":
    main()
