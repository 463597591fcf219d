#!/usr/bin/env python3
"""The CPU KV cache's element types through the real server on the default
model (SmolLM2-135M: 30 layers, 3 KV heads of head_dim 64), each with
--kv-cache-memory 2G:

1. Greedy texts (32 tokens, ignore_eos) of the 20 held-out prompts
   (server_util.PROMPTS_20): --kv-cache-dtype f16 equals f32 on every one
   in the default numerics, which round K and V to f16 before they are
   used whatever the cache holds (kernels/cpu/llama_compat.h), so an f16
   cache changes nothing; auto is f16 there and gives the same texts. With
   bf16, q8_0, fp8 (e4m3, scale 1.0, saturating: CUDA's fp8 cache) and
   fp8_e4m3_scaled (e4m3 with an f32 scale per head row) the count of equal
   texts is reported, not asserted beyond "no error, non-empty text".
2. Capacity: the start-up line "KV cache on cpu: N blocks x 16 tokens = T
   tokens (..., TYPE, B bytes per block)". B is the layout's: 2 (K and V) x
   30 layers x 16 tokens x 3 heads x row bytes (f32 256, f16 128, q8_0
   2 x 34 = 68, fp8 64, fp8_e4m3_scaled 4 + 64 = 68), T = (floor(2 GiB / B)
   - 1) x 16 (block 0 is the null block); /metrics'
   paged:kv_cache_blocks{state="total"} agrees. So T(f16) / T(f32) is 2,
   T(q8_0) / T(f32) and T(fp8_e4m3_scaled) / T(f32) are 256 / 68 = 3.765 and
   T(fp8) / T(f32) is 4, up to the rounding of whole blocks (< 0.1% here).
3. Every KV block is back in the pool after the requests (wait_idle, then
   paged:kv_cache_blocks{state="used"} == 0).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

KV_BYTES = 2 << 30
LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 30, 3, 64, 16
ROW_BYTES = {"f32": 4 * HEAD_DIM, "f16": 2 * HEAD_DIM, "bf16": 2 * HEAD_DIM, "q8_0": HEAD_DIM // 32 * 34,
             "fp8": HEAD_DIM, "fp8_e4m3_scaled": HEAD_DIM + 4}
# The flag's name -> the log's (pg_kv_dtype_name).
LOG_NAME = {"fp8": "fp8 e4m3", "fp8_e4m3_scaled": "fp8 e4m3 scaled"}
LINE = re.compile(r"KV cache on cpu: (\d+) blocks x (\d+) tokens = (\d+) tokens \([\d.]+ GiB, ([^,]+), "
                  r"(\d+) bytes per block\)")


def run(dtype, mode="default"):
    """Greedy texts of the 20 prompts, the logged capacity, /metrics' totals."""
    args = ["--max-model-len", "2048", "--kv-cache-memory", "2G", "--kv-cache-dtype", dtype, "--matmul-mode", mode,
            "--device", "cpu"]
    with su.Server(*args, default_args=False) as srv:
        m = LINE.search(srv.log())
        assert m, srv.log()[-3000:]
        blocks, bs, tokens, named, per_block = int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5])
        texts = []
        for p in su.PROMPTS_20:
            st, body = su.post(srv.port, "/v1/completions",
                               {"prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True})
            assert st == 200, (dtype, st, body)
            assert body["usage"]["completion_tokens"] == 32, body
            texts.append(body["choices"][0]["text"])
        mt = su.wait_idle(srv.port)
        used = su.metric(mt, "paged:kv_cache_blocks", state="used")
        total = su.metric(mt, "paged:kv_cache_blocks", state="total")
    return dict(texts=texts, blocks=blocks, bs=bs, tokens=tokens, named=named, per_block=per_block,
                used=used, total=total)


def check_capacity(name, r):
    expect_block = 2 * LAYERS * BLOCK * KV_HEADS * ROW_BYTES[name]
    assert r["named"] == LOG_NAME.get(name, name) and r["bs"] == BLOCK, r
    assert r["per_block"] == expect_block, (name, r["per_block"], expect_block)
    assert r["tokens"] == (KV_BYTES // expect_block - 1) * BLOCK == r["blocks"] * BLOCK, (name, r)
    # /metrics counts the same usable blocks (or those plus the null block).
    assert r["total"] in (r["blocks"], r["blocks"] + 1), (name, r["total"], r["blocks"])
    assert r["used"] == 0, (name, r["used"])


def main():
    su.require_model_and_binary()
    res = {dt: run(dt) for dt in ("f32", "f16", "q8_0", "bf16", "fp8", "fp8_e4m3_scaled")}
    auto = run("auto")
    for name, r in res.items():
        check_capacity(name, r)
        print(f"ok   {name:15s}: {r['tokens']} tokens in 2 GiB ({r['per_block']} bytes per block), "
              f"all blocks free after the requests")
    # auto is f16 in the default numerics (test_device_flags checks exact: f32).
    assert auto["named"] == "f16" and auto["tokens"] == res["f16"]["tokens"], auto
    # Ratios: exactly the layouts' up to whole blocks.
    f32 = res["f32"]["tokens"]
    for name, want in (("f16", 2.0), ("q8_0", 4 * 32 / 34), ("fp8", 4.0), ("fp8_e4m3_scaled", 256 / 68)):
        got = res[name]["tokens"] / f32
        print(f"ok   capacity {name} / f32 = {got:.4f} (layout: {want:.4f})")
        assert abs(got / want - 1) < 0.002, (name, got, want)
    # Texts.
    same = sum(a == b for a, b in zip(res["f16"]["texts"], res["f32"]["texts"]))
    diff = [(p, a, b) for p, a, b in zip(su.PROMPTS_20, res["f32"]["texts"], res["f16"]["texts"]) if a != b]
    assert same == 20, diff
    assert auto["texts"] == res["f16"]["texts"]
    print("ok   f16 greedy texts equal f32's on 20/20 prompts (auto: the same)")
    for name in ("bf16", "q8_0", "fp8", "fp8_e4m3_scaled"):
        texts = res[name]["texts"]
        assert all(t.strip() for t in texts), texts
        n = sum(a == b for a, b in zip(texts, res["f32"]["texts"]))
        first16 = sum(a[:16] == b[:16] for a, b in zip(texts, res["f32"]["texts"]))
        print(f"     {name}: {n}/20 greedy texts equal f32's ({first16}/20 share the first 16 characters; "
              f"reported, not asserted)")
    print("ok")


if __name__ == "__main__":
    main()
