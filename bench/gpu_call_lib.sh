# bench/gpu_call_lib.sh - what every device call script shares (sourced by
# bench/results/gpu_session*/call*.sh; the device tool runs them in the
# repository root with $OUT set):
#   call_init NAME     results folder /tmp/NAME, timer, build/ made
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
call_init() {
    CALL=$1
    T0=$(date +%s)
    R=/tmp/$CALL
    mkdir -p "$R" build
}
el() { echo $(( $(date +%s) - T0 )); }
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
