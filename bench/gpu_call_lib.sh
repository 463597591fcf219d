# bench/gpu_call_lib.sh - what every device call script shares (sourced by
# bench/results/gpu_session*/call*.sh; the device tool runs them in the
# repository root with $OUT set):
#   call_init NAME     results folder /tmp/NAME, timer, build/ made
#   call_begin NAME PACK  call_init, PACK unpacked unless build/gpu-pack/paged
#                      is there, K=build/gpu-pack, gpu_name
#   el                 seconds since call_init
#   save               the results folder as $OUT/NAME.tgz (call it after
#                      every stage: a call cut short keeps what it saved)
#   unpack PACK [DIR]  .gpucarry/PACK.tar.xz into build/ (or DIR)
#   gpu_name           the GPU's name and memory, printed and kept in
#                      $R/gpu.txt (which card gave the numbers)
#   write_prompts VOCAB  /tmp/w1.jsonl (1 x 128 in / 256 out) and
#                      /tmp/w2.jsonl (1000 x 1000 in / 1000 out), random ids
#                      below VOCAB, greedy, ignore_eos (docs/benchmarks.md)
#   w2_prompts N       /tmp/w2_N.jsonl: the first N of write_prompts' W2
#                      requests (call write_prompts first)
#   summ FILE          one line from `paged generate`'s JSONL output:
#                      requests, tokens, seconds, output tok/s, errors, TPOT
#   long_prompt N VOCAB  /tmp/long_N.jsonl: one prompt of N random ids
#                      below VOCAB, max_tokens 1, greedy (time to first token)
#   ttft FILE          "ttft_ms T output_ids [...]" of a generate output's
#                      first line
#   serve_up LOG ARGS... `$P serve ARGS --port 18400` (environment as
#                      exported), output to LOG, waits for /health;
#                      SERVE_PID
#   serve_down         SIGTERM to it, and waits
#   w4 NAME [ARGS...]  served W4 through bench/bench_serve.py (1,000 in /
#                      256 out, 200 clients, 60 s, drain 30 s, seed 4) against
#                      the server up: $R/NAME.txt and .json; ARGS override
#   ttft_http NAME LEN COUNT  time to first token through HTTP against the
#                      server up: COUNT requests of LEN random ids, one
#                      client, 1 token out; prints its TTFT row
#                      ($R/NAME.txt, .json; session 21's calls B and C
#                      wrote this loop out by hand)
#   w1_http NAME [ARGS...]  W1 through HTTP against the server up (one
#                      client, 3 x 128 in / 256 out): prints its TPOT row
#   ncu_summary FILE   ncu --csv (gpu__time_duration.sum) as a line per
#                      kernel and grid: launches, median, min (us)
#   m64_lora           the small random model /tmp/paged-m64 and three
#                      adapters for it; prints test_cuda_runner's --lora
#   lora_checks K [SGMV...]  test_cuda_lora (its graph cases again with
#                      PAGED_CUDA_LORA_EXPAND_COLS=1), then test_cuda_runner --lora
#                      for each PAGED_CUDA_LORA_SGMV value (default 0) and
#                      with BGMV alone (PAGED_CUDA_LORA_GEMM_RUNS=0), the
#                      programs in folder K
#   lora_serve_runs K N RUN...  the llama3-8b shape served with N random
#                      rank-16 adapters (a0..), for each RUN (new: K/paged,
#                      old: K/paged_old, oldruns: it with
#                      PAGED_CUDA_LORA_GEMM_RUNS=16, dev: K/paged with
#                      PAGED_LORA_DEV_EAGER=1, runs: K/paged with
#                      PAGED_CUDA_LORA_GEMM_RUNS=16, bgmv: with =0,
#                      cols1 / cols2: PAGED_CUDA_LORA_EXPAND_COLS=1 / 2,
#                      tiles: PAGED_CUDA_LORA_TILES=${LORA_TILES:-16},
#                      tilesdev: that and PAGED_LORA_DEV_EAGER=1,
#                      base: K/paged, its W4
#                      naming no adapter): W1 without and with adapter a0, then W4
#                      (100 clients over all N, 30 s); the loop session
#                      24's callP-callS.sh wrote out by hand
call_init() {
    CALL=$1
    T0=$(date +%s)
    R=/tmp/$CALL
    mkdir -p "$R" build
}
el() { echo $(( $(date +%s) - T0 )); }
# call_init NAME, the pack .gpucarry/PACK.tar.xz unpacked into build/ unless
# a pack is there already, K its folder, and gpu_name: every call script's
# first lines.
call_begin() { # NAME PACK
    call_init "$1"
    [ -x build/gpu-pack/paged ] || unpack "$2"
    K=$PWD/build/gpu-pack
    gpu_name
}
save() { tar -C /tmp -czf "$OUT/$CALL.tgz" "$CALL"; }
unpack() { tar -C "${2:-build}" -xJf ".gpucarry/$1.tar.xz" || { echo "unpack $1 failed"; exit 1; }; }
gpu_name() { nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/gpu.txt"; }
write_prompts() {
    python3 - "$1" <<'PY'
import json, random, sys
vocab = int(sys.argv[1])
r = random.Random(1)
with open('/tmp/w1.jsonl', 'w') as f:
    print(json.dumps({"prompt_ids": [r.randrange(0, vocab) for _ in range(128)], "max_tokens": 256,
                      "temperature": 0, "ignore_eos": True}), file=f)
r = random.Random(2)
with open('/tmp/w2.jsonl', 'w') as f:
    for _ in range(1000):
        print(json.dumps({"prompt_ids": [r.randrange(0, vocab) for _ in range(1000)], "max_tokens": 1000,
                          "temperature": 0, "ignore_eos": True}), file=f)
PY
}
# A prefix of the W2 file rather than a second generator, so a run of N
# requests is the first N of the full workload's.
w2_prompts() { head -n "$1" /tmp/w2.jsonl > "/tmp/w2_$1.jsonl"; }
summ() {
    python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t=max(r.get('total_ms',0) for r in rows)/1e3; n=sum(r.get('completion_tokens',0) for r in rows)
e=sum(1 for r in rows if 'error' in r)
tp=[r['tpot_ms'] for r in rows if r.get('tpot_ms')]
print(len(rows),'requests',n,'tokens',round(t,3),'s',round(n/t),'output tok/s', e,'errors', 'tpot_ms', round(sum(tp)/len(tp),4) if tp else '-')" "$1" 2>&1
}
long_prompt() {
    python3 - "$1" "$2" <<'PY'
import json, random, sys
n, vocab = int(sys.argv[1]), int(sys.argv[2])
r = random.Random(7)
with open(f"/tmp/long_{n}.jsonl", "w") as f:
    print(json.dumps({"prompt_ids": [r.randrange(0, vocab) for _ in range(n)], "max_tokens": 1,
                      "temperature": 0, "ignore_eos": True}), file=f)
PY
}
ttft() {
    python3 -c "
import json,sys
r=json.loads(open(sys.argv[1]).readline()); print('ttft_ms', round(r.get('ttft_ms',-1),1), r.get('output_ids'), r.get('error',''))" "$1" 2>&1
}
serve_up() {
    local log=$1
    shift
    "$P" serve "$@" --port 18400 > "$log" 2>&1 &
    SERVE_PID=$!
    for _ in $(seq 1 900); do curl -sf localhost:18400/health > /dev/null && return 0; sleep 0.2; done
    echo "serve_up: no /health after 180 s ($log)"
    return 1
}
serve_down() { kill -TERM "$SERVE_PID"; wait "$SERVE_PID"; }
w4() {
    local name=$1
    shift
    timeout 130 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 4 --input-len 1000 --output-len 256 \
        --concurrency 200 --num-prompts 1616 --max-seconds 60 --drain-seconds 30 --progress-seconds 0 \
        --out "$R/$name.json" "$@" > "$R/$name.txt" 2>&1
    local rc=$?
    rm -f "$R/$name.json.requests"
    return $rc
}
ttft_http() {
    local name=$1 len=$2 cnt=$3
    timeout 100 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 5 --concurrency 1 --num-prompts "$cnt" \
        --input-len "$len" --output-len 1 --out "$R/$name.json" --progress-seconds 0 > "$R/$name.txt" 2>&1
    local rc=$?
    rm -f "$R/$name.json.requests"
    echo "TTFT HTTP $len x $cnt ($name) rc=$rc at $(el)s: $(grep -E '^ *TTFT' "$R/$name.txt" | head -1)"
    return $rc
}
# W1 through HTTP against the server up: one client, 3 x 128 in / 256 out
# after one warm-up request; prints its TPOT row ($R/NAME.txt, .json).
# ARGS go to bench_serve.py (e.g. --model a0 for a LoRA adapter). Session
# 22's callD.sh and session 23's callL.sh wrote it out by hand.
w1_http() { # NAME [ARGS...]
    local name=$1
    shift
    timeout 60 python3 bench/bench_serve.py --port 18400 --warmup 1 --seed 3 --concurrency 1 --num-prompts 3 \
        --input-len 128 --output-len 256 --progress-seconds 0 --out "$R/$name.json" "$@" > "$R/$name.txt" 2>&1
    local rc=$?
    rm -f "$R/$name.json.requests"
    echo "W1 HTTP $name rc=$rc at $(el)s: $(grep -E '^ *TPOT' "$R/$name.txt" | head -1)"
    return $rc
}
# ncu's --csv output of `--metrics gpu__time_duration.sum` (FILE) as one
# line per (kernel, grid): launches, median and min in us, in the order
# first seen. Session 31's call A printed "void" for every name (it cut
# the demangled name at "<"); this takes the name before the template or
# argument list.
ncu_summary() { # FILE
    python3 - "$1" <<'PY'
import collections, csv, re, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit(print("ncu: no rows"))
h = rows[0]
ki, mi, vi, idi, gi = (h.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "ID", "Grid Size"))
per = collections.defaultdict(dict)
for r in rows[1:]:
    m = re.search(r"(\w+)\s*[<(]", r[ki].replace("void ", "", 1))
    per[r[idi]].update({r[mi]: r[vi], "k": m.group(1) if m else r[ki][:40], "g": r[gi]})
d = collections.OrderedDict()
for i in sorted(per, key=int):
    v = per[i]
    if "gpu__time_duration.sum" in v:
        d.setdefault((v["k"], v["g"]), []).append(float(v["gpu__time_duration.sum"].replace(",", "")) / 1e3)
for (k, g), ts in d.items():
    print(f"{k:32s} grid {g:14s} n {len(ts):4d} median {statistics.median(ts):7.2f} us  min {min(ts):7.2f}")
PY
}
# The small random model every GPU check runs (/tmp/paged-m64: hidden 512,
# 4 layers, bf16) and test_cuda_runner --lora's three random adapters for
# it: prints the adapters' folders (the runner's --lora argument). Call
# scripts wrote these two lines out each time.
m64_lora() {
    python3 tests/gpu/make_random_model.py /tmp/paged-m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 \
        --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
    python3 tests/gpu/make_lora_adapters.py /tmp/paged-m64 /tmp/paged-m64-lora
}
# LoRA's GPU checks with the programs in folder K: test_cuda_lora (every
# case for both shapes of the kernels), then test_cuda_runner --lora (three
# random adapters + none against the CPU, tests/gpu/make_lora_adapters.py)
# once for each PAGED_CUDA_LORA_SGMV value given (default: 0), and once with
# BGMV alone in eager steps.
lora_checks() { # K [SGMV...]
    local k=$1 m64=/tmp/paged-m64 dirs sg
    shift
    timeout 120 "$k/test_cuda_lora" > "$R/lora_kernels.txt" 2>&1
    echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 "$R/lora_kernels.txt")"
    grep -E "^FAIL|staged" "$R/lora_kernels.txt" | head -12
    PAGED_CUDA_LORA_EXPAND_COLS=1 timeout 120 "$k/test_cuda_lora" -k "lora graph" > "$R/lora_kernels_cols1.txt" 2>&1
    echo "test_cuda_lora -k 'lora graph', EXPAND_COLS=1 rc=$? at $(el)s: $(tail -1 "$R/lora_kernels_cols1.txt")"
    grep -E "^FAIL" "$R/lora_kernels_cols1.txt" | head -6
    dirs=$(m64_lora)
    for sg in "${@:-0}"; do
        PAGED_CUDA_LORA_SGMV=$sg timeout 120 "$k/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_lora_$sg.txt" 2>&1
        echo "runner LoRA SGMV=$sg rc=$? at $(el)s: $(tail -1 "$R/runner_lora_$sg.txt" | cut -c1-200)"
    done
    PAGED_CUDA_LORA_GEMM_RUNS=0 timeout 120 "$k/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_lora_bgmv.txt" 2>&1
    echo "runner LoRA GEMM_RUNS=0 (BGMV alone) rc=$? at $(el)s: $(tail -1 "$R/runner_lora_bgmv.txt" | cut -c1-200)"
    # The graph-safe op in tiles of one adapter at every size, in the graphs
    # and (PAGED_LORA_DEV_EAGER=1) in the eager steps too.
    PAGED_CUDA_LORA_TILES=1 timeout 120 "$k/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_lora_tiles.txt" 2>&1
    echo "runner LoRA TILES=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_tiles.txt" | cut -c1-200)"
    PAGED_CUDA_LORA_TILES=1 PAGED_LORA_DEV_EAGER=1 timeout 120 "$k/test_cuda_runner" $m64 --lora "$dirs" \
        > "$R/runner_lora_tilesdev.txt" 2>&1
    echo "runner LoRA TILES=1 DEV_EAGER=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_tilesdev.txt" | cut -c1-200)"
    # Split eager steps: decode rows through the tiles, prefill chunks
    # through lora_apply (PAGED_LORA_SPLIT=1).
    PAGED_CUDA_LORA_TILES=1 PAGED_LORA_SPLIT=1 timeout 120 "$k/test_cuda_runner" $m64 --lora "$dirs" \
        > "$R/runner_lora_split.txt" 2>&1
    echo "runner LoRA TILES=1 SPLIT=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_split.txt" | cut -c1-200)"
}
# The llama3-8b shape served with N random rank-16 adapters, for each RUN
# (new: K/paged, old: K/paged_old, oldruns: K/paged_old with
# PAGED_CUDA_LORA_GEMM_RUNS=16, dev: K/paged with PAGED_LORA_DEV_EAGER=1,
# runs: K/paged with PAGED_CUDA_LORA_GEMM_RUNS=16 (the default since
# session 26), bgmv: K/paged with PAGED_CUDA_LORA_GEMM_RUNS=0 (eager steps
# through BGMV alone), cols1 / cols2: K/paged with
# PAGED_CUDA_LORA_EXPAND_COLS=1 / 2 (the graph-safe expand one / two
# columns a thread; 2 is the default since session 26), tiles: K/paged
# with PAGED_CUDA_LORA_TILES=${LORA_TILES:-16} (the graph-safe op in tiles
# of one adapter from that many rows), tilesdev: that and
# PAGED_LORA_DEV_EAGER=1 (eager steps through it too), split: tiles and
# PAGED_LORA_SPLIT=1 (eager steps' decode rows through it; the default on
# CUDA since session 31), nosplit: PAGED_LORA_SPLIT=0, base: K/paged with
# W4 naming no adapter, nolora: K/paged served without --enable-lora (the
# issue's "no LoRA" of the same call), W4 naming no adapter, fused:
# PAGED_CUDA_LORA_FUSED=${LORA_FUSED:-8} (calls of at most that many rows
# in one kernel, lora_fused.cu); none
# starts past LORA_STOP seconds, 420 by default): W1
# with no adapter and with a0 (w1base_RUN, w1_RUN), then (unless
# LORA_W4=0) W4 at 100 clients over all N adapters for 30 s (w4_RUN),
# saving after each run; LORA_TAG=S appends S to every file's RUN.
lora_serve_runs() { # K N RUN...
    local k=$1 n=$2 mods names run
    shift 2
    mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json /tmp/lora8b --many "$n" 2> "$R/lora_make.txt")
    [ -n "$mods" ] || { echo "adapters not written: $(cat "$R/lora_make.txt")"; return 1; }
    names=$(echo "$mods" | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
    for run in "$@"; do
        [ "$(el)" -gt "${LORA_STOP:-420}" ] && { echo "stopped before $run at $(el)s"; break; }
        P=$k/paged
        case $run in old | oldruns) P=$k/paged_old ;; esac
        # shellcheck disable=SC2206
        local wm=(--model "$names") lf=(--enable-lora --max-loras "$n" --max-lora-rank 16 --lora-modules $mods)
        case $run in base | nolora) wm=() ;; esac
        [ "$run" = nolora ] && lf=()
        case $run in dev | tilesdev) export PAGED_LORA_DEV_EAGER=1 ;; *) unset PAGED_LORA_DEV_EAGER ;; esac
        case $run in tiles | tilesdev | split) export PAGED_CUDA_LORA_TILES=${LORA_TILES:-16} ;; *) unset PAGED_CUDA_LORA_TILES ;; esac
        case $run in split) export PAGED_LORA_SPLIT=1 ;; nosplit) export PAGED_LORA_SPLIT=0 ;; *) unset PAGED_LORA_SPLIT ;; esac
        case $run in cols1 | cols2) export PAGED_CUDA_LORA_EXPAND_COLS=${run#cols} ;; *) unset PAGED_CUDA_LORA_EXPAND_COLS ;; esac
        case $run in fused) export PAGED_CUDA_LORA_FUSED=${LORA_FUSED:-8} ;; *) unset PAGED_CUDA_LORA_FUSED ;; esac
        case $run in
        runs | oldruns) export PAGED_CUDA_LORA_GEMM_RUNS=16 ;;
        bgmv) export PAGED_CUDA_LORA_GEMM_RUNS=0 ;;
        *) unset PAGED_CUDA_LORA_GEMM_RUNS ;;
        esac
        serve_up "$R/serve_$run${LORA_TAG:-}.log" --device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json \
            "${lf[@]}" || continue
        grep -E "graphs|LoRA:" "$R/serve_$run${LORA_TAG:-}.log" | head -3
        w1_http "w1base_$run${LORA_TAG:-}"
        [ "$run" = nolora ] || w1_http "w1_$run${LORA_TAG:-}" --model a0
        if [ "${LORA_W4:-1}" != 0 ]; then
            w4 "w4_$run${LORA_TAG:-}" --concurrency 100 "${wm[@]}" --max-seconds 30 --drain-seconds 15
            echo "W4 100 clients 30 s $run${LORA_TAG:-} rc=$? at $(el)s: $(grep -m1 'output' "$R/w4_$run${LORA_TAG:-}.txt")"
            grep -E '^ *(TTFT|TPOT)' "$R/w4_$run${LORA_TAG:-}.txt" | head -2
        fi
        serve_down
        rm -f "$R"/*.json.requests
        save
    done
    unset PAGED_LORA_DEV_EAGER PAGED_CUDA_LORA_GEMM_RUNS PAGED_CUDA_LORA_EXPAND_COLS PAGED_CUDA_LORA_TILES \
        PAGED_LORA_SPLIT PAGED_CUDA_LORA_FUSED
}
