#!/bin/bash
# Session 11, device call 4 (issue 27 step 3): the quantization fused into the
# RMSNorm (before QKV, gate/up) and the SiLU * mul (before down): the kernel
# tests, the runner, then W2 with FP8 weights + fp8 KV on the fused build
# against call 2's build (22c1938: a separate quantization pass), alternating
# new, old, new; then served W4 (1000 in / 256 out, 200 clients, 60 s) with
# FP8 weights if time is left.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c4; mkdir -p $R build
tar -C build -xJf .gpucarry/p4.tar.xz && tar -C build -xJf .gpucarry/old4.tar.xz || { echo "unpack failed"; exit 1; }
cp -r build/gpu-pack/lib build/old/lib
P=$PWD/build/gpu-pack/paged OLDP=$PWD/build/old/paged
timeout 120 build/gpu-pack/test_cuda_fp8_gemm > $R/fp8_gemm_test.log 2>&1
echo "fp8 gemm test rc=$? at $(el)s"; grep -E "^FAIL" $R/fp8_gemm_test.log | head -10 | cut -c1-220
grep -E "(rmsnorm|silu_mul)_quant" $R/fp8_gemm_test.log | cut -c1-200 | head -14; tail -1 $R/fp8_gemm_test.log
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
timeout 60 build/gpu-pack/test_cuda_runner $m64 --quantization fp8 --tol 0.1 > $R/runner_w8a8.log 2>&1
echo "runner fp8 W8A8 rc=$?: $(tail -1 $R/runner_w8a8.log | cut -c1-250)"
timeout 150 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
python3 - <<'PY' > /tmp/w2q.jsonl
import json, random
r = random.Random(2)
for _ in range(1000):
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(1000)], "max_tokens": 1000,
                      "temperature": 0, "ignore_eos": True}))
PY
w2() { # NAME BINARY
    timeout 120 $2 generate --device cuda --model /tmp/fp8-8b --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2q.jsonl > $R/w2_$1.out 2> $R/w2_$1.log
    echo "w2 $1 rc=$? at $(el)s: $(python3 -c "
import json
rows=[json.loads(l) for l in open('$R/w2_$1.out') if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
e=sum(1 for r in rows if 'error' in r)
print(len(rows),'requests', n, 'tokens', round(t,3), 's', round(n/t), 'output tok/s from submission', e, 'errors')")"
    grep -E "WARN|bf16 product" $R/w2_$1.log | head -3
    rm -f $R/w2_$1.out
}
w2 fused1 $P
w2 sep1 $OLDP
w2 fused2 $P
if [ $(el) -lt 420 ]; then
    $P serve --model /tmp/fp8-8b --port 18400 > $R/serve_w4.log 2>&1 &
    pid=$!
    for i in $(seq 1 600); do curl -sf localhost:18400/health >/dev/null && break; sleep 0.2; done
    echo "serve up at $(el)s"
    timeout 110 python3 bench/bench_serve.py --port 18400 --input-len 1000 --output-len 256 --concurrency 200 \
        --num-prompts 1616 --warmup 0 --max-seconds 60 --drain-seconds 30 --seed 4 --out $R/w4_fp8.json \
        --progress-seconds 0 > $R/w4_fp8.txt 2>&1
    echo "w4 rc=$? at $(el)s"; head -8 $R/w4_fp8.txt
    kill $pid; wait $pid
fi
rm -f $R/w4_fp8.json.requests
tar -C $OUT -czf $OUT/call4.tgz c4 && rm -rf $R
echo "done at $(el)s"
