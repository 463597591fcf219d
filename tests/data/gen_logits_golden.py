#!/usr/bin/env python3
"""Reference logits and greedy continuations for the default model.

Two independent references, both on models/SmolLM2-135M-Instruct.Q4_1.gguf:
  * llama.cpp (built from the llama-cpp-python 0.3.36 sdist, CPU): last
    position logits and 16 greedy tokens per prompt. llama.cpp quantizes
    activations to 8 bits inside its Q4_1/Q8_0 dot products, so its logits
    differ from an exact f32 forward by about a percent.
  * an exact f32 forward written here in numpy over weights dequantized by
    llama.cpp's own gguf-py package (not by our C code).

Writes tests/data/logits_golden.json: for each prompt the token ids, both
references' full last-position logits (as float32 base64) and llama.cpp's
greedy tokens. Usage (see tests/data/README.md):
  PYTHONPATH=$SDIST:$SDIST/vendor/llama.cpp/gguf-py LLAMA_CPP_LIB_PATH=$BUILD/bin \
      python3 tests/data/gen_logits_golden.py models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import base64
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea,",
    "List three primary colors:",
    "Translate to French: Good morning, my friend.",
]


def load(path):
    r = GGUFReader(path)
    t = {}
    for x in r.tensors:
        a = dequantize(x.data, x.tensor_type).astype(np.float32)
        t[x.name] = a.reshape([int(d) for d in reversed(x.shape)]) if a.ndim else a
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    return t, kv


def unpermute(w, n_head):
    # llama.cpp interleaves rotary pairs; go back to the rotate-half layout.
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def forward(t, kv, ids):
    L = kv["llama.block_count"]
    nh = kv["llama.attention.head_count"]
    nkv = kv["llama.attention.head_count_kv"]
    eps = kv["llama.attention.layer_norm_rms_epsilon"]
    theta = kv["llama.rope.freq_base"]
    x = t["token_embd.weight"][ids].astype(np.float64)
    n, dim = x.shape
    hd = dim // nh
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def rope(v):  # v: [n, heads, hd]
        a, b = v[..., : hd // 2], v[..., hd // 2 :]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(L):
        p = f"blk.{l}."
        h = rms(x, t[p + "attn_norm.weight"])
        q = h @ unpermute(t[p + "attn_q.weight"], nh).T
        k = h @ unpermute(t[p + "attn_k.weight"], nkv).T
        v = h @ t[p + "attn_v.weight"].T
        q = rope(q.reshape(n, nh, hd))
        k = rope(k.reshape(n, nkv, hd))
        v = v.reshape(n, nkv, hd)
        g = nh // nkv
        out = np.empty((n, nh, hd))
        for hh in range(nh):
            s = q[:, hh] @ k[:, hh // g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, hh] = s @ v[:, hh // g]
        x = x + out.reshape(n, dim) @ t[p + "attn_output.weight"].T
        h = rms(x, t[p + "ffn_norm.weight"])
        gt = h @ t[p + "ffn_gate.weight"].T
        up = h @ t[p + "ffn_up.weight"].T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ t[p + "ffn_down.weight"].T
    x = rms(x[-1:], t["output_norm.weight"])
    head = t.get("output.weight", t["token_embd.weight"])
    return (x @ head.T)[0].astype(np.float32)


def b64(a):
    return base64.b64encode(np.asarray(a, dtype=np.float32).tobytes()).decode()


def main():
    path = sys.argv[1]
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=1024, logits_all=True, verbose=False, n_threads=2)
    t, kv = load(path)
    out = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        ref_llama = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
        greedy, seq = [], list(ids)
        for _ in range(16):
            llm.reset()
            llm.eval(seq)
            tok = int(np.argmax(llm.scores[len(seq) - 1]))
            greedy.append(tok)
            seq.append(tok)
        ref_f32 = forward(t, kv, ids)
        err = np.linalg.norm(ref_f32 - ref_llama) / np.linalg.norm(ref_f32)
        print(f"{prompt[:30]!r:34} n={len(ids):3d} top1 f32={ref_f32.argmax()} llama={ref_llama.argmax()} rel={err:.4f}")
        out.append({"prompt": prompt, "ids": [int(i) for i in ids], "greedy_llama_cpp": greedy,
                    "logits_f32": b64(ref_f32), "logits_llama_cpp": b64(ref_llama)})
    json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "llama_cpp_python": "0.3.36",
               "prompts": out}, open("tests/data/logits_golden.json", "w"))


if __name__ == "__main__":
    main()
