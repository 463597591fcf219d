#!/bin/bash
# bench/run_gpu_bench.sh - the GPU workloads of BENCHMARKS.md on llama3-8b-shape.
#
#   bench/run_gpu_bench.sh [w1] [w6] [w8] [w2]      (default: w1 w6 w8)
#
# Weights: --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json
# (bf16, a seeded normal generated on the GPU). Prompts are random token ids
# ("prompt_ids" lines for `paged generate --prompts-file`), outputs fixed
# with ignore_eos. Environment: PAGED (binary; default build/gpu-pack/paged
# or build/paged), OUT (where logs and gpu_bench.json go), W2_N (requests
# of W2, default 1000), W2_LEN (input = output tokens, default 1000), CFG
# (another config.json), W6_MAX (cap on W6's sequences, default 256),
# KV_DTYPE (--kv-cache-dtype for every paged command: auto (default), bf16
# or fp8; e.g. `KV_DTYPE=fp8 OUT=/tmp/fp8 bench/run_gpu_bench.sh w6 w2`
# for the fp8 KV variants of W6 and W2), W2_ARGS (extra flags for W2's
# paged command, e.g. "--max-num-seqs 512").
#   W1  1 request, 128 prompt tokens, 256 generated: TPOT = (finish - first
#       token) / 255 from the engine's timestamps.
#   W6  KV capacity at --gpu-memory-utilization 0.9 (start-up log), then
#       N = capacity / 4096 sequences of 4096 tokens (4032 prompt + 64
#       generated) at once: no preemption allowed; wall time and throughput.
#   W8  `paged serve` cold start: process start to the first 200 of /health.
#   W2  W2_N requests of W2_LEN in / W2_LEN out at once: output tokens/s.
set -u
cd "$(dirname "$0")/.." || exit 1
out_dir=${OUT:-/tmp/paged-bench}
mkdir -p "$out_dir"
if [ -f build/gpu-pack.tar.xz ] && [ ! -x build/gpu-pack/paged ]; then tar -C build -xJf build/gpu-pack.tar.xz; fi
# PAGED from the environment wins (e.g. an older build's pack, to compare
# two builds in one device call); else the pack, else build/paged.
if [ -z "${PAGED:-}" ]; then
    PAGED=build/paged
    [ -x build/gpu-pack/paged ] && PAGED=build/gpu-pack/paged
fi
CFG=${CFG:-tests/gpu/llama3-8b-shape.json}
COMMON=(--device cuda --load-format dummy --hf-config "$CFG" --kv-cache-dtype "${KV_DTYPE:-auto}")
work=/tmp/paged-bench-work
mkdir -p "$work"
want=("$@")
[ ${#want[@]} = 0 ] && want=(w1 w6 w8)
has() { for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
results="$out_dir/gpu_bench.json"
echo "{" >"$results.tmp"
table=""

# prompts FILE N PROMPT_LEN MAX_TOKENS SEED: random ids below min(vocab, 128000)
prompts() {
    python3 - "$@" "$CFG" <<'PY'
import json, random, sys
path, n, plen, mt, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
vocab = min(128000, json.load(open(sys.argv[6]))["vocab_size"])
r = random.Random(seed)
with open(path, "w") as f:
    for _ in range(n):
        f.write(json.dumps({"prompt_ids": [r.randrange(0, vocab) for _ in range(plen)], "max_tokens": mt,
                            "temperature": 0, "ignore_eos": True}) + "\n")
PY
}

# summary FILE: count, preemptions, errors, mean ttft/tpot, output tokens
summarize() {
    python3 - "$1" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
err = sum(1 for r in rows if "error" in r)
tp = [r["tpot_ms"] for r in rows if "tpot_ms" in r]
tt = [r["ttft_ms"] for r in rows if "ttft_ms" in r]
print(json.dumps({"requests": len(rows), "errors": err,
                  "preemptions": sum(r.get("preemptions", 0) for r in rows),
                  "completion_tokens": sum(r.get("completion_tokens", 0) for r in rows),
                  "tpot_ms_mean": st.mean(tp) if tp else None, "tpot_ms_median": st.median(tp) if tp else None,
                  "ttft_ms_mean": st.mean(tt) if tt else None,
                  "ttft_ms_max": max(tt) if tt else None}))
PY
}

mem_line() { grep -h "device memory:" "$1" | tail -1 | sed 's/.*device memory: //'; }
kv_tokens() { grep -h "KV cache on cuda" "$1" | tail -1 | sed -E 's/.* = ([0-9]+) tokens.*/\1/'; }

cap=""
if has w1 || has w6; then
    prompts "$work/w1.jsonl" 1 128 256 1
    t0=$(date +%s.%N)
    PAGED_CUDA_TIMING=1 "$PAGED" generate "${COMMON[@]}" --prompts-file "$work/w1.jsonl" >"$work/w1.out" 2>"$work/w1.log"
    rc=$?
    t1=$(date +%s.%N)
    cat "$work/w1.log"
    timing=$(grep -h 'cuda timing' "$work/w1.log" | sed 's/.*INFO  //')
    s=$(summarize "$work/w1.out")
    cap=$(kv_tokens "$work/w1.log")
    echo "W1: $s (exit $rc)"
    tpot=$(echo "$s" | python3 -c 'import json,sys; v=json.load(sys.stdin)["tpot_ms_mean"]; print("%.3f" % v if v else "nan")')
    echo "\"w1\": {\"cmd\": \"paged generate ${COMMON[*]} --prompts-file w1.jsonl (1 x 128 in / 256 out)\", \"result\": $s, \"exit\": $rc, \"process_s\": $(python3 -c "print(round($t1 - $t0, 3))"), \"kv_tokens\": ${cap:-0}, \"memory\": \"$(mem_line "$work/w1.log")\", \"timing\": \"$timing\"}," >>"$results.tmp"
    table="${table}W1 TPOT (ms, target <= 4.2, floor 3.80)|$tpot\n"
    table="${table}W1 tokens/s|$(python3 -c "print('%.1f' % (1000/$tpot))" 2>/dev/null)\n"
    table="${table}W6 KV capacity (tokens) at 0.9|${cap:-?}\n"
fi

if has w1e; then # W1 without CUDA graphs, for the comparison
    prompts "$work/w1.jsonl" 1 128 256 1
    PAGED_CUDA_GRAPHS=0 PAGED_CUDA_TIMING=1 "$PAGED" generate "${COMMON[@]}" --prompts-file "$work/w1.jsonl" \
        >"$work/w1e.out" 2>"$work/w1e.log"
    rc=$?
    grep -h "cuda timing" "$work/w1e.log"
    s=$(summarize "$work/w1e.out")
    echo "W1 eager: $s (exit $rc)"
    tpot=$(echo "$s" | python3 -c 'import json,sys; v=json.load(sys.stdin)["tpot_ms_mean"]; print("%.3f" % v if v else "nan")')
    echo "\"w1_eager\": {\"cmd\": \"PAGED_CUDA_GRAPHS=0 paged generate ${COMMON[*]} --prompts-file w1.jsonl\", \"result\": $s, \"exit\": $rc, \"timing\": \"$(grep -h 'cuda timing' "$work/w1e.log" | sed 's/.*INFO  //')\"}," >>"$results.tmp"
    table="${table}W1 TPOT without CUDA graphs (ms)|$tpot\n"
fi

if has w8; then
    port=18094
    t0=$(date +%s.%N)
    "$PAGED" serve "${COMMON[@]}" --served-model-name llama3-8b-shape --host 127.0.0.1 --port $port >"$work/w8.log" 2>&1 &
    spid=$!
    up=0
    for _ in $(seq 1 1200); do
        curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && up=1 && break
        kill -0 $spid 2>/dev/null || break
        sleep 0.02
    done
    t1=$(date +%s.%N)
    cold=$(python3 -c "print(round($t1 - $t0, 3))")
    resp=$(curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
        -d '{"model": "llama3-8b-shape", "prompt": [1, 791, 2864, 315, 922, 374], "max_tokens": 16, "temperature": 0, "ignore_eos": true}')
    echo "W8: cold start ${cold} s (health $up); completion: ${resp:0:300}"
    kill $spid 2>/dev/null
    wait $spid 2>/dev/null
    echo "\"w8\": {\"cmd\": \"paged serve ${COMMON[*]}; poll /health every 20 ms\", \"cold_start_s\": $cold, \"healthy\": $up}," >>"$results.tmp"
    table="${table}W8 cold start to /health 200 (s)|$cold\n"
fi

if has w6 && [ -n "$cap" ]; then
    n=$((cap / 4096))
    [ $n -gt ${W6_MAX:-256} ] && n=${W6_MAX:-256}
    prompts "$work/w6.jsonl" $n 4032 64 6
    t0=$(date +%s.%N)
    "$PAGED" generate "${COMMON[@]}" --max-num-seqs $n --prompts-file "$work/w6.jsonl" >"$work/w6.out" 2>"$work/w6.log"
    rc=$?
    t1=$(date +%s.%N)
    tail -5 "$work/w6.log"
    s=$(summarize "$work/w6.out")
    echo "W6: $n x 4096 tokens: $s (exit $rc)"
    echo "\"w6\": {\"cmd\": \"paged generate ${COMMON[*]} --max-num-seqs $n --prompts-file w6.jsonl ($n x 4032 in / 64 out)\", \"sequences\": $n, \"kv_tokens\": $cap, \"result\": $s, \"exit\": $rc, \"wall_s\": $(python3 -c "print(round($t1 - $t0, 3))")}," >>"$results.tmp"
    pre=$(echo "$s" | python3 -c 'import json,sys; print(json.load(sys.stdin)["preemptions"])')
    table="${table}W6 concurrent 4096-token seqs (preemptions)|$n ($pre)\n"
fi

if has w2; then
    n=${W2_N:-1000} len=${W2_LEN:-1000}
    prompts "$work/w2.jsonl" "$n" "$len" "$len" 2
    t0=$(date +%s.%N)
    # W2_ARGS: extra flags (scheduler limits), e.g. "--max-num-seqs 512".
    # shellcheck disable=SC2086
    "$PAGED" generate "${COMMON[@]}" ${W2_ARGS:-} --prompts-file "$work/w2.jsonl" >"$work/w2.out" 2>"$work/w2.log"
    rc=$?
    t1=$(date +%s.%N)
    wall=$(python3 -c "print(round($t1 - $t0, 3))")
    s=$(summarize "$work/w2.out")
    echo "W2: $n x $len/$len: $s in $wall s (exit $rc)"
    tput=$(python3 -c "import json; s=json.loads('$s'); print('%.0f' % (s['completion_tokens'] / $wall))")
    # From submission (all requests at once, after start-up) to the last
    # finish: the engine's own time, without loading and graph capture.
    run_s=$(python3 -c "import json; print(round(max(json.loads(l).get('total_ms', 0) for l in open('$work/w2.out')) / 1e3, 3))")
    tput_run=$(python3 -c "import json; s=json.loads('$s'); print('%.0f' % (s['completion_tokens'] / $run_s))")
    total_run=$(python3 -c "import json; s=json.loads('$s'); print('%.0f' % ((s['completion_tokens'] + $n * $len) / $run_s))")
    echo "\"w2\": {\"cmd\": \"paged generate ${COMMON[*]} ${W2_ARGS:-} --prompts-file w2.jsonl ($n x $len in / $len out)\", \"result\": $s, \"exit\": $rc, \"wall_s\": $wall, \"output_tok_s_incl_startup\": $tput, \"run_s\": $run_s, \"output_tok_s\": $tput_run, \"total_tok_s\": $total_run}," >>"$results.tmp"
    table="${table}W2 $n x $len/$len output tok/s (incl. start-up)|$tput\n"
    table="${table}W2 output tok/s from submission ($run_s s)|$tput_run\n"
    table="${table}W2 total (input + output) tok/s from submission|$total_run\n"
fi

echo "\"device\": \"$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)\"}" >>"$results.tmp"
mv "$results.tmp" "$results"
tar -C "$work" -czf "$out_dir/bench_logs.tgz" . 2>/dev/null
echo "== GPU benchmarks (llama3-8b-shape, dummy bf16 weights)"
printf "%b" "$table" | awk -F'|' '{printf "%-48s %s\n", $1, $2}'
