#!/usr/bin/env bash
# bench/run_gpu_compare.sh - GPU side by side on llama3-8b-shape: paged,
# llama.cpp's llama-server (CUDA) and HF transformers continuous batching,
# run on the lent GPU machine in one command of at most 10 minutes.
#
#   bench/run_gpu_compare.sh [ENGINE...]            ENGINE: paged llamacpp hf
#   ENGINES="paged llamacpp" bench/run_gpu_compare.sh
#   bench/run_gpu_compare.sh table DIR...           the table again, from result JSONs
#
# What it does:
#  1. unpacks build/gpu-pack.tar.xz (tools/pack_gpu.sh) and
#     build/llama-cuda-pack.tar.xz (tools/pack_llama_cuda.sh) when present;
#  2. for paged / llamacpp: writes the shared GGUF ($MODEL, default
#     /tmp/llama3-8b-shape.gguf) with tools/make_random_gguf.py from $CFG
#     (bf16, seeded N(0, 0.02^2), torch on the GPU), timed;
#  3. per engine, a fresh server on 127.0.0.1; its time from process start
#     to the first 200 of /health with the file in the page cache (W8 for
#     paged); then bench/bench_serve.py (token-id prompts in [1000, 127256],
#     ignore_eos):
#       w1   1 stream, 128 in / 256 out, W1_N requests one after another
#       w2   W2_N requests of 1000 in / 1000 out at once (+ W2_SMALL_N for
#            the engines in W2_SMALL_ENGINES: the request count HF runs)
#       w4   closed loop, W4_CONC clients, 1000 in / 256 out, W4_SECONDS
#            each (requests still running get W4_DRAIN more)
#       w3   Poisson at W3_RATES req/s, in U[512,1536], out U[64,512],
#            W3_SECONDS each
#     hf: bench/bench_hf_cb.py in-process, random init from $CFG (w1 via
#     generate, w2 via continuous batching with HF_W2_N requests of
#     1000/1000; w4_c<C> / w3_r<rate> with HF_W4_* / HF_W3_* through one
#     shared continuous batching manager with streamed outputs);
#  4. writes $OUT/gpu_compare_<engine>.json (every run, per-request rows
#     dropped unless KEEP_ROWS=1), $OUT/gpu_compare.log, and prints a table
#     last: workload, engine, output tok/s, TTFT p50, TPOT p50, and the
#     ratios paged / peer.
# A time budget (BUDGET, seconds from the start, default 560) is shared out
# among the engines still to run; a workload that would not fit is skipped
# and marked so (in the JSON and the table), so the results always come back.
#
# Environment (defaults): OUT (${OUT:-/tmp/gpu-compare}), MODEL, CFG
# (tests/gpu/llama3-8b-shape.json), WORKLOADS ("w1 w2 w4 w3"), W1_N (4),
# W2_N (256), W2_LIMIT (150 s), W2_SMALL_N (64), W2_SMALL_ENGINES (paged),
# W4_CONC ("1 25 100 200 400"), W4_SECONDS (12), W4_DRAIN (60), W3_RATES
# ("2 8 16"), W3_SECONDS (15), W3_DRAIN (30), PAGED_ARGS (--max-model-len
# 4096), LLAMA_NP (256), LLAMA_CTX_PER_SLOT (2048), LLAMA_ARGS (-fa on
# -cram 0), HF_W2_N (64), HF_ARGS, HF_WORKLOADS (w1,w2; any of w1 w1cb w2
# w4 w3), HF_W4_CONC, HF_W4_SECONDS, HF_W4_DRAIN, HF_W3_RATES, HF_W3_SECONDS,
# HF_W3_DRAIN (the W4_* / W3_* values), HF_MAX_SECONDS (what the budget
# leaves: bench_hf_cb.py's --max-seconds, a budget for its whole process),
# KEEP_MODEL (1: reuse an existing $MODEL).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
PY=${PY:-python3}

# --------------------------------------------------------------- the table
table() {
    "$PY" - "$@" <<'PYEOF'
import glob, json, os, sys
files = []
for a in sys.argv[1:]:
    files += sorted(glob.glob(os.path.join(a, "gpu_compare_*.json"))) if os.path.isdir(a) else [a]
runs = {}  # (workload, engine) -> (out tok/s, ttft p50, tpot p50, note)
order = []
for f in files:
    try:
        d = json.load(open(f))
    except (OSError, ValueError):
        continue
    eng = d.get("engine")
    if not eng:
        continue
    if d.get("cold_start_s") is not None:
        runs[("w8 cold start s", eng)] = (None, None, None, f"{d['cold_start_s']:.1f} s")
        order.append("w8 cold start s")
    for w, r in d.get("runs", {}).items():
        order.append(w)
        if r.get("skipped") or r.get("error"):
            runs[(w, eng)] = (None, None, None, r.get("skipped") or r.get("error"))
            continue
        note = []
        if r.get("failed"):
            note.append(f"{r['failed']} failed")
        tput = r.get("output_throughput")
        if r.get("cancelled"):
            # Requests cancelled at the window's end: count what they streamed.
            tput = r.get("window_output_throughput", tput)
            note.append(f"{r['cancelled']} cancelled (their streamed tokens counted)")
        if r.get("output_len_mismatch"):
            note.append(f"{r['output_len_mismatch']} short")
        if r.get("truncated"):
            note.append("truncated")
        n = r.get("completed")
        note.insert(0, f"n={n}")
        ttft = (r.get("ttft_ms") or {}).get("p50")
        if ttft is None and (r.get("ttft_all_ms") or {}).get("p50") is not None:
            # bench_hf_cb.py w3/w4: no request completed; TTFT of those that streamed a token
            ttft = r["ttft_all_ms"]["p50"]
            note.append(f"TTFT of {r['ttft_all_ms']['n']} cut requests")
        runs[(w, eng)] = (tput, ttft, (r.get("tpot_ms") or {}).get("p50"), " ".join(note))
engines = []  # paged first, then the peers
for _, e in runs:
    if e not in engines:
        engines.append(e)
engines.sort(key=lambda e: (["paged", "llamacpp", "hf"] + [e]).index(e))
import re
def wkey(w):
    if w.startswith("w8"):
        return (0, 0, w)
    m = re.match(r"w(\d)(?:_small)?(?:_[cr]([\d.]+))?", w)
    return (1, int(m.group(1)) if m else 9, float(m.group(2)) if m and m.group(2) else -1, w)
seen = sorted(set(order), key=wkey)
def f(x, p=1):
    return "-" if x is None else f"{x:.{p}f}"
print(f"{'workload':16} {'engine':9} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12}  note")
for w in seen:
    for e in engines:
        if (w, e) in runs:
            o, t, p, note = runs[(w, e)]
            print(f"{w:16} {e:9} {f(o):>10} {f(t):>12} {f(p, 2):>12}  {note}")
    po = runs.get((w, "paged"), (None,))[0]
    for e in engines:
        if e != "paged" and (w, e) in runs and po and runs[(w, e)][0]:
            print(f"{'':16} {'paged/' + e:>9} {po / runs[(w, e)][0]:>9.2f}x")
hf = runs.get(("w2", "hf"))
if hf and hf[0]:
    for w in ("w2", "w2_small"):
        if (w, "paged") in runs and runs[(w, "paged")][0]:
            print(f"paged {w} / hf w2 (target >= 10x): {runs[(w, 'paged')][0] / hf[0]:.1f}x")
PYEOF
}
if [ "${1:-}" = table ]; then
    shift
    table "$@"
    exit 0
fi

OUT=${OUT:-/tmp/gpu-compare}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_compare.log") 2>&1
T_START=$(date +%s.%N)
BUDGET=${BUDGET:-560}
elapsed() { "$PY" -c "import time; print(int(time.time() - $T_START))"; }

ENGINE_LIST=("$@")
[ ${#ENGINE_LIST[@]} = 0 ] && read -r -a ENGINE_LIST <<<"${ENGINES:-paged llamacpp hf}"
WORKLOADS=${WORKLOADS:-"w1 w2 w4 w3"}
CFG=${CFG:-tests/gpu/llama3-8b-shape.json}
MODEL=${MODEL:-/tmp/llama3-8b-shape.gguf}
VOCAB=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$CFG")
W1_N=${W1_N:-4}
W2_N=${W2_N:-256}
W2_LIMIT=${W2_LIMIT:-150}
W2_SMALL_N=${W2_SMALL_N:-64}
W2_SMALL_ENGINES=${W2_SMALL_ENGINES:-paged}
W4_CONC=${W4_CONC:-"1 25 100 200 400"}
W4_SECONDS=${W4_SECONDS:-12}
W4_DRAIN=${W4_DRAIN:-60}
W3_RATES=${W3_RATES:-"2 8 16"}
W3_SECONDS=${W3_SECONDS:-15}
W3_DRAIN=${W3_DRAIN:-30}
LLAMA_NP=${LLAMA_NP:-256}
LLAMA_CTX_PER_SLOT=${LLAMA_CTX_PER_SLOT:-2048}
read -r -a PAGED_ARGS <<<"${PAGED_ARGS:---max-model-len 4096}"
read -r -a LLAMA_ARGS <<<"${LLAMA_ARGS:--fa on -cram 0}"
HF_W2_N=${HF_W2_N:-64}
DEVICE=${DEVICE:-cuda}  # cpu: a local smoke run on a tiny CFG
HF_WORKLOADS=${HF_WORKLOADS:-w1,w2}
HF_W2_LEN=${HF_W2_LEN:-1000}
HF_W4_CONC=${HF_W4_CONC:-$W4_CONC}
HF_W4_SECONDS=${HF_W4_SECONDS:-$W4_SECONDS}
HF_W4_DRAIN=${HF_W4_DRAIN:-$W4_DRAIN}
HF_W3_RATES=${HF_W3_RATES:-$W3_RATES}
HF_W3_SECONDS=${HF_W3_SECONDS:-$W3_SECONDS}
HF_W3_DRAIN=${HF_W3_DRAIN:-$W3_DRAIN}
read -r -a HF_ARGS <<<"${HF_ARGS:-}"
WORK=$(mktemp -d /tmp/gpu-compare-work.XXXXXX)

echo "== run_gpu_compare: engines ${ENGINE_LIST[*]}, workloads $WORKLOADS, budget ${BUDGET} s, out $OUT"
echo "host: $(hostname), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2 " GiB"}'), $(date -u)"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | head -4
echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --short 2>/dev/null | wc -l) changed files"
"$PY" -c 'import sys; print("python", sys.version.split()[0])'

# ------------------------------------------------------------- unpack
if [ -f build/gpu-pack.tar.xz ] && [ ! -x build/gpu-pack/paged ]; then tar -C build -xJf build/gpu-pack.tar.xz; fi
if [ -f build/llama-cuda-pack.tar.xz ] && [ ! -x build/llama-cuda/llama-server ]; then
    tar -C build -xJf build/llama-cuda-pack.tar.xz
fi
PAGED=${PAGED:-}
[ -z "$PAGED" ] && { if [ -x build/gpu-pack/paged ]; then PAGED=build/gpu-pack/paged; else PAGED=build/paged; fi; }
LLAMA_SERVER=${LLAMA_SERVER:-build/llama-cuda/llama-server}
LLAMA_LIB=$(dirname "$LLAMA_SERVER")/lib
CUDA_LIB=${CUDA_HOME:-/usr/local/cuda}/lib64

# shellcheck source=bench/server_lib.sh
. "$ROOT/bench/server_lib.sh" # stop_server (on exit too), free_port

# ------------------------------------------------------------- the model file
GGUF_S=null
need_gguf=0
for e in "${ENGINE_LIST[@]}"; do [ "$e" = paged ] || [ "$e" = llamacpp ] && need_gguf=1; done
if [ $need_gguf = 1 ]; then
    if [ -f "$MODEL" ] && [ "${KEEP_MODEL:-1}" = 1 ]; then
        echo "== model: $MODEL exists, reused"
    else
        echo "== writing $MODEL from $CFG"
        t0=$(date +%s.%N)
        if ! "$PY" tools/make_random_gguf.py "$CFG" "$MODEL" --seed 0; then
            echo "run_gpu_compare: make_random_gguf failed" >&2
            exit 1
        fi
        GGUF_S=$("$PY" -c "import time; print(round(time.time() - $t0, 1))")
        echo "   written in $GGUF_S s"
    fi
    ls -la "$MODEL"
    # In the page cache for W8 (it is after the write; this makes sure).
    t0=$(date +%s.%N)
    cat "$MODEL" >/dev/null
    echo "   page-cache read: $("$PY" -c "import time; print(round(time.time() - $t0, 1))") s"
fi

# --------------------------------------------------------------- servers
# start_server ENGINE PORT -> sets SERVER_PID and COLD (seconds to the first /health 200)
start_server() {
    local eng=$1 port=$2
    local -a cmd
    case $eng in
    paged) cmd=("$PAGED" serve --device "$DEVICE" --model "$MODEL" --host 127.0.0.1 --port "$port" "${PAGED_ARGS[@]}") ;;
    llamacpp) cmd=("$LLAMA_SERVER" -m "$MODEL" -ngl 999 -np "$LLAMA_NP" -c $((LLAMA_NP * LLAMA_CTX_PER_SLOT))
                   --cont-batching --host 127.0.0.1 --port "$port" --no-webui "${LLAMA_ARGS[@]}") ;;
    esac
    SERVER_CMD="${cmd[*]}"
    echo "+ $SERVER_CMD"
    local t0
    t0=$(date +%s.%N)
    LD_LIBRARY_PATH="$LLAMA_LIB:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${cmd[@]}" >"$WORK/$eng.server.log" 2>&1 &
    SERVER_PID=$!
    COLD=$("$PY" - "$port" "$SERVER_PID" "$t0" 300 <<'PYEOF'
import os, sys, time, urllib.request
port, pid, t0, limit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
while time.time() - t0 < limit:
    try:
        os.kill(pid, 0)
    except OSError:
        print("dead"); sys.exit(0)
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
            print(f"{time.time() - t0:.2f}"); sys.exit(0)
    except Exception:
        pass
    time.sleep(0.05)
print("timeout")
PYEOF
)
    if [ "$COLD" = dead ] || [ "$COLD" = timeout ]; then
        echo "run_gpu_compare: $eng did not come up ($COLD); its log:" >&2
        tail -40 "$WORK/$eng.server.log" >&2
        stop_server
        return 1
    fi
    echo "   $eng: /health 200 after $COLD s"
    grep -E -i 'device memory|KV cache|kv_cache|CUDA0|model buffer|compute buffer|n_ctx|graph' "$WORK/$eng.server.log" | head -20 | sed 's/^/   | /'
    return 0
}

# bench ENGINE PORT NAME [bench_serve args...]: one run to $WORK/ENGINE/NAME.json
bench() {
    local eng=$1 port=$2 name=$3 backend=openai
    shift 3
    [ "$eng" = llamacpp ] && backend=llamacpp
    mkdir -p "$WORK/$eng"
    echo "+ [$eng $name, t=$(elapsed) s] bench_serve.py $*"
    "$PY" bench/bench_serve.py --base-url "http://127.0.0.1:$port" --backend "$backend" --label "$eng" \
        --vocab-size "$VOCAB" --seed 1 --progress-seconds 30 --out "$WORK/$eng/$name.json" "$@" 2>&1 |
        grep -v '^ wrote '
    local rc=${PIPESTATUS[0]}
    [ -f "$WORK/$eng/$name.json" ] || echo "{\"error\": \"bench_serve wrote nothing (rc $rc)\"}" >"$WORK/$eng/$name.json"
}
skip() {  # ENGINE NAME REASON
    mkdir -p "$WORK/$1"
    echo "   skipped $1 $2: $3"
    printf '{"skipped": "%s"}\n' "$3" >"$WORK/$1/$2.json"
}

# collect ENGINE COLD SERVER_CMD: merge the runs into $OUT/gpu_compare_ENGINE.json
collect() {
    "$PY" - "$1" "$2" "$3" "$WORK/$1" "$OUT/gpu_compare_$1.json" "$GGUF_S" "$MODEL" "${KEEP_ROWS:-0}" \
        "$WORK/$1.server.log" <<'PYEOF'
import glob, json, os, sys
eng, cold, cmd, wdir, out, gguf_s, model, keep, slog = sys.argv[1:10]
runs = {}
def key(p):
    n = os.path.basename(p)[:-5]
    import re
    m = re.match(r"(w\d)(?:_[cr])?([\d.]+)?", n)
    return (n[:2], float(m.group(2)) if m and m.group(2) else -1, n)
for p in sorted(glob.glob(os.path.join(wdir, "*.json")), key=key):
    try:
        r = json.load(open(p))
    except ValueError as e:
        r = {"error": f"unreadable: {e}"}
    if keep != "1":
        r.pop("requests", None)
    runs[os.path.basename(p)[:-5]] = r
tail = []
try:
    tail = open(slog, errors="replace").read().splitlines()[-60:]
except OSError:
    pass
d = {"engine": eng, "server_cmd": cmd, "model": model, "gguf_write_s": None if gguf_s == "null" else float(gguf_s),
     "cold_start_s": float(cold) if cold not in ("", "null", "dead", "timeout") else None,
     "runs": runs, "server_log_tail": tail}
json.dump(d, open(out, "w"), indent=1)
print(f"   wrote {out} ({len(runs)} runs)")
PYEOF
}

# ------------------------------------------------------------- one engine
has_w() { case " $WORKLOADS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

run_server_engine() {
    local eng=$1 deadline=$2 port
    port=$(free_port)
    SERVER_CMD=""
    COLD=null
    if ! start_server "$eng" "$port"; then
        mkdir -p "$WORK/$eng"
        echo '{"error": "server did not start"}' >"$WORK/$eng/w0_start.json"
        collect "$eng" null "$SERVER_CMD"
        return
    fi
    local cold=$COLD
    left() { echo $((deadline - $(elapsed))); }
    if has_w w1; then
        if [ "$(left)" -gt 20 ]; then
            bench "$eng" "$port" w1 --input-len 128 --output-len 256 --concurrency 1 --num-prompts "$W1_N" \
                --warmup 1 --max-seconds "$(($(left) - 10))" --drain-seconds 30
        else skip "$eng" w1 "no time left"; fi
    fi
    if has_w w2; then
        local l=$(($(left) - 20))
        [ "$l" -gt "$W2_LIMIT" ] && l=$W2_LIMIT
        if [ "$l" -gt 30 ]; then
            bench "$eng" "$port" w2 --input-len 1000 --output-len 1000 --num-prompts "$W2_N" --request-rate inf \
                --warmup 0 --max-seconds 5 --drain-seconds "$l" --timeout 900
        else skip "$eng" w2 "no time left"; fi
        case " $W2_SMALL_ENGINES " in *" $eng "*)
            l=$(($(left) - 20))
            [ "$l" -gt "$W2_LIMIT" ] && l=$W2_LIMIT
            if [ "$l" -gt 30 ]; then
                bench "$eng" "$port" w2_small --input-len 1000 --output-len 1000 --num-prompts "$W2_SMALL_N" \
                    --request-rate inf --warmup 0 --max-seconds 5 --drain-seconds "$l" --timeout 900
            else skip "$eng" w2_small "no time left"; fi
            ;;
        esac
    fi
    if has_w w4; then
        for c in $W4_CONC; do
            local d=$W4_DRAIN
            [ $((W4_SECONDS + d + 10)) -gt "$(left)" ] && d=$(($(left) - W4_SECONDS - 10))
            if [ "$d" -ge 10 ]; then
                bench "$eng" "$port" "w4_c$c" --input-len 1000 --output-len 256 --concurrency "$c" \
                    --num-prompts $((c * 8 + 16)) --warmup 0 --max-seconds "$W4_SECONDS" --drain-seconds "$d"
            else skip "$eng" "w4_c$c" "no time left"; fi
        done
    fi
    if has_w w3; then
        for r in $W3_RATES; do
            local d=$W3_DRAIN
            [ $((W3_SECONDS + d + 10)) -gt "$(left)" ] && d=$(($(left) - W3_SECONDS - 10))
            if [ "$d" -ge 10 ]; then
                bench "$eng" "$port" "w3_r$r" --input-len 512:1536 --output-len 64:512 --request-rate "$r" \
                    --num-prompts "$("$PY" -c "print(int($r * $W3_SECONDS * 2) + 20)")" --warmup 0 --max-seconds "$W3_SECONDS" --drain-seconds "$d"
            else skip "$eng" "w3_r$r" "no time left"; fi
        done
    fi
    cp "$WORK/$eng.server.log" "$WORK/$eng.server.log.keep" 2>/dev/null
    stop_server
    collect "$eng" "$cold" "$SERVER_CMD"
}

run_hf() {
    local deadline=$1
    local l=$((deadline - $(elapsed) - 15))
    [ -n "${HF_MAX_SECONDS:-}" ] && [ "$HF_MAX_SECONDS" -lt "$l" ] && l=$HF_MAX_SECONDS
    [ "$l" -lt 30 ] && l=30
    local wl=${HF_WORKLOADS//[ ,]/,}
    echo "+ [hf, t=$(elapsed) s] bench/bench_hf_cb.py --workloads $wl (--max-seconds $l for the whole process)"
    local t0
    t0=$(date +%s)
    # --max-seconds bounds the whole process (import, model build, every workload): w2 is cut where it
    # runs out, w3/w4 drains shrink to share what is left and runs that would not fit are skipped and marked.
    # The JSON is rewritten after every run, so even the timeout leaves what was done.
    timeout $((l + 15)) "$PY" bench/bench_hf_cb.py --config "$CFG" --workloads "$wl" --w2-n "$HF_W2_N" \
        --w2-len "$HF_W2_LEN" --w4-conc "${HF_W4_CONC// /,}" --w4-seconds "$HF_W4_SECONDS" --w4-drain "$HF_W4_DRAIN" \
        --w3-rates "${HF_W3_RATES// /,}" --w3-seconds "$HF_W3_SECONDS" --w3-drain "$HF_W3_DRAIN" \
        --device "$DEVICE" --max-seconds "$l" --out "$WORK/hf.json" "${HF_ARGS[@]}" 2>&1 |
        grep -v -E 'it/s\]|Solving' | tail -60
    echo "   hf took $(($(date +%s) - t0)) s"
    "$PY" - "$WORK/hf.json" "$OUT/gpu_compare_hf.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    d = {"results": {}, "error": f"no result: {e}"}
d["engine"] = "hf"
d["runs"] = d.pop("results", {})
json.dump(d, open(sys.argv[2], "w"), indent=1)
print(f"   wrote {sys.argv[2]}")
PYEOF
}

n_left=${#ENGINE_LIST[@]}
for eng in "${ENGINE_LIST[@]}"; do
    now=$(elapsed)
    share=$(((BUDGET - now) / n_left))
    deadline=$((now + share))
    echo "== $eng: t=$now s, until t=$deadline s"
    case $eng in
    paged | llamacpp) run_server_engine "$eng" "$deadline" ;;
    hf) run_hf "$deadline" ;;
    *) echo "unknown engine $eng (paged llamacpp hf)" >&2 ;;
    esac
    n_left=$((n_left - 1))
done
echo "== done in $(elapsed) s"
table "$OUT"
