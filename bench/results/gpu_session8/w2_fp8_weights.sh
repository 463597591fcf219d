#!/bin/bash
# Session 8, device call 5 (run by hand on the warm machine after call 3,
# whose make_fp8_model.py had written /tmp/fp8-8b): W2 with FP8 weights and
# fp8 KV. Printed: 1000 requests 1000000 tokens 111.604 s 8960 output tok/s
# from submission 0 errors.
python3 - <<'PY' > /tmp/w2q.jsonl
import json, random
r = random.Random(2)
for _ in range(1000):
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(1000)], "max_tokens": 1000,
                      "temperature": 0, "ignore_eos": True}))
PY
timeout 200 build/gpu-pack/paged generate --device cuda --model /tmp/fp8-8b --kv-cache-dtype fp8 --max-num-seqs 512 \
    --prompts-file /tmp/w2q.jsonl > /tmp/w2q.out 2> /tmp/w2q.log
python3 -c "
import json
rows=[json.loads(l) for l in open('/tmp/w2q.out') if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
print(len(rows),'requests', n, 'tokens', round(t,3), 's', round(n/t), 'output tok/s from submission')"
