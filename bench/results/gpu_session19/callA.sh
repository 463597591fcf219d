#!/bin/bash
# Device call A (session 19): issue 33's LoRA on CUDA, then session 18's
# call G (issue 27's shape pick against the default), one binary:
#   1. test_cuda_lora (lora_apply's kernels against the CPU arithmetic) and
#      the runner with three random PEFT adapters against the CPU
#      (test_cuda_runner --lora: bf16, weight-only FP8, W8A8 FP8);
#   2. test_cuda_fp8_gemm whole, the runner's W8A8 checks (--gap 0.2) with
#      the pick (=2) and with c7 everywhere;
#   3. W2 1,000 x 1,000/1,000, FP8 checkpoint, fp8 KV: =2 then =0 (budget
#      for one of each: two starts failed and one machine was taken back
#      this session); W1.
# Pack: .gpucarry/s19.tar.xz (tools/pack_gpu.sh at session 19's merge).
set -u
. bench/gpu_call_lib.sh
call_init cA
unpack ${PACK:-s19}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
gpu_name
timeout 60 $G/test_cuda_lora > $R/lora.txt 2>&1; echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 $R/lora.txt)"
grep -m8 FAIL $R/lora.txt | cut -c1-200
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
L=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
echo "adapters: $L"
timeout 60 $G/test_cuda_runner $m64 --lora "$L" > $R/runner_lora.log 2>&1
echo "runner LoRA bf16 rc=$? at $(el)s: $(tail -1 $R/runner_lora.log | cut -c1-250)"
PAGED_CUDA_FP8_GEMM=0 timeout 60 $G/test_cuda_runner $m64 --lora "$L" --quantization fp8 > $R/runner_lora_fp8wo.log 2>&1
echo "runner LoRA fp8 weight-only rc=$? at $(el)s: $(tail -1 $R/runner_lora_fp8wo.log | cut -c1-250)"
timeout 60 $G/test_cuda_runner $m64 --lora "$L" --quantization fp8 --tol 0.1 --gap 0.2 > $R/runner_lora_fp8.log 2>&1
echo "runner LoRA W8A8 rc=$? at $(el)s: $(tail -1 $R/runner_lora_fp8.log | cut -c1-250)"
save
timeout 100 $G/test_cuda_fp8_gemm > $R/fp8_gemm.log 2>&1; echo "test_cuda_fp8_gemm rc=$? at $(el)s: $(tail -1 $R/fp8_gemm.log)"
grep -m8 FAIL $R/fp8_gemm.log | cut -c1-200
gzip -f $R/fp8_gemm.log
PAGED_CUDA_FP8_CUTLASS=2 timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 --gap 0.2 > $R/runner_pick.log 2>&1
echo "runner W8A8 pick (=2) --gap 0.2 rc=$? at $(el)s: $(tail -1 $R/runner_pick.log | cut -c1-250)"
PAGED_CUDA_FP8_CUTLASS=1 PAGED_CUDA_FP8_CUTLASS_CFG=7 timeout 60 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 \
    --gap 0.2 > $R/runner_c7.log 2>&1
echo "runner W8A8 c7 --gap 0.2 rc=$? at $(el)s: $(tail -1 $R/runner_c7.log | cut -c1-250)"
save
timeout 200 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
write_prompts 128000
LD="--device cuda --model /tmp/fp8-8b"
# W2 1,000 x 1,000/1,000 (the figure): the pick, then the default.
for v in 2 0; do
    [ $(el) -gt 360 ] && break
    PAGED_CUDA_FP8_CUTLASS=$v timeout 110 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2.jsonl > $R/w2_$v.out 2> $R/w2_$v.log
    echo "W2 1000 FP8 weights fp8 KV, PAGED_CUDA_FP8_CUTLASS=$v rc=$? at $(el)s: $(summ $R/w2_$v.out)"
    rm -f $R/w2_$v.out
    save
done
[ $(el) -lt 500 ] && { timeout 30 $P generate $LD --prompts-file /tmp/w1.jsonl > $R/w1.out 2> $R/w1.log
    echo "W1 FP8 ckpt rc=$? at $(el)s: $(summ $R/w1.out)"; }
save
echo "done at $(el)s"
