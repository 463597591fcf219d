#!/bin/bash
# Session 13, device call 5: the CUTLASS W8A8 kernel on the cooperative
# schedule (no spills at compile time; the ping-pong one spilled 940 bytes a
# thread): its test cases, then bench_cuda_gemm_fp8 --quick (cutlass column
# beside cuBLASLt's in the same run).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c5; mkdir -p $R build
tar -C build -xJf .gpucarry/p6.tar.xz || { echo "unpack failed"; exit 1; }
timeout 40 build/gpu-pack/bench_cuda_gemm_fp8 --quick > $R/gemm_fp8.log 2>&1
echo "bench rc=$? at $(el)s"; grep -E "cutlass" $R/gemm_fp8.log | cut -c1-140
timeout 40 build/gpu-pack/test_cuda_fp8_gemm -k cutlass > $R/test.log 2>&1
echo "test -k cutlass rc=$? at $(el)s: $(tail -1 $R/test.log)"; grep "^FAIL" $R/test.log | head -5 | cut -c1-160
tar -C $OUT -czf $OUT/call5.tgz c5 && rm -rf $R
echo "done at $(el)s"
