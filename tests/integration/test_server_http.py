#!/usr/bin/env python3
"""HTTP edge cases with raw sockets: requests split at every byte (headers,
Content-Length and chunked bodies), pipelining answered in order, keep-alive,
HTTP/1.0, Expect: 100-continue, slowloris connections (bounded in time),
malformed JSON and invalid UTF-8, clients that disconnect mid-stream and
mid-prefill (their requests are aborted and their KV blocks freed), and a
client that pipelines without reading (the server stops reading it: bounded
memory).

Runs against $PAGED_BIN (default build/paged); test_server_http_asan.py runs
it against build/asan/paged."""
import json
import os
import socket
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
ASAN = "asan" in su.binary()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def post_bytes(path, obj, extra_headers=b""):
    body = json.dumps(obj).encode()
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n" +
            extra_headers + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def chunked_bytes(path, obj):
    body = json.dumps(obj).encode()
    parts = [body[i:i + 7] for i in range(0, len(body), 7)]
    out = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    for p in parts:
        out += b"%x\r\n" % len(p) + p + b"\r\n"
    return out + b"0\r\n\r\n"


def non_reading_stream_dropped():
    """A streaming client that stops reading: once the socket buffers are
    full and nothing is written for --write-timeout, the server drops it and
    aborts its request; it never buffers the whole generation. (A long
    served model name makes each chunk ~8 KB, so the kernel's socket buffers
    fill in seconds on a CPU model.)"""
    with su.Server("--write-timeout", "2", "--served-model-name", "m" * 8000) as srv:
        port = srv.port
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        s.connect(("127.0.0.1", port))
        s.sendall(post_bytes("/v1/completions", {"prompt": "Tell me a very long story.", "max_tokens": 1000,
                                                 "ignore_eos": True, "stream": True, "n": 4}))
        t0 = time.time()
        while time.time() - t0 < 120:
            st, _, data = su.request(port, "GET", "/metrics")
            aborted = sum(float(l.rpartition(" ")[2]) for l in data.decode().splitlines()
                          if l.startswith("paged:request_success_total") and 'finished_reason="abort"' in l)
            gen = sum(float(l.rpartition(" ")[2]) for l in data.decode().splitlines()
                      if l.startswith("paged:generation_tokens_total"))
            if aborted >= 4:
                break
            time.sleep(0.25)
        dt = time.time() - t0
        s.close()
        assert aborted >= 4, (dt, gen)
        assert gen < 4000, gen  # dropped long before the end
        assert "client not reading" in srv.log() or "not reading" in srv.log(), srv.log()[-2000:]
        print(f"     dropped after {dt:.1f}s and {gen:.0f} of 4000 tokens")
        su.wait_idle(port)


def big_prompts_off_the_loop():
    """Large prompts are tokenized on the thread pool: /health stays fast
    while 600 KB prompts are encoded, and clients that leave meanwhile cost
    nothing."""
    with su.Server("--max-model-len", "8192", "--kv-cache-memory", "512M", default_args=False) as srv:
        port = srv.port
        # Distinct random words (no tokenizer cache hits): each encoding takes
        # long enough that a blocked loop would stand out from scheduling noise.
        rnd = random.Random(7)
        words = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 11)))
                 for _ in range(90000)]
        text = " ".join(words)[:624000]  # 624 KB
        done = []

        def tokenize():
            for _ in range(3):
                t0 = time.time()
                st, r = su.post(port, "/tokenize", {"prompt": text})
                assert st == 200 and r["count"] > 100000, st
                done.append(time.time() - t0)

        t = threading.Thread(target=tokenize)
        t.start()
        worst = 0.0
        while t.is_alive():
            t0 = time.time()
            assert su.request(port, "GET", "/health", timeout=5)[0] == 200
            worst = max(worst, time.time() - t0)
            time.sleep(0.005)
        t.join()
        assert len(done) == 3
        assert worst < max(0.1, min(done) / 2), (worst, done)
        print(f"     3 x 624 KB tokenized in {min(done) * 1000:.0f}-{max(done) * 1000:.0f} ms each; "
              f"/health worst {worst * 1000:.1f} ms meanwhile")
        # Too long for the model: 400 after tokenizing, or at once by size.
        st, r = su.post(port, "/v1/completions", {"prompt": text, "max_tokens": 1})
        assert st == 400 and "maximum context length" in r["error"]["message"], r
        st, r = su.post(port, "/v1/completions", {"prompt": text * 2, "max_tokens": 1})
        assert st == 400 and "bytes long" in r["error"]["message"], r
        # Clients that leave while their prompt is being tokenized.
        for _ in range(5):
            s = su.connect(port)
            s.sendall(post_bytes("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}))
            s.close()
        su.wait_idle(port)
        assert su.request(port, "GET", "/health")[0] == 200


def main():
    with su.Server("--header-timeout", "2", "--body-timeout", "2", "--keep-alive-timeout", "3") as srv:
        port = srv.port

        def send_split(sock, data, cuts):
            last = 0
            for c in cuts:
                sock.sendall(data[last:c])
                time.sleep(0.002)  # separate segments
                last = c
            sock.sendall(data[last:])

        def split_at_every_byte():
            reqs = [
                (b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n", 200, None),
                (post_bytes("/tokenize", {"prompt": "héllo wörld"}), 200, "tokens"),
                (chunked_bytes("/tokenize", {"prompt": "chunked body"}), 200, "tokens"),
            ]
            s = su.connect(port)
            leftover = b""
            for data, status, key in reqs:
                for cut in range(1, len(data)):
                    send_split(s, data, [cut])
                    st, _, body, leftover = su.read_response(s, leftover)
                    assert st == status, (data[:cut], st, body)
                    if key:
                        assert key in json.loads(body)
            # One byte at a time, a whole completion request.
            data = post_bytes("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "temperature": 0})
            send_split(s, data, range(1, len(data)))
            st, _, body, leftover = su.read_response(s, leftover)
            assert st == 200 and json.loads(body)["choices"][0]["text"] is not None
            s.close()

        def pipelining_in_order():
            s = su.connect(port)
            batch = b""
            expect = []
            for i in range(12):
                if i % 4 == 0:
                    batch += post_bytes("/v1/completions", {"prompt": f"Count {i}:", "max_tokens": 2,
                                                            "temperature": 0, "ignore_eos": True})
                    expect.append("completion")
                elif i % 4 == 1:
                    batch += b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
                    expect.append("health")
                elif i % 4 == 2:
                    batch += post_bytes("/tokenize", {"prompt": "x" * (i + 1)})
                    expect.append(("tokenize", i + 1))
                else:
                    batch += chunked_bytes("/detokenize", {"tokens": [i]})
                    expect.append("detokenize")
            s.sendall(batch)  # all at once
            leftover = b""
            for e in expect:
                st, _, body, leftover = su.read_response(s, leftover)
                assert st == 200, (e, st, body)
                if e == "completion":
                    assert json.loads(body)["usage"]["completion_tokens"] == 2
                elif e == "health":
                    assert body == b""
                elif isinstance(e, tuple):
                    assert json.loads(body)["count"] >= 1
                else:
                    assert "prompt" in json.loads(body)
            assert leftover == b""
            s.close()

        def keepalive_http10_expect():
            s = su.connect(port)
            for _ in range(3):
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
                st, h, body, rest = su.read_response(s)
                assert st == 200 and "connection" not in h and rest == b""
            s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            st, h, _, _ = su.read_response(s)
            assert st == 200 and h["connection"] == "close"
            assert s.recv(1) == b""
            s.close()
            # HTTP/1.0: closes unless keep-alive is asked for.
            s = su.connect(port)
            s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            st, h, _, _ = su.read_response(s)
            assert st == 200 and h.get("connection") == "close"
            assert s.recv(1) == b""
            s.close()
            s = su.connect(port)
            s.sendall(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            st, h, _, _ = su.read_response(s)
            assert st == 200 and h.get("connection") == "keep-alive"
            # A streamed response on HTTP/1.0 is close-delimited.
            s.sendall(post_bytes("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True}).replace(
                b"HTTP/1.1", b"HTTP/1.0"))
            st, h, body, _ = su.read_response(s)
            assert st == 200 and body.rstrip().endswith(b"data: [DONE]"), body
            s.close()
            # Expect: 100-continue gets an interim 100, then the answer.
            s = su.connect(port)
            body = json.dumps({"prompt": "abc"}).encode()
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n")
            head = s.recv(100)
            assert head.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), head
            s.sendall(body)
            st, _, out, _ = su.read_response(s)
            assert st == 200 and json.loads(out)["count"] >= 1
            s.close()
            # An idle keep-alive connection is closed after --keep-alive-timeout (3 s).
            s = su.connect(port)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            su.read_response(s)
            t0 = time.time()
            s.settimeout(10)
            assert s.recv(1) == b""
            assert 2 < time.time() - t0 < 6

        def slowloris_bounded():
            # 40 connections trickling header bytes; all are cut off with 408
            # within the header timeout, while others are served normally.
            socks = [su.connect(port) for _ in range(40)]
            idle = su.connect(port)  # sends nothing at all
            t0 = time.time()
            for s in socks:
                s.sendall(b"GET /health HTTP/1.1\r\n")
            done = [False] * len(socks)
            statuses = []
            while not all(done) and time.time() - t0 < 10:
                st, _, _ = su.request(port, "GET", "/health", timeout=2)
                assert st == 200
                for i, s in enumerate(socks):
                    if done[i]:
                        continue
                    try:
                        s.sendall(b"X: y\r\n")  # one more header line
                    except OSError:
                        done[i] = True
                        continue
                    s.setblocking(False)
                    try:
                        data = s.recv(65536)
                        if data:
                            statuses.append(int(data.split(b" ")[1]))
                        done[i] = True
                    except BlockingIOError:
                        pass
                    s.setblocking(True)
                time.sleep(0.3)
            dt = time.time() - t0
            assert all(done) and dt < 6, (dt, sum(done))
            assert statuses and all(st == 408 for st in statuses), statuses
            idle.settimeout(5)
            assert idle.recv(1) == b""  # the silent connection is closed too
            for s in socks + [idle]:
                s.close()

        def malformed_and_invalid_utf8():
            s = su.connect(port)
            for raw in [b'{"prompt": "Hi", "max_tokens": 2', b'{"prompt": "\xc3\x28"}', b'{"prompt": "\xed\xa0\x80"}',
                        b'{"messages": [{"role": "user", "content": "\xff"}]}', b'\x00\x01\x02']:
                path = b"/v1/chat/completions" if b"messages" in raw else b"/v1/completions"
                s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nContent-Length: " + str(len(raw)).encode() +
                          b"\r\n\r\n" + raw)
                st, _, body, _ = su.read_response(s)
                assert st == 400, (raw, st)
                su.error_of(body)
            # Invalid UTF-8 in the URL or a header does not break anything.
            s.sendall(b"GET /health\xff HTTP/1.1\r\nHost: t\r\n\r\n")
            try:
                st, _, _, _ = su.read_response(s)
                assert st in (400, 404)
            except ConnectionError:
                pass
            s.close()
            s = su.connect(port)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Bad: \xff\xfe\r\n\r\n")
            assert su.read_response(s)[0] in (200, 400)
            s.close()

        def disconnect_mid_stream():
            m0 = su.metrics(port)
            aborted0 = su.metric(m0, "paged:request_success_total", finished_reason="abort")
            for n in (1, 2):
                s = su.connect(port)
                s.sendall(post_bytes("/v1/completions", {"prompt": "Write a long story.", "max_tokens": 500,
                                                         "ignore_eos": True, "stream": True, "n": n}))
                buf = b""
                while buf.count(b"data: ") < 3:
                    chunk = s.recv(4096)
                    assert chunk, buf
                    buf += chunk
                s.close()  # mid-stream
            m = su.wait_idle(port, timeout=60)
            assert su.metric(m, "paged:request_success_total", finished_reason="abort") >= aborted0 + 3
            assert su.metric(m, "paged:kv_cache_blocks", state="used") == 0

        def disconnect_mid_prefill():
            m0 = su.metrics(port)
            aborted0 = su.metric(m0, "paged:request_success_total", finished_reason="abort")
            long_prompt = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 tokens
            for stream in (False, True):
                s = su.connect(port)
                s.sendall(post_bytes("/v1/completions", {"prompt": long_prompt, "max_tokens": 100, "stream": stream}))
                time.sleep(0.05)
                s.close()  # before the first token
            m = su.wait_idle(port, timeout=60)
            assert su.metric(m, "paged:request_success_total", finished_reason="abort") >= aborted0 + 2
            assert su.metric(m, "paged:kv_cache_blocks", state="used") == 0
            # Closing with a half-written request costs nothing either.
            s = su.connect(port)
            s.sendall(post_bytes("/v1/completions", {"prompt": "Hi"})[:-3])
            s.close()
            st, _, _ = su.request(port, "GET", "/health")
            assert st == 200

        def non_reading_client_bounded():
            # Pipelined requests for /metrics (about 15 KB each) from a client
            # that never reads: the server stops reading it once its output
            # backs up, so the client's sends stall and server memory stays flat.
            rss0 = rss_kib(srv.proc.pid)
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.setblocking(False)
            req = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n" * 100
            sent, t0 = 0, time.time()
            while time.time() - t0 < 3:
                try:
                    sent += s.send(req)
                except BlockingIOError:
                    time.sleep(0.01)
            # Others are still served promptly.
            t1 = time.time()
            st, _, _ = su.request(port, "GET", "/health", timeout=5)
            assert st == 200 and time.time() - t1 < 1
            rss1 = rss_kib(srv.proc.pid)
            s.close()
            assert sent < 64 << 20, f"the server kept reading: {sent} bytes accepted"
            if not ASAN:
                assert rss1 - rss0 < 64 << 10, f"RSS grew {rss1 - rss0} KiB"
            print(f"     non-reading client: {sent >> 10} KiB accepted, RSS {rss0} -> {rss1} KiB")
            su.wait_idle(port)

        def mutated_requests_never_hurt():
            # 300 seeded mutations of valid requests (bit flips, cuts,
            # inserted bytes, odd headers, upgrades): each gets an answer or a
            # close, and the server keeps serving.
            import random
            rng = random.Random(7)
            seeds = [
                b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
                post_bytes("/tokenize", {"prompt": "abc"}),
                post_bytes("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
                post_bytes("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
                chunked_bytes("/detokenize", {"tokens": [1, 2]}),
                b"GET /health HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nGET /health HTTP/1.1\r\n\r\n",
                b"POST /tokenize HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n",
                b"POST /tokenize HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            ]
            for it in range(300):
                data = bytearray(rng.choice(seeds))
                for _ in range(rng.randint(1, 4)):
                    op = rng.randrange(4)
                    pos = rng.randrange(len(data))
                    if op == 0:
                        data[pos] ^= 1 << rng.randrange(8)
                    elif op == 1:
                        del data[pos:pos + rng.randint(1, 8)]
                    elif op == 2:
                        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
                    else:
                        data[pos:pos] = rng.choice([b"\r\n", b"\r\n\r\n", b":", b" ", b"\x00", b"0\r\n\r\n"])
                s = su.connect(port, timeout=0.5)
                try:
                    s.sendall(bytes(data))
                    s.recv(65536)
                except OSError:
                    pass  # timed out waiting (incomplete request) or reset
                finally:
                    s.close()
                if it % 25 == 0:
                    assert su.request(port, "GET", "/health", timeout=5)[0] == 200
            su.wait_idle(port)

        su.run_checks([
            ("mutated requests never hurt the server", mutated_requests_never_hurt),
            ("requests split at every byte", split_at_every_byte),
            ("pipelined requests answered in order", pipelining_in_order),
            ("keep-alive, HTTP/1.0, Expect: 100-continue, idle timeout", keepalive_http10_expect),
            ("slowloris connections cut off in bounded time", slowloris_bounded),
            ("malformed JSON and invalid UTF-8", malformed_and_invalid_utf8),
            ("disconnect mid-stream aborts and frees KV", disconnect_mid_stream),
            ("disconnect mid-prefill aborts and frees KV", disconnect_mid_prefill),
            ("a client that never reads is bounded", non_reading_client_bounded),
        ])
    su.run_checks([("a streaming client that stops reading is dropped", non_reading_stream_dropped),
                   ("large prompts are tokenized off the loop", big_prompts_off_the_loop)])
    print(f"test_server_http ({su.binary()}): all passed")


if __name__ == "__main__":
    main()
