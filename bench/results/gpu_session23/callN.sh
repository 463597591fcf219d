#!/bin/bash
# Device call N (session 23, the budget's last 200 s): the committed LoRA
# code (3a8d868: BGMV the default, staged in every call as before; the
# grouped kernels behind PAGED_CUDA_LORA_SGMV=1) against its references:
# test_cuda_lora over both shapes, and test_cuda_runner --lora (three
# adapters + none against the CPU) in each shape.
# Pack: .gpucarry/s27t.tar.xz (test_cuda_runner, test_cuda_lora, lib).
set -u
. bench/gpu_call_lib.sh
call_init cN
[ -x build/gpu-pack/test_cuda_lora ] || unpack s27t
K=$PWD/build/gpu-pack
gpu_name
timeout 60 $K/test_cuda_lora > $R/lora_kernels.txt 2>&1
echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 $R/lora_kernels.txt)"
grep -E "^FAIL|staged" $R/lora_kernels.txt | head -12
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
lora_dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
for sg in 0 1; do
    PAGED_CUDA_LORA_SGMV=$sg timeout 60 $K/test_cuda_runner $m64 --lora "$lora_dirs" > $R/runner_lora_$sg.txt 2>&1
    echo "runner LoRA SGMV=$sg rc=$? at $(el)s: $(tail -1 $R/runner_lora_$sg.txt | cut -c1-200)"
done
save
echo "done at $(el)s"
