#!/bin/bash
# Device call M (session 23; issue 33), written after call L found the
# grouped kernels slower: BGMV is the default again (staged in every call,
# as before), the grouped kernels behind PAGED_CUDA_LORA_SGMV=1.
#   1. test_cuda_lora: every case for both shapes, the staged path and
#      each row alone bit for bit;
#   2. test_cuda_runner --lora: three adapters + none against the CPU (the
#      default shape);
#   3. llama3-8b-shape dummy weights through HTTP, session 22's build
#      (paged_old) and this one in the same call: W1 naming one rank-16
#      adapter, served W4 at 100 clients over 8 adapters, 30 s windows.
# Packs: .gpucarry/s26.tar.xz (paged, test_cuda_runner, test_cuda_lora,
# lib; build it from the commit to measure: sh tools/pack_gpu.sh, then
# tar -cf - gpu-pack/{paged,test_cuda_runner,test_cuda_lora,lib} in
# build/ | xz -T1 --lzma2=preset=6,dict=256MiB), .gpucarry/s25old.tar.xz
# (session 22's paged alone as gpu-pack/paged_old).
set -u
. bench/gpu_call_lib.sh
call_init cM
[ -x build/gpu-pack/paged ] || unpack s26
[ -x build/gpu-pack/paged_old ] || unpack s25old
K=$PWD/build/gpu-pack
gpu_name
lora_checks $K
save
mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json /tmp/lora8b --many 8 2> $R/lora_make.txt)
[ -n "$mods" ] || { echo "adapters not written: $(cat $R/lora_make.txt)"; exit 1; }
names8=$(echo $mods | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
LORA="--enable-lora --max-loras 8 --max-lora-rank 16 --lora-modules $mods"
for run in new old; do
    [ $(el) -gt 200 ] && { echo "stopped before $run at $(el)s"; break; }
    [ $run = new ] && P=$K/paged || P=$K/paged_old
    # shellcheck disable=SC2086
    serve_up $R/serve_$run.log $LD $LORA || continue
    w1_http w1_$run --model a0
    w4 w4_$run --concurrency 100 --model $names8 --max-seconds 30 --drain-seconds 15
    echo "W4 100 clients 30 s $run rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$run.txt)"
    grep -E '^ *(TTFT|TPOT)' $R/w4_$run.txt | head -2
    serve_down
    rm -f $R/*.json.requests
    save
done
echo "done at $(el)s"
