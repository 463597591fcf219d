#!/bin/bash
# Device call F (session 21, issue 29 step 3): fp8 KV through FlashInfer's
# fp8 kernel (PAGED_CUDA_FI_FP8=1) against ours, to decide its default:
#   1. the runner against the CPU with an fp8 cache in both (test_cuda_runner
#      --kv-cache-dtype fp8: each calibrates its scales; the difference is
#      the CUDA kernels' arithmetic), check 2's models and Gemma 3 (window
#      32), bf16 cache for scale, ours and FlashInfer's;
#   2. W2 1,000 x 1,000/1,000 with fp8 KV (llama3-8b-shape, dummy bf16
#      weights, `paged generate --kv-cache-dtype fp8 --max-num-seqs 512`),
#      PAGED_CUDA_FI_FP8=0 then 1, one binary.
# Packs: .gpucarry/s21.tar.xz, s21r2.tar.xz (test_cuda_runner with
# --kv-cache-dtype; the paged built with it is s21's plus a log line).
set -u
. bench/gpu_call_lib.sh
call_init cF
[ -x build/gpu-pack/paged ] || unpack s21
unpack s21r2
P=$PWD/build/gpu-pack/paged
gpu_name
m64=/tmp/paged-m64 m128=/tmp/paged-m128 g3=/tmp/paged-gemma3
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
python3 tests/gpu/make_random_model.py $m128 --hidden 512 --heads 4 --kv-heads 1 --layers 3 --ffn 1024 \
    --vocab 1003 --dtype f32 --tie --seed 2 > /dev/null
python3 tests/gpu/make_random_model.py $g3 --gemma3 --hidden 512 --layers 6 --ffn 1536 --vocab 1000 --untie \
    --window 32 --seed 3 --heads 8 --kv-heads 2 --head-dim 64 > /dev/null
for m in $m64 $m128 $g3; do
    for v in bf16:0 fp8:0 fp8:1; do
        kv=${v%:*} f=${v#*:}
        L=$R/runner_$(basename $m)_${kv}_$f.log
        PAGED_CUDA_FI_FP8=$f build/gpu-pack/test_cuda_runner $m --kv-cache-dtype $kv --tol 0.1 --gap 0.2 \
            --gap-sigmas 4 > $L 2>&1
        echo "runner $(basename $m) $kv KV, FI_FP8=$f: rc=$? fi8 $(grep -c 'first fp8 KV' $L): $(tail -1 $L | cut -c1-150)"
    done
done
save
write_prompts 128000
D="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --kv-cache-dtype fp8"
for f in 0 1; do
    PAGED_CUDA_FI_FP8=$f timeout 220 $P generate $D --max-num-seqs 512 --prompts-file /tmp/w2.jsonl \
        > $R/w2f8_$f.out 2> $R/w2f8_$f.log
    echo "W2 fp8 KV, PAGED_CUDA_FI_FP8=$f rc=$? at $(el)s: $(summ $R/w2f8_$f.out); fp8 FI ran: $(grep -c 'first fp8 KV' $R/w2f8_$f.log)"
    rm -f $R/w2f8_$f.out
    save
done
echo "done at $(el)s"
