#!/usr/bin/env python3
"""LoRA adapters through the real server (docs/lora.md): `paged serve
--enable-lora --lora-modules alpha=DIR beta=DIR` on the default model, with
two random rank-8 PEFT adapters written here for its shapes (all seven
projections, lora_B non-zero), queried with the official OpenAI SDK.

1. /v1/models lists the model and both adapters, each adapter with the
   model as its parent and its directory as its root.
2. The model and the two adapters answer concurrently (three threads, greedy,
   20 tokens, the same prompt): each response names the model it was asked
   for; the adapters' texts differ from the base model's; each text equals
   the one the same request gives alone (a batch mixing adapters computes
   each sequence as it would alone).
3. The prefix cache is keyed by adapter: after alpha has run a prompt, the
   base model's run of the same prompt finds nothing cached
   (paged:prefix_cache_hits_total does not move), while a second alpha run
   hits.
4. Runtime loading (--allow-runtime-lora-updating, --max-loras 2), as
   vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter: the routes are
   404 without the flag; beta loaded at run time gives the text beta gave
   when loaded at start-up; a third adapter finds no slot (400), a name
   already served is refused (400), an adapter of the wrong shape names
   its file (400); alpha cannot be unloaded while a request streams with it
   (409) and can after (200), and then answers 404; an adapter loaded into
   the slot alpha left finds none of alpha's KV in the prefix cache.
5. Unknown model names get the OpenAI 404; bad flags stop the server with
   one line: --lora-modules without --enable-lora, a name given twice,
   --max-loras below the adapters named, an adapter of another shape (its
   file named).
Every KV block is back in the pool at the end.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()
import openai  # noqa: E402

try:
    import torch
    from safetensors.torch import save_file
except ImportError as e:
    su.skip(f"torch/safetensors not importable ({e})")

# SmolLM2-135M: hidden 576, 30 layers, 9 heads and 3 KV heads of 64, FFN 1536.
H, L, Q, KV, F = 576, 30, 576, 192, 1536
SHAPES = {"q_proj": (Q, H), "k_proj": (KV, H), "v_proj": (KV, H), "o_proj": (H, Q), "gate_proj": (F, H),
          "up_proj": (F, H), "down_proj": (H, F)}
PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(d, seed, rank=8, alpha=16, layers=L, shapes=SHAPES):
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    t = {}
    for l in range(layers):
        for m, (out, inp) in shapes.items():
            p = f"base_model.model.model.layers.{l}.{PARENT[m]}.{m}"
            t[p + ".lora_A.weight"] = (torch.randn(rank, inp, generator=g) / inp ** 0.5).contiguous()
            t[p + ".lora_B.weight"] = (0.5 * torch.randn(out, rank, generator=g) / rank ** 0.5).contiguous()
    save_file(t, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})
    json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(shapes),
               "bias": "none", "base_model_name_or_path": "SmolLM2-135M-Instruct", "task_type": "CAUSAL_LM"},
              open(os.path.join(d, "adapter_config.json"), "w"))


def metric(port, name):
    st, _, body = su.request(port, "GET", "/metrics")
    assert st == 200
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def refused(args, want):
    p = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--port", str(su.free_port()), *args],
                       capture_output=True, text=True, timeout=120)
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    ok = p.returncode != 0 and lines and all(w in lines[-1] for w in want)
    print(f"refused ({' '.join(a if len(a) < 40 else '...' for a in args)}): {lines[-1] if lines else '(nothing)'}")
    assert ok, p.stderr[-2000:]


def plan_lora(a_dir, b_dir):
    """`paged plan` reads the adapters named and counts them in the weights."""
    def plan(*args):
        p = subprocess.run([su.binary(), "plan", "--model", su.MODEL, "--json", *args], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode in (0, 1), p.stderr
        return json.loads(p.stdout)["plan"]["ranks"]
    one = os.path.getsize(os.path.join(a_dir, "adapter_model.safetensors"))
    base = plan()
    two = plan("--enable-lora", "--lora-modules", f"a={a_dir}", f"b={b_dir}")
    grown = two[0]["weights_bytes"] - base[0]["weights_bytes"]
    print(f"plan: two adapters add {grown / 2**20:.2f} MiB to the weights (files: 2 x {one / 2**20:.2f} MiB)")
    assert two[0]["lora_bytes"] == grown and abs(grown - 2 * one) < 2 * 65536, (grown, one)
    tp3 = plan("--enable-lora", "--lora-modules", f"a={a_dir}", "-tp", "3")
    assert 0 < tp3[0]["lora_bytes"] < one, (tp3[0]["lora_bytes"], one)


def runtime(tmp, a_dir, b_dir, static_texts):
    with su.Server("--enable-lora", "--allow-runtime-lora-updating", "--max-loras", "2",
                   "--lora-modules", f"alpha={a_dir}") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=120, max_retries=0)

        def post(path, body):
            st, _, data = su.request(srv.port, "POST", path, body)
            return st, json.loads(data)

        st, msg = post("/v1/load_lora_adapter", {"lora_name": "beta", "lora_path": b_dir})
        assert st == 200 and "beta" in msg, (st, msg)
        assert [m.id for m in client.models.list().data][1:] == ["alpha", "beta"]
        text = client.completions.create(model="beta", prompt="The history of the printing press begins",
                                         max_tokens=20, temperature=0).choices[0].text
        assert text == static_texts["beta"], (text, static_texts["beta"])
        print("runtime: beta loaded at run time gives its start-up text")
        st, err = post("/v1/load_lora_adapter", {"lora_name": "gamma", "lora_path": b_dir})
        assert st == 400 and "no room for LoRA adapter" in err["error"]["message"], (st, err)
        st, err = post("/v1/load_lora_adapter", {"lora_name": "beta", "lora_path": b_dir})
        assert st == 400 and "already been loaded" in err["error"]["message"], (st, err)
        st, err = post("/v1/unload_lora_adapter", {"lora_name": "nobody"})
        assert st == 404, (st, err)
        # In use: a stream with alpha holds it.
        long_prompt = "Once upon a time there was a lighthouse keeper who " * 12
        stream = client.completions.create(model="alpha", prompt=long_prompt, max_tokens=60, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        st, err = post("/v1/unload_lora_adapter", {"lora_name": "alpha"})
        assert st == 409 and "in use" in err["error"]["message"], (st, err)
        for _ in stream:
            pass
        st, msg = post("/v1/unload_lora_adapter", {"lora_name": "alpha"})
        assert st == 200, (st, msg)
        try:
            client.completions.create(model="alpha", prompt="x", max_tokens=1)
            raise AssertionError("alpha answered after its unload")
        except openai.NotFoundError:
            pass
        print("runtime: no slot 400, taken name 400, unknown 404, in use 409, unloaded then 404")
        # A new adapter in alpha's old slot: none of alpha's KV.
        delta = os.path.join(tmp, "delta")
        write_adapter(delta, 4)
        st, msg = post("/v1/load_lora_adapter", {"lora_name": "delta", "lora_path": delta})
        assert st == 200, (st, msg)
        h0 = metric(srv.port, "paged:prefix_cache_hits_total")
        client.completions.create(model="delta", prompt=long_prompt, max_tokens=2, temperature=0)
        h1 = metric(srv.port, "paged:prefix_cache_hits_total")
        assert h1 == h0, (h0, h1)
        bad = os.path.join(tmp, "bad-runtime")
        write_adapter(bad, 5, shapes={"q_proj": (Q, 512)})
        post("/v1/unload_lora_adapter", {"lora_name": "delta"})
        st, err = post("/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": bad})
        assert st == 400 and "adapter_model.safetensors" in err["error"]["message"], (st, err)
        print(f"runtime: delta in alpha's old slot found {h1 - h0:.0f} cached tokens; a bad adapter: "
              f"{err['error']['message'][:90]}...")
        assert metric(srv.port, "paged:kv_cache_usage_perc") == 0.0


def on_demand(tmp, a_dir, b_dir, static_texts):
    """Two adapters, one slot (--max-loras 1): each request brings its adapter
    in, evicting the idle one; concurrent requests of both wait their turn;
    the texts are those of the two-slot server; a third adapter loaded at run
    time (--max-cpu-loras 3) waits in no slot until a request names it."""
    with su.Server("--enable-lora", "--max-loras", "1", "--max-cpu-loras", "3", "--allow-runtime-lora-updating",
                   "--lora-modules", f"alpha={a_dir}", f"beta={b_dir}") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=120, max_retries=0)
        ids = [m.id for m in client.models.list().data]
        base = ids[0]
        assert ids[1:] == ["alpha", "beta"], ids
        prompt = "The history of the printing press begins"

        def complete(model, out=None, key=None):
            text = client.completions.create(model=model, prompt=prompt, max_tokens=20,
                                             temperature=0).choices[0].text
            if out is not None:
                out[key] = text
            return text
        for m in ("beta", "alpha", "beta", base, "alpha"):
            assert complete(m) == static_texts[m], m
        print("on demand, one slot: beta, alpha, beta, base, alpha one after another give the two-slot texts")
        # Concurrently, one request of each (two rows of one adapter in a
        # step would change the CPU's summation order, and with these flat
        # random adapters a greedy pick: the start-up texts were made with
        # one row each): one adapter waits for the slot.
        for names in (["alpha", "beta", base], ["beta", base, "alpha"]):
            together = {}
            threads = [threading.Thread(target=complete, args=(m, together, i)) for i, m in enumerate(names)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(together) == len(names), together
            for i, m in enumerate(names):
                assert together[i] == static_texts[m], (i, m, together[i])
        print("on demand, one slot: both adapters and the base at once, twice: the two-slot texts")
        st, _, body = su.request(srv.port, "POST", "/v1/load_lora_adapter", {"lora_name": "gamma", "lora_path": b_dir})
        assert st == 200, body
        assert complete("gamma") == static_texts["beta"]
        st, _, body = su.request(srv.port, "POST", "/v1/load_lora_adapter", {"lora_name": "delta", "lora_path": b_dir})
        assert st == 400 and b"no room" in body, (st, body)
        st, _, body = su.request(srv.port, "POST", "/v1/unload_lora_adapter", {"lora_name": "beta"})
        assert st == 200, body
        assert complete("alpha") == static_texts["alpha"]
        print("on demand: gamma loaded at run time with the slot full answers as beta (its files); a fourth "
              "adapter 400 (--max-cpu-loras 3); beta unloaded while in no slot")
        assert metric(srv.port, "paged:kv_cache_usage_perc") == 0.0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        a_dir, b_dir = os.path.join(tmp, "alpha"), os.path.join(tmp, "beta")
        write_adapter(a_dir, 1)
        write_adapter(b_dir, 2)
        with su.Server("--enable-lora", "--lora-modules", f"alpha={a_dir}", f"beta={b_dir}") as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=120, max_retries=0)
            models = client.models.list().data
            base = models[0].id
            ids = [m.id for m in models]
            assert ids == [base, "alpha", "beta"], ids
            raw = json.loads(su.request(srv.port, "GET", "/v1/models")[2])["data"]
            assert raw[1]["parent"] == base and raw[1]["root"] == a_dir and raw[0]["parent"] is None, raw
            print(f"/v1/models: {ids}, adapters' parent {raw[1]['parent']}")

            prompt = "The history of the printing press begins"

            def complete(model, out=None, key=None):
                r = client.completions.create(model=model, prompt=prompt, max_tokens=20, temperature=0)
                assert r.model == model, (r.model, model)
                if out is not None:
                    out[key] = r.choices[0].text
                return r.choices[0].text

            together = {}
            threads = [threading.Thread(target=complete, args=(m, together, m)) for m in (base, "alpha", "beta")]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(together) == 3, together
            for m in ("alpha", "beta"):
                assert together[m] != together[base], (m, together)
            alone = {m: complete(m) for m in (base, "alpha", "beta")}
            for m in together:
                print(f"{m:28s} {together[m]!r}")
                assert alone[m] == together[m], (m, alone[m], together[m])
            print("concurrent texts equal the texts alone; the adapters change the text")

            # 3. The prefix cache keyed by adapter (a long prompt: whole blocks).
            long_prompt = "Once upon a time there was a lighthouse keeper who " * 12
            chat = dict(prompt=long_prompt, max_tokens=4, temperature=0)
            client.completions.create(model="alpha", **chat)
            h0 = metric(srv.port, "paged:prefix_cache_hits_total")
            client.completions.create(model=base, **chat)
            h1 = metric(srv.port, "paged:prefix_cache_hits_total")
            client.completions.create(model="alpha", **chat)
            h2 = metric(srv.port, "paged:prefix_cache_hits_total")
            print(f"prefix cache hits (tokens): base after alpha +{h1 - h0:.0f}, alpha again +{h2 - h1:.0f}")
            assert h1 == h0 and h2 > h1, (h0, h1, h2)

            # 4. vLLM's lora_requests_info: the adapter of a running request,
            # then none once it is gone; the value is the time of the change.
            def lora_info():
                body = su.request(srv.port, "GET", "/metrics")[2].decode()
                m = re.findall(r'^paged:lora_requests_info\{max_lora="(\d+)",running_lora_adapters="([^"]*)",'
                               r'waiting_lora_adapters="([^"]*)"\} ([0-9.e+]+)$', body, re.M)
                assert len(m) == 1, m  # one series
                return m[0][0], m[0][1], m[0][2], float(m[0][3])
            t0 = time.time()
            stream = client.completions.create(model="alpha", prompt=prompt, max_tokens=400, temperature=0,
                                               stream=True)
            next(iter(stream))
            mx, run, wait, stamp = lora_info()
            print(f"lora_requests_info while alpha streams: max_lora={mx} running={run!r} waiting={wait!r}")
            assert (mx, run, wait) == ("2", "alpha", "") and t0 - 1 <= stamp <= time.time() + 1, (mx, run, stamp)
            stream.close()
            for _ in range(100):
                mx, run, wait, stamp2 = lora_info()
                if run == "":
                    break
                time.sleep(0.1)
            print(f"after the client left: running={run!r} waiting={wait!r}")
            assert (run, wait) == ("", "") and stamp2 >= stamp, (run, wait, stamp, stamp2)

            # 5. An unknown model.
            try:
                client.completions.create(model="gamma", prompt="x", max_tokens=1)
                raise AssertionError("gamma answered")
            except openai.NotFoundError as e:
                assert "gamma" in str(e), e
            used = metric(srv.port, "paged:kv_cache_usage_perc")
            assert used == 0.0, used
            st, _, _ = su.request(srv.port, "POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": b_dir})
            assert st == 404, st
        runtime(tmp, a_dir, b_dir, together)
        on_demand(tmp, a_dir, b_dir, together)
        plan_lora(a_dir, b_dir)
        refused(["--lora-modules", f"alpha={a_dir}"], ["--lora-modules needs --enable-lora"])
        refused(["--enable-lora", "--lora-modules", f"a={a_dir}", f"a={b_dir}"], ["given twice"])
        refused(["--enable-lora", "--max-loras", "1", "--max-cpu-loras", "1", "--lora-modules", f"a={a_dir}",
                 f"b={b_dir}"], ["more than --max-cpu-loras 1"])
        refused(["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "1", "--lora-modules", f"a={a_dir}"],
                ["--max-cpu-loras 1 must be at least --max-loras 2"])
        odd = os.path.join(tmp, "odd")
        write_adapter(odd, 3, shapes={"q_proj": (Q, 512)})
        refused(["--enable-lora", "--lora-modules", f"odd={odd}"], [odd, "adapter_model.safetensors"])
        # One beyond the slots is read at start too.
        refused(["--enable-lora", "--max-loras", "1", "--lora-modules", f"a={a_dir}", f"odd={odd}"],
                [odd, "adapter_model.safetensors"])
    print("ok: LoRA through the server (SDK, concurrent adapters, prefix cache keyed by adapter, errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
