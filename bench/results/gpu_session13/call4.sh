#!/bin/bash
# Session 13, device call 4: where the two slow FP8 kernels stall, for the
# next step. ncu with source counters (the top stall locations) on the
# CUTLASS W8A8 kernel (gate/up 28672 x 4096, m = 4096) and on the FP8 GEMV
# at m = 1 (the fused RMSNorm + QKV 6144 x 4096 ring kernel and the plain
# O 4096 x 4096, bench_cuda_gemv --fp8 --quick).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c4; mkdir -p $R build
for p in p4 p5; do tar -C build -xJf .gpucarry/$p.tar.xz || { echo "unpack $p failed"; exit 1; }; done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
SEC="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy"
timeout 150 $NCU --kernel-name-base mangled --kernel-name regex:Sm90ColBroadcast --launch-skip $((73 * 8)) --launch-count 1 \
    $SEC --print-details all build/gpu-pack/bench_cuda_gemm_fp8 --quick > $R/ncu_cutlass.log 2>&1
echo "ncu cutlass rc=$? at $(el)s"
sed -n '/Section: Source Counters/,/Section: /p' $R/ncu_cutlass.log | head -60 | cut -c1-170
# --quick: WARM 10 + 11 x 20 = 230 launches per timing; the first fp8 GEMV
# timed is qkv +norm at m = 1 (the ring kernel, kind 2).
timeout 120 $NCU --kernel-name regex:gemv_ring_kernel --launch-skip 20 --launch-count 1 $SEC --print-details all \
    build/gpu-pack/bench_cuda_gemv --fp8 --quick > $R/ncu_gemv_qkv.log 2>&1
echo "ncu gemv qkv rc=$? at $(el)s"
grep -E "Duration|DRAM Throughput|Memory Throughput|Issued Ipc|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occ|Dynamic Shared" $R/ncu_gemv_qkv.log | head -12 | cut -c1-150
sed -n '/Section: Warp State/,/Section: /p' $R/ncu_gemv_qkv.log | grep -E "Est\.|stalled|Stall|cycles" | head -12 | cut -c1-170
sed -n '/Section: Source Counters/,/Section: /p' $R/ncu_gemv_qkv.log | head -40 | cut -c1-170
tar -C $OUT -czf $OUT/call4.tgz c4 && rm -rf $R
echo "done at $(el)s"
