#!/bin/bash
# A/B of two builds of paged on the CPU, alternating: batch-1 decode (128 tokens)
# and 16 concurrent streams of 128 in / 128 out (prompt ids), 2 threads.
M=/work/main/models/SmolLM2-135M-Instruct.Q4_1.gguf
for i in 1 2 3; do
  for b in base new; do
    bin=/tmp/base/paged; [ $b = new ] && bin=/work/main/build/paged
    s1=$($bin generate --model $M --device cpu --threads 2 --prompt "The history of the city" --max-tokens 128 --temperature 0 --ignore-eos 2>&1 >/dev/null | grep -o 'generated [0-9]* tokens in [0-9.]* s: [0-9.]* tok/s' | awk '{print $NF=="tok/s"?$(NF-1):$NF}')
    t0=$(date +%s.%N); $bin generate --model $M --device cpu --threads 2 --prompts-file /tmp/w7/p16.jsonl > /tmp/w7/out_$b.jsonl 2>/dev/null; t1=$(date +%s.%N)
    agg=$(python3 -c "import json;r=[json.loads(l) for l in open('/tmp/w7/out_$b.jsonl')];print('%.1f'%(sum(x['completion_tokens'] for x in r)/($t1-$t0)))")
    echo "$b run$i batch1 $s1 tok/s  16streams $agg tok/s (wall incl. load)"
  done
done
