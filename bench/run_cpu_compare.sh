#!/usr/bin/env bash
# CPU side by side (W7): paged and llama.cpp's llama-server on the same model
# file, the same client (bench/bench_serve.py), the same workloads, one
# server at a time (each workload runs on a freshly started server):
#   batch1     batch-1 decode: 3 requests one after another, 128 in / 128 out
#   streams16  aggregate tokens/s, 16 closed-loop clients, 128 in / 128 out, ~60 s
#   poisson1   TTFT/TPOT at 1 req/s Poisson arrivals, 128 in / 64 out, 60 s
# Writes bench/results/cpu_<engine>_<workload>.json and prints a table with
# the ratios paged / llama.cpp last.
#
#   bench/run_cpu_compare.sh                       # both engines, all workloads
#   ENGINES="paged" WORKLOADS="batch1" bench/run_cpu_compare.sh
#   ENGINES="paged paged-quant llamacpp" ...       # paged-quant: --matmul-mode quant
#   SECONDS_PER_RUN=30 THREADS=2 ...
#   LLAMA_SERVER=/path/to/llama-server ...
# The machine has 2 cores: check `uptime` first; the load is printed and
# stored in each JSON (load_avg_1m).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
PAGED=${PAGED:-$ROOT/build/paged}
LLAMA_SERVER=${LLAMA_SERVER:-/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server}
THREADS=${THREADS:-2}
ENGINES=${ENGINES:-"paged llamacpp"}
WORKLOADS=${WORKLOADS:-"batch1 streams16 poisson1"}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-60}
OUT=${OUT:-$ROOT/bench/results}
VOCAB=49152  # SmolLM2
if [ -x "$ROOT/.venv/bin/python3" ]; then PY=$ROOT/.venv/bin/python3; else PY=python3; fi
mkdir -p "$OUT"
LOGDIR=$(mktemp -d)
# shellcheck source=bench/server_lib.sh
. "$ROOT/bench/server_lib.sh" # stop_server (on exit too), free_port

start_server() {  # engine port
    local eng=$1 port=$2
    case $eng in
    paged) cmd=("$PAGED" serve --model "$MODEL" --host 127.0.0.1 --port "$port" --threads "$THREADS") ;;
    paged-quant) cmd=("$PAGED" serve --model "$MODEL" --host 127.0.0.1 --port "$port" --threads "$THREADS"
                      --matmul-mode quant) ;;
    llamacpp) cmd=("$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" -c 8192 -np 16 --host 127.0.0.1 --port "$port"
                   --no-webui) ;;
    *) echo "unknown engine $eng" >&2; exit 2 ;;
    esac
    echo "+ ${cmd[*]}" >&2
    "${cmd[@]}" >"$LOGDIR/$eng.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 300); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "$eng exited at start:" >&2; tail -20 "$LOGDIR/$eng.log" >&2; exit 1
        fi
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    echo "$eng did not answer /health in 60 s" >&2; tail -20 "$LOGDIR/$eng.log" >&2; exit 1
}

run_workload() {  # engine port workload
    local eng=$1 port=$2 w=$3 backend=openai
    [ "$eng" = llamacpp ] && backend=llamacpp
    local common=(--base-url "http://127.0.0.1:$port" --backend "$backend" --label "$eng" --vocab-size "$VOCAB"
                  --out "$OUT/cpu_${eng}_${w}.json" --progress-seconds 15)
    case $w in
    batch1) args=(--input-len 128 --output-len 128 --concurrency 1 --num-prompts 3 --warmup 1) ;;
    streams16) args=(--input-len 128 --output-len 128 --concurrency 16 --num-prompts 2000 --warmup 1
                     --max-seconds "$SECONDS_PER_RUN" --drain-seconds 120) ;;
    poisson1) args=(--input-len 128 --output-len 64 --request-rate 1 --num-prompts 2000 --warmup 1
                    --max-seconds "$SECONDS_PER_RUN" --drain-seconds 120) ;;
    *) echo "unknown workload $w" >&2; exit 2 ;;
    esac
    echo "+ bench/bench_serve.py ${common[*]} ${args[*]}" >&2
    echo "  load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    local before
    before=$(cpu_snapshot)
    "$PY" bench/bench_serve.py "${common[@]}" "${args[@]}"
    # The load average counts the server under test too; this splits the
    # machine's busy time into server, client and everything else.
    "$PY" - "$OUT/cpu_${eng}_${w}.json" "$before" "$(cpu_snapshot)" <<'PYEOF'
import json, os, sys
path, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
wall, busy, server = (b[i] - a[i] for i in range(3))
r = json.load(open(path))
client = r["client_cpu_share"] * r["duration_s"]
r["cpu_accounting"] = {"wall_s": wall, "server_cores": server / wall, "client_cores": client / wall,
                       "other_cores": max(0.0, busy - server - client) / wall, "machine_cores": os.cpu_count()}
json.dump(r, open(path, "w"), indent=1)
print(f" CPU: server {server / wall:.2f} cores, client {client / wall:.2f}, "
      f"everything else {max(0.0, busy - server - client) / wall:.2f} (of the machine's cores)")
PYEOF
}

cpu_snapshot() {  # wall seconds, machine busy core-seconds, server core-seconds
    local hz
    hz=$(getconf CLK_TCK)
    awk -v hz="$hz" -v up="$(cut -d' ' -f1 /proc/uptime)" '
        FILENAME == "/proc/stat" && FNR == 1 { busy = $2 + $3 + $4 + $7 + $8 }  # user nice system irq softirq
        FILENAME != "/proc/stat" && FNR == 1 { split(substr($0, index($0, ") ") + 2), g, " "); srv = g[12] + g[13] }
        END { printf "%s %.2f %.2f\n", up, busy / hz, srv / hz }' /proc/stat "/proc/$SERVER_PID/stat"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "uptime: $(uptime)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}"
echo "paged: $("$PAGED" version 2>/dev/null || echo '?') git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "llama.cpp: $("$LLAMA_SERVER" --version 2>&1 | grep -m1 version || echo '?')"
# Workloads outside, engines inside: the engines compared on one workload
# run minutes apart, under about the same load from the rest of the machine.
for w in $WORKLOADS; do
    for eng in $ENGINES; do
        port=$(free_port)
        start_server "$eng" "$port"
        run_workload "$eng" "$port" "$w"
        stop_server
    done
done
echo "uptime after: $(uptime)"

"$PY" - "$OUT" "$ENGINES" "$WORKLOADS" <<'EOF'
import json, os, sys
out, engines, workloads = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def load(e, w):
    try:
        return json.load(open(os.path.join(out, f"cpu_{e}_{w}.json")))
    except OSError:
        return None
rows = [  # (workload, figure, getter, higher is better)
    ("batch1", "batch-1 decode tok/s (1000/TPOT p50)", lambda r: 1000 / r["tpot_ms"]["p50"], True),
    ("batch1", "batch-1 TTFT p50 ms (128-token prompt)", lambda r: r["ttft_ms"]["p50"], False),
    ("streams16", "16 streams: output tok/s", lambda r: r["output_throughput"], True),
    ("streams16", "16 streams: total tok/s", lambda r: r["total_token_throughput"], True),
    ("streams16", "16 streams: TPOT p50 ms", lambda r: r["tpot_ms"]["p50"], False),
    ("streams16", "16 streams: TTFT p50 ms", lambda r: r["ttft_ms"]["p50"], False),
    ("poisson1", "1 req/s: TTFT p50 ms", lambda r: r["ttft_ms"]["p50"], False),
    ("poisson1", "1 req/s: TTFT p99 ms", lambda r: r["ttft_ms"]["p99"], False),
    ("poisson1", "1 req/s: TPOT p50 ms", lambda r: r["tpot_ms"]["p50"], False),
    ("poisson1", "1 req/s: TPOT p99 ms", lambda r: r["tpot_ms"]["p99"], False),
    ("poisson1", "1 req/s: ITL p99 ms", lambda r: r["itl_ms"]["p99"], False),
    ("poisson1", "1 req/s: goodput %", lambda r: 100 * r["goodput"]["fraction"], True),
]
base = "llamacpp" if "llamacpp" in engines else None
print()
print(f"{'figure':42}" + "".join(f"{e:>13}" for e in engines)
      + "".join(f"{e + '/llama':>18}" for e in engines if base and e != base))
for w, name, get, _ in rows:
    if w not in workloads:
        continue
    vals = {}
    for e in engines:
        r = load(e, w)
        try:
            vals[e] = get(r) if r and r["completed"] else None
        except (TypeError, ZeroDivisionError, KeyError):
            vals[e] = None
    line = f"{name:42}" + "".join(f"{vals[e]:13.1f}" if vals[e] is not None else f"{'-':>13}" for e in engines)
    for e in engines:
        if base and e != base:
            ok = vals[e] is not None and vals[base]
            line += f"{vals[e] / vals[base]:18.2f}" if ok else f"{'-':>18}"
    print(line)
for e in engines:
    for w in workloads:
        r = load(e, w)
        if r and (r["failed"] or r["cancelled"]):
            print(f"note: {e} {w}: {r['failed']} failed, {r['cancelled']} cancelled; first error: {r['errors'][:1]}")
        if r:
            ca = r.get("cpu_accounting", {})
            print(f"{e:10} {w:10} {r['completed']:4} requests in {r['duration_s']:5.1f} s; load avg (1 min) at the end "
                  f"{r['load_avg_1m']:.2f}; cores used by the server {ca.get('server_cores', float('nan')):.2f}, "
                  f"client {ca.get('client_cores', float('nan')):.2f}, other work {ca.get('other_cores', float('nan')):.2f}")
EOF
