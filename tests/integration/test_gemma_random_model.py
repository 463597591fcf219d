#!/usr/bin/env python3
"""The random Gemma models the GPU tests write (tests/gpu/make_random_model.py
--gemma3 / --gemma2, numpy only) against Hugging Face transformers on the CPU:
transformers loads each directory as written (its config keys and tensor
names) and its float32 next-token logits of a 100-token prompt (longer than
the window, so the local layers' window matters) and of a 5-token one agree
with paged's exact mode (build/tests/tools/dump_logits) within 1e-4
relative, with the same argmax. float32 weights (--dtype f32); variants:
"gemma3" the GPU tests' default (4 layers L L L G, window 32, head_dim 64,
tied), "gemma3-27b-like" (head_dim 128, 4/1 heads, query_pre_attn_scalar
168, linear RoPE 8 on the global layers, window 16, 7 layers, untied),
"gemma2" (soft-caps 5 so they matter, layers L G L G).

Skipped (exit 77) when torch or transformers are not importable.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

TOL = 1e-4

try:
    import hf_util as hu  # numpy, torch, transformers
    import torch
    import transformers
except ImportError as e:
    print(f"SKIP: transformers/torch not importable ({e})")
    sys.exit(77)

MAKE = os.path.join(hu.ROOT, "tests/gpu/make_random_model.py")
VARIANTS = {
    "gemma3": ["--gemma3"],
    "gemma3-27b-like": ["--gemma3", "--layers", "7", "--heads", "4", "--kv-heads", "1", "--head-dim", "128",
                        "--attn-scalar", "168", "--rope-linear", "8", "--window", "16", "--untie", "--seed", "3"],
    "gemma2": ["--gemma2", "--attn-softcap", "5", "--final-softcap", "5", "--seed", "2"],
}
PROMPTS = [list(range(5, 5 + 100 * 7, 7)), [104, 101, 108, 108, 111]]


def main():
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in VARIANTS.items():
            path = os.path.join(tmp, name)
            subprocess.run([sys.executable, MAKE, path, "--dtype", "f32", *args], check=True)
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                      attn_implementation="eager").eval()
            for ids in PROMPTS:
                ref = hu.hf_logits(model, ids)
                arch, got = hu.paged_logits([path], ids)
                err = hu.rel(got, ref)
                same = hu.same_argmax(got, ref)
                print(f"{name:15s} ({arch}) {len(ids):3d} tokens: rel err {err:.2e}, argmax "
                      f"{'equal' if same else 'DIFFERS'}")
                if not (err < TOL and same):
                    failed.append((name, len(ids), err))
    return su.verdict(failed, f"ok: make_random_model.py's {len(VARIANTS)} Gemma variants within {TOL:g} of "
                      f"transformers {transformers.__version__}")


if __name__ == "__main__":
    sys.exit(main())
