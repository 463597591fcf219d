#!/bin/bash
# Session 15, device call D (issue 31): after call C, the switch to 64-row
# tiles at 16 pairs an expert (was 32) and the 16 x 64 x 128 variant gone:
#  1. test_cuda_moe (bf16 and FP8 experts);
#  2. the runner against the CPU with FP8 weights, weight-only throughout
#     (PAGED_CUDA_FP8_GEMM=0), at bf16's bound;
#  3. bench_cuda_moe at m 256-1024 (the switch);
#  4. Qwen3-30B-A3B shape W1, and W2 1000 x 1000/1000 at 512 sequences
#     (call C: 8,488 tok/s with the old switch).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/cD; mkdir -p $R build
save() { tar -C /tmp -czf $OUT/callD.tgz cD; }
tar -C build -xJf .gpucarry/${PACK:-m4}.tar.xz || { echo "unpack failed"; exit 1; }
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 120 $G/test_cuda_moe > $R/test_moe.log 2>&1; echo "test_cuda_moe rc=$? at $(el)s"; grep FAIL $R/test_moe.log | head; tail -1 $R/test_moe.log
for v in "qwen3 16 16 128 2" "mixtral 8 8 512 3"; do
    read -r arch ne nk nf nl <<<"$v"
    d=/tmp/moe-$arch-$ne-$nk
    python3 tests/gpu/make_random_model.py $d --hidden 512 --heads 8 --kv-heads 2 --head-dim 64 --layers $nl \
        --vocab 1000 --dtype bf16 --moe $arch --experts $ne --top-k $nk --moe-ffn $nf --seed 6 > /dev/null
    PAGED_CUDA_FP8_GEMM=0 timeout 60 $G/test_cuda_runner $d --quantization fp8 > $R/runner_${arch}_fp8.log 2>&1; rc=$?
    echo "runner $arch $ne/top-$nk fp8 weight-only rc=$rc: $(tail -1 $R/runner_${arch}_fp8.log | cut -c1-200)"
done
timeout 60 $G/bench_cuda_moe --shape qwen3 --m 1,64,256,512,1024,2048 > $R/bench_moe.log 2>&1; echo "bench rc=$? at $(el)s"
grep -E "^\|" $R/bench_moe.log | head -9
save
python3 - <<'PY'
import json, random
r = random.Random(1)
with open('/tmp/w1.jsonl', 'w') as f:
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(128)], "max_tokens": 256, "temperature": 0, "ignore_eos": True}), file=f)
r = random.Random(2)
with open('/tmp/w2.jsonl', 'w') as f:
    for _ in range(1000):
        print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(1000)], "max_tokens": 1000,
                          "temperature": 0, "ignore_eos": True}), file=f)
PY
summ() { python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
e=sum(1 for r in rows if 'error' in r)
tp=[r['tpot_ms'] for r in rows if r.get('tpot_ms')]
print(len(rows),'requests',n,'tokens',round(t,3),'s',round(n/t),'output tok/s', e,'errors', 'tpot_ms', round(sum(tp)/len(tp),4) if tp else '-')" $1 2>&1; }
QD="--device cuda --load-format dummy --hf-config tests/gpu/qwen3-30b-a3b-shape.json"
timeout 60 $P generate $QD --prompts-file /tmp/w1.jsonl > $R/q_w1.out 2> $R/q_w1.log
echo "qwen3 W1: $(summ $R/q_w1.out)"
save
timeout 200 $P generate $QD --kv-cache-dtype fp8 --max-num-seqs 512 --prompts-file /tmp/w2.jsonl > $R/q_w2.out 2> $R/q_w2.log
echo "qwen3 W2 1000 seqs 512 at $(el)s: $(summ $R/q_w2.out)"
rm -f $R/*.out
save
echo "done at $(el)s"
