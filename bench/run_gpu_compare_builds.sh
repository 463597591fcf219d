#!/bin/bash
# bench/run_gpu_compare_builds.sh - the same GPU workloads on two builds of
# paged in one device call, so a refactor's before/after is measured on the
# same machine, card state and data.
#
#   OLD=path/to/old/paged NEW=path/to/new/paged bench/run_gpu_compare_builds.sh w1 [w2]
#
# Runs bench/run_gpu_bench.sh for each workload with PAGED=$OLD, then
# PAGED=$NEW, alternating per workload (old, new, old, new when REPEAT=2),
# writes $OUT/<build>_<workload>_<i>/gpu_bench.json and prints a table of
# W1 TPOT and W2 output tokens/s, with the new/old ratio. Environment is
# passed through to run_gpu_bench.sh (KV_DTYPE, W2_N, W2_LEN, W2_ARGS).
set -u
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/paged-compare}
mkdir -p "$out"
: "${OLD:?OLD=path to the old build's paged}" "${NEW:?NEW=path to the new build's paged}"
want=("$@")
[ ${#want[@]} = 0 ] && want=(w1)
repeat=${REPEAT:-1}
for w in "${want[@]}"; do
    for i in $(seq 1 "$repeat"); do
        for b in old new; do
            bin=$OLD
            [ $b = new ] && bin=$NEW
            echo "== $w, $b build ($bin), run $i"
            PAGED=$bin OUT="$out/${b}_${w}_$i" bash bench/run_gpu_bench.sh "$w" >"$out/${b}_${w}_$i.log" 2>&1
            tail -n 3 "$out/${b}_${w}_$i.log"
        done
    done
done
python3 - "$out" "${want[@]}" <<'PY'
import glob, json, os, statistics, sys
out, wants = sys.argv[1], sys.argv[2:]
def val(b, w):
    vals = []
    for f in sorted(glob.glob(os.path.join(out, f"{b}_{w}_*", "gpu_bench.json"))):
        try:
            j = json.load(open(f)).get(w, {})
        except (OSError, ValueError):
            continue
        v = j.get("result", {}).get("tpot_ms_mean") if w == "w1" else j.get("output_tok_s")
        if v is not None:
            vals.append(float(v))
    return statistics.median(vals) if vals else None
print(f"{'workload':10s} {'old':>12s} {'new':>12s} {'new/old':>8s}")
for w in wants:
    o, n = val("old", w), val("new", w)
    unit = "ms TPOT" if w == "w1" else "tok/s"
    r = f"{n / o:.3f}" if o and n else "-"
    fmt = lambda v: f"{v:.3f}" if v is not None and w == "w1" else (f"{v:.0f}" if v is not None else "-")
    print(f"{w + ' ' + unit:10s} {fmt(o):>12s} {fmt(n):>12s} {r:>8s}")
PY
