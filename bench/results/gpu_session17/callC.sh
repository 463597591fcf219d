#!/bin/bash
# Device call C (written in session 17, whose device loans were paused; for
# the next session): O's weight to the L2 before RoPE and attention
# (PAGED_CUDA_L2_PREFETCH=1, kernels/cuda/l2_prefetch.cu), off by default
# until this measures it.
#   1. test_cuda_kernels -k "pdl chain" (the chains with the prefetch kernel
#      in the middle, bit for bit) and -k "l2 prefetch";
#   2. bench_cuda_gemv --chain-fp8 --quick and --chain --quick: the W1
#      chain with and without "O to L2" (the tables' last rows);
#   3. W1 end to end (llama3-8b-shape, dummy weights, 128 in / 256 out),
#      bf16 and FP8 weights (--quantization fp8), flag off / on
#      alternating, twice: TPOT.
# Pack: .gpucarry/o3.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cC
unpack ${PACK:-o3}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
for k in "pdl chain" "l2 prefetch"; do
    timeout 120 $G/test_cuda_kernels -k "$k" > "$R/kernels_$k.log" 2>&1
    echo "test_cuda_kernels -k '$k' rc=$? at $(el)s: $(tail -1 "$R/kernels_$k.log")"
    grep -E "^(FAIL|ok)" "$R/kernels_$k.log" | cut -c1-150
done
save
for b in "--chain-fp8" "--chain"; do
    timeout 150 $G/bench_cuda_gemv $b --quick > "$R/gemv$b.log" 2>&1; echo "bench_cuda_gemv $b rc=$? at $(el)s"
    grep -E "^\|" "$R/gemv$b.log" | tail -18
    save
done
write_prompts 128000
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
for i in 1 2; do
    for q in none fp8; do
        for l2 in 0 1; do
            [ $(el) -gt 540 ] && break
            PAGED_CUDA_L2_PREFETCH=$l2 timeout 60 $P generate $LD --quantization $q --prompts-file /tmp/w1.jsonl \
                > $R/w1_${q}_l2${l2}_$i.out 2> $R/w1_${q}_l2${l2}_$i.log
            echo "W1 $q weights, L2 prefetch $l2, run $i rc=$? at $(el)s: $(summ $R/w1_${q}_l2${l2}_$i.out)"
        done
    done
    save
done
echo "done at $(el)s"
