#!/bin/bash
# Device call B (session 20, issue 29): served figures with FlashInfer's
# prefill (PAGED_CUDA_PREFILL=flashinfer) against ours, one binary,
# llama3-8b-shape, dummy bf16 weights, bf16 KV, HTTP (bench/bench_serve.py):
#   1. W4: 1,000 in / 256 out, 200 clients, 60 s window;
#   2. W3: Poisson 24 req/s, in U[512,1536], out U[64,512], 40 s of arrivals.
# Pack: .gpucarry/s20.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cB
[ -x build/gpu-pack/paged ] || unpack ${PACK:-s20}
P=$PWD/build/gpu-pack/paged
gpu_name
LD="--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192"
serve_bench() { # NAME PREFILL bench_serve args...
    local name=$1 pf=$2
    shift 2
    PAGED_CUDA_PREFILL=$pf $P serve $LD --port 18400 > $R/serve_$name.log 2>&1 &
    local pid=$!
    for i in $(seq 1 900); do curl -sf localhost:18400/health > /dev/null && break; sleep 0.2; done
    echo "serve $name up at $(el)s"
    timeout 130 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 4 --out $R/$name.json \
        --progress-seconds 0 "$@" > $R/$name.txt 2>&1
    echo "$name rc=$? at $(el)s fi_ran=$(grep -c 'FlashInfer prefill ran' $R/serve_$name.log)"; head -8 $R/$name.txt
    kill $pid; wait $pid
    rm -f $R/$name.json.requests
    save
}
for pf in ours flashinfer; do
    [ $(el) -gt 330 ] && break
    serve_bench w4_$pf $pf --input-len 1000 --output-len 256 --concurrency 200 --num-prompts 1616 \
        --max-seconds 60 --drain-seconds 30
done
for pf in ours flashinfer; do
    [ $(el) -gt 470 ] && break
    serve_bench w3_$pf $pf --input-len 512:1536 --output-len 64:512 --request-rate 24 --num-prompts 960 \
        --max-seconds 40 --drain-seconds 25
done
echo "done at $(el)s"
