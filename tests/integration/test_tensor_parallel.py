#!/usr/bin/env python3
"""Tensor parallelism on the CPU backend (engine/dist/executor.h, the in-process
communicator of kernels/comm/comm.h): the same model split over N ranks must
compute what one rank computes.

1. Logits: random-weight models of shapes that split 2, 4 and 8 ways (MHA,
   GQA with KV heads replicated when there are fewer than ranks, Qwen2 with
   Q/K/V biases and tied embeddings, Qwen3 with per-head q/k norms), both as
   dummy weights (the generator's windows) and as a real safetensors file
   (each rank slicing rows and columns of f32 tensors): next-token logits at
   --tp N against --tp 1 (build/tests/tools/dump_logits), exact f32 numerics.
   Bound: only the summation order differs (a row-parallel product is N
   partial dot products added by the all-reduce, in rank order), so the
   logits agree to a few f32 ulps of the largest terms; we allow 1e-5 of the
   largest logit (observed ~1e-7), and the argmax must be the same.
2. The default model (SmolLM2-135M, Q4_1 GGUF: 9 heads, 3 KV heads) through
   the real server: --tp 3 gives the same greedy text as --tp 1 on at least
   18 of 20 prompts; /metrics has one device label per rank; every KV block
   returns to the pool; seeded sampling (which gathers every logit, where
   plain greedy rows exchange only the ranks' row maxima) gives the same
   text on at least 4 of 5 prompts, and greedy with logprobs (gathered) the
   same text as plain greedy (exchanged); seeded top-k sampling (each rank's
   k best exchanged) the same text as the same requests with logprobs
   (gathered) at the same tp, and as tp 1 on at least 3 of 4. In the exact numerics (--matmul-mode exact): the
   default CPU numerics quantize activations to 8 bits per block as
   llama.cpp does, a discontinuous rounding under which a one-ulp change of
   the residual stream alone (the only thing tensor parallelism changes)
   moves the logits by about 2% (docs/tensor_parallel.md has the
   measurement), so there greedy texts part after a few tokens whatever the
   split; the test prints that figure too.
3. Several nodes on loopback (engine/dist/remote.h): --tp 3 --nnodes 3 as three
   processes (node 0 serves HTTP and schedules; nodes 1 and 2 follow, the
   collectives over the tcp communicator) answer completions through the
   real server with the same greedy text as one process at --tp 1; the
   followers exit 0 when node 0 stops; a dummy Mixtral under expert
   parallelism (-tp 2 --enable-expert-parallel) with the all-to-all
   combine (--all2all-backend alltoall) answers as with the all-reduce,
   in one process and as two over tcp; a follower with other flags is
   refused by name: -tp, and the configuration its hello carries
   (engine/dist/node_config.h) - --enable-expert-parallel on node 0 only
   (the dummy Mixtral), another --kv-cache-dtype, another --max-model-len:
   both processes exit non-zero within seconds, each with the line naming
   the field and both values; a follower that dies fails node 0's engine (a 500 for
   the request in flight, exit code 70) instead of leaving it hanging.
   Two nodes of two ranks each (--tp 4 --nnodes 2, a dummy model whose 8
   heads split 4 ways), and of one (--tp 2): one local rank fails its step
   before its first collective (PAGED_TP_FAULT_RANK), on the follower or
   on node 0, while the others wait in the collective; its node aborts
   every local rank's communicator, the other node's ranks see the
   connections close, and
   node 0 answers the request in flight with an error (a 500, or a stream's
   error event and [DONE]) naming the fault, not an echo of it, /health
   turns 503 and it exits 70, within seconds. A follower that stops
   (SIGSTOP: a hung or cut-off host, whose connections stay open) with
   --tp-timeout 2: node 0's collective times out, its wait for the
   follower's reply too, and it fails the same way within a few seconds.
4. Bad configurations stop before any weight is read, with one line naming
   the numbers: --tp 2 on the default model (9 heads), the nccl communicator
   on the CPU.
"""
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

ROOT = su.ROOT
DUMP = os.path.join(ROOT, "build/tests/tools/dump_logits")
TOL = 1e-5

try:
    import numpy as np
except ImportError as e:
    su.skip(f"numpy not importable ({e})")

BASE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, head_dim=32,
            vocab_size=1024, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
            tie_word_embeddings=False)
SHAPES = {
    # name: (config overrides, tensor-parallel sizes)
    "llama-mha": (dict(architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=8), (2, 4, 8)),
    "llama-gqa": (dict(architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=2), (2, 4, 8)),
    "qwen2-bias": (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_key_value_heads=4,
                        tie_word_embeddings=True), (2, 4, 8)),
    "qwen3-qknorm": (dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_key_value_heads=4,
                          head_dim=64), (2, 4)),
}
PROMPT = "1,17,5,230,99,42,7,310,8,64,1000,3,3,3,512,77"


def write_config(d, cfg):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def write_safetensors(d, cfg, seed):
    """A real checkpoint of random f32 weights (norms and biases away from
    1 and 0, so they matter), in the safetensors layout transformers writes."""
    rng = np.random.default_rng(seed)
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    t = {"model.embed_tokens.weight": rng.normal(0, 0.2, (V, H)), "model.norm.weight": rng.uniform(0.5, 1.5, H)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = rng.normal(0, 0.2, (V, H))
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = rng.uniform(0.5, 1.5, H)
        t[p + "post_attention_layernorm.weight"] = rng.uniform(0.5, 1.5, H)
        for n, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
            t[p + f"self_attn.{n}_proj.weight"] = rng.normal(0, 0.2, (rows, H))
            if cfg["model_type"] == "qwen2":
                t[p + f"self_attn.{n}_proj.bias"] = rng.normal(0, 0.2, rows)
        if cfg["model_type"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = rng.uniform(0.5, 1.5, hd)
            t[p + "self_attn.k_norm.weight"] = rng.uniform(0.5, 1.5, hd)
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (H, nh * hd))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.2, (F, H))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.2, (F, H))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.2, (H, F))
    header, blobs, off = {}, [], 0
    for name, a in t.items():
        b = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def logits(model_args, tp):
    r = subprocess.run([DUMP, *model_args, "--mode", "exact", "--tp", str(tp), "--threads", "2", PROMPT],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (model_args, tp, r.stderr[-2000:])
    o = json.loads(r.stdout)
    return np.array(o["logits"]), o["token"]


def check_logits():
    if not os.path.exists(DUMP):
        su.skip(f"{DUMP} is not built")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (over, tps) in SHAPES.items():
            cfg = dict(BASE, **over)
            d = os.path.join(tmp, name)
            write_config(d, cfg)
            write_safetensors(d, cfg, seed=len(name))
            for kind, args in (("dummy", ["--dummy", os.path.join(d, "config.json")]), ("safetensors", [d])):
                ref, ref_tok = logits(args, 1)
                scale = float(np.abs(ref).max())
                assert scale > 0, (name, kind)
                for tp in tps:
                    got, tok = logits(args, tp)
                    err = float(np.abs(got - ref).max()) / scale
                    print(f"  {name:13s} {kind:11s} tp {tp}: max |d| / max |logit| = {err:.2e}, "
                          f"argmax {tok} (tp 1: {ref_tok})")
                    assert err <= TOL, (name, kind, tp, err)
                    assert tok == ref_tok and int(np.argmax(got)) == int(np.argmax(ref)), (name, kind, tp)


PROMPTS = su.PROMPTS_20  # the held-out set the server tests share


def greedy_texts(tp, mode="exact"):
    with su.Server("--tensor-parallel-size", str(tp), "--max-num-seqs", "8", "--matmul-mode", mode) as srv:
        texts = []
        for p in PROMPTS:
            st, body = su.post(srv.port, "/v1/completions",
                               {"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
            assert st == 200, (st, body)
            texts.append(body["choices"][0]["text"])
        # Seeded sampling and greedy with logprobs gather every logit (the
        # plain greedy requests above exchange only row maxima): the same
        # text as one rank's.
        for p in PROMPTS[:5]:
            st, body = su.post(srv.port, "/v1/completions",
                               {"prompt": p, "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "seed": 7,
                                "ignore_eos": True})
            assert st == 200, (st, body)
            texts.append(body["choices"][0]["text"])
        # Seeded top-k sampling: the ranks exchange their k best entries per
        # row (pg_model_forward_topk); with logprobs asked for, the same
        # requests gather every logit, and the tokens must be the same.
        for p in PROMPTS[5:9]:
            req = {"prompt": p, "max_tokens": 24, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11,
                   "ignore_eos": True}
            st, body = su.post(srv.port, "/v1/completions", req)
            assert st == 200, (st, body)
            st, gathered = su.post(srv.port, "/v1/completions", dict(req, logprobs=1))
            assert st == 200, (st, gathered)
            assert body["choices"][0]["text"] == gathered["choices"][0]["text"], (tp, p, body, gathered)
            texts.append(body["choices"][0]["text"])
        for p in PROMPTS[:3]:
            st, body = su.post(srv.port, "/v1/completions",
                               {"prompt": p, "max_tokens": 24, "temperature": 0, "logprobs": 2, "ignore_eos": True})
            assert st == 200, (st, body)
            assert body["choices"][0]["text"] == texts[PROMPTS.index(p)], (p, body["choices"][0]["text"])
        m = su.metrics(srv.port)
        devs = sorted({k.split('device="')[1].split('"')[0] for k in m
                       if k.startswith("paged:device_memory_bytes{") and 'device="' in k})
        su.wait_idle(srv.port)
        m = su.metrics(srv.port)
        used = su.metric(m, "paged:kv_cache_blocks", state="used")
        return texts, devs, used


def check_default_model():
    su.require_model_and_binary()
    t1, d1, u1 = greedy_texts(1)
    t3, d3, u3 = greedy_texts(3)
    same = sum(a == b for a, b in zip(t1[:20], t3[:20]))
    seeded = sum(a == b for a, b in zip(t1[20:25], t3[20:25]))
    topk = sum(a == b for a, b in zip(t1[25:], t3[25:]))
    print(f"  default model, exact numerics: tp 3 greedy text equals tp 1 on {same}/20 prompts, seeded sampling "
          f"on {seeded}/5, seeded top-k (exchanged; equal to gathered at tp 3) on {topk}/4; devices {d3}")
    assert topk >= 3, list(zip(t1[25:], t3[25:]))
    assert seeded >= 4, list(zip(t1[20:], t3[20:]))
    q1, _, _ = greedy_texts(1, "default")
    q3, _, q3u = greedy_texts(3, "default")
    print(f"  default model, default (8-bit activation) numerics: {sum(a == b for a, b in zip(q1[:20], q3[:20]))}/20 "
          f"(reported, not asserted: see the docstring)")
    assert q3u == 0, q3u
    assert same >= 18, [(p, a, b) for p, a, b in zip(PROMPTS, t1, t3) if a != b]
    assert d1 == ["cpu"] and d3 == ["cpu:0", "cpu:1", "cpu:2"], (d1, d3)
    assert u1 == 0 and u3 == 0, (u1, u3)


NODE_PROMPTS = PROMPTS[:4]


def serve_cmd(*args):
    """A follower's command line: the flags su.Server gives node 0 around
    `args` (its defaults and PAGED_EXTRA_ARGS), since every node's
    configuration must match node 0's (engine/dist/node_config.h)."""
    return [su.binary(), "serve", "--model", su.MODEL, *su.DEFAULT_ARGS, *args, *su.EXTRA_ARGS]


def node_cmd(rank, nnodes, port, *extra):
    return serve_cmd("-tp", str(nnodes), "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-port",
                     str(port), "--matmul-mode", "exact", *extra)


def spawn_follower(cmd, log_path, env=None):
    """A follower process, its output into log_path: (Popen, log file)."""
    log = open(log_path, "w+")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log


def start_followers(nnodes, port, tmp, *extra):
    return [spawn_follower(node_cmd(r, nnodes, port, *extra), os.path.join(tmp, f"node{r}.log"))
            for r in range(1, nnodes)]


def follower_tails(followers):
    """The end of each follower's log, for a failure's report."""
    tails = []
    for i, (p, log) in enumerate(followers):
        log.flush()
        with open(log.name, errors="replace") as f:
            tails.append(f"--- node {i + 1} (exit {p.poll()}):\n{f.read()[-2000:]}")
    return "\n".join(tails)


def start_leader(srv, followers, spawn):
    """Starts node 0 (srv.start()); once it listens on the master port, the
    followers that spawn() starts, added to `followers` (the caller's, for
    its clean-up). Leader first, so no follower dials the port before
    anything listens there (a window where a dial can even join a socket to
    itself: common/net.c; the followers retry either way). When node 0 does
    not come up, the followers' logs go with its own."""
    import threading
    import time

    def later():
        deadline = time.time() + 120
        while time.time() < deadline:
            if srv.proc is not None and ("waiting on port" in srv.log() or srv.proc.poll() is not None):
                break
            time.sleep(0.05)
        followers.extend(spawn())

    th = threading.Thread(target=later)
    th.start()
    try:
        srv.start()
    except RuntimeError as e:
        th.join()
        srv.stop()
        raise RuntimeError(f"{e}\n" + follower_tails(followers)) from None
    th.join()


@contextlib.contextmanager
def nodes(srv, spawn, clean_exit=False):
    """Node 0 (the su.Server srv, not started) and its followers (spawn()
    returns [(Popen, log file)]), started by start_leader; yields the
    followers' list. With clean_exit, a body that returns then stops node 0
    and checks that it exited cleanly and every follower exited 0. Whatever
    happens, node 0 is stopped and every follower still running killed
    (after a SIGCONT, should it be stopped) and reaped; on a failure after
    the start, the followers' logs and node 0's go to stderr."""
    followers = []
    try:
        start_leader(srv, followers, spawn)  # its error names the followers' logs itself
        try:
            yield followers
            if clean_exit:
                srv.stop()
                srv.check_clean_exit()
                for p, log in followers:
                    assert p.wait(30) == 0, (p.returncode, open(log.name).read()[-2000:])
        except BaseException:
            srv.stop()
            sys.stderr.write(f"{follower_tails(followers)}\n--- node 0 (exit {srv.returncode}, {srv.logf.name}):\n"
                             f"{srv.log()[-3000:]}\n")
            raise
    finally:
        srv.stop()
        for p, log in followers:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(30)
            log.close()


def complete(port, prompt, max_tokens=24):
    return su.post(port, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                             "ignore_eos": True})


# Token masks travel to the other nodes inside the plan (pg_plan_seq.mask):
# a grammar and an allowed-token set must constrain every node's ranks alike.
NODE_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]}


def complete_masked(port, prompt):
    code, r = su.post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 40, "temperature": 0,
                                                "guided_json": NODE_SCHEMA})
    assert code == 200, r
    code, r2 = su.post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                 "ignore_eos": True, "allowed_token_ids": [28, 30, 253, 260],
                                                 "logprobs": 1})
    assert code == 200, r2
    return r["choices"][0]["text"], r2["choices"][0]["logprobs"]["tokens"]


def check_nodes():
    su.require_model_and_binary()
    with su.Server("--matmul-mode", "exact") as srv:
        ref = [complete(srv.port, p)[1]["choices"][0]["text"] for p in NODE_PROMPTS]
        ref_masked = complete_masked(srv.port, NODE_PROMPTS[0])
    with tempfile.TemporaryDirectory() as tmp:
        port = su.free_port(2)  # --master-port and its data plane
        srv = su.Server("-tp", "3", "--nnodes", "3", "--node-rank", "0", "--master-port", str(port),
                        "--matmul-mode", "exact")
        with nodes(srv, lambda: start_followers(3, port, tmp), clean_exit=True):
            got = [complete(srv.port, p)[1]["choices"][0]["text"] for p in NODE_PROMPTS]
            got_masked = complete_masked(srv.port, NODE_PROMPTS[0])
            su.wait_idle(srv.port)
            assert su.metric(su.metrics(srv.port), "paged:kv_cache_blocks", state="used") == 0
    print(f"  3 processes: {sum(a == b for a, b in zip(ref, got))}/{len(ref)} greedy texts equal one process's")
    assert got == ref, list(zip(ref, got))
    # The masked requests: the same valid JSON and the same allowed tokens.
    obj = json.loads(got_masked[0])
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int), got_masked
    assert got_masked == ref_masked, (got_masked, ref_masked)
    print(f"  3 processes: masked requests equal one process's ({got_masked[0]!r}, {got_masked[1]})")


def check_nodes_moe_alltoall():
    """Expert parallelism's combine by all-to-all (--all2all-backend
    alltoall, engine/model/moe_a2a.c) over the tcp communicator of two
    processes, and over the in-process one: a dummy Mixtral (8 experts, top
    2) answers as one process with the default all-reduce combine does."""
    su.require_model_and_binary()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(BASE, architectures=["MixtralForCausalLM"], model_type="mixtral", num_key_value_heads=4,
                   intermediate_size=128, num_local_experts=8, num_experts_per_tok=2)
        write_config(tmp, cfg)
        moe = ["--load-format", "dummy", "--hf-config", os.path.join(tmp, "config.json"), "--matmul-mode", "exact",
               "-tp", "2", "--enable-expert-parallel"]
        texts = {}
        for what, extra in (("all-reduce, one process", []), ("all-to-all, one process", ["--all2all-backend",
                                                                                           "alltoall"])):
            with su.Server(*moe, *extra) as srv:
                texts[what] = [complete(srv.port, p)[1]["choices"][0]["text"] for p in NODE_PROMPTS]
                if extra:
                    assert "each row's expert shares go to the rank owning the row" in srv.log(), srv.log()[-2000:]
        port = su.free_port(2)  # --master-port and its data plane
        node = moe[:-3] + ["--enable-expert-parallel", "--all2all-backend", "alltoall"]
        srv = su.Server(*node, "-tp", "2", "--nnodes", "2", "--node-rank", "0", "--master-port", str(port))
        spawn = lambda: [spawn_follower(  # noqa: E731
            serve_cmd(*node, "-tp", "2", "--nnodes", "2", "--node-rank", "1", "--master-port", str(port)),
            os.path.join(tmp, "node1.log"))]
        with nodes(srv, spawn, clean_exit=True):
            texts["all-to-all, two processes (tcp)"] = [complete(srv.port, p)[1]["choices"][0]["text"]
                                                        for p in NODE_PROMPTS]
            assert "each row's expert shares go to the rank owning the row" in srv.log(), srv.log()[-2000:]
    ref = texts["all-reduce, one process"]
    for what, got in texts.items():
        print(f"  MoE -tp 2 --enable-expert-parallel, {what}: {sum(a == b for a, b in zip(ref, got))}/{len(ref)} "
              "greedy texts equal the all-reduce's")
        assert got == ref, (what, list(zip(ref, got)))


def check_node_refused():
    su.require_model_and_binary()
    port = su.free_port(2)  # --master-port and its data plane
    # A follower that says --tp 2 to a node 0 of --tp 3: node 0 names both.
    bad = subprocess.Popen([su.binary(), "serve", "--model", su.MODEL, "-tp", "2", "--nnodes", "2", "--node-rank",
                            "1", "--master-port", str(port)], stderr=subprocess.PIPE, text=True)
    r = subprocess.run(node_cmd(0, 2, port)[:4] + ["-tp", "4", "--nnodes", "2", "--node-rank", "0", "--master-port",
                                                     str(port), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    err = bad.communicate(timeout=60)[1]
    assert r.returncode != 0 and "-tp 2" in r.stderr and "-tp 4" in r.stderr, r.stderr[-2000:]
    assert bad.returncode != 0 and "refused" in err, err[-2000:]


def check_node_config_mismatch():
    """A follower whose configuration differs from node 0's is refused at
    its hello with one line naming the field and both values, which both
    processes print; both exit non-zero within seconds (no weight read, no
    wait for a collective)."""
    import time
    su.require_model_and_binary()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(BASE, architectures=["MixtralForCausalLM"], model_type="mixtral", num_key_value_heads=4,
                   intermediate_size=128, num_local_experts=8, num_experts_per_tok=2)
        write_config(tmp, cfg)
        moe = ["--load-format", "dummy", "--hf-config", os.path.join(tmp, "config.json")]
        cases = [  # node 0's flags, the follower's, the line both print
            (moe + ["--enable-expert-parallel"], moe,
             "node 1: --enable-expert-parallel off here, on on node 0"),
            ([], ["--kv-cache-dtype", "f16"], "node 1: --kv-cache-dtype f16 here, f32 on node 0"),
            (["--max-model-len", "2048"], ["--max-model-len", "1024"],
             "node 1: --max-model-len 1024 here, 2048 on node 0"),
        ]
        for lead_extra, follow_extra, want in cases:
            port = su.free_port(2)  # --master-port and its data plane
            lead_log = open(os.path.join(tmp, "node0.log"), "w+")
            lead = subprocess.Popen(node_cmd(0, 2, port, "--port", "0", *lead_extra), stdout=lead_log,
                                    stderr=subprocess.STDOUT)
            follower = None
            try:
                deadline = time.time() + 60
                while time.time() < deadline and lead.poll() is None:
                    lead_log.flush()
                    if "waiting on port" in open(lead_log.name, errors="replace").read():
                        break
                    time.sleep(0.05)
                t0 = time.time()
                follower = subprocess.Popen(node_cmd(1, 2, port, *follow_extra), stderr=subprocess.PIPE, text=True)
                err = follower.communicate(timeout=30)[1]
                lead.wait(30)
                took = time.time() - t0
                lead_out = open(lead_log.name, errors="replace").read()
                assert lead.returncode not in (0, None) and want in lead_out, (want, lead_out[-2000:])
                assert follower.returncode != 0 and want in err, (want, err[-2000:])
                assert "loaded" not in lead_out and "loaded" not in err, (lead_out[-2000:], err[-2000:])
                assert took < 10, took
                print(f"  refused in {took:.1f} s: {want}")
            finally:
                for p in (lead, follower):
                    if p is not None and p.poll() is None:
                        p.kill()
                        p.wait(30)
                lead_log.close()


def check_node_dies():
    su.require_model_and_binary()
    with tempfile.TemporaryDirectory() as tmp:
        port = su.free_port(2)  # --master-port and its data plane
        srv = su.Server("-tp", "3", "--nnodes", "3", "--node-rank", "0", "--master-port", str(port),
                        "--matmul-mode", "exact", "--step-timeout", "10")
        with nodes(srv, lambda: start_followers(3, port, tmp)) as followers:
            st, _ = complete(srv.port, "Hello", 4)
            assert st == 200
            out = {}
            import threading
            t = threading.Thread(target=lambda: out.setdefault("r", complete(srv.port, "Once upon a time", 2000)))
            t.start()
            import time
            time.sleep(1.0)
            followers[1][0].kill()
            t.join(120)
            st, body = out["r"]
            assert st == 500, (st, body)
            rc = srv.wait(60)
            assert rc == 70, (rc, srv.log()[-3000:])
            assert "node 2" in srv.log() or "rank 2" in srv.log(), srv.log()[-3000:]


def check_local_rank_fails():
    su.require_model_and_binary()
    import threading
    import time
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=8,
                   max_position_embeddings=4096)
        write_config(tmp, cfg)
        dummy = ["--load-format", "dummy", "--hf-config", os.path.join(tmp, "config.json")]
        # (-tp, failing rank, streamed): at -tp 4 rank 3 is node 1's second
        # rank, rank 1 node 0's second (rank 0 waits for it on node 0, the
        # others on node 1); at -tp 2 rank 1 is node 1's only rank.
        for tp, fault_rank, stream in ((4, 3, False), (4, 1, True), (2, 1, False)):
            port = su.free_port(2)  # --master-port and its data plane
            env = dict(os.environ, PAGED_TP_FAULT_RANK=f"{fault_rank}:8")
            spawn = lambda: [spawn_follower(  # noqa: E731
                serve_cmd(*dummy, "-tp", str(tp), "--nnodes", "2", "--node-rank", "1", "--master-port", str(port)),
                os.path.join(tmp, f"node1-{fault_rank}.log"), env)]
            # The step timeout is a safety net far above the bound asserted
            # below: the failure must come from the abort, not the watchdog.
            srv = su.Server(*dummy, "-tp", str(tp), "--nnodes", "2", "--node-rank", "0", "--master-port",
                            str(port), "--step-timeout", "120", env={"PAGED_TP_FAULT_RANK": f"{fault_rank}:8"})
            with nodes(srv, spawn) as followers:
                follower = followers[0][0]
                st, _ = complete(srv.port, "Hello", 3)  # steps 1-3 are fine
                assert st == 200, st
                body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
                out = {}
                t0 = time.time()
                if stream:
                    t = threading.Thread(target=lambda: out.setdefault(
                        "r", su.sse_stream(srv.port, "/v1/completions", dict(body, stream=True), timeout=60)))
                else:
                    t = threading.Thread(target=lambda: out.setdefault(
                        "r", su.post(srv.port, "/v1/completions", body, timeout=60)))
                t.start()
                t.join(60)
                assert not t.is_alive(), "the request in flight hangs"
                took = time.time() - t0
                if stream:
                    st, events, done = out["r"]
                    assert st == 200 and done and "error" in events[-1], (st, events[-3:], done)
                else:
                    st, resp = out["r"]
                    assert st == 500, (st, resp)
                    su.error_of(resp)
                assert took < 15, f"the error took {took:.1f} s"
                # The watchdog (twice a second) turns /health to 503 until the exit.
                hst, deadline = None, time.time() + 10
                while hst != 503 and time.time() < deadline:
                    try:
                        hst = su.request(srv.port, "GET", "/health", timeout=5)[0]
                    except OSError:
                        break  # exited already
                    time.sleep(0.05)
                assert hst in (503, None) or srv.proc.poll() is not None, hst
                rc = srv.wait(60)
                assert rc == 70, (rc, srv.log()[-3000:])
                want = f"fault injection (PAGED_TP_FAULT_RANK): rank {fault_rank} failed step 8"
                failed = [l for l in srv.log().splitlines() if "engine failed" in l]
                assert failed and want in failed[0], (want, srv.log()[-3000:])
                # The follower stops once node 0 is gone.
                follower.wait(60)
                print(f"  -tp {tp}, rank {fault_rank} fails ({'stream' if stream else '500'}): error after {took:.2f} s, "
                      f"exit {rc}; {failed[0].split('engine failed: ')[-1][:110]}")


def check_node_stalls():
    su.require_model_and_binary()
    import threading
    import time
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=8,
                   max_position_embeddings=4096)
        write_config(tmp, cfg)
        common = ["--load-format", "dummy", "--hf-config", os.path.join(tmp, "config.json"), "-tp", "4",
                  "--nnodes", "2", "--tp-timeout", "2"]  # 2 s: a live but CPU-starved rank stays inside it
        port = su.free_port(2)  # --master-port and its data plane
        srv = su.Server(*common, "--node-rank", "0", "--master-port", str(port), "--step-timeout", "120")
        spawn = lambda: [spawn_follower(  # noqa: E731
            serve_cmd(*common, "--node-rank", "1", "--master-port", str(port)),
            os.path.join(tmp, "node1.log"))]
        with nodes(srv, spawn) as followers:  # a stopped follower gets a SIGCONT before its SIGKILL
            follower = followers[0][0]
            st, _ = complete(srv.port, "Hello", 3)
            assert st == 200, st
            # Stopped between requests: the next step's collectives wait for it.
            follower.send_signal(signal.SIGSTOP)
            out = {}
            t = threading.Thread(target=lambda: out.setdefault("r", su.post(
                srv.port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0,
                                              "ignore_eos": True}, timeout=60)))
            t0 = time.time()
            t.start()
            t.join(60)
            assert not t.is_alive(), "the request in flight hangs"
            took = time.time() - t0
            st, resp = out["r"]
            assert st == 500, (st, resp)
            assert took < 12, f"the error took {took:.1f} s"
            rc = srv.wait(60)
            assert rc == 70, (rc, srv.log()[-3000:])
            failed = [l for l in srv.log().splitlines() if "engine failed" in l]
            assert failed and ("sent nothing for 2.0 s" in failed[0] or "sent no reply for 2.0 s" in failed[0]), \
                srv.log()[-3000:]
            print(f"  follower stopped: error after {took:.2f} s, exit {rc}; "
                  f"{failed[0].split('engine failed: ')[-1][:100]}")


def check_refused():
    su.require_model_and_binary()
    cases = [
        (["--tensor-parallel-size", "2"], "does not divide the model's 9 attention heads"),
        (["-tp", "3", "--tp-comm", "nccl"], "nccl communicator needs --device cuda"),
        (["-tp", "0"], "-tp"),
    ]
    for args, want in cases:
        r = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--port", "0", *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and want in r.stderr, (args, r.returncode, r.stderr[-2000:])
        # One line, and no weight was read.
        assert "loaded" not in r.stderr and "KV cache on" not in r.stderr, r.stderr[-2000:]


def main():
    su.run_checks([
        ("--tp 2/4/8 logits equal --tp 1 within 1e-5 (dummy and safetensors weights)", check_logits),
        ("default model: --tp 3 greedy text equals --tp 1; per-rank memory metrics", check_default_model),
        ("--tp 3 over 3 processes (--nnodes 3) answers as one process does", check_nodes),
        ("MoE expert parallelism: the all-to-all combine, in one process and over 2 nodes (tcp), answers as "
         "the all-reduce does", check_nodes_moe_alltoall),
        ("a follower with other flags is refused by name", check_node_refused),
        ("a follower whose configuration differs is refused at its hello naming the field; both exit within "
         "seconds", check_node_config_mismatch),
        ("a follower that dies fails node 0's engine: 500, exit 70", check_node_dies),
        ("a local rank that fails before its collective fails the group at once: 500, exit 70",
         check_local_rank_fails),
        ("a follower that stops fails node 0 past --tp-timeout: 500, exit 70", check_node_stalls),
        ("bad tensor-parallel configurations stop with one line", check_refused),
    ])
    print("test_tensor_parallel: all passed")


if __name__ == "__main__":
    main()
