#!/usr/bin/env python3
"""The peer of bench/bench_cuda_gemm_fp8.cu: torch's FP8 product with rowwise
scales (torch._scaled_mm, e4m3 x e4m3, per-token scale_a [m, 1] and
per-channel scale_b [1, n], bf16 out) and torch.mm in bf16, on the same
Llama-3.1-8B shapes and m, timed the same way (median of 20 repetitions of
10 back-to-back calls after warm-up, CUDA events). Also the accuracy of
_scaled_mm on one shape against fp64, as a sanity check of the inputs.

  python3 bench/cuda/scaled_mm_peer.py [--quick] [--json FILE]

Runs on the GPU host (its python3 has torch); prints a table of TFLOP/s.
"""
import argparse
import json
import sys

import torch

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def time_ms(fn, warm=3, reps=20, inner=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / inner)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    ms = [64, 1024, 4096] if args.quick else [16, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    reps = 7 if args.quick else 20
    dev = "cuda"
    f8 = torch.float8_e4m3fn
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}")
    print(f"{'matrix':8s} {'m':>6s} {'n':>6s} {'k':>6s} | {'scaled_mm':>9s} {'fast':>9s} {'bf16 mm':>9s} | TFLOP/s")
    out = []
    for name, n, k in SHAPES:
        w = (torch.randn(n, k, device=dev) * 0.02)
        ws = (w.abs().amax(dim=1, keepdim=True) / 448.0).float()  # [n, 1]
        wq = (w / ws).to(f8)
        wb = w.to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device=dev) * 2.0
            xs = (x.abs().amax(dim=1, keepdim=True) / 448.0).float()  # [m, 1]
            xq = (x / xs).to(f8)
            xb = x.to(torch.bfloat16)
            bt = wq.t()  # [k, n] column-major, as _scaled_mm wants
            sb = ws.t().contiguous()  # [1, n]
            row = {"matrix": name, "m": m, "n": n, "k": k}
            try:
                row["scaled_mm_ms"] = time_ms(
                    lambda: torch._scaled_mm(xq, bt, scale_a=xs, scale_b=sb, out_dtype=torch.bfloat16), reps=reps)
            except RuntimeError as e:
                row["scaled_mm_error"] = str(e)[:200]
            try:
                row["scaled_mm_fast_ms"] = time_ms(
                    lambda: torch._scaled_mm(xq, bt, scale_a=xs, scale_b=sb, out_dtype=torch.bfloat16,
                                             use_fast_accum=True), reps=reps)
            except RuntimeError as e:
                row["scaled_mm_fast_error"] = str(e)[:200]
            row["bf16_mm_ms"] = time_ms(lambda: torch.mm(xb, wb.t()), reps=reps)
            fl = 2.0 * m * n * k

            def tf(key):
                v = row.get(key)
                return f"{fl / (v * 1e-3) / 1e12:9.1f}" if v else f"{'-':>9s}"
            print(f"{name:8s} {m:6d} {n:6d} {k:6d} | {tf('scaled_mm_ms')} {tf('scaled_mm_fast_ms')} {tf('bf16_mm_ms')}")
            sys.stdout.flush()
            out.append(row)
    # Accuracy of the rowwise product on one shape, against fp64 of the same e4m3 values.
    n, k, m = 4096, 4096, 256
    w = torch.randn(n, k, device=dev) * 0.02
    ws = (w.abs().amax(dim=1, keepdim=True) / 448.0).float()
    wq = (w / ws).to(f8)
    x = torch.randn(m, k, device=dev)
    xs = (x.abs().amax(dim=1, keepdim=True) / 448.0).float()
    xq = (x / xs).to(f8)
    y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t().contiguous(), out_dtype=torch.bfloat16).double()
    ref = (xq.double() * xs.double()) @ (wq.double() * ws.double()).t()
    print(f"scaled_mm accuracy m {m} n {n} k {k}: max_rel {((y - ref).abs().max() / ref.abs().max()).item():.3e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
