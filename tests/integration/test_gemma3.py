#!/usr/bin/env python3
"""Gemma 3 text models (engine/model/gemma.c, docs/gemma3.md) against Hugging
Face transformers on the CPU.

1. Parity: tiny random Gemma3ForCausalLM checkpoints written here by
   transformers itself (save_pretrained, float32, eager attention; every
   norm weight w random, so x * (1 + w) matters): paged's CPU backend in
   exact mode (build/tests/tools/dump_logits) computes the next-token logits
   of prompts of 9 to 70 tokens (longer than the window of 8, so the local
   layers' window matters), transformers computes them in float32; they must
   agree within 1e-4 relative (||paged - hf|| / ||hf||) with the same
   argmax. Variants: "gemma3", layers local but every 6th (llama.cpp's
   pattern), linear RoPE scaling 2 on the global layers, query_pre_attn_scalar
   = head_dim; "gemma3-mixed", layer_types global, local, global, local,
   local, global, and query_pre_attn_scalar 24 (not head_dim).
2. GGUF: the "gemma3" weights written as llama.cpp's convert_hf_to_gguf.py
   lays them out (gguf-py, arch "gemma3", norms stored as 1 + w, Q/K rows as
   they are) give the safetensors logits within 1e-5 relative; the same
   safetensors with a transformers 4 config.json (sliding_window_pattern,
   rope_local_base_freq, rope_scaling) give them exactly.
3. Tensor parallelism: --tp 2 (two query heads a rank, the one KV head on
   both) gives the logits of --tp 1 within 1e-5 of the largest logit.
4. Errors, one line: a multimodal Gemma3ForConditionalGeneration config;
   use_bidirectional_attention (soft-capping runs since Gemma 2 came:
   test_gemma2.py).

Skipped (exit 77) when torch or transformers are not importable.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

TOL = 1e-4

try:
    import hf_util as hu  # numpy, torch, transformers
    import transformers
except ImportError as e:  # the quickstart installs them; say so when missing
    print(f"SKIP: transformers/torch not importable ({e})")
    sys.exit(77)

S, F = "sliding_attention", "full_attention"
COMMON = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
              vocab_size=320, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2,
              sliding_window=8)
VARIANTS = {
    "gemma3": dict(num_hidden_layers=7, layer_types=[S, S, S, S, S, F, S], query_pre_attn_scalar=32,
                   rope_parameters={F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                                    S: {"rope_type": "default", "rope_theta": 10000.0}}),
    "gemma3-mixed": dict(num_hidden_layers=6, layer_types=[F, S, F, S, S, F], query_pre_attn_scalar=24),
}
PROMPTS = [[1, 17, 5, 230, 99, 42, 7, 310, 8], list(range(3, 3 + 70 * 4, 4)), [250] * 5 + [11, 12, 13] * 9]


def make_checkpoint(extra, path, seed):
    """A tiny random Gemma 3 (test_kv_layer_groups.py writes one too). Gemma's
    norms start at w = 0 (x * 1): moved to 0.3 * N(0, 1)."""
    return hu.make_checkpoint(transformers.Gemma3TextConfig(**COMMON, **extra), path, seed, norm_center=0.0)


def main():
    failed = []
    worst = {}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        # 1. Parity with transformers.
        for i, (name, extra) in enumerate(VARIANTS.items()):
            path = os.path.join(tmp, name)
            model = make_checkpoint(extra, path, seed=201 + i)
            dirs[name] = path
            for ids in PROMPTS:
                ref = hu.hf_logits(model, ids)
                arch, got = hu.paged_logits([path], ids)
                err = hu.rel(got, ref)
                same = hu.same_argmax(got, ref)
                worst[name] = max(worst.get(name, 0.0), err)
                print(f"{name:13s} ({arch}) {len(ids):3d} tokens: rel err {err:.2e}, argmax "
                      f"{'equal' if same else 'DIFFERS'}")
                if not (err < TOL and same):
                    failed.append(("parity", name, len(ids), err))

        # 2. GGUF: llama.cpp's layout of the same weights.
        try:
            import gguf  # noqa: F401
            out = os.path.join(tmp, "gemma3.gguf")
            hu.write_gemma_gguf(dirs["gemma3"], out, "gemma3", "gemma3")
            for ids in PROMPTS:
                _, a = hu.paged_logits([dirs["gemma3"]], ids)
                arch, b = hu.paged_logits([out], ids)
                err = hu.rel(b, a)
                print(f"gemma3 gguf ({arch}) vs safetensors {len(ids):3d} tokens: rel err {err:.2e}")
                if not (err < 1e-5 and hu.same_argmax(b, a)):
                    failed.append(("gguf", len(ids), err))
        except ImportError:
            print("gguf-py not importable: the GGUF check is left out")

        # 2b. The same checkpoint with a transformers 4 config.json (what the
        # Hub's gemma-3 configs say): no layer_types but sliding_window_pattern,
        # rope_theta / rope_local_base_freq / rope_scaling instead of
        # rope_parameters: the same logits.
        old = os.path.join(tmp, "gemma3-v4")
        os.makedirs(old)
        cfg = json.load(open(os.path.join(dirs["gemma3"], "config.json")))
        full = cfg.pop("rope_parameters")[F]
        del cfg["layer_types"]
        cfg.update(sliding_window_pattern=6, rope_theta=full["rope_theta"], rope_local_base_freq=10000.0,
                   rope_scaling={"rope_type": "linear", "factor": full["factor"]})
        json.dump(cfg, open(os.path.join(old, "config.json"), "w"))
        os.symlink(os.path.join(dirs["gemma3"], "model.safetensors"), os.path.join(old, "model.safetensors"))
        for ids in PROMPTS[1:2]:
            _, a = hu.paged_logits([dirs["gemma3"]], ids)
            _, b = hu.paged_logits([old], ids)
            err = hu.rel(b, a)
            print(f"gemma3 transformers-4 config.json vs 5 {len(ids):3d} tokens: rel err {err:.2e}")
            if err != 0.0:
                failed.append(("v4 config", len(ids), err))

        # 3. Tensor parallelism.
        for name in VARIANTS:
            for ids in PROMPTS[:2]:
                _, a = hu.paged_logits([dirs[name]], ids)
                _, b = hu.paged_logits([dirs[name]], ids, tp=2)
                err = hu.max_diff(b, a)
                print(f"{name:13s} --tp 2 vs --tp 1 {len(ids):3d} tokens: max diff {err:.1e} of the largest logit")
                if not (err < 1e-5 and hu.same_argmax(b, a)):
                    failed.append(("tp", name, err))

        # 4. Errors: one line naming the file and the reason.
        def refused(args, want, what):
            p = hu.dump(args, PROMPTS[0])
            lines = p.stderr.strip().splitlines()
            ok = p.returncode != 0 and len(lines) == 1 and all(w in lines[0] for w in want)
            print(f"refused, {what}: {lines[-1] if lines else '(nothing)'}")
            if not ok:
                failed.append(("error", what, p.returncode, p.stderr))

        for what, edit, want in (("multimodal", {"architectures": ["Gemma3ForConditionalGeneration"]},
                                  ["Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"]),
                                 ("bidirectional", {"use_bidirectional_attention": True},
                                  ["use_bidirectional_attention"])):
            bad = os.path.join(tmp, "bad-" + what)
            os.makedirs(bad)
            cfg = json.load(open(os.path.join(dirs["gemma3"], "config.json")))
            cfg.update(edit)
            json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
            os.symlink(os.path.join(dirs["gemma3"], "model.safetensors"), os.path.join(bad, "model.safetensors"))
            refused([bad], [bad] + want, what)

    print("worst: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return su.verdict(failed, f"ok: {len(VARIANTS)} Gemma 3 variants x {len(PROMPTS)} prompts within {TOL:g} of "
                      f"transformers {transformers.__version__}; GGUF, --tp 2 and the errors as expected")


if __name__ == "__main__":
    sys.exit(main())
