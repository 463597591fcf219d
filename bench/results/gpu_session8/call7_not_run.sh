#!/bin/bash
# Session 8, device call 7: W4-style throughput at 64 closed-loop clients
# (1000 in / 256 out, 25 s windows) with and without a json_schema
# response_format, through HTTP, llama3-8b-shape dummy weights (issue 17).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c7; mkdir -p $R build
[ -x build/gpu-pack/paged ] || tar -C build -xJf .gpucarry/new.tar.xz
P=build/gpu-pack/paged
$P serve --device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --port 18300 > $R/serve.log 2>&1 &
pid=$!
for i in $(seq 1 200); do curl -sf localhost:18300/health >/dev/null && break; sleep 0.2; done
echo "serving at $(el)s"
SCHEMA='{"response_format": {"type": "json_schema", "json_schema": {"name": "inventory", "schema": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "qty": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["name", "qty"], "additionalProperties": false}, "minItems": 60, "maxItems": 80}}, "required": ["items"], "additionalProperties": false}}}}'
C="--port 18300 --input-len 1000 --output-len 256 --concurrency 64 --num-prompts 100000 --max-seconds 25 --drain-seconds 20 --vocab-size 128000 --seed 1"
timeout 60 python3 bench/bench_serve.py $C --out $R/plain.json > $R/plain.txt 2>&1; echo "plain rc=$? at $(el)s"
timeout 60 python3 bench/bench_serve.py $C --extra-body "$SCHEMA" --out $R/json.json > $R/json.txt 2>&1; echo "json rc=$? at $(el)s"
kill $pid; wait $pid
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
for n in ("plain", "json"):
    try:
        j = json.load(open(f"{R}/{n}.json"))
        r = j["runs"][0] if "runs" in j else j
        keys = [k for k in r if "tok" in k or "ttft" in k or "tpot" in k or "completed" in k or "fail" in k or "error" in k]
        print(n, {k: r[k] for k in keys if not isinstance(r[k], (list, dict))})
    except Exception as e:
        print(n, "?", e)
PY
tail -5 $R/json.txt
tar -C $OUT -czf $OUT/call7.tgz c7
echo "done at $(el)s"
