#!/usr/bin/env python3
"""LoRA adapters in the forward (engine/model/lora.c, engine/model/layers.c;
docs/lora.md) against Hugging Face transformers + peft on the CPU.

A tiny random Llama base is written by transformers (float32), and three
PEFT adapters by peft itself, with lora_B randomised (PEFT starts it at
zero, which would hide every mistake):
  1. rank 4, alpha 8, q_proj and v_proj;
  2. rank 8, alpha 16, all seven projections;
  3. rank 16, alpha 32, rsLoRA (scale alpha / sqrt(r)), k_proj, o_proj,
     gate_proj and down_proj.
paged (build/tests/tools/dump_logits, exact mode) runs ONE batch that mixes
the three adapters and the base model over several prompts; every
sequence's next-token logits must be within 1e-4 relative of peft's for its
adapter (the base model's for none), with the same argmax. The same batch at
--tp 2 must give the --tp 1 logits within 1e-5 of the largest logit (each
rank holds its slice of every pair: B's rows for q/k/v/gate/up, A's columns
for o/down). A bad adapter stops the load with one line naming the file.

Skipped (exit 77) when torch, transformers or peft are not importable.
"""
import copy
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4

try:
    import hf_util as hu  # numpy, torch, transformers
    import numpy as np
    import peft
    import torch
    import transformers
except ImportError as e:  # the quickstart installs them; say so when missing
    print(f"SKIP: torch/transformers/peft not importable ({e})")
    sys.exit(77)

BASE = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=312, max_position_embeddings=512, rms_norm_eps=1e-6,
            initializer_range=0.2, rope_theta=10000.0, tie_word_embeddings=False)

ADAPTERS = [
    dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]),
    dict(r=16, lora_alpha=32, use_rslora=True, target_modules=["k_proj", "o_proj", "gate_proj", "down_proj"]),
]

PROMPTS = [[1, 17, 5, 230, 99, 42, 7, 310, 8], list(range(3, 3 + 60, 3)), [250] * 5 + [11, 12, 13]]
# (adapter, prompt) pairs of the one batch: every adapter, the base, and
# one prompt under several adapters.
BATCH = [(1, 0), (2, 1), (3, 2), (0, 0), (2, 0), (3, 0), (0, 1), (1, 2)]


def dump(args, batch, tp=1):
    return hu.dump(args, *[(a, PROMPTS[p]) for a, p in batch], tp=tp)


def paged_batch(args, batch, tp=1):
    p = dump(args, batch, tp)
    assert p.returncode == 0, p.stderr
    return [np.array(json.loads(line)["logits"], dtype=np.float64) for line in p.stdout.strip().splitlines()]


def main():
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = os.path.join(tmp, "base")
        base = hu.make_checkpoint(transformers.LlamaConfig(**BASE), base_dir, seed=7)

        refs = {(0, p): hu.hf_logits(base, ids) for p, ids in enumerate(PROMPTS)}
        dirs = []
        for i, kw in enumerate(ADAPTERS):
            torch.manual_seed(100 + i)
            m = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(lora_dropout=0.0, **kw))
            with torch.no_grad():
                for name, p in m.named_parameters():
                    if "lora_B" in name or "lora_A" in name:
                        p.copy_(0.3 * torch.randn_like(p))
            m.eval()
            d = os.path.join(tmp, f"adapter{i + 1}")
            m.save_pretrained(d)
            dirs.append(d)
            for p, ids in enumerate(PROMPTS):
                refs[(i + 1, p)] = hu.hf_logits(m, ids)

        lora_args = [base_dir] + [x for d in dirs for x in ("--lora", d)]
        got = paged_batch(lora_args, BATCH)
        worst = 0.0
        for (a, p), g in zip(BATCH, got):
            ref = refs[(a, p)]
            err = hu.rel(g, ref)
            same = hu.same_argmax(g, ref)
            moved = hu.rel(ref, refs[(0, p)])
            worst = max(worst, err)
            print(f"adapter {a} prompt {p} ({len(PROMPTS[p]):2d} tokens): rel err {err:.2e} vs peft, argmax "
                  f"{'equal' if same else 'DIFFERS'} (the adapter moves the logits by {moved:.2f})")
            if not (err < TOL and same):
                failed.append(("parity", a, p, err))
            if a and moved < 0.05:
                failed.append(("adapter has no effect", a, p, moved))

        tp2 = paged_batch(lora_args, BATCH, tp=2)
        for (a, p), g1, g2 in zip(BATCH, got, tp2):
            d = hu.max_diff(g2, g1)
            if not (d < 1e-5 and hu.same_argmax(g2, g1)):
                failed.append(("tp", a, p, d))
        print(f"--tp 2 vs --tp 1, the same mixed batch: max diff "
              f"{max(hu.max_diff(b, a) for a, b in zip(got, tp2)):.1e} of the largest logit")

        # A bad adapter: one line naming the file and the reason.
        bad = os.path.join(tmp, "bad")
        os.makedirs(bad)
        cfg = json.load(open(os.path.join(dirs[0], "adapter_config.json")))
        cfg["r"] = 128
        json.dump(cfg, open(os.path.join(bad, "adapter_config.json"), "w"))
        p = dump([base_dir, "--lora", bad], [(1, 0)])
        lines = p.stderr.strip().splitlines()
        print(f"refused: {lines[-1] if lines else '(nothing)'}")
        if not (p.returncode != 0 and len(lines) == 1 and "adapter_config.json" in lines[0] and "128" in lines[0]):
            failed.append(("bad adapter", p.returncode, p.stderr))

    print(f"worst: {worst:.1e}")
    if failed:
        print(f"FAIL: {failed}")
        return 1
    print(f"ok: {len(BATCH)} sequences of 3 adapters and the base in one batch within {TOL:g} of peft "
          f"{peft.__version__}; --tp 2 equal; a bad adapter refused in one line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
