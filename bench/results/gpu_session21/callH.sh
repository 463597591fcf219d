#!/bin/bash
# Device call H (session 21, issue 29): what limits FlashInfer's prefill at
# 0.83-0.92x cuDNN's rate on 2 x 8,192 and 8 x 4,096 (call A): ncu on one
# bf16 launch of each (bench_fi_prefill --no-check --quick: 12 FlashInfer
# launches a shape, the plan's first, 2 warm-up, 3 x 3 timed; shape 2 is
# launches 12-23, shape 3 24-35; our kernel's launches have another name).
# Pack: .gpucarry/s22.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cH
[ -x build/gpu-pack/paged ] || unpack s22
G=build/gpu-pack
gpu_name
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
SEC="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
SEC="$SEC --section LaunchStats --section Occupancy --section SchedulerStats"
for sk in 13:2x8192 25:8x4096; do
    skip=${sk%:*} name=${sk#*:}
    timeout 100 $NCU --kernel-name regex:PrefillWithKVCacheKernel --launch-skip $skip --launch-count 1 $SEC \
        --print-details all $G/bench_fi_prefill --no-check --quick > $R/ncu_$name.log 2>&1
    echo "== ncu $name rc=$? at $(el)s"
    grep -E "PrefillWithKVCacheKernel<|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issued Ipc|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occ|Grid Size|Block Size|Dynamic Shared|Pipe Util|Tensor" \
        $R/ncu_$name.log | cut -c1-140 | head -30
    sed -n '/Section: Warp State/,/Section: /p' $R/ncu_$name.log | grep -E "Est\.|stall|Stall" | head -8 | cut -c1-170
    save
done
echo "done at $(el)s"
