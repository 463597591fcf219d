#!/usr/bin/env python3
"""Writes a small random Llama model as a Hugging Face directory.

  tests/gpu/make_random_model.py OUT_DIR [--hidden 512] [--layers 4]
      [--heads 8] [--kv-heads 2] [--ffn 1536] [--vocab 1000]
      [--dtype bf16|f32] [--tie] [--seed 1]

config.json, model.safetensors and a byte-level tokenizer.json (256 byte
tokens, no merges, ids >= 256 spelled "<tN>"), with numpy only, so the GPU
machine can make it (the default model cannot travel there). The weights
are scaled like an initialisation that keeps activations near unit size:
linear layers N(0, 1/fan_in), embeddings N(0, 1), norms 1 + N(0, 0.1), the
LM head N(0, 9/hidden) so logits spread over several units and greedy picks
have clear margins. tests/gpu/test_cuda_runner.c runs it on the CPU and
the GPU and compares.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools'))
from safetensors_write import write_safetensors  # noqa: E402


def byte_chars():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def tokenizer_json(vocab):
    bc = byte_chars()
    v = {bc[b]: b for b in range(256)}
    for i in range(256, vocab):
        v[f"<t{i}>"] = i
    return {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": v, "merges": []},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--tie", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    H, hd = a.hidden, a.hidden // a.heads
    q, kv = a.heads * hd, a.kv_heads * hd

    def lin(rows, cols):
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)

    def norm():
        return 1.0 + 0.1 * rng.standard_normal(H, dtype=np.float32)

    t = [("model.embed_tokens.weight", rng.standard_normal((a.vocab, H), dtype=np.float32))]
    for l in range(a.layers):
        p = f"model.layers.{l}."
        t += [
            (p + "input_layernorm.weight", norm()),
            (p + "post_attention_layernorm.weight", norm()),
            (p + "self_attn.q_proj.weight", lin(q, H)),
            (p + "self_attn.k_proj.weight", lin(kv, H)),
            (p + "self_attn.v_proj.weight", lin(kv, H)),
            (p + "self_attn.o_proj.weight", lin(H, q)),
            (p + "mlp.gate_proj.weight", lin(a.ffn, H)),
            (p + "mlp.up_proj.weight", lin(a.ffn, H)),
            (p + "mlp.down_proj.weight", lin(H, a.ffn)),
        ]
    t.append(("model.norm.weight", norm()))
    if not a.tie:
        t.append(("lm_head.weight", 3.0 * rng.standard_normal((a.vocab, H), dtype=np.float32) / np.sqrt(H)))
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), t, a.dtype)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.vocab,
        "hidden_size": H,
        "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": hd,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": bool(a.tie),
        "bos_token_id": None,
        "eos_token_id": 3,
        "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float32",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(a.vocab), f)
    print(f"wrote {a.out}: hidden {H}, {a.layers} layers, {a.heads}/{a.kv_heads} heads of {hd}, ffn {a.ffn}, "
          f"vocab {a.vocab}, {a.dtype}{', tied' if a.tie else ''}")


if __name__ == "__main__":
    main()
