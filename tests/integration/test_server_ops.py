#!/usr/bin/env python3
"""Operating `paged serve`: the API key (flag and environment variable, 401
with the OpenAI error body, /health open), a full queue (503 before any
stream starts), and graceful shutdown on SIGTERM / SIGINT (new requests 503,
running ones finish, the timeout aborts the rest, exit code 0)."""
import json
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()
import openai  # noqa: E402


def auth():
    with su.Server("--api-key", "s3cret-key") as srv:
        port = srv.port
        assert su.request(port, "GET", "/health")[0] == 200
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret-ke"},
                        {"Authorization": "Bearer s3cret-keyy"}, {"Authorization": "Basic s3cret-key"},
                        {"Authorization": "s3cret-key"}]:
            for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
                                 ("POST", "/tokenize"), ("GET", "/version")]:
                st, h, body = su.request(port, method, path, {"prompt": "x"} if method == "POST" else None, headers)
                assert st == 401, (headers, path, st)
                e = su.error_of(body)
                assert e["type"] == "authentication_error" and e["code"] == 401
                assert h.get("www-authenticate") == "Bearer"
        for scheme in ("Bearer", "bearer"):
            st, _, _ = su.request(port, "GET", "/v1/models", headers={"Authorization": f"{scheme} s3cret-key"})
            assert st == 200
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret-key", max_retries=0, timeout=60)
        r = good.completions.create(model=good.models.list().data[0].id, prompt="Hi", max_tokens=2)
        assert r.choices[0].text is not None
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0, timeout=60)
        try:
            bad.models.list()
            raise AssertionError("a wrong key was accepted")
        except openai.AuthenticationError as e:
            assert e.status_code == 401
    with su.Server(env={"PAGED_API_KEY": "from-env"}) as srv:
        assert su.request(srv.port, "GET", "/v1/models")[0] == 401
        assert su.request(srv.port, "GET", "/v1/models", headers={"Authorization": "Bearer from-env"})[0] == 200
        assert su.request(srv.port, "GET", "/health")[0] == 200


def queue_full():
    # One sequence runs, one request may wait: the rest get 503 at once.
    with su.Server("--max-num-seqs", "1", "--max-waiting", "1") as srv:
        port = srv.port
        results = []

        def one(stream):
            body = {"prompt": "Count to one hundred:", "max_tokens": 24, "ignore_eos": True, "stream": stream}
            if stream:
                st, events, done = su.sse_stream(port, "/v1/completions", body)
                results.append((st, events[0] if st != 200 else None, done))
            else:
                st, r = su.post(port, "/v1/completions", body)
                results.append((st, r if st != 200 else None, True))

        threads = [threading.Thread(target=one, args=(i % 2 == 1,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        statuses = sorted(r[0] for r in results)
        assert statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
        assert set(statuses) <= {200, 503}, statuses
        for st, err, done in results:
            if st == 503:
                e = su.error_of(err)
                assert e["code"] == 503 and "queue full" in e["message"], e
            else:
                assert done
        m = su.wait_idle(port)
        assert su.metric(m, "paged:http_requests_total", status="503") == statuses.count(503)


def graceful_sigterm():
    srv = su.Server()
    srv.start()
    try:
        port = srv.port
        out = {}

        def stream():
            out["result"] = su.sse_stream(port, "/v1/completions",
                                          {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
                                           "stream": True})

        t = threading.Thread(target=stream)
        t.start()
        # Wait for the stream to be running.
        deadline = time.time() + 60
        while time.time() < deadline:
            if su.metric(su.metrics(port), "paged:generation_tokens_total") > 0:
                break
            time.sleep(0.05)
        # A request whose body is still arriving when the signal comes.
        body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
        late = su.connect(port)
        late.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:5])
        time.sleep(0.2)
        srv.signal(signal.SIGTERM)
        time.sleep(0.3)
        late.sendall(body[5:])
        st, h, data, _ = su.read_response(late)
        late.close()
        assert st == 503 and h.get("connection") == "close", (st, h)
        assert "shutting down" in su.error_of(data)["message"]
        # Nobody new gets in.
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            refused = False
        except OSError:
            refused = True
        assert refused, "the listener is still open"
        t.join(timeout=120)
        st, events, done = out["result"]
        assert st == 200 and done, (st, events[-1:])
        assert events[-1]["choices"][0]["finish_reason"] == "length", events[-1]
        assert sum(1 for e in events if e["choices"] and e["choices"][0]["text"]) >= 30
        assert srv.wait(60) == 0
        srv.check_clean_exit()
        assert "draining 1 requests" in srv.log(), srv.log()
    finally:
        srv.stop()


def shutdown_timeout_aborts():
    srv = su.Server("--shutdown-timeout", "1")
    srv.start()
    try:
        port = srv.port
        out = {}

        def stream():
            out["result"] = su.sse_stream(port, "/v1/completions",
                                          {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True,
                                           "stream": True})

        t = threading.Thread(target=stream)
        t.start()
        deadline = time.time() + 60
        while time.time() < deadline:
            if su.metric(su.metrics(port), "paged:generation_tokens_total") > 0:
                break
            time.sleep(0.05)
        t0 = time.time()
        srv.signal(signal.SIGINT)
        assert srv.wait(30) == 0
        dt = time.time() - t0
        t.join(timeout=30)
        st, events, done = out["result"]
        assert st == 200 and done
        assert events[-1]["choices"][0]["finish_reason"] == "abort", events[-1]
        assert 0.8 < dt < 10, dt
        srv.check_clean_exit()
    finally:
        srv.stop()


def idle_shutdown_is_quick():
    srv = su.Server()
    srv.start()
    try:
        keep = su.connect(srv.port)  # an idle keep-alive connection does not hold shutdown up
        keep.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        su.read_response(keep)
        t0 = time.time()
        srv.signal(signal.SIGTERM)
        assert srv.wait(10) == 0
        assert time.time() - t0 < 3
        srv.check_clean_exit()
        keep.close()
    finally:
        srv.stop()


def main():
    su.run_checks([
        ("--api-key and PAGED_API_KEY: 401 unless Bearer matches; /health open", auth),
        ("queue full -> 503 (streamed or not)", queue_full),
        ("SIGTERM: 503 for new requests, running ones finish, exit 0", graceful_sigterm),
        ("SIGINT with --shutdown-timeout 1 aborts the rest, exit 0", shutdown_timeout_aborts),
        ("idle shutdown is immediate", idle_shutdown_is_quick),
    ])
    print("test_server_ops: all passed")


if __name__ == "__main__":
    main()
