#!/bin/bash
# Device call B (written in session 17, whose device loans were paused; for
# the next session): the one-pass CUTLASS W8A8 kernel's configurations.
#   1. test_cuda_fp8_gemm whole (every configuration on the CUTLASS cases,
#      swizzle/raster knobs, refusals; cuBLASLt path, GEMV, quantizers);
#   2. bench_cuda_gemm_fp8 --sweep (every config x swizzle x raster against
#      cuBLASLt + rescale, Llama-3-8B matrices, m 64..8192; ~70 s) and
#      torch's _scaled_mm (rowwise) on the same shapes, same machine;
#   3. the runner with FP8 weights, W8A8 against the CPU's W8A8
#      (--cpu-matmul quant, PAGED_CUDA_QGEMV=0: every step W8A8) for cuBLASLt
#      and for the CUTLASS kernel, and against the exact CPU (the
#      run_gpu_tests check) for both;
#   4. W2 with FP8 weights under cuBLASLt + rescale and CUTLASS (c0, and
#      picked by shape: PAGED_CUDA_FP8_CUTLASS=2).
# Pack: .gpucarry/o3.tar.xz (tools/pack_gpu.sh's programs at 4f6333c, recompressed:
# docs/gpu_checklist.md).
set -u
. bench/gpu_call_lib.sh
call_init cB
unpack ${PACK:-o3}
G=build/gpu-pack
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 150 $G/test_cuda_fp8_gemm > $R/fp8_gemm.log 2>&1; echo "test_cuda_fp8_gemm rc=$? at $(el)s: $(tail -1 $R/fp8_gemm.log)"
grep -m8 FAIL $R/fp8_gemm.log
save
timeout 200 $G/bench_cuda_gemm_fp8 --sweep --json $R/sweep.json > $R/sweep.log 2>&1; echo "sweep rc=$? at $(el)s"
grep -E "^(qkv|o|gate_up|down|sweep)" $R/sweep.log | head -40
save
timeout 120 python3 bench/cuda/scaled_mm_peer.py --json $R/torch.json > $R/torch.log 2>&1; echo "torch peer rc=$? at $(el)s"
tail -20 $R/torch.log
save
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
for cut in 0 1; do
    PAGED_CUDA_FP8_CUTLASS=$cut PAGED_CUDA_QGEMV=0 timeout 60 $G/test_cuda_runner $m64 --quantization fp8 \
        --cpu-matmul quant --json $R/runner_q_c$cut.json > $R/runner_q_c$cut.log 2>&1
    echo "runner fp8 W8A8 vs cpu quant, cutlass=$cut rc=$? at $(el)s: $(tail -1 $R/runner_q_c$cut.log)"
    PAGED_CUDA_FP8_CUTLASS=$cut timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 \
        --json $R/runner_x_c$cut.json > $R/runner_x_c$cut.log 2>&1
    echo "runner fp8 default vs cpu exact, cutlass=$cut rc=$? at $(el)s: $(tail -1 $R/runner_x_c$cut.log)"
    save
done
# 4. W2 with FP8 weights (quantized at load) and fp8 KV, 400 x 1000/1000, 512
#    sequences: cuBLASLt + rescale, CUTLASS c0, CUTLASS picked by shape
#    (PAGED_CUDA_FP8_CUTLASS=0/1/2), as far as the call's time allows.
write_prompts 128000
head -400 /tmp/w2.jsonl > /tmp/w2_400.jsonl
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --quantization fp8"
for cut in 0 2 1; do
    [ $(el) -gt 440 ] && break
    PAGED_CUDA_FP8_CUTLASS=$cut timeout 120 $G/paged generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2_400.jsonl > $R/w2_fp8_c$cut.out 2> $R/w2_fp8_c$cut.log
    echo "W2 400 FP8 weights, PAGED_CUDA_FP8_CUTLASS=$cut rc=$? at $(el)s: $(summ $R/w2_fp8_c$cut.out)"
    save
done
echo "done at $(el)s"
