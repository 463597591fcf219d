#!/bin/bash
# Device call L (session 23; issues 33 and 34), one machine:
#   1. test_cuda_lora: the grouped LoRA kernels (stage + route once, shrink
#      and expand by tiles of one adapter's rows) against the host
#      reference, the staged path and each row alone bit for bit;
#   2. test_cuda_runner --lora: three adapters + none against the CPU;
#   3. issue 34: the Gemma 3 head_dim 256 runner with an fp8 cache (the
#      logprob rule now takes the flip band; mismatches printed) through
#      FlashInfer's fp8 kernel and ours, and the 12B shape's W1 without
#      PAGED_CUDA_HD256 (the flag is gone);
#   4. issue 33's figures, llama3-8b-shape dummy weights through HTTP, the
#      old build (session 22's BGMV kernels, paged_old) and the new in this
#      call: W1 naming one rank-16 adapter, served W4 at 100 clients spread
#      over 8 adapters; W4 without LoRA (new build).
# Packs: .gpucarry/s25.tar.xz (paged, test_cuda_runner, test_cuda_lora,
# lib), .gpucarry/s25old.tar.xz (gpu-pack/paged_old).
set -u
. bench/gpu_call_lib.sh
call_init cL
[ -x build/gpu-pack/paged ] || unpack s25
[ -x build/gpu-pack/paged_old ] || unpack s25old
K=$PWD/build/gpu-pack
gpu_name
timeout 120 $K/test_cuda_lora > $R/lora_kernels.txt 2>&1
echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 $R/lora_kernels.txt)"
grep -E "^FAIL|staged" $R/lora_kernels.txt | head -12
save
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
lora_dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
timeout 120 $K/test_cuda_runner $m64 --lora "$lora_dirs" > $R/runner_lora.txt 2>&1
echo "runner LoRA rc=$? at $(el)s: $(tail -1 $R/runner_lora.txt | cut -c1-200)"
g=/tmp/g3w
python3 tests/gpu/make_random_model.py $g --gemma3 --hidden 512 --layers 6 --ffn 1536 --vocab 1000 --untie \
    --window 32 --seed 3 --heads 4 --kv-heads 1 --head-dim 256 > /dev/null
for f8 in 1 0; do
    PAGED_CUDA_FI_FP8=$f8 timeout 120 $K/test_cuda_runner $g --kv-cache-dtype fp8 --tol 0.1 --gap 0.2 --gap-sigmas 4 \
        > $R/runner_hd256_fp8_$f8.txt 2>&1
    echo "runner hd256 fp8 KV FI_FP8=$f8 rc=$? at $(el)s: $(tail -1 $R/runner_hd256_fp8_$f8.txt | cut -c1-200)"
    grep -o "\[[A-F][^]]*logprob[^]]*\]" $R/runner_hd256_fp8_$f8.txt | head -4
done
timeout 120 $K/test_cuda_runner $g --gap 0.2 > $R/runner_hd256.txt 2>&1
echo "runner hd256 bf16 rc=$? at $(el)s: $(tail -1 $R/runner_hd256.txt | cut -c1-200)"
write_prompts 262000
env -u PAGED_CUDA_HD256 timeout 90 $K/paged generate --device cuda --load-format dummy \
    --hf-config tests/gpu/gemma3-12b-shape.json --prompts-file /tmp/w1.jsonl > $R/w1_12b.out 2> $R/w1_12b.log
echo "12B W1 (no flag) rc=$? at $(el)s: $(summ $R/w1_12b.out)"
save
L=/tmp/lora8b
mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json $L --many 8 2> $R/lora_make.txt)
[ -n "$mods" ] || { echo "adapters not written: $(cat $R/lora_make.txt)"; exit 1; }
names8=$(echo $mods | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
LORA="--enable-lora --max-loras 8 --max-lora-rank 16 --lora-modules $mods"
w1_http() { # NAME [--model M]
    local name=$1
    shift
    timeout 60 python3 bench/bench_serve.py --port 18400 --warmup 1 --seed 3 --concurrency 1 --num-prompts 3 \
        --input-len 128 --output-len 256 --progress-seconds 0 --out $R/$name.json "$@" > $R/$name.txt 2>&1
    echo "W1 HTTP $name rc=$? at $(el)s: $(grep -E "^ *TPOT" $R/$name.txt | head -1)"
    rm -f $R/$name.json.requests
}
for run in new old new_none; do
    [ $(el) -gt 360 ] && { echo "stopped before $run at $(el)s"; break; }
    case $run in
    new) P=$K/paged extra="$LORA" ;;
    old) P=$K/paged_old extra="$LORA" ;;
    new_none) P=$K/paged extra="" ;;
    esac
    # shellcheck disable=SC2086
    serve_up $R/serve_$run.log $LD $extra || continue
    models=""
    if [ $run != new_none ]; then
        w1_http w1_$run --model a0
        models="--model $names8"
    fi
    # shellcheck disable=SC2086
    w4 w4_$run --concurrency 100 $models
    echo "W4 100 clients $run rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$run.txt)"
    grep -E '^ *(TTFT|TPOT)' $R/w4_$run.txt | head -2
    serve_down
    save
done
echo "done at $(el)s"
