#!/bin/bash
# Device call G (session 20, for issue 30): call F's profile charged 4.1% of
# a served W4 step to "kv_swap to host", the host KV tier copying evicted
# prefix blocks (on by default on the GPU: docs/engine.md); random prompts
# never reuse them. Served W4 (as call B, 40 s windows) with the host tier
# on (the default) and off (--no-host-kv-cache), one binary, same machine.
# Pack: .gpucarry/s20.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cG
[ -x build/gpu-pack/paged ] || unpack s20
P=$PWD/build/gpu-pack/paged
gpu_name
LD="--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192"
for v in "tier:" "notier:--no-host-kv-cache"; do
    tag=${v%%:*} fl=${v#*:}
    [ $(el) -gt 150 ] && break
    # shellcheck disable=SC2086
    $P serve $LD $fl --port 18400 > $R/serve_$tag.log 2>&1 &
    pid=$!
    for i in $(seq 1 900); do curl -sf localhost:18400/health > /dev/null && break; sleep 0.2; done
    timeout 80 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 4 --input-len 1000 --output-len 256 \
        --concurrency 200 --num-prompts 1200 --max-seconds 40 --drain-seconds 15 --out $R/w4_$tag.json \
        --progress-seconds 0 > $R/w4_$tag.txt 2>&1
    echo "W4 $tag: rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$tag.txt) | offloads $(curl -s localhost:18400/metrics | grep -m1 '^paged:kv_host_offloads_total')"
    kill $pid; wait $pid
    rm -f $R/w4_$tag.json.requests
    save
done
echo "done at $(el)s"
