#!/bin/bash
# Device call F (session 20, for issue 30's "profile first"): where a served
# W4 step's time goes, op by op (PAGED_PROFILE_OPS=1, docs/profiling.md;
# --cuda-graphs off so every op is seen), llama3-8b-shape, dummy bf16
# weights, bf16 KV, 1,000 in / 256 out, 200 clients, 40 s window: with our
# prefill, then with FlashInfer's. The table is in the server's log at exit.
# Pack: .gpucarry/s20.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cF
[ -x build/gpu-pack/paged ] || unpack s20
P=$PWD/build/gpu-pack/paged
gpu_name
LD="--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192 --cuda-graphs off"
for pf in ours flashinfer; do
    [ $(el) -gt 200 ] && break
    PAGED_PROFILE_OPS=1 PAGED_CUDA_PREFILL=$pf $P serve $LD --port 18400 > $R/serve_prof_$pf.log 2>&1 &
    pid=$!
    for i in $(seq 1 900); do curl -sf localhost:18400/health > /dev/null && break; sleep 0.2; done
    timeout 90 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 4 --input-len 1000 --output-len 256 \
        --concurrency 200 --num-prompts 1200 --max-seconds 40 --drain-seconds 20 --out $R/w4_prof_$pf.json \
        --progress-seconds 0 > $R/w4_prof_$pf.txt 2>&1
    echo "W4 profiled, $pf: rc=$? at $(el)s: $(grep -m1 'output' $R/w4_prof_$pf.txt)"
    kill -TERM $pid; wait $pid
    rm -f $R/w4_prof_$pf.json.requests
    sed -n '/op profile/,$p' $R/serve_prof_$pf.log | head -32 | cut -c1-150
    save
done
echo "done at $(el)s"
