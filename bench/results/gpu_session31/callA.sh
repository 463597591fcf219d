#!/bin/bash
# Device call A (session 31), issue 33 (many LoRA adapters): the split
# eager steps as CUDA's default (runner.c: PAGED_LORA_SPLIT unset now means
# on where the backend has graphs), the tiles' threshold, W1's LoRA
# kernels alone, and served W4 beside a server without LoRA:
#   1. test_cuda_lora whole; test_cuda_runner --lora against the CPU with
#      the defaults (tiles from 16 rows, the split) and with the split off;
#   2. bench_cuda_lora --m 1,8,16,24,32,48,64,92 (where tiles of one
#      adapter start to beat a CTA a row; 16 lost in session 30);
#   3. ncu of the graph-safe op a CTA a row at m = 1 (each shrink and
#      expand launch's own duration and grid, the four groups of a layer);
#   4. served llama3-8b-shape (dummy bf16 weights): W1 and W4 (100
#      clients, 30 s) without --enable-lora, with 8 rank-16 adapters and
#      the new default, with every eager LoRA row through the tiles
#      (PAGED_LORA_DEV_EAGER=1: at 92-256 rows of one adapter they beat
#      the cuBLASLt runs the prefill chunks take), with the split off; then
#      64 adapters if time is left.
# Pack: .gpucarry/s44.tar.xz (paged, test_cuda_runner, test_cuda_lora,
# bench_cuda_lora, lib; HEAD 773ba2c + the split default).
set -u
. bench/gpu_call_lib.sh
call_begin cA "${PACK:-s44}"
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
timeout 90 "$K/test_cuda_lora" > "$R/lora_kernels.txt" 2>&1
echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 "$R/lora_kernels.txt")"
grep -E "^FAIL" "$R/lora_kernels.txt" | head -8
dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
for sp in default 0; do
    if [ $sp = default ]; then unset PAGED_LORA_SPLIT; else export PAGED_LORA_SPLIT=$sp; fi
    timeout 60 "$K/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_lora_split_$sp.txt" 2>&1
    echo "runner LoRA split=$sp rc=$? at $(el)s: $(tail -1 "$R/runner_lora_split_$sp.txt" | cut -c1-200)"
    grep -m1 "LoRA:" "$R/runner_lora_split_$sp.txt"
done
unset PAGED_LORA_SPLIT
save
timeout 60 "$K/bench_cuda_lora" --m 1,8,16,24,32,48,64,92 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(layer)" "$R/bench_lora.txt"
save
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
    timeout 100 "$NCU" --kernel-name regex:'lora_dev_(shrink|expand)' --launch-count 700 \
        --metrics gpu__time_duration.sum,launch__grid_size --csv "$K/bench_cuda_lora" --m 1 \
        > "$R/ncu_lora_m1.csv" 2> "$R/ncu_lora_m1.err"
    echo "ncu rc=$? at $(el)s"
    python3 - "$R/ncu_lora_m1.csv" <<'PY'
import csv, statistics, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("ncu: no rows"); sys.exit()
h = rows[0]; ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
idi = h.index("ID")
per = collections.defaultdict(dict)
for r in rows[1:]:
    per[r[idi]][r[mi]] = r[vi]; per[r[idi]]["k"] = r[ki].split("<")[0].split("(")[0]
d = collections.defaultdict(list)
for v in per.values():
    try: d[(v["k"], v.get("launch__grid_size", "?"))].append(float(v["gpu__time_duration.sum"].replace(",", "")))
    except (KeyError, ValueError): pass
for (k, g), ts in sorted(d.items()):
    print(f"{k:28s} grid {g:>5s} n {len(ts):4d} median {statistics.median(ts):8.0f} (unit as ncu)")
PY
else
    echo "no ncu"
fi
save
LORA_STOP=${LORA_STOP:-420} lora_serve_runs "$K" 8 nolora new tilesdev nosplit
LORA_TAG=_64 LORA_STOP=${LORA_STOP64:-480} lora_serve_runs "$K" 64 new
echo "done at $(el)s"
