#!/bin/bash
# Session 16, device call C (issue 34): the Gemma 3 27B shape (dummy bf16)
# on the card this call gets (call A's figures are an H100's):
#  1. plan at 32K with and without KV layer groups;
#  2. W1 (128 in / 256 out) with groups (graphs of grouped steps);
#  3. W6: 8 prompts of 32,000 tokens at once, 32 out, with and without
#     groups (--max-model-len 32768 so one table can start);
#  4. W2-short: 256 x 1000 in / 200 out with groups.
set -u
. bench/gpu_call_lib.sh
call_init cC
unpack ${PACK:-n3}
P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
# The runner test with its gap taken after C's penalty and D's bans, and
# every row's logits compared (call B: seeds 3-5 of the head_dim 128 Gemma
# 3 flipped at gaps 0.10-0.17, and C's "3.028" was its raw gap).
G=build/gpu-pack
M="--hidden 512 --layers 6 --ffn 1536 --vocab 1000 --heads 4 --kv-heads 1 --head-dim 128"
Gm="--gemma3 --untie --window 32 --attn-scalar 96 --rope-linear 8"
for v in "s3:$Gm --seed 3" "s4:$Gm --seed 4" "s5:$Gm --seed 5" "s6:$Gm --seed 6" "llama:--seed 3"; do
    tag=${v%%:*} fl=${v#*:}
    python3 tests/gpu/make_random_model.py /tmp/d_$tag $M $fl > /dev/null
    timeout 120 $G/test_cuda_runner /tmp/d_$tag > $R/runner_$tag.log 2>&1; rc=$?
    echo "runner $tag rc=$rc: $(tail -1 $R/runner_$tag.log | cut -c1-200)"
    grep -o "\[[A-F]: [^]]*\]" $R/runner_$tag.log | tr '\n' ' '; echo
done
GM="--hidden 512 --layers 6 --ffn 1536 --vocab 1000 --untie --window 32 --seed 3"
python3 tests/gpu/make_random_model.py /tmp/g3 --gemma3 $GM --heads 8 --kv-heads 2 --head-dim 64 > /dev/null
python3 tests/gpu/make_random_model.py /tmp/g2 --gemma2 $GM --heads 8 --kv-heads 4 --head-dim 64 --attn-softcap 5 --final-softcap 3 > /dev/null
python3 tests/gpu/make_random_model.py /tmp/m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
for d in g3 g2 m64; do
    timeout 120 $G/test_cuda_runner /tmp/$d > $R/runner_$d.log 2>&1; echo "runner $d rc=$?: $(tail -1 $R/runner_$d.log | cut -c1-200)"
done
save
GD="--device cuda --load-format dummy --hf-config tests/gpu/gemma3-27b-shape.json"
for v in "groups:" "plain:--disable-hybrid-kv-cache-manager"; do
    tag=${v%%:*} fl=${v#*:}
    timeout 120 $P plan $GD --plan-seq-len 32768 $fl > $R/plan27_$tag.txt 2>&1
    echo "plan 27B $tag rc=$?: $(grep -m3 -iE 'KV cache:|concurrent|KV layer groups' $R/plan27_$tag.txt | tr '\n' ' ' | cut -c1-300)"
done
save
write_prompts 262000
timeout 150 $P generate $GD --prompts-file /tmp/w1.jsonl > $R/w1.out 2> $R/w1.log
echo "27B W1 groups at $(el)s: $(summ $R/w1.out)"; grep -m1 "graphs:.*captured" $R/w1.log | cut -c1-160
save
python3 - <<'PY'
import json, random
r = random.Random(6)
with open('/tmp/w6.jsonl', 'w') as f:
    for _ in range(8):
        print(json.dumps({"prompt_ids": [r.randrange(0, 262000) for _ in range(32000)], "max_tokens": 32,
                          "temperature": 0, "ignore_eos": True}), file=f)
PY
ttft() { python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print('ttft_s', [round(r.get('ttft_ms',0)/1e3,1) for r in rows], 'preemptions', sum(r.get('preemptions',0) for r in rows))" "$1" 2>&1; }
for v in "groups:" "plain:--disable-hybrid-kv-cache-manager"; do
    tag=${v%%:*} fl=${v#*:}
    timeout 150 $P generate $GD --max-model-len 32768 $fl --prompts-file /tmp/w6.jsonl > $R/w6_$tag.out 2> $R/w6_$tag.log
    echo "27B W6 $tag at $(el)s: $(summ $R/w6_$tag.out) $(ttft $R/w6_$tag.out)"
    grep -m2 -E "KV cache on|KV layer groups" $R/w6_$tag.log | cut -c1-200
    save
done
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open('/tmp/w2.jsonl')][:256]
with open('/tmp/w2s.jsonl', 'w') as f:
    for r in rows:
        r['max_tokens'] = 200
        print(json.dumps(r), file=f)
PY
timeout 150 $P generate $GD --kv-cache-dtype fp8 --max-model-len 4096 --prompts-file /tmp/w2s.jsonl > $R/w2s.out 2> $R/w2s.log
echo "27B W2-short (256 x 1000/200, fp8 KV) at $(el)s: $(summ $R/w2s.out)"; grep -m2 -E "fp8 KV|KV cache on" $R/w2s.log | cut -c1-200
save
echo "done at $(el)s"
