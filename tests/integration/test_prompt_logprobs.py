#!/usr/bin/env python3
"""Prompt logprobs end to end: vLLM's `prompt_logprobs` on /v1/completions
and /v1/chat/completions, and OpenAI's `echo` with `logprobs` (also with
max_tokens 0), on real servers with the default model.

  1. self-consistency: a greedy generation with logprobs=5, then prompt +
     the generated ids as a token-id prompt with prompt_logprobs=5: at the
     generated positions the prompt logprobs equal the generation's within
     SELF_BOUND and the top-5 ids agree (ranks are 1 for greedy tokens);
  2. Hugging Face transformers on the same GGUF weights (dequantized with
     the `gguf` package into a LlamaForCausalLM, float32): every prompt
     position of a server in --matmul-mode exact within HF_BOUND;
  3. echo + logprobs through the OpenAI SDK (non-streamed, streamed, and
     max_tokens 0): shapes, the first entry null, text_offset monotone and
     consistent with the text;
  4. prompt_logprobs on chat (on the response, one entry per prompt token);
  5. a ~1,500-token prompt chunked over many 256-token steps gives the same
     prompt logprobs as one 2048-token step (another server);
  6. after the same prompt was cached, a prompt_logprobs request still gets
     every position (the prefix cache is bypassed: 0 cached tokens);
  7. limits: k above 20 and k > 0 in a stream are 400s naming the field;
  8. afterwards no KV block is held and no request runs (/metrics).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import (MODEL, Server, error_of, post, require_model_and_binary, require_openai,  # noqa: E402
                         run_checks, sse_stream, wait_idle)

require_model_and_binary()
require_openai()
import openai  # noqa: E402

# Generation scores a token from a decode row (one query against the KV
# cache through the decode attention kernel, a one-row product); prompt
# logprobs score the same position from a prefill row (the prefill
# attention kernel, many-row products, other step shapes). The default CPU
# numerics (llama.cpp's: each row's activations quantized to 8 bits,
# integer dot products, per-row attention) make a row's result independent
# of the step it is in, so the two agree bit for bit (measured: 0). The
# bound leaves room for f32 reassociation (~1e-6 relative per op through
# 30 layers, ~1e-5 nats) should a kernel start splitting rows by batch
# shape, and still catches a wrong row (an off-by-one position is off by
# whole nats).
SELF_BOUND = 1e-4
# Exact mode (f32 products of the dequantized weights) against torch f32
# on the same dequantized weights: summation order only; measured ~2e-5
# nats through 30 layers, bound with a 50x margin.
HF_BOUND = 1e-3
# Chunked (256-token steps) against one step, same numerics: different
# step shapes again, as SELF_BOUND.
CHUNK_BOUND = SELF_BOUND

PROMPT = "The capital of France is"
LONG = " ".join(f"Item {i}: the {['red', 'green', 'blue', 'old', 'new'][i % 5]} box holds {i * 7 % 13} stones."
                for i in range(110))


def tokenize(port, text):
    st, j = post(port, "/tokenize", {"prompt": text})
    assert st == 200, j
    return j["tokens"]


def completion(port, body):
    st, j = post(port, "/v1/completions", dict({"max_tokens": 1, "temperature": 0}, **body), timeout=600)
    assert st == 200, j
    return j


def check_plp_shape(plp, ids, k):
    """vLLM's prompt_logprobs: [None, {id: {logprob, rank, decoded_token}}, ...]."""
    assert isinstance(plp, list) and len(plp) == len(ids), (len(plp), len(ids))
    assert plp[0] is None
    for p in range(1, len(ids)):
        d = plp[p]
        keys = list(d)
        assert keys[0] == str(ids[p]), (p, keys, ids[p])  # the prompt token first
        assert k <= len(d) <= k + 1, (p, len(d), k)
        for key, e in d.items():
            assert set(e) == {"logprob", "rank", "decoded_token"}, e
            assert e["logprob"] <= 0 and isinstance(e["rank"], int) and e["rank"] >= 1, e
        # The top-k hold ranks 1..k (the prompt token's own entry is shared when
        # it is among them).
        ranks = sorted(e["rank"] for e in d.values())
        assert ranks[:k] == list(range(1, k + 1)), (p, d)
        # The top-k are ordered by logprob; the prompt token's rank agrees with them.
        me = d[keys[0]]
        above = sum(1 for kk, e in d.items() if kk != keys[0] and e["logprob"] > me["logprob"] + 1e-6)
        assert me["rank"] >= above + 1, (p, me, d)


def plp_values(plp, ids):
    return [None] + [plp[p][str(ids[p])]["logprob"] for p in range(1, len(ids))]


def top_ids(d, k):
    """The top-k ids of one prompt_logprobs entry, by rank."""
    items = sorted(((e["rank"], int(key)) for key, e in d.items()), key=lambda x: x[0])
    return [i for r, i in items if r <= k][:k]


# --- the checks -------------------------------------------------------------------------


def self_consistency(port):
    gen = completion(port, {"prompt": PROMPT, "max_tokens": 8, "logprobs": 5, "ignore_eos": True})
    lp = gen["choices"][0]["logprobs"]
    gen_tokens = lp["tokens"]
    assert len(gen_tokens) == 8
    # The generated ids: the prompt + output text tokenized again (checked
    # below to give back exactly the generated tokens).
    ids = tokenize(port, PROMPT)
    full = tokenize(port, PROMPT + gen["choices"][0]["text"])
    assert full[:len(ids)] == ids and len(full) - len(ids) == 8, (ids, full, gen_tokens)
    j = completion(port, {"prompt": full, "max_tokens": 1, "prompt_logprobs": 5})
    plp = j["choices"][0]["prompt_logprobs"]
    check_plp_shape(plp, full, 5)
    n_gen = len(full) - len(ids)
    worst = 0.0
    for t in range(n_gen):
        p = len(ids) + t
        d = plp[p]
        assert d[str(full[p])]["decoded_token"] == gen_tokens[t], (t, d, gen_tokens[t])
        diff = abs(d[str(full[p])]["logprob"] - lp["token_logprobs"][t])
        worst = max(worst, diff)
        assert diff <= SELF_BOUND, (t, d[str(full[p])]["logprob"], lp["token_logprobs"][t])
        assert d[str(full[p])]["rank"] == 1, (t, d)  # greedy: the most likely token
        # The same top-5 (texts, as the legacy format keys them) and values.
        want = lp["top_logprobs"][t]
        got = {plp[p][str(i)]["decoded_token"]: plp[p][str(i)]["logprob"] for i in top_ids(d, 5)}
        assert set(got) == set(want), (t, got, want)
        for s, v in want.items():
            worst = max(worst, abs(got[s] - v))
            assert abs(got[s] - v) <= SELF_BOUND, (t, s, got[s], v)
    print(f"     {n_gen} generated positions: max |prompt logprob - generation logprob| {worst:.2e}")


def echo_sdk(port):
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
    model = c.models.list().data[0].id
    ids = tokenize(port, PROMPT)
    r = c.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=3)
    ch = r.choices[0]
    assert ch.text.startswith(PROMPT), ch.text
    lp = ch.logprobs
    n = len(ids) + 4
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs[1:])
    assert all(1 <= len(t) <= 4 for t in lp.top_logprobs[1:])
    for i in range(1, n):  # the token itself is always among its top_logprobs
        assert abs(lp.top_logprobs[i][lp.tokens[i]] - lp.token_logprobs[i]) < 1e-9
    assert lp.text_offset[0] == 0
    assert all(a <= b for a, b in zip(lp.text_offset, lp.text_offset[1:])), lp.text_offset
    for tok, off in zip(lp.tokens, lp.text_offset):
        assert ch.text[off:off + len(tok)] == tok, (tok, off, ch.text)
    assert "".join(lp.tokens) == ch.text
    # The same prompt positions as prompt_logprobs reports.
    j = completion(port, {"prompt": PROMPT, "prompt_logprobs": 3})
    ref = plp_values(j["choices"][0]["prompt_logprobs"], ids)
    for p in range(1, len(ids)):
        assert abs(lp.token_logprobs[p] - ref[p]) <= SELF_BOUND, (p, lp.token_logprobs[p], ref[p])
    # max_tokens 0: the prompt alone, with its logprobs; no completion tokens.
    r0 = c.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    ch0 = r0.choices[0]
    assert ch0.text == PROMPT, ch0.text
    assert len(ch0.logprobs.tokens) == len(ids) and ch0.logprobs.token_logprobs[0] is None
    assert ch0.finish_reason == "length" and r0.usage.completion_tokens == 0, (ch0.finish_reason, r0.usage)
    # Streamed: the first chunk carries the prompt and its logprobs.
    chunks = list(c.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0, echo=True,
                                       logprobs=1, stream=True))
    first = chunks[0].choices[0]
    assert first.text == PROMPT and len(first.logprobs.tokens) == len(ids), first
    assert first.logprobs.token_logprobs[0] is None
    text = "".join(k.choices[0].text for k in chunks if k.choices)
    offs = [o for k in chunks if k.choices and k.choices[0].logprobs for o in k.choices[0].logprobs.text_offset]
    toks = [t for k in chunks if k.choices and k.choices[0].logprobs for t in k.choices[0].logprobs.tokens]
    assert len(toks) == len(ids) + 3 and all(a <= b for a, b in zip(offs, offs[1:])), offs
    for tok, off in zip(toks, offs):
        assert text[off:off + len(tok)] == tok, (tok, off, text)
    # Without logprobs, echo + max_tokens 0 is the prompt and no logprobs.
    r1 = c.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True)
    assert r1.choices[0].text == PROMPT and r1.choices[0].logprobs is None


def chat(port):
    msgs = [{"role": "user", "content": "Name a colour."}]
    st, tk = post(port, "/tokenize", {"messages": msgs})
    assert st == 200, tk
    ids = tk["tokens"]
    st, j = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0,
                                                "prompt_logprobs": 2})
    assert st == 200, j
    assert "prompt_logprobs" not in j["choices"][0]  # vLLM: on the response
    check_plp_shape(j["prompt_logprobs"], ids, 2)
    assert j["usage"]["prompt_tokens"] == len(ids)
    # Without the field: none.
    st, j = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    assert st == 200 and "prompt_logprobs" not in j, j
    # prompt_logprobs 0 with stream: allowed (vLLM), nothing reported.
    st, evs, done = sse_stream(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2,
                                                              "prompt_logprobs": 0, "stream": True})
    assert st == 200 and done and all("prompt_logprobs" not in e for e in evs), evs


def long_prompt(port, port_big, ctx):
    ids = tokenize(port, LONG)
    assert 1300 <= len(ids) <= 1700, len(ids)
    a = completion(port, {"prompt": ids, "prompt_logprobs": 2})
    b = completion(port_big, {"prompt": ids, "prompt_logprobs": 2})
    pa, pb = a["choices"][0]["prompt_logprobs"], b["choices"][0]["prompt_logprobs"]
    check_plp_shape(pa, ids, 2)
    check_plp_shape(pb, ids, 2)
    va, vb = plp_values(pa, ids), plp_values(pb, ids)
    worst = max(abs(x - y) for x, y in zip(va[1:], vb[1:]))
    assert worst <= CHUNK_BOUND, worst
    same_top = sum(top_ids(pa[p], 1) == top_ids(pb[p], 1) for p in range(1, len(ids)))
    assert same_top >= len(ids) - 1 - 3, same_top  # argmax ties may flip a handful
    print(f"     {len(ids)} tokens in 256-token steps vs one step: max |diff| {worst:.2e}, "
          f"top-1 equal at {same_top}/{len(ids) - 1}")
    ctx.update(ids=ids, values=va)


def prefix_cache_bypass(port, ctx):
    ids = ctx["ids"]
    # Cache the prompt with a plain request, then ask for its prompt logprobs.
    completion(port, {"prompt": ids})
    warm = completion(port, {"prompt": ids})
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, warm["usage"]  # it is cached
    j = completion(port, {"prompt": ids, "prompt_logprobs": 1})
    assert j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, j["usage"]
    plp = j["choices"][0]["prompt_logprobs"]
    check_plp_shape(plp, ids, 1)
    # Every position computed again: the values of the uncached request (check 5).
    vals = plp_values(plp, ids)
    worst = max(abs(x - y) for x, y in zip(vals[1:], ctx["values"][1:]))
    assert worst <= CHUNK_BOUND, worst


def limits(port):
    st, j = post(port, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 21})
    e = error_of(j)
    assert st == 400 and e["param"] == "prompt_logprobs" and "20" in e["message"], (st, j)
    st, j = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                "prompt_logprobs": -1})
    assert st == 400 and error_of(j)["param"] == "prompt_logprobs", (st, j)
    st, j = post(port, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True})
    e = error_of(j)
    assert st == 400 and e["param"] == "prompt_logprobs" and "stream" in e["message"], (st, j)
    st, j = post(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert st == 400 and error_of(j)["param"] == "max_tokens", (st, j)
    # A one-token prompt: just [null].
    ids = tokenize(port, "Hi")[:1]
    j = completion(port, {"prompt": ids, "prompt_logprobs": 3})
    assert j["choices"][0]["prompt_logprobs"] == [None], j
    # Several prompts and n > 1: each choice carries its prompt's list.
    j = completion(port, {"prompt": [PROMPT, "Hello there"], "n": 2, "temperature": 0.8, "seed": 1,
                          "prompt_logprobs": 1})
    assert len(j["choices"]) == 4
    for ch in j["choices"]:
        text = [PROMPT, "Hello there"][ch["index"] // 2]
        check_plp_shape(ch["prompt_logprobs"], tokenize(port, text), 1)


def idle(port):
    m = wait_idle(port)
    print(f"     idle: {len(m)} metric samples, 0 KV blocks used, 0 requests running")


# --- Hugging Face reference ---------------------------------------------------------------


def hf_model():
    """The default model's GGUF weights, dequantized, in a transformers
    LlamaForCausalLM (float32); None when torch/transformers/gguf are missing."""
    try:
        import gguf
        import numpy as np
        import torch
        import transformers
    except ImportError as e:
        print(f"     (no HF reference: {e})")
        return None
    r = gguf.GGUFReader(MODEL)

    def field(name):
        f = r.fields[name]
        return f.parts[f.data[0]][0]
    n_head, n_kv = int(field("llama.attention.head_count")), int(field("llama.attention.head_count_kv"))
    cfg = transformers.LlamaConfig(
        hidden_size=int(field("llama.embedding_length")), intermediate_size=int(field("llama.feed_forward_length")),
        num_hidden_layers=int(field("llama.block_count")), num_attention_heads=n_head, num_key_value_heads=n_kv,
        vocab_size=int(field("llama.vocab_size")), rms_norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(field("llama.rope.freq_base")), max_position_embeddings=int(field("llama.context_length")),
        tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg).float().eval()

    def unpermute(w, heads):  # llama.cpp's converter interleaves Q/K rows for its RoPE
        # (rows of a head as [d/2][2] there, [2][d/2] in Hugging Face's rotate-half order).
        return w.reshape(heads, w.shape[0] // heads // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    sd = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)]) if w.ndim > 1 or len(t.shape) > 1 else w
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = w
        elif t.name == "output_norm.weight":
            sd["model.norm.weight"] = w
        elif parts[0] == "blk":
            kind = parts[2]
            if kind == "attn_q":
                w = unpermute(w, n_head)
            elif kind == "attn_k":
                w = unpermute(w, n_kv)
            sd[f"model.layers.{parts[1]}.{names[kind]}.weight"] = w
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                                                strict=False)
    assert not unexpected and all("lm_head" in k or "rotary" in k for k in missing), (missing, unexpected)
    model.tie_weights()
    return model


def hf_parity(port_exact):
    model = hf_model()
    if model is None:
        return
    import torch
    ids = tokenize(port_exact, "Paged attention stores the KV cache in fixed-size blocks, so memory is not wasted.")
    with torch.no_grad():
        lps = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    j = completion(port_exact, {"prompt": ids, "prompt_logprobs": 5})
    plp = j["choices"][0]["prompt_logprobs"]
    check_plp_shape(plp, ids, 5)
    worst, rank_ok = 0.0, 0
    for p in range(1, len(ids)):
        ref = float(lps[p - 1, ids[p]])
        got = plp[p][str(ids[p])]
        worst = max(worst, abs(got["logprob"] - ref))
        rank_ref = int((lps[p - 1] > lps[p - 1, ids[p]]).sum()) + 1
        rank_ok += got["rank"] == rank_ref
        ref_top = torch.topk(lps[p - 1], 5).indices.tolist()
        assert top_ids(plp[p], 5)[:3] == ref_top[:3], (p, top_ids(plp[p], 5), ref_top)
    assert worst <= HF_BOUND, worst
    assert rank_ok >= len(ids) - 1 - 1, (rank_ok, len(ids))
    print(f"     {len(ids) - 1} positions vs transformers (exact mode): max |diff| {worst:.2e}, "
          f"ranks equal at {rank_ok}/{len(ids) - 1}")


def main():
    ctx = {}
    with Server("--max-num-batched-tokens", "2048") as big:
        with Server("--max-num-batched-tokens", "256") as srv:
            p = srv.port
            run_checks([
                ("1. prompt logprobs at generated positions = the generation's logprobs", lambda: self_consistency(p)),
                ("3. echo + logprobs via the OpenAI SDK (whole, max_tokens 0, streamed)", lambda: echo_sdk(p)),
                ("4. prompt_logprobs on chat", lambda: chat(p)),
                ("5. a 1,500-token prompt in 256-token steps = one 2048-token step",
                 lambda: long_prompt(p, big.port, ctx)),
                ("6. after the prompt is cached: every position, no prefix-cache hits",
                 lambda: prefix_cache_bypass(p, ctx)),
                ("7. limits and 400s", lambda: limits(p)),
                ("8. no KV block or request left", lambda: (idle(p), idle(big.port))),
            ])
    with Server("--matmul-mode", "exact") as ex:
        run_checks([("2. exact mode against transformers on the same weights", lambda: hf_parity(ex.port)),
                    ("8. no KV block or request left (exact server)", lambda: idle(ex.port))])
    print("ok: prompt logprobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
