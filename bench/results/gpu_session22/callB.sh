#!/bin/bash
# Device call B (session 22, issue 34: head_dim 256 on CUDA): the runner
# and the engine.
#   1. a tiny random Gemma 3 with head_dim 256 (4 query / 1 KV heads, as
#      the 270M and 1B; make_random_model.py, window 32): the runner
#      against the CPU with FlashInfer's prefill (the default) and ours
#      (PAGED_CUDA_PREFILL=paged), and with an fp8 cache through FlashInfer's
#      fp8 kernel and ours (PAGED_CUDA_FI_FP8=0);
#   2. paged generate, KV layer groups against one table for every layer
#      and fp8 KV: identical greedy texts (8 prompts past the window);
#   3. the Gemma 3 12B shape (dummy bf16 weights, head_dim 256, 16/8 heads,
#      window 1024): W1 (1 x 128 in / 256 out), time to first token of
#      one 32,768-token prompt with FlashInfer's prefill and ours, W2-short
#      (256 x 1,000 in / 200 out).
# Pack: .gpucarry/s24r.tar.xz (paged, test_cuda_runner, lib).
set -u
export PAGED_CUDA_HD256=1 # head_dim 256 runs only when asked for until these checks pass
. bench/gpu_call_lib.sh
call_init cB
[ -x build/gpu-pack/paged ] || unpack s24r
P=$PWD/build/gpu-pack/paged RT=$PWD/build/gpu-pack/test_cuda_runner
gpu_name
g=/tmp/g3w
python3 tests/gpu/make_random_model.py $g --gemma3 --hidden 512 --layers 6 --ffn 1536 --vocab 1000 --untie \
    --window 32 --seed 3 --heads 4 --kv-heads 1 --head-dim 256 > $R/model.txt 2>&1 || cat $R/model.txt
for pf in flashinfer paged; do
    PAGED_CUDA_PREFILL=$pf timeout 120 $RT $g --gap 0.2 > $R/runner_$pf.txt 2>&1
    echo "runner hd256 prefill=$pf rc=$? at $(el)s, FlashInfer ran: $(grep -c 'FlashInfer prefill ran' $R/runner_$pf.txt): $(tail -1 $R/runner_$pf.txt | cut -c1-200)"
done
for f8 in 1 0; do
    PAGED_CUDA_FI_FP8=$f8 timeout 120 $RT $g --kv-cache-dtype fp8 --tol 0.1 --gap 0.2 --gap-sigmas 4 > $R/runner_fp8_$f8.txt 2>&1
    echo "runner hd256 fp8 KV FI_FP8=$f8 rc=$? at $(el)s, FlashInfer fp8 ran: $(grep -c 'FlashInfer prefill ran (first fp8' $R/runner_fp8_$f8.txt): $(tail -1 $R/runner_fp8_$f8.txt | cut -c1-200)"
done
save
gp=/tmp/gp.jsonl
python3 - "$gp" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for n in [40, 100, 200, 300, 33, 64, 250, 17]:
        f.write(json.dumps({"prompt_ids": [r.randrange(0, 1000) for _ in range(n)], "max_tokens": 48,
                            "temperature": 0, "ignore_eos": True}) + "\n")
PY
timeout 60 $P generate --model $g --device cuda --prompts-file $gp > $R/gen_groups.jsonl 2> $R/gen_groups.log; a=$?
timeout 60 $P generate --model $g --device cuda --disable-hybrid-kv-cache-manager --prompts-file $gp > $R/gen_one.jsonl 2> $R/gen_one.log; b=$?
timeout 60 $P generate --model $g --device cuda --kv-cache-dtype fp8 --prompts-file $gp > $R/gen_fp8.jsonl 2> $R/gen_fp8.log; c=$?
PAGED_CUDA_PREFILL=paged timeout 60 $P generate --model $g --device cuda --prompts-file $gp > $R/gen_paged.jsonl 2> $R/gen_paged.log; d=$?
echo "generate rc groups $a one-table $b fp8 $c paged-prefill $d; $(grep -o 'KV layer groups: [0-9]* block tables' $R/gen_groups.log | head -1)"
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{R}/{n}.jsonl") if l.strip()]
a, b, c, d = load("gen_groups"), load("gen_one"), load("gen_fp8"), load("gen_paged")
same = lambda x, y: sum(1 for u, v in zip(x, y) if u.get("text") == v.get("text") and "error" not in u)
print(f"groups vs one table identical {same(a, b)}/{len(a)}; FlashInfer vs paged prefill {same(a, d)}/{len(a)}; "
      f"fp8 vs bf16 first 16 chars {sum(1 for u, v in zip(a, c) if u.get('text','')[:16] == v.get('text','')[:16])}/{len(a)}; "
      f"errors {sum(1 for x in a + b + c + d if 'error' in x)}")
PY
save
D="--device cuda --load-format dummy --hf-config tests/gpu/gemma3-12b-shape.json"
write_prompts 262000
timeout 90 $P generate $D --prompts-file /tmp/w1.jsonl > $R/w1.out 2> $R/w1.log
echo "12B W1 rc=$? at $(el)s: $(summ $R/w1.out)"
grep -E "KV cache|layer groups|FlashInfer" $R/w1.log | head -4
save
long_prompt 32768 262000
for pf in flashinfer paged flashinfer; do
    PAGED_CUDA_PREFILL=$pf timeout 90 $P generate $D --max-model-len 40000 --prompts-file /tmp/long_32768.jsonl > $R/ttft32k_$pf.out 2> $R/ttft32k_$pf.log
    echo "12B TTFT 32k prefill=$pf rc=$? at $(el)s: $(ttft $R/ttft32k_$pf.out)"
done
save
[ $(el) -gt 400 ] && { echo "done at $(el)s (W2-short left out)"; exit 0; }
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("/tmp/w2.jsonl")][:256]
with open("/tmp/w2s.jsonl", "w") as f:
    for r in rows:
        r["max_tokens"] = 200
        print(json.dumps(r), file=f)
PY
timeout 150 $P generate $D --max-model-len 4096 --prompts-file /tmp/w2s.jsonl > $R/w2s.out 2> $R/w2s.log
echo "12B W2-short (256 x 1000/200) rc=$? at $(el)s: $(summ $R/w2s.out)"
rm -f $R/w2s.out
save
echo "done at $(el)s"
