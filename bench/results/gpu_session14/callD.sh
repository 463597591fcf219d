#!/bin/bash
# Session 14, device call D: W1 (bf16 dummy weights, llama3-8b-shape) on
# session 13's build (.gpucarry/p2: paged + lib) against this one (the op
# profiler's hook in the executor and the backend's timer entries; off
# unless PAGED_PROFILE_OPS), old/new alternating twice
# (bench/run_gpu_compare_builds.sh w1).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/cD; mkdir -p $R build
tar -C build -xJf .gpucarry/p2.tar.xz && tar -C build -xJf .gpucarry/q2.tar.xz || { echo "unpack failed"; exit 1; }
mkdir -p build/old && mv build/gpu-pack/paged build/old/paged && cp -r build/gpu-pack/lib build/old/lib && mv build/new/paged build/gpu-pack/paged
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$R/w1 OLD=$PWD/build/old/paged NEW=$PWD/build/gpu-pack/paged REPEAT=2 timeout 200 bash bench/run_gpu_compare_builds.sh w1 > $R/w1_compare.log 2>&1
echo "w1 compare rc=$? at $(el)s"; tail -4 $R/w1_compare.log
tar -C /tmp -czf $OUT/callD.tgz cD
echo "done at $(el)s"
