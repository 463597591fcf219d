#!/usr/bin/env python3
"""The PEFT LoRA adapter reader (engine/model/lora_adapter.c) on adapters
written by PEFT itself: a tiny random Llama base is written by transformers
(save_pretrained), then three adapters with peft (LoraConfig,
get_peft_model, lora_B randomized since PEFT zero-inits it,
save_pretrained):

  r4:  rank 4, alpha 8, q_proj v_proj, stored bf16
  r8:  rank 8, alpha 16, all seven projections, layers 0 and 2 only
  r16: rank 16, alpha 32, rsLoRA (scale alpha / sqrt(r) = 8), target_modules
       the regular expression ".*mlp\\.(gate|up|down)_proj"

build/tests/tools/lora_info loads each against the base's config.json; its
JSON must give PEFT's rank and scaling, the targeted modules, every
(layer, module) pair the file holds with the shapes and element sums of
the file's tensors; and two of its pairs through the CPU backend's
lora_apply (lora_info --apply) must match scale * x . A^T . B^T computed in
double from the file (bound 1e-5 of the largest value). Then broken copies
must fail with exit 1 and one stderr line naming the file at fault and the
reason.

Without peft (or with LORA_TEST_NO_PEFT=1) the same files are written by
hand (adapter_config.json as PEFT writes it, tensors via safetensors) and
the run says so. Skipped (exit 77) without torch/transformers/safetensors.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFO = os.path.join(ROOT, "build/tests/tools/lora_info")

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"SKIP: torch/transformers/safetensors not importable ({e})")
    sys.exit(77)
try:
    if os.environ.get("LORA_TEST_NO_PEFT") == "1":
        raise ImportError("LORA_TEST_NO_PEFT=1")
    import peft
except ImportError as e:
    peft = None
    print(f"note: peft not importable ({e}): adapters written by hand")

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PARENT = {m: ("self_attn" if m in MODULES[:4] else "mlp") for m in MODULES}
BASE = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=311, max_position_embeddings=512)
# name: (r, alpha, target_modules as given, the modules they mean, layers, rslora, dtype)
ADAPTERS = {
    "r4": (4, 8, ["q_proj", "v_proj"], ["q_proj", "v_proj"], [0, 1, 2], False, torch.bfloat16),
    "r8": (8, 16, list(MODULES), list(MODULES), [0, 2], False, torch.float32),
    "r16": (16, 32, r".*mlp\.(gate|up|down)_proj", ["gate_proj", "up_proj", "down_proj"], [0, 1, 2], True,
            torch.float32),
}


def shapes(module):
    """(out, in) of the base model's projection."""
    h, f, q, kv = 64, 160, 64, 32  # head_dim 16: 4 heads, 2 KV heads
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}[module]


def tname(layer, module, ab):
    return f"base_model.model.model.layers.{layer}.{PARENT[module]}.{module}.lora_{ab}.weight"


def write_base(path):
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**BASE), dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)


def write_with_peft(base, path, spec):
    r, alpha, targets, _, layers, rslora, dtype = spec
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora, lora_dropout=0.0,
                          layers_to_transform=None if layers == [0, 1, 2] else layers)
    pm = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero: the adapter would do nothing
                p.normal_(0.0, 0.1)
    pm.to(dtype).save_pretrained(path)
    return pm.base_model.model.model.layers[layers[0]]


def write_by_hand(path, spec):
    r, alpha, targets, modules, layers, rslora, dtype = spec
    os.makedirs(path, exist_ok=True)
    config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets,
              "use_rslora": rslora, "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
              "rank_pattern": {}, "alpha_pattern": {}, "base_model_name_or_path": None, "lora_dropout": 0.0,
              "layers_to_transform": None if layers == [0, 1, 2] else layers, "use_dora": False}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tensors = {}
    for l in layers:
        for m in modules:
            out, inp = shapes(m)
            tensors[tname(l, m, "A")] = (0.1 * torch.randn(r, inp)).to(dtype)
            tensors[tname(l, m, "B")] = (0.1 * torch.randn(out, r)).to(dtype)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))


def lora_info(adapter, config, *extra):
    return subprocess.run([INFO, adapter, config, *extra], capture_output=True, text=True, timeout=60)


def check_good(name, path, config, spec, peft_layer):
    r, alpha, _, modules, layers, rslora, dtype = spec
    p = lora_info(path, config)
    assert p.returncode == 0, f"{name}: {p.stderr}"
    j = json.loads(p.stdout)
    scale = alpha / (math.sqrt(r) if rslora else r)
    if peft_layer is not None:  # PEFT's own scaling of a targeted module
        sub = getattr(peft_layer, PARENT[modules[0]])
        assert abs(getattr(sub, modules[0]).scaling["default"] - scale) < 1e-6
    assert j["rank"] == r and abs(j["scale"] - scale) < 1e-6 and j["rslora"] == rslora, j
    assert j["target_modules"] == modules, j["target_modules"]
    assert j["n_pairs"] == len(layers) * len(modules), j["n_pairs"]
    assert [e["layer"] for e in j["layers"]] == layers, j["layers"]
    tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
    worst = 0.0
    for e in j["layers"]:
        assert sorted(k for k in e if k != "layer") == sorted(modules), e
        for m in modules:
            out, inp = shapes(m)
            got = e[m]
            assert got["a"] == [r, inp] and got["b"] == [out, r], (m, got)
            assert got["dtype"] == {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype], got["dtype"]
            for ab in "ab":
                t = tensors[tname(e["layer"], m, ab.upper())].double()
                want = t.sum().item()
                err = abs(got[f"{ab}_sum"] - want) / max(t.abs().sum().item(), 1e-30)
                worst = max(worst, err)
    assert worst < 1e-6, f"{name}: element sums off by {worst:.2e} of the sum of magnitudes"
    apply_err = max(check_apply(path, config, tensors, layers[-1], m, scale) for m in (modules[0], modules[-1]))
    print(f"ok {name}: rank {r}, scale {j['scale']:g}, {j['n_pairs']} pairs over layers {layers}, "
          f"sums within {worst:.1e}, lora_apply within {apply_err:.1e} of the double product")


def check_apply(path, config, tensors, layer, module, scale, rows=5):
    """The reader's pair through the CPU op against scale * x . A^T . B^T in double
    over the file's tensors; row 1 (no adapter) must stay zero. f32 rounding
    (<= 160-term shrink, <= 16-term expand): ~1e-7; bound 1e-5 of the largest."""
    p = lora_info(path, config, "--apply", str(layer), module, str(rows))
    assert p.returncode == 0, p.stderr
    got = torch.tensor(json.loads(p.stdout)["delta"], dtype=torch.float64)
    a = tensors[tname(layer, module, "A")].double()
    b = tensors[tname(layer, module, "B")].double()
    q = torch.arange(rows * a.shape[1], dtype=torch.float32)
    x = torch.sin(0.37 * q + 0.1).reshape(rows, -1).double()
    want = scale * (x @ a.T) @ b.T
    want[1] = 0.0
    assert torch.all(got[1] == 0), "a row without an adapter was changed"
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"{path} layer {layer} {module}: lora_apply off by {err:.2e}"
    return err


def expect_error(what, adapter, config, file_named, reason, *extra):
    p = lora_info(adapter, config, *extra)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode != 0, f"{what}: exit 0"
    assert len(lines) == 1, f"{what}: stderr is not one line: {p.stderr!r}"
    assert file_named in lines[0] and reason in lines[0], f"{what}: {lines[0]!r}"
    print(f"ok refused ({what}): {lines[0].replace(adapter, '<dir>')}")


def broken_copy(src, tmp, name):
    dst = os.path.join(tmp, name)
    shutil.copytree(src, dst)
    return dst


def edit_config(path, **kv):
    f = os.path.join(path, "adapter_config.json")
    c = json.load(open(f))
    c.update(kv)
    json.dump(c, open(f, "w"))


def edit_tensors(path, fn):
    f = os.path.join(path, "adapter_model.safetensors")
    t = load_file(f)
    fn(t)
    save_file(t, f)


def check_bad(tmp, good, config):
    cfg_f, st_f = "adapter_config.json", "adapter_model.safetensors"
    d = broken_copy(good["r8"], tmp, "no_config")
    os.remove(os.path.join(d, cfg_f))
    expect_error("missing adapter_config.json", d, config, os.path.join(d, cfg_f), "no such file")
    d = broken_copy(good["r8"], tmp, "bad_json")
    open(os.path.join(d, cfg_f), "w").write('{"r": 8, "lora_alpha": ')
    expect_error("bad JSON", d, config, os.path.join(d, cfg_f), "not valid JSON")
    expect_error("rank over the max", good["r16"], config, os.path.join(good["r16"], cfg_f),
                 "r = 16 is above the largest rank allowed (8)", "--max-rank", "8")
    d = broken_copy(good["r8"], tmp, "wrong_shape")
    edit_tensors(d, lambda t: t.update({tname(2, "o_proj", "A"): t[tname(2, "o_proj", "A")][:, :60].clone()}))
    expect_error("a tensor of the wrong shape", d, config, os.path.join(d, st_f),
                 f"tensor '{tname(2, 'o_proj', 'A')}' is 8x60, expected 8x64")
    d = broken_copy(good["r4"], tmp, "unknown_module")
    edit_config(d, target_modules=["q_proj", "v_proj", "lm_head"])
    expect_error("an unknown target module", d, config, os.path.join(d, cfg_f), "target module 'lm_head'")
    d = broken_copy(good["r8"], tmp, "no_lora_b")
    edit_tensors(d, lambda t: t.pop(tname(0, "down_proj", "B")))
    expect_error("a missing lora_B", d, config, os.path.join(d, st_f),
                 f"tensor '{tname(0, 'down_proj', 'B')}' is missing")
    d = broken_copy(good["r8"], tmp, "no_alpha")
    c = json.load(open(os.path.join(d, cfg_f)))
    del c["lora_alpha"]
    json.dump(c, open(os.path.join(d, cfg_f), "w"))
    expect_error("no lora_alpha", d, config, os.path.join(d, cfg_f), "lora_alpha is missing")
    for key, val, reason in [("rank_pattern", {"q_proj": 4}, "rank_pattern"), ("use_dora", True, "DoRA"),
                             ("fan_in_fan_out", True, "fan_in_fan_out"), ("bias", "all", "bias must be"),
                             ("modules_to_save", ["lm_head"], "modules_to_save"),
                             ("peft_type", "IA3", "only LORA")]:
        d = broken_copy(good["r4"], tmp, f"refused_{key}")
        edit_config(d, **{key: val})
        expect_error(key, d, config, os.path.join(d, cfg_f), reason)
    d = broken_copy(good["r4"], tmp, "layer_out_of_range")
    edit_tensors(d, lambda t: t.update({tname(3, "q_proj", "A"): t[tname(0, "q_proj", "A")].clone(),
                                        tname(3, "q_proj", "B"): t[tname(0, "q_proj", "B")].clone()}))
    expect_error("a layer the model lacks", d, config, os.path.join(d, st_f), "is for layer 3, the model has 3")
    d = broken_copy(good["r4"], tmp, "untargeted")
    edit_tensors(d, lambda t: t.update({tname(0, "k_proj", "A"): t[tname(0, "q_proj", "A")].clone()}))
    expect_error("a tensor target_modules does not name", d, config, os.path.join(d, st_f),
                 "k_proj, which target_modules does not name")


def main():
    if not os.access(INFO, os.X_OK):
        print(f"FAIL: {INFO} is not built (ninja build/tests/tools/lora_info)")
        return 1
    tmp = tempfile.mkdtemp(prefix="paged-lora-")
    try:
        base = os.path.join(tmp, "base")
        write_base(base)
        config = os.path.join(base, "config.json")
        good = {}
        torch.manual_seed(7)
        for name, spec in ADAPTERS.items():
            good[name] = os.path.join(tmp, name)
            layer = write_with_peft(base, good[name], spec) if peft else write_by_hand(good[name], spec)
            check_good(name, good[name], config if name != "r8" else base, spec, layer)
        check_bad(tmp, good, config)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"all lora adapter checks passed ({'peft ' + peft.__version__ if peft else 'hand-written files'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
