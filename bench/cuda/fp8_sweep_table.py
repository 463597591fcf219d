#!/usr/bin/env python3
"""Reads bench_cuda_gemm_fp8 --sweep --json output and prints, per matrix and
m, cuBLASLt + rescale's TFLOP/s, each configuration's best over the
scheduler's knobs (as a ratio to cuBLASLt), and the winner: the table the
shape pick in gemm_fp8_cutlass.cu is read from (docs/fp8_gemm.md).

  python3 bench/cuda/fp8_sweep_table.py SWEEP.json [--no-fast]

--no-fast leaves out the fast-accumulation configurations (names with
" fast")."""
import json
import sys


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    no_fast = "--no-fast" in sys.argv
    d = json.load(open(args[0]))
    cfgs = d["configs"]
    keep = [i for i, c in enumerate(cfgs) if not (no_fast and " fast" in c)]
    print(d.get("device", ""))
    print("configs: " + "; ".join(f"{cfgs[i]}" for i in keep))
    print(f"{'matrix':8s} {'m':>5s} {'cuBLASLt':>8s} | " + " ".join(f"c{i:<4d}" for i in keep) + " | best")
    for p in d["points"]:
        best = {}
        for r in p["cutlass"]:
            c = r["cfg"]
            if c in keep and (c not in best or r["tflops"] > best[c]["tflops"]):
                best[c] = r
        base = p["cublaslt_tflops"]
        cells = " ".join(f"{best[i]['tflops'] / base:5.2f}" if i in best else "    -" for i in keep)
        w = max(best.values(), key=lambda r: r["tflops"]) if best else None
        win = (f"c{w['cfg']} sw{w['swizzle']} {w['raster']} {w['tflops']:.0f} ({w['tflops'] / base:.2f}x)"
               if w and w["tflops"] > base else "cuBLASLt")
        print(f"{p['matrix']:8s} {p['m']:5d} {base:8.1f} | {cells} | {win}")


if __name__ == "__main__":
    main()
