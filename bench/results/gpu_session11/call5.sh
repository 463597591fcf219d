#!/bin/bash
# Session 11, device call 5: the one-pass CUTLASS FP8 kernel
# (kernels/cuda/gemm_fp8_cutlass.cu) against the CPU reference, and its
# TFLOP/s beside cuBLASLt + rescale and bf16 (the bench's last column).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c5; mkdir -p $R build
tar -C build -xJf .gpucarry/p5.tar.xz || { echo "unpack failed"; exit 1; }
timeout 100 build/gpu5/test_cuda_fp8_gemm > $R/fp8_gemm_test.log 2>&1
echo "fp8 gemm test rc=$? at $(el)s"; grep -E "^FAIL" $R/fp8_gemm_test.log | head -10 | cut -c1-200
grep -E "gemm_fp8_cutlass" $R/fp8_gemm_test.log | cut -c1-130 | head -30; tail -1 $R/fp8_gemm_test.log
timeout 90 build/gpu5/bench_cuda_gemm_fp8 > $R/bench_fp8.log 2>&1
echo "bench rc=$? at $(el)s"; grep -E "^(cutlass|qkv|o|gate_up|down) " $R/bench_fp8.log 
tar -C $OUT -czf $OUT/call5.tgz c5 && rm -rf $R
echo "done at $(el)s"
