#!/usr/bin/env python3
"""Speculative decoding with n-gram prompt lookup at batch 1 (issue 32): decode
tokens/s of one greedy request on a copy-heavy prompt, with and without
--speculative-config, and the acceptance rate from /metrics.

For each configuration (`--config NAME=FLAGS`, repeatable; by default
"plain=" and "ngram-k5=--speculative-config '{...k 5, n 2..4}'") it starts
build/paged serve with the default model, sends one warm-up request and then
--runs streamed requests one at a time (batch 1), and reports the decode
rate: (tokens - 1) / (last token time - first token time), the prefill
left out (it is the same with and without speculation), and the server's
CPU time per token (prefill included), which other work on a shared machine
hardly moves. The texts of every
configuration must be the same (greedy): the script says so when they are
not. Not a timed test: figures go to docs/speculative_decoding.md.

    bench/bench_spec.py                 # the two default configurations
    bench/bench_spec.py --prompt-kind plain   # a prompt with little to copy
    bench/bench_spec.py --temperature 1       # seeded sampling: drafts kept in part
    bench/bench_spec.py --config "k3=--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'"

--concurrency N sends N requests at once (the copy prompts, one each)
instead, --runs times, and reports the aggregate rate: all their tokens over
the wall time from sending to the last one done (prefill included), and the
CPU time per token - for the draft model's batched steps:

    bench/bench_spec.py --concurrency 4 --config plain= \
        --config "draft-k4=--speculative-config '{\"method\": \"draft_model\", \"model\": \"models/SmolLM2-135M-Instruct.Q4_1.gguf\", \"num_speculative_tokens\": 4}'"
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import server_util as su  # noqa: E402
from test_spec_decode import COPY_PROMPTS  # noqa: E402

NGRAM = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
PROMPTS = {"copy": COPY_PROMPTS[0], "code": COPY_PROMPTS[2], "plain": "Write a short story about a dragon who"}
# The requests' sampling (--temperature T > 0: seeded, so every
# configuration must give the same text: verification keeps the draws).
SAMPLING = {"temperature": 0}


def one_request(port, prompt, max_tokens):
    """Streams one completion (greedy unless --temperature): (text, tokens, decode seconds)."""
    times, parts = [], []

    def on_event(ev):
        for c in ev.get("choices", []):
            if c.get("text"):
                times.append(time.perf_counter())
                parts.append(c["text"])

    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **SAMPLING}
    st, events, done = su.sse_stream(port, "/v1/completions", body, timeout=600, on_event=on_event)
    assert st == 200 and done, st
    usage = next((e["usage"] for e in events if e.get("usage")), None)
    n = usage["completion_tokens"] if usage else len(parts)
    return "".join(parts), n, times[-1] - times[0] if len(times) > 1 else float("nan")


def cpu_seconds(pid):
    """User + system CPU time of a process so far: unlike wall time it hardly
    moves when other work shares the cores (this machine is shared)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(name, flags, prompt, max_tokens, runs):
    with su.Server(*shlex.split(flags)) as srv:
        one_request(srv.port, prompt, max_tokens)  # warm-up (page cache, first-step costs)
        m0 = su.metrics(srv.port)
        rates, text, cpu, total = [], None, 0.0, 0
        for _ in range(runs):
            c0 = cpu_seconds(srv.proc.pid)
            text, n, secs = one_request(srv.port, prompt, max_tokens)
            cpu += cpu_seconds(srv.proc.pid) - c0
            total += n
            rates.append((n - 1) / secs)
        m1 = su.metrics(srv.port)
    d = {k: su.metric(m1, f"paged:spec_decode_num_{k}_total") - su.metric(m0, f"paged:spec_decode_num_{k}_total")
         for k in ("drafts", "draft_tokens", "accepted_tokens")}
    return {"name": name, "flags": flags, "tokens": n, "tok_s": statistics.median(rates), "runs": rates,
            "cpu_ms_per_token": 1000 * cpu / total,
            "drafts": d["drafts"], "draft_tokens": d["draft_tokens"], "accepted": d["accepted_tokens"],
            "acceptance": d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else None,
            "tokens_per_step": (n * runs) / (n * runs - d["accepted_tokens"]) if n else None, "text": text}


def bench_concurrent(name, flags, n_req, max_tokens, runs):
    """n_req greedy requests at once (COPY_PROMPTS in turn): tokens/s over the
    whole batch's wall time, CPU ms per token, and the drafts' counts."""
    from test_spec_decode import complete  # noqa: E402
    prompts = [COPY_PROMPTS[i % len(COPY_PROMPTS)] for i in range(n_req)]
    with su.Server(*shlex.split(flags)) as srv:
        with concurrent.futures.ThreadPoolExecutor(n_req) as ex:  # warm-up
            list(ex.map(lambda p: complete(srv.port, p, max_tokens), prompts))
        m0 = su.metrics(srv.port)
        rates, cpu, total, texts = [], 0.0, 0, None
        for _ in range(runs):
            c0, t0 = cpu_seconds(srv.proc.pid), time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(n_req) as ex:
                texts = list(ex.map(lambda p: one_request(srv.port, p, max_tokens), prompts))
            secs = time.perf_counter() - t0
            cpu += cpu_seconds(srv.proc.pid) - c0
            n = sum(t[1] for t in texts)
            total += n
            rates.append(n / secs)
        m1 = su.metrics(srv.port)
    d = {k: su.metric(m1, f"paged:spec_decode_num_{k}_total") - su.metric(m0, f"paged:spec_decode_num_{k}_total")
         for k in ("drafts", "draft_tokens", "accepted_tokens")}
    return {"name": name, "flags": flags, "tokens": total // runs, "tok_s": statistics.median(rates), "runs": rates,
            "cpu_ms_per_token": 1000 * cpu / total,
            "drafts": d["drafts"], "draft_tokens": d["draft_tokens"], "accepted": d["accepted_tokens"],
            "acceptance": d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else None,
            "tokens_per_step": total / (total - d["accepted_tokens"]) if total else None,
            "text": "\n".join(t[0] for t in texts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", help="NAME=FLAGS for paged serve (repeatable)")
    ap.add_argument("--prompt-kind", choices=sorted(PROMPTS), default="copy")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--concurrency", type=int, default=1, help="requests at once (1: the batch-1 decode rate)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature (seed 7) instead of greedy: drafts break off at random points")
    a = ap.parse_args()
    if a.temperature > 0:
        SAMPLING.update(temperature=a.temperature, seed=7)
    su.require_model_and_binary()
    configs = a.config or ["plain=", f"ngram-k5=--speculative-config '{NGRAM}'"]
    results = []
    for c in configs:
        name, _, flags = c.partition("=")
        if a.concurrency > 1:
            r = bench_concurrent(name, flags, a.concurrency, a.max_tokens, a.runs)
        else:
            r = bench(name, flags, PROMPTS[a.prompt_kind], a.max_tokens, a.runs)
        results.append(r)
        acc = f"{r['acceptance']:.1%} of {int(r['draft_tokens'])} draft tokens in {int(r['drafts'])} drafts, " \
              f"{r['tokens_per_step']:.2f} tokens per step" if r["acceptance"] is not None else "no drafts"
        what = "decode" if a.concurrency <= 1 else f"over {a.concurrency} requests at once, prefill included"
        print(f"{name:12s} {r['tok_s']:7.1f} tok/s {what} (median of {a.runs}; {r['tokens']} tokens), "
              f"{r['cpu_ms_per_token']:.2f} CPU ms per token (prefill included); {acc}", flush=True)
    base, base_cpu = results[0]["tok_s"], results[0]["cpu_ms_per_token"]
    for r in results[1:]:
        same = "same text" if r["text"] == results[0]["text"] else "TEXT DIFFERS"
        print(f"{r['name']}: {r['tok_s'] / base:.2f}x {results[0]['name']} in tok/s, "
              f"{base_cpu / r['cpu_ms_per_token']:.2f}x in CPU time per token ({same})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"prompt_kind": a.prompt_kind, "max_tokens": a.max_tokens, "concurrency": a.concurrency,
                   "temperature": a.temperature,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
