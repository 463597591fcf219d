#!/usr/bin/env python3
"""CPU benchmarks of the default model through `paged generate` (W7, and the
foundation/scheduler issues' figures), next to llama.cpp's llama-bench on
the same file when its path is given.

  bench/bench_cpu.py [--llama-bench PATH] [--reps 3] [--out bench/results/cpu.json]

Prints, medians of --reps runs:
  batch-1   prefill tok/s (128-token prompt) and decode tok/s (128 tokens)
  N streams aggregate output tok/s at 1, 4, 16 concurrent prompts (128 in / 64 out)
  prefix    time to first token with and without the prefix cache for prompts
            sharing a 512-token prefix (run one after another)
The machine has 2 cores; close other work first (`uptime`).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
# ~128 tokens of plain English for the SmolLM2 tokenizer.
WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old oak tree "
         "near the river where children play and fishermen wait for the evening tide to come in ").split()


def text_of(n_words, offset=0):
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n_words))


def paged(args, *flags, timeout=1800):
    p = subprocess.run([args.paged, "generate", "--model", args.model, *flags], capture_output=True,
                       timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"paged failed: {p.stderr.decode()}")
    return p.stdout.decode(), p.stderr.decode()


def batch1(args):
    pre, dec = [], []
    for _ in range(args.reps):
        _, err = paged(args, "--prompt", text_of(110), "--max-tokens", "128", "--ignore-eos",
                       "--temperature", "0", *args.extra)
        m = re.search(r"prompt (\d+) tokens in [\d.]+ s: ([\d.]+) tok/s \| generated (\d+) tokens in [\d.]+ s: ([\d.]+) tok/s", err)
        pre.append(float(m.group(2)))
        dec.append(float(m.group(4)))
        n_prompt = int(m.group(1))
    return {"prompt_tokens": n_prompt, "prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec)}


def run_file(args, prompts, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
        path = f.name
    try:
        out, _ = paged(args, "--prompts-file", path, "--temperature", "0", *flags, *args.extra)
    finally:
        os.unlink(path)
    return [json.loads(l) for l in out.splitlines()]


def streams(args, n):
    rates = []
    for _ in range(args.reps):
        rows = run_file(args, [{"prompt": text_of(110, i), "max_tokens": 64, "ignore_eos": True} for i in range(n)])
        wall = max(r["total_ms"] for r in rows) / 1000
        rates.append(sum(r["completion_tokens"] for r in rows) / wall)
    return statistics.median(rates)


def prefix(args):
    shared = text_of(450)
    prompts = [{"prompt": shared + " question " + str(i) + ": " + text_of(8, i), "max_tokens": 4} for i in range(8)]
    res = {}
    for name, flags in (("cache_on", []), ("cache_off", ["--no-prefix-caching"])):
        rows = run_file(args, prompts, "--max-num-seqs", "1", *flags)
        # The first request fills the cache; the others can hit it.
        res[name + "_ttft_ms"] = statistics.median(r["ttft_ms"] - (rows[i - 1]["total_ms"] if i else 0)
                                                   for i, r in enumerate(rows) if i > 0)
        res[name + "_cached_tokens"] = sum(r["cached_tokens"] for r in rows)
        res["prompt_tokens"] = rows[0]["prompt_tokens"]
    res["speedup"] = res["cache_off_ttft_ms"] / res["cache_on_ttft_ms"]
    return res


def llama_bench(args):
    if not args.llama_bench:
        return None
    p = subprocess.run([args.llama_bench, "-m", args.model, "-t", str(os.cpu_count()), "-p", "128", "-n", "128",
                        "-r", str(args.reps), "-o", "json"], capture_output=True, timeout=1800)
    rows = json.loads(p.stdout.decode())
    res = {}
    for r in rows:
        key = "prefill_tok_s" if r["n_prompt"] else "decode_tok_s"
        res[key] = r["avg_ts"]
    res["build"] = rows[0].get("build_commit", "")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--paged", default=os.path.join(ROOT, "build/paged"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--llama-bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--extra", nargs="*", default=[], help="extra flags for paged generate")
    args = ap.parse_args()
    t0 = time.time()
    res = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "load": os.getloadavg()[0],
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}
    res["batch1"] = batch1(args)
    res["streams"] = {str(n): streams(args, n) for n in (1, 4, 16)}
    res["prefix_cache"] = prefix(args)
    res["llama_cpp"] = llama_bench(args)
    res["seconds"] = time.time() - t0
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)
    b, l = res["batch1"], res["llama_cpp"]
    print(f"{'figure':34} {'paged':>10} {'llama.cpp':>10} {'ratio':>6}")
    for key, name in (("prefill_tok_s", "batch-1 prefill tok/s"), ("decode_tok_s", "batch-1 decode tok/s")):
        lv = l[key] if l else None
        print(f"{name:34} {b[key]:10.1f} {lv if lv else float('nan'):10.1f} {b[key] / lv if lv else float('nan'):6.2f}")
    for n, v in res["streams"].items():
        print(f"{'aggregate output tok/s, ' + n + ' streams':34} {v:10.1f}")
    pc = res["prefix_cache"]
    print(f"{'prefix cache TTFT ms on/off':34} {pc['cache_on_ttft_ms']:10.1f} {pc['cache_off_ttft_ms']:10.1f} {pc['speedup']:6.2f}x")


if __name__ == "__main__":
    main()
