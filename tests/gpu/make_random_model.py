#!/usr/bin/env python3
"""Writes a small random Llama model as a Hugging Face directory.

  tests/gpu/make_random_model.py OUT_DIR [--hidden 512] [--layers 4]
      [--heads 8] [--kv-heads 2] [--ffn 1536] [--vocab 1000]
      [--dtype bf16|f32] [--tie] [--seed 1] [--head-dim D]
      [--moe qwen3|mixtral [--experts 8] [--top-k 2] [--moe-ffn 256]
       [--no-renorm]]

config.json, model.safetensors and a byte-level tokenizer.json (256 byte
tokens, no merges, ids >= 256 spelled "<tN>"), with numpy only, so the GPU
machine can make it (the default model cannot travel there). The weights
are scaled like an initialisation that keeps activations near unit size:
linear layers N(0, 1/fan_in), embeddings N(0, 1), norms 1 + N(0, 0.1), the
LM head N(0, 9/hidden) so logits spread over several units and greedy picks
have clear margins. tests/gpu/test_cuda_runner.c runs it on the CPU and
the GPU and compares.

--moe writes a mixture-of-experts model instead, with the tensor names and
config keys engine/model/layer_tensors.c and model_config.c read (as
transformers writes them; tests/integration/test_moe.py): qwen3 a
Qwen3MoeForCausalLM (q/k norms, mlp.gate router, mlp.experts.E.gate_proj /
up_proj / down_proj of width --moe-ffn in every layer, norm_topk_prob unless
--no-renorm); mixtral a MixtralForCausalLM (block_sparse_moe.gate,
block_sparse_moe.experts.E.w1 / w3 / w2, intermediate_size = --moe-ffn,
always renormalised). The router is N(0, 1/hidden) like any linear layer,
so the routing logits spread over about a unit and ties are rare.
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
    ap.add_argument("--head-dim", type=int, default=0, help="default hidden / heads")
    ap.add_argument("--moe", choices=["qwen3", "mixtral"])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-ffn", type=int, default=256)
    ap.add_argument("--no-renorm", action="store_true", help="qwen3: norm_topk_prob false")
    a = ap.parse_args()
    if a.moe and not 1 <= a.top_k <= a.experts:
        ap.error(f"--top-k {a.top_k} of {a.experts} experts")
    if a.no_renorm and a.moe != "qwen3":
        ap.error("--no-renorm is Qwen3-MoE's norm_topk_prob (Mixtral always renormalises)")
    rng = np.random.default_rng(a.seed)
    H, hd = a.hidden, a.head_dim or a.hidden // a.heads
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
        ]
        if a.moe == "qwen3":
            t += [(p + "self_attn.q_norm.weight", 1.0 + 0.1 * rng.standard_normal(hd, dtype=np.float32)),
                  (p + "self_attn.k_norm.weight", 1.0 + 0.1 * rng.standard_normal(hd, dtype=np.float32)),
                  (p + "mlp.gate.weight", lin(a.experts, H))]
            for e in range(a.experts):
                t += [(p + f"mlp.experts.{e}.gate_proj.weight", lin(a.moe_ffn, H)),
                      (p + f"mlp.experts.{e}.up_proj.weight", lin(a.moe_ffn, H)),
                      (p + f"mlp.experts.{e}.down_proj.weight", lin(H, a.moe_ffn))]
        elif a.moe == "mixtral":
            t.append((p + "block_sparse_moe.gate.weight", lin(a.experts, H)))
            for e in range(a.experts):  # w1 gate, w3 up, w2 down
                t += [(p + f"block_sparse_moe.experts.{e}.w1.weight", lin(a.moe_ffn, H)),
                      (p + f"block_sparse_moe.experts.{e}.w3.weight", lin(a.moe_ffn, H)),
                      (p + f"block_sparse_moe.experts.{e}.w2.weight", lin(H, a.moe_ffn))]
        else:
            t += [
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
    if a.moe == "qwen3":
        # intermediate_size is the dense layers' width (none here: every
        # layer is sparse with decoder_sparse_step 1).
        cfg.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=a.experts,
                   num_experts_per_tok=a.top_k, moe_intermediate_size=a.moe_ffn, norm_topk_prob=not a.no_renorm,
                   decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False, use_sliding_window=False,
                   sliding_window=None)
    elif a.moe == "mixtral":
        # Mixtral's experts are intermediate_size wide; no sliding window
        # (a number here would turn one on).
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=a.moe_ffn,
                   num_local_experts=a.experts, num_experts_per_tok=a.top_k, sliding_window=None)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(a.vocab), f)
    ffn = (f"{a.moe} experts {a.experts} top {a.top_k} of width {a.moe_ffn}"
           f"{', not renormalised' if a.no_renorm else ''}" if a.moe else f"ffn {a.ffn}")
    print(f"wrote {a.out}: hidden {H}, {a.layers} layers, {a.heads}/{a.kv_heads} heads of {hd}, {ffn}, "
          f"vocab {a.vocab}, {a.dtype}{', tied' if a.tie else ''}")


if __name__ == "__main__":
    main()
