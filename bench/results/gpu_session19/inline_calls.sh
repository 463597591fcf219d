#!/bin/bash
# Session 19: the device calls made inline (the `run` tool's command line)
# after callA.sh, on the same warm H100, as they were run; logs in the
# folders of the same names. Not meant to be run as one script: each
# block was one call.

# cH2 + cD: FlashInfer's sm90 prefill beside ours, then callD.sh (the replay draft).
. bench/gpu_call_lib.sh; call_init cH2; unpack s19
timeout 150 build/gpu-pack/bench_fi_prefill > $R/fi_prefill.txt 2>&1; echo "bench_fi_prefill rc=$? at $(el)s"
tail -25 $R/fi_prefill.txt; save
timeout 330 bash bench/results/gpu_session19/callD.sh

# cD2 + cC: the replay recorded from a replayed run at k 8, then callC.sh (the W1 FP8 chain, ncu).
. bench/gpu_call_lib.sh; call_init cD2; unpack s19
[ -f /tmp/draft-128k/config.json ] || python3 tests/gpu/make_random_model.py /tmp/draft-128k --vocab 128256 \
    --hidden 1024 --layers 4 --heads 16 --kv-heads 4 --ffn 2816 > /dev/null
RECORD_K=8 OUT=$R/spec timeout 100 bash bench/spec_replay.sh /tmp/draft-128k --device cuda --load-format dummy \
    --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 2048 > $R/spec.txt 2>&1
save
timeout 300 bash bench/results/gpu_session19/callC.sh

# cB2: served W4 with FP8 weights, =2 then =0.
. bench/gpu_call_lib.sh; call_init cB2; unpack s19; P=$PWD/build/gpu-pack/paged
for v in 2 0; do
    PAGED_CUDA_FP8_CUTLASS=$v $P serve --model /tmp/fp8-8b --port 18400 > $R/serve_$v.log 2>&1 &
    pid=$!
    for i in $(seq 1 900); do curl -sf localhost:18400/health > /dev/null && break; sleep 0.2; done
    timeout 110 python3 bench/bench_serve.py --port 18400 --input-len 1000 --output-len 256 --concurrency 200 \
        --num-prompts 1616 --warmup 0 --max-seconds 60 --drain-seconds 30 --seed 4 --out $R/w4_$v.json \
        --progress-seconds 0 > $R/w4_$v.txt 2>&1
    kill $pid; wait $pid; save
done

# cL: test_cuda_lora under memcheck.
. bench/gpu_call_lib.sh; call_init cL; unpack s19
timeout 150 compute-sanitizer --tool memcheck build/gpu-pack/test_cuda_lora > $R/lora_memcheck.txt 2>&1; save

# cL2: W8A8 under LoRA against the CPU's W8A8 mode, and again against the exact CPU.
. bench/gpu_call_lib.sh; call_init cL2; unpack s19; G=build/gpu-pack; m64=/tmp/paged-m64
L=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
timeout 60 $G/test_cuda_runner $m64 --lora "$L" --quantization fp8 --cpu-matmul quant --tol 0.1 --gap 0.2 > $R/r_quant.log 2>&1
timeout 60 $G/test_cuda_runner $m64 --lora "$L" --quantization fp8 --tol 0.1 --gap 0.2 > $R/again.log 2>&1; save

# cA2: W2 1000 with FP8 weights, =0 then =2 (callA.sh's order reversed).
. bench/gpu_call_lib.sh; call_init cA2; unpack s19; P=$PWD/build/gpu-pack/paged; write_prompts 128000
for v in 0 2; do
    PAGED_CUDA_FP8_CUTLASS=$v timeout 105 $P generate --device cuda --model /tmp/fp8-8b --kv-cache-dtype fp8 \
        --max-num-seqs 512 --prompts-file /tmp/w2.jsonl > $R/w2_$v.out 2> $R/w2_$v.log
    echo "W2 1000 FP8 =$v: $(summ $R/w2_$v.out)"; rm -f $R/w2_$v.out; save
done
