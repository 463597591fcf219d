#!/usr/bin/env python3
"""torch's SDPA beside bench_fi_prefill (issue 29's peers, same device call).

Causal prefill, 32 query / 8 KV heads of 128 (the KV heads repeated to 32, as
SDPA's fused backends want), bf16, the shapes of bench/cuda/bench_fi_prefill.cu:
1 x 4096, 2 x 8192, 8 x 4096, 1 x 32768. Each backend (cuDNN, FlashAttention-2)
is forced with torch.nn.attention.sdpa_kernel; median of 10 timed calls after
3 warm-up calls, CUDA events; TFLOP/s with the causal FLOPs
2 * 2 * heads * head_dim * sum L(L+1)/2, the same count as bench_fi_prefill.

Needs torch with CUDA (the GPU host has it); prints one table.
  python3 bench/cuda/sdpa_peer.py [--heads H/KV/D]
--heads: other query heads, KV heads and head_dim (bench_fi_prefill's flag
of the same name; 16/8/256 is Gemma 3 12B's).
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, KV, HD = 32, 8, 128
SHAPES = [(1, 4096), (2, 8192), (8, 4096), (1, 32768)]
BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash-2", SDPBackend.FLASH_ATTENTION)]


def time_ms(fn, warm=3, reps=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    global H, KV, HD
    if len(sys.argv) == 3 and sys.argv[1] == "--heads":
        H, KV, HD = (int(x) for x in sys.argv[2].split("/"))
    elif len(sys.argv) > 1:
        print("usage: sdpa_peer.py [--heads H/KV/D]", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("skipped: no CUDA device for torch")
        return 77
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; causal, {H} q / {KV} KV heads "
          f"(repeated), head_dim {HD}, bf16")
    print(f"{'shape':<12}" + "".join(f"{name:>16}" for name, _ in BACKENDS))
    g = torch.Generator(device="cuda").manual_seed(1)
    for n, length in SHAPES:
        q = torch.randn(n, H, length, HD, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(n, KV, length, HD, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(n, KV, length, HD, device="cuda", dtype=torch.bfloat16, generator=g)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        flops = 2.0 * 2.0 * H * HD * n * length * (length + 1) / 2.0
        row = f"{f'{n} x {length}':<12}"
        for _, backend in BACKENDS:
            try:
                with sdpa_kernel([backend]):
                    ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                row += f"{flops / ms * 1e-9:>11.1f} TF/s"
            except RuntimeError as e:
                row += f"{'n/a':>16}"
                print(f"  ({backend}: {str(e).splitlines()[0][:100]})", file=sys.stderr)
        print(row)
        del q, k, v
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
