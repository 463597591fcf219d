#!/usr/bin/env python3
"""The replay draft (engine/draft_replay.h, docs/speculative_decoding.md "The
replay draft") end to end with `paged generate` on the default model, which
is also the draft model:

1. a greedy run writes its outputs (--record-ids: "prompt_ids", "output_ids"
   per line);
2. the replayed run with replay_error_rate 0 gives the identical texts and
   ids, and acceptance 1.0 (every draft token accepted, from the engine's
   spec_decode counters that generate prints on stderr);
3. replay_error_rate 0.5 (seed 7) gives the identical texts and, with one
   draft token, an acceptance in 0.3 .. 0.7 (with four: 0.1 .. 0.45, a
   draft stopping at its first wrong token; seeded, so the wrong positions
   are always the same);
4. replay_error_rate 1 makes every replayed token wrong: no draft token is
   accepted although this draft, left alone, agrees with the target on
   nearly every token - so the proposals are the replay's, not the draft's;
5. a missing file and a file of bad JSON are refused at start with one line
   naming the file and the reason (exit 1), bad values of the keys at
   option parsing (exit 2);
6. bench/spec_replay.sh's smoke run (2 prompts of 16 random ids x 24
   tokens, k 1 and 2, rates 0 and 0.5): every output the plain run's,
   acceptance 1.0 at rate 0.

About 20 s on two cores.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

MAX_TOKENS = 48
PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:", "Once upon a time"]
ARGS = ["--max-model-len", "1024", "--kv-cache-memory", "128M", "--temperature", "0",
        "--max-tokens", str(MAX_TOKENS), "--ignore-eos"]
COUNTS = re.compile(r"\[speculative decoding: (\d+) drafts, (\d+) draft tokens, (\d+) accepted")


def generate(prompts_file, spec=None, record=False):
    """(returncode, result lines, stderr) of paged generate --prompts-file [--record-ids]."""
    cmd = [su.binary(), "generate", "--model", su.MODEL, "--prompts-file", prompts_file, *ARGS]
    if record:
        cmd.append("--record-ids")
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [json.loads(s) for s in p.stdout.splitlines() if s.strip()] if p.returncode == 0 else []
    return p.returncode, lines, p.stderr


def replay_spec(path, rate, seed=7, k=4):
    return {"method": "draft_model", "model": su.MODEL, "num_speculative_tokens": k, "replay": path,
            "replay_error_rate": rate, "replay_seed": seed}


def counts(err):
    m = COUNTS.search(err)
    assert m, f"no speculative decoding counters on stderr:\n{err[-2000:]}"
    return tuple(int(x) for x in m.groups())


def same_outputs(greedy, got, what):
    for g, r in zip(greedy, got, strict=True):
        assert r["output_ids"] == g["output_ids"] and r["text"] == g["text"], (what, g["text"], r["text"])


def error_lines(err):
    return [s for s in err.splitlines() if s.strip() and " INFO " not in s and " WARN " not in s]


def main():
    su.require_model_and_binary()
    work = tempfile.mkdtemp(prefix="paged-spec-replay-")
    try:
        run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work):
    prompts = os.path.join(work, "prompts.jsonl")
    with open(prompts, "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"prompt": p}) + "\n")

    # 1. The recording.
    rc, greedy, err = generate(prompts, record=True)
    assert rc == 0, err
    assert all(len(g["output_ids"]) == MAX_TOKENS and g["prompt_ids"] for g in greedy), greedy
    recording = os.path.join(work, "greedy.jsonl")
    with open(recording, "w") as f:
        for g in greedy:
            f.write(json.dumps(g) + "\n")
    print(f"greedy run: {len(greedy)} requests x {MAX_TOKENS} tokens recorded")

    # 2. Error rate 0: everything accepted.
    rc, got, err = generate(prompts, replay_spec(recording, 0))
    assert rc == 0, err
    assert "replaying" in err, err
    same_outputs(greedy, got, "rate 0")
    drafts, drafted, accepted = counts(err)
    print(f"rate 0: {drafts} drafts, {drafted} draft tokens, {accepted} accepted; texts identical")
    assert drafted > 0 and accepted == drafted, (drafts, drafted, accepted)

    # 3. Error rate 0.5: each draft token right with probability 0.5, so
    # with one token a draft about half the draft tokens are accepted; with
    # four, a draft stops at its first wrong token (about 0.23 of them at a
    # fixed length; the adaptive length moves it). Which positions are
    # wrong is fixed by the seed; the counts still move a little from run
    # to run with how generate's requests fall into steps (which steps
    # draft), far less than the bands.
    for k, lo, hi in ((1, 0.3, 0.7), (4, 0.1, 0.45)):
        rc, got, err = generate(prompts, replay_spec(recording, 0.5, k=k))
        assert rc == 0, err
        same_outputs(greedy, got, f"rate 0.5, k {k}")
        c1 = counts(err)
        rate = c1[2] / c1[1]
        print(f"rate 0.5, k {k}: {c1[0]} drafts, {c1[1]} draft tokens, {c1[2]} accepted ({rate:.3f}); "
              "texts identical")
        assert lo <= rate <= hi, (k, c1)

    # 4. Error rate 1: the replay, not the draft, proposes.
    rc, got, err = generate(prompts, replay_spec(recording, 1))
    assert rc == 0, err
    same_outputs(greedy, got, "rate 1")
    c = counts(err)
    print(f"rate 1: {c[0]} drafts, {c[1]} draft tokens, {c[2]} accepted")
    assert c[1] > 0 and c[2] == 0, c

    # 5. Bad files and values.
    bad = os.path.join(work, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(greedy[0]) + "\n{\"prompt_ids\": [1, 2\n")
    missing = os.path.join(work, "missing.jsonl")
    # A run's output without --record-ids has "output_ids" but no "prompt_ids".
    plain = os.path.join(work, "plain.jsonl")
    with open(plain, "w") as f:
        for g in got:
            assert "output_ids" in g and "prompt_ids" not in g, g
            f.write(json.dumps(g) + "\n")
    for path, reason in ((missing, "No such file or directory"), (bad, "line 2 is not a JSON object"),
                         (plain, "line 1 has no \"prompt_ids\" and \"output_ids\" (write it with paged generate "
                                 "--prompts-file --record-ids)")):
        rc, _, err = generate(prompts, replay_spec(path, 0))
        lines = error_lines(err)
        print(f"refused: {lines}")
        assert rc == 1 and len(lines) == 1 and path in lines[0] and reason in lines[0], (rc, err)
    for extra, reason in (({"replay_error_rate": 1.5}, "replay_error_rate must be a number in [0, 1]"),
                          ({"replay": ""}, "\"replay\" must be a file path")):
        spec = dict(replay_spec(recording, 0), **extra)
        rc, _, err = generate(prompts, spec)
        assert rc == 2 and reason in err, (rc, err)
    spec = {"method": "draft_model", "model": su.MODEL, "num_speculative_tokens": 2, "replay_seed": 3}
    rc, _, err = generate(prompts, spec)
    assert rc == 2 and "need \"replay\"" in err, (rc, err)

    # 6. The benchmark's smoke run: bench/spec_replay.sh at a small size.
    env = dict(os.environ, PAGED=su.binary(), OUT=os.path.join(work, "bench"), N="2", PROMPT_LEN="16",
               MAX_TOKENS="24", KS="1 2", RATES="0 0.5")
    p = subprocess.run(["bash", os.path.join(su.ROOT, "bench", "spec_replay.sh"), su.MODEL, *ARGS[:4]],
                       capture_output=True, text=True, timeout=300, env=env)
    print(p.stdout)
    assert p.returncode == 0, p.stderr[-3000:]
    res = {r["name"]: r for r in json.load(open(os.path.join(work, "bench", "results.json")))}
    assert sorted(res) == ["greedy", "k1_r0", "k1_r0.5", "k2_r0", "k2_r0.5"], sorted(res)
    assert all(r["ok"] and r["same_as_plain"] for r in res.values()), res
    assert res["k1_r0"]["acceptance"] == 1 and res["k2_r0"]["acceptance"] == 1, res
    print("OK")


if __name__ == "__main__":
    main()
