#!/bin/bash
# Device call G (session 18, not run: no device time left): the shape pick
# (PAGED_CUDA_FP8_CUTLASS=2: cuBLASLt + rescale below 256 rows, CUTLASS c7
# / c8 with fast accumulation above, gemm_fp8_cutlass.cu) against the
# default (=0: cuBLASLt + rescale for every shape), one binary, both set
# explicitly (o5 was packed while =2 was the default; HEAD's is =0):
#   1. test_cuda_fp8_gemm whole (the fast configurations at their k-bound);
#   2. the runner's W8A8 checks as run_gpu_tests.sh now runs them (--gap 0.2;
#      the pick and c7 for every product);
#   3. W2 400 x 1000/1000, FP8 checkpoint, fp8 KV: =2 / =0, alternating,
#      twice; W1 (m = 1: the GEMV, neither path).
# Pack: .gpucarry/o5.tar.xz (paged, test_cuda_runner, test_cuda_fp8_gemm, lib/).
set -u
. bench/gpu_call_lib.sh
call_init cG
unpack ${PACK:-o5}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
gpu_name
timeout 100 $G/test_cuda_fp8_gemm > $R/fp8_gemm.log 2>&1; echo "test_cuda_fp8_gemm rc=$? at $(el)s: $(tail -1 $R/fp8_gemm.log)"
grep -m8 FAIL $R/fp8_gemm.log | cut -c1-200
save
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
PAGED_CUDA_FP8_CUTLASS=2 timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 --gap 0.2 > $R/runner_def.log 2>&1
echo "runner W8A8 pick (=2) --gap 0.2 rc=$? at $(el)s: $(tail -1 $R/runner_def.log)"
PAGED_CUDA_FP8_CUTLASS=1 PAGED_CUDA_FP8_CUTLASS_CFG=7 timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 \
    --gap 0.2 > $R/runner_c7.log 2>&1
echo "runner W8A8 c7 --gap 0.2 rc=$? at $(el)s: $(tail -1 $R/runner_c7.log)"
save
timeout 200 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
write_prompts 128000
w2_prompts 400
LD="--device cuda --model /tmp/fp8-8b"
i=0
for v in "PAGED_CUDA_FP8_CUTLASS=2" "PAGED_CUDA_FP8_CUTLASS=0" "PAGED_CUDA_FP8_CUTLASS=2" "PAGED_CUDA_FP8_CUTLASS=0"; do
    [ $(el) -gt 200 ] && break
    i=$((i+1))
    env $v timeout 80 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2_400.jsonl > $R/w2_$i.out 2> $R/w2_$i.log
    echo "W2 400 FP8 weights, $v rc=$? at $(el)s: $(summ $R/w2_$i.out)"
    save
done
timeout 30 $P generate $LD --prompts-file /tmp/w1.jsonl > $R/w1.out 2> $R/w1.log
echo "W1 FP8 ckpt default rc=$? at $(el)s: $(summ $R/w1.out)"
save
echo "done at $(el)s"
