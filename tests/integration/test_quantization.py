#!/usr/bin/env python3
"""Quantized weights end to end on the CPU (docs/quantization.md).

A tiny random Llama checkpoint is written by transformers (float32); from
it, with numpy and torch, an FP8 checkpoint in the Hugging Face layout
(`*.weight` F8_E4M3 + `*.weight_scale` f32 [rows, 1], config.json's
quantization_config quant_method "fp8") and the dequantized references:
the FP8 values times their scales, and paged's int4 quantizer (AWQ's
round-to-nearest with zero points, groups of 128) applied and undone, each
saved back as float32. The next-token logits (build/tests/tools/dump_logits,
exact numerics) must agree with the reference's within 1e-4 relative:
  - the FP8 checkpoint, as loaded;
  - --quantization fp8 and --quantization int4 on the float32 checkpoint
    (the online quantizers reproduce the numpy ones);
and `paged generate` names the quantization in its log.

AWQ (GEMM) and GPTQ (v1 and v2) int4 checkpoints, groups of 128 and 64,
are written here by a numpy packer of their documented layouts
(engine/model/int4_ckpt.h); each must load (inferred from config.json) to the
logits of its numpy-dequantized float32 reference, within the same 1e-4;
the g64 ones also at --tp 2 (the g128 ones cannot split O's 128 columns
into two groups: a one-line error naming the tensor). Bad inputs: bits 8
and an act-order g_idx are one-line errors naming config.json / the
tensor; a --quantization that contradicts the checkpoint is refused.
Skipped (exit 77) without torch, transformers or safetensors.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMP = os.path.join(ROOT, "build/tests/tools/dump_logits")
PAGED = os.path.join(ROOT, "build/paged")
TOL = 1e-4

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"SKIP: torch/transformers/safetensors not importable ({e})")
    sys.exit(77)

CFG = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=302,  # even: --tp 2
           max_position_embeddings=256, rms_norm_eps=1e-6,
           initializer_range=0.1, rope_theta=10000.0)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IDS = [1, 17, 5, 230, 99, 42, 7, 300, 8, 64, 3]


def fp8_rows(w):
    """Per-row e4m3 as kernels/dtype.h: scale max|w| / 448, q = e4m3(w * (1 / scale))."""
    amax = w.abs().amax(dim=1, keepdim=True)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (w * (1.0 / s)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def int4_rows(w, g=128):
    """paged's int4 (pg_quantize_row_int4) applied and undone, in float32."""
    x = w.numpy().astype(np.float32).reshape(w.shape[0], -1, g)
    mx, mn = x.max(axis=2, keepdims=True), x.min(axis=2, keepdims=True)
    d = np.maximum((mx - mn) / np.float32(15), np.float32(1e-5)).astype(np.float16).astype(np.float32)
    z = np.clip(-np.rint(mn / d), 0, 15)
    q = np.clip(np.rint(x / d) + z, 0, 15)
    return torch.from_numpy(((q - z) * d).astype(np.float32).reshape(w.shape))


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble slot s holds element 8c + AWQ_ORDER[s]


def int4_groups(w, g):
    """Round-to-nearest int4 with zero points per group of g inputs: q, z
    (0..15, z in 1..15 so GPTQ v1's z - 1 is never -1) and f16 scales d,
    each [in / g][out] (q: [in][out]), and the float32 dequantized W."""
    x = w.numpy().astype(np.float32)  # [out][in]
    out, inn = x.shape
    xg = x.reshape(out, inn // g, g)
    mx, mn = xg.max(axis=2, keepdims=True), xg.min(axis=2, keepdims=True)
    d = np.maximum((mx - mn) / np.float32(15), np.float32(1e-5)).astype(np.float16)
    df = d.astype(np.float32)
    z = np.clip(-np.rint(mn / df), 1, 15)
    q = np.clip(np.rint(xg / df) + z, 0, 15)
    deq = ((q - z) * df).astype(np.float32).reshape(out, inn)
    qt = q.reshape(out, inn).T.astype(np.uint32)  # [in][out]
    return qt, z[:, :, 0].T.astype(np.uint32), d[:, :, 0].T.copy(), torch.from_numpy(deq)


def pack8(a, order=range(8)):
    """Packs the last axis (a multiple of 8) of a 0..15 array into int32
    words: nibble slot s of word c = element 8c + order[s]."""
    a = a.reshape(*a.shape[:-1], -1, 8)
    words = np.zeros(a.shape[:-1], dtype=np.uint32)
    for s, e in enumerate(order):
        words |= a[..., e] << np.uint32(4 * s)
    return words.view(np.int32)


def awq_tensors(prefix, w, g):
    qt, z, d, deq = int4_groups(w, g)
    t = {prefix + "qweight": pack8(qt, AWQ_ORDER), prefix + "qzeros": pack8(z, AWQ_ORDER), prefix + "scales": d}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()}, deq


def gptq_tensors(prefix, w, g, v1, act_order=False):
    qt, z, d, deq = int4_groups(w, g)
    inn = qt.shape[0]
    qw = pack8(np.ascontiguousarray(qt.reshape(inn // 8, 8, -1).transpose(0, 2, 1)))[..., 0]  # along the input
    g_idx = np.arange(inn, dtype=np.int32) // g
    if act_order:
        g_idx = np.ascontiguousarray(g_idx[::-1])
    t = {prefix + "qweight": qw, prefix + "qzeros": pack8(z - 1 if v1 else z), prefix + "scales": d,
         prefix + "g_idx": g_idx}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()}, deq


def int4_checkpoint(sd, pack):
    """The model with every layer linear packed by `pack`, and its dequantized reference."""
    q, ref = {}, {}
    for k, v in sd.items():
        if is_linear(k):
            t, deq = pack(k[: -len("weight")], v)
            q.update(t)
            ref[k] = deq
        else:
            q[k] = ref[k] = v
    return q, ref


def fails(path, want, *flags):
    """dump_logits refuses the checkpoint with one line containing every string of `want`."""
    p = subprocess.run([DUMP, path, "--mode", "exact", *flags, "1,2,3"], capture_output=True, text=True, timeout=60)
    err = p.stderr.strip()
    ok = p.returncode != 0 and len(err.splitlines()) == 1 and all(w in err for w in want)
    print(f"  refused: {err}" if ok else f"  not refused as expected (rc {p.returncode}): {err[-500:]}")
    return ok


def is_linear(name):
    return name.endswith(".weight") and any(f".{p}." in name for p in LINEAR)


def write(path, tensors, config, quant_config=None):
    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, "model.safetensors"))
    cfg = dict(config)
    if quant_config:
        cfg["quantization_config"] = quant_config
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def logits(path, *flags):
    p = subprocess.run([DUMP, path, "--mode", "exact", *flags, ",".join(map(str, IDS))], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return np.array(json.loads(p.stdout)["logits"], dtype=np.float64)


def main():
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "f32")
        torch.manual_seed(7)
        model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**CFG), dtype=torch.float32)
        model.save_pretrained(base, safe_serialization=True)
        with open(os.path.join(base, "config.json")) as f:
            config = json.load(f)
        sd = load_file(os.path.join(base, "model.safetensors"))
        fp8, fp8_ref, int4_ref = {}, {}, {}
        for k, v in sd.items():
            fp8[k] = fp8_ref[k] = int4_ref[k] = v
            if is_linear(k):
                q, s = fp8_rows(v)
                fp8[k], fp8[k + "_scale"] = q, s.float()
                fp8[k.replace(".weight", ".input_scale")] = torch.ones(1)  # static scales: ignored
                fp8_ref[k] = q.float() * s
                int4_ref[k] = int4_rows(v)
        write(os.path.join(tmp, "fp8"), fp8, config, {"quant_method": "fp8", "activation_scheme": "dynamic"})
        write(os.path.join(tmp, "fp8_ref"), fp8_ref, config)
        write(os.path.join(tmp, "int4_ref"), int4_ref, config)
        cases = [("fp8 checkpoint", logits(os.path.join(tmp, "fp8")), "fp8_ref"),
                 ("--quantization fp8", logits(base, "--quantization", "fp8"), "fp8_ref"),
                 ("--quantization int4", logits(base, "--quantization", "int4"), "int4_ref")]
        plain = logits(base)
        for name, got, ref_dir in cases:
            ref = logits(os.path.join(tmp, ref_dir))
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            moved = float(np.linalg.norm(got - plain) / np.linalg.norm(plain))
            print(f"{name:22s}: rel err {err:.2e} vs its dequantized reference ({moved:.2e} from float32)")
            if not (err < TOL and moved > 1e-6):  # equal to the reference, and actually quantized
                failed.append(name)

        # AWQ / GPTQ checkpoints against their dequantized references.
        qc_awq = lambda g: {"quant_method": "awq", "bits": 4, "group_size": g, "version": "gemm", "zero_point": True}
        qc_gptq = lambda g, fmt: {"quant_method": "gptq", "bits": 4, "group_size": g, "desc_act": False,
                                  "sym": False, **({"checkpoint_format": fmt} if fmt else {})}
        ckpts = [("awq g128", lambda p, v: awq_tensors(p, v, 128), qc_awq(128)),
                 ("awq g64", lambda p, v: awq_tensors(p, v, 64), qc_awq(64)),
                 ("gptq v1 g128", lambda p, v: gptq_tensors(p, v, 128, True), qc_gptq(128, "gptq")),
                 ("gptq v1 g64 (no checkpoint_format)", lambda p, v: gptq_tensors(p, v, 64, True), qc_gptq(64, None)),
                 ("gptq v2 g64", lambda p, v: gptq_tensors(p, v, 64, False), qc_gptq(64, "gptq_v2"))]
        for i, (name, pack, qc) in enumerate(ckpts):
            q, ref = int4_checkpoint(sd, pack)
            qdir, rdir = os.path.join(tmp, f"int4ckpt{i}"), os.path.join(tmp, f"int4ckpt{i}_ref")
            write(qdir, q, config, qc)
            write(rdir, ref, config)
            ref_logits = logits(rdir)
            runs = [("", ())] + ([(" --tp 2", ("--tp", "2"))] if "g64" in name else [])
            for tag, flags in runs:
                got = logits(qdir, *flags)
                err = float(np.linalg.norm(got - ref_logits) / np.linalg.norm(ref_logits))
                moved = float(np.linalg.norm(got - plain) / np.linalg.norm(plain))
                print(f"{name + tag:37s}: rel err {err:.2e} vs its dequantized reference ({moved:.2e} from float32)")
                if not (err < TOL and moved > 1e-6):
                    failed.append(name + tag)
            if name == "awq g128":
                if not fails(qdir, ["o_proj", "int4_g128", "tensor parallelism"], "--tp", "2"):
                    failed.append("awq g128 --tp 2 refusal")
                if not fails(qdir, ["--quantization gptq", "does not say quant_method \"gptq\"", "awq"], "--quantization", "gptq"):
                    failed.append("--quantization gptq on awq")
                if not fails(qdir, ["--quantization int4", "pre-quantized checkpoint", "awq"], "--quantization", "int4"):
                    failed.append("--quantization int4 on awq")
                explicit = logits(qdir, "--quantization", "awq")
                if not np.array_equal(explicit, logits(qdir)):
                    failed.append("--quantization awq explicit")
        # Bad inputs: bits 8 (config.json), act-order g_idx (the tensor).
        q, _ = int4_checkpoint(sd, lambda p, v: awq_tensors(p, v, 128))
        bad = os.path.join(tmp, "awq_bits8")
        write(bad, q, config, {**qc_awq(128), "bits": 8})
        if not fails(bad, ["config.json", "bits is 8"]):
            failed.append("bits 8")
        # (Reversed, g_idx is plain for a single group: down_proj's 256 inputs are the first with two.)
        q, _ = int4_checkpoint(sd, lambda p, v: gptq_tensors(p, v, 128, True, act_order=True))
        bad = os.path.join(tmp, "gptq_act_order")
        write(bad, q, config, {**qc_gptq(128, "gptq"), "desc_act": True})
        if not fails(bad, ["model.layers.0.mlp.down_proj.g_idx", "act-order"]):
            failed.append("act-order")

        # The start-up log names the format. (The default model: the tiny
        # checkpoint has no tokenizer.) CUDA runs these types as stored;
        # tests/gpu/run_gpu_tests.sh checks them against this CPU twin.
        p = subprocess.run([PAGED, "generate", "--quantization", "fp8", "--prompt", "hi", "--max-tokens", "2",
                            "--temperature", "0"], capture_output=True, text=True, timeout=120, cwd=ROOT)
        log = p.stderr
        if "quantization fp8: per layer Q|K|V fp8_e4m3" not in log:
            print(f"generate log does not name the quantization (rc {p.returncode}):\n{log[-2000:]}")
            failed.append("log")
    if failed:
        print(f"FAIL: {failed}")
        return 1
    print("ok: FP8, AWQ and GPTQ checkpoints, online fp8 and int4 equal their dequantized references; bad "
          "inputs refused; the log names the format")
    return 0


if __name__ == "__main__":
    sys.exit(main())
