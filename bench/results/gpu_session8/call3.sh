#!/bin/bash
# Session 8, device call 3: the host KV tier's TTFT on the H200 (issue 15),
# paged plan against the start-up (auto and fp8 KV), W2 with fp8 scales 1.0
# (the cost of the scales), and W1 with FP8 weights (an 8B FP8 checkpoint
# made here) when call 1's qgemv/qgemm cases passed.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c3; mkdir -p $R build
[ -x build/gpu-pack/paged ] || tar -C build -xJf .gpucarry/new.tar.xz
echo "unpacked at $(el)s"
P=$PWD/build/gpu-pack/paged CFG=tests/gpu/llama3-8b-shape.json
COMMON="--device cuda --load-format dummy --hf-config $CFG"
# 1. host tier TTFT: 4 GiB of bf16 KV (32k tokens), ten 4k prompts evict the prefix.
for mode in tier notier; do
    extra=""; [ $mode = notier ] && extra="--swap-space 0"
    port=18200; [ $mode = notier ] && port=18201
    $P serve $COMMON --kv-cache-memory 4G --max-model-len 16384 --port $port $extra > $R/serve_$mode.log 2>&1 &
    pid=$!
    for i in $(seq 1 300); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.2; done
    timeout 120 python3 bench/bench_prefix_tier.py --port $port --prefix-len 4096 --evict 10 --rounds 3 --vocab 128000 \
        > $R/tier_$mode.txt 2>&1
    curl -s localhost:$port/metrics | grep -E "^paged:(prefix_cache_host_hits_total|prefix_cache_hits_total|kv_host_offloads_total|host_kv_cache_blocks)" >> $R/tier_$mode.txt
    kill $pid; wait $pid
    echo "tier $mode at $(el)s: $(head -1 $R/tier_$mode.txt)"
done
# 2. plan against the start-up, auto and fp8 KV (the card's size as the driver reports it, GiB).
DEVMEM=$(python3 -c "import subprocess; m=int(subprocess.check_output(['nvidia-smi','--query-gpu=memory.total','--format=csv,noheader,nounits']).split()[0]); print('%.4fG' % (m / 1024))")
for kv in auto fp8; do
    $P plan $COMMON --device-memory $DEVMEM \
        --kv-cache-dtype $kv --json > $R/plan_$kv.json 2> $R/plan_$kv.err
    $P plan $COMMON --device-memory $DEVMEM \
        --kv-cache-dtype $kv > $R/plan_$kv.txt 2>&1
    $P serve $COMMON --kv-cache-dtype $kv --port 18202 > $R/serve_plan_$kv.log 2>&1 &
    pid=$!
    for i in $(seq 1 300); do curl -sf localhost:18202/health >/dev/null && break; sleep 0.2; done
    kill $pid; wait $pid
    echo "plan $kv at $(el)s: $(grep -h 'KV cache on' $R/serve_plan_$kv.log | head -1 | cut -c1-160)"
done
# 3. W2 with --kv-cache-scales one (the build as served ran in call 2).
printf '#!/bin/sh\nexec %s "$@" --kv-cache-scales one\n' "$P" > /tmp/paged-one; chmod +x /tmp/paged-one
if [ $(el) -lt 300 ]; then
    PAGED=/tmp/paged-one OUT=$R/w2one KV_DTYPE=fp8 W2_ARGS="--max-num-seqs 512" timeout 105 bash bench/run_gpu_bench.sh w2 \
        > $R/w2one.log 2>&1
    echo "w2 scales one at $(el)s: $(grep -h 'W2 output tok/s from submission' $R/w2one.log)"
fi
# 4. FP8 weights: W1 on an FP8 checkpoint of the 8B shape (needs call 1's qgemv pass).
if [ -f /tmp/qgemv_ok ] && [ $(el) -lt 420 ]; then
    timeout 150 python3 tests/gpu/make_fp8_model.py $CFG /tmp/fp8-8b > $R/make_fp8.log 2>&1
    echo "fp8 checkpoint rc=$? at $(el)s"
    python3 - <<'PY' > /tmp/w1fp8.jsonl
import json, random
r = random.Random(1)
print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(128)], "max_tokens": 256, "temperature": 0, "ignore_eos": True}))
PY
    PAGED_CUDA_QUANT=1 PAGED_CUDA_TIMING=1 timeout 90 $P generate --device cuda --model /tmp/fp8-8b \
        --prompts-file /tmp/w1fp8.jsonl > $R/w1fp8.out 2> $R/w1fp8.log
    echo "w1 fp8 rc=$? at $(el)s: $(cut -c1-400 $R/w1fp8.out)"
    grep -E "weights|memory:|cuda timing" $R/w1fp8.log | head -5
else
    echo "fp8 W1 skipped (qgemv marker $( [ -f /tmp/qgemv_ok ] && echo yes || echo no ), at $(el)s)"
fi
tar -C $OUT -czf $OUT/call3.tgz c3 && rm -rf $R
echo "done at $(el)s"
