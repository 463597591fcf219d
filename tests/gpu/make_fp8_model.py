#!/usr/bin/env python3
"""Writes a random FP8 checkpoint of a config's shape, for GPU benchmarks of
FP8 weights (--load-format dummy makes bf16 only, and --quantization fp8 of
an 8B bf16 file would first need that 16 GB file).

  tests/gpu/make_fp8_model.py CONFIG.json OUT_DIR [--seed 1] [--shard-mb 4096]

Hugging Face's "fp8" layout, as vLLM and our loader read it
(engine/model/model_load.c, attach_fp8_scales): every linear weight of the
layers in F8_E4M3 with `weight_scale` f32 [rows, 1] = max|row| / 448; the
embedding, norms and LM head bf16; config.json's quantization_config
{"quant_method": "fp8", "activation_scheme": "dynamic"}; a byte-level
tokenizer.json (tests/gpu/make_random_model.py's). Values: linear layers
N(0, 1/fan_in), embeddings N(0, 1), norms 1, the LM head N(0, 9/hidden), as
make_random_model.py scales them. Made with torch on the GPU (the GPU host
has it; an 8B shape takes about a minute, most of it writing 8.5 GB).

Mixture-of-experts configs (model_type qwen3_moe / Qwen3MoeForCausalLM,
mixtral / MixtralForCausalLM) get the tensor names engine/model/
layer_tensors.c reads (docs/moe.md): every expert's gate / up / down
(Qwen3-MoE mlp.experts.E.gate_proj / up_proj / down_proj of width
moe_intermediate_size; Mixtral block_sparse_moe.experts.E.w1 / w3 / w2 of
width intermediate_size) in F8_E4M3 with row scales like the dense
linears; the router (mlp.gate / block_sparse_moe.gate, N(0, 1/hidden)) in
bf16, unquantized as in vLLM's FP8 MoE checkpoints; Qwen3-MoE's
self_attn.q_norm / k_norm bf16 ones; Qwen3-MoE's dense layers
(decoder_sparse_step, mlp_only_layers) the dense mlp.*_proj of
intermediate_size. Per layer the draws are Q, K, V, O, then the router and
expert by expert gate, up, down (or the dense gate, up, down). A MoE
checkpoint is written in shards of about --shard-mb MB at layer
boundaries (model-0000i-of-0000n.safetensors and
model.safetensors.index.json, which formats/safetensors.c reads), so only
one shard's tensors are in memory at a time (Qwen3-30B-A3B's shape: about
31 GB of FP8, 128 experts x 48 layers); when it all fits in one shard it is
one model.safetensors. A dense config is always one model.safetensors, as
before.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_random_model import tokenizer_json  # noqa: E402

MOE_ARCHS = {"qwen3_moe": "qwen3_moe", "Qwen3MoeForCausalLM": "qwen3_moe",
             "mixtral": "mixtral", "MixtralForCausalLM": "mixtral"}


def moe_kind(cfg):
    """'qwen3_moe', 'mixtral' or None (dense): the loader goes by
    architectures[0], a config without it by model_type."""
    archs = cfg.get("architectures") or []
    return MOE_ARCHS.get(archs[0] if archs else cfg.get("model_type", ""))


def nbytes(t):
    return sum(v.numel() * v.element_size() for v in t.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shard-mb", type=float, default=4096.0,
                    help="mixture-of-experts configs: shards of about this many MB (1e6 bytes)")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    H, V, F, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", H // nh)
    moe = moe_kind(cfg)
    if moe == "mixtral":
        E, Fm, step, dense_layers = cfg["num_local_experts"], F, 1, set()
        mlp, names = "block_sparse_moe.", ("w1", "w3", "w2")  # gate, up, down
    elif moe == "qwen3_moe":
        # As engine/model/model_config.c: num_local_experts when there
        # (transformers 5 writes it), else num_experts.
        E = cfg["num_local_experts"] if "num_local_experts" in cfg else cfg["num_experts"]
        Fm, step = cfg["moe_intermediate_size"], cfg.get("decoder_sparse_step") or 1
        dense_layers = set(cfg.get("mlp_only_layers") or [])
        mlp, names = "mlp.", ("gate_proj", "up_proj", "down_proj")

    def is_moe(l):
        return moe is not None and (l + 1) % step == 0 and l not in dense_layers

    def normal(rows, cols, std):
        return torch.randn(rows, cols, generator=g, device=dev, dtype=torch.float32) * std

    def fp8(name, rows, cols):
        w = normal(rows, cols, cols ** -0.5)
        s = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
        return {name: (w / s).to(torch.float8_e4m3fn).cpu(), name + "_scale": s.cpu()}

    os.makedirs(a.out, exist_ok=True)
    shards = []  # the MoE shards written so far: (temporary file name, tensor names)

    def flush(t):
        name = f"model-{len(shards) + 1:05d}.safetensors.tmp"
        save_file(t, os.path.join(a.out, name))
        shards.append((name, sorted(t)))
        t.clear()

    t = {"model.embed_tokens.weight": normal(V, H, 1.0).to(torch.bfloat16).cpu()}
    ones = torch.ones(H, dtype=torch.bfloat16)
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = ones.clone()
        t[p + "post_attention_layernorm.weight"] = ones.clone()
        for name, rows, cols in (("self_attn.q_proj", nh * hd, H), ("self_attn.k_proj", nkv * hd, H),
                                 ("self_attn.v_proj", nkv * hd, H), ("self_attn.o_proj", H, nh * hd)):
            t.update(fp8(p + name + ".weight", rows, cols))
        if moe == "qwen3_moe":
            t[p + "self_attn.q_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
            t[p + "self_attn.k_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
        if is_moe(l):
            t[p + mlp + "gate.weight"] = normal(E, H, H ** -0.5).to(torch.bfloat16).cpu()  # the router
            for e in range(E):
                q = f"{p}{mlp}experts.{e}."
                for name, rows, cols in ((names[0], Fm, H), (names[1], Fm, H), (names[2], H, Fm)):
                    t.update(fp8(q + name + ".weight", rows, cols))
        else:
            for name, rows, cols in (("mlp.gate_proj", F, H), ("mlp.up_proj", F, H), ("mlp.down_proj", H, F)):
                t.update(fp8(p + name + ".weight", rows, cols))
        if moe and l + 1 < L and nbytes(t) >= a.shard_mb * 1e6:
            flush(t)
    t["model.norm.weight"] = ones.clone()
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = normal(V, H, 3.0 / H ** 0.5).to(torch.bfloat16).cpu()
    if shards:
        flush(t)
        n, weight_map, total = len(shards), {}, 0
        for i, (tmp, tensors) in enumerate(shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(os.path.join(a.out, tmp), os.path.join(a.out, final))
            total += os.path.getsize(os.path.join(a.out, final))
            weight_map.update({k: final for k in tensors})
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    else:
        save_file(t, os.path.join(a.out, "model.safetensors"))
    out_cfg = dict(cfg)
    out_cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    out_cfg["torch_dtype"] = "bfloat16"
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(out_cfg, f, indent=1)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(V), f)
    if moe:
        n_moe = sum(is_moe(l) for l in range(L))
        print(f"wrote {a.out}: {L} layers ({n_moe} MoE: {E} {moe} experts of width {Fm}, bf16 router), hidden {H}, "
              f"ffn {F}, vocab {V}, FP8 e4m3 linear weights with row scales, "
              f"{len(shards) or 1} file{'s' if len(shards) > 1 else ''}")
    else:
        print(f"wrote {a.out}: {L} layers, hidden {H}, ffn {F}, vocab {V}, FP8 e4m3 linear weights with row scales")


if __name__ == "__main__":
    main()
