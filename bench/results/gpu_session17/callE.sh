#!/bin/bash
# Device call E (session 18): what call B could not run because
# --quantization fp8 refuses --load-format dummy: an FP8 checkpoint of the
# llama3-8b shape (tests/gpu/make_fp8_model.py), then W2 400 x 1000/1000 with
# fp8 KV under cuBLASLt + rescale / CUTLASS picked by shape / CUTLASS c0
# (PAGED_CUDA_FP8_CUTLASS=0/2/1), then W1 with the FP8 checkpoint: L2 prefetch
# 0/1 and GEMV kind 2/1. Pack: .gpucarry/o3.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cE
unpack ${PACK:-o3}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"; tail -2 $R/make_fp8.log
write_prompts 128000
head -400 /tmp/w2.jsonl > /tmp/w2_400.jsonl
LD="--device cuda --model /tmp/fp8-8b"
for cut in 0 2 1; do
    [ $(el) -gt 400 ] && break
    PAGED_CUDA_FP8_CUTLASS=$cut timeout 120 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2_400.jsonl > $R/w2_fp8_c$cut.out 2> $R/w2_fp8_c$cut.log
    echo "W2 400 FP8 weights, PAGED_CUDA_FP8_CUTLASS=$cut rc=$? at $(el)s: $(summ $R/w2_fp8_c$cut.out)"
    tail -2 $R/w2_fp8_c$cut.log | cut -c1-200
    save
done
for i in 1 2; do
    for v in "PAGED_CUDA_L2_PREFETCH=0" "PAGED_CUDA_L2_PREFETCH=1" "PAGED_CUDA_GEMV_KERNEL=1"; do
        [ $(el) -gt 540 ] && break
        env $v timeout 60 $P generate $LD --prompts-file /tmp/w1.jsonl > $R/w1_${v}_$i.out 2> $R/w1_${v}_$i.log
        echo "W1 FP8 ckpt $v run $i rc=$? at $(el)s: $(summ $R/w1_${v}_$i.out)"
    done
    save
done
echo "done at $(el)s"
