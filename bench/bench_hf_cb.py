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
Timing uses the manager's per-token timestamps (record_timestamps) after its
warm-up (CUDA graph capture), which is not timed.

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


def summarize(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}

    def q(p):
        k = (len(xs) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
    return {"n": len(xs), "mean": sum(xs) / len(xs), "min": xs[0], "p50": q(0.5), "p90": q(0.9),
            "p99": q(0.99), "max": xs[-1]}


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


def prompts(rng, n, length, vocab, lo=1000):
    hi = max(lo + 1, vocab - 1000)
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
        deadline = t0 + args.max_seconds if args.max_seconds > 0 else math.inf
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
                       "request_rate": "inf", "max_seconds": args.max_seconds,
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tests/gpu/llama3-8b-shape.json")
    ap.add_argument("--workloads", default="w1,w2", help="comma list of w1, w1cb, w2 (default %(default)s)")
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
    ap.add_argument("--max-seconds", type=float, default=0, help="stop W2 after this long (0 = no limit)")
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

    for w in [x.strip() for x in args.workloads.split(",") if x.strip()]:
        log(f"bench_hf_cb: {w} ...")
        t = time.perf_counter()
        try:
            if w == "w1":
                r = run_generate_w1(args, torch, model, cfg, rng)
            elif w == "w1cb":
                r = run_cb(args, torch, model, cfg, prompts(rng, 1, args.w1_in, cfg.vocab_size), args.w1_out,
                           "w1cb", attn)
            elif w == "w2":
                r = run_cb(args, torch, model, cfg, prompts(rng, args.w2_n, args.w2_len, cfg.vocab_size),
                           args.w2_len, "w2", attn)
            else:
                sys.exit(f"unknown workload {w}")
        except Exception as e:  # noqa: BLE001 - record and go on with the next workload
            import traceback
            traceback.print_exc()
            r = {"workload": w, "error": f"{type(e).__name__}: {e}", "completed": 0}
        r["label"] = args.label
        r["wall_s"] = time.perf_counter() - t
        res["results"][w] = r
        save()
        if "error" not in r and r.get("errors") and not r.get("completed"):
            r["error"] = "; ".join(r["errors"])[:500]
        if "error" not in r:
            log(f"bench_hf_cb: {w}: {r['completed']} done, {r['output_throughput']:.1f} output tok/s, "
                f"TTFT p50 {r['ttft_ms']['p50'] or 0:.1f} ms, TPOT p50 {r['tpot_ms']['p50'] or 0:.2f} ms, "
                f"mismatch {r['output_len_mismatch']}, {r['wall_s']:.0f} s")
    print(f"{'workload':10} {'engine':8} {'done':>6} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12}")
    for w, r in res["results"].items():
        if "error" in r:
            print(f"{w:10} {args.label:8} error: {r['error'][:80]}")
            continue
        print(f"{w:10} {args.label:8} {r['completed']:>6} {r['output_throughput']:>10.1f} "
              f"{r['ttft_ms']['p50'] or 0:>12.1f} {r['tpot_ms']['p50'] or 0:>12.2f}")


if __name__ == "__main__":
    main()
