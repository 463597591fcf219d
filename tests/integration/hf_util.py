"""What the Hugging Face parity tests share (test_hf_parity.py, test_moe.py,
test_gemma3.py, test_lora.py): a tiny random transformers checkpoint written
by save_pretrained, transformers' next-token logits, paged's from
build/tests/tools/dump_logits in exact mode, and the two distances the tests
compare them by.

Imports torch and transformers at load: a test imports this module inside
its own `try: import torch ... except ImportError` guard, which exits 77
when they are missing. The name does not start with test_, so
tests/run_all.py does not run it.
"""
import json
import os
import subprocess

import numpy as np
import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMP = os.path.join(ROOT, "build/tests/tools/dump_logits")


def make_checkpoint(cfg, path, seed, norm_center=1.0, bias_scale=None):
    """Writes a random float32 model of the transformers config `cfg` to
    `path` (config.json + model.safetensors) and returns it, in eval mode,
    eager attention. The RNG is seeded with `seed` before the model is built.
    Every `*norm.weight` becomes norm_center + 0.3 * N(0, 1) (away from the
    value that makes the norm a no-op: 1 for x * w, 0 for Gemma's
    x * (1 + w)); with bias_scale, every `*.bias` becomes bias_scale * N(0, 1)
    (away from 0), so they matter."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(norm_center + 0.3 * torch.randn_like(p))
            elif bias_scale is not None and name.endswith(".bias"):
                p.copy_(bias_scale * torch.randn_like(p))
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_logits(model, ids):
    """transformers' logits at the last position of the token ids, float64."""
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long))
    return out.logits[0, -1].double().numpy()


def dump(args, *seqs, tp=1, threads=2, ep=False, a2a=False, timeout=300):
    """Runs dump_logits --mode exact on `args` (the model and its flags) for
    the sequences `seqs`, each a list of token ids or an (adapter, ids) pair
    (written ADAPTER:ids); tp / threads None leave --tp / --threads out.
    Returns the CompletedProcess (stdout one JSON line a sequence)."""
    cmd = [DUMP, *args, "--mode", "exact"]
    if tp is not None:
        cmd += ["--tp", str(tp)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if ep:
        cmd += ["--ep"]
    if a2a:
        cmd += ["--a2a"]
    for s in seqs:
        cmd.append(f"{s[0]}:{','.join(map(str, s[1]))}" if isinstance(s, tuple) else ",".join(map(str, s)))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def paged_logits(args, ids, **kw):
    """paged's next-token logits of one sequence (float64) and the arch it
    loaded; kw as dump's. Asserts that dump_logits succeeded."""
    p = dump(args, ids, **kw)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    return j["arch"], np.array(j["logits"], dtype=np.float64)


def rel(a, b):
    """||a - b|| / ||b||: b is the reference."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def max_diff(a, b):
    """max |a - b| / max |b|: the largest difference as a fraction of the
    reference b's largest logit."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def same_argmax(a, b):
    return int(np.argmax(a)) == int(np.argmax(b))


def write_gemma_gguf(hf_dir, out, arch, name):
    """A tiny Gemma 2 or 3 checkpoint (config.json + model.safetensors in
    hf_dir) written as llama.cpp's converter writes it: arch "gemma2" or
    "gemma3", norms stored as 1 + w, Q/K rows as they are, q/k norms where
    the checkpoint has them (Gemma 3), the global layers' RoPE base and
    linear scaling, Gemma 2's soft-caps as metadata."""
    import gguf
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    sd = {k: v.numpy() for k, v in load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    w = gguf.GGUFWriter(out, arch)
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    rp = cfg.get("rope_parameters") or {}
    full = rp.get("full_attention", rp)  # Gemma 3: per layer type; Gemma 2: one
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(full.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    w.add_sliding_window(cfg["sliding_window"])
    if arch == "gemma2":
        w.add_float32("gemma2.attn_logit_softcapping", cfg["attn_logit_softcapping"])
        w.add_float32("gemma2.final_logit_softcapping", cfg["final_logit_softcapping"])
    w.add_vocab_size(cfg["vocab_size"])

    def norm(k):
        return (sd[k] + np.float32(1.0)).astype(np.float32)

    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", norm("model.norm.weight"))
    for l in range(L):
        p = f"model.layers.{l}."
        for g, hf in (("attn_norm", "input_layernorm"), ("attn_q_norm", "self_attn.q_norm"),
                      ("attn_k_norm", "self_attn.k_norm"), ("post_attention_norm", "post_attention_layernorm"),
                      ("ffn_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm")):
            if p + hf + ".weight" in sd:
                w.add_tensor(f"blk.{l}.{g}.weight", norm(p + hf + ".weight"))
        for g, hf in (("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
                      ("attn_output", "self_attn.o_proj"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
                      ("ffn_down", "mlp.down_proj")):
            w.add_tensor(f"blk.{l}.{g}.weight", sd[p + hf + ".weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
