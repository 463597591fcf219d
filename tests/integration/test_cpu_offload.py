#!/usr/bin/env python3
"""--cpu-offload-gb (engine/model/model_offload.c) on the CPU backend: layers from
the first on move to host copies as they load and run from two slots, layer
l from slot l % 2, the copy of layer l + 2 queued after layer l's ops. The
CPU backend runs each op when it is called, so a copy queued too early (a
slot overwritten before its layer ran) or a weight pointed at the wrong
offset changes the output: the checks compare bit for bit.

1. Next-token logits (build/tests/tools/dump_logits, exact numerics) with
   none, some and all layers offloaded are identical: the default model
   (Q4_1 GGUF, quantized blocks used in place) at --tp 1 and 3; a random
   safetensors checkpoint with --quantization fp8 (row scales inside each
   weight's pack) and int4, and its shape as dummy weights (made by the
   backend's generator), at --tp 1 and 2.
2. The real server: greedy texts of the held-out prompts with
   --cpu-offload-gb equal those without (raw HTTP and the OpenAI SDK, one
   process and --tp 3); the log names the layers and the measured copy
   rate; /metrics counts the host copies (weights_offloaded) and the
   device weights drop by what moved, less the two slots; every KV block
   returns.
3. Bad values stop before any weight is read, with one line naming the flag.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

DUMP = os.path.join(su.ROOT, "build/tests/tools/dump_logits")
IDS = "1,17,5,230,99,42,7,310,8,64,1000,3,3,3,512,77"


def dump(args):
    r = subprocess.run([DUMP, *args, "--mode", "exact", "--threads", "2", IDS], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, (args, r.stderr[-2000:])
    return json.loads(r.stdout)["logits"], r.stderr


def check_logits():
    su.require_model_and_binary()
    if not os.path.exists(DUMP):
        su.skip(f"{DUMP} is not built")
    import test_tensor_parallel as ttp  # its random safetensors writer
    cases = [([su.MODEL], tp, offs) for tp in (1, 3) for offs in (("0.004", "0.02", "1"),)]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(ttp.BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=2,
                   num_hidden_layers=5, intermediate_size=1024, hidden_size=256)
        ttp.write_config(tmp, cfg)
        ttp.write_safetensors(tmp, cfg, seed=3)
        cases += [(["--dummy", os.path.join(tmp, "config.json")], tp, ("0.0005", "1")) for tp in (1, 2)]
        for q in ("fp8", "int4"):
            cases += [([tmp, "--quantization", q], tp, ("0.0005", "1")) for tp in (1, 2)]
        for args, tp, offs in cases:
            ref, _ = dump([*args, "--tp", str(tp)])
            for off in offs:
                got, err = dump([*args, "--tp", str(tp), "--cpu-offload-gb", off])
                assert "cpu offload: layers 0-" in err, err[-2000:]
                n = err.split("cpu offload: layers 0-")[1].split()[1].strip("(")
                assert got == ref, (args, tp, off, max(abs(a - b) for a, b in zip(got, ref)))
                print(f"  {os.path.basename(args[0])[:28]:28s} {' '.join(args[1:]):17s} tp {tp} "
                      f"--cpu-offload-gb {off:6s}: {n} layers offloaded, logits identical")


def greedy(port, prompts):
    out = []
    for p in prompts:
        st, body = su.post(port, "/v1/completions", {"prompt": p, "max_tokens": 24, "temperature": 0,
                                                     "ignore_eos": True})
        assert st == 200, (st, body)
        out.append(body["choices"][0]["text"])
    return out


def check_server():
    su.require_model_and_binary()
    su.require_openai()
    import openai
    prompts = su.PROMPTS_20[:8]
    for tp in ("1", "3"):
        with su.Server("--matmul-mode", "exact", "-tp", tp) as srv:
            ref = greedy(srv.port, prompts)
            m0 = su.metrics(srv.port)
        with su.Server("--matmul-mode", "exact", "-tp", tp, "--cpu-offload-gb", "0.02") as srv:
            got = greedy(srv.port, prompts)
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
            model = client.models.list().data[0].id
            r = client.completions.create(model=model, prompt=prompts[0], max_tokens=24, temperature=0,
                                          extra_body={"ignore_eos": True})
            assert r.choices[0].text == ref[0], (r.choices[0].text, ref[0])
            m = su.wait_idle(srv.port)
            assert su.metric(m, "paged:kv_cache_blocks", state="used") == 0
            log = srv.log()
        assert got == ref, [(a, b) for a, b in zip(ref, got) if a != b]
        line = next(l for l in log.splitlines() if "cpu offload: layers 0-" in l)
        assert "GB/s measured now" in line and "ms of copies per step" in line, line
        host = su.metric(m, "paged:host_memory_bytes", category="weights_offloaded")
        assert host >= 0.02 * (1 << 30), host  # the budget is per rank, as vLLM's is per GPU
        dev = "cpu" if tp == "1" else "cpu:0"
        w0 = su.metric(m0, "paged:device_memory_bytes", device=dev, category="weights")
        w1 = su.metric(m, "paged:device_memory_bytes", device=dev, category="weights")
        assert w1 < w0, (w0, w1)
        print(f"  -tp {tp}: {len(prompts)}/{len(prompts)} greedy texts equal with --cpu-offload-gb 0.02; host copies "
              f"{host / 2**20:.1f} MiB; device weights {w0 / 2**20:.1f} -> {w1 / 2**20:.1f} MiB; {line.split('INFO')[1].strip()[:120]}")


def check_bad_values():
    su.require_model_and_binary()
    for v in ("-1", "lots", ""):
        r = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--port", "0", "--cpu-offload-gb", v],
                           capture_output=True, text=True, timeout=60)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        assert r.returncode != 0 and "--cpu-offload-gb" in r.stderr and "loaded" not in r.stderr, (v, r.stderr)
        assert len(lines) <= 2, (v, lines)


def main():
    su.run_checks([
        ("offloaded layers give identical logits (GGUF Q4_1 tp 1/3; fp8, int4 tp 1/2)", check_logits),
        ("the server with --cpu-offload-gb answers as without it; log and metrics", check_server),
        ("bad --cpu-offload-gb values stop with one line", check_bad_values),
    ])
    print("test_cpu_offload: all passed")


if __name__ == "__main__":
    main()
