#!/bin/bash
# Session 8, device call 6: paged plan against the start-up with FP8
# weights after the planner counts their row scales and the dequantize
# scratch; W2 256 x 1000/1000 with --cpu-offload-gb 6 against the
# transfer bound (utilization 0.32: the KV cache holds the 256 sequences).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c6; mkdir -p $R build
rm -rf build/gpu-pack; tar -C build -xJf .gpucarry/new.tar.xz
echo "unpacked at $(el)s"
P=$PWD/build/gpu-pack/paged
timeout 100 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
DEVMEM=$(python3 -c "import subprocess; m=int(subprocess.check_output(['nvidia-smi','--query-gpu=memory.total','--format=csv,noheader,nounits']).split()[0]); print('%.4fG' % (m / 1024))")
for kv in auto; do
    $P plan --device cuda --model /tmp/fp8-8b --device-memory $DEVMEM --kv-cache-dtype $kv --json > $R/plan_$kv.json 2>&1
    $P plan --device cuda --model /tmp/fp8-8b --device-memory $DEVMEM --kv-cache-dtype $kv > $R/plan_$kv.txt 2>&1
    $P serve --device cuda --model /tmp/fp8-8b --kv-cache-dtype $kv --port 18210 > $R/serve_$kv.log 2>&1 &
    pid=$!
    for i in $(seq 1 400); do curl -sf localhost:18210/health >/dev/null && break; sleep 0.2; done
    curl -s localhost:18210/metrics | grep -E '^paged:device_memory_bytes' > $R/metrics_$kv.txt
    kill $pid; wait $pid
    echo "plan $kv at $(el)s: plan $(grep -E '^KV cache:' $R/plan_$kv.txt | cut -c1-80) | serve $(grep -h 'KV cache on' $R/serve_$kv.log | head -1 | cut -c20-100)"
    python3 -c "
import json,re
p=json.load(open('$R/plan_$kv.json'))['plan']['ranks'][0]
m={re.search('category=\"(\w+)\"',l).group(1): int(l.split()[-1]) for l in open('$R/metrics_$kv.txt')}
print('weights plan', p['weights_bytes'], 'serve', m.get('weights'), '| workspace plan', p['workspace_bytes'], 'serve', m.get('workspace'), '| other serve', m.get('other'), 'graphs serve', m.get('graphs'))"
done
printf '#!/bin/sh\nexec %s "$@" --gpu-memory-utilization 0.32 --cpu-offload-gb 6 --max-model-len 4096\n' "$P" > /tmp/paged-off
chmod +x /tmp/paged-off
PAGED=/tmp/paged-off OUT=$R/w2off KV_DTYPE=fp8 W2_N=256 W2_LEN=1000 W2_ARGS="--max-num-seqs 256" timeout 240 \
    bash bench/run_gpu_bench.sh w2 > $R/w2off.log 2>&1
echo "w2 offload rc=$? at $(el)s"
grep -hE "cpu offload|KV cache on" $R/w2off.log | cut -c1-300
tail -4 $R/w2off.log
tar -C $OUT -czf $OUT/call6.tgz c6 && rm -rf $R
echo "done at $(el)s"
