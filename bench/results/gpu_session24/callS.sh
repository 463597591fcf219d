#!/bin/bash
# NOT RUN in session 24 (no machine could be started for it). Its build
# is main at 9013a96 plus lora_graph_pdl.patch (beside this script:
# `git apply bench/results/gpu_session24/lora_graph_pdl.patch`), packed
# as .gpucarry/s31.tar.xz by tools/pack_gpu.sh and the tar line of callP.sh.
# Device call S (session 24; issue 33): call R again over the fourth build
# (both graph-safe kernels launched with PDL: the chunk of A and the row of
# B asked of the L2 before the wait; the expand's chunk loads four at a
# time). Call R's build: call Q again over the third build
# (the shrink in chunks of 1,024 columns, a CTA each; the test's table
# set-up fixed), without the eager W4 run. Call Q's build:
# the graph-safe shrink takes every rank a thread (A in flight at once)
# and the RMSNorm of the fused base product (no rmsnorm kernels).
#   1. test_cuda_lora: every case of both eager shapes, and "lora graph":
#      the graph-safe op (kernels/cuda/lora_graph.cu, the norm fused)
#      against the fp64 reference, and replayed from one captured graph
#      over two slot patterns and a rewritten slot table bit for bit
#      against its eager runs;
#   2. test_cuda_runner --lora: three adapters + none against the CPU; its
#      decode-only steps (4-23) now replay the LoRA set's graphs;
#      with PAGED_CUDA_LORA_SGMV=0 and =1 (the eager steps' shapes);
#   3. llama3-8b-shape dummy weights through HTTP, session 22's build
#      (paged_old: LoRA steps eager) and this one in the same call: W1 with
#      no adapter and naming one rank-16 adapter, served W4 at 100 clients
#      over 8 adapters, 30 s windows; and W4 with PAGED_LORA_DEV_EAGER=1
#      (eager LoRA steps through the graph-safe op too), whose runner
#      check also runs.
# Packs: .gpucarry/s31.tar.xz (paged, test_cuda_runner, test_cuda_lora,
# lib from this build: sh tools/pack_gpu.sh, then in build/ tar -cf -
# gpu-pack/{paged,test_cuda_runner,test_cuda_lora,lib} | xz -T1
# --lzma2=preset=6,dict=256MiB), .gpucarry/s25old.tar.xz (session 22's
# paged alone as gpu-pack/paged_old).
set -u
. bench/gpu_call_lib.sh
call_init cS
[ -x build/gpu-pack/paged ] || unpack s31
[ -x build/gpu-pack/paged_old ] || unpack s25old
K=$PWD/build/gpu-pack
gpu_name
lora_checks $K 0 1
PAGED_LORA_DEV_EAGER=1 timeout 120 $K/test_cuda_runner /tmp/paged-m64 --lora "$(ls -d /tmp/paged-m64-lora/* | paste -sd,)" > $R/runner_lora_deveager.txt 2>&1
echo "runner LoRA DEV_EAGER=1 rc=$? at $(el)s: $(tail -1 $R/runner_lora_deveager.txt | cut -c1-200)"
grep -E "graph" $R/lora_kernels.txt | head -4
grep -iE "graphs" $R/runner_lora_0.txt | head -3
save
mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json /tmp/lora8b --many 8 2> $R/lora_make.txt)
[ -n "$mods" ] || { echo "adapters not written: $(cat $R/lora_make.txt)"; exit 1; }
names8=$(echo $mods | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
LORA="--enable-lora --max-loras 8 --max-lora-rank 16 --lora-modules $mods"
for run in new old; do
    [ $(el) -gt 420 ] && { echo "stopped before $run at $(el)s"; break; }
    [ $run = old ] && P=$K/paged_old || P=$K/paged
    [ $run = eager ] && export PAGED_LORA_DEV_EAGER=1 || unset PAGED_LORA_DEV_EAGER
    # shellcheck disable=SC2086
    serve_up $R/serve_$run.log $LD $LORA || continue
    grep -E "graphs" $R/serve_$run.log | head -2
    if [ $run != eager ]; then
        w1_http w1base_$run
        w1_http w1_$run --model a0
    fi
    w4 w4_$run --concurrency 100 --model $names8 --max-seconds 30 --drain-seconds 15
    echo "W4 100 clients 30 s $run rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$run.txt)"
    grep -E '^ *(TTFT|TPOT)' $R/w4_$run.txt | head -2
    serve_down
    grep -E "graph" $R/serve_$run.log | tail -2
    rm -f $R/*.json.requests
    save
done
echo "done at $(el)s"
