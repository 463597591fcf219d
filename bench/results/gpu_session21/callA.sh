#!/bin/bash
# Device call A (session 21, issue 29 steps 2-3): the checks, on this build
# (FlashInfer's prefill the default; fp8 KV through its fp8 kernel behind
# PAGED_CUDA_FI_FP8=1):
#   1. bench_fi_prefill: the --check cases (bf16 and fp8 caches) through
#      pg_cuda_fi_prefill_run against an fp32 reference, then the TFLOP/s
#      tables (bf16 KV, fp8 KV) beside ours; torch's SDPA (cuDNN, FA2) on
#      the same shapes (bench/cuda/sdpa_peer.py);
#   2. tests/gpu/run_gpu_tests.sh --skip-kernels (check 10: the runner with
#      FlashInfer's prefill by default and with PAGED_CUDA_PREFILL=paged,
#      3b's fp8 KV run through FlashInfer's fp8 kernel, layer groups).
# Pack: .gpucarry/s21.tar.xz (paged, test_cuda_runner, bench_fi_prefill, lib).
set -u
. bench/gpu_call_lib.sh
call_init cA
[ -x build/gpu-pack/paged ] || unpack s21
G=build/gpu-pack
gpu_name
timeout 240 $G/bench_fi_prefill > $R/fi_bench.log 2>&1
echo "bench_fi_prefill rc=$? at $(el)s"; grep -v "^$" $R/fi_bench.log | grep -v " ok$" | tail -16
grep "fp8" $R/fi_bench.log | grep check | cut -c1-130
timeout 120 python3 bench/cuda/sdpa_peer.py > $R/sdpa.log 2>&1
echo "sdpa_peer rc=$? at $(el)s"; cat $R/sdpa.log
save
OUT=$R timeout 330 bash tests/gpu/run_gpu_tests.sh --skip-kernels > $R/run_gpu_tests.log 2>&1
echo "run_gpu_tests.sh --skip-kernels rc=$? at $(el)s: $(tail -1 $R/run_gpu_tests.log)"
grep -E "^FAIL|FlashInfer|fp8 KV" $R/run_gpu_tests.log | cut -c1-200 | head -30
save
echo "done at $(el)s"
