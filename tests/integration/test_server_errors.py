#!/usr/bin/env python3
"""Every bad request gets its status and an OpenAI-style error object
({"error": {"message", "type", "param", "code"}}), and the server keeps
serving: malformed/truncated JSON, wrong types, NaN/Inf, absurd n /
max_tokens / logprobs, ids outside the vocabulary, prompts beyond the model
length, stop string limits, unsupported fields, unknown routes and models
(404), wrong methods (405), oversize bodies (413), URLs (414) and header
blocks (431), and slow headers / bodies (408)."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()


def main():
    with su.Server("--header-timeout", "1.5", "--body-timeout", "1.5") as srv:
        port = srv.port
        counts = {}

        def expect(status, method, path, body=None, headers=None, param=None, contains=None):
            st, h, data = su.request(port, method, path, body, headers)
            assert st == status, (method, path, body, st, data)
            e = su.error_of(data)
            assert e["code"] == status, e
            assert e["type"] == {401: "authentication_error", 404: "not_found_error"}.get(
                status, "server_error" if status >= 500 else "invalid_request_error"), e
            if param is not None:
                assert e["param"] == param, (body, e)
            if contains:
                assert contains in e["message"], e
            assert h.get("content-type") == "application/json", h
            counts[status] = counts.get(status, 0) + 1
            return e

        def bad_json():
            for raw in [b'{"prompt": "x",', b'', b'[1, 2]', b'"text"', b'{"prompt": "x"} trailing',
                        b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "n": Infinity}',
                        b'{"prompt": "\xff\xfe"}', b'{"prompt": "\\ud800"}', b'{"prompt": "x"' + b' ' * 10]:
                expect(400, "POST", "/v1/completions", raw, {"Content-Type": "application/json"})
            e = expect(400, "POST", "/v1/completions", b'{"prompt": "\xc3\x28"}')
            assert "UTF-8" in e["message"]
            # A body shorter than its Content-Length is a truncated request:
            # the server waits for the rest, then answers 408.
            s = su.connect(port)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"prompt\":")
            st, _, body, _ = su.read_response(s)
            s.close()
            assert st == 408, st
            su.error_of(body)

        def wrong_types():
            for field, value in [("prompt", 5), ("prompt", {"a": 1}), ("temperature", "hot"), ("top_p", [1]),
                                 ("n", "2"), ("n", 1.5), ("max_tokens", True), ("stream", "yes"),
                                 ("stop", 7), ("stop_token_ids", "1"), ("echo", 1), ("seed", "s"),
                                 ("logprobs", True), ("model", 3), ("ignore_eos", "no")]:
                body = {"prompt": "Hello", "max_tokens": 2, field: value}
                expect(400, "POST", "/v1/completions", body, param=field)
            for field, value in [("messages", "hi"), ("messages", []), ("logprobs", 2),
                                 ("max_completion_tokens", "3"), ("top_logprobs", 2)]:
                body = {"messages": [{"role": "user", "content": "Hi"}], field: value}
                expect(400, "POST", "/v1/chat/completions", body, param=field)
            expect(400, "POST", "/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]},
                   param="messages[0]")
            expect(400, "POST", "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                   param="messages[0].content")
            expect(400, "POST", "/v1/chat/completions", {"messages": [{"role": "user"}]},
                   param="messages[0].content")

        def inf_and_ranges():
            raw = b'{"prompt": "x", "temperature": 1e999}'
            expect(400, "POST", "/v1/completions", raw, {"Content-Type": "application/json"}, param="temperature")
            for field, value in [("n", -1), ("n", 0), ("n", 1000000), ("n", 1e300), ("max_tokens", -1),
                                 ("max_tokens", 0), ("max_tokens", 10 ** 12), ("logprobs", 21),
                                 ("logprobs", -1), ("temperature", -1), ("top_p", 0), ("top_p", 1.1),
                                 ("min_p", 1.5), ("top_k", -5), ("presence_penalty", 3),
                                 ("frequency_penalty", -2.5), ("repetition_penalty", 0), ("min_tokens", -1),
                                 ("seed", 1e40), ("priority", 1)]:
                expect(400, "POST", "/v1/completions", {"prompt": "Hi", field: value}, param=field)
            expect(400, "POST", "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 21},
                   param="top_logprobs")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "min_tokens": 3},
                   param="min_tokens")

        def vocabulary_and_length():
            for ids in ([49152], [1, -1], [1, 2.5], [10 ** 10], [[1], [49999]], []):
                expect(400, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 1}, param="prompt")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "stop_token_ids": [49152]},
                   param="stop_token_ids")
            e = expect(400, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2048},
                       param="max_tokens", contains="maximum context length is 2048 tokens")
            assert "in the completion" in e["message"]
            expect(400, "POST", "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 5000},
                   param="max_completion_tokens", contains="maximum context length")
            long_prompt = "hello " * 3000
            expect(400, "POST", "/v1/completions", {"prompt": long_prompt, "max_tokens": 1}, param="prompt",
                   contains="maximum context length")
            expect(400, "POST", "/v1/completions", {"prompt": list(range(1, 2100)), "max_tokens": 1},
                   param="prompt")

        def stop_limits():
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "stop": [str(i) for i in range(17)]},
                   param="stop", contains="at most 16")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "stop": "x" * 300}, param="stop",
                   contains="at most 256 bytes")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "stop": [""]}, param="stop")

        def unsupported():
            # echo + logprobs is served now (test_prompt_logprobs.py); prompt logprobs in a stream are not.
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "prompt_logprobs": 2, "stream": True},
                   param="prompt_logprobs", contains="stream=True")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 0}, param="max_tokens")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "stream_options": {"include_usage": True}},
                   param="stream_options")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "n": 2, "best_of": 3, "stream": True},
                   param="best_of", contains="stream")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "n": 3, "best_of": 2}, param="best_of")
            expect(400, "POST", "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]},
                   param="tools")

        def structured_output_errors():
            chat = {"messages": [{"role": "user", "content": "Hi"}]}
            schema = lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
            expect(400, "POST", "/v1/chat/completions",
                   {**chat, "response_format": schema({"type": "string", "pattern": "(a"})},
                   param="response_format", contains="cannot be compiled")
            expect(400, "POST", "/v1/chat/completions",
                   {**chat, "response_format": schema({"$ref": "#/$defs/Missing"})},
                   param="response_format", contains="#/$defs/Missing")
            expect(400, "POST", "/v1/chat/completions", {**chat, "response_format": schema({"not": {}})},
                   param="response_format", contains="not is not supported")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "guided_grammar": "root ::= x"},
                   param="guided_grammar", contains="undefined rule 'x'")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "guided_regex": "(a)\\1"},
                   param="guided_regex", contains="backreferences")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "guided_choice": []}, param="guided_choice")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "guided_regex": "a", "guided_choice": ["a"]},
                   param="guided_choice", contains="only one")
            # A hostile schema (deep nesting) is refused quickly, not compiled.
            deep = True
            for _ in range(500):
                deep = {"type": "array", "items": deep}
            expect(400, "POST", "/v1/chat/completions", {**chat, "response_format": schema(deep)},
                   param="response_format", contains="deeper")
            expect(400, "POST", "/v1/completions",
                   {"prompt": "Hi", "logit_bias": {str(i): 1 for i in range(301)}},
                   param="logit_bias", contains="at most 300")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "logit_bias": {"99999999": 1}},
                   param="logit_bias")
            expect(400, "POST", "/v1/completions", {"prompt": "Hi", "logit_bias": {"5": 101}},
                   param="logit_bias")

        def not_found_and_methods():
            # ("/" is the chat page, docs/server.md "Browser clients")
            for path in ["/index.html", "/v1/nothing", "/v1/completions/x", "/v2/models", "/health/"]:
                expect(404, "GET", path)
            expect(404, "POST", "/v1/completions", {"model": "gpt-4", "prompt": "Hi"}, param="model",
                   contains="does not exist")
            expect(404, "POST", "/v1/chat/completions",
                   {"model": "nope", "messages": [{"role": "user", "content": "Hi"}]}, param="model")
            for method, path in [("GET", "/v1/completions"), ("PUT", "/v1/chat/completions"),
                                 ("POST", "/health"), ("DELETE", "/v1/models"), ("POST", "/metrics")]:
                st, h, data = su.request(port, method, path, b"{}" if method != "GET" else None)
                assert st == 405, (method, path, st)
                su.error_of(data)
                assert "allow" in h, h
                counts[405] = counts.get(405, 0) + 1

        def raw_error(req, status, send_all=True):
            s = su.connect(port)
            try:
                try:
                    s.sendall(req)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server answered and closed before reading it all
                st, h, body, _ = su.read_response(s)
                assert st == status, (st, body)
                e = su.error_of(body)
                assert e["code"] == status
                assert h.get("connection") == "close", h
                counts[status] = counts.get(status, 0) + 1
                # The connection is closed after a protocol error.
                s.settimeout(5)
                assert s.recv(1) == b""
            finally:
                s.close()

        def oversize():
            # 413 from Content-Length alone (2 MB default limit).
            raw_error(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 3000000\r\n\r\n", 413)
            # 413 for a chunked body that grows past the limit.
            chunk = b"x" * 65536
            req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            req += (b"10000\r\n" + chunk + b"\r\n") * 34
            raw_error(req, 413)
            # 414: a URL over 8 KiB.
            raw_error(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414)
            # 431: more than 100 headers, and a header block over 64 KiB.
            many = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
            raw_error(b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n", 431)
            raw_error(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 70000 + b"\r\n\r\n", 431)
            # Just under the limits is fine.
            ok = b"".join(b"X-H%d: v\r\n" % i for i in range(98))
            s = su.connect(port)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + ok + b"\r\n")
            assert su.read_response(s)[0] == 200
            s.close()
            # A malformed request line.
            raw_error(b"GARBAGE\r\n\r\n", 400)
            raw_error(b"GET /health HTTP/9.9\r\n\r\n", 505)
            raw_error(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n", 400)

        def timeouts():
            # Headers that never finish: 408 after --header-timeout (1.5 s), bounded.
            t0 = time.time()
            s = su.connect(port)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            st, _, body, _ = su.read_response(s)
            dt = time.time() - t0
            s.close()
            assert st == 408 and 1.0 < dt < 5, (st, dt)
            su.error_of(body)
            # A body that stops halfway: 408 after --body-timeout.
            t0 = time.time()
            s = su.connect(port)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
            st, _, body, _ = su.read_response(s)
            dt = time.time() - t0
            s.close()
            assert st == 408 and 1.0 < dt < 5, (st, dt)
            counts[408] = counts.get(408, 0) + 2

        def extreme_but_valid():
            # Valid edge values are served, not rejected, and crash nothing.
            for extra in [{"top_k": 100000}, {"top_k": 1}, {"min_p": 1}, {"top_p": 1e-9}, {"temperature": 100},
                          {"temperature": 1e-9}, {"repetition_penalty": 100}, {"repetition_penalty": 0.01},
                          {"presence_penalty": -2, "frequency_penalty": 2}, {"seed": -2 ** 63},
                          {"seed": 2 ** 63 - 1}, {"seed": 2 ** 64 - 2048}, {"n": 128, "max_tokens": 1},
                          {"logprobs": 20, "n": 3}, {"min_tokens": 4, "max_tokens": 4},
                          {"stop_token_ids": list(range(64))}, {"prompt": [0]}, {"prompt": [49151]},
                          {"prompt": "\U0001F600" * 50}, {"skip_special_tokens": False},
                          {"stop": ["\n", "a", "the"], "include_stop_str_in_output": True}]:
                body = dict({"prompt": "Hello there", "max_tokens": 4}, **extra)
                st, r = su.post(port, "/v1/completions", body)
                assert st == 200, (extra, r)
                assert len(r["choices"]) == body.get("n", 1), (extra, r)
            e = expect(400, "POST", "/v1/completions", b'{"prompt": "a\\u0000b"}', {"Content-Type": "application/json"})
            assert "NUL" in e["message"]

        def still_healthy():
            st, r = su.post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "temperature": 0})
            assert st == 200 and r["choices"][0]["finish_reason"] in ("length", "stop"), r
            m = su.wait_idle(port)
            for status, n in counts.items():
                got = su.metric(m, "paged:http_requests_total", status=str(status))
                assert got >= n, (status, got, n)

        su.run_checks([
            ("malformed, truncated, non-UTF-8 JSON -> 400", bad_json),
            ("wrong types -> 400 naming the field", wrong_types),
            ("Inf and out-of-range values -> 400", inf_and_ranges),
            ("ids outside the vocabulary, prompts beyond the model length -> 400", vocabulary_and_length),
            ("too many / too long stop strings -> 400", stop_limits),
            ("unsupported fields -> 400", unsupported),
            ("structured output compile errors -> 400", structured_output_errors),
            ("unknown route / model -> 404, wrong method -> 405", not_found_and_methods),
            ("413 body, 414 URL, 431 headers, 400 malformed HTTP", oversize),
            ("408 slow headers and body", timeouts),
            ("extreme but valid values are served", extreme_but_valid),
            ("still serving; responses counted in /metrics", still_healthy),
        ])
    print("test_server_errors: all passed")


if __name__ == "__main__":
    main()
