#!/bin/bash
# Session 13, device call 3: W2 (1000 x 1000/1000, llama3-8b-shape, bf16
# dummy weights, bench/run_gpu_bench.sh) on session 11's build against this
# session's, one call (session 12's runner changes, KV layer groups with
# CUDA at one group, and this session's GEMV changes must keep bf16 speed).
# First ncu on the CUTLASS W8A8 kernel (gate/up 28672 x 4096 at m = 4096 in
# bench_cuda_gemm_fp8 --quick), which runs at a quarter of cuBLASLt's rate.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c3; mkdir -p $R build
for p in p2 p4 old; do tar -C build -xJf .gpucarry/$p.tar.xz || { echo "unpack $p failed"; exit 1; }; done
cp -r build/gpu-pack/lib build/old/lib
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
# quick: m in {64, 1024, 4096}, 3 + 7 x 10 launches each; gate_up is the third shape.
timeout 150 $NCU --kernel-name-base mangled --kernel-name regex:Sm90ColBroadcast --launch-skip $((73 * 8)) --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis build/gpu-pack/bench_cuda_gemm_fp8 --quick > $R/ncu_cutlass.log 2>&1
echo "ncu rc=$? at $(el)s"
grep -E "Duration|Throughput|Registers|Shared Memory Config|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Stall|Issued Ipc|No Eligible|Warp Cycles Per Issued|Waves" $R/ncu_cutlass.log | head -40 | cut -c1-160
OUT=$R/w2 OLD=$PWD/build/old/paged NEW=$PWD/build/gpu-pack/paged REPEAT=1 timeout 330 bash bench/run_gpu_compare_builds.sh w2 > $R/w2.log 2>&1
echo "w2 compare rc=$? at $(el)s"; tail -3 $R/w2.log
tar -C $OUT -czf $OUT/call3.tgz c3 && rm -rf $R
echo "done at $(el)s"
