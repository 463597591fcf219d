#!/usr/bin/env python3
"""`paged serve` with curl and the official openai package on the real
default model: completions and chat, streamed and not, n=2, lists of prompts,
token-id prompts, echo, stop strings (across token boundaries), stop token
ids, logprobs, seeds, /tokenize, /detokenize, /v1/models, /version."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()
import openai  # noqa: E402

PROMPT = "The capital of France is"


def curl(*args):
    p = subprocess.run(["curl", "-sS", "--max-time", "120", *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=150)
    assert p.returncode == 0, p.stderr
    return p.stdout.decode()


def main():
    with su.Server() as srv:
        port = srv.port
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=120, max_retries=0)
        model = client.models.list().data[0].id
        state = {}

        def curl_basics():
            out = curl("-i", f"{srv.url}/health")
            assert out.startswith("HTTP/1.1 200"), out
            models = json.loads(curl(f"{srv.url}/v1/models"))
            assert models["object"] == "list" and models["data"][0]["id"] == model
            assert model == "SmolLM2-135M-Instruct.Q4_1", model
            assert models["data"][0]["max_model_len"] == 2048
            assert json.loads(curl(f"{srv.url}/version"))["version"]

        def curl_completion():
            body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                               "ignore_eos": True})
            r = json.loads(curl("-H", "Content-Type: application/json", "-d", body,
                                f"{srv.url}/v1/completions"))
            assert r["id"].startswith("cmpl-") and r["object"] == "text_completion", r
            assert r["model"] == model and isinstance(r["created"], int)
            (c,) = r["choices"]
            assert c["index"] == 0 and c["finish_reason"] == "length" and c["logprobs"] is None
            assert len(c["text"]) > 0
            ntok = su.post(port, "/tokenize", {"prompt": PROMPT})[1]["count"]
            u = r["usage"]
            assert u["prompt_tokens"] == ntok and u["completion_tokens"] == 8, u
            assert u["total_tokens"] == ntok + 8
            assert u["prompt_tokens_details"]["cached_tokens"] >= 0
            state["greedy8"] = c["text"]

        def curl_stream_chat():
            body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                               "max_tokens": 6, "temperature": 0, "stream": True})
            out = curl("-N", "-H", "Content-Type: application/json", "-d", body,
                       f"{srv.url}/v1/chat/completions")
            events = [l[6:] for l in out.split("\n") if l.startswith("data: ")]
            assert events[-1] == "[DONE]", events[-3:]
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert all(c["object"] == "chat.completion.chunk" for c in chunks)
            assert len({c["id"] for c in chunks}) == 1
            assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
            assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
            # Every chunk is `data: ...` followed by a blank line.
            assert out.count("\n\n") == len(events), out

        def sdk_completion_matches_stream():
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
            assert r.choices[0].text == state["greedy8"], (r.choices[0].text, state["greedy8"])
            text, usage, finishes = "", None, []
            for chunk in client.completions.create(model=model, prompt=PROMPT, max_tokens=8,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}):
                if chunk.usage:
                    usage = chunk.usage
                    assert chunk.choices == []
                    continue
                text += chunk.choices[0].text
                finishes.append(chunk.choices[0].finish_reason)
            assert text == state["greedy8"], (text, state["greedy8"])
            assert finishes[-1] == "length" and all(f is None for f in finishes[:-1]), finishes
            assert usage.completion_tokens == 8 and usage.prompt_tokens == r.usage.prompt_tokens

        def n2_and_prompt_lists():
            r = client.completions.create(model=model, prompt=[PROMPT, "One, two, three,"], n=2,
                                          max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
            assert [c.index for c in r.choices] == [0, 1, 2, 3]
            assert r.choices[0].text == r.choices[1].text == state["greedy8"]
            assert r.choices[2].text == r.choices[3].text != state["greedy8"]
            assert r.usage.completion_tokens == 32
            # Streamed: every index appears, each finishes once.
            seen = {}
            for ch in client.completions.create(model=model, prompt=[PROMPT, "One, two, three,"], n=2,
                                                max_tokens=4, temperature=0, stream=True):
                for c in ch.choices:
                    seen.setdefault(c.index, []).append(c.finish_reason)
            assert sorted(seen) == [0, 1, 2, 3]
            assert all(sum(f is not None for f in v) == 1 for v in seen.values()), seen

        def token_id_prompts_and_echo():
            ids = su.post(port, "/tokenize", {"prompt": PROMPT})[1]["tokens"]
            r = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
            assert r.choices[0].text == state["greedy8"]
            r = client.completions.create(model=model, prompt=[ids, ids], max_tokens=8, temperature=0,
                                          echo=True, extra_body={"ignore_eos": True})
            assert len(r.choices) == 2
            assert r.choices[1].text == PROMPT + state["greedy8"], r.choices[1].text
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=2, temperature=0,
                                          echo=True)
            assert r.choices[0].text.startswith(PROMPT)

        def completion_logprobs():
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                          logprobs=3, extra_body={"ignore_eos": True})
            c = r.choices[0]
            lp = c.logprobs
            assert "".join(lp.tokens) == c.text == state["greedy8"]
            assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
            off = 0
            for tok, l, top, o in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
                assert o == off
                off += len(tok)
                assert l <= 0 and 3 <= len(top) <= 4, top
                # Greedy: the sampled token is the most likely one.
                assert abs(max(top.values()) - l) < 1e-4 and abs(top[tok] - l) < 1e-4, (tok, l, top)
            state["tokens"] = lp.tokens

        def stop_strings_across_tokens():
            full = state["greedy8"]
            toks = state["tokens"]
            # A stop string spanning the boundary between two tokens.
            k = next(i for i in range(1, len(toks) - 1) if toks[i] and toks[i + 1])
            boundary = len("".join(toks[:k + 1]))
            stop = full[boundary - 1:boundary + 1]
            cut = full.index(stop)
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                          stop=[stop, "zzzz"], extra_body={"ignore_eos": True})
            c = r.choices[0]
            assert c.text == full[:cut], (c.text, full, stop)
            assert c.finish_reason == "stop"
            assert c.model_extra.get("stop_reason") == stop
            streamed = ""
            for ch in client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                                stop=stop, stream=True, extra_body={"ignore_eos": True}):
                streamed += ch.choices[0].text
                assert stop not in streamed
            assert streamed == full[:cut], (streamed, full[:cut])
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, stop=stop,
                                          extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
            assert r.choices[0].text == full[:cut + len(stop)]

        def stop_token_ids():
            ids = su.post(port, "/tokenize", {"prompt": state["greedy8"], "add_special_tokens": False})[1]["tokens"]
            st, r = su.post(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                      "stop_token_ids": [ids[2]], "ignore_eos": True})
            assert st == 200, r
            c = r["choices"][0]
            assert c["finish_reason"] == "stop" and c["stop_reason"] == ids[2], c
            assert r["usage"]["completion_tokens"] <= 3

        def seeds_reproducible():
            def sample(seed):
                r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8,
                                              temperature=1.0, top_p=0.95, seed=seed, n=2,
                                              extra_body={"ignore_eos": True})
                return [c.text for c in r.choices]
            a, b = sample(1234), sample(1234)
            assert a == b, (a, b)
            c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a story."}],
                                               max_tokens=6, temperature=0.9, seed=7)
            d = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a story."}],
                                               max_tokens=6, temperature=0.9, seed=7)
            assert c.choices[0].message.content == d.choices[0].message.content

        def chat_nonstream_and_stream():
            msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
            r = client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=8, temperature=0)
            assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
            c = r.choices[0]
            assert c.message.role == "assistant" and c.message.content
            assert c.finish_reason in ("stop", "length")
            assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 10
            text, roles, finish, usage = "", [], None, None
            for ch in client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=8,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}):
                if ch.usage:
                    usage = ch.usage
                    continue
                d = ch.choices[0].delta
                if d.role:
                    roles.append(d.role)
                text += d.content or ""
                finish = ch.choices[0].finish_reason or finish
            assert roles == ["assistant"] and text == c.message.content, (text, c.message.content)
            assert finish == c.finish_reason and usage.total_tokens == r.usage.total_tokens
            # Text content parts render like the plain string.
            r2 = client.chat.completions.create(
                model=model, max_tokens=8, temperature=0,
                messages=[msgs[0], {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}])
            assert r2.choices[0].message.content == c.message.content
            # max_completion_tokens is honoured exactly with ignore_eos.
            r3 = client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=3,
                                                temperature=0, extra_body={"ignore_eos": True})
            assert r3.usage.completion_tokens == 3 and r3.choices[0].finish_reason == "length"

        def chat_logprobs_and_n():
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=5, temperature=0, logprobs=True, top_logprobs=2, n=2,
                                               extra_body={"ignore_eos": True})
            assert [c.index for c in r.choices] == [0, 1]
            for c in r.choices:
                content = c.logprobs.content
                assert len(content) == 5
                assert "".join(e.token for e in content) == c.message.content
                for e in content:
                    assert bytes(e.bytes).decode(errors="replace") == e.token
                    assert len(e.top_logprobs) == 2
                    assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4
            got = {}
            for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=5, temperature=0, logprobs=True, n=2, stream=True,
                                                     extra_body={"ignore_eos": True}):
                for c in ch.choices:
                    if c.logprobs and c.logprobs.content:
                        got.setdefault(c.index, []).extend(c.logprobs.content)
            assert sorted(got) == [0, 1] and all(len(v) == 5 for v in got.values()), got

        def tokenize_roundtrip():
            st, t = su.post(port, "/tokenize", {"prompt": "Hello, wörld!", "return_token_strs": True})
            assert st == 200 and t["count"] == len(t["tokens"]) == len(t["token_strs"]) and t["max_model_len"] == 2048
            st, d = su.post(port, "/detokenize", {"tokens": t["tokens"]})
            assert st == 200 and d["prompt"].endswith("Hello, wörld!"), d
            st, t2 = su.post(port, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
            assert st == 200 and t2["count"] > 3

        def prefix_cache_in_usage():
            prompt = "The quick brown fox jumps over the lazy dog. " * 8
            first = client.completions.create(model=model, prompt=prompt, max_tokens=2)
            again = client.completions.create(model=model, prompt=prompt, max_tokens=2)
            cached = again.usage.prompt_tokens_details.cached_tokens
            assert cached >= 64 and cached < again.usage.prompt_tokens, (first.usage, again.usage)
            m = su.metrics(port)
            assert su.metric(m, "paged:prefix_cache_hits_total") >= cached

        def device_memory_categories():
            # The CPU backend reports its host memory under device="cpu":
            # weights, kv_cache, workspace (grown by the requests above);
            # graphs, other, free and the total belong to a GPU only.
            m = su.metrics(port)
            for cat in ("weights", "kv_cache", "workspace"):
                su.metric(m, "paged:device_memory_bytes", device="cpu", category=cat)
            assert su.metric(m, "paged:device_memory_bytes", category="weights") > 0
            assert su.metric(m, "paged:device_memory_bytes", category="kv_cache") > 0
            assert su.metric(m, "paged:device_memory_bytes", category="workspace") > 0
            cats = {k for k in m if k.startswith("paged:device_memory_bytes{")}
            assert not any('category="graphs"' in k or 'category="free"' in k for k in cats), cats
            assert not any(k.startswith("paged:device_memory_total_bytes{") for k in m)

        def idle_after():
            m = su.wait_idle(port, timeout=30)
            assert su.metric(m, "paged:request_success_total") >= 20
            assert su.metric(m, "paged:http_requests_total", handler="/v1/completions", status="200") >= 10

        su.run_checks([
            ("curl /health, /v1/models, /version", curl_basics),
            ("curl completion", curl_completion),
            ("curl streamed chat (SSE framing)", curl_stream_chat),
            ("openai completions, streamed = whole", sdk_completion_matches_stream),
            ("n=2 and lists of prompts", n2_and_prompt_lists),
            ("token-id prompts and echo", token_id_prompts_and_echo),
            ("completion logprobs", completion_logprobs),
            ("stop strings across token boundaries", stop_strings_across_tokens),
            ("stop_token_ids", stop_token_ids),
            ("seeds reproducible", seeds_reproducible),
            ("chat, streamed and not", chat_nonstream_and_stream),
            ("chat logprobs, n=2", chat_logprobs_and_n),
            ("/tokenize and /detokenize", tokenize_roundtrip),
            ("prefix-cache hits in usage and /metrics", prefix_cache_in_usage),
            ("device memory by category in /metrics", device_memory_categories),
            ("idle afterwards", idle_after),
        ])
    print("test_server_api: all passed")


if __name__ == "__main__":
    main()
