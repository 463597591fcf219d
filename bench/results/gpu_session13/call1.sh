#!/bin/bash
# Session 13, device call 1 (issue 27): the FP8 GEMV for 1-8 rows (gemv.cu,
# PAGED_CUDA_FP8_GEMV) against its CPU references and qgemv.cu, its kernel
# table; the CUTLASS one-pass W8A8 kernel rebuilt with -DNDEBUG (ptxas had
# serialized its wgmma pipeline at assert calls) in bench_cuda_gemm_fp8 beside
# torch._scaled_mm; the runner against the CPU with FP8 weights on each path.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c1; mkdir -p $R build
tar -C build -xJf .gpucarry/p1.tar.xz || { echo "unpack failed"; exit 1; }
echo "unpacked at $(el)s"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee $R/smi.txt
G=build/gpu-pack
timeout 200 $G/test_cuda_fp8_gemm > $R/fp8_test.log 2>&1
echo "test_cuda_fp8_gemm rc=$? at $(el)s: $(tail -1 $R/fp8_test.log)"
grep -E "^FAIL" $R/fp8_test.log | head -20 | cut -c1-220
grep -E "vs (qgemv|unfused)" $R/fp8_test.log | head -4 | cut -c1-200
timeout 90 $G/bench_cuda_gemv --fp8 --quick > $R/gemv_fp8.log 2>&1
echo "bench gemv --fp8 rc=$? at $(el)s"; grep "^|" $R/gemv_fp8.log
timeout 100 $G/bench_cuda_gemm_fp8 > $R/gemm_fp8.log 2>&1
echo "bench gemm fp8 rc=$? at $(el)s"; grep -E "cutlass" $R/gemm_fp8.log | head -40 | cut -c1-200
timeout 100 python3 bench/cuda/scaled_mm_peer.py --json $R/peer.json > $R/peer.log 2>&1
echo "peer rc=$? at $(el)s"; tail -30 $R/peer.log | cut -c1-160
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
for v in 0 1; do
    PAGED_CUDA_FP8_GEMV=$v timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 > $R/runner_gemv$v.log 2>&1
    echo "runner fp8 FP8_GEMV=$v rc=$?: $(tail -1 $R/runner_gemv$v.log | cut -c1-250)"
done
PAGED_CUDA_FP8_GEMV=1 PAGED_CUDA_FP8_CUTLASS=1 timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 > $R/runner_cutlass.log 2>&1
echo "runner fp8 FP8_GEMV=1 CUTLASS=1 rc=$?: $(tail -1 $R/runner_cutlass.log | cut -c1-250)"
tar -C $OUT -czf $OUT/call1.tgz c1 && rm -rf $R
echo "done at $(el)s"
