#!/usr/bin/env python3
"""llama.cpp's decode throughput on the workload of bench/bench_cpu_decode.c:
S sequences prefilled with P tokens, then N llama_decode calls of one token
per sequence (m = S rows per matrix product), through llama-cpp-python's
low-level API on the library built from its sdist.

  SD=/work/ref/llama_cpp_python-0.3.36
  PYTHONPATH=$SD LLAMA_CPP_LIB_PATH=$SD/vendor/llama.cpp/build/bin \
      python3 bench/ref/llama_cpp_decode.py --seqs 16 --steps 32 [--fa auto|on|off] 2>/dev/null
(llama.cpp logs to stderr.)
"""
import argparse
import time

import llama_cpp as L

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--seqs", type=int, default=1)
ap.add_argument("--steps", type=int, default=64)
ap.add_argument("--prompt", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--fa", default="auto", choices=["auto", "on", "off"])
a = ap.parse_args()
S, N, P = a.seqs, a.steps, a.prompt

L.llama_backend_init()
model = L.llama_model_load_from_file(a.model.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = S * (P + N) + 64
cp.n_batch = max(512, S * P)
cp.n_ubatch = 512
cp.n_seq_max = S
cp.n_threads = cp.n_threads_batch = a.threads
cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[a.fa]
ctx = L.llama_init_from_model(model, cp)
V = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
b = L.llama_batch_init(max(S * P, S), 0, 1)


def put(i, tok, pos, seq, logits):
    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
    b.seq_id[i][0] = seq


n = 0
for s in range(S):  # the same token ids as bench_cpu_decode
    for i in range(P):
        put(n, (s * 7919 + i * 104729) % V, i, s, i == P - 1)
        n += 1
b.n_tokens = n
assert L.llama_decode(ctx, b) == 0
t0, c0 = time.perf_counter(), time.process_time()
for step in range(N):
    for s in range(S):
        put(s, (s + step * 31) % V, P + step, s, True)
    b.n_tokens = S
    assert L.llama_decode(ctx, b) == 0
    L.llama_get_logits(ctx)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(f"llama.cpp seqs {S}, threads {a.threads}, fa {a.fa}, prompt {P}, {N} steps: "
      f"{S * N / wall:.1f} tok/s aggregate, {wall / N * 1e3:.2f} ms/step (cpu {cpu / N * 1e3:.2f} ms/step)")
