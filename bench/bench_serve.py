#!/usr/bin/env python3
"""Serving benchmark client for any OpenAI-compatible server (paged, vLLM,
llama.cpp's llama-server, HF `transformers serve`), in the manner of
`vllm bench serve`.

Every request streams (SSE), so each token is timed: TTFT, TPOT, ITL and
end-to-end latency at p50/p90/p99 and mean, request and token throughput,
goodput (share of requests with TTFT < --goodput-ttft-ms and
TPOT < --goodput-tpot-ms), errors. Prompts are lists of token ids by default
(the /v1/completions API accepts them, so the prompt length is exact for the
target model); output lengths are fixed with max_tokens + ignore_eos.

  # W1: one stream, 128 in / 256 out
  bench/bench_serve.py --port 8000 --input-len 128 --output-len 256 --concurrency 1 --num-prompts 8
  # W2: everything at once
  bench/bench_serve.py --input-len 1000 --output-len 1000 --num-prompts 1000 --request-rate inf
  # W3: Poisson arrivals, lengths uniform in a range, a sweep of rates
  bench/bench_serve.py --input-len 512:1536 --output-len 64:512 --request-rate 1,2,4 --num-prompts 200
  # W4: closed-loop sweep
  bench/bench_serve.py --input-len 1000 --output-len 256 --concurrency 1,25,100,200,400 --num-prompts 800

Modes: with --concurrency N and no finite --request-rate, N clients each send
their next request as soon as the last one finished (closed loop). With
--request-rate R, requests arrive as a Poisson process of R req/s (gamma
with --burstiness), `inf` sending them all at once; --concurrency then caps
the requests in flight. Comma lists in either run a sweep, one result file
each (`OUT_c25.json`, `OUT_r2.json`).

Bounds: --max-seconds stops issuing new requests after that many seconds;
requests in flight get --drain-seconds more to finish and are then
cancelled (counted apart, not as errors); --timeout bounds each request;
Ctrl-C stops the same way and still writes the result.

Uses aiohttp when installed, else a small asyncio HTTP/1.1 client of its own
(standard library only); --http picks one.
"""
import argparse
import asyncio
import json
import math
import os
import random
import signal
import ssl
import sys
import time
from urllib.parse import urlsplit

try:
    import aiohttp
except ImportError:  # the stdlib client below takes over
    aiohttp = None

TOOL_VERSION = 1

# Short common English words: one token each (with their leading space) in
# the usual BPE vocabularies, so N words make a prompt of about N tokens.
WORDS = ("the of and to in is was for on that with as by at from his her it he she they we you are be "
         "had has have not but or an this which all one two three new more time year day man men world "
         "life work hand part place case week point home water room house area money story fact month "
         "lot right study book eye job word side kind head far long big high old great small large next "
         "early young few last good bad best sure free full open red blue green black white dark light "
         "cold warm hot road city town state land sea sky sun moon star tree wood stone fire rain snow "
         "wind river hill field farm garden school class child boy girl king queen war peace law power "
         "game team music song art film paper letter car ship train plane door wall floor bed table "
         "chair food bread milk tea wine fish bird dog cat horse cow heart mind body face voice name "
         "line group order form level end start run walk talk look find give take make keep hold turn "
         "move live play pay meet lead stand lose grow read write learn teach build send fall cut").split()


class HTTPStatusError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


# ---------------------------------------------------------------- HTTP clients


class AiohttpClient:
    name = "aiohttp"

    def __init__(self):
        self.session = None

    async def open(self):
        # One connection per request, as the stdlib client: a kept-alive socket that
        # the server closed after a stream fails the next request on it.
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        kw = dict(connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
        try:
            self.session = aiohttp.ClientSession(read_bufsize=1 << 20, **kw)
        except TypeError:  # aiohttp < 3.7
            self.session = aiohttp.ClientSession(**kw)

    async def close(self):
        if self.session:
            await self.session.close()

    async def get_json(self, url, headers):
        async with self.session.get(url, headers=headers) as r:
            body = await r.text()
            if r.status != 200:
                raise HTTPStatusError(r.status, body)
            return json.loads(body)

    async def post_lines(self, url, headers, body):
        """Yields the response body line by line (bytes, newline kept)."""
        async with self.session.post(url, data=body, headers=headers) as r:
            if r.status != 200:
                raise HTTPStatusError(r.status, (await r.read()).decode(errors="replace"))
            async for line in r.content:
                yield line


class StdlibClient:
    """HTTP/1.1 over asyncio streams: one connection per request
    (Connection: close), chunked or sized or read-to-close bodies."""
    name = "stdlib"

    async def open(self):
        pass

    async def close(self):
        pass

    async def _request(self, method, url, headers, body):
        u = urlsplit(url)
        tls = u.scheme == "https"
        host = u.hostname
        port = u.port or (443 if tls else 80)
        path = (u.path or "/") + ("?" + u.query if u.query else "")
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl.create_default_context() if tls else None, limit=1 << 20)
        try:
            hdr = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
                   "User-Agent: paged-bench_serve", f"Content-Length: {len(body)}"]
            hdr += [f"{k}: {v}" for k, v in headers.items()]
            writer.write(("\r\n".join(hdr) + "\r\n\r\n").encode() + body)
            await writer.drain()
            while True:
                line = await reader.readline()
                if not line:
                    raise ConnectionError("the server closed the connection before answering")
                parts = line.decode("latin-1").split(None, 2)
                if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                    raise ConnectionError(f"bad status line {line[:80]!r}")
                status = int(parts[1])
                rh = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    rh[k.strip().lower()] = v.strip()
                if status != 100:
                    break
            return status, rh, reader, writer
        except BaseException:
            writer.close()
            raise

    @staticmethod
    async def _body(rh, reader):
        """Yields the body in pieces, de-chunked."""
        if "chunked" in rh.get("transfer-encoding", "").lower():
            while True:
                size_line = await reader.readline()
                if not size_line:
                    raise ConnectionError("connection closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = await reader.readexactly(size)
                await reader.readexactly(2)
                yield data
        elif "content-length" in rh:
            left = int(rh["content-length"])
            while left > 0:
                data = await reader.read(min(left, 1 << 16))
                if not data:
                    raise ConnectionError("connection closed before Content-Length bytes")
                left -= len(data)
                yield data
        else:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    return
                yield data

    async def get_json(self, url, headers):
        status, rh, reader, writer = await self._request("GET", url, headers, b"")
        try:
            body = b"".join([d async for d in self._body(rh, reader)]).decode(errors="replace")
        finally:
            writer.close()
        if status != 200:
            raise HTTPStatusError(status, body)
        return json.loads(body)

    async def post_lines(self, url, headers, body):
        status, rh, reader, writer = await self._request("POST", url, headers, body)
        try:
            if status != 200:
                err = b""
                async for d in self._body(rh, reader):
                    err += d
                    if len(err) > 4096:
                        break
                raise HTTPStatusError(status, err.decode(errors="replace"))
            buf = b""
            async for data in self._body(rh, reader):
                buf += data
                while True:
                    i = buf.find(b"\n")
                    if i < 0:
                        break
                    yield buf[:i + 1]
                    buf = buf[i + 1:]
            if buf:
                yield buf
        finally:
            writer.close()


def make_client(kind):
    if kind == "aiohttp" or (kind == "auto" and aiohttp is not None):
        if aiohttp is None:
            sys.exit("bench_serve: --http aiohttp but aiohttp is not installed")
        return AiohttpClient()
    return StdlibClient()


# ---------------------------------------------------------------- workload


def parse_len(s):
    """'128' -> (128, 128); '512:1536' -> (512, 1536)."""
    lo, _, hi = str(s).partition(":")
    lo, hi = int(lo), int(hi or lo)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"bad length {s!r}: want N or MIN:MAX with 1 <= MIN <= MAX")
    return lo, hi


def make_specs(args, n, rng):
    """The requests of one run: (input_len, output_len, prompt)."""
    specs = []
    lo_id = args.token_id_min
    hi_id = args.token_id_max if args.token_id_max is not None else args.vocab_size - 1000
    if not 0 <= lo_id <= hi_id < args.vocab_size:
        sys.exit(f"bench_serve: bad token id range [{lo_id}, {hi_id}] for vocabulary {args.vocab_size}")
    for _ in range(n):
        il = rng.randint(*args.input_len)
        ol = rng.randint(*args.output_len)
        if args.prompt_mode == "ids":
            prompt = [rng.randint(lo_id, hi_id) for _ in range(il)]
        else:
            # A distinct number first, so no two prompts share a prefix.
            prompt = str(rng.randint(0, 10 ** 9)) + " " + " ".join(rng.choice(WORDS) for _ in range(il - 1))
        specs.append((il, ol, prompt))
    return specs


def build_body(args, il, ol, prompt, i=0):
    body = {"max_tokens": ol, "stream": True, "stream_options": {"include_usage": True},
            "temperature": args.temperature}
    if args.model:  # a comma-separated list: request i names the (i mod n)-th (LoRA adapters, say)
        models = args.model.split(",")
        body["model"] = models[i % len(models)]
    if args.top_p is not None:
        body["top_p"] = args.top_p
    if not args.no_ignore_eos:
        body["ignore_eos"] = True
    if args.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if args.backend == "llamacpp":
        body["n_predict"] = ol  # llama.cpp's own name; it wins over max_tokens there
    if args.extra_body:
        body.update(args.extra_body)
    return json.dumps(body).encode()


# ---------------------------------------------------------------- one request


class Result:
    __slots__ = ("i", "input_len", "output_len", "prompt_tokens", "output_tokens", "chunks", "ttft", "itl",
                 "e2el", "start", "ok", "cancelled", "error", "finish_reason")

    def __init__(self, i, il, ol):
        self.i, self.input_len, self.output_len = i, il, ol
        self.prompt_tokens = self.output_tokens = None
        self.chunks = 0
        self.ttft = self.e2el = None
        self.itl = []
        self.start = 0.0
        self.ok = self.cancelled = False
        self.error = self.finish_reason = None

    @property
    def tpot(self):
        if self.ok and self.output_tokens and self.output_tokens > 1 and self.ttft is not None:
            return (self.e2el - self.ttft) / (self.output_tokens - 1)
        return None


async def run_one(client, args, url, headers, i, il, ol, prompt, t0):
    r = Result(i, il, ol)
    body = build_body(args, il, ol, prompt, i)
    chat = args.api == "chat"
    st = time.perf_counter()
    r.start = st - t0
    last = None
    usage_out = None
    lines = client.post_lines(url, headers, body)

    async def consume():
        nonlocal last, usage_out
        async for raw in lines:
            if not raw.startswith(b"data:"):
                continue  # blank separators, comments, event:/id: lines
            data = raw[5:].strip()
            if data == b"[DONE]":
                break
            now = time.perf_counter()
            try:
                obj = json.loads(data)
            except ValueError:
                raise ValueError(f"bad SSE data: {data[:200]!r}")
            if not isinstance(obj, dict):
                continue
            if obj.get("error"):
                raise RuntimeError(f"error in stream: {json.dumps(obj['error'])[:300]}")
            usage = obj.get("usage")
            if usage:
                r.prompt_tokens = usage.get("prompt_tokens", r.prompt_tokens)
                usage_out = usage.get("completion_tokens", usage_out)
            choices = obj.get("choices")
            if choices:
                c = choices[0]
                if chat:
                    d = c.get("delta") or {}
                    text = d.get("content") or d.get("reasoning_content") or d.get("reasoning")
                else:
                    text = c.get("text")
                if text:
                    if r.ttft is None:
                        r.ttft = now - st
                    else:
                        r.itl.append(now - last)
                    last = now
                    r.chunks += 1
                if c.get("finish_reason"):
                    r.finish_reason = c["finish_reason"]

    try:
        await asyncio.wait_for(consume(), args.timeout)
        r.e2el = time.perf_counter() - st
        r.output_tokens = usage_out if usage_out is not None else r.chunks
        if r.ttft is None or not r.output_tokens:
            r.error = "the stream carried no tokens"
        else:
            r.ok = True
    except asyncio.CancelledError:
        r.cancelled = True
    except asyncio.TimeoutError:
        r.error = f"timeout after {args.timeout:g} s ({r.chunks} chunks received)"
    except Exception as e:  # noqa: BLE001 - every failure is a counted error
        r.error = f"{type(e).__name__}: {e}" if not isinstance(e, HTTPStatusError) else str(e)
    finally:
        try:
            await lines.aclose()
        except BaseException:  # noqa: BLE001
            pass
    return r


# ---------------------------------------------------------------- one run


async def bench_run(client, args, url, headers, specs, rate, concurrency, stop_flag):
    results = []
    inflight = [0, 0]  # now, max
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    deadline = t0 + args.max_seconds if args.max_seconds else math.inf
    rng = random.Random(args.seed + 1)
    tasks = set()

    async def one(i, spec):
        inflight[0] += 1
        inflight[1] = max(inflight[1], inflight[0])
        try:
            results.append(await run_one(client, args, url, headers, i, *spec, t0))
        finally:
            inflight[0] -= 1

    async def progress():
        while True:
            await asyncio.sleep(args.progress_seconds)
            done = sum(1 for r in results if r.ok)
            bad = sum(1 for r in results if r.error)
            print(f"  [{time.perf_counter() - t0:6.0f} s] done {done}/{len(specs)}, failed {bad}, "
                  f"in flight {inflight[0]}", file=sys.stderr, flush=True)

    prog = asyncio.ensure_future(progress()) if args.progress_seconds > 0 else None
    if concurrency and math.isinf(rate):
        # Closed loop: each client sends its next request when the last one ends.
        it = iter(enumerate(specs))

        async def worker():
            for i, spec in it:
                if stop_flag.is_set() or time.perf_counter() >= deadline:
                    return
                await one(i, spec)

        tasks = {asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(specs)))}
    else:
        sem = asyncio.Semaphore(concurrency) if concurrency else None

        async def limited(i, spec):
            try:
                await one(i, spec)
            finally:
                if sem:
                    sem.release()

        stop_task = asyncio.ensure_future(stop_flag.wait())
        next_t = t0
        for i, spec in enumerate(specs):
            if not math.isinf(rate):
                if args.burstiness == 1.0:
                    next_t += rng.expovariate(rate)
                else:
                    next_t += rng.gammavariate(args.burstiness, 1.0 / (rate * args.burstiness))
                wait = min(next_t, deadline) - time.perf_counter()
                if wait > 0:
                    await asyncio.wait([stop_task], timeout=wait)
            if stop_flag.is_set() or time.perf_counter() >= deadline:
                break
            if sem:
                acq = asyncio.ensure_future(sem.acquire())
                left = deadline - time.perf_counter()
                await asyncio.wait([acq, stop_task], timeout=None if math.isinf(left) else max(left, 0),
                                   return_when=asyncio.FIRST_COMPLETED)
                if not acq.done() or acq.cancelled():
                    acq.cancel()
                    break
            tasks.add(asyncio.ensure_future(limited(i, spec)))
        stop_task.cancel()

    # Wait for the requests in flight, at most --drain-seconds past the deadline.
    all_done = asyncio.gather(*tasks, return_exceptions=True)
    stop_task = asyncio.ensure_future(stop_flag.wait())
    hard = deadline + args.drain_seconds - time.perf_counter()
    await asyncio.wait([all_done, stop_task], return_when=asyncio.FIRST_COMPLETED,
                       timeout=None if math.isinf(hard) else max(hard, 0))
    stop_task.cancel()
    if not all_done.done():
        for t in tasks:
            t.cancel()
    outcomes = await all_done
    duration = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    if prog:
        prog.cancel()
    for o in outcomes:  # surface bugs in the harness itself
        if isinstance(o, Exception):
            raise o
    return results, duration, inflight[1], client_cpu


# ---------------------------------------------------------------- statistics


def quantile(sorted_xs, q):
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(xs_s):
    """Seconds in, milliseconds out."""
    xs = sorted(x * 1000.0 for x in xs_s)
    if not xs:
        return {"n": 0, "mean": None, "std": None, "min": None, "p50": None, "p90": None, "p99": None, "max": None}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return {"n": len(xs), "mean": mean, "std": std, "min": xs[0], "p50": quantile(xs, 0.5),
            "p90": quantile(xs, 0.9), "p99": quantile(xs, 0.99), "max": xs[-1]}


def cdf_grid(xs_s):
    """101 quantiles (0, 1, ..., 100 %) in ms: enough to draw a CDF."""
    xs = sorted(x * 1000.0 for x in xs_s)
    return [quantile(xs, k / 100.0) for k in range(101)] if xs else []


def throughput(n_ok, in_tok, out_tok, part_tok, duration):
    """Token and request rates of a run (also bench_hf_cb.py's): completed
    requests' tokens, and with the streamed tokens of cut requests (window)."""
    def per_s(x):
        return x / duration if duration > 0 else 0.0
    return {"total_input_tokens": in_tok, "total_output_tokens": out_tok,
            "request_throughput": per_s(n_ok), "output_throughput": per_s(out_tok),
            "cancelled_streamed_tokens": part_tok, "window_output_throughput": per_s(out_tok + part_tok),
            "total_token_throughput": per_s(in_tok + out_tok)}


def report(args, results, duration, max_inflight, rate, concurrency, server_info, client_cpu):
    ok = [r for r in results if r.ok]
    failed = [r for r in results if r.error]
    cancelled = [r for r in results if r.cancelled]
    in_tok = sum((r.prompt_tokens if r.prompt_tokens is not None else r.input_len) for r in ok)
    out_tok = sum(r.output_tokens for r in ok)
    # Tokens that requests cancelled at the end of the drain had streamed:
    # in a window-bounded run (a truncated W2, the last W4 clients) they are
    # work the server did inside the window.
    part_tok = sum(r.chunks for r in cancelled)
    ttft = [r.ttft for r in ok]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    itl = [x for r in ok for x in r.itl]
    e2el = [r.e2el for r in ok]
    good = sum(1 for r in ok if r.ttft * 1000 < args.goodput_ttft_ms
               and (r.tpot is None or r.tpot * 1000 < args.goodput_tpot_ms))
    judged = len(ok) + len(failed)
    errors = []
    for r in failed:
        if r.error not in errors:
            errors.append(r.error)
        if len(errors) >= 5:
            break
    res = {
        "tool": "bench_serve.py", "tool_version": TOOL_VERSION,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "label": args.label, "backend": args.backend, "api": args.api, "base_url": args.base_url,
        "endpoint": args.endpoint, "model": args.model, "server_models": server_info,
        "http_client": args.http_client_name,
        "config": {"input_len": list(args.input_len), "output_len": list(args.output_len),
                   "prompt_mode": args.prompt_mode, "vocab_size": args.vocab_size,
                   "num_prompts": args.num_prompts, "request_rate": "inf" if math.isinf(rate) else rate, "burstiness": args.burstiness,
                   "concurrency": concurrency,
                   "mode": "closed-loop" if concurrency and math.isinf(rate) else "open-loop",
                   "max_seconds": args.max_seconds, "drain_seconds": args.drain_seconds,
                   "timeout_s": args.timeout, "temperature": args.temperature, "ignore_eos": not args.no_ignore_eos,
                   "seed": args.seed, "warmup": args.warmup, "extra_body": args.extra_body},
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "issued": len(results), "completed": len(ok), "failed": len(failed), "cancelled": len(cancelled),
        "errors": errors,
        "duration_s": duration,
        "max_inflight": max_inflight,
        # This client's CPU time over the run: near 1.0 the client, not the
        # server, limits the figures (one Python thread).
        "client_cpu_share": client_cpu / duration if duration > 0 else 0.0,
        **throughput(len(ok), in_tok, out_tok, part_tok, duration),
        "ttft_ms": summarize(ttft), "tpot_ms": summarize(tpot), "itl_ms": summarize(itl),
        "e2el_ms": summarize(e2el),
        "goodput": {"ttft_ms_slo": args.goodput_ttft_ms, "tpot_ms_slo": args.goodput_tpot_ms, "good": good,
                    "fraction": good / judged if judged else 0.0,
                    "req_s": good / duration if duration > 0 else 0.0},
        "output_len_mismatch": sum(1 for r in ok if r.output_tokens != r.output_len),
        # Text prompts have only about the asked length: counted for id prompts.
        "input_len_mismatch": sum(1 for r in ok if r.prompt_tokens is not None and r.prompt_tokens != r.input_len)
        if args.prompt_mode == "ids" else None,
        "usage_reported": sum(1 for r in ok if r.prompt_tokens is not None),
        "cdf_ms": {"ttft": cdf_grid(ttft), "tpot": cdf_grid(tpot), "itl": cdf_grid(itl), "e2el": cdf_grid(e2el)},
        "requests": [{"i": r.i, "input_len": r.input_len, "output_len": r.output_len,
                      "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "chunks": r.chunks,
                      "start_s": round(r.start, 6),
                      "ttft_ms": None if r.ttft is None else round(r.ttft * 1000, 3),
                      "tpot_ms": None if r.tpot is None else round(r.tpot * 1000, 3),
                      "e2el_ms": None if r.e2el is None else round(r.e2el * 1000, 3),
                      "finish_reason": r.finish_reason,
                      "status": "ok" if r.ok else ("cancelled" if r.cancelled else "error"),
                      "error": r.error,
                      **({"itl_ms": [round(x * 1000, 3) for x in r.itl]} if args.save_itl else {})}
                     for r in sorted(results, key=lambda r: r.i)],
    }
    return res


def fmt(v, w=9, p=1):
    return f"{v:{w}.{p}f}" if isinstance(v, (int, float)) and v is not None else f"{'-':>{w}}"


def print_table(res):
    c = res["config"]
    mode = (f"closed loop, {c['concurrency']} clients" if c["mode"] == "closed-loop" else
            f"rate {c['request_rate']} req/s" + (f", at most {c['concurrency']} in flight" if c["concurrency"] else ""))
    il, ol = c["input_len"], c["output_len"]
    lens = (f"{il[0]}" if il[0] == il[1] else f"{il[0]}-{il[1]}") + " in / " + \
           (f"{ol[0]}" if ol[0] == ol[1] else f"{ol[0]}-{ol[1]}") + " out"
    g = res["goodput"]
    print("=" * 64)
    print(f" {res['label'] or res['backend']} @ {res['base_url']}{res['endpoint']}  ({res['http_client']})")
    print(f" {mode}; {lens}; {c['prompt_mode']} prompts")
    print(f" requests: {res['completed']} ok, {res['failed']} failed, {res['cancelled']} cancelled "
          f"of {res['issued']} issued; max in flight {res['max_inflight']}; "
          f"client CPU {100 * res['client_cpu_share']:.0f}%")
    print(f" duration {res['duration_s']:.2f} s | {res['request_throughput']:.3f} req/s | "
          f"output {res['output_throughput']:.1f} tok/s | total {res['total_token_throughput']:.1f} tok/s")
    print(f" goodput (TTFT < {g['ttft_ms_slo']:g} ms, TPOT < {g['tpot_ms_slo']:g} ms): "
          f"{100 * g['fraction']:.1f}% = {g['req_s']:.3f} req/s")
    print(f" {'ms':6} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9} {'max':>9}")
    for k in ("ttft", "tpot", "itl", "e2el"):
        s = res[k + "_ms"]
        print(f" {k.upper():6} {fmt(s['mean'])} {fmt(s['p50'])} {fmt(s['p90'])} {fmt(s['p99'])} {fmt(s['max'])}")
    if res["client_cpu_share"] > 0.8:
        print(f" note: this client used {100 * res['client_cpu_share']:.0f}% of a core: it may be the bottleneck")
    if res["output_len_mismatch"]:
        print(f" note: {res['output_len_mismatch']} requests did not produce exactly the asked output length "
              f"(ignore_eos not honoured?)")
    if res["input_len_mismatch"]:
        print(f" note: {res['input_len_mismatch']} requests had a server prompt length other than asked")
    for e in res["errors"]:
        print(f" error: {e}")
    print("=" * 64, flush=True)


# ---------------------------------------------------------------- main


def parse_rates(s):
    out = []
    for x in str(s).split(","):
        x = x.strip().lower()
        v = math.inf if x in ("inf", "infinity") else float(x)
        if v <= 0:
            raise argparse.ArgumentTypeError("request rates must be > 0 (or inf)")
        out.append(v)
    return out


def parse_ints(s):
    out = [int(x) for x in str(s).split(",")]
    if any(v < 1 for v in out):
        raise argparse.ArgumentTypeError("concurrency must be >= 1")
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("server")
    g.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    g.add_argument("--host", help="override the host of --base-url")
    g.add_argument("--port", type=int, help="override the port of --base-url")
    g.add_argument("--backend", choices=("openai", "llamacpp"), default="openai",
                   help="openai: max_tokens + ignore_eos; llamacpp: also n_predict (default %(default)s)")
    g.add_argument("--api", choices=("completions", "chat"), default="completions",
                   help="/v1/completions (token-id prompts) or /v1/chat/completions (text only)")
    g.add_argument("--endpoint", help="path (default /v1/completions or /v1/chat/completions)")
    g.add_argument("--model", help="model name to send (default: the first of GET /v1/models, else none); "
                   "A,B,...: request i sends the (i mod n)-th, e.g. requests spread over LoRA adapters")
    g.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="Bearer token ($OPENAI_API_KEY)")
    g.add_argument("--http", choices=("auto", "aiohttp", "stdlib"), default="auto",
                   help="HTTP client: aiohttp when installed, else the standard library (default %(default)s)")
    g = ap.add_argument_group("workload")
    g.add_argument("--num-prompts", type=int, default=100, help="requests per run (default %(default)s)")
    g.add_argument("--input-len", type=parse_len, default=(128, 128), help="N or MIN:MAX (uniform) prompt tokens")
    g.add_argument("--output-len", type=parse_len, default=(128, 128), help="N or MIN:MAX (uniform) output tokens")
    g.add_argument("--prompt-mode", choices=("ids", "text"), help="token-id lists (exact length; default for "
                   "completions) or text of ~1 token per word (default for chat)")
    g.add_argument("--vocab-size", type=int, default=32000,
                   help="vocabulary of the target model; 32000 is safe for any model with at least that many "
                        "(SmolLM2 49152, Llama-3 128256) (default %(default)s)")
    g.add_argument("--token-id-min", type=int, default=1000, help="smallest random token id (default %(default)s)")
    g.add_argument("--token-id-max", type=int, help="largest random token id (default vocab-size - 1000, "
                   "clear of special tokens at either end)")
    g.add_argument("--temperature", type=float, default=0.0, help="(default %(default)s)")
    g.add_argument("--top-p", type=float)
    g.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (servers that reject it)")
    g.add_argument("--extra-body", type=json.loads, help="JSON object merged into every request body")
    g.add_argument("--seed", type=int, help="seed of prompts, lengths and arrivals (default: random, so that "
                   "a rerun does not hit the server's prefix cache; recorded in the JSON)")
    g = ap.add_argument_group("load")
    g.add_argument("--request-rate", type=parse_rates, default=[math.inf],
                   help="req/s of Poisson arrivals, inf = all at once; a comma list sweeps (default inf)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of inter-arrival times; 1 = Poisson")
    g.add_argument("--concurrency", type=parse_ints, default=[None],
                   help="closed-loop clients (with rate inf), else a cap on requests in flight; a comma list sweeps")
    g.add_argument("--warmup", type=int, default=1, help="untimed requests first, one at a time (default %(default)s)")
    g = ap.add_argument_group("bounds")
    g.add_argument("--max-seconds", type=float, default=0, help="stop issuing requests after this long (0 = no limit)")
    g.add_argument("--drain-seconds", type=float, default=120,
                   help="past --max-seconds, wait this long for requests in flight, then cancel them (default %(default)s)")
    g.add_argument("--timeout", type=float, default=600, help="seconds per request (default %(default)s)")
    g.add_argument("--progress-seconds", type=float, default=10, help="progress line period on stderr; 0 = none")
    g = ap.add_argument_group("results")
    g.add_argument("--goodput-ttft-ms", type=float, default=500)
    g.add_argument("--goodput-tpot-ms", type=float, default=50)
    g.add_argument("--out", help="result JSON (with a sweep: OUT_c<N>.json / OUT_r<R>.json)")
    g.add_argument("--label", default="", help="engine name recorded in the JSON and used by plot_serve.py")
    g.add_argument("--save-itl", action="store_true", help="keep every inter-token latency per request in the JSON")
    g.add_argument("--fail-on-error", action="store_true", help="exit 1 when any request failed")
    args = ap.parse_args(argv)
    if args.host or args.port:
        u = urlsplit(args.base_url)
        args.base_url = f"{u.scheme}://{args.host or u.hostname}:{args.port or u.port or 80}"
    args.base_url = args.base_url.rstrip("/")
    if args.prompt_mode is None:
        args.prompt_mode = "text" if args.api == "chat" else "ids"
    if args.api == "chat" and args.prompt_mode == "ids":
        ap.error("the chat API takes text only: use --prompt-mode text")
    args.endpoint = args.endpoint or ("/v1/chat/completions" if args.api == "chat" else "/v1/completions")
    if len(args.request_rate) > 1 and len(args.concurrency) > 1:
        ap.error("sweep either --request-rate or --concurrency, not both")
    if args.extra_body is not None and not isinstance(args.extra_body, dict):
        ap.error("--extra-body must be a JSON object")
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    if args.num_prompts < 1:
        ap.error("--num-prompts must be >= 1")
    return args


def out_path(args, rate, conc):
    if not args.out:
        return None
    stem, ext = os.path.splitext(args.out)
    if len(args.concurrency) > 1:
        return f"{stem}_c{conc}{ext or '.json'}"
    if len(args.request_rate) > 1:
        return f"{stem}_r{'inf' if math.isinf(rate) else f'{rate:g}'}{ext or '.json'}"
    return args.out


async def amain(args):
    stop_flag = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, lambda s=sig: (print(f"\nbench_serve: signal {s}, stopping",
                                                               file=sys.stderr), stop_flag.set()))
        except (NotImplementedError, RuntimeError):
            pass
    client = make_client(args.http)
    args.http_client_name = client.name + (f" {aiohttp.__version__}" if client.name == "aiohttp" else "")
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    await client.open()
    rc = 0
    try:
        server_info = None
        try:
            models = await asyncio.wait_for(client.get_json(args.base_url + "/v1/models", headers), 30)
            server_info = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
            if not args.model and server_info:
                args.model = server_info[0]
        except Exception as e:  # noqa: BLE001 - not every server lists models
            print(f"bench_serve: GET /v1/models: {e}; sending no model name", file=sys.stderr)
        url = args.base_url + args.endpoint
        rng = random.Random(args.seed)
        for k, spec in enumerate(make_specs(args, args.warmup, random.Random(args.seed + 7))):
            r = await run_one(client, args, url, headers, -1 - k, *spec, time.perf_counter())
            if not r.ok:
                print(f"bench_serve: warm-up request failed: {r.error}", file=sys.stderr)
                return 2
            if stop_flag.is_set():
                return 130
        for rate in args.request_rate:
            for conc in args.concurrency:
                if stop_flag.is_set():
                    break
                specs = make_specs(args, args.num_prompts, rng)
                results, duration, max_inflight, client_cpu = await bench_run(client, args, url, headers, specs, rate, conc,
                                                                     stop_flag)
                res = report(args, results, duration, max_inflight, rate, conc, server_info, client_cpu)
                print_table(res)
                path = out_path(args, rate, conc)
                if path:
                    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                    with open(path + ".tmp", "w") as f:
                        json.dump(res, f, indent=1, allow_nan=False)
                    os.replace(path + ".tmp", path)
                    print(f" wrote {path}", flush=True)
                if res["failed"] and args.fail_on_error:
                    rc = 1
    finally:
        await client.close()
    return rc if not stop_flag.is_set() else (rc or 130)


def raise_fd_limit():
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def main(argv=None):
    args = parse_args(argv)
    raise_fd_limit()
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
