#!/bin/bash
# Session 11, device call 2: the W8A8 product as rebuilt after call 1 (cuBLASLt
# e4m3 with scalar scales, then a rescale pass): its test against the CPU
# reference, its benchmark, the runner against the CPU with it; then W2
# (1000 x 1000/1000, fp8 KV) with FP8 weights on
# an FP8 checkpoint of llama3-8b-shape, the bf16 path of large batches
# (PAGED_CUDA_FP8_GEMM=0: dequantize + bf16 cuBLASLt, what HEAD did) against
# the W8A8 product, same binary, same call; then W1 with FP8 weights.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c2; mkdir -p $R build
tar -C build -xJf .gpucarry/p2.tar.xz || { echo "unpack failed"; exit 1; }
P=$PWD/build/gpu-pack/paged
timeout 120 build/gpu-pack/test_cuda_fp8_gemm > $R/fp8_gemm_test.log 2>&1
echo "fp8 gemm test rc=$? at $(el)s"; grep -E "^FAIL" $R/fp8_gemm_test.log | head -10 | cut -c1-200; tail -1 $R/fp8_gemm_test.log
timeout 100 build/gpu-pack/bench_cuda_gemm_fp8 > $R/bench_fp8.log 2>&1
echo "bench rc=$? at $(el)s"; grep -E "^(gate_up|down) .* (1024|4096) " $R/bench_fp8.log; sed -n '/^per layer/,$p' $R/bench_fp8.log
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
for f in 0 1; do
    PAGED_CUDA_FP8_GEMM=$f timeout 60 build/gpu-pack/test_cuda_runner $m64 --quantization fp8 --tol 0.1 --json $R/runner_fp8_$f.json > $R/runner_fp8_$f.log 2>&1
    echo "runner fp8 FP8_GEMM=$f rc=$?: $(tail -1 $R/runner_fp8_$f.log | cut -c1-250)"
done
timeout 150 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
python3 - <<'PY' > /tmp/w2q.jsonl
import json, random
r = random.Random(2)
for _ in range(1000):
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(1000)], "max_tokens": 1000,
                      "temperature": 0, "ignore_eos": True}))
PY
w2() { # NAME ENV...
    local name=$1; shift
    env "$@" timeout 170 $P generate --device cuda --model /tmp/fp8-8b --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2q.jsonl > $R/w2_$name.out 2> $R/w2_$name.log
    echo "w2 $name rc=$? at $(el)s: $(python3 -c "
import json
rows=[json.loads(l) for l in open('$R/w2_$name.out') if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
e=sum(1 for r in rows if 'error' in r)
print(len(rows),'requests', n, 'tokens', round(t,3), 's', round(n/t), 'output tok/s from submission', e, 'errors')")"
    grep -E "FP8|fp8 gemm|bf16 product|scratch" $R/w2_$name.log | head -3
}
w2 w8a8 PAGED_CUDA_FP8_GEMM=1
w2 deq PAGED_CUDA_FP8_GEMM=0
python3 - <<'PY' > /tmp/w1fp8.jsonl
import json, random
r = random.Random(1)
print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(128)], "max_tokens": 256, "temperature": 0, "ignore_eos": True}))
PY
PAGED_CUDA_TIMING=1 timeout 60 $P generate --device cuda --model /tmp/fp8-8b --prompts-file /tmp/w1fp8.jsonl > $R/w1fp8.out 2> $R/w1fp8.log
echo "w1 fp8 rc=$? at $(el)s: $(cut -c1-300 $R/w1fp8.out)"
if [ $(el) -lt 380 ]; then w2 w8a8_fast PAGED_CUDA_FP8_GEMM=1 PAGED_CUDA_FP8_FAST=1; fi
tar -C $OUT -czf $OUT/call2.tgz c2 && rm -rf $R
echo "done at $(el)s"
