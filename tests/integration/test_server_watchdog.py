#!/usr/bin/env python3
"""The engine watchdog, driven by the fault-injection hook
(PAGED_FAULT_INJECT, engine/engine.h) on the CPU: a step that stalls past
--step-timeout, and a step that fails. Either way every request in flight
ends with a clear error (a 500 JSON error, or an error event then [DONE]
on a started stream), /health answers 503 with the reason, and the
process exits with code 70 so a supervisor restarts it. A malformed
PAGED_FAULT_INJECT stops start-up with one line."""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()

EXIT_ENGINE_FAILED = 70
FAULT_STEP = 100


def fault(kind, extra_args=()):
    srv = su.Server("--step-timeout", "2", *extra_args, env={"PAGED_FAULT_INJECT": kind})
    srv.start()
    try:
        port = srv.port
        out = {}
        started = threading.Event()

        # Long requests, a fault many steps in: the stream has begun (its
        # first event arrived) before the second request is sent, and both
        # are in flight when the fault's step comes (about a second of
        # CPU steps later), however slow the machine.
        def stream():
            out["stream"] = su.sse_stream(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 1000,
                                                                    "ignore_eos": True, "stream": True},
                                          on_event=lambda ev: started.set())
            started.set()

        def whole():
            out["whole"] = su.post(port, "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1000,
                                    "ignore_eos": True})

        threads = [threading.Thread(target=stream), threading.Thread(target=whole)]
        threads[0].start()
        assert started.wait(60), srv.log()[-3000:]
        threads[1].start()
        # /health turns 503 (with the reason) before the process goes.
        health = None
        deadline = time.time() + 60
        while time.time() < deadline and srv.proc.poll() is None:
            try:
                st, _, body = su.request(port, "GET", "/health", timeout=5)
            except OSError:
                break
            if st == 503:
                health = su.error_of(body)
                break
            time.sleep(0.05)
        assert health and "engine failed" in health["message"], (health, srv.log()[-3000:])
        for t in threads:
            t.join(timeout=60)
        st, events, done = out["stream"]
        assert st == 200 and done, (st, events[-2:])
        err = events[-1].get("error")
        assert err and ("engine failed" in err["message"] or "step failed" in err["message"]), events[-2:]
        st, body = out["whole"]
        assert st == 500, (st, body)
        e = su.error_of(json.dumps(body))
        assert e["type"] == "server_error", e
        rc = srv.wait(30)
        assert rc == EXIT_ENGINE_FAILED, (rc, srv.log()[-3000:])
        log = srv.log()
        assert "engine failed" in log, log[-3000:]
        return health["message"], log
    finally:
        srv.stop()


def stall():
    msg, log = fault("stall:%d" % FAULT_STEP)
    assert "has not finished in" in msg, msg
    assert "fault injection: stalling step %d" % FAULT_STEP in log


def fail():
    msg, log = fault("fail:%d" % FAULT_STEP)
    assert "step failed" in msg and "fault injection" in msg, msg


def bad_value():
    for v in ("stall", "fail:0", "explode:3", "stall:2:-1"):
        r = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--port", "0"], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, PAGED_FAULT_INJECT=v))
        assert r.returncode != 0 and "PAGED_FAULT_INJECT" in r.stderr, (v, r.returncode, r.stderr)


def main():
    su.run_checks([
        ("a step stalled past --step-timeout: 500s, /health 503, exit 70", stall),
        ("a failed step: 500s, /health 503, exit 70", fail),
        ("a malformed PAGED_FAULT_INJECT is a start-up error", bad_value),
    ])
    print("test_server_watchdog: all passed")


if __name__ == "__main__":
    main()
