#!/usr/bin/env python3
"""Gemma 2 (engine/model/gemma.c, docs/gemma3.md "Gemma 2") against Hugging
Face transformers on the CPU.

1. Parity: tiny random Gemma2ForCausalLM checkpoints written here by
   transformers (save_pretrained, float32, eager attention; norm weights w
   random, so x * (1 + w) matters): paged's CPU backend in exact mode
   (build/tests/tools/dump_logits) on prompts of 9 to 70 tokens, past the
   window of 8 of the local (even) layers, within 1e-4 relative of
   transformers, same argmax. Variants: "gemma2-caps" with soft-caps small
   enough to bend most scores and logits (attention 2.0, final 3.0: the
   soft-capping must be right), "gemma2" with Gemma 2's defaults (50, 30).
   The "gemma2-caps" checkpoint read by transformers with the caps turned
   off differs from paged by more than 1e-2 (the caps matter);
   query_pre_attn_scalar 32 (head_dim) and 24.
2. GGUF: the "gemma2-caps" weights written as llama.cpp's converter lays a
   Gemma 2 out (gguf-py, arch "gemma2", norms stored as 1 + w, the caps as
   gemma2.attn_logit_softcapping / final_logit_softcapping) give the
   safetensors logits within 1e-5 relative.
3. Tensor parallelism: --tp 2 gives --tp 1's logits within 1e-5 of the
   largest logit.
4. KV layer groups: the server's start-up line shows 2 groups (full,
   window 8) for the 4-layer variant.

Skipped (exit 77) when torch or transformers are not importable.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

try:
    import transformers

    import hf_util as hu
except ImportError as e:  # the quickstart installs them; say so when missing
    print(f"SKIP: transformers/torch not importable ({e})")
    sys.exit(77)

TOL = 1e-4
COMMON = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
              vocab_size=320, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2,
              sliding_window=8)
VARIANTS = {
    # query_pre_attn_scalar = head_dim: what llama.cpp's GGUF implies (it has no key for it)
    "gemma2-caps": dict(num_hidden_layers=4, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                        query_pre_attn_scalar=32),
    "gemma2": dict(num_hidden_layers=5, query_pre_attn_scalar=24),
}
PROMPTS = [[1, 17, 5, 230, 99, 42, 7, 310, 8], list(range(3, 3 + 70 * 4, 4)), [250] * 5 + [11, 12, 13] * 9]


def make_checkpoint(extra, path, seed):
    # Gemma's norms multiply by 1 + w: w around 0 already matters.
    return hu.make_checkpoint(transformers.Gemma2Config(**COMMON, **extra), path, seed, norm_center=0.0)


def main():
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for i, (name, extra) in enumerate(VARIANTS.items()):
            d = dirs[name] = os.path.join(tmp, name)
            model = make_checkpoint(extra, d, seed=40 + i)
            worst = 0.0
            for ids in PROMPTS:
                arch, got = hu.paged_logits([d], ids)
                ref = hu.hf_logits(model, ids)
                err, same = hu.rel(got, ref), hu.same_argmax(got, ref)
                worst = max(worst, err)
                print(f"{name:12s} ({arch}) {len(ids):3d} tokens: rel err {err:.2e} vs transformers, argmax "
                      f"{'equal' if same else 'DIFFERS'}")
                if arch != "gemma2" or not (err < TOL and same):
                    failed.append((name, len(ids), err))
            if name == "gemma2-caps":
                # The same weights without the caps: far from paged's logits.
                cfg = json.load(open(os.path.join(d, "config.json")))
                cfg.update(attn_logit_softcapping=None, final_logit_softcapping=None)
                nocap = os.path.join(tmp, "nocap")
                os.makedirs(nocap)
                json.dump(cfg, open(os.path.join(nocap, "config.json"), "w"))
                os.link(os.path.join(d, "model.safetensors"), os.path.join(nocap, "model.safetensors"))
                m2 = transformers.AutoModelForCausalLM.from_pretrained(nocap, attn_implementation="eager").float()
                _, got = hu.paged_logits([d], PROMPTS[1])
                off = hu.rel(got, hu.hf_logits(m2.eval(), PROMPTS[1]))
                print(f"  the same weights without soft-capping in transformers: rel err {off:.2e} (the caps matter)")
                if off < 1e-2:
                    failed.append(("caps do not matter", off))

        gg = os.path.join(tmp, "g2.gguf")
        hu.write_gemma_gguf(dirs["gemma2-caps"], gg, "gemma2", "gemma2-caps")
        for ids in PROMPTS:
            _, a = hu.paged_logits([dirs["gemma2-caps"]], ids)
            arch, b = hu.paged_logits([gg], ids)
            err = hu.rel(b, a)
            print(f"GGUF vs safetensors, {len(ids)} tokens ({arch}): rel err {err:.2e}")
            if arch != "gemma2" or err > 1e-5:
                failed.append(("gguf", len(ids), err))

        for ids in PROMPTS:
            _, a = hu.paged_logits([dirs["gemma2-caps"]], ids, tp=1)
            _, b = hu.paged_logits([dirs["gemma2-caps"]], ids, tp=2)
            d2 = hu.max_diff(b, a)
            print(f"--tp 2 vs --tp 1, {len(ids)} tokens: max diff {d2:.2e} of the largest logit")
            if d2 > 1e-5:
                failed.append(("tp", len(ids), d2))

        with su.Server("--model", dirs["gemma2-caps"], "--tokenizer", su.MODEL, "--matmul-mode", "exact",
                       "--max-model-len", "256", default_args=False) as srv:
            line = [x for x in srv.log().splitlines() if "KV layer groups:" in x]
            st, r = su.post(srv.port, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0})
            print(line[0].split("INFO")[-1].strip() if line else "no groups line", "| served:", st)
            if not line or "2 block tables" not in line[0] or st != 200:
                failed.append(("served", line, st))

    for f in failed:
        print("FAIL:", f)
    print("ok" if not failed else f"{len(failed)} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
