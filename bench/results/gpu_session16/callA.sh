#!/bin/bash
# Session 16, device call A (issue 34): Gemma 3 on CUDA, first run.
#  1. test_cuda_gemma_ops (scale, rmsnorm_add, gelu_mul, softcap) and
#     test_cuda_kernels -k window (sliding windows and soft-caps in decode
#     v2/v4 and prefill v1/v2, bf16 and fp8 KV);
#  2. tiny random Gemma 3 / Gemma 2 models (make_random_model.py), the
#     runner against the CPU (test_cuda_runner; one block table);
#  3. `paged generate` greedy texts, CPU against CUDA with KV layer groups,
#     with one table (--disable-hybrid-kv-cache-manager) and with fp8 KV;
#  4. the Gemma 3 27B shape (dummy bf16): plan at 32K with and without
#     groups, W1, and W6 (8 prompts of 32,000 tokens at once).
set -u
. bench/gpu_call_lib.sh
call_init cA
unpack ${PACK:-n1}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 60 $G/test_cuda_gemma_ops > $R/gemma_ops.log 2>&1; echo "test_cuda_gemma_ops rc=$? at $(el)s: $(tail -1 $R/gemma_ops.log)"
grep -m5 FAIL $R/gemma_ops.log
timeout 300 $G/test_cuda_kernels -k window > $R/kernels_window.log 2>&1; echo "test_cuda_kernels -k window rc=$? at $(el)s: $(tail -1 $R/kernels_window.log)"
grep -m8 FAIL $R/kernels_window.log
save
M="--hidden 512 --layers 6 --ffn 1536 --vocab 1000 --untie --window 32 --seed 3"
python3 tests/gpu/make_random_model.py /tmp/g3a --gemma3 $M --heads 8 --kv-heads 2 --head-dim 64 > $R/models.log
python3 tests/gpu/make_random_model.py /tmp/g3b --gemma3 $M --heads 4 --kv-heads 1 --head-dim 128 --attn-scalar 96 --rope-linear 8 >> $R/models.log
python3 tests/gpu/make_random_model.py /tmp/g2 --gemma2 $M --heads 8 --kv-heads 4 --head-dim 64 --attn-softcap 5 --final-softcap 3 >> $R/models.log
for d in g3a g3b g2; do
    timeout 120 $G/test_cuda_runner /tmp/$d --json $R/runner_$d.json > $R/runner_$d.log 2>&1; rc=$?
    echo "runner $d rc=$rc: $(tail -1 $R/runner_$d.log | cut -c1-220)"
done
PAGED_CUDA_FP8_GEMM=0 timeout 120 $G/test_cuda_runner /tmp/g3a --quantization fp8 > $R/runner_g3a_fp8.log 2>&1
echo "runner g3a fp8 weight-only rc=$?: $(tail -1 $R/runner_g3a_fp8.log | cut -c1-220)"
save
python3 - <<'PY'
import json, random
r = random.Random(7)
with open('/tmp/tiny.jsonl', 'w') as f:
    for n in [40, 100, 200, 300, 33, 64, 250, 17]:
        print(json.dumps({"prompt_ids": [r.randrange(0, 1000) for _ in range(n)], "max_tokens": 48,
                          "temperature": 0, "ignore_eos": True}), file=f)
PY
cmp_texts() { python3 -c "
import json,sys
a=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; b=[json.loads(l) for l in open(sys.argv[2]) if l.strip()]
same=sum(1 for x,y in zip(a,b) if x.get('text')==y.get('text') and 'error' not in y)
err=[y.get('error') for y in b if 'error' in y]
print(f'{same}/{len(a)} texts identical', ('errors: '+str(err[:2])) if err else '')" "$1" "$2"; }
for d in g3a g3b g2; do
    timeout 120 $P generate --model /tmp/$d --device cpu --matmul-mode exact --prompts-file /tmp/tiny.jsonl > $R/gen_${d}_cpu.out 2> $R/gen_${d}_cpu.log
    for v in "groups:" "plain:--disable-hybrid-kv-cache-manager" "fp8kv:--kv-cache-dtype fp8" "groups-b4:--block-size 16 --max-num-batched-tokens 64"; do
        tag=${v%%:*} fl=${v#*:}
        timeout 120 $P generate --model /tmp/$d --device cuda $fl --prompts-file /tmp/tiny.jsonl > $R/gen_${d}_$tag.out 2> $R/gen_${d}_$tag.log
        echo "generate $d cuda $tag rc=$?: $(cmp_texts $R/gen_${d}_cpu.out $R/gen_${d}_$tag.out) $(grep -m1 -o 'KV layer groups: [0-9]* block tables*' $R/gen_${d}_$tag.log)"
    done
done
save
GD="--load-format dummy --hf-config tests/gpu/gemma3-27b-shape.json"
for v in "groups:" "plain:--disable-hybrid-kv-cache-manager"; do
    tag=${v%%:*} fl=${v#*:}
    timeout 120 $P plan --device cuda $GD --plan-seq-len 32768 $fl > $R/plan27_$tag.txt 2>&1
    echo "plan 27B $tag rc=$?: $(grep -m3 -iE 'sequences|KV layer groups' $R/plan27_$tag.txt | tr '\n' ' ' | cut -c1-300)"
done
save
write_prompts 262000
for v in "groups:" "plain:--disable-hybrid-kv-cache-manager"; do
    tag=${v%%:*} fl=${v#*:}
    timeout 150 $P generate --device cuda $GD $fl --prompts-file /tmp/w1.jsonl > $R/g27_w1_$tag.out 2> $R/g27_w1_$tag.log
    echo "27B W1 $tag at $(el)s: $(summ $R/g27_w1_$tag.out)"
    save
done
python3 - <<'PY'
import json, random
r = random.Random(6)
with open('/tmp/w6.jsonl', 'w') as f:
    for _ in range(8):
        print(json.dumps({"prompt_ids": [r.randrange(0, 262000) for _ in range(32000)], "max_tokens": 32,
                          "temperature": 0, "ignore_eos": True}), file=f)
PY
for v in "groups:" "plain:--disable-hybrid-kv-cache-manager"; do
    tag=${v%%:*} fl=${v#*:}
    timeout 200 $P generate --device cuda $GD --max-model-len 32768 $fl --prompts-file /tmp/w6.jsonl > $R/g27_w6_$tag.out 2> $R/g27_w6_$tag.log
    echo "27B W6 $tag at $(el)s: $(summ $R/g27_w6_$tag.out) preemptions $(python3 -c "
import json; print(sum(json.loads(l).get('preemptions',0) for l in open('$R/g27_w6_$tag.out') if l.strip()))" 2>&1)"
    grep -m2 -E "KV cache on|KV layer groups" $R/g27_w6_$tag.log | cut -c1-250
    save
done
rm -f $R/*.out.big
save
echo "done at $(el)s"
