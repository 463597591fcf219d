#!/usr/bin/env python3
"""Expert parallelism's two combines (docs/moe.md): the all-reduce that ends
every layer (default) against `--all2all-backend alltoall` (each row's expert
shares to the rank owning the row, engine/model/moe_a2a.c), on the CPU, with
a dummy Mixtral-shaped model (random weights of a config written here:
hidden, experts, top-k and layers from the flags), as one process of -tp N
ranks (the in-process cpu communicator) and as N processes on loopback
(--nnodes N, the tcp communicator).

For each (topology, combine) it starts the server(s), sends one warm-up
request, then --concurrency requests at once (random prompt ids, greedy,
ignore_eos) and reports output tokens/s over the wall time, and checks that
every combine gave the same texts. Also prints the bytes a rank moves per
MoE layer and row under each combine (ring all-reduce: 2 (N-1)/N rows x
hidden x 4; all-to-all: the shares, min(top_k, N)/N of them, plus the
slices' all-gather, (N-1)/N). Not a timed test: figures go to docs/moe.md.

    bench/bench_moe_combine.py                         # -tp 4, 8 experts top 2
    bench/bench_moe_combine.py --tp 2 --top-k 8 --experts 16
"""
import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import server_util as su  # noqa: E402
from test_tensor_parallel import start_leader  # noqa: E402


def run(port, prompts, max_tokens):
    def one(ids):
        st, r = su.post(port, "/v1/completions", {"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                                                  "ignore_eos": True}, timeout=600)
        assert st == 200, r
        return r["choices"][0]["text"], r["usage"]["completion_tokens"]
    one(prompts[0])  # warm-up
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
        out = list(ex.map(one, prompts))
    return time.time() - t0, [t for t, _ in out], sum(n for _, n in out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="--threads of each server (0: its default)")
    a = ap.parse_args()
    su.require_model_and_binary()
    n, k = a.tp, a.top_k
    print(f"bytes a rank moves per MoE layer, in rows x hidden x 4: all-reduce {2 * (n - 1) / n:.2f}, "
          f"all-to-all {min(k, n) / n * (n - 1) / n + (n - 1) / n:.2f} (shares {min(k, n) / n * (n - 1) / n:.2f} "
          f"+ slices {(n - 1) / n:.2f})")
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 1024) for _ in range(a.prompt_len)] for _ in range(a.concurrency)]
    results, texts = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=a.hidden,
                   intermediate_size=a.ffn, num_hidden_layers=a.layers, num_attention_heads=8, head_dim=a.hidden // 8,
                   num_key_value_heads=4, vocab_size=1024, max_position_embeddings=4096, rms_norm_eps=1e-6,
                   rope_theta=10000.0, tie_word_embeddings=False, num_local_experts=a.experts,
                   num_experts_per_tok=k)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        base = ["--load-format", "dummy", "--hf-config", os.path.join(tmp, "config.json"), "--enable-expert-parallel",
                "--max-model-len", "2048"] + (["--threads", str(a.threads)] if a.threads else [])
        for topo in ("one process", f"{n} processes (tcp)"):
            for combine in ("allreduce", "alltoall"):
                flags = base + ["--all2all-backend", combine]
                if topo == "one process":
                    with su.Server(*flags, "-tp", str(n)) as srv:
                        secs, t, toks = run(srv.port, prompts, a.max_tokens)
                else:
                    port, followers = su.free_port(2), []
                    # node 0's flags as su.Server makes them: the hello compares them
                    node = lambda r: [su.binary(), "serve", "--model", su.MODEL, *su.DEFAULT_ARGS, *flags,  # noqa: E731
                                      "-tp", str(n), "--nnodes", str(n), "--node-rank", str(r), "--master-port",
                                      str(port), *su.EXTRA_ARGS]
                    spawn = lambda: [(subprocess.Popen(node(r), stdout=subprocess.DEVNULL,  # noqa: E731
                                                       stderr=subprocess.DEVNULL), open(os.devnull)) for r in
                                     range(1, n)]
                    srv = su.Server(*flags, "-tp", str(n), "--nnodes", str(n), "--node-rank", "0",
                                    "--master-port", str(port))
                    try:
                        start_leader(srv, followers, spawn)
                        try:
                            secs, t, toks = run(srv.port, prompts, a.max_tokens)
                        finally:
                            srv.stop()
                    finally:
                        for p, _ in followers:
                            if p.wait(60) is None:
                                p.kill()
                texts[(topo, combine)] = t
                results.append((topo, combine, secs, toks))
                print(f"{topo:20s} {combine:9s}: {toks} tokens in {secs:.2f} s, {toks / secs:.1f} output tok/s",
                      flush=True)
    ref = next(iter(texts.values()))
    same = all(t == ref for t in texts.values())
    print(f"greedy texts identical across every run: {'yes' if same else 'NO'}")
    print(f"\n| topology | combine | output tok/s |\n| --- | --- | ---: |")
    for topo, combine, secs, toks in results:
        print(f"| {topo} | {combine} | {toks / secs:.1f} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
