#!/bin/bash
# Session 15, device call C (issue 31): the MoE kernel by batch size, and
# W2 with more rows per step:
#  0. FP8 experts: bench --fp8, test_cuda_moe (bf16 and fp8 cases), the
#     runner against the CPU on MoE models with --quantization fp8;
#  1. bench_cuda_moe --quick (Qwen3-30B-A3B and Mixtral shapes), the
#     default 16 x 64 x 64 small tile and PAGED_CUDA_MOE_TILE=k128;
#     the 16-row tiles never (PAGED_CUDA_MOE_SMALL_PAIRS=0) and up to 128
#     pairs an expert (=128), for the switch between the tiles;
#  2. test_cuda_moe under k128 (the variant must be right to be compared);
#  3. W2 1000 x 1000/1000, fp8 KV, Qwen3-30B-A3B shape and llama3-8b shape,
#     --max-num-seqs 512 and 1024 (vLLM V1's default on 80+ GB cards is
#     1024 sequences).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/cC; mkdir -p $R build
save() { tar -C /tmp -czf $OUT/callC.tgz cC; }
tar -C build -xJf .gpucarry/${PACK:-m3}.tar.xz || { echo "unpack failed"; exit 1; }
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 100 $G/bench_cuda_moe --quick > $R/bench_moe.log 2>&1; echo "bench default rc=$? at $(el)s"
grep -E "^\||^#" $R/bench_moe.log | head -24
timeout 100 $G/bench_cuda_moe --quick --fp8 > $R/bench_moe_fp8.log 2>&1; echo "bench fp8 rc=$? at $(el)s"
grep -E "^\||^#" $R/bench_moe_fp8.log | head -24
save
timeout 150 $G/test_cuda_moe > $R/test_moe.log 2>&1; echo "test_cuda_moe rc=$? at $(el)s"; grep FAIL $R/test_moe.log | head; tail -1 $R/test_moe.log
for v in "qwen3 16 16 128 2" "mixtral 8 8 512 3"; do
    read -r arch ne nk nf nl <<<"$v"
    d=/tmp/moe-$arch-$ne-$nk
    python3 tests/gpu/make_random_model.py $d --hidden 512 --heads 8 --kv-heads 2 --head-dim 64 --layers $nl \
        --vocab 1000 --dtype bf16 --moe $arch --experts $ne --top-k $nk --moe-ffn $nf --seed 6 > /dev/null
    timeout 60 $G/test_cuda_runner $d > $R/runner_$arch.log 2>&1; rc=$?
    echo "runner $arch $ne/top-$nk bf16 rc=$rc: $(tail -1 $R/runner_$arch.log | cut -c1-200)"
    timeout 60 $G/test_cuda_runner $d --quantization fp8 --tol 0.1 > $R/runner_${arch}_fp8.log 2>&1; rc=$?
    echo "runner $arch $ne/top-$nk fp8 rc=$rc: $(tail -1 $R/runner_${arch}_fp8.log | cut -c1-200)"
done
PAGED_CUDA_MOE_TILE=k128 timeout 100 $G/bench_cuda_moe --quick --shape qwen3 > $R/bench_moe_k128.log 2>&1; echo "bench k128 rc=$? at $(el)s"
grep -E "^\||^#" $R/bench_moe_k128.log | head -12
for sp in 0 128; do
    PAGED_CUDA_MOE_SMALL_PAIRS=$sp timeout 60 $G/bench_cuda_moe --shape qwen3 --m 64,128,256,512,1024,2048 > $R/bench_moe_sp$sp.log 2>&1
    echo "bench small-pairs $sp rc=$? at $(el)s"; grep -E "^\|" $R/bench_moe_sp$sp.log | head -9
done
save
PAGED_CUDA_MOE_TILE=k128 timeout 100 $G/test_cuda_moe > $R/test_moe_k128.log 2>&1; echo "test_cuda_moe k128 rc=$? at $(el)s: $(tail -1 $R/test_moe_k128.log)"
save
python3 - <<'PY'
import json, random
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
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
for s in 512 1024; do
    timeout 200 $P generate $QD --kv-cache-dtype fp8 --max-num-seqs $s --prompts-file /tmp/w2.jsonl > $R/q_w2_$s.out 2> $R/q_w2_$s.log
    echo "qwen3 W2 1000 seqs $s at $(el)s: $(summ $R/q_w2_$s.out)"; grep -E "preempt|WARN|ERROR" $R/q_w2_$s.log | head -2
    save
    timeout 150 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs $s --prompts-file /tmp/w2.jsonl > $R/l_w2_$s.out 2> $R/l_w2_$s.log
    echo "llama3-8b W2 1000 seqs $s at $(el)s: $(summ $R/l_w2_$s.out)"
    save
done
rm -f $R/*.out
save
echo "done at $(el)s"
