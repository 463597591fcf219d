#!/usr/bin/env python3
"""Writes random PEFT LoRA adapters for a Llama model directory (as
tests/gpu/make_random_model.py writes one), with numpy only, so the GPU
machine can make them (torch and peft do not travel there).

  tests/gpu/make_lora_adapters.py MODEL_DIR OUT_DIR [--seed 1]

Writes three adapters, OUT_DIR/r8, OUT_DIR/r16 and OUT_DIR/r4, each an
adapter_config.json and an adapter_model.safetensors as PEFT's
save_pretrained writes them (the keys of tests/integration/
test_lora_adapter.py's write_by_hand; docs/lora.md "Accepted"), and prints
their paths comma-separated on stdout (test_cuda_runner's --lora):

  r8:  rank 8, alpha 16, all seven projections, every layer, bf16
  r16: rank 16, alpha 16, rsLoRA (scale alpha / sqrt(r) = 4), o_proj,
       gate_proj and up_proj, layers 0 and 2 only (layers_to_transform;
       every layer of a model with fewer than 3), f32 (the CUDA backend's
       weight_upload rounds it to bf16, the CPU keeps f32)
  r4:  rank 4, alpha 8, target_modules the regular expression
       ".*\\.(q_proj|v_proj|down_proj)", bf16

  tests/gpu/make_lora_adapters.py MODEL_DIR|CONFIG.json OUT_DIR --many N [--rank 16]

writes N adapters instead, OUT_DIR/a0 ... a{N-1}, each of rank R (alpha R,
all seven projections, every layer, bf16: issue 33's served figures), the
same weights hard-linked N times (they load into separate slots all the
same; one set of random weights keeps 64 adapters of llama3-8b-shape to
one write of 84 MB), and prints "a0=PATH a1=PATH ..." (--lora-modules).
A config file (tests/gpu/llama3-8b-shape.json) stands for a model
directory: the adapters need only the base's shapes.

PEFT starts lora_B at zero (an adapter that does nothing); here A is
N(0, 1/in) and B N(0, g^2 / r) with g chosen so scale * g = 0.5: for rows
of unit size (the normed rows q/k/v and gate/up read) an adapter adds
about half a unit to each output, so the adapters move the logits well
beyond the bf16 bound and a wrong slot, row or scale cannot pass.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools'))
from safetensors_write import write_safetensors  # noqa: E402

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PARENT = {m: ("self_attn" if m in MODULES[:4] else "mlp") for m in MODULES}

# name: (r, alpha, target_modules as written, the modules they mean, layers (None: all), rslora, dtype)
ADAPTERS = {
    "r8": (8, 16, list(MODULES), list(MODULES), None, False, "bf16"),
    "r16": (16, 16, ["o_proj", "gate_proj", "up_proj"], ["o_proj", "gate_proj", "up_proj"], [0, 2], True, "f32"),
    "r4": (4, 8, r".*\.(q_proj|v_proj|down_proj)", ["q_proj", "v_proj", "down_proj"], None, False, "bf16"),
}


def shapes(cfg):
    """(out, in) of each projection of the base model."""
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or h // nh
    q, kv = nh * hd, nkv * hd
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}


def write_adapter(path, cfg, spec, rng):
    r, alpha, targets, modules, layers, rslora, dtype = spec
    n_layers = cfg["num_hidden_layers"]
    if layers is not None:
        layers = [l for l in layers if l < n_layers]
        if len(layers) < 2:
            layers = None
    os.makedirs(path, exist_ok=True)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
              "target_modules": targets, "use_rslora": rslora, "bias": "none", "fan_in_fan_out": False,
              "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
              "base_model_name_or_path": os.path.abspath(cfg["_dir"]), "lora_dropout": 0.0,
              "layers_to_transform": layers, "use_dora": False, "init_lora_weights": True}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    scale = alpha / math.sqrt(r) if rslora else alpha / r
    g = 0.5 / scale
    sh = shapes(cfg)
    tensors = []
    for l in (layers if layers is not None else range(n_layers)):
        for m in modules:
            out, inp = sh[m]
            name = f"base_model.model.model.layers.{l}.{PARENT[m]}.{m}.lora_"
            tensors.append((name + "A.weight", rng.normal(0.0, 1.0 / math.sqrt(inp), (r, inp)).astype(np.float32)))
            tensors.append((name + "B.weight", rng.normal(0.0, g / math.sqrt(r), (out, r)).astype(np.float32)))
    write_safetensors(os.path.join(path, "adapter_model.safetensors"), tensors, dtype)
    return scale


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--many", type=int, default=0, help="N adapters of --rank on every projection")
    ap.add_argument("--rank", type=int, default=16)
    a = ap.parse_args()
    config_path = a.model_dir if os.path.isfile(a.model_dir) else os.path.join(a.model_dir, "config.json")
    with open(config_path) as f:
        cfg = json.load(f)
    if cfg.get("model_type", "llama") not in ("llama", "mistral", "qwen2", "qwen3"):
        sys.exit(f"{a.model_dir}: model_type {cfg.get('model_type')}: LoRA is Llama-family only (docs/lora.md)")
    cfg["_dir"] = os.path.dirname(os.path.abspath(config_path))
    rng = np.random.default_rng(a.seed)
    if a.many > 0:
        if a.rank < 1 or a.rank > 64:
            sys.exit(f"--rank {a.rank}: 1 to 64 (the CUDA op's ranks)")
        spec = (a.rank, a.rank, list(MODULES), list(MODULES), None, False, "bf16")
        first = os.path.join(a.out_dir, "a0")
        write_adapter(first, cfg, spec, rng)
        pairs = [f"a0={first}"]
        for i in range(1, a.many):
            p = os.path.join(a.out_dir, f"a{i}")
            os.makedirs(p, exist_ok=True)
            for fn in ("adapter_config.json", "adapter_model.safetensors"):
                if os.path.exists(os.path.join(p, fn)):
                    os.remove(os.path.join(p, fn))
                os.link(os.path.join(first, fn), os.path.join(p, fn))
            pairs.append(f"a{i}={p}")
        print(f"{a.many} adapters of rank {a.rank} on {', '.join(MODULES)}: {a.out_dir}", file=sys.stderr)
        print(" ".join(pairs))
        return
    paths = []
    for name, spec in ADAPTERS.items():
        p = os.path.join(a.out_dir, name)
        scale = write_adapter(p, cfg, spec, rng)
        print(f"{p}: rank {spec[0]}, scale {scale:g}, {', '.join(spec[3])}, {spec[6]}", file=sys.stderr)
        paths.append(p)
    print(",".join(paths))


if __name__ == "__main__":
    main()
