#!/usr/bin/env python3
"""Writes a small random Llama model as a Hugging Face directory.

  tests/gpu/make_random_model.py OUT_DIR [--hidden 512] [--layers 4]
      [--heads 8] [--kv-heads 2] [--ffn 1536] [--vocab 1000]
      [--dtype bf16|f32] [--tie] [--seed 1] [--head-dim D]
      [--moe qwen3|mixtral [--experts 8] [--top-k 2] [--moe-ffn 256]
       [--no-renorm]]
      [--gemma3|--gemma2 [--window 32] [--global-every 6|2] [--pattern LLLLLG]
       [--attn-scalar S] [--rope-linear F] [--untie]
       [--attn-softcap 50] [--final-softcap 30]]

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

--gemma3 writes a Gemma3ForCausalLM (model_type gemma3_text) instead, and
--gemma2 a Gemma2ForCausalLM, with the config keys and tensor names
transformers 5 writes for them (save_pretrained; tests/integration/
test_gemma3.py and test_gemma2.py) and engine/model/model_config.c /
layer_tensors.c read: four norms a layer (input_layernorm,
post_attention_layernorm, pre_feedforward_layernorm,
post_feedforward_layernorm), Gemma 3's self_attn.q_norm / k_norm,
gelu_pytorch_tanh gate/up/down, tied embeddings (no lm_head.weight unless
--untie), layer_types of "sliding_attention" (local, a window of --window
tokens) and "full_attention" (global), query_pre_attn_scalar (--attn-scalar,
default head_dim), and RoPE per layer type in rope_parameters (Gemma 3:
global 1e6, linear scaling --rope-linear F if given, local 1e4; Gemma 2:
one base 1e4). The layers are local but every --global-every-th (default
6 for Gemma 3, 2 for Gemma 2), the last layer global when that leaves none;
--pattern spells them out instead, one letter a layer (L local, G global).
Gemma 2 has the soft-caps (--attn-softcap, default 50, --final-softcap,
default 30; 0 writes null: none); small values (5) make them matter.
--head-dim defaults to 64 and must be 64, 128 or 256 (the CUDA attention
kernels'). Gemma's norms compute x * (1 + w), so w is N(0, 0.1) (paged's
loader adds the 1 for Hugging Face files). Gemma scales the embeddings by
sqrt(hidden), so they are N(0, 9/hidden) when tied (the LM head's scale
above: the residual stream starts near 3 a component, each layer's
post-normed attention and FFN add about 1) and N(0, 1/hidden) with --untie
(then lm_head.weight is N(0, 9/hidden)). A tied random model's logits favour
the last input token (its embedding is the largest part of the residual):
the logits still differ everywhere else, but greedy text repeats.
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
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gemma3", action="store_true", help="a Gemma3ForCausalLM (gemma3_text)")
    g.add_argument("--gemma2", action="store_true", help="a Gemma2ForCausalLM")
    ap.add_argument("--window", type=int, default=32, help="Gemma: the local layers' sliding_window")
    ap.add_argument("--global-every", type=int, default=0, help="Gemma: every N-th layer global (6 or 2)")
    ap.add_argument("--pattern", default="", help="Gemma: one letter a layer, L local, G global")
    ap.add_argument("--attn-scalar", type=int, default=0, help="Gemma: query_pre_attn_scalar (head_dim)")
    ap.add_argument("--rope-linear", type=float, default=0, help="Gemma 3: the global layers' linear RoPE factor")
    ap.add_argument("--untie", action="store_true", help="Gemma: write lm_head.weight")
    ap.add_argument("--attn-softcap", type=float, help="Gemma 2: attn_logit_softcapping (0: null)")
    ap.add_argument("--final-softcap", type=float, help="Gemma 2: final_logit_softcapping (0: null)")
    a = ap.parse_args()
    gemma = a.gemma3 or a.gemma2
    if gemma and a.moe:
        ap.error("--moe and --gemma3/--gemma2 are different models")
    if gemma and a.tie:
        ap.error("Gemma is tied unless --untie (no --tie)")
    if not gemma and (a.untie or a.pattern or a.global_every or a.attn_scalar or a.rope_linear):
        ap.error("--untie, --pattern, --global-every, --attn-scalar and --rope-linear are Gemma's")
    if a.rope_linear and not a.gemma3:
        ap.error("--rope-linear is Gemma 3's (its global layers)")
    if (a.attn_softcap is not None or a.final_softcap is not None) and not a.gemma2:
        ap.error("--attn-softcap and --final-softcap are Gemma 2's")
    if a.gemma2:
        a.attn_softcap = 50.0 if a.attn_softcap is None else a.attn_softcap
        a.final_softcap = 30.0 if a.final_softcap is None else a.final_softcap
    if gemma:
        a.head_dim = a.head_dim or 64
        if a.head_dim not in (64, 128, 256):
            ap.error(f"--head-dim {a.head_dim}: Gemma's random models use 64, 128 or 256 (the CUDA attention kernels')")
        if a.window < 1:
            ap.error(f"--window {a.window}")
        every = a.global_every or (6 if a.gemma3 else 2)
        if every < 1:
            ap.error(f"--global-every {every}")
        if a.pattern:
            if len(a.pattern) != a.layers or set(a.pattern) - set("LG"):
                ap.error(f"--pattern {a.pattern!r}: {a.layers} letters, L or G")
            local = [c == "L" for c in a.pattern]
        else:
            local = [(l + 1) % every != 0 for l in range(a.layers)]
            if all(local):
                local[-1] = False
        a.tie = not a.untie
    if a.moe and not 1 <= a.top_k <= a.experts:
        ap.error(f"--top-k {a.top_k} of {a.experts} experts")
    if a.no_renorm and a.moe != "qwen3":
        ap.error("--no-renorm is Qwen3-MoE's norm_topk_prob (Mixtral always renormalises)")
    rng = np.random.default_rng(a.seed)
    H, hd = a.hidden, a.head_dim or a.hidden // a.heads
    q, kv = a.heads * hd, a.kv_heads * hd

    def lin(rows, cols):
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)

    def norm(n=H):  # Gemma's x * (1 + w): w near 0
        return (0.0 if gemma else 1.0) + 0.1 * rng.standard_normal(n, dtype=np.float32)

    emb = rng.standard_normal((a.vocab, H), dtype=np.float32)
    if gemma:  # times sqrt(H) in the model; tied, also the LM head
        emb *= (3.0 if a.tie else 1.0) / np.sqrt(H)
    t = [("model.embed_tokens.weight", emb)]
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
        if gemma:
            t += [(p + "pre_feedforward_layernorm.weight", norm()),
                  (p + "post_feedforward_layernorm.weight", norm())]
            if a.gemma3:
                t += [(p + "self_attn.q_norm.weight", norm(hd)), (p + "self_attn.k_norm.weight", norm(hd))]
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
    elif gemma:
        # transformers 5's keys (save_pretrained of Gemma3TextConfig /
        # Gemma2Config); rope_theta lives in rope_parameters.
        del cfg["rope_theta"]
        cfg.update(hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, attention_bias=False,
                   attention_dropout=0.0, query_pre_attn_scalar=a.attn_scalar or hd, sliding_window=a.window,
                   layer_types=["sliding_attention" if x else "full_attention" for x in local],
                   pad_token_id=0, use_cache=True)
        if a.gemma3:
            full = {"rope_theta": 1000000.0, "rope_type": "default"}
            if a.rope_linear:
                full = {"rope_theta": 1000000.0, "rope_type": "linear", "factor": a.rope_linear}
            cfg.update(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", _sliding_window_pattern=every,
                       attn_logit_softcapping=None, final_logit_softcapping=None, use_bidirectional_attention=False,
                       rope_parameters={"full_attention": full,
                                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}})
        else:
            cfg.update(architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                       attn_logit_softcapping=a.attn_softcap or None, final_logit_softcapping=a.final_softcap or None,
                       rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(a.vocab), f)
    ffn = (f"{a.moe} experts {a.experts} top {a.top_k} of width {a.moe_ffn}"
           f"{', not renormalised' if a.no_renorm else ''}" if a.moe else f"ffn {a.ffn}")
    if gemma:
        ffn += (f", {cfg['model_type']} layers {''.join('L' if x else 'G' for x in local)} window {a.window}"
                f" query_pre_attn_scalar {cfg['query_pre_attn_scalar']}")
    print(f"wrote {a.out}: hidden {H}, {a.layers} layers, {a.heads}/{a.kv_heads} heads of {hd}, {ffn}, "
          f"vocab {a.vocab}, {a.dtype}{', tied' if a.tie else ''}")


if __name__ == "__main__":
    main()
