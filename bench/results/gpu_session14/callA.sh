#!/bin/bash
# Session 14, device call A (issue 27), everything in one call (device
# machines were scarce: several starts failed), most wanted first, the logs
# re-packed into $OUT/callA.tgz after each stage (a call cut short by the
# device budget still brings back what it did):
#  1. bench_cuda_gemm_fp8 --quick: the CUTLASS W8A8 kernel on the
#     cooperative schedule beside cuBLASLt + rescale;
#  2. an FP8 checkpoint of llama3-8b-shape, then 600 of W2's 1,000 requests
#     (1000 in / 1000 out, fp8 KV, 512 sequences) under PAGED_PROFILE_OPS=1
#     with --cuda-graphs off: where a step's device time goes, op by op;
#  3. W2 1000 x 1000/1000 as run (graphs on, no profiler);
#  4. bench_cuda_gemv --chain-fp8 --quick: the W1 chain with FP8 weights;
#  5. the runner against the CPU with FP8 weights, cuBLASLt and CUTLASS;
#  6. W1 (128 in / 256 out) with FP8 weights.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/cA; mkdir -p $R build
save() { tar -C /tmp -czf $OUT/callA.tgz cA; }
for p in q1 p7 p8; do tar -C build -xJf .gpucarry/$p.tar.xz || { echo "unpack $p failed"; exit 1; }; done
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 60 $G/bench_cuda_gemm_fp8 --quick > $R/gemm_fp8.log 2>&1
echo "gemm bench rc=$? at $(el)s"; grep -iE "cutlass|^\| *m|^\| ---" $R/gemm_fp8.log | cut -c1-170 | head -30
save
timeout 120 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
python3 - <<'PY' > /tmp/w2q.jsonl
import json, random
r = random.Random(2)
for _ in range(1000):
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(1000)], "max_tokens": 1000,
                      "temperature": 0, "ignore_eos": True}))
PY
head -600 /tmp/w2q.jsonl > /tmp/w2q600.jsonl
w2() { # NAME LIMIT PROMPTS EXTRA-ARGS ENV...
    local name=$1 lim=$2 prompts=$3 extra=$4; shift 4
    env "$@" timeout $lim $P generate --device cuda --model /tmp/fp8-8b --kv-cache-dtype fp8 --max-num-seqs 512 $extra \
        --prompts-file $prompts > $R/w2_$name.out 2> $R/w2_$name.log
    echo "w2 $name rc=$? at $(el)s: $(python3 -c "
import json
rows=[json.loads(l) for l in open('$R/w2_$name.out') if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
e=sum(1 for r in rows if 'error' in r)
print(len(rows),'requests', n, 'tokens', round(t,3), 's', round(n/t), 'output tok/s from submission', e, 'errors')")"
    grep -E "WARN|ERROR" $R/w2_$name.log | head -3
    rm -f $R/w2_$name.out
}
# The table is written at exit, which a timeout would lose: 600 requests.
w2 profiled 150 /tmp/w2q600.jsonl "--cuda-graphs off" PAGED_PROFILE_OPS=1
grep -A40 "op profile, cuda" $R/w2_profiled.log 2>/dev/null | cut -c20-140 | head -40
save
w2 default 130 /tmp/w2q.jsonl "" PAGED_CUDA_FP8_CUTLASS=0
save
timeout 100 $G/bench_cuda_gemv --chain-fp8 --quick > $R/chain_fp8.log 2>&1
echo "chain-fp8 rc=$? at $(el)s"; grep -E "^\|" $R/chain_fp8.log | head -14
save
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
for c in 0 1; do
    PAGED_CUDA_FP8_CUTLASS=$c timeout 40 $G/test_cuda_runner $m64 --quantization fp8 --tol 0.1 > $R/runner_cutlass$c.log 2>&1
    echo "runner fp8 cutlass=$c rc=$?: $(tail -1 $R/runner_cutlass$c.log | cut -c1-250)"
done
python3 - <<'PY' > /tmp/w1.jsonl
import json, random
r = random.Random(1)
print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(128)], "max_tokens": 256, "temperature": 0, "ignore_eos": True}))
PY
timeout 40 $P generate --device cuda --model /tmp/fp8-8b --prompts-file /tmp/w1.jsonl > $R/w1.out 2> $R/w1.log
echo "w1 fp8 rc=$? at $(el)s: $(python3 -c "
import json
r=json.loads(open('$R/w1.out').readline())
print('tpot_ms', round(r.get('tpot_ms'),4), 'ttft_ms', round(r.get('ttft_ms'),2), 'tokens', r.get('completion_tokens'))" 2>&1)"
save
echo "done at $(el)s"
