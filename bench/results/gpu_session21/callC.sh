#!/bin/bash
# Device call C (session 21, issue 29 steps 2-3): served W4 (1,000 in / 256
# out, 200 clients, 60 s, bench/bench_serve.py) old build against new, then
# fp8 KV on the new build: 32,768-token TTFT through HTTP with paged's
# prefill (the default for fp8 KV) and with FlashInfer's fp8 kernel
# (PAGED_CUDA_FI_FP8=1); llama3-8b-shape, dummy bf16 weights.
# Packs: .gpucarry/s21.tar.xz, s20p.tar.xz (build/old: session 20's paged).
set -u
. bench/gpu_call_lib.sh
call_init cC
[ -x build/gpu-pack/paged ] || unpack s21
# the old paged alone (s20p: session 20's paged), with the new pack's lib/
[ -x build/old/gpu-pack/paged ] || { mkdir -p build/old && unpack s20p build/old && ln -s ../../gpu-pack/lib build/old/gpu-pack/lib; }
NEW=$PWD/build/gpu-pack/paged OLD=$PWD/build/old/gpu-pack/paged
gpu_name
for b in old new; do
    P=$OLD; [ $b = new ] && P=$NEW
    serve_up $R/serve_w4_$b.log --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192 ||
        continue
    w4 w4_$b
    echo "W4 $b rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$b.txt)"
    grep -E "TTFT|TPOT" $R/w4_$b.txt | head -3
    serve_down
    save
done
P=$NEW
LD="--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 40000 --kv-cache-dtype fp8"
for f in 0 1; do
    [ $(el) -gt 500 ] && break
    export PAGED_CUDA_FI_FP8=$f
    serve_up $R/serve_f8_$f.log $LD || continue
    for n in 4096:3 32768:3; do
        len=${n%:*} cnt=${n#*:}
        timeout 60 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 5 --concurrency 1 \
            --num-prompts $cnt --input-len $len --output-len 1 --out $R/f8ttft_${len}_$f.json \
            --progress-seconds 0 > $R/f8ttft_${len}_$f.txt 2>&1
        echo "TTFT fp8 KV $len x $cnt, PAGED_CUDA_FI_FP8=$f at $(el)s: $(grep -E '^ *TTFT' $R/f8ttft_${len}_$f.txt | head -1)"
        rm -f $R/f8ttft_${len}_$f.json.requests
    done
    echo "fp8 FI ran: $(grep -c 'first fp8 KV launch' $R/serve_f8_$f.log)"
    serve_down
    save
done
echo "done at $(el)s"
