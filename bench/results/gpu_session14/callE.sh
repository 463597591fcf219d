#!/bin/bash
# Session 14, device call E: what profiling costs - the 600 W2 requests of
# call A's profiled run (graphs off, PAGED_PROFILE_OPS=1: 12,586 tok/s)
# again as run (graphs on, no profiler), same build, same card.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/cE; mkdir -p $R build
tar -C build -xJf .gpucarry/q2.tar.xz && tar -C build -xJf .gpucarry/p2.tar.xz && cp -r build/gpu-pack/lib build/new/lib || { echo "unpack failed"; exit 1; }
[ -f /tmp/fp8-8b/config.json ] || timeout 100 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "checkpoint ready at $(el)s"
python3 - <<'PY' > /tmp/w2q600.jsonl
import json, random
r = random.Random(2)
for _ in range(600):
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(1000)], "max_tokens": 1000,
                      "temperature": 0, "ignore_eos": True}))
PY
timeout 120 build/new/paged generate --device cuda --model /tmp/fp8-8b --kv-cache-dtype fp8 --max-num-seqs 512 \
    --prompts-file /tmp/w2q600.jsonl > $R/w2.out 2> $R/w2.log
echo "w2 600 as run rc=$? at $(el)s: $(python3 -c "
import json
rows=[json.loads(l) for l in open('$R/w2.out') if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
print(len(rows),'requests', n, 'tokens', round(t,3), 's', round(n/t), 'output tok/s from submission')")"
rm -f $R/w2.out; tar -C /tmp -czf $OUT/callE.tgz cE
echo "done at $(el)s"
