#!/usr/bin/env python3
"""Continuous batching on the real default model: 32 prompts generated all
at once through the scheduler give exactly the greedy text each gives
alone, also when a tiny KV pool forces preemption (by recompute and by
swap) and when prompts share a long prefix that the prefix cache reuses."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGED = os.environ.get("PAGED_BIN", os.path.join(ROOT, "build/paged"))
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
MAX_TOKENS = 10

SUBJECTS = ["The capital of France is", "My favourite food is", "def fibonacci(n):", "Water boils at",
            "The largest planet is", "In 1969, humans", "A haiku about rain:", "To make tea, first",
            "The opposite of hot is", "import numpy as np\n", "Roses are red,", "The speed of light is",
            "Once upon a time", "SELECT * FROM", "The best way to learn is", "Mount Everest is",
            "Cats are", "1, 2, 3, 4,", "The sun rises in the", "Photosynthesis converts",
            "Dear Sir or Madam,", "The quick brown fox", "HTTP status 404 means", "Shakespeare wrote",
            "The chemical symbol for gold is", "Monday, Tuesday,", "A triangle has", "Bonjour means",
            "The heart pumps", "git commit -m", "Rain falls because", "The moon orbits"]
SHARED = ("You are a concise assistant. Answer in one short sentence, with no preamble, no lists, "
          "and no follow-up questions. Be accurate and plain. Question: ")


def run(prompts, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
        path = f.name
    try:
        p = subprocess.run([PAGED, "generate", "--prompts-file", path, "--temperature", "0",
                            "--max-tokens", str(MAX_TOKENS), "--ignore-eos", *flags],
                           capture_output=True, timeout=1200)
    finally:
        os.unlink(path)
    assert p.returncode == 0, p.stderr.decode()
    rows = [json.loads(l) for l in p.stdout.decode().splitlines()]
    assert len(rows) == len(prompts)
    for r in rows:
        assert r["completion_tokens"] == MAX_TOKENS, r
    return rows


def main():
    if not os.path.exists(MODEL):
        print("SKIP: default model missing")
        sys.exit(77)
    alone = [run([p])[0]["text"] for p in SUBJECTS]
    together = run(SUBJECTS)
    assert [r["text"] for r in together] == alone, "batched greedy text differs from one at a time"
    print("32 prompts at once == one at a time")
    # 24 blocks of 16 tokens cannot hold 32 sequences: the scheduler must
    # preempt, and the text must not change.
    for mode in ("recompute", "swap"):
        rows = run(SUBJECTS, "--kv-blocks", "24", "--max-model-len", "64", "--preemption-mode", mode)
        assert [r["text"] for r in rows] == alone, f"text changed under preemption by {mode}"
        n_pre = sum(r["preemptions"] for r in rows)
        assert n_pre > 0, f"no preemption happened with a tiny pool ({mode})"
        print(f"tiny pool, preemption by {mode}: {n_pre} preemptions, same text")
    # Shared prefix: the first request fills the cache; later ones hit it.
    shared = [SHARED + s for s in SUBJECTS[:8]]
    shared_alone = [run([p], "--no-prefix-caching")[0]["text"] for p in shared]
    rows = run(shared, "--max-num-seqs", "1")  # one at a time through one engine: later ones hit the cache
    assert [r["text"] for r in rows] == shared_alone, "prefix caching changed the text"
    hits = sum(r["cached_tokens"] for r in rows)
    assert hits >= 7 * 16, f"expected prefix-cache hits, got {hits} cached tokens"
    print(f"shared prefix: {hits} prompt tokens served from the prefix cache, same text")
    print("ok")


if __name__ == "__main__":
    main()
