#!/bin/bash
# Device call D (written in session 17, whose device loans were paused; for
# the next session): what tests/gpu/run_gpu_tests.sh runs, whole: the kernel
# programs (test_cuda_kernels, test_cuda_moe, test_cuda_gemma_ops; the FP8
# GEMM program is call B's) on their own clocks, then the script with
# --skip-kernels (runner checks, generate cpu/cuda, async, L2 prefetch (3d),
# fp8 KV, serve, watchdog, -tp 1 NCCL, Gemma 3/2 with layer groups).
# Pack: .gpucarry/o3.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cD
unpack ${PACK:-o3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
for t in test_cuda_kernels test_cuda_moe test_cuda_gemma_ops; do
    timeout 200 build/gpu-pack/$t > $R/$t.log 2>&1; echo "$t rc=$? at $(el)s: $(tail -1 $R/$t.log)"
    grep -m10 "^FAIL" $R/$t.log
    save
done
OUT=$R timeout 330 bash tests/gpu/run_gpu_tests.sh --skip-kernels > $R/run_gpu_tests.log 2>&1
echo "run_gpu_tests.sh --skip-kernels rc=$? at $(el)s"
grep -E "^(PASS|FAIL|skipped)" $R/run_gpu_tests.log | head -60
sed -n '/== summary/,$p' $R/run_gpu_tests.log
save
