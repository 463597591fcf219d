#!/bin/bash
# Session 8, device call 2: W2 (1000 x 1000/1000, fp8 KV, 512 sequences)
# on the build before tensor parallelism (ba71d0b) and this build three
# ways: as served (host KV tier, swaps by kernel where runs are short,
# calibrated fp8 scales), swaps by cudaMemcpyAsync (PAGED_CUDA_SWAP=memcpy,
# the previous swap path), and without the host tier (--swap-space 0).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c2; mkdir -p $R build /tmp/old
[ -x build/gpu-pack/paged ] || tar -C build -xJf .gpucarry/new.tar.xz
[ -x /tmp/old/gpu-pack/paged ] || tar -C /tmp/old -xJf .gpucarry/old.tar.xz
echo "unpacked at $(el)s"
NEW=$PWD/build/gpu-pack/paged OLD=/tmp/old/gpu-pack/paged
printf '#!/bin/sh\nexec %s "$@" --swap-space 0\n' "$NEW" > /tmp/paged-notier; chmod +x /tmp/paged-notier
w2() { # NAME BINARY [ENV...]
    local name=$1 bin=$2; shift 2
    if [ $(el) -gt 480 ]; then echo "skip $name (at $(el)s)"; return; fi
    env "$@" PAGED=$bin OUT=$R/$name KV_DTYPE=fp8 W2_ARGS="--max-num-seqs 512" timeout 105 \
        bash bench/run_gpu_bench.sh w2 > $R/$name.log 2>&1
    echo "$name rc=$? at $(el)s: $(grep -h 'W2 output tok/s from submission' $R/$name.log)"
    grep -h "fp8 KV cache\|host tier\|swap" $R/$name/bench_logs.tgz 2>/dev/null | head -0
}
w2 old_1 $OLD
w2 new_1 $NEW
w2 memcpy_1 $NEW PAGED_CUDA_SWAP=memcpy
w2 notier_1 /tmp/paged-notier
w2 old_2 $OLD
w2 new_2 $NEW
python3 - $R <<'PY'
import glob, json, os, statistics, sys
R = sys.argv[1]
vals = {}
for f in sorted(glob.glob(os.path.join(R, "*", "gpu_bench.json"))):
    name = os.path.basename(os.path.dirname(f)).rsplit("_", 1)[0]
    try:
        w = json.load(open(f))["w2"]
        vals.setdefault(name, []).append(w["output_tok_s"])
    except Exception as e:
        print("bad", f, e)
base = statistics.median(vals["old"]) if vals.get("old") else None
print(f"{'build':8s} {'W2 out tok/s (runs)':34s} {'median':>8s} {'vs old':>7s}")
for k in ("old", "new", "memcpy", "notier"):
    v = vals.get(k, [])
    m = statistics.median(v) if v else None
    print(f"{k:8s} {', '.join(str(x) for x in v):34s} {m if m else '-':>8} {('%.3f' % (m / base)) if m and base else '-':>7}")
PY
tar -C $OUT -czf $OUT/call2.tgz c2 && rm -rf $R
echo "done at $(el)s"
