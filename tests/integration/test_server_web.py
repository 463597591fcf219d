#!/usr/bin/env python3
"""The browser-facing parts of `paged serve` on a real socket: the chat page
at / (and --no-webui), CORS (off by default; with --allowed-origins a
preflight is answered on every route before the key check, refused for an
unknown origin, method or header, and simple responses carry
Access-Control-Allow-Origin), /openapi.json (a valid OpenAPI 3.1 document,
every documented operation answers with a documented status), and
--metrics-compat vllm (the vllm: names next to the paged: ones, same values).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()  # re-executes under .venv, which has openapi-spec-validator

KEY = "web-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "http://app.example:3000"

# A minimal valid request for every operation, to prove each answers.
SAMPLE = {
    ("post", "/v1/completions"): {"prompt": "Hello", "max_tokens": 2},
    ("post", "/v1/chat/completions"): {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    ("post", "/tokenize"): {"prompt": "Hello"},
    ("post", "/detokenize"): {"tokens": [1, 2]},
    # The runtime LoRA routes (mounted by --enable-lora --allow-runtime-lora-updating):
    # load a tiny adapter, then unload it (document order).
    ("post", "/v1/unload_lora_adapter"): {"lora_name": "tiny"},
}


def tiny_adapter():
    """A rank-1 PEFT adapter on q_proj of the default model (576 wide, 30
    layers), written with safetensors' numpy API; its directory."""
    import tempfile
    import numpy as np
    from safetensors.numpy import save_file
    import atexit
    import shutil
    d = tempfile.mkdtemp(prefix="paged-lora-")
    atexit.register(shutil.rmtree, d, True)
    t = {}
    for l in range(30):
        p = f"base_model.model.model.layers.{l}.self_attn.q_proj"
        t[p + ".lora_A.weight"] = np.full((1, 576), 0.01, np.float32)
        t[p + ".lora_B.weight"] = np.full((576, 1), 0.01, np.float32)
    save_file(t, os.path.join(d, "adapter_model.safetensors"))
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"], "bias": "none"}, f)
    return d


def check_cors_off():
    with su.Server() as srv:
        st, h, _ = su.request(srv.port, "OPTIONS", "/v1/chat/completions",
                              headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
        assert st == 405 and h["allow"] == "POST", (st, h)
        st, h, _ = su.request(srv.port, "GET", "/v1/models", headers={"Origin": ORIGIN})
        assert st == 200 and "access-control-allow-origin" not in h, h
        # The page is served, self-contained, under a policy that lets it
        # reach this server only.
        st, h, body = su.request(srv.port, "GET", "/")
        assert st == 200 and h["content-type"].startswith("text/html"), (st, h)
        assert "connect-src 'self'" in h["content-security-policy"] and "default-src 'none'" in h["content-security-policy"]
        page = body.decode()
        assert "/v1/chat/completions" in page and 'id="stop"' in page
        for ext in ("http://", "https://", "//cdn"):
            assert ext not in page.replace("http://www.w3.org", ""), f"page refers to {ext}"
    print("ok   CORS off by default (OPTIONS 405, no ACAO); chat page at / with a self-only CSP")


def check_no_webui():
    with su.Server("--no-webui") as srv:
        st, _, body = su.request(srv.port, "GET", "/")
        assert st == 404, st
        su.error_of(body)
        st, _, _ = su.request(srv.port, "GET", "/health")
        assert st == 200
    print("ok   --no-webui: / is 404")


def check_cors_on():
    # --enable-lora --allow-runtime-lora-updating: every documented route is
    # mounted (the runtime LoRA routes are 404 without them, as vLLM's).
    with su.Server("--api-key", KEY, "--allowed-origins", f'["{ORIGIN}"]',
                   "--allowed-headers", "content-type,authorization", "--enable-lora",
                   "--allow-runtime-lora-updating") as srv:
        doc = json.loads(su.request(srv.port, "GET", "/openapi.json")[2])
        for path, ops in doc["paths"].items():
            for method in ops:
                st, h, body = su.request(srv.port, "OPTIONS", path, headers={
                    "Origin": ORIGIN, "Access-Control-Request-Method": method.upper(),
                    "Access-Control-Request-Headers": "Content-Type, Authorization"})
                assert st == 200, (path, st, body)
                assert h["access-control-allow-origin"] == ORIGIN, h
                assert "POST" in h["access-control-allow-methods"], h
                assert h["access-control-allow-headers"] == "content-type, authorization", h
                assert h["access-control-max-age"] == "600" and h["vary"] == "Origin", h
        print(f"ok   preflight answered on all {len(doc['paths'])} documented paths without the key")
        # Refusals: the origin, a header that is not allowed.
        st, h, body = su.request(srv.port, "OPTIONS", "/v1/models", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
        assert st == 400 and "access-control-allow-origin" not in h, (st, h)
        assert "origin http://evil.example is not allowed" in su.error_of(body)["message"]
        st, h, body = su.request(srv.port, "OPTIONS", "/v1/models", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-secret"})
        assert st == 400 and "header x-secret is not allowed" in su.error_of(body)["message"], body
        # Simple and actual requests: the header on success and on errors.
        st, h, _ = su.request(srv.port, "GET", "/v1/models", headers=dict(AUTH, Origin=ORIGIN))
        assert st == 200 and h["access-control-allow-origin"] == ORIGIN and h["vary"] == "Origin", h
        st, h, _ = su.request(srv.port, "GET", "/v1/models", headers={"Origin": ORIGIN})
        assert st == 401 and h["access-control-allow-origin"] == ORIGIN, (st, h)
        st, h, _ = su.request(srv.port, "GET", "/v1/models", headers=dict(AUTH, Origin="http://evil.example"))
        assert st == 200 and "access-control-allow-origin" not in h, h
        st, h, _ = su.request(srv.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                              headers=dict(AUTH, Origin=ORIGIN))
        assert st == 200 and h["access-control-allow-origin"] == ORIGIN, (st, h)
        # Not a preflight (no Access-Control-Request-Method): still 405.
        st, h, _ = su.request(srv.port, "OPTIONS", "/v1/models", headers={"Origin": ORIGIN})
        assert st == 405, st
    print("ok   refused origin/header are 400 with the reason; ACAO on 200 and 401 for the allowed origin only")
    with su.Server("--allowed-origins", "*", "--allowed-methods", "GET") as srv:
        st, h, _ = su.request(srv.port, "OPTIONS", "/v1/completions", headers={
            "Origin": "http://any.example", "Access-Control-Request-Method": "POST"})
        assert st == 400 and h["access-control-allow-methods"] == "GET", (st, h)
        st, h, _ = su.request(srv.port, "OPTIONS", "/v1/models", headers={
            "Origin": "http://any.example", "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "X-Any"})
        assert st == 200 and h["access-control-allow-origin"] == "*" and h["access-control-allow-headers"] == "X-Any", h
    print("ok   --allowed-origins '*': ACAO *, method list enforced, any header echoed")


def check_openapi_and_compat():
    from openapi_spec_validator import validate
    SAMPLE[("post", "/v1/load_lora_adapter")] = {"lora_name": "tiny", "lora_path": tiny_adapter()}
    with su.Server("--api-key", KEY, "--metrics-compat", "vllm", "--enable-lora",
                   "--allow-runtime-lora-updating") as srv:
        st, h, body = su.request(srv.port, "GET", "/openapi.json")
        assert st == 200 and h["content-type"] == "application/json", (st, h)
        doc = json.loads(body)
        validate(doc)
        n = 0
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                sample = SAMPLE.get((method, path))
                hdrs = AUTH if "security" in op else {}
                st, h, body = su.request(srv.port, method.upper(), path, sample, hdrs)
                assert st == 200, (method, path, st, body[:300])
                assert str(st) in op["responses"], (path, st)
                ctype = h.get("content-type", "").split(";")[0]
                content = op["responses"]["200"].get("content")
                assert content is None or ctype in content, (path, ctype, list(content))
                if "security" in op:
                    st, _, _ = su.request(srv.port, method.upper(), path, sample)
                    assert st == 401 and "401" in op["responses"], (path, st)
                n += 1
        print(f"ok   /openapi.json is valid OpenAPI {doc['openapi']}; all {n} operations answer 200 "
              "with a documented content type (and 401 without the key where documented)")
        m = su.metrics(srv.port, AUTH)
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "gpu_cache_usage_perc",
                     "prompt_tokens_total", "generation_tokens_total", "num_preemptions_total",
                     "time_to_first_token_seconds_count", "e2e_request_latency_seconds_count"):
            assert su.metric(m, "vllm:" + name) == su.metric(m, "paged:" + name), name
        assert su.metric(m, "vllm:generation_tokens_total") >= 4
        assert not [k for k in m if k.startswith("vllm:device_memory") or k.startswith("vllm:http_")]
    print("ok   --metrics-compat vllm: vllm: names equal the paged: ones; paged-only families not aliased")
    with su.Server() as srv:
        assert not [k for k in su.metrics(srv.port) if k.startswith("vllm:")]
    print("ok   no vllm: names without the flag")


def check_bad_flags():
    import subprocess
    for args, want in ((["--metrics-compat", "sglang"], "the only value is vllm"),
                       (["--allowed-origins", "[1]"], "--allowed-origins: every item must be a non-empty string"),
                       (["--allowed-headers", " , "], "--allowed-headers: the list is empty")):
        p = subprocess.run([su.binary(), "serve", "--model", su.MODEL] + args, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and want in p.stderr, (args, p.returncode, p.stderr)
    print("ok   bad --metrics-compat / --allowed-* values: exit 2 with the reason")


if __name__ == "__main__":
    su.run_checks([("cors off, page", check_cors_off), ("no webui", check_no_webui), ("cors on", check_cors_on),
                   ("openapi + compat", check_openapi_and_compat), ("bad flags", check_bad_flags)])
    print("test_server_web: all passed")
