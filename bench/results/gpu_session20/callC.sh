#!/bin/bash
# Device call C (session 20, issue 29): the figures of the table, one
# binary, in one call:
#   1. bench_fi_prefill (the --check cases through pg_cuda_fi_prefill_run,
#      lengths 1-32,768, chunked, hd64/128, GQA 1/4/8; then TFLOP/s of
#      FlashInfer's and ours on the shapes) and torch's SDPA (cuDNN,
#      FlashAttention-2) on the same shapes: bench/cuda/sdpa_peer.py;
#   2. time to first token through HTTP (paged serve, bench/bench_serve.py,
#      one client): 4,096 and 32,768 tokens (3 requests each) and 131,000
#      (1), llama3-8b-shape, dummy bf16 weights, bf16 KV: ours, FlashInfer's;
#   3. W1 (1 x 128 in / 256 out) with the default path: session 19's pack
#      against this one (the attention batch gained host fields), twice.
# Packs: .gpucarry/s20.tar.xz, .gpucarry/s19.tar.xz (build/old).
set -u
. bench/gpu_call_lib.sh
call_init cC
[ -x build/gpu-pack/paged ] || unpack s20
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
gpu_name
timeout 200 $G/bench_fi_prefill > $R/fi_bench.log 2>&1
echo "bench_fi_prefill rc=$? at $(el)s"; grep -v "^$" $R/fi_bench.log | tail -17
timeout 120 python3 bench/cuda/sdpa_peer.py > $R/sdpa.log 2>&1
echo "sdpa_peer rc=$? at $(el)s"; cat $R/sdpa.log
save
LD="--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 131072"
for pf in ours flashinfer; do
    [ $(el) -gt 400 ] && break
    PAGED_CUDA_PREFILL=$pf $P serve $LD --port 18400 > $R/serve_ttft_$pf.log 2>&1 &
    pid=$!
    for i in $(seq 1 900); do curl -sf localhost:18400/health > /dev/null && break; sleep 0.2; done
    for n in 4096:3 32768:3 131000:1; do
        len=${n%:*} cnt=${n#*:}
        timeout 100 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 5 --concurrency 1 \
            --num-prompts $cnt --input-len $len --output-len 1 --out $R/ttft_${len}_$pf.json \
            --progress-seconds 0 > $R/ttft_${len}_$pf.txt 2>&1
        echo "TTFT HTTP $len tokens x $cnt, $pf: rc=$? at $(el)s: $(grep -m1 'TTFT' $R/ttft_${len}_$pf.txt)"
        rm -f $R/ttft_${len}_$pf.json.requests
    done
    echo "fi_ran=$(grep -c 'FlashInfer prefill ran' $R/serve_ttft_$pf.log)"
    kill $pid; wait $pid
    save
done
if [ -f .gpucarry/s19.tar.xz ] && [ $(el) -lt 470 ]; then
    mkdir -p build/old && unpack s19 build/old
    write_prompts 128000
    W1D="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
    for b in old new old new; do
        bin=$PWD/build/old/gpu-pack/paged
        [ $b = new ] && bin=$P
        timeout 60 $bin generate $W1D --prompts-file /tmp/w1.jsonl > $R/w1_$b.out 2> $R/w1_$b.log
        echo "W1 bf16 $b build rc=$? at $(el)s: $(summ $R/w1_$b.out)"
    done
    save
fi
echo "done at $(el)s"
