#!/usr/bin/env python3
"""fp8 KV cache scales end to end on the CPU (engine/runner/runner_kv_scales.c).

A small random Llama checkpoint (f32 safetensors, numpy; K and V of order
1) is served by the real `paged serve` on a real socket, and vLLM's
`prompt_logprobs` over a 60-token id prompt measure each cache against an
f32 cache (mean |d logprob| of the prompt's own tokens):
  - fp8 with the checkpoint's per-layer `self_attn.k_scale` / `v_scale`
    (1/64: the values land in e4m3's normal range): the log says the
    scales come from the checkpoint, and the error is small;
  - the same file with scales of 1000 (every value of K and V then falls
    below e4m3's smallest subnormal and is stored as 0): the error is many
    times larger, so the checkpoint's scales are what the cache applies;
  - fp8 calibrated at start-up (the file without scales) and fp8 at scale
    1.0 (--kv-cache-scales one): both small on this model (no outliers),
    each logged as such.
Every server ends with no KV block in use and exits 0.
Bad checkpoints are one-line errors naming the tensor: a layer without
v_scale, a negative scale, a scale of two values.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

ROOT = su.ROOT
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
try:
    import numpy as np
    from make_random_model import tokenizer_json
    from safetensors_write import write_safetensors
except ImportError as e:
    su.skip(f"numpy not importable ({e})")

PAGED = su.binary()
H, L, NH, NKV, FFN, V = 128, 2, 4, 2, 256, 300
HD = H // NH
IDS = [(i * 37 + 11) % (V - 1) + 1 for i in range(60)]


def tensors(rng):
    lin = lambda r, c: rng.standard_normal((r, c), dtype=np.float32) / np.sqrt(c)
    t = [("model.embed_tokens.weight", rng.standard_normal((V, H), dtype=np.float32))]
    for layer in range(L):
        p = f"model.layers.{layer}."
        t += [(p + "input_layernorm.weight", np.ones(H, np.float32)),
              (p + "post_attention_layernorm.weight", np.ones(H, np.float32)),
              (p + "self_attn.q_proj.weight", lin(NH * HD, H)), (p + "self_attn.k_proj.weight", lin(NKV * HD, H)),
              (p + "self_attn.v_proj.weight", lin(NKV * HD, H)), (p + "self_attn.o_proj.weight", lin(H, NH * HD)),
              (p + "mlp.gate_proj.weight", lin(FFN, H)), (p + "mlp.up_proj.weight", lin(FFN, H)),
              (p + "mlp.down_proj.weight", lin(H, FFN))]
    t += [("model.norm.weight", np.ones(H, np.float32)),
          ("lm_head.weight", 3.0 * rng.standard_normal((V, H), dtype=np.float32) / np.sqrt(H))]
    return t


def write_model(path, scales=None, skip=None, shape=(1,)):
    """scales: (k, v) for every layer, or None; skip: a name left out."""
    os.makedirs(path, exist_ok=True)
    t = tensors(np.random.default_rng(7))
    if scales is not None:
        for layer in range(L):
            for kind, val in zip(("k_scale", "v_scale"), scales):
                name = f"model.layers.{layer}.self_attn.{kind}"
                if name != skip:
                    t.append((name, np.full(shape, val, np.float32)))
    write_safetensors(os.path.join(path, "model.safetensors"), t, "f32")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
           "intermediate_size": FFN, "num_hidden_layers": L, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 3,
           "torch_dtype": "float32"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(V), f)
    return path


def serve(model, *flags):
    """Prompt logprobs of IDS through a real server; (values, log)."""
    port = su.free_port()
    logf = tempfile.NamedTemporaryFile(prefix="paged-kvs-", suffix=".log", delete=False)
    cmd = [PAGED, "serve", "--model", model, "--device", "cpu", "--matmul-mode", "exact", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "256", "--kv-cache-memory", "16M", *flags]
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.time() + 60
        while True:
            assert p.poll() is None, f"paged serve exited {p.returncode}: {open(logf.name).read()[-3000:]}"
            try:
                if su.request(port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "not healthy in 60 s"
            time.sleep(0.1)
        st, _, body = su.request(port, "POST", "/v1/completions",
                                 {"prompt": IDS, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1})
        assert st == 200, body[:500]
        plp = json.loads(body)["choices"][0]["prompt_logprobs"]
        vals = [plp[i][str(IDS[i])]["logprob"] for i in range(1, len(IDS))]
        st, _, m = su.request(port, "GET", "/metrics")
        used = re.search(rb"^paged:kv_cache_usage_perc\S* (\S+)$", m, re.M)
        assert used and float(used.group(1)) == 0.0, "KV blocks still in use after the request"
    finally:
        p.terminate()
        rc = p.wait(timeout=60)
    log = open(logf.name, errors="replace").read()
    os.unlink(logf.name)
    assert rc == 0, f"exit code {rc}: {log[-3000:]}"
    return vals, log


def err(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def refused(model, want):
    prompts = os.path.join(os.path.dirname(model), "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write('{"prompt": "a", "max_tokens": 1}\n')
    p = subprocess.run([PAGED, "generate", "--model", model, "--device", "cpu", "--kv-cache-dtype", "fp8",
                        "--prompts-file", prompts], capture_output=True, text=True, timeout=120, cwd=ROOT)
    ok = p.returncode != 0 and all(w in p.stderr for w in want)
    print(f"  {'refused' if ok else 'NOT refused as expected'} ({p.returncode}): "
          f"{(p.stderr.strip().splitlines() or [''])[-1][:200]}")
    return ok


def main():
    tmp = tempfile.mkdtemp(prefix="paged-kvs-")
    fails = 0
    try:
        plain = write_model(os.path.join(tmp, "plain"))
        good = write_model(os.path.join(tmp, "good"), (1 / 64, 1 / 64))
        huge = write_model(os.path.join(tmp, "huge"), (1000.0, 1000.0))
        ref, _ = serve(plain)  # the default CPU cache of the exact numerics: f32
        runs = {
            "checkpoint 1/64": serve(good, "--kv-cache-dtype", "fp8"),
            "checkpoint 1000": serve(huge, "--kv-cache-dtype", "fp8"),
            "calibrated": serve(plain, "--kv-cache-dtype", "fp8"),
            "scale 1.0": serve(plain, "--kv-cache-dtype", "fp8", "--kv-cache-scales", "one"),
        }
        e = {k: err(v[0], ref) for k, v in runs.items()}
        for k, v in e.items():
            print(f"  fp8 KV, {k:16s}: mean |d logprob| vs f32 over {len(ref)} prompt tokens {v:.5f}")
        logs = {k: v[1] for k, v in runs.items()}
        checks = [
            ("the checkpoint's scales are logged", "the checkpoint's k_scale / v_scale" in logs["checkpoint 1/64"]),
            ("calibration is logged", "calibrated at start-up" in logs["calibrated"]),
            ("scale 1.0 is logged", "scale 1.0 (--kv-cache-scales one)" in logs["scale 1.0"]),
            ("checkpoint scales 1/64: small error", e["checkpoint 1/64"] < 0.05),
            ("checkpoint scales 1000: the cache applies them (10x the error)",
             e["checkpoint 1000"] > 10 * max(e["checkpoint 1/64"], 1e-3)),
            ("calibrated: small error", e["calibrated"] < 0.05),
            ("scale 1.0: small error on this model", e["scale 1.0"] < 0.05),
        ]
        for name, ok in checks:
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
            fails += not ok
        print("bad checkpoints:")
        fails += not refused(write_model(os.path.join(tmp, "miss"), (0.1, 0.1), skip="model.layers.1.self_attn.v_scale"),
                             ["model.layers.1.self_attn.v_scale", "is missing"])
        fails += not refused(write_model(os.path.join(tmp, "neg"), (0.1, -0.5)),
                             ["model.layers.0.self_attn.v_scale", "positive"])
        fails += not refused(write_model(os.path.join(tmp, "two"), (0.1, 0.1), shape=(2,)),
                             ["model.layers.0.self_attn.k_scale", "2 values"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if fails == 0 else f"FAIL: {fails} check(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
