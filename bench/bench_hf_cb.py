#!/usr/bin/env python3
"""bench/bench_hf_cb.py - the HF transformers peer of bench_serve.py: W1 and W2
through transformers itself (no HTTP), on a model built from a config.json
with random weights (the same shape as paged's and llama.cpp's GGUF).

    bench/bench_hf_cb.py --config tests/gpu/llama3-8b-shape.json --out $OUT/hf.json
    bench/bench_hf_cb.py --workloads w1,w1cb,w2 --w2-n 64 --w2-len 1000 --max-seconds 300

Workloads (token-id prompts drawn from [1000, vocab - 1000], output lengths
fixed: EOS disabled, every request generates exactly its max_new_tokens):
  w1    1 request, 128 in / 256 out, plain model.generate (DynamicCache,
        --generate-attn, default sdpa): TTFT from a 1-token generate, TPOT =
        (t(256 tokens) - t(1 token)) / 255, tokens/s = 1000 / TPOT.
  w1cb  the same request through continuous batching (generate manager).
  w2    --w2-n requests of --w2-len in / --w2-len out, all submitted at once
        to the continuous batching manager (model.init_continuous_batching,
        attention --attn, default paged|sdpa, or paged|flash_attention_2
        when flash_attn is installed); output tokens/s = generated tokens of
        the completed requests / (last finish - submission). BENCHMARKS.md's
        W2 is 1000 requests: HF runs ~600 tok/s, so --w2-n defaults to 64
        and the JSON records the count (and "truncated" when --max-seconds
        stopped the run before every request finished).
  w4    closed loop, for each C in --w4-conc: C clients, each submitting its
        next request (--w4-in random ids in, --w4-out out) when its last one
        finished, for --w4-seconds; requests in flight then get at most
        --w4-drain more seconds and are cut (counted as "cancelled", the
        tokens they had streamed go into window_output_throughput, as in
        bench_serve.py). Keys w4_c<C>.
  w3    Poisson arrivals at each rate of --w3-rates req/s for --w3-seconds,
        input lengths uniform in --w3-in (512:1536), outputs in --w3-out
        (64:512), drained like w4. Keys w3_r<rate>.
w1 / w1cb / w2 time from the manager's per-token timestamps (record_timestamps)
after its warm-up (CUDA graph capture), which is not timed. w3 / w4 run on
ONE manager (one warm-up) shared by all their runs: requests are added one by
one with streaming=True, so the manager hands back an output per generated
token; TTFT = receipt of the first streamed token in this (client) thread -
the add_request call, ITL = gaps between receipts, TPOT = (e2e - TTFT) /
(n - 1), e2e = receipt of the last token - add_request (bench_serve.py's
definitions, with in-process delivery standing in for SSE). The manager's
own per-token timestamps give engine_ttft_ms / engine_tpot_ms / engine_itl_ms
as well. A run cut with requests in flight ends with a hard stop of the
manager (the batch processor and its warm-up are kept) and a restart.

--max-seconds is a budget for the whole process, counted from its start: w2
is cut where it runs out, and a w1 / w2 / w3 / w4 run that would not fit is
skipped and marked so ("skipped" in its result); w3 / w4 drains shrink to
share what is left among the runs still to do.

Writes one JSON (--out) with a result per workload in bench_serve.py's
field names (output_throughput, total_token_throughput, ttft_ms / tpot_ms
summaries, completed, failed, output_len_mismatch, config) and prints a
table last. Needs torch and transformers (5.x: continuous batching API).
"""
import argparse
import importlib.util
import json
import math
import os
import random
import sys
import time

import bench_serve  # its summary statistics (this file's folder is on sys.path)

T_START = time.perf_counter()  # the --max-seconds budget counts from here


def budget_left(args):
    return math.inf if not args.max_seconds or args.max_seconds <= 0 else \
        args.max_seconds - (time.perf_counter() - T_START)


def parse_list(s, conv=str):
    return [conv(x) for x in s.replace(",", " ").split()]


def parse_range(s):
    """'512:1536' -> (512, 1536); '1000' -> (1000, 1000)."""
    a, _, b = str(s).partition(":")
    return int(a), int(b or a)


def summarize(xs_ms):
    """Milliseconds in and out: bench_serve.py's summary (same quantiles)."""
    return bench_serve.summarize([x / 1000.0 for x in xs_ms if x is not None])


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def build_model(args, torch):
    from transformers import AutoConfig, AutoModelForCausalLM
    path = args.config if not os.path.isdir(args.config) else os.path.join(args.config, "config.json")
    raw = json.load(open(path))
    raw.pop("architectures", None)
    mt = raw.pop("model_type", "llama")
    raw.pop("torch_dtype", None)
    raw.pop("dtype", None)
    cfg = AutoConfig.for_model(mt, **raw)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    with torch.device(args.device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=args.generate_attn)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=args.generate_attn)
    model.to(device=args.device, dtype=dtype)
    # Seeded N(0, std^2) for matrices and embeddings, 1 for norms (whatever
    # from_config did).
    g = torch.Generator(device=args.device).manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, args.std, generator=g)
    model.eval()
    if args.device == "cuda":
        torch.cuda.synchronize()
    n = sum(p.numel() for p in model.parameters())
    log(f"bench_hf_cb: model {mt} {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{n / 1e9:.2f} B parameters, {args.dtype}, built in {time.perf_counter() - t0:.1f} s")
    return model, cfg, n


def id_range(vocab, lo=1000):
    """Prompt ids in [lo, vocab - 1000) (a tiny smoke-test vocabulary: its middle half)."""
    if vocab < 4 * lo:
        return vocab // 4, max(vocab // 4 + 1, 3 * vocab // 4)
    return lo, vocab - 1000


def prompts(rng, n, length, vocab, lo=1000):
    lo, hi = id_range(vocab, lo)
    return [[rng.randrange(lo, hi) for _ in range(length)] for _ in range(n)]


def pick_attn(args):
    if args.attn != "auto":
        return args.attn
    if args.device == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "paged|flash_attention_2"
    return "paged|sdpa"


def run_generate_w1(args, torch, model, cfg, rng):
    """W1 with plain generate: TTFT from a 1-token call, TPOT from the difference."""
    from transformers import GenerationConfig
    ids = torch.tensor(prompts(rng, 1, args.w1_in, cfg.vocab_size), device=args.device)
    mask = torch.ones_like(ids)

    def gen(n):
        gc = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                              pad_token_id=0, bos_token_id=None)
        sync()
        t = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
        sync()
        return time.perf_counter() - t, out.shape[1] - ids.shape[1]

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()
    with torch.no_grad():
        gen(4)  # warm-up
        t1 = min(gen(1)[0] for _ in range(3))
        runs = [gen(args.w1_out) for _ in range(args.w1_runs)]
    tpots = [(t - t1) / (n - 1) * 1000 for t, n in runs]
    total = sum(t for t, _ in runs)
    out_tok = sum(n for _, n in runs)
    return {"workload": "w1", "method": "model.generate (DynamicCache)", "attn": args.generate_attn,
            "config": {"input_len": args.w1_in, "output_len": args.w1_out, "num_prompts": len(runs),
                       "concurrency": 1},
            "completed": len(runs), "failed": 0,
            "output_len_mismatch": sum(1 for _, n in runs if n != args.w1_out),
            "total_output_tokens": out_tok, "duration_s": total,
            "output_throughput": out_tok / total, "total_token_throughput": (out_tok + args.w1_in * len(runs)) / total,
            "decode_tok_s": 1000 / summarize(tpots)["p50"],
            "ttft_ms": summarize([t1 * 1000]), "tpot_ms": summarize(tpots)}


def run_cb(args, torch, model, cfg, inputs, out_len, name, attn):
    """All inputs at once through the continuous batching manager."""
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError:
        WorkloadHints = None
    original_attn = model.config._attn_implementation
    model.set_attn_implementation(attn)  # explicit: the manager's own choice may look for flash kernels online
    gc = GenerationConfig(max_new_tokens=out_len, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb_kw = {}
    if args.max_memory_percent:
        cb_kw["max_memory_percent"] = args.max_memory_percent
    if args.max_batch_tokens:
        cb_kw["max_batch_tokens"] = args.max_batch_tokens
    if args.num_blocks:
        cb_kw["num_blocks"] = args.num_blocks
    if args.compile_level:
        cb_kw["default_compile_level"] = args.compile_level
    cbc = ContinuousBatchingConfig(**cb_kw)
    kw = {}
    if WorkloadHints is not None:
        kw["workload_hints"] = WorkloadHints(max_prompt_length=max(len(x) for x in inputs),
                                             max_generated_length=out_len, num_requests=len(inputs))
    t_w = time.perf_counter()
    manager = model.init_continuous_batching(generation_config=gc, continuous_batching_config=cbc, **kw)
    if args.device == "cuda" and not args.no_warmup:
        manager.warmup()
    warm_s = time.perf_counter() - t_w
    manager.start()
    results, errors, truncated = {}, [], False
    t0 = time.perf_counter()
    try:
        ids = manager.add_requests(inputs=inputs, max_new_tokens=out_len, record_timestamps=True)
        left = budget_left(args)  # keep ~15 s of the global budget for the stop and what follows
        deadline = t0 + max(left - 15, 5) if math.isfinite(left) else math.inf
        last_log = t0
        while len(results) < len(ids):
            r = manager.get_result(timeout=1)
            now = time.perf_counter()
            if r is not None and r.is_finished():
                results[r.request_id] = (r, now)
            elif r is None and not manager.is_running():
                errors.append("generation thread stopped")
                break
            if now > deadline:
                truncated = True
                break
            if now - last_log > 30:
                log(f"  {name}: {len(results)}/{len(ids)} done, {now - t0:.0f} s")
                last_log = now
    finally:
        t_stop = time.perf_counter()
        try:
            manager.stop(block=True, timeout=60, hard_stop=truncated or bool(errors))
        except TypeError:
            manager.stop(block=True, timeout=60)
        # A hard stop fails the requests still running, with the tokens they had.
        partial = []
        for _ in range(len(inputs)):
            try:
                r = manager.get_result(timeout=0.2)
            except Exception:  # noqa: BLE001 - queue gone
                r = None
            if r is None:
                break
            if r.request_id not in results:
                partial.append(r)
        if hasattr(manager, "destroy"):
            try:
                manager.destroy()
            except Exception as e:  # noqa: BLE001 - cleanup only
                log(f"  manager.destroy: {e}")
        model.set_attn_implementation(original_attn)
    ok = [(r, t) for r, t in results.values() if r.error is None]
    failed = [r for r, _ in results.values() if r.error is not None]
    for r in failed[:5]:
        errors.append(str(r.error))
    ttft, tpot, e2e = [], [], []
    out_tok = 0
    end = t0
    for r, t_seen in ok:
        n = len(r.generated_tokens)
        out_tok += n
        ts = r.timestamps or []
        finish = ts[-1] if ts else (r.lifespan[1] if r.lifespan[1] > 0 else t_seen)
        end = max(end, finish)
        if ts:
            ttft.append((ts[0] - t0) * 1000)
            if n > 1:
                tpot.append((ts[-1] - ts[0]) / (n - 1) * 1000)
        e2e.append((finish - t0) * 1000)
    dur = (end - t0) if ok else (time.perf_counter() - t0)
    partial_tok = sum(len(r.generated_tokens or []) for r in partial)
    if truncated:  # throughput of the cut run: every token made until the stop
        out_tok += partial_tok
        dur = t_stop - t0
    in_tok = sum(len(r.prompt_ids) or len(inputs[0]) for r, _ in ok)
    return {"workload": name, "method": "continuous batching (init_continuous_batching manager)", "attn": attn,
            "config": {"input_len": len(inputs[0]), "output_len": out_len, "num_prompts": len(inputs),
                       "request_rate": "inf", "budget_s": args.max_seconds,
                       "continuous_batching_config": {k: str(v) for k, v in cb_kw.items()}},
            "warmup_s": warm_s, "truncated": truncated, "partial_requests": len(partial),
            "partial_output_tokens": partial_tok,
            "issued": len(inputs), "completed": len(ok), "failed": len(failed) + (len(inputs) - len(results)),
            "errors": errors, "duration_s": dur,
            "total_input_tokens": in_tok, "total_output_tokens": out_tok,
            "output_throughput": out_tok / dur if dur > 0 else 0.0,
            "total_token_throughput": (in_tok + out_tok) / dur if dur > 0 else 0.0,
            "output_len_mismatch": sum(1 for r, _ in ok if len(r.generated_tokens) != out_len),
            "ttft_ms": summarize(ttft), "tpot_ms": summarize(tpot), "e2el_ms": summarize(e2e)}


# ------------------------------------------------------------- w3 / w4


class SharedCB:
    """One continuous batching manager (one warm-up) for every w3 / w4 run.
    A run that ends with requests in flight is cut by a hard stop
    (keep_for_next_session: the batch processor, its cache and CUDA graphs
    stay) and the next run starts the generation thread again."""

    def __init__(self, args, torch, model, attn, max_in, max_out, max_requests):
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig
        try:
            from transformers.generation.continuous_batching.utils import WorkloadHints
        except ImportError:
            WorkloadHints = None
        self.args, self.torch, self.model, self.attn = args, torch, model, attn
        self.original_attn = model.config._attn_implementation
        model.set_attn_implementation(attn)
        gc = GenerationConfig(max_new_tokens=max_out, do_sample=False, eos_token_id=-1, pad_token_id=0)
        self.cb_kw = {}
        if args.max_memory_percent:
            self.cb_kw["max_memory_percent"] = args.max_memory_percent
        if args.max_batch_tokens:
            self.cb_kw["max_batch_tokens"] = args.max_batch_tokens
        if args.num_blocks:
            self.cb_kw["num_blocks"] = args.num_blocks
        if args.compile_level:
            self.cb_kw["default_compile_level"] = args.compile_level
        kw = {}
        if WorkloadHints is not None:
            kw["workload_hints"] = WorkloadHints(max_prompt_length=max_in, max_generated_length=max_out,
                                                 num_requests=max_requests)
        t = time.perf_counter()
        self.manager = model.init_continuous_batching(
            generation_config=gc, continuous_batching_config=ContinuousBatchingConfig(**self.cb_kw), **kw)
        if args.device == "cuda" and not args.no_warmup:
            self.manager.warmup()
        elif getattr(self.manager, "batch_processor", None) is None and hasattr(self.manager, "_create_batch_processor"):
            # The KV cache is allocated here, not inside the first run's clock.
            self.manager.batch_processor = self.manager._create_batch_processor()
        self.warmup_s = time.perf_counter() - t
        self.broken = None  # why the manager cannot be used any more
        self.restarts = 0
        log(f"bench_hf_cb: shared manager for w3/w4 ready in {self.warmup_s:.1f} s ({attn})")

    def ensure_running(self):
        if not self.manager.is_running():
            if self.model.config._attn_implementation != self.attn:
                self.model.set_attn_implementation(self.attn)
            self.manager.start()

    def drain_queue(self):
        q = self.manager.output_router.output_queue
        n = 0
        while True:
            try:
                q.get_nowait()
                n += 1
            except Exception:  # noqa: BLE001 - queue.Empty
                return n

    def join_timeout(self):
        # The generation thread stops after its current step; never wait past the budget for it.
        return max(5.0, min(60.0, budget_left(self.args) - 3))

    def cut(self):
        """Hard stop with what is in flight (failed by the manager), keep the warm processor."""
        t = time.perf_counter()
        timeout = self.join_timeout()
        try:
            self.manager.stop(block=True, timeout=timeout, keep_for_next_session=True, hard_stop=True)
        except TypeError:
            self.manager.stop(block=True, timeout=timeout, keep_for_next_session=True)
        # stop() parks the manager on the model for init_continuous_batching: not wanted here.
        if getattr(self.model, "_cached_continuous_batching_manager", None) is self.manager:
            delattr(self.model, "_cached_continuous_batching_manager")
        if self.manager.is_running():
            self.broken = f"the generation thread did not stop within {timeout:.0f} s of a hard stop"
        self.drain_queue()
        self.restarts += 1
        return time.perf_counter() - t

    def close(self):
        try:
            if self.manager.is_running():
                self.manager.stop(block=True, timeout=self.join_timeout(), hard_stop=True)
            if getattr(self.model, "_cached_continuous_batching_manager", None) is self.manager:
                delattr(self.model, "_cached_continuous_batching_manager")
            self.manager.batch_processor = None
            if hasattr(self.manager, "destroy"):
                self.manager.destroy()
        except Exception as e:  # noqa: BLE001 - cleanup only
            log(f"  shared manager close: {e}")
        self.model.set_attn_implementation(self.original_attn)
        self.manager = None
        import gc
        gc.collect()
        if self.args.device == "cuda":
            self.torch.cuda.empty_cache()


class Req:
    __slots__ = ("rid", "start", "input_len", "output_len", "n", "first", "last", "itl", "end", "ok", "error",
                 "engine_ts", "queue_s")

    def __init__(self, rid, start, il, ol):
        self.rid, self.start, self.input_len, self.output_len = rid, start, il, ol
        self.n = 0
        self.first = self.last = self.end = None
        self.itl = []
        self.ok = False
        self.error = self.engine_ts = self.queue_s = None


def run_stream(args, shared, name, mode, level, issue_s, drain_s, in_range, out_range, vocab, seed):
    """One w4 (mode 'closed', level = clients) or w3 (mode 'poisson', level =
    req/s) run on the shared manager; returns a bench_serve.py-shaped dict."""
    rng = random.Random(f"{seed}-{name}")
    lo_id, hi_id = id_range(vocab)

    def spec():
        il = rng.randint(*in_range)
        ol = rng.randint(*out_range)
        return [rng.randrange(lo_id, hi_id) for _ in range(il)], ol

    manager = shared.manager
    shared.ensure_running()
    shared.drain_queue()
    reqs, inflight = {}, set()
    errors = []
    # Prompts for the first burst are drawn before the clock starts.
    first = [spec() for _ in range(int(level))] if mode == "closed" else []
    arrivals = []
    if mode == "poisson":
        t = 0.0
        while True:
            t += rng.expovariate(level)
            if t >= issue_s:
                break
            arrivals.append(t)
    ai = 0
    max_inflight = 0
    t0 = time.perf_counter()
    cpu0 = time.thread_time()  # this (client) thread only: the manager's thread is another
    deadline = t0 + issue_s
    hard = deadline + drain_s

    def submit(prompt, ol):
        nonlocal max_inflight
        rid = f"{name}_{len(reqs)}"
        st = time.perf_counter()
        manager.add_request(input_ids=prompt, request_id=rid, max_new_tokens=ol, streaming=True,
                            record_timestamps=True)
        reqs[rid] = Req(rid, st, len(prompt), ol)
        inflight.add(rid)
        max_inflight = max(max_inflight, len(inflight))

    for p, ol in first:
        submit(p, ol)
    next_log = t0 + 30
    while True:
        now = time.perf_counter()
        if now >= hard:
            break
        if mode == "poisson":
            while ai < len(arrivals) and t0 + arrivals[ai] <= now:
                submit(*spec())
                ai += 1
            if not inflight and ai >= len(arrivals):
                break
        elif not inflight and now >= deadline:
            break
        wait = min(0.05, hard - now)
        if mode == "poisson" and ai < len(arrivals):
            wait = min(wait, t0 + arrivals[ai] - now)
        if now > next_log:
            log(f"  {name}: {sum(r.ok for r in reqs.values())} done, {len(inflight)} in flight, {now - t0:.0f} s")
            next_log = now + 30
        out = manager.get_result(timeout=max(wait, 0.001))
        if out is None:
            if not manager.is_running():
                errors.append("generation thread stopped")
                break
            continue
        t = time.perf_counter()
        r = reqs.get(out.request_id)
        if r is None or r.end is not None:
            continue  # not this run's
        n = len(out.generated_tokens or [])
        if n > r.n:
            if r.first is None:
                r.first = t
                r.itl.extend([0.0] * (n - 1))
            else:
                r.itl.append(t - r.last)
                r.itl.extend([0.0] * (n - r.n - 1))  # several tokens in one output (not expected)
            r.last, r.n = t, n
        if out.is_finished():
            r.end = t
            inflight.discard(r.rid)
            r.error = out.error
            r.ok = out.error is None and r.first is not None
            if out.error is None and r.first is None:
                r.error = "finished without a token"
            r.engine_ts = out.timestamps
            if out.lifespan and out.lifespan[0] > 0:
                r.queue_s = out.lifespan[0] - r.start
            if mode == "closed" and t < deadline:
                submit(*spec())
    t_end = time.perf_counter()
    cut_ids = sorted(inflight)
    stop_s = shared.cut() if cut_ids or errors else 0.0
    duration = t_end - t0
    client_cpu = time.thread_time() - cpu0

    ok = [r for r in reqs.values() if r.ok]
    failed = [r for r in reqs.values() if r.end is not None and not r.ok]
    cancelled = [reqs[i] for i in cut_ids]
    for r in failed:
        if r.error not in errors and len(errors) < 5:
            errors.append(str(r.error))
    out_tok = sum(r.n for r in ok)
    part_tok = sum(r.n for r in cancelled)
    in_tok = sum(r.input_len for r in ok)
    ttft = [r.first - r.start for r in ok]
    e2el = [r.last - r.start for r in ok]
    tpot = [(r.last - r.first) / (r.n - 1) for r in ok if r.n > 1]
    itl = [x for r in ok for x in r.itl]
    e_ttft, e_tpot, e_itl = [], [], []
    for r in ok:
        ts = r.engine_ts or []
        if ts:
            e_ttft.append(ts[0] - r.start)
            if len(ts) > 1:
                e_tpot.append((ts[-1] - ts[0]) / (len(ts) - 1))
                e_itl.extend(b - a for a, b in zip(ts, ts[1:]))
    good = sum(1 for r in ok if (r.first - r.start) * 1000 < args.goodput_ttft_ms
               and (r.n <= 1 or (r.last - r.first) / (r.n - 1) * 1000 < args.goodput_tpot_ms))
    judged = len(ok) + len(failed)

    ms = bench_serve.summarize  # seconds in, milliseconds out
    return {
        "workload": name, "method": "continuous batching, streaming=True (shared init_continuous_batching manager)",
        "attn": shared.attn,
        "measured": ("in-process: TTFT = receipt of the first streamed GenerationOutput in the client thread "
                     "- add_request; ITL = gaps between receipts; TPOT = (e2e - TTFT) / (n - 1); e2e = receipt "
                     "of the last token - add_request; engine_* from the manager's record_timestamps (token "
                     "appended in the generation thread); queue_ms = scheduled (lifespan[0]) - add_request"),
        "config": {"input_len": list(in_range), "output_len": list(out_range),
                   "request_rate": level if mode == "poisson" else "inf",
                   "concurrency": int(level) if mode == "closed" else None,
                   "mode": "closed-loop" if mode == "closed" else "open-loop",
                   "max_seconds": issue_s, "drain_seconds": drain_s, "ignore_eos": True, "seed": seed,
                   "continuous_batching_config": {k: str(v) for k, v in shared.cb_kw.items()}},
        "issued": len(reqs), "completed": len(ok), "failed": len(failed), "cancelled": len(cancelled),
        "errors": errors, "duration_s": duration, "max_inflight": max_inflight,
        "client_cpu_share": client_cpu / duration if duration > 0 else 0.0,
        "stop_s": stop_s,
        **bench_serve.throughput(len(ok), in_tok, out_tok, part_tok, duration),
        "ttft_ms": ms(ttft), "tpot_ms": ms(tpot), "itl_ms": ms(itl), "e2el_ms": ms(e2el),
        "engine_ttft_ms": ms(e_ttft), "engine_tpot_ms": ms(e_tpot), "engine_itl_ms": ms(e_itl),
        "queue_ms": ms([r.queue_s for r in ok if r.queue_s is not None]),
        # TTFT of every request that streamed a token, the cut ones too (ttft_ms: completed ones, as bench_serve)
        "ttft_all_ms": ms([r.first - r.start for r in reqs.values() if r.first is not None]),
        "goodput": {"ttft_ms_slo": args.goodput_ttft_ms, "tpot_ms_slo": args.goodput_tpot_ms, "good": good,
                    "fraction": good / judged if judged else 0.0,
                    "req_s": good / duration if duration > 0 else 0.0},
        "output_len_mismatch": sum(1 for r in ok if r.n != r.output_len),
    }


def stream_plan(args):
    """[(key, workload, mode, level, issue_s, drain_s, in_range, out_range)] for w4 and w3, in --workloads order."""
    plan = []
    for w in parse_list(args.workloads):
        if w == "w4":
            for c in parse_list(args.w4_conc):
                plan.append((f"w4_c{c}", "w4", "closed", int(c), args.w4_seconds, args.w4_drain,
                             parse_range(args.w4_in), parse_range(args.w4_out)))
        elif w == "w3":
            for r in parse_list(args.w3_rates):
                plan.append((f"w3_r{r}", "w3", "poisson", float(r), args.w3_seconds, args.w3_drain,
                             parse_range(args.w3_in), parse_range(args.w3_out)))
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tests/gpu/llama3-8b-shape.json")
    ap.add_argument("--workloads", default="w1,w2", help="comma list of w1, w1cb, w2, w4, w3 (default %(default)s)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--attn", default="auto", help="CB attention: auto, paged|sdpa, paged|flash_attention_2, ...")
    ap.add_argument("--generate-attn", default="sdpa", help="attention of the model / plain generate (W1)")
    ap.add_argument("--w1-in", type=int, default=128)
    ap.add_argument("--w1-out", type=int, default=256)
    ap.add_argument("--w1-runs", type=int, default=2)
    ap.add_argument("--w2-n", type=int, default=64, help="W2 requests (default %(default)s; BENCHMARKS.md: 1000)")
    ap.add_argument("--w2-len", type=int, default=1000, help="W2 input = output tokens (default %(default)s)")
    ap.add_argument("--w4-conc", default="1,25,100,200,400", help="W4 closed-loop clients, a list (default %(default)s)")
    ap.add_argument("--w4-seconds", type=float, default=12, help="W4 issuing window per level (default %(default)s)")
    ap.add_argument("--w4-drain", type=float, default=10,
                    help="W4: at most this long for the requests in flight after the window (default %(default)s)")
    ap.add_argument("--w4-in", default="1000", help="W4 input length, N or LO:HI (default %(default)s)")
    ap.add_argument("--w4-out", default="256", help="W4 output length, N or LO:HI (default %(default)s)")
    ap.add_argument("--w3-rates", default="2,8,16", help="W3 Poisson rates in req/s, a list (default %(default)s)")
    ap.add_argument("--w3-seconds", type=float, default=12, help="W3 issuing window per rate (default %(default)s)")
    ap.add_argument("--w3-drain", type=float, default=10, help="W3 drain bound (default %(default)s)")
    ap.add_argument("--w3-in", default="512:1536", help="W3 input lengths, uniform in LO:HI (default %(default)s)")
    ap.add_argument("--w3-out", default="64:512", help="W3 output lengths, uniform in LO:HI (default %(default)s)")
    ap.add_argument("--min-drain", type=float, default=2,
                    help="w3/w4: a run whose share of the budget leaves less drain than this is skipped")
    ap.add_argument("--run-overhead", type=float, default=3,
                    help="w3/w4: first guess of the seconds a run takes beyond window + drain (hard stop, restart); "
                         "raised to the largest seen")
    ap.add_argument("--reserve", type=float, default=6,
                    help="seconds of --max-seconds kept for closing the manager and writing the JSON")
    ap.add_argument("--goodput-ttft-ms", type=float, default=500)
    ap.add_argument("--goodput-tpot-ms", type=float, default=50)
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="budget for the whole process from its start (0 = none): w2 is cut where it runs out, "
                         "runs that would not fit are skipped and marked")
    ap.add_argument("--max-memory-percent", type=float, default=None)
    ap.add_argument("--max-batch-tokens", type=int, default=None)
    ap.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: from free GPU memory)")
    ap.add_argument("--compile-level", type=int, default=0, help="ContinuousBatchingConfig.default_compile_level")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--label", default="hf")
    ap.add_argument("--out", help="result JSON")
    args = ap.parse_args()

    import torch
    import transformers
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_hf_cb: no CUDA device (use --device cpu for a smoke run)")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model, cfg, n_params = build_model(args, torch)
    attn = pick_attn(args)
    res = {"tool": "bench_hf_cb.py", "label": args.label, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
           "model_config": args.config, "parameters": n_params, "dtype": args.dtype, "cb_attn": attn,
           "results": {}}

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)

    def finish(key, r, t):
        r["label"] = args.label
        r["wall_s"] = time.perf_counter() - t
        if "error" not in r and "skipped" not in r and r.get("errors") and not r.get("completed") \
                and not r.get("cancelled"):
            r["error"] = "; ".join(r["errors"])[:500]
        res["results"][key] = r
        save()
        if "skipped" in r:
            log(f"bench_hf_cb: {key}: skipped ({r['skipped']})")
        elif "error" in r:
            log(f"bench_hf_cb: {key}: error {r['error'][:200]}")
        else:
            log(f"bench_hf_cb: {key}: {r['completed']} done"
                + (f", {r['cancelled']} cut" if r.get("cancelled") else "")
                + f", {r['output_throughput']:.1f} output tok/s"
                + (f" (window {r['window_output_throughput']:.1f})" if "window_output_throughput" in r else "")
                + f", TTFT p50 {r['ttft_ms']['p50'] or 0:.1f} ms, TPOT p50 {r['tpot_ms']['p50'] or 0:.2f} ms, "
                f"mismatch {r['output_len_mismatch']}, {r['wall_s']:.0f} s, budget left {budget_left(args):.0f} s")

    plan = stream_plan(args)
    n_stream = len(plan)
    over_est = args.run_overhead
    shared = None
    res["budget_s"] = args.max_seconds
    for w in parse_list(args.workloads):
        if w not in ("w1", "w1cb", "w2", "w3", "w4"):
            sys.exit(f"unknown workload {w}")
        if w in ("w3", "w4"):
            for key, _, mode, level, issue_s, drain_ask, in_r, out_r in [p for p in plan if p[1] == w]:
                t = time.perf_counter()
                left = budget_left(args) - args.reserve
                if shared is not None and shared.broken:
                    finish(key, {"workload": key, "skipped": shared.broken, "completed": 0}, t)
                    n_stream -= 1
                    continue
                if left < issue_s + over_est + args.min_drain:
                    finish(key, {"workload": key, "completed": 0,
                                 "skipped": f"no time left ({max(left, 0):.0f} s of --max-seconds "
                                            f"{args.max_seconds:g}, needs {issue_s + over_est + args.min_drain:.0f})"},
                           t)
                    n_stream -= 1
                    continue
                log(f"bench_hf_cb: {key} ...")
                try:
                    built = shared is None
                    if built:
                        shared = SharedCB(args, torch, model, attn, max(p[6][1] for p in plan),
                                          max(p[7][1] for p in plan),
                                          max([p[3] for p in plan if p[2] == "closed"] +
                                              [int(p[3] * p[4] * 1.5) + 8 for p in plan if p[2] == "poisson"]))
                        res["shared_manager_warmup_s"] = shared.warmup_s
                        left = budget_left(args) - args.reserve
                    # This run's share of what is left: the drain shrinks first, down to --min-drain.
                    share = (left - n_stream * (issue_s + over_est)) / n_stream
                    drain = max(args.min_drain, min(drain_ask, share))
                    drain = min(drain, left - issue_s - over_est)
                    t_run = time.perf_counter()
                    r = run_stream(args, shared, key, mode, level, issue_s, drain, in_r, out_r, cfg.vocab_size,
                                   args.seed)
                    r["config"]["drain_seconds_asked"] = drain_ask
                    r["warmup_s"] = shared.warmup_s if built else 0.0  # before the clock, not timed
                    over_est = max(over_est, time.perf_counter() - t_run - issue_s - drain)
                except Exception as e:  # noqa: BLE001 - record and go on
                    import traceback
                    traceback.print_exc()
                    r = {"workload": key, "error": f"{type(e).__name__}: {e}", "completed": 0}
                    if shared is not None and shared.manager is not None:
                        try:
                            shared.cut()
                        except Exception as e2:  # noqa: BLE001
                            shared.broken = f"manager unusable after an error: {e2}"
                n_stream -= 1
                finish(key, r, t)
            continue
        if shared is not None:  # w1cb / w2 make their own manager (and KV cache)
            shared.close()
            shared = None
        t = time.perf_counter()
        need = 40 if w == "w1" else 30
        if budget_left(args) - args.reserve < need:
            finish(w, {"workload": w, "completed": 0,
                       "skipped": f"no time left ({max(budget_left(args), 0):.0f} s of --max-seconds)"}, t)
            continue
        log(f"bench_hf_cb: {w} ...")
        try:
            if w == "w1":
                r = run_generate_w1(args, torch, model, cfg, rng)
            elif w == "w1cb":
                r = run_cb(args, torch, model, cfg, prompts(rng, 1, args.w1_in, cfg.vocab_size), args.w1_out,
                           "w1cb", attn)
            else:
                r = run_cb(args, torch, model, cfg, prompts(rng, args.w2_n, args.w2_len, cfg.vocab_size),
                           args.w2_len, "w2", attn)
        except Exception as e:  # noqa: BLE001 - record and go on with the next workload
            import traceback
            traceback.print_exc()
            r = {"workload": w, "error": f"{type(e).__name__}: {e}", "completed": 0}
        finish(w, r, t)
    if shared is not None:
        shared.close()
    res["wall_s"] = time.perf_counter() - T_START
    save()
    print_table(args, res)
    import threading
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        log("bench_hf_cb: a generation thread is still running (a step past the budget): exiting without it")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def print_table(args, res):
    print(f"{'workload':10} {'engine':8} {'done':>6} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12}")
    for w, r in res["results"].items():
        if "skipped" in r:
            print(f"{w:10} {args.label:8} skipped: {r['skipped'][:80]}")
            continue
        if "error" in r:
            print(f"{w:10} {args.label:8} error: {r['error'][:80]}")
            continue
        tput = r["window_output_throughput"] if r.get("cancelled") else r["output_throughput"]
        print(f"{w:10} {args.label:8} {r['completed']:>6} {tput:>10.1f} "
              f"{r['ttft_ms']['p50'] or 0:>12.1f} {r['tpot_ms']['p50'] or 0:>12.2f}")


if __name__ == "__main__":
    main()
