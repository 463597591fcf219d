#!/usr/bin/env python3
"""Writes a random FP8 checkpoint of a config's shape, for GPU benchmarks of
FP8 weights (--load-format dummy makes bf16 only, and --quantization fp8 of
an 8B bf16 file would first need that 16 GB file).

  tests/gpu/make_fp8_model.py CONFIG.json OUT_DIR [--seed 1]

Hugging Face's "fp8" layout, as vLLM and our loader read it
(engine/model/model_load.c, attach_fp8_scales): every linear weight of the
layers in F8_E4M3 with `weight_scale` f32 [rows, 1] = max|row| / 448; the
embedding, norms and LM head bf16; config.json's quantization_config
{"quant_method": "fp8", "activation_scheme": "dynamic"}; a byte-level
tokenizer.json (tests/gpu/make_random_model.py's). Values: linear layers
N(0, 1/fan_in), embeddings N(0, 1), norms 1, the LM head N(0, 9/hidden), as
make_random_model.py scales them. Made with torch on the GPU (the GPU host
has it; an 8B shape takes about a minute, most of it writing 8.5 GB).
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_random_model import tokenizer_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    H, V, F, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", H // nh)

    def normal(rows, cols, std):
        return torch.randn(rows, cols, generator=g, device=dev, dtype=torch.float32) * std

    def fp8(name, rows, cols):
        w = normal(rows, cols, cols ** -0.5)
        s = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
        return {name: (w / s).to(torch.float8_e4m3fn).cpu(), name + "_scale": s.cpu()}

    t = {"model.embed_tokens.weight": normal(V, H, 1.0).to(torch.bfloat16).cpu()}
    ones = torch.ones(H, dtype=torch.bfloat16)
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = ones.clone()
        t[p + "post_attention_layernorm.weight"] = ones.clone()
        for name, rows, cols in (("self_attn.q_proj", nh * hd, H), ("self_attn.k_proj", nkv * hd, H),
                                 ("self_attn.v_proj", nkv * hd, H), ("self_attn.o_proj", H, nh * hd),
                                 ("mlp.gate_proj", F, H), ("mlp.up_proj", F, H), ("mlp.down_proj", H, F)):
            t.update(fp8(p + name + ".weight", rows, cols))
    t["model.norm.weight"] = ones.clone()
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = normal(V, H, 3.0 / H ** 0.5).to(torch.bfloat16).cpu()
    os.makedirs(a.out, exist_ok=True)
    save_file(t, os.path.join(a.out, "model.safetensors"))
    out_cfg = dict(cfg)
    out_cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    out_cfg["torch_dtype"] = "bfloat16"
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(out_cfg, f, indent=1)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(V), f)
    print(f"wrote {a.out}: {L} layers, hidden {H}, ffn {F}, vocab {V}, FP8 e4m3 linear weights with row scales")


if __name__ == "__main__":
    main()
