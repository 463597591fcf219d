#!/usr/bin/env python3
"""Writes a Hugging Face style model directory from a Llama GGUF file.

  tools/gguf_to_hf.py MODEL.gguf OUT_DIR [--dtype f32|f16|bf16] [--shards N]
                      [--tokenizer-json FILE] [--layers N]

Weights are dequantized by the `gguf` package (llama.cpp's gguf-py), Q and K
rows are put back in the rotate-half order Hugging Face checkpoints use, and
the result is written as model.safetensors (or N shards plus
model.safetensors.index.json) with config.json and generation_config.json.
Used by the loader tests (the same weights through both loaders must give
the same logits) and to make small models for the GPU machine (--layers
keeps only the first N layers).
"""
import argparse
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_write import write_safetensors  # noqa: E402


def unpermute(w, n_head):
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--tokenizer-json")
    ap.add_argument("--layers", type=int, default=0)
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = kv["general.architecture"]
    nh, nkv = kv[f"{arch}.attention.head_count"], kv[f"{arch}.attention.head_count_kv"]
    n_layers = kv[f"{arch}.block_count"]
    if a.layers:
        n_layers = min(n_layers, a.layers)
    t = {}
    for x in r.tensors:
        t[x.name] = dequantize(x.data, x.tensor_type).astype(np.float32).reshape(
            [int(d) for d in reversed(x.shape)])
    out = [("model.embed_tokens.weight", t["token_embd.weight"]), ("model.norm.weight", t["output_norm.weight"])]
    if "output.weight" in t:
        out.append(("lm_head.weight", t["output.weight"]))
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for l in range(n_layers):
        for g, h in names.items():
            w = t[f"blk.{l}.{g}.weight"]
            if g == "attn_q":
                w = unpermute(w, nh)
            elif g == "attn_k":
                w = unpermute(w, nkv)
            out.append((f"model.layers.{l}.{h}.weight", w))
    os.makedirs(a.out, exist_ok=True)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), out, a.dtype)
    else:
        wm = {}
        per = (len(out) + a.shards - 1) // a.shards
        for s in range(a.shards):
            fn = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            part = out[s * per:(s + 1) * per]
            write_safetensors(os.path.join(a.out, fn), part, a.dtype)
            wm.update({n: fn for n, _ in part})
        json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(a.out, "model.safetensors.index.json"), "w"))
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(t["token_embd.weight"].shape[0]), "hidden_size": int(kv[f"{arch}.embedding_length"]),
        "intermediate_size": int(kv[f"{arch}.feed_forward_length"]), "num_hidden_layers": int(n_layers),
        "num_attention_heads": int(nh), "num_key_value_heads": int(nkv),
        "max_position_embeddings": int(kv.get(f"{arch}.context_length", 2048)),
        "rms_norm_eps": float(kv[f"{arch}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(kv.get(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in t, "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[a.dtype],
        "bos_token_id": int(r.fields["tokenizer.ggml.bos_token_id"].contents()),
        "eos_token_id": int(r.fields["tokenizer.ggml.eos_token_id"].contents()),
    }
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)
    json.dump({"eos_token_id": cfg["eos_token_id"], "bos_token_id": cfg["bos_token_id"]},
              open(os.path.join(a.out, "generation_config.json"), "w"))
    if a.tokenizer_json:
        with open(a.tokenizer_json, "rb") as src, open(os.path.join(a.out, "tokenizer.json"), "wb") as dst:
            dst.write(src.read())
        tc = {"add_bos_token": False, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
        if "tokenizer.chat_template" in r.fields:
            tc["chat_template"] = r.fields["tokenizer.chat_template"].contents()
        json.dump(tc, open(os.path.join(a.out, "tokenizer_config.json"), "w"))


if __name__ == "__main__":
    main()
