#!/bin/bash
# Session 11, device call 1: the FP8 GEMM (issue 27 step 1) against its CPU
# reference and beside cuBLAS bf16 and torch._scaled_mm in the same call,
# then every GPU check of the new build (issue 28's item 00, first half).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c1; mkdir -p $R build
tar -C build -xJf .gpucarry/p1.tar.xz || { echo "unpack failed"; exit 1; }
echo "unpacked at $(el)s"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/smi.txt; cat $R/smi.txt
ls /usr/local/cuda/lib64/libcublasLt.so.* 2>/dev/null | head -3
timeout 150 build/gpu-pack/test_cuda_fp8_gemm > $R/fp8_gemm_test.log 2>&1
echo "fp8 gemm test rc=$? at $(el)s"; grep -E "^FAIL" $R/fp8_gemm_test.log | head -20; tail -1 $R/fp8_gemm_test.log
timeout 150 build/gpu-pack/bench_cuda_gemm_fp8 > $R/bench_fp8.log 2>&1
echo "bench rc=$? at $(el)s"; sed -n '/^per layer/,$p' $R/bench_fp8.log; grep -i error $R/bench_fp8.log | head -3
timeout 120 python3 bench/cuda/scaled_mm_peer.py --json $R/peer.json > $R/peer.log 2>&1
echo "peer rc=$? at $(el)s"; grep -E "^(gate_up|down) .* (1024|4096|8192) " $R/peer.log; tail -1 $R/peer.log
# The GPU checks (kernels, fp8 gemm again, runner incl. fp8 W8A8, generate, serve, watchdog).
left=$(( 560 - $(el) ))
OUT=$R/gt timeout $left bash tests/gpu/run_gpu_tests.sh > $R/gpu_tests.log 2>&1
echo "gpu_tests rc=$? at $(el)s"
sed -n '/^== summary/,$p' $R/gpu_tests.log | cut -c1-300
grep -E "^FAIL" $R/gpu_tests.log | head -20 | cut -c1-200
tar -C $OUT -czf $OUT/call1.tgz c1 && rm -rf $R
echo "done at $(el)s"
