#!/bin/bash
# Session 14, device call C: the GPU kernel tests after the review's
# refactor of their helpers (max_rel, gemv_out, norm_rows_ref and
# refusals_ok now in tests/gpu/gpu_util.h): test_cuda_kernels whole and
# test_cuda_fp8_gemm whole (its CUTLASS cases on the cooperative schedule).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/cC; mkdir -p $R build
tar -C build -xJf .gpucarry/p9.tar.xz || { echo "unpack failed"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 build/gpu-pack/test_cuda_kernels > $R/kernels.log 2>&1
echo "test_cuda_kernels rc=$? at $(el)s: $(tail -1 $R/kernels.log)"; grep -E "^FAIL" $R/kernels.log | head -8 | cut -c1-200
timeout 150 build/gpu-pack/test_cuda_fp8_gemm > $R/fp8.log 2>&1
echo "test_cuda_fp8_gemm rc=$? at $(el)s: $(tail -1 $R/fp8.log)"; grep -E "^FAIL" $R/fp8.log | head -8 | cut -c1-200
grep -iE "cutlass" $R/fp8.log | head -4 | cut -c1-160
tar -C $OUT -czf $OUT/callC.tgz cC && rm -rf $R
echo "done at $(el)s"
