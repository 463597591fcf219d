#!/usr/bin/env python3
"""The forward's graph-safe LoRA paths on the CPU (engine/model/layers.c
layer_lora, engine/runner/runner.c queue_step; docs/lora.md "Split eager
steps"), against the plain eager path.

The CPU backend's lora_apply_dev is the op's reference (kernels/cpu/lora.c:
the norm, then lora_apply), so on the CPU the dev-row paths differ from the
plain one only in how the forward routes rows: which rows reach which op,
through which views, with the norm fused or not. Those are what break when
the routing is wrong, and what this checks on the real default model:

`paged generate` (exact matmul mode, so every row's arithmetic is the same
in any batch) runs eight greedy requests over two random PEFT adapters and
the base, with prompts of 4 to 200 tokens and --max-num-batched-tokens 32,
so that most steps mix the short requests' decode rows with a long prompt's
chunk. Run three ways:
  1. plain: every eager step through lora_apply over the host rows;
  2. PAGED_LORA_DEV_EAGER=1: every eager step through lora_apply_dev over
     the uploaded rows, the norm fused as graph steps fuse it;
  3. PAGED_LORA_SPLIT=1: an eager step's decode rows (its first n_decode
     rows) through lora_apply_dev, its prefill rows through lora_apply.
The output ids must be identical, each run must log the path it took, and
the adapters must change the output (else nothing would be tested). A
"model" in a prompts-file line that names no adapter is refused on its line.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
try:
    import torch  # noqa: F401  (test_lora_server's adapter writer)
except ImportError as e:
    su.skip(f"torch not importable ({e})")
from test_lora_server import write_adapter  # noqa: E402

SIZES = [(5, "a"), (9, None), (200, "b"), (7, "b"), (150, "a"), (12, None), (90, "a"), (4, "b")]


def generate(tmp, prompts, env_extra):
    env = dict(os.environ)
    env.pop("PAGED_LORA_DEV_EAGER", None)
    env.pop("PAGED_LORA_SPLIT", None)
    env.update(env_extra)
    p = subprocess.run([su.binary(), "generate", "--model", su.MODEL, "--matmul-mode", "exact", "--enable-lora",
                        "--lora-modules", f"a={tmp}/a", f"b={tmp}/b", "--prompts-file", prompts,
                        "--max-num-batched-tokens", "32"], capture_output=True, text=True, timeout=300, env=env)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")], p.stderr


def main():
    with tempfile.TemporaryDirectory() as tmp:
        write_adapter(f"{tmp}/a", 1)
        write_adapter(f"{tmp}/b", 2, rank=16, alpha=16)
        r = random.Random(3)
        prompts = f"{tmp}/p.jsonl"
        with open(prompts, "w") as f:
            for n, model in SIZES:
                d = {"prompt_ids": [r.randrange(1, 40000) for _ in range(n)], "max_tokens": 24, "temperature": 0,
                     "ignore_eos": True}
                if model:
                    d["model"] = model
                f.write(json.dumps(d) + "\n")
        runs = {}
        for name, env, log in [("plain", {}, None),
                               ("dev", {"PAGED_LORA_DEV_EAGER": "1"}, "eager steps through the graph-safe op"),
                               ("split", {"PAGED_LORA_SPLIT": "1"}, "eager steps' decode rows through the graph-safe op")]:
            rc, out, err = generate(tmp, prompts, env)
            assert rc == 0 and len(out) == len(SIZES), (name, rc, err[-2000:])
            assert log is None or log in err, (name, err[-2000:])
            runs[name] = [o["output_ids"] for o in out]
            print(f"{name}: {len(out)} requests, {sum(len(x) for x in runs[name])} tokens")
        for name in ("dev", "split"):
            diff = [i for i in range(len(SIZES)) if runs[name][i] != runs["plain"][i]]
            assert not diff, f"{name}: requests {diff} differ from the plain path"
        # The adapters act: the same prompt under "a" and under the base differs.
        with open(prompts) as f:
            first = json.loads(f.readline())
        base_only = f"{tmp}/base.jsonl"
        with open(base_only, "w") as f:
            f.write(json.dumps({k: v for k, v in first.items() if k != "model"}) + "\n")
        rc, out, err = generate(tmp, base_only, {})
        assert rc == 0 and out[0]["output_ids"] != runs["plain"][0], "adapter a left request 0 unchanged"
        print("dev and split: every request's ids equal the plain path's; adapter a changes request 0")
        # A model that is not served is refused on its line, the rest runs.
        bad = f"{tmp}/bad.jsonl"
        with open(bad, "w") as f:
            f.write(json.dumps({"prompt_ids": [1, 2, 3], "max_tokens": 2, "model": "nope"}) + "\n")
            f.write(json.dumps({"prompt_ids": [1, 2, 3], "max_tokens": 2, "temperature": 0}) + "\n")
        rc, out, err = generate(tmp, bad, {})
        assert rc == 1 and "nope" in out[0].get("error", "") and out[1].get("output_ids"), (rc, out, err[-500:])
        print(f"refused: {out[0]['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
