#!/bin/bash
# Session 8, device call 5 (the last): the qgemv cases with the corrected
# bound, FP8 / int4 weights without the removed development gate (runner
# against the CPU twin), paged plan against the start-up with FP8 weights,
# and W1 with FP8 weights.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c5; mkdir -p $R build
rm -rf build/gpu-pack; tar -C build -xJf .gpucarry/new.tar.xz
xz -dc .gpucarry/final/tck.xz > /tmp/tck && chmod +x /tmp/tck
echo "unpacked at $(el)s"
timeout 120 /tmp/tck -k qge > $R/qkernels.log 2>&1
echo "q* kernel cases rc=$? at $(el)s: $(grep -c '^ok' $R/qkernels.log) ok, $(grep -c '^FAIL' $R/qkernels.log) FAIL"
grep '^FAIL' $R/qkernels.log | head -5
grep -E '^ok +qgemv' $R/qkernels.log | awk '{print $(NF-2)}' | sort -g | tail -1 | sed 's/^/worst qgemv max_rel: /'
python3 tests/gpu/make_random_model.py /tmp/m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
for q in fp8 int4; do
    timeout 60 build/gpu-pack/test_cuda_runner /tmp/m64 --quantization $q --json $R/runner_$q.json > $R/runner_$q.log 2>&1
    echo "runner $q rc=$?: $(tail -c 260 $R/runner_$q.json)"
done
timeout 100 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
P=build/gpu-pack/paged
DEVMEM=$(python3 -c "import subprocess; m=int(subprocess.check_output(['nvidia-smi','--query-gpu=memory.total','--format=csv,noheader,nounits']).split()[0]); print('%.4fG' % (m / 1024))")
for kv in auto fp8; do
    $P plan --device cuda --model /tmp/fp8-8b --device-memory $DEVMEM --kv-cache-dtype $kv --json > $R/plan_$kv.json 2>&1
    $P plan --device cuda --model /tmp/fp8-8b --device-memory $DEVMEM --kv-cache-dtype $kv > $R/plan_$kv.txt 2>&1
    $P serve --device cuda --model /tmp/fp8-8b --kv-cache-dtype $kv --port 18210 > $R/serve_$kv.log 2>&1 &
    pid=$!
    for i in $(seq 1 400); do curl -sf localhost:18210/health >/dev/null && break; sleep 0.2; done
    curl -s localhost:18210/metrics | grep -E '^paged:device_memory_bytes' > $R/metrics_$kv.txt
    kill $pid; wait $pid
    echo "plan $kv at $(el)s: plan $(grep -E '^KV cache:' $R/plan_$kv.txt | cut -c1-80) | serve $(grep -h 'KV cache on' $R/serve_$kv.log | head -1 | cut -c20-120)"
    grep -E "^  (weights|workspace)" $R/plan_$kv.txt
    grep -E "device memory:" $R/serve_$kv.log | cut -c20-260
done
python3 - <<'PY' > /tmp/w1.jsonl
import json, random
r = random.Random(1)
print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(128)], "max_tokens": 256, "temperature": 0, "ignore_eos": True}))
PY
for i in 1 2; do
    PAGED_CUDA_TIMING=1 timeout 90 $P generate --device cuda --model /tmp/fp8-8b --prompts-file /tmp/w1.jsonl > $R/w1fp8_$i.out 2> $R/w1fp8_$i.log
    echo "w1 fp8 run $i rc=$? at $(el)s: tpot_ms $(python3 -c "import json; print(json.loads(open('$R/w1fp8_$i.out').readline())['tpot_ms'])")"
done
grep -h "cuda timing" $R/w1fp8_2.log | cut -c1-400
tar -C $OUT -czf $OUT/call5.tgz c5 && rm -rf $R
echo "done at $(el)s"
