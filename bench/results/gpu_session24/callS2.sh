#!/bin/bash
# NOT RUN in session 24 (no machine could be started for it). Its build
# is main at 9013a96 plus lora_graph_pdl.patch (beside this script:
# `git apply bench/results/gpu_session24/lora_graph_pdl.patch`), packed
# as .gpucarry/s31.tar.xz by tools/pack_gpu.sh and the tar line of callP.sh.
# Device call S2 (session 24; issue 33): call S cut to fit the budget's
# last 300 s: test_cuda_lora and the LoRA runner check on the fourth build
# (both graph-safe kernels launched with PDL: the chunk of A and the row of
# B asked of the L2 before the wait; the expand's chunk loads four at a
# time), then W1 naming one adapter, this build and session 22's.
# Packs: .gpucarry/s31.tar.xz (this build), .gpucarry/s25old.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cS
[ -x build/gpu-pack/paged ] || unpack s31
[ -x build/gpu-pack/paged_old ] || unpack s25old
K=$PWD/build/gpu-pack
gpu_name
lora_checks $K 0
grep -E "graph" $R/lora_kernels.txt | head -4
save
mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json /tmp/lora8b --many 1 2> $R/lora_make.txt)
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
LORA="--enable-lora --max-loras 1 --max-lora-rank 16 --lora-modules $mods"
for run in new old; do
    [ $run = old ] && P=$K/paged_old || P=$K/paged
    # shellcheck disable=SC2086
    serve_up $R/serve_$run.log $LD $LORA --max-model-len 4096 || continue
    w1_http w1_$run --model a0
    serve_down
    rm -f $R/*.json.requests
    save
done
echo "done at $(el)s"
