#!/usr/bin/env python3
"""Issue 18's defects, each on the real server over real sockets:
strict HTTP/1.1 parsing (invalid or empty header names, HTTP/2.0 -> 505,
Transfer-Encoding on HTTP/1.0), absolute-form request targets, strict JSON
(RFC 8259, duplicate keys), the legacy functions/function_call fields (400)
and an empty logit_bias (accepted), an empty --api-key refused at start-up,
SIGHUP draining like SIGTERM, /tokenize + /detokenize of 10^6 ids off the
loop thread, and bounded queues (buffered request bodies, waiting
requests) by default."""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()
import openai  # noqa: E402


def raw(port, data):
    """Sends raw bytes on a fresh connection; returns (status, headers, body)."""
    s = su.connect(port)
    try:
        s.sendall(data)
        st, h, body, _ = su.read_response(s)
        return st, h, body
    finally:
        s.close()


def strict_http(srv):
    port = srv.port
    cases = [
        (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n", 400, "header name"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n: empty\r\n\r\n", 400, "header name"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nName\x01: 1\r\n\r\n", 400, None),
        (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505, "version"),
        (b"GET /health HTTP/0.9\r\nHost: x\r\n\r\n", 505, "version"),
        (b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"5\r\n{\"a\":\r\n0\r\n\r\n", 400, "Transfer-Encoding"),
    ]
    for data, want, word in cases:
        st, h, body = raw(port, data)
        assert st == want, (data, st, body)
        assert h.get("connection") == "close", h
        e = su.error_of(body)
        assert e["code"] == want
        if word:
            assert word in e["message"], e
    # Still serving, and a valid HTTP/1.0 request still works.
    st, _, _ = raw(port, b"GET /health HTTP/1.0\r\n\r\n")
    assert st == 200


def absolute_form(srv):
    port = srv.port
    for target in [f"http://127.0.0.1:{port}/health", "http://example.com/health", "HTTP://x/health?probe=1"]:
        st, _, _ = raw(port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert st == 200, (target, st)
    st, _, body = raw(port, f"GET http://127.0.0.1:{port}/v1/models HTTP/1.1\r\nHost: x\r\n"
                            f"Connection: close\r\n\r\n".encode())
    assert st == 200 and json.loads(body)["data"], body
    # Authority only: the path is "/" (the chat page).
    st, _, body = raw(port, b"GET http://x?a=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert st == 200 and b"<html" in body, (st, body[:100])
    st, _, _ = raw(port, b"GET http://x/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert st == 404, st


def strict_json(srv):
    port = srv.port
    hdr = {"Content-Type": "application/json"}
    bad = [b'{"prompt": "x", "max_tokens": 01}', b'{"prompt": "x", "temperature": 1.}',
           b'{"prompt": "a\tb"}', b'{"prompt": "a\nb"}', b'{"prompt": "x", "max_tokens": -}',
           b'{"prompt": "x", "max_tokens": 2, "max_tokens": 3}']
    for body in bad:
        st, _, data = su.request(port, "POST", "/v1/completions", body, hdr)
        assert st == 400, (body, st, data)
        e = su.error_of(data)
        assert "JSON" in e["message"] or "twice" in e["message"], e
    # The same texts, valid: escaped TAB/LF and distinct keys.
    st, r = su.post(port, "/v1/completions", {"prompt": "a\tb\nc", "max_tokens": 1})
    assert st == 200, r


def unsupported_fields(srv):
    port = srv.port
    msgs = [{"role": "user", "content": "Hi"}]
    for field, value in [("functions", [{"name": "f", "parameters": {"type": "object"}}]),
                         ("function_call", "auto")]:
        st, r = su.post(port, "/v1/chat/completions", {"messages": msgs, field: value, "max_tokens": 1})
        assert st == 400 and r["error"]["param"] == field, r
        assert "function" in r["error"]["message"], r
    st, r = su.post(port, "/v1/chat/completions", {"messages": msgs, "logit_bias": {}, "max_tokens": 1})
    assert st == 200, r
    # logit_bias is supported (structured outputs and the request surface):
    # a bias is applied, one outside OpenAI's [-100, 100] is a 400.
    st, r = su.post(port, "/v1/completions", {"prompt": "Hi", "logit_bias": {"5": 1}, "max_tokens": 1})
    assert st == 200, r
    st, r = su.post(port, "/v1/completions", {"prompt": "Hi", "logit_bias": {"5": 200}, "max_tokens": 1})
    assert st == 400 and r["error"]["param"] == "logit_bias", r
    # The SDK sends logit_bias={} as is.
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    out = c.chat.completions.create(model=c.models.list().data[0].id, messages=msgs, max_tokens=1,
                                    logit_bias={})
    assert out.choices[0].finish_reason in ("length", "stop")


def empty_api_key():
    for args, env in [(["--api-key", ""], {}), ([], {"PAGED_API_KEY": ""})]:
        e = dict(os.environ, **env)
        p = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--port", "0"] + args,
                           capture_output=True, text=True, timeout=60, env=e)
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "empty" in lines[0], p.stderr


def sighup_drains():
    srv = su.Server()
    srv.start()
    try:
        port = srv.port
        out = {}

        def stream():
            out["r"] = su.sse_stream(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40,
                                                               "ignore_eos": True, "stream": True})

        t = threading.Thread(target=stream)
        t.start()
        deadline = time.time() + 60
        while time.time() < deadline and su.metric(su.metrics(port), "paged:generation_tokens_total") == 0:
            time.sleep(0.05)
        srv.signal(signal.SIGHUP)
        t.join(timeout=120)
        st, events, done = out["r"]
        assert st == 200 and done, (st, events[-1:])
        assert events[-1]["choices"][0]["finish_reason"] == "length", events[-1]
        assert srv.wait(60) == 0, srv.log()
        srv.check_clean_exit()
        assert "Hangup: draining" in srv.log(), srv.log()
    finally:
        srv.stop()


def big_token_lists_off_the_loop():
    """10^6 ids through /detokenize and a 10^6-id /tokenize answer: /health
    stays fast meanwhile (the work runs on the thread pool)."""
    with su.Server("--max-model-len", "2048", "--kv-cache-memory", "256M", "--max-body-bytes", "16M",
                   default_args=False) as srv:
        port = srv.port
        rnd = random.Random(3)
        ids = [rnd.randrange(100, 40000) for _ in range(1000000)]
        body = json.dumps({"tokens": ids}).encode()
        done = []

        def detok():
            for _ in range(3):
                t0 = time.time()
                st, _, data = su.request(port, "POST", "/detokenize", body, {"Content-Type": "application/json"})
                assert st == 200 and len(json.loads(data)["prompt"]) > 1000000, st
                done.append(time.time() - t0)

        t = threading.Thread(target=detok)
        t.start()
        worst = 0.0
        while t.is_alive():
            t0 = time.time()
            assert su.request(port, "GET", "/health", timeout=5)[0] == 200
            worst = max(worst, time.time() - t0)
            time.sleep(0.005)
        t.join()
        assert len(done) == 3
        assert worst < max(0.05, min(done) / 4), (worst, done)
        print(f"     3 x 10^6-id /detokenize in {min(done) * 1000:.0f}-{max(done) * 1000:.0f} ms each; "
              f"/health worst {worst * 1000:.1f} ms meanwhile")
        # Clients that leave while their ids are decoded cost nothing.
        for _ in range(4):
            s = su.connect(port)
            s.sendall(b"POST /detokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            s.close()
        su.wait_idle(port)
        st, r = su.post(port, "/detokenize", {"tokens": [1, 2, 3]})
        assert st == 200 and isinstance(r["prompt"], str), r


def bounded_buffers():
    """A global cap on buffered request bodies (503 + Retry-After, the
    connection closed), freed as bodies complete; waiting requests bounded
    by default (the start-up log says how)."""
    with su.Server("--max-buffered-body-bytes", "1M", "--max-body-bytes", "1M") as srv:
        port = srv.port
        assert "queues bounded: 1024 waiting requests, 1 MiB of request bodies" in srv.log(), srv.log()
        big = json.dumps({"tokens": [7] * 300000}).encode()[:900000]
        a = su.connect(port)
        a.sendall(b"POST /detokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % 900000 + big[:800000])
        time.sleep(0.3)
        # Declared too big for what is left: refused at the headers.
        st, h, body = raw(port, b"POST /detokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n")
        assert st == 503 and h.get("retry-after") == "1" and h.get("connection") == "close", (st, h)
        assert "busy" in su.error_of(body)["message"]
        # Chunked: refused when the bytes arrive.
        s = su.connect(port)
        s.sendall(b"POST /detokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        try:
            for _ in range(8):
                s.sendall(b"10000\r\n" + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        st, h, body, _ = su.read_response(s)
        s.close()
        assert st == 503 and h.get("retry-after") == "1", (st, h)
        # Small requests still pass, and once A's body is complete (and
        # answered) its bytes leave the budget.
        assert su.request(port, "GET", "/health")[0] == 200
        a.sendall(big[800000:])
        st, _, _, _ = su.read_response(a)
        a.close()
        assert st == 400, st  # the body was cut to fit: not valid JSON
        st, h, body = raw(port, b"POST /detokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n" +
                          json.dumps({"tokens": [7] * 50000}).encode().ljust(300000))
        assert st == 200, (st, body[:200])
    with su.Server("--max-waiting", "0") as srv:
        assert "waiting requests unbounded" in srv.log(), srv.log()


def main():
    with su.Server() as srv:
        su.run_checks([
            ("strict HTTP: bad/empty header names 400, HTTP/2.0 505, TE on 1.0 400", lambda: strict_http(srv)),
            ("absolute-form request targets", lambda: absolute_form(srv)),
            ("strict JSON: 01, 1., raw TAB/LF, duplicate keys -> 400", lambda: strict_json(srv)),
            ("functions/function_call 400, logit_bias {} accepted", lambda: unsupported_fields(srv)),
        ])
    su.run_checks([
        ("--api-key '' and PAGED_API_KEY='' refused at start-up", empty_api_key),
        ("SIGHUP drains like SIGTERM: the stream ends with [DONE], exit 0", sighup_drains),
        ("10^6-id /detokenize off the loop thread", big_token_lists_off_the_loop),
        ("bounded queues: buffered bodies 503 + Retry-After, waiting requests bounded", bounded_buffers),
    ])
    print("test_server_hardening: all passed")


if __name__ == "__main__":
    main()
