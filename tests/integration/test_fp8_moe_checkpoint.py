#!/usr/bin/env python3
"""FP8 mixture-of-experts checkpoints from tests/gpu/make_fp8_model.py, run
by the real binary on the CPU.

The script writes tiny random FP8 checkpoints of a Qwen3-MoE config (8
experts, top 2, q/k norms, mlp_only_layers [1]: a dense FP8 MLP between the
MoE layers; --shard-mb small, so it is sharded with a
model.safetensors.index.json) and of a Mixtral config (8 experts, top 2,
one model.safetensors). Checked:
  - the layout: every expert's gate / up / down (and every attention and
    dense linear) is F8_E4M3 with a `weight_scale` f32 [rows, 1] equal to
    max|row| / 448 (so every stored row's largest |value| is 448); the router,
    norms (Qwen3's q_norm / k_norm too), embedding and LM head are bf16;
    config.json says quant_method "fp8";
  - `paged generate --device cpu --matmul-mode exact` loads it: the start-up
    log names the FP8 layers ("safetensors fp8_e4m3") and the experts with
    their type (the MoE line's "fp8_e4m3"), and
    greedy output has the requested token count for every prompt;
  - the reference: the same weights dequantized (e4m3 x scale, exactly
    representable in float32) written as a float32 checkpoint. Its greedy
    ids equal the FP8 checkpoint's, and build/tests/tools/dump_logits
    (exact numerics) gives next-token logits within 1e-4 relative with the
    same argmax (the FP8 product on the CPU is weight-only: the e4m3 row
    times its scale, as test_quantization.py checks for dense layers).
Skipped (exit 77) without torch or safetensors.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGED = os.path.join(ROOT, "build/paged")
DUMP = os.path.join(ROOT, "build/tests/tools/dump_logits")
SCRIPT = os.path.join(ROOT, "tests/gpu/make_fp8_model.py")
TOL = 1e-4
MAX_TOKENS = 8

try:
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"SKIP: torch/safetensors not importable ({e})")
    sys.exit(77)

COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
              max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=2)
VARIANTS = {
    # arch as paged names it, the config, the script's flags, shards expected (> 1 or 1)
    "qwen3_moe": ("qwen3moe", dict(COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                                   num_hidden_layers=3, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                   num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                                   mlp_only_layers=[1], rope_theta=1000000.0, attention_bias=False,
                                   use_sliding_window=False, sliding_window=None),
                  ["--shard-mb", "0.05"], True),
    "mixtral": ("mixtral", dict(COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral",
                                num_hidden_layers=2, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2,
                                rope_theta=1000000.0, sliding_window=None),
                [], False),
}
PROMPTS = [[1, 17, 5, 230, 99, 42, 7], list(range(3, 3 + 40, 3))]


def load_all(path):
    """Every tensor of a checkpoint directory (sharded or not) and its shard count."""
    idx = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return load_file(os.path.join(path, "model.safetensors")), 1
    files = sorted(set(json.load(open(idx))["weight_map"].values()))
    t = {}
    for f in files:
        t.update(load_file(os.path.join(path, f)))
    return t, len(files)


def check_layout(name, cfg, t):
    """The FP8 / bf16 split the brief of make_fp8_model.py promises; a list of problems."""
    bad = []
    moe = "block_sparse_moe." if name == "mixtral" else "mlp."
    E = cfg.get("num_local_experts", cfg.get("num_experts"))
    parts = ("w1", "w3", "w2") if name == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    dense = set(cfg.get("mlp_only_layers") or [])
    n_exp = 0
    for l in range(L):
        p = f"model.layers.{l}."
        lin = [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        if l in dense:
            lin += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        else:
            lin += [f"{p}{moe}experts.{e}.{x}.weight" for e in range(E) for x in parts]
            n_exp += E * 3
            r = t.get(p + moe + "gate.weight")
            if r is None or r.dtype != torch.bfloat16 or tuple(r.shape) != (E, H):
                bad.append(f"router of layer {l}: {None if r is None else (r.dtype, tuple(r.shape))}")
        vec = [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if name == "qwen3_moe":
            vec += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        for k in lin:
            w, s = t.get(k), t.get(k + "_scale")
            if w is None or s is None or w.dtype != torch.float8_e4m3fn or s.dtype != torch.float32 or \
                    tuple(s.shape) != (w.shape[0], 1) or (w.float().abs().amax(dim=1) != 448.0).any():
                bad.append(f"{k}: not F8_E4M3 with f32 [rows, 1] row scales")
        for k in vec:
            if k not in t or t[k].dtype != torch.bfloat16:
                bad.append(f"{k}: not bf16")
    for k in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        if k not in t or t[k].dtype != torch.bfloat16:
            bad.append(f"{k}: not bf16")
    n8 = sum(v.dtype == torch.float8_e4m3fn for v in t.values())
    print(f"  {name}: {len(t)} tensors, {n8} in F8_E4M3 ({n_exp} of them experts')")
    return bad


def dequantized(src, dst):
    """The checkpoint's weights as float32, e4m3 x scale, in dst (one file, no quantization_config)."""
    t, _ = load_all(src)
    ref = {}
    for k, v in t.items():
        if k.endswith("_scale"):
            continue
        ref[k] = v.float() * t[k + "_scale"] if v.dtype == torch.float8_e4m3fn else v.float()
    os.makedirs(dst)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(dst, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    del cfg["quantization_config"]
    cfg["torch_dtype"] = "float32"
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    shutil.copy(os.path.join(src, "tokenizer.json"), dst)


def generate(model, tmp):
    path = os.path.join(tmp, "prompts.jsonl")
    with open(path, "w") as f:
        for ids in PROMPTS:
            f.write(json.dumps({"prompt_ids": ids, "max_tokens": MAX_TOKENS, "temperature": 0,
                                "ignore_eos": True}) + "\n")
    p = subprocess.run([PAGED, "generate", "--device", "cpu", "--model", model, "--matmul-mode", "exact",
                        "--threads", "2", "--kv-cache-memory", "16M", "--prompts-file", path],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return rows, p.stderr


def logits(model, ids):
    p = subprocess.run([DUMP, model, "--mode", "exact", "--threads", "2", ",".join(map(str, ids))],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return np.array(json.loads(p.stdout)["logits"], dtype=np.float64)


def main():
    for exe in (PAGED, DUMP):
        if not os.path.exists(exe):
            print(f"FAIL: {exe} is not built (ninja build/paged build/tests/tools/dump_logits)")
            return 1
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (arch, cfg, flags, sharded)) in enumerate(VARIANTS.items()):
            cfg_path = os.path.join(tmp, name + ".json")
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            fp8, ref = os.path.join(tmp, name + "-fp8"), os.path.join(tmp, name + "-ref")
            p = subprocess.run([sys.executable, SCRIPT, cfg_path, fp8, "--seed", str(11 + i), *flags],
                               capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                print(f"{name}: make_fp8_model.py failed:\n{p.stderr[-3000:]}")
                failed.append((name, "script"))
                continue
            print(p.stdout.strip())
            t, n_files = load_all(fp8)
            qc = json.load(open(os.path.join(fp8, "config.json"))).get("quantization_config", {})
            bad = check_layout(name, cfg, t)
            if qc.get("quant_method") != "fp8":
                bad.append(f"quantization_config {qc}")
            if (n_files > 1) != sharded:
                bad.append(f"{n_files} safetensors files")
            for b in bad[:10]:
                print(f"  layout: {b}")
            if bad:
                failed.append((name, "layout"))
            dequantized(fp8, ref)

            rows, log = generate(fp8, tmp)
            # The experts' own type is named on the MoE line (engine/setup.c).
            want = [f"({arch}, safetensors fp8_e4m3)", "mixture of experts: 8 experts",
                    "2 used per token, fp8_e4m3;"]
            missing = [w for w in want if w not in log]
            if missing:
                print(f"  log does not say {missing}:\n{log[-2000:]}")
                failed.append((name, "log"))
            counts = [(r["completion_tokens"], len(r["output_ids"])) for r in rows]
            if len(rows) != len(PROMPTS) or any(c != (MAX_TOKENS, MAX_TOKENS) for c in counts):
                print(f"  token counts {counts}, want {MAX_TOKENS} each of {len(PROMPTS)} prompts")
                failed.append((name, "count"))
            ref_rows, _ = generate(ref, tmp)
            got_ids, ref_ids = [r["output_ids"] for r in rows], [r["output_ids"] for r in ref_rows]
            print(f"  greedy ids {'equal' if got_ids == ref_ids else 'DIFFER'} to the dequantized reference's: "
                  f"{got_ids}")
            if got_ids != ref_ids:
                print(f"  reference: {ref_ids}")
                failed.append((name, "greedy ids"))
            for ids in PROMPTS:
                a, b = logits(fp8, ids), logits(ref, ids)
                err = float(np.linalg.norm(a - b) / np.linalg.norm(b))
                same = int(np.argmax(a)) == int(np.argmax(b))
                print(f"  {len(ids):2d}-token prompt: logits rel err {err:.2e} vs the reference, argmax "
                      f"{'equal' if same else 'DIFFERS'}")
                if not (err < TOL and same):
                    failed.append((name, "logits", len(ids), err))
    if failed:
        print(f"FAIL: {failed}")
        return 1
    print("ok: make_fp8_model.py's Qwen3-MoE (sharded) and Mixtral FP8 checkpoints load with FP8 experts and bf16 "
          "routers, and match their dequantized float32 references")
    return 0


if __name__ == "__main__":
    sys.exit(main())
