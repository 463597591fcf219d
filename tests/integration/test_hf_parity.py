#!/usr/bin/env python3
"""Every architecture of the one model definition (engine/model/model.c) against
Hugging Face transformers on the CPU: a tiny random checkpoint of each family
is written here by transformers itself (save_pretrained: config.json +
model.safetensors, float32), paged's CPU backend in exact mode computes the
next-token logits of a few prompts (build/tests/tools/dump_logits), and
transformers computes them with torch in float32 (eager attention). The
logits must agree within 1e-4 relative (||paged - hf|| / ||hf||) and have
the same argmax.

Families: Llama 2 (plain RoPE), Llama 3.1 (llama3 RoPE scaling), Mistral
(and Mistral with a sliding window of 8, shorter than the prompts),
Qwen2 (Q/K/V biases, tied embeddings), Qwen3 (per-head q/k RMSNorm, a head
dimension that is not hidden / heads). Skipped (exit 77) when torch or
transformers are not importable.
"""
import os
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4

try:
    import hf_util as hu  # numpy, torch, transformers
    import transformers
except ImportError as e:  # the quickstart installs them; say so when missing
    print(f"SKIP: transformers/torch not importable ({e})")
    sys.exit(77)

COMMON = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=311, max_position_embeddings=512, rms_norm_eps=1e-6,
              initializer_range=0.2)

FAMILIES = {
    "llama2": ("LlamaConfig", dict(rope_theta=10000.0)),
    "llama3.1": ("LlamaConfig", dict(rope_theta=500000.0,
                                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", dict(rope_theta=1000000.0, sliding_window=None)),
    # A window shorter than the prompts: keys past it are masked (the CPU's
    # windowed attention; engine/model/model.c pg_model_attn_window).
    "mistral-window": ("MistralConfig", dict(rope_theta=1000000.0, sliding_window=8)),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)),
    "qwen3": ("Qwen3Config", dict(rope_theta=1000000.0, head_dim=32, use_sliding_window=False)),
}

PROMPTS = [[1, 17, 5, 230, 99, 42, 7, 310, 8], list(range(3, 3 + 70, 3)), [250] * 5 + [11, 12, 13]]


def make_checkpoint(kind, extra, path):
    """A tiny random checkpoint of one family (test_kv_layer_groups.py writes
    one too), seeded by its config (the same weights in every run: Python's
    hash() of the path, the seed before, changed with each process and
    temporary directory); biases away from 0 too."""
    seed = zlib.crc32((kind + repr(sorted(extra.items()))).encode()) % 1000
    return hu.make_checkpoint(getattr(transformers, kind)(**COMMON, **extra), path, seed=seed, bias_scale=0.5)


def main():
    worst = {}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (kind, extra) in FAMILIES.items():
            path = os.path.join(tmp, name)
            model = make_checkpoint(kind, extra, path)
            for ids in PROMPTS:
                ref = hu.hf_logits(model, ids)
                # Without --tp / --threads: dump_logits' defaults.
                arch, got = hu.paged_logits([path], ids, tp=None, threads=None, timeout=120)
                err = hu.rel(got, ref)
                same = hu.same_argmax(got, ref)
                worst[name] = max(worst.get(name, 0.0), err)
                print(f"{name:9s} ({arch:7s}) {len(ids):3d} tokens: rel err {err:.2e}, argmax "
                      f"{'equal' if same else 'DIFFERS'}")
                if not (err < TOL and same):
                    failed.append((name, len(ids), err))
    print("worst: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    if failed:
        print(f"FAIL: {failed}")
        return 1
    print(f"ok: {len(FAMILIES)} families x {len(PROMPTS)} prompts within {TOL:g} of transformers "
          f"{transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
