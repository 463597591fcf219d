#!/usr/bin/env python3
"""`paged plan` against the real start-up on the CPU: for several flag sets
the planned weights and workspace equal the bytes `paged serve` reports
(/metrics, per rank) and the KV tokens its start-up line; --json carries the
same numbers; a configuration that cannot fit is refused by serve with the
planner's advice, and following that advice really starts. Then a
llama3-8b-shape dummy config planned for a 141G GPU (bf16 and fp8 KV),
checked for internal consistency; llama3-70b-shape refused on one 139.8 GiB
GPU with -tp 2 as the advice and split evenly at -tp 4 and 8; and bad flags
(exit 2)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

ROOT = su.ROOT
PAGED = os.environ.get("PAGED_BIN", os.path.join(ROOT, "build/paged"))
MODEL = su.MODEL
SHAPE = os.path.join(ROOT, "tests/gpu/llama3-8b-shape.json")
KV_LINE = re.compile(r"KV cache on cpu.*? (\d+) blocks x (\d+) tokens = (\d+) tokens")
MEM_LINE = re.compile(r"memory( per rank)?: weights ([\d.]+) MiB \+ KV cache ([\d.]+) MiB \+ workspace ([\d.]+) MiB")


def plan(*args, model=True, env=None):
    cmd = [PAGED, "plan"] + (["--model", MODEL] if model else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, **env) if env else None)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def plan_json(*args, model=True, env=None):
    rc, out, err = plan("--json", *args, model=model, env=env)
    assert rc in (0, 1), (rc, out, err)
    return rc, json.loads(out)


def serve_numbers(args):
    """Starts serve with `args`; returns per-rank (weights, kv, workspace) bytes and KV tokens."""
    with su.Server(*args, default_args=False) as s:
        m = su.metrics(s.port)
        log = s.log()
    ranks = {"host": {"weights_offloaded": int(su.metric(m, "paged:host_memory_bytes", category="weights_offloaded"))}}
    for key, v in m.items():
        if not key.startswith("paged:device_memory_bytes{"):
            continue
        dev = re.search(r'device="([^"]+)"', key).group(1)
        cat = re.search(r'category="([^"]+)"', key).group(1)
        ranks.setdefault(dev, {})[cat] = int(v)
    kv = KV_LINE.search(log)
    assert kv and MEM_LINE.search(log), log
    return ranks, int(kv.group(3)), log


def check_against_serve(args):
    rc, d = plan_json(*args)
    p = d["plan"]
    assert rc == 0 and p["fits"], d
    ranks, tokens, log = serve_numbers(args)
    # --cpu-offload-gb: the host copies (rank 0's, as /metrics has them).
    off = ranks.pop("host")["weights_offloaded"]
    assert off == p["ranks"][0]["offloaded_host_bytes"], (args, off, p["ranks"][0])
    assert ("cpu offload: layers 0-" in log) == (off > 0), log[-3000:]
    devs = sorted(ranks)
    assert len(devs) == len(p["ranks"]), (devs, p["ranks"])
    for dev, pr in zip(devs, p["ranks"]):
        real = ranks[dev]
        assert pr["weights_bytes"] == real["weights"], (args, dev, pr, real)
        assert pr["workspace_bytes"] == real["workspace"], (args, dev, pr, real)
        assert pr["kv_cache_bytes"] == real["kv_cache"], (args, dev, pr, real)
    assert abs(p["kv_tokens"] - tokens) <= tokens * 0.01, (args, p["kv_tokens"], tokens)
    # The text names the same numbers.
    rc, out, _ = plan(*args)
    assert f"= {p['kv_tokens']} tokens" in out and f"sequences of {p['plan_seq_len']} tokens: {p['sequences']}" in out, out
    print(f"  {' '.join(args) or '(defaults)'}: weights {p['ranks'][0]['weights_bytes']} B, workspace "
          f"{p['ranks'][0]['workspace_bytes']} B, KV {p['kv_tokens']} tokens (serve: {tokens}), "
          f"{p['sequences']} sequences of {p['plan_seq_len']}")


def test_matches_startup():
    for args in ([], ["--kv-cache-memory", "512M"], ["--max-model-len", "4096", "--max-num-seqs", "16"],
                 ["-tp", "3"], ["--quantization", "int4"], ["--quantization", "fp8", "--kv-cache-dtype", "q8_0"],
                 ["--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "fp8_e4m3_scaled", "--kv-cache-memory", "512M"],
                 ["--cpu-offload-gb", "0.02"], ["-tp", "3", "--cpu-offload-gb", "0.004"],
                 ["--quantization", "fp8", "--cpu-offload-gb", "1"]):
        check_against_serve(args)


def test_fp8_checkpoint():
    """A Hugging Face FP8 checkpoint (weights F8_E4M3 with row scales, made
    by tests/gpu/make_fp8_model.py with torch): the planned weights count
    the row scales, as the backends hold them."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("  fp8 checkpoint: skipped (no torch)")
        return
    import tempfile
    tmp = tempfile.mkdtemp(prefix="paged-plan-fp8-")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
           "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 1024, "rope_theta": 10000.0,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(tmp, "shape.json"), "w") as f:
        json.dump(cfg, f)
    model = os.path.join(tmp, "fp8")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests/gpu/make_fp8_model.py"), os.path.join(tmp, "shape.json"),
                    model], check=True, capture_output=True, timeout=300)
    try:
        for args in (["--model", model], ["--model", model, "--kv-cache-dtype", "fp8"]):
            check_against_serve(args)
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def test_plan_seq_len():
    _, d = plan_json("--plan-seq-len", "1000")
    p = d["plan"]
    assert p["plan_seq_len"] == 1000 and p["sequences"] == p["kv_tokens"] // (63 * 16), p  # 1000 tokens = 63 blocks


def test_does_not_fit_advice():
    args = ["--kv-cache-memory", "64M"]
    rc, out, _ = plan(*args)
    assert rc == 1 and "does not fit" in out and "would fit:" in out, out
    _, d = plan_json(*args)
    assert not d["plan"]["fits"] and d["advice"], d
    flags = [a["flags"] for a in d["advice"]]
    mml = [f for f in flags if f.startswith("--max-model-len")]
    assert mml, flags
    # serve refuses with the same advice.
    p = subprocess.run([PAGED, "serve", "--model", MODEL, "--port", str(su.free_port()), *args],
                       capture_output=True, timeout=120, cwd=ROOT)
    err = p.stderr.decode()
    assert p.returncode != 0 and "cannot hold one sequence" in err and "would fit" in err, err
    for f in flags:
        assert f in err, (f, err)
    # Following the advice starts, with the planned KV tokens.
    adv = next(a for a in d["advice"] if a["flags"] == mml[0])
    ranks, tokens, _ = serve_numbers(args + mml[0].split())
    assert tokens == adv["plan"]["kv_tokens"], (tokens, adv["plan"])
    print(f"  {' '.join(args)}: advice {flags}; {mml[0]} starts with {tokens} KV tokens")
    # 1M: not even one block; the --kv-cache-memory advice starts.
    rc, d = plan_json("--kv-cache-memory", "1M")
    kvm = [a["flags"] for a in d["advice"] if a["flags"].startswith("--kv-cache-memory")]
    assert rc == 1 and kvm, d
    p = subprocess.run([PAGED, "serve", "--model", MODEL, "--port", str(su.free_port()), "--kv-cache-memory", "1M"],
                       capture_output=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0 and kvm[0] in p.stderr.decode(), p.stderr.decode()
    serve_numbers(kvm[0].split())


def test_gpu_shape_consistency():
    with open(SHAPE) as f:
        c = json.load(f)
    H, F, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    params = V * H * (1 if c["tie_word_embeddings"] else 2) + H  # embedding, LM head, final norm
    params += L * (H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * F * H + 2 * H)
    base = ["--device", "cuda", "--device-memory", "141G", "--load-format", "dummy", "--hf-config", SHAPE]
    for kvd, elem in (("auto", 2), ("fp8", 1)):
        t0 = time.time()
        rc, out, err = plan(*base, "--kv-cache-dtype", kvd, model=False)
        secs = time.time() - t0
        print(out)
        assert rc == 0, (out, err)
        assert secs < 5, secs  # the config only: no weight is made
        _, d = plan_json(*base, "--kv-cache-dtype", kvd, model=False)
        p, r = d["plan"], d["plan"]["ranks"][0]
        assert r["weights_bytes"] == params * 2, (r["weights_bytes"], params * 2)
        per_token = 2 * L * nkv * hd * elem
        assert p["kv_bytes_per_token"] == per_token and p["kv_block_bytes"] == per_token * 16, p
        assert (p["kv_blocks"] + 1) * p["kv_block_bytes"] == r["kv_cache_bytes"], p  # + the null block
        assert p["kv_tokens"] * per_token == p["kv_blocks"] * p["kv_block_bytes"], p
        total = 141 << 30
        assert r["weights_bytes"] + r["kv_cache_bytes"] + r["workspace_bytes"] + r["graphs_bytes"] + \
            r["other_bytes"] + r["free_bytes"] == total, r
        assert r["free_bytes"] >= r["reserved_bytes"] == total - int(0.9 * total), r
        assert p["sequences"] == p["kv_tokens"] // 131072, p
    # fp8 holds twice the tokens, to a block.
    _, a = plan_json(*base, model=False)
    _, b = plan_json(*base, "--kv-cache-dtype", "fp8", model=False)
    assert abs(b["plan"]["kv_blocks"] - 2 * a["plan"]["kv_blocks"]) <= 2, (a["plan"], b["plan"])
    # -tp 2: each rank holds half the layers' heads and FFN columns.
    _, t = plan_json(*base, "-tp", "2", model=False)
    assert len(t["plan"]["ranks"]) == 2 and t["plan"]["ranks"][0]["weights_bytes"] < params * 2 // 2 + 2 * H * L * 2, t


def test_gpu_70b_shape():
    # llama3-70b-shape (the multi-GPU issue's config) on 139.8 GiB H200s:
    # the weights (2 bytes a parameter) do not fit one GPU, the advice is
    # -tp 2, and -tp 4 / -tp 8 split the weights evenly and fit.
    shape70 = os.path.join(ROOT, "tests/gpu/llama3-70b-shape.json")
    with open(shape70) as f:
        c = json.load(f)
    H, F, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    per_layer = H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * F * H
    base = ["--device", "cuda", "--device-memory", "139.8G", "--load-format", "dummy", "--hf-config", shape70]
    rc, d = plan_json(*base, model=False)
    assert rc == 1 and not d["plan"]["fits"], d["plan"]
    flags = [a["flags"] for a in d["advice"]]
    assert flags and flags[0] == "-tp 2" and all(a["plan"]["fits"] for a in d["advice"]), d["advice"]
    for tp in (4, 8):
        rc, t = plan_json(*base, "-tp", str(tp), model=False)
        ranks = t["plan"]["ranks"]
        assert rc == 0 and t["plan"]["fits"] and len(ranks) == tp, t["plan"]
        # Each rank: 1/tp of every layer's matrices and of the vocabulary
        # (embedding and LM head), the norms whole.
        want = 2 * (L * per_layer // tp + 2 * V * H // tp + L * 2 * H + H)
        assert all(r["weights_bytes"] == want for r in ranks), (tp, [r["weights_bytes"] for r in ranks], want)
        print(f"  70b shape -tp {tp}: weights {want / 2**30:.2f} GiB per rank, KV {t['plan']['kv_tokens']} tokens")


def test_gpu_gemma3_27b_layer_groups():
    # Gemma 3 27B's shape on an H200 (141 GB): CUDA runs sliding windows
    # (caps.attn_window), so the KV pool keeps the local layers' windows
    # only: 7 block tables a sequence, 10 layers a block, and 19 sequences
    # of 32K where one table for every layer holds 4 (session 16's device
    # run fitted the same 19 on a real H200: docs/gemma3.md).
    shape = os.path.join(ROOT, "tests/gpu/gemma3-27b-shape.json")
    base = ["--device", "cuda", "--device-memory", "141G", "--load-format", "dummy", "--hf-config", shape,
            "--plan-seq-len", "32768"]
    rc, g = plan_json(*base, model=False)
    rc1, one = plan_json(*base, "--disable-hybrid-kv-cache-manager", model=False)
    gp, op = g["plan"], one["plan"]
    assert rc == rc1 == 0 and gp["fits"] and op["fits"], (gp, op)
    assert gp["kv_groups"] == 7 and gp["kv_layers_per_block"] == 10 and gp["kv_group_window"] == 1024, gp
    assert gp["sequences"] >= 4 * op["sequences"] and op["sequences"] >= 1, (gp["sequences"], op["sequences"])
    assert gp["kv_group_gain"] > 3.5 and op.get("kv_groups", 1) == 1, (gp, op)
    print(f"  gemma3-27b shape: {gp['sequences']} sequences of 32K with KV layer groups, {op['sequences']} without")


def test_gpu_head_dim():
    # The plan says what start-up would refuse on CUDA, in one line: a
    # head_dim the attention kernels are not built for. 256 (Gemma 3
    # 270M-12B) plans as any other since its GPU checks passed (session 23;
    # the flag that held it back is gone, so setting it changes nothing):
    # the 12B shape's KV layer groups give 4x the sequences of 32K of one
    # table.
    shape12 = os.path.join(ROOT, "tests/gpu/gemma3-12b-shape.json")
    base = ["--device", "cuda", "--device-memory", "80G", "--load-format", "dummy", "--plan-seq-len", "32768"]
    rc, g = plan_json(*base, "--hf-config", shape12, model=False, env={"PAGED_CUDA_HD256": "0"})
    gp = g["plan"]
    assert rc == 0 and gp["fits"] and gp["kv_groups"] == 6 and gp["sequences"] >= 8, gp
    with tempfile.TemporaryDirectory() as d:
        cfg = json.load(open(SHAPE))
        cfg["head_dim"] = 96  # 32 heads of 96 over hidden 4096: a shape no CUDA kernel is built for
        p96 = os.path.join(d, "hd96.json")
        json.dump(cfg, open(p96, "w"))
        rc, out, err = plan(*base, "--hf-config", p96, model=False)
        lines = [l for l in err.splitlines() if l.strip()]
        assert rc == 2 and len(lines) == 1 and "head_dim 96" in err and "64, 128 and 256" in err, (rc, out, err)
    print(f"  gemma3-12b shape: {gp['sequences']} sequences of 32K on CUDA; head_dim 96 refused in one line")


def test_gpu_does_not_fit():
    # An 8B shape on a 24 GiB GPU at the full 128K length: KV room for about
    # 40K tokens; the advice names a shorter length and -tp 2, each of which
    # fits by the plan.
    base = ["--device", "cuda", "--device-memory", "24G", "--load-format", "dummy", "--hf-config", SHAPE]
    rc, out, _ = plan(*base, model=False)
    assert rc == 1 and "does not fit" in out, out
    _, d = plan_json(*base, model=False)
    flags = " ".join(a["flags"] for a in d["advice"])
    assert "-tp 2" in flags and "--max-model-len" in flags and all(a["plan"]["fits"] for a in d["advice"]), d["advice"]
    print(out)
    # --cpu-offload-gb is advised too, as the fewest whole GiB that fit: the
    # layers of the 8B shape move from the first on until that many GiB
    # have (416 MiB of bf16 each), and two slots of one layer stay.
    off = [a for a in d["advice"] if a["flags"].startswith("--cpu-offload-gb ")]
    assert off, d["advice"]
    g = int(off[0]["flags"].split()[1])
    with open(SHAPE) as f:
        c = json.load(f)
    H, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    layer = 2 * (H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * F * H + 2 * H)  # 256-byte multiples already
    n = min(L, -(-(g << 30) // layer))
    _, full = plan_json(*base, "--max-model-len", "4096", model=False)
    _, o = plan_json(*base, "--max-model-len", "4096", "--cpu-offload-gb", str(g), model=False)
    r0, r = full["plan"]["ranks"][0], o["plan"]["ranks"][0]
    assert r["offloaded_layers"] == n and r["offloaded_host_bytes"] == n * layer and r["offload_slot_bytes"] == layer, r
    assert r["weights_bytes"] == r0["weights_bytes"] - n * layer + 2 * layer, (r, r0)
    _, less = plan_json(*base, "--cpu-offload-gb", str(g - 1), model=False)
    assert not less["plan"]["fits"], less["plan"]  # the fewest
    print(f"  24G: --cpu-offload-gb {g} moves {n} layers ({n * layer / 2**30:.2f} GiB), "
          f"KV {off[0]['plan']['kv_tokens']} tokens")


def test_gpu_lora_workspace():
    # --enable-lora adds the lora_apply workspace the runner carves
    # (engine/runner/runner.c lora_ws_bytes): on CUDA the backend's
    # pg_cuda_lora_workspace_size (kernels/cuda/cuda_ops.h) for
    # max_num_batched_tokens rows: the staged slots (bytes), the rows sorted
    # by slot (int32), the tiles (8 bytes, one per 32 rows plus one per
    # slot), each to 256, then the graph-safe op's shrink parts (which
    # cover the grouped shrink's too): one [rows][max rank] of floats per
    # 1,024 columns of the widest input (the FFN's 14,336: 14) for each of
    # three projections, and a float per row; the slot table and the graph
    # reserve move too (below).
    base = ["--device", "cuda", "--device-memory", "141G", "--load-format", "dummy", "--hf-config", SHAPE]
    cfg = json.load(open(SHAPE))
    width = max(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"] * cfg.get(
        "head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]))
    up = lambda v: -(-v // 256) * 256
    _, a = plan_json(*base, model=False)
    for rank in (16, 64):
        _, b = plan_json(*base, "--enable-lora", "--max-loras", "4", "--max-lora-rank", str(rank), model=False)
        t = b["plan"]["max_num_batched_tokens"]
        want = up(t) + up(4 * t) + up(8 * (-(-t // 32) + 64)) + (3 * -(-width // 1024) * t * rank + t) * 4
        ra, rb = a["plan"]["ranks"][0], b["plan"]["ranks"][0]
        grown = rb["workspace_buffers_bytes"] - ra["workspace_buffers_bytes"]
        print(f"  cuda, --max-lora-rank {rank}: LoRA workspace {grown} B for {t} rows (want {want})")
        assert grown == want, (grown, want, t)
        # No adapter named: no adapter weights, only the slot table in device
        # memory that the decode graphs' LoRA reads (engine/model/lora.c): 24
        # bytes per (layer, projection, slot).
        table = cfg["num_hidden_layers"] * 7 * 4 * 24
        assert rb["workspace_extra_bytes"] == ra["workspace_extra_bytes"] and rb["lora_bytes"] == table, (ra, rb)
        assert rb["weights_bytes"] == ra["weights_bytes"] + table, (ra, rb)
        # Graphs: a second set of buckets with the adapters' kernels in
        # (engine/runner/runner_graphs.c), so twice the reserve past its 16 MiB.
        mib16 = 16 << 20
        assert rb["graphs_bytes"] - mib16 == 2 * (ra["graphs_bytes"] - mib16), (ra, rb)
    # The CPU's own figure (kernels/cpu/lora.c) still counts.
    _, c0 = plan_json()
    _, c1 = plan_json("--enable-lora")
    assert c1["plan"]["ranks"][0]["workspace_buffers_bytes"] > c0["plan"]["ranks"][0]["workspace_buffers_bytes"]


def test_gpu_flashinfer_prefill_workspace():
    # FlashInfer's prefill (the default on Hopper since session 21): its plan
    # image at the head of the attention workspace (kernels/cuda/cuda_ops.h,
    # pg_cuda_fi_prefill_ws_bytes): seven int32 arrays of 4,096 work items a
    # query head, the per-SM index and alignments, to 256 bytes, then the
    # fp8 path's Q scales (256 bytes at up to 32 heads); nothing else moves. PAGED_CUDA_PREFILL=paged (our kernel) counts none, and naming
    # the default changes nothing. Planned here without a GPU, as `paged plan`
    # does for one.
    base = ["--device", "cuda", "--device-memory", "141G", "--load-format", "dummy", "--hf-config", SHAPE]
    with open(SHAPE) as f:
        nh = json.load(f)["num_attention_heads"]
    def fi_ws(h):  # the plan image, then Q's fp8 scales and their reduction (2 x h floats)
        return -(-(7 * 4 * 4096 * h + 4 * 1025 + 8 * 16) // 256) * 256 + -(-(8 * h) // 256) * 256

    want = fi_ws(nh)
    for tp in (1, 2):
        _, a = plan_json(*base, "-tp", str(tp), model=False, env={"PAGED_CUDA_PREFILL": "paged"})
        _, b = plan_json(*base, "-tp", str(tp), model=False)
        _, c = plan_json(*base, "-tp", str(tp), model=False, env={"PAGED_CUDA_PREFILL": "flashinfer"})
        ra, rb = a["plan"]["ranks"][0], b["plan"]["ranks"][0]
        grown = rb["workspace_buffers_bytes"] - ra["workspace_buffers_bytes"]
        w = fi_ws(nh // tp)
        print(f"  cuda -tp {tp}, FlashInfer's prefill (default) against PAGED_CUDA_PREFILL=paged: "
              f"attention workspace +{grown} B (want {w})")
        assert grown == w, (grown, w)
        assert rb["weights_bytes"] == ra["weights_bytes"] and rb["workspace_extra_bytes"] == ra["workspace_extra_bytes"]
        assert c["plan"]["ranks"][0] == rb, (c["plan"]["ranks"][0], rb)
    assert want == 3674624  # 3.7 MB at 32 heads (docs/cuda_kernels.md)


def test_draft_model():
    # A draft model (--speculative-config draft_model) counts on rank 0 before
    # the KV budget: on a GPU its bytes come out of the KV cache's blocks.
    spec = '{"method": "draft_model", "model": "%s", "num_speculative_tokens": 4}' % MODEL
    gpu = ["--device", "cuda", "--device-memory", "141G"]
    _, base = plan_json(*gpu)
    _, with_draft = plan_json(*gpu, "--speculative-config", spec)
    b, d = base["plan"], with_draft["plan"]
    draft = d["ranks"][0]["draft_bytes"]
    fewer = b["kv_blocks"] - d["kv_blocks"]
    print(f"  draft model: {draft >> 20} MiB on rank 0, {fewer} fewer KV blocks of {d['kv_block_bytes']} bytes")
    assert b["ranks"][0]["draft_bytes"] == 0 and draft > 100 << 20, (b["ranks"][0], d["ranks"][0])
    assert abs(fewer * d["kv_block_bytes"] - draft) <= d["kv_block_bytes"], (fewer, draft)
    rc, out, _ = plan("--speculative-config", spec)
    assert rc == 0 and "draft " in out and "draft model" in out, out


def test_bad_flags():
    for args in (["--plan-seq-len", "0"], ["--plan-seq-len"], ["--device-memory", "lots"], ["--bogus"],
                 ["--device", "cpu", "--device-memory", "141G"], ["--kv-cache-dtype", "fp9"],
                 ["--host-kv-offload", "sometimes"], ["--host-kv-offload"]):
        rc, out, err = plan(*args)
        lines = [l for l in err.splitlines() if l.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("paged plan: "), (args, rc, out, err)
    # fp8 with per-row scales is the CPU's: the CUDA plan refuses it by name.
    rc, out, err = plan("--device", "cuda", "--device-memory", "24G", "--load-format", "dummy", "--hf-config", SHAPE,
                        "--kv-cache-dtype", "fp8_e4m3_scaled", model=False)
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == 2 and len(lines) == 1 and "fp8_e4m3_scaled is CPU-only" in err, (rc, out, err)
    rc, out, err = plan("--host-kv-offload", "sometimes")
    assert "--host-kv-offload must be all or reused" in err, err
    rc, out, err = plan("--device", "cuda")
    if not subprocess.run(["sh", "-c", "nvidia-smi -L 2>/dev/null | grep -q GPU"]).returncode == 0:
        assert rc == 2 and "--device-memory" in err, err


if __name__ == "__main__":
    if not os.path.exists(MODEL):
        print("SKIP: default model missing")
        sys.exit(77)
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            print(name)
            fn()
    print("ok")
