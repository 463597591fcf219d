#!/bin/bash
# bench/spec_replay.sh - speculative decoding at a controlled acceptance
# (issue 32): the replay draft (docs/speculative_decoding.md, "The replay
# draft") on a W1-shaped run, one table.
#
#   bench/spec_replay.sh DRAFT [TARGET FLAGS ...]
#
# 1. a plain greedy `paged generate` of N (default 1) prompts of random ids
#    (PROMPT_LEN, default 128, below VOCAB) x MAX_TOKENS (default 256,
#    ignore_eos, --record-ids) writes its outputs (greedy.jsonl: prompt_ids, output_ids);
# 2. the same with --speculative-config draft_model DRAFT replaying them,
#    for every k in KS (default "1 2 4 8") and error rate in RATES (default
#    "0 0.5"; seed SEED, default 1).
# Table: TPOT = (finish - first token) / (tokens - 1) per request, the time
# per emitted (accepted + bonus) token; its ratio to the plain run;
# acceptance = accepted / draft tokens (the engine's spec_decode counters)
# and accepted per draft; output tok/s over all requests; whether every
# output is the plain run's. Logs and results.json in OUT.
#
# The draft's forward passes all run (its cost is measured); only its
# tokens are replaced. Each replayed token is wrong with probability R, so
# a draft token is accepted with probability 1 - R given the ones before
# it were; accepted / draft tokens is lower for k > 1 (a draft stops at
# its first wrong token).
#
# On the CPU with the default model (the smoke test; the model is its own
# draft):
#   MAX_TOKENS=32 KS="1 4" bench/spec_replay.sh models/SmolLM2-135M-Instruct.Q4_1.gguf
# On a GPU, llama3-8b-shape with random weights and a small random llama
# draft of its vocabulary:
#   python3 tests/gpu/make_random_model.py /tmp/draft-128k --vocab 128256 --hidden 1024 \
#       --layers 4 --heads 16 --kv-heads 4 --ffn 2816
#   bench/spec_replay.sh /tmp/draft-128k --device cuda --load-format dummy \
#       --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 2048
# Environment: PAGED (binary; default build/gpu-pack/paged or
# build/paged), OUT (default /tmp/paged-spec-replay), N, PROMPT_LEN,
# MAX_TOKENS, KS, RATES, SEED, VOCAB (default: --hf-config's vocab_size
# capped at 128000 as run_gpu_bench.sh does, else 49152, the default
# model's), SPEC_EXTRA (more keys of the speculative config, e.g.
# '"disable_by_batch_size": 256' for batches above 8), RECORD_K (record
# from a replayed run at R = 0 with that k instead of the plain run: where
# the verify step and the plain decode step break near-ties differently,
# docs/speculative_decoding.md; `same` then still compares with plain).
set -u
cd "$(dirname "$0")/.." || exit 1
if [ $# -lt 1 ]; then
    sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
fi
draft=$1
shift
target=("$@")
if [ -z "${PAGED:-}" ]; then
    PAGED=build/paged
    [ -x build/gpu-pack/paged ] && PAGED=build/gpu-pack/paged
fi
out=${OUT:-/tmp/paged-spec-replay}
mkdir -p "$out"
n=${N:-1} plen=${PROMPT_LEN:-128} mt=${MAX_TOKENS:-256} ks=${KS:-1 2 4 8} rates=${RATES:-0 0.5} seed=${SEED:-1}
vocab=${VOCAB:-}
if [ -z "$vocab" ]; then
    vocab=49152
    for ((i = 0; i + 1 < ${#target[@]}; i++)); do
        if [ "${target[$i]}" = --hf-config ]; then
            vocab=$(python3 -c "import json,sys; print(min(128000, json.load(open(sys.argv[1]))['vocab_size']))" \
                "${target[$((i + 1))]}") || exit 1
        fi
    done
fi
python3 - "$out/prompts.jsonl" "$n" "$plen" "$mt" "$vocab" <<'PY' || exit 1
import json, random, sys
path, n, plen, mt, vocab = sys.argv[1], *map(int, sys.argv[2:6])
r = random.Random(1)
with open(path, "w") as f:
    for _ in range(n):
        f.write(json.dumps({"prompt_ids": [r.randrange(0, vocab) for _ in range(plen)], "max_tokens": mt,
                            "temperature": 0, "ignore_eos": True}) + "\n")
PY

# run NAME [FLAGS ...]: one generate over the prompts; NAME.jsonl, NAME.log
run() {
    local name=$1
    shift
    echo "== $name: $PAGED generate ${target[*]} --prompts-file prompts.jsonl $*" >&2
    "$PAGED" generate "${target[@]}" --prompts-file "$out/prompts.jsonl" "$@" >"$out/$name.jsonl" 2>"$out/$name.log"
    local rc=$?
    grep -v " INFO " "$out/$name.log" >&2
    return $rc
}

run greedy --record-ids || { echo "the plain greedy run failed (exit $?): $out/greedy.log" >&2; exit 1; }
recording=$out/greedy.jsonl
if [ -n "${RECORD_K:-}" ]; then
    # The recording from a replayed run (R = 0, k RECORD_K): its tokens come
    # from the verify step's shape, where the plain run's decode steps may
    # break near-ties the other way (random weights on a GPU).
    spec="{\"method\": \"draft_model\", \"model\": \"$draft\", \"num_speculative_tokens\": $RECORD_K, \"replay\": \"$recording\"${SPEC_EXTRA:+, $SPEC_EXTRA}}"
    run record --record-ids --speculative-config "$spec" || { echo "the recording run failed: $out/record.log" >&2; exit 1; }
    recording=$out/record.jsonl
fi
names=()
for k in $ks; do
    for r in $rates; do
        spec="{\"method\": \"draft_model\", \"model\": \"$draft\", \"num_speculative_tokens\": $k, \"replay\": \"$recording\", \"replay_error_rate\": $r, \"replay_seed\": $seed${SPEC_EXTRA:+, $SPEC_EXTRA}}"
        run "k${k}_r$r" --speculative-config "$spec" || echo "k $k, rate $r: exit $?" >&2
        names+=("k${k}_r$r")
    done
done

python3 - "$out" greedy "${names[@]}" <<'PY'
import json, os, re, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
counts_re = re.compile(r"\[speculative decoding: (\d+) drafts, (\d+) draft tokens, (\d+) accepted")

def load(name):
    path = os.path.join(out, name + ".jsonl")
    rows = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
    m = counts_re.search(open(os.path.join(out, name + ".log")).read())
    d = [int(x) for x in m.groups()] if m else [0, 0, 0]
    ok = rows and not any("error" in r for r in rows)
    tpot = statistics.mean(r["tpot_ms"] for r in rows if "tpot_ms" in r) if ok else None
    wall = max(r.get("total_ms", 0) for r in rows) if ok else 0
    toks = sum(r.get("completion_tokens", 0) for r in rows)
    return {"name": name, "ok": bool(ok), "tpot_ms": tpot, "tok_s": toks / wall * 1e3 if wall else None,
            "drafts": d[0], "draft_tokens": d[1], "accepted": d[2],
            "acceptance": d[2] / d[1] if d[1] else None, "accepted_per_draft": d[2] / d[0] if d[0] else None,
            "outputs": [r.get("output_ids") for r in rows]}

res = [load(n) for n in names]
base = res[0]
print(f"\n{'run':<12} {'TPOT ms':>8} {'vs plain':>8} {'accept':>7} {'acc/draft':>9} {'drafts':>7} {'tok/s':>8}  same")
for r in res:
    f = lambda v, fmt: format(v, fmt) if v is not None else format("-", ">" + fmt.split(".")[0])
    ratio = r["tpot_ms"] / base["tpot_ms"] if r["tpot_ms"] and base["tpot_ms"] else None
    r["same_as_plain"] = r["outputs"] == base["outputs"]
    print(f"{r['name']:<12} {f(r['tpot_ms'], '8.3f')} {f(ratio, '8.3f')} {f(r['acceptance'], '7.3f')} "
          f"{f(r['accepted_per_draft'], '9.2f')} {r['drafts']:>7} {f(r['tok_s'], '8.1f')}  "
          f"{'yes' if r['same_as_plain'] else 'NO'}")
for r in res:
    del r["outputs"]
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)
print(f"(TPOT: mean over requests of (finish - first token) / (tokens - 1); results.json and logs in {out})")
sys.exit(0 if all(r["ok"] and r["same_as_plain"] for r in res) else 1)
PY
