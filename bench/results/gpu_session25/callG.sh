#!/bin/bash
# NOT RUN in session 25 (its device budget was spent). Device call G (issue
# 33's W4): lora_gemm_runs.patch (beside this script: runs of one adapter's
# rows through cuBLASLt, PAGED_CUDA_LORA_GEMM_RUNS=N; docs/lora.md "Runs
# of one adapter through cuBLASLt"), built on 3a470c2 and packed as
# .gpucarry/s35.tar.xz (paged, test_cuda_runner, test_cuda_lora,
# bench_cuda_lora, lib; if
# that pack is gone: `git apply bench/results/gpu_session25/lora_gemm_runs.patch`,
# tools/pack_gpu.sh, and the tar line of docs/gpu_checklist.md), in one call:
#   0. bench_cuda_lora (the patch's: one llama3-8b layer's LoRA by batch
#      size, BGMV / graph-safe op / runs through cuBLASLt), with the
#      graph-safe op's tiles off, then on;
#   1. test_cuda_lora (with "lora runs"), the LoRA runner check plain and
#      with PAGED_CUDA_LORA_GEMM_RUNS=16;
#   2. lora_serve_runs: served llama3-8b shape, 8 rank-16 adapters, W4 100 clients 30 s:
#      runs through cuBLASLt (runs), the default BGMV (new), naming no
#      adapter (base), each with W1 with and without an adapter.
# The target: W4 with adapters >= 0.85x of base (0.55x now).
set -u
. bench/gpu_call_lib.sh
call_init cG
[ -x build/gpu-pack/paged ] || unpack s35
K=$PWD/build/gpu-pack
gpu_name
timeout 90 "$K/bench_cuda_lora" > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(layer|rank)" "$R/bench_lora.txt"
PAGED_CUDA_LORA_DEV_TILES=1 timeout 90 "$K/bench_cuda_lora" --m 256,2048 > "$R/bench_lora_tiles.txt" 2>&1
echo "bench_cuda_lora DEV_TILES=1 rc=$? at $(el)s"
grep -E "^(layer|rank)" "$R/bench_lora_tiles.txt"
save
lora_checks "$K" 0
grep -E "lora runs" "$R/lora_kernels.txt"
PAGED_CUDA_LORA_GEMM_RUNS=16 timeout 60 "$K/test_cuda_runner" /tmp/paged-m64 \
    --lora "$(ls -d /tmp/paged-m64-lora/* | paste -sd,)" > "$R/runner_lora_runs.txt" 2>&1
echo "runner LoRA GEMM_RUNS=16 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_runs.txt" | cut -c1-200)"
save
lora_serve_runs "$K" 8 runs new base
echo "done at $(el)s"
