#!/usr/bin/env python3
"""The server under ThreadSanitizer (build/tsan/paged, `ninja tsan`): a
bounded mix that crosses every thread boundary - the loop thread and the
engine thread (submissions, events through uv_async, aborts of clients that
leave, stop strings finishing sequences, /metrics reading the engine's
stats), libuv's thread pool (large /tokenize, /detokenize and prompts), the
CPU backend's worker pool (every forward), and a SIGTERM drain with a
stream running; then the same mix at -tp 3 (the tensor-parallel workers
and the in-process communicator). Passes when every request got its answer, the server
exited 0, and TSan reported nothing."""
import json
import os
import random
import signal
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "build", "tsan", "paged")
if not os.path.exists(BIN):
    print(f"SKIP: {BIN} is not built (ninja build/tsan/paged)")
    sys.exit(77)
os.environ["PAGED_BIN"] = BIN
# Reports go to the server log (checked below); keep running after one so
# the whole mix is covered; exit code 66 if any was found.
os.environ.setdefault("TSAN_OPTIONS", "halt_on_error=0 exitcode=66 second_deadlock_stack=1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()


def mix(port):
    rnd = random.Random(5)
    words = " ".join("".join(rnd.choice("abcdefghij") for _ in range(rnd.randint(2, 8))) for _ in range(9000))
    ids = [rnd.randrange(100, 40000) for _ in range(30000)]
    errors = []

    def guard(fn):
        def run():
            try:
                fn()
            except Exception as e:  # reported below, with the server log
                errors.append(f"{fn.__name__}: {e!r}")
        return run

    def streams():
        for i in range(3):
            st, events, done = su.sse_stream(port, "/v1/completions", {"prompt": f"Count {i}:", "max_tokens": 6,
                                                                       "ignore_eos": True, "stream": True})
            assert st == 200 and done, st

    def plain():
        for i in range(3):
            st, r = su.post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Hi {i}"}],
                                                           "max_tokens": 4, "n": 2})
            assert st == 200 and len(r["choices"]) == 2, r

    def stop_strings():
        st, r = su.post(port, "/v1/completions", {"prompt": "1, 2, 3, 4,", "max_tokens": 12, "stop": [","],
                                                  "ignore_eos": True})
        assert st == 200 and r["choices"][0]["finish_reason"] in ("stop", "length"), r

    def leavers():
        for _ in range(3):
            s = su.connect(port, timeout=300)  # TSan on a busy machine: the first token can take long
            body = json.dumps({"prompt": "Tell me a story", "max_tokens": 50, "ignore_eos": True,
                               "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            s.recv(1)  # the stream started
            s.close()

    def pool_work():
        st, r = su.post(port, "/tokenize", {"prompt": words})
        assert st == 200 and r["count"] > 5000, st
        st, _, data = su.request(port, "POST", "/detokenize", {"tokens": ids})
        assert st == 200, st
        st, r = su.post(port, "/v1/completions", {"prompt": words[:30000], "max_tokens": 1})
        assert st == 400, r  # longer than the model: found after tokenizing on the pool

    def scrapes():
        for _ in range(10):
            su.metrics(port)
            time.sleep(0.05)

    threads = [threading.Thread(target=guard(f)) for f in (streams, plain, stop_strings, leavers, pool_work,
                                                           scrapes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    su.wait_idle(port, timeout=120)


def main():
    srv = su.Server("--max-model-len", "1024", "--kv-cache-memory", "64M", default_args=False, ready_timeout=300)
    srv.start()
    try:
        t0 = time.time()
        mix(srv.port)
        print(f"ok   loop/engine/thread-pool mix under TSan ({time.time() - t0:.1f}s)", flush=True)
        out = {}

        def stream():
            out["r"] = su.sse_stream(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 8,
                                                                   "ignore_eos": True, "stream": True})

        t = threading.Thread(target=stream)
        t.start()
        deadline = time.time() + 120
        while time.time() < deadline and su.metric(su.metrics(srv.port), "paged:num_requests_running") == 0:
            time.sleep(0.02)
        srv.signal(signal.SIGTERM)
        t.join(timeout=300)
        st, events, done = out["r"]
        assert st == 200 and done, (st, events[-1:])
        assert srv.wait(120) == 0, srv.log()[-8000:]
        log = srv.log()
        assert "ThreadSanitizer" not in log, log[-12000:]
        print("ok   SIGTERM drain under TSan, exit 0, no report", flush=True)
    except BaseException:
        sys.stderr.write(f"--- server log ---\n{srv.log()[-12000:]}\n")
        raise
    finally:
        srv.stop()
    tensor_parallel()
    print("test_server_tsan: all passed")


def tensor_parallel():
    """-tp 3 on the CPU: the executor's worker threads and the in-process
    communicator (each step's all-reduces and the greedy exchange or the
    logits all-gather) under the same mix, then a drain."""
    srv = su.Server("--max-model-len", "1024", "--kv-cache-memory", "64M", "-tp", "3", default_args=False,
                    ready_timeout=300)
    srv.start()
    try:
        t0 = time.time()
        mix(srv.port)
        assert srv.stop() == 0, srv.log()[-8000:]
        log = srv.log()
        assert "ThreadSanitizer" not in log, log[-12000:]
        print(f"ok   the same mix at -tp 3 (executor workers, cpu communicator), no report ({time.time() - t0:.1f}s)",
              flush=True)
    except BaseException:
        sys.stderr.write(f"--- server log (-tp 3) ---\n{srv.log()[-12000:]}\n")
        srv.stop()
        raise


if __name__ == "__main__":
    main()
