#!/bin/bash
# Device call F (session 18): the CUTLASS configurations c6-c8 (ping-pong
# 64x128 with promotion; ping-pong and cooperative 128x128 with fast
# accumulation, vLLM's schedule) beside c0-c5 and cuBLASLt + rescale:
#   1. test_cuda_fp8_gemm whole (every configuration on the CUTLASS cases);
#   2. bench_cuda_gemm_fp8 --sweep;
#   3. the runner with FP8 weights vs the exact CPU for c7 and cuBLASLt fast;
#   4. W2 400 x 1000/1000, FP8 checkpoint, fp8 KV: cuBLASLt + rescale (the
#      default), cuBLASLt fast accumulation, CUTLASS c7, c8, c6;
#   5. W1 with the FP8 checkpoint: the GEMV's new default for FP8 (kind 1)
#      against kind 2 (the old default).
# Pack: .gpucarry/o4.tar.xz (paged, test_cuda_runner, test_cuda_fp8_gemm,
# bench_cuda_gemm_fp8, lib/).
set -u
. bench/gpu_call_lib.sh
call_init cF
unpack ${PACK:-o4}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 150 $G/test_cuda_fp8_gemm > $R/fp8_gemm.log 2>&1; echo "test_cuda_fp8_gemm rc=$? at $(el)s: $(tail -1 $R/fp8_gemm.log)"
grep -m8 FAIL $R/fp8_gemm.log | cut -c1-200
save
timeout 200 $G/bench_cuda_gemm_fp8 --sweep --json $R/sweep.json > $R/sweep.log 2>&1; echo "sweep rc=$? at $(el)s"
grep -E "^(qkv|o|gate_up|down) +[0-9]+ \|" $R/sweep.log | head -32
save
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
for v in "PAGED_CUDA_FP8_CUTLASS=1 PAGED_CUDA_FP8_CUTLASS_CFG=7" "PAGED_CUDA_FP8_FAST=1" "PAGED_CUDA_FP8_CUTLASS=0"; do
    env $v timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 > "$R/runner_$v.log" 2>&1
    echo "runner fp8 vs exact, $v rc=$? at $(el)s: $(tail -1 "$R/runner_$v.log")"
done
save
timeout 200 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
write_prompts 128000
head -400 /tmp/w2.jsonl > /tmp/w2_400.jsonl
LD="--device cuda --model /tmp/fp8-8b"
i=0
for v in "PAGED_CUDA_FP8_CUTLASS=0" "PAGED_CUDA_FP8_CUTLASS=1 PAGED_CUDA_FP8_CUTLASS_CFG=7" "PAGED_CUDA_FP8_FAST=1" \
         "PAGED_CUDA_FP8_CUTLASS=1 PAGED_CUDA_FP8_CUTLASS_CFG=8" "PAGED_CUDA_FP8_CUTLASS=1 PAGED_CUDA_FP8_CUTLASS_CFG=6"; do
    [ $(el) -gt 300 ] && break
    i=$((i+1))
    env $v timeout 100 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2_400.jsonl > $R/w2_$i.out 2> $R/w2_$i.log
    echo "W2 400 FP8 weights, $v rc=$? at $(el)s: $(summ $R/w2_$i.out)"
    grep -m1 "through CUTLASS" $R/w2_$i.log | cut -c1-160
    save
done
j=0
for k in "" 2 "" 2; do
    [ $(el) -gt 380 ] && break
    j=$((j+1))
    PAGED_CUDA_GEMV_KERNEL=$k timeout 30 $P generate $LD --prompts-file /tmp/w1.jsonl > $R/w1_$j.out 2> $R/w1_$j.log
    echo "W1 FP8 ckpt GEMV kind '${k:-default}' rc=$? at $(el)s: $(summ $R/w1_$j.out)"
done
save
echo "done at $(el)s"
