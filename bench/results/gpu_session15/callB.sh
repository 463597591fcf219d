#!/bin/bash
# Session 15, device call B (issue 31): the MoE kernels after call A
# (router GEMV up to 8 rows, 16 x 64 tiles for small batches, PDL, the
# workspace check) against call A's build (old/paged) in the same call:
#  1. test_cuda_moe;
#  2. the runner against the CPU on MoE models whose routing has no choice
#     (top_k = n_experts), then with real routing (reported);
#  3. Qwen3-30B-A3B shape, dummy bf16: W1 old vs new, W1 profiled (new),
#     W2 100 x 1000/1000 profiled (graphs off), W2 200 x 1000/1000 as run;
#  4. llama3-8b-shape W2 200 x 1000/1000 (the issue's W2 >= 2x the 8B's).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/cB; mkdir -p $R build
save() { tar -C /tmp -czf $OUT/callB.tgz cB; }
for p in m2 m1p; do tar -C build -xJf .gpucarry/$p.tar.xz || { echo "unpack $p failed"; exit 1; }; done
cp -r build/gpu-pack/lib build/old/lib
G=build/gpu-pack P=$PWD/build/gpu-pack/paged OLD=$PWD/build/old/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 150 $G/test_cuda_moe > $R/test_moe.log 2>&1; rc=$?
echo "test_cuda_moe rc=$rc at $(el)s"; grep -E "FAIL" $R/test_moe.log | head -12; tail -1 $R/test_moe.log
save
for v in "qwen3 16 16 128 2" "mixtral 8 8 512 3" "qwen3 128 8 128 2" "mixtral 8 2 512 2"; do
    read -r arch ne nk nf nl <<<"$v"
    d=/tmp/moe-$arch-$ne-$nk
    python3 tests/gpu/make_random_model.py $d --hidden 512 --heads 8 --kv-heads 2 --head-dim 64 --layers $nl \
        --vocab 1000 --dtype bf16 --moe $arch --experts $ne --top-k $nk --moe-ffn $nf --seed 6 > /dev/null
    timeout 60 $G/test_cuda_runner $d > $R/runner_$arch-$ne-$nk.log 2>&1; rc=$?
    echo "runner $arch $ne/top-$nk rc=$rc: $(tail -1 $R/runner_$arch-$ne-$nk.log | cut -c1-220)"
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
head -100 /tmp/w2.jsonl > /tmp/w2_100.jsonl
summ() { python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
e=sum(1 for r in rows if 'error' in r)
tp=[r['tpot_ms'] for r in rows if r.get('tpot_ms')]
print(len(rows),'requests',n,'tokens',round(t,3),'s',round(n/t),'output tok/s', e,'errors', 'tpot_ms', round(sum(tp)/len(tp),4) if tp else '-')" $1 2>&1; }
QD="--device cuda --load-format dummy --hf-config tests/gpu/qwen3-30b-a3b-shape.json"
for b in old new old new; do
    bin=$P; [ $b = old ] && bin=$OLD
    timeout 60 $bin generate $QD --prompts-file /tmp/w1.jsonl > $R/q_w1_$b.out 2> $R/q_w1_$b.log
    echo "qwen3 W1 $b: $(summ $R/q_w1_$b.out)"
done
save
PAGED_PROFILE_OPS=1 timeout 60 $P generate $QD --cuda-graphs off --prompts-file /tmp/w1.jsonl > $R/q_w1p.out 2> $R/q_w1p.log
echo "qwen3 W1 profiled: $(summ $R/q_w1p.out)"; grep -A16 "op profile, cuda" $R/q_w1p.log | cut -c20-150 | head -16
save
PAGED_PROFILE_OPS=1 timeout 150 $P generate $QD --cuda-graphs off --kv-cache-dtype fp8 --max-num-seqs 256 --prompts-file /tmp/w2_100.jsonl > $R/q_w2p.out 2> $R/q_w2p.log
echo "qwen3 W2 100 profiled at $(el)s: $(summ $R/q_w2p.out)"; grep -A16 "op profile, cuda" $R/q_w2p.log | cut -c20-150 | head -16
save
timeout 200 $P generate $QD --kv-cache-dtype fp8 --max-num-seqs 256 --prompts-file /tmp/w2.jsonl > $R/q_w2.out 2> $R/q_w2.log
echo "qwen3 W2 200 at $(el)s: $(summ $R/q_w2.out)"; grep -E "KV cache on" $R/q_w2.log | cut -c1-150
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
timeout 120 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs 256 --prompts-file /tmp/w2.jsonl > $R/l_w2.out 2> $R/l_w2.log
echo "llama3-8b W2 200 at $(el)s: $(summ $R/l_w2.out)"
rm -f $R/*.out
save
echo "done at $(el)s"
