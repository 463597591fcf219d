#!/bin/bash
# Device call N (session 23, the budget's last 200 s): the committed LoRA
# code (BGMV the default, staged in every call as before; the
# grouped kernels behind PAGED_CUDA_LORA_SGMV=1) against its references:
# test_cuda_lora over both shapes, and test_cuda_runner --lora (three
# adapters + none against the CPU) in each shape.
# Pack: .gpucarry/s27t.tar.xz (test_cuda_runner, test_cuda_lora, lib),
# built from the commit measured: sh tools/pack_gpu.sh, then in build/
# tar -cf - gpu-pack/{test_cuda_runner,test_cuda_lora,lib} | xz -T1
# --lzma2=preset=6,dict=256MiB.
set -u
. bench/gpu_call_lib.sh
call_init cN
[ -x build/gpu-pack/test_cuda_lora ] || unpack s27t
K=$PWD/build/gpu-pack
gpu_name
lora_checks $K 0 1
save
echo "done at $(el)s"
