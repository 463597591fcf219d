#!/bin/bash
# Device call B (session 21, issue 29 step 2): old build (session 20's pack:
# paged's prefill by default) against this one (FlashInfer's by default),
# the same machine, one call, llama3-8b-shape, dummy bf16 weights, bf16 KV:
#   1. W1 (1 x 128 in / 256 out), old new old new;
#   2. W2 1,000 x 1,000/1,000 (paged generate), old then new;
#   3. time to first token through HTTP, one client: 4,096 and 32,768
#      tokens (3 requests each), 131,000 (1), old then new.
# Packs: .gpucarry/s21.tar.xz, .gpucarry/s20.tar.xz (build/old).
set -u
. bench/gpu_call_lib.sh
call_init cB
[ -x build/gpu-pack/paged ] || unpack s21
[ -x build/old/gpu-pack/paged ] || { mkdir -p build/old && unpack s20 build/old; }
NEW=$PWD/build/gpu-pack/paged OLD=$PWD/build/old/gpu-pack/paged
gpu_name
write_prompts 128000
D="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
for b in old new old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    timeout 60 $bin generate $D --prompts-file /tmp/w1.jsonl > $R/w1_$b.out 2> $R/w1_$b.log
    echo "W1 $b rc=$? at $(el)s: $(summ $R/w1_$b.out)"
done
save
for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    timeout 200 $bin generate $D --max-num-seqs 512 --prompts-file /tmp/w2.jsonl > $R/w2_$b.out 2> $R/w2_$b.log
    echo "W2 bf16 KV $b rc=$? at $(el)s: $(summ $R/w2_$b.out); fi ran: $(grep -c 'FlashInfer prefill ran' $R/w2_$b.log)"
    rm -f $R/w2_$b.out
    save
done
LD="--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 131072"
for b in old new; do
    [ $(el) -gt 480 ] && break
    P=$OLD; [ $b = new ] && P=$NEW
    serve_up $R/serve_ttft_$b.log $LD || continue
    for n in 4096:3 32768:3 131000:1; do
        len=${n%:*} cnt=${n#*:}
        timeout 60 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 5 --concurrency 1 \
            --num-prompts $cnt --input-len $len --output-len 1 --out $R/ttft_${len}_$b.json \
            --progress-seconds 0 > $R/ttft_${len}_$b.txt 2>&1
        echo "TTFT HTTP $len x $cnt, $b at $(el)s: $(grep -E '^ *TTFT' $R/ttft_${len}_$b.txt | head -1)"
        rm -f $R/ttft_${len}_$b.json.requests
    done
    serve_down
    save
done
echo "done at $(el)s"
