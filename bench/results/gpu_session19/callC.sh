#!/bin/bash
# Device call C (session 19, issue 27): where the W1 FP8 GEMV chain loses
# against its weight-read floor (67% on an H100 in session 18). The chain
# bench as it is (bench_cuda_gemv --chain-fp8: the layer with each matrix
# left out in turn), then ncu on four consecutive FP8 ring GEMV launches
# inside the chain (QKV + norm, O, gate/up + norm + SiLU, down: one of
# each), with the sections that say what the small matrices wait on.
# Pack: .gpucarry/s19.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cC
unpack ${PACK:-s19}
G=build/gpu-pack
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 150 $G/bench_cuda_gemv --chain-fp8 > $R/chain_fp8.txt 2>&1
echo "chain-fp8 rc=$? at $(el)s"; grep -E "^\|" $R/chain_fp8.txt | head -30 | cut -c1-200
save
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
SEC="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis"
SEC="$SEC --section LaunchStats --section Occupancy --section SchedulerStats"
timeout 240 $NCU --kernel-name regex:gemv_ring_kernel --launch-skip 400 --launch-count 4 $SEC --print-details all \
    $G/bench_cuda_gemv --chain-fp8 --quick > $R/ncu_chain.log 2>&1
echo "ncu chain rc=$? at $(el)s"
grep -E "gemv_ring_kernel|Duration|DRAM Throughput|Memory Throughput|Issued Ipc|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occ|Grid Size|Block Size" \
    $R/ncu_chain.log | cut -c1-150 | head -60
sed -n '/Section: Warp State/,/Section: /p' $R/ncu_chain.log | grep -E "Est\.|stall|Stall" | head -16 | cut -c1-170
save
echo "done at $(el)s"
