#!/bin/bash
# Session 15, device call A (issue 31): the CUDA MoE feed-forward
# (kernels/cuda/moe.cu), most wanted first, logs re-packed into
# $OUT/callA.tgz after each stage:
#  1. build/gpu/test_cuda_moe: pg_cuda_moe_ffn against fp64 on random inputs;
#  2. test_cuda_runner on random Qwen3-MoE (128 experts, top 8) and Mixtral
#     (8, top 2) models against the CPU runner;
#  3. Qwen3-30B-A3B shape, dummy bf16 weights: W1 (128 in / 256 out), W1
#     under PAGED_PROFILE_OPS=1 (graphs off), W2 200 x 1000/1000, and the
#     start-up log's KV capacity;
#  4. llama3-8b-shape W2 200 x 1000/1000 in the same call (the issue's
#     "W2 >= 2x the 8B's").
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/cA; mkdir -p $R build
save() { tar -C /tmp -czf $OUT/callA.tgz cA; }
tar -C build -xJf .gpucarry/${PACK:-m1}.tar.xz || { echo "unpack failed"; exit 1; }
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 150 $G/test_cuda_moe > $R/test_moe.log 2>&1
echo "test_cuda_moe rc=$? at $(el)s"; grep -E "FAIL|near" $R/test_moe.log | head -12; tail -2 $R/test_moe.log
save
mq=/tmp/paged-moe-qwen3 mx=/tmp/paged-moe-mixtral
python3 tests/gpu/make_random_model.py $mq --hidden 512 --heads 8 --kv-heads 2 --head-dim 64 --layers 2 \
    --vocab 1000 --dtype bf16 --moe qwen3 --experts 128 --top-k 8 --moe-ffn 128 --seed 4 > /dev/null
python3 tests/gpu/make_random_model.py $mx --hidden 512 --heads 8 --kv-heads 2 --layers 3 --vocab 1000 \
    --dtype bf16 --moe mixtral --experts 8 --top-k 2 --moe-ffn 512 --seed 5 > /dev/null
for m in $mq $mx; do
    timeout 60 $G/test_cuda_runner $m > $R/runner_$(basename $m).log 2>&1
    echo "runner $(basename $m) rc=$? at $(el)s: $(tail -1 $R/runner_$(basename $m).log | cut -c1-250)"
done
save
python3 - <<'PY'
import json, random
r = random.Random(1)
with open('/tmp/w1.jsonl', 'w') as f:
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(128)], "max_tokens": 256, "temperature": 0, "ignore_eos": True}), file=f)
r = random.Random(2)
with open('/tmp/w2.jsonl', 'w') as f:
    for _ in range(200):
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
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
timeout 90 $P generate $QD --prompts-file /tmp/w1.jsonl > $R/q_w1.out 2> $R/q_w1.log
echo "qwen3-30b-a3b W1 rc=$? at $(el)s: $(summ $R/q_w1.out)"; grep -iE "expert|param|KV cache|tokens of KV|error" $R/q_w1.log | head -8
save
PAGED_PROFILE_OPS=1 timeout 90 $P generate $QD --cuda-graphs off --prompts-file /tmp/w1.jsonl > $R/q_w1p.out 2> $R/q_w1p.log
echo "qwen3 W1 profiled rc=$? at $(el)s: $(summ $R/q_w1p.out)"; grep -A24 "op profile" $R/q_w1p.log | cut -c20-150 | head -26
save
timeout 240 $P generate $QD --kv-cache-dtype fp8 --max-num-seqs 256 --prompts-file /tmp/w2.jsonl > $R/q_w2.out 2> $R/q_w2.log
echo "qwen3 W2 200 rc=$? at $(el)s: $(summ $R/q_w2.out)"; grep -E "WARN|ERROR" $R/q_w2.log | head -3
save
timeout 120 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs 256 --prompts-file /tmp/w2.jsonl > $R/l_w2.out 2> $R/l_w2.log
echo "llama3-8b W2 200 rc=$? at $(el)s: $(summ $R/l_w2.out)"
rm -f $R/*.out
save
echo "done at $(el)s"
