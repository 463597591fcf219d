#!/usr/bin/env python3
"""The real Gemma 3 270M (models/gemma-3-270m-q4_k_m.gguf: Q4_K_M, 18
layers, sliding window 512) through the real server in --matmul-mode quant,
against llama.cpp's own answers on the same file
(tests/data/gemma3_llamacpp_golden.json, from llama-cpp-python 0.3.36 by
tests/data/gen_gemma3_golden.py; tests/data/README.md).

1. Tokenizer: /tokenize (add_special_tokens false: no BOS; special-token
   text is always parsed there) gives llama.cpp's ids (add_bos false,
   parse_special true) for all 42 strings: Latin with accents, Cyrillic,
   CJK, Korean, Arabic, Devanagari, Hebrew, Greek, emoji (ZWJ, skin tone,
   flag), code, whitespace runs, digits, Gemma's chat-template text. Where
   parse_special false gives other ids (special-token text), the C
   tokenizer is held to them by build/tests/test_tokenizer
   (test_gguf_gemma3_matches_llama_cpp).
2. Greedy: /v1/completions with the golden prompt ids (BOS included, as
   llama.cpp adds it for this file), max_tokens 20, temperature 0, for 20
   prompts (facts, code, lists, Russian, Japanese, a chat-formatted prompt
   and a 711-token prompt past the 512-token window). llama.cpp's token ids
   are turned into the server's token strings by asking the server for the
   prompt_logprobs of prompt + llama.cpp's continuation (its
   "decoded_token" for each of llama.cpp's ids), so the comparison is with
   the server's own formatting; the same request gives, per position,
   paged's top-1 id after llama.cpp's prefix, which is printed.

   paged's quant CPU numerics (--matmul-mode quant; the default differs
   only for K-quants, whose Q8_K kernels are not the default's)
   quantize activations as llama.cpp does: Q5_0/Q8_0 to Q8_0 blocks, and
   (issue 34) this file's Q4_K/Q6_K products to Q8_K with ggml's
   dot-product arithmetic (Q4_K in the summation order
   of llama.cpp's repacked q4_K_8x8 kernels; docs/cpu_kernels.md). Before
   the Q8_K path (exact f32 for K-quants) the figures were prefixes
   [15, 20, 8, 14, 3, 3, 20, 20, 12, 20, 20, 3, 20, 20, 10, 4, 15, 0, 20, 20],
   9 whole, top-1 385 of 400; Q4_K in vec_dot_q4_K_q8_K's order instead of
   the repacked one gave 11 whole, 387. Then (issue 34, branch gelu) the
   Gemma ops in ggml's arithmetic: the GELU from ggml's fp16 table, Q4_K
   activation rows in groups of 4 in the repack gemm's order, Gemma's
   attention in llama.cpp's NEOX dimension order with q scaled before its
   fp16 rounding, and a lone decode query summed as ggml_vec_dot_f16
   (docs/gemma3.md). Before that: prefixes
   [20, 20, 20, 20, 0, 9, 20, 20, 20, 20, 20, 3, 20, 20, 10, 20, 20, 20, 20, 19],
   15 whole, top-1 393.

   Observed (this machine, llama.cpp built for AVX2): the tokens equal
   llama.cpp's for matching prefixes of
   [20, 20, 20, 14, 20, 20, 20, 20, 20, 20, 20, 3, 20, 20, 20, 20, 20, 20, 20, 19]
   tokens (17 of 20 prompts equal throughout); with llama.cpp's own prefix
   fed back, paged's top-1 is llama.cpp's token at 390 of 400 positions
   (that comparison is one prefill over prompt + continuation, whose
   summation orders are llama.cpp's batched ones, while llama.cpp's tokens
   came from one-token decode steps; so it moves less than the greedy
   figure). The issue's target (every prompt >= 8 tokens, >= 17 of 20
   whole) was NOT met: prompt 11 (the shopping list) parted at its 4th
   token, because llama.cpp runs Q6_K (ffn_down here) and non-repacked
   K-quant products with 8 or more activation rows through its "tiled"
   kernels (ggml-cpu/tiled), whose order paged did not reproduce.
   With that order (issue 34, branch tiled: kernels/cpu/kquant_dot.c,
   PG_KDOT_TILED): all 20 prompts equal throughout (prefixes all 20), top-1
   after llama.cpp's prefix 389 of 400 (the one-prefill comparison now
   takes the tiled order at every continuation position, where llama.cpp's
   one-token decode steps took vec_dot's).
   Asserted, as regression floors just under the figures above: the
   tokenizer exactly, the issue's target (every prompt >= 8 tokens), >= 19
   of 20 whole continuations and top-1 agreement >= 388 of 400.

Skipped (exit 77) without the model file or the built server.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

ROOT = su.ROOT
GOLDEN = os.path.join(ROOT, "tests", "data", "gemma3_llamacpp_golden.json")
# The target (asserted since branch tiled: see above).
TARGET_PREFIX, TARGET_FULL = 8, 17
# Asserted floors, just under what is measured (20 whole, 389 of 400).
MIN_FULL, MIN_TOP1 = 19, 388

GGUF = su.require_gemma3_270m()
if not os.path.exists(su.binary()):
    su.skip(f"{su.binary()} is not built")


def post(port, path, body):
    return su.post_ok(port, path, body, timeout=600)


def main():
    t0 = time.time()
    with open(GOLDEN, encoding="utf-8") as f:
        gold = json.load(f)
    failed = []
    with su.Server("--model", GGUF, "--max-model-len", "2048", "--matmul-mode", "quant", default_args=False) as srv:
        # 1. Tokenizer.
        rows = [r for r in gold["tokenize"] if r["parse_special"]]
        plain = {r["text"]: r["ids"] for r in gold["tokenize"] if not r["parse_special"]}
        n_eq = 0
        for r in rows:
            got = post(srv.port, "/tokenize", {"prompt": r["text"], "add_special_tokens": False})["tokens"]
            if got == r["ids"]:
                n_eq += 1
            else:
                failed.append(("tokens", r["text"], got, r["ids"]))
                print(f"tokenize {r['text']!r}:\n  paged     {got}\n  llama.cpp {r['ids']}")
        n_special = sum(1 for r in rows if plain[r["text"]] != r["ids"])
        print(f"tokenizer: {n_eq} of {len(rows)} strings give llama.cpp's ids ({n_special} of them hold "
              "special-token text, whose parse_special=false ids test_tokenizer checks)")

        # 2. Greedy continuations.
        prefixes, full, top1_agree, top1_total = [], 0, 0, 0
        for k, g in enumerate(gold["greedy"]):
            pids, want = g["prompt_ids"], g["ids"]
            r = post(srv.port, "/v1/completions", {"prompt": pids, "max_tokens": 20, "temperature": 0,
                                                   "logprobs": 0})
            ch = r["choices"][0]
            got = ch["logprobs"]["tokens"]
            # llama.cpp's ids as the server writes them, and paged's top-1 id
            # after llama.cpp's prefix at each position.
            pl = post(srv.port, "/v1/completions", {"prompt": pids + want, "max_tokens": 1, "temperature": 0,
                                                    "prompt_logprobs": 1})["choices"][0]["prompt_logprobs"]
            want_str, top1 = [], []
            for i, t in enumerate(want):
                e = pl[len(pids) + i]
                want_str.append(e[str(t)]["decoded_token"])
                top1.append(next(int(x) for x, v in e.items() if v["rank"] == 1))
            n = 0
            while n < min(len(got), len(want_str)) and got[n] == want_str[n]:
                n += 1
            whole = n == len(want_str) and len(got) == len(want_str)
            full += whole
            prefixes.append(n)
            forced = sum(1 for a, b in zip(top1, want) if a == b)
            print(f"greedy {k:2d} ({len(pids):3d} ids) {g['prompt'][:36]!r:40} {n:2d}/{len(want)} tokens equal, "
                  f"top-1 after llama.cpp's prefix {forced}/{len(want)}, finish {ch['finish_reason']}"
                  + ("" if whole else f"\n    paged     {''.join(got)!r}\n    llama.cpp {g['text']!r}"))
            top1_agree += forced
            top1_total += len(want)
        print(f"greedy: {full} of {len(prefixes)} prompts give all of llama.cpp's tokens; matching prefixes "
              f"{prefixes}")
        short = sum(1 for n, g in zip(prefixes, gold["greedy"]) if n < min(TARGET_PREFIX, len(g["ids"])))
        print(f"top-1 after llama.cpp's prefix: {top1_agree} of {top1_total} positions; the issue's target "
              f"(all >= {TARGET_PREFIX} tokens, >= {TARGET_FULL} whole): {'met' if full >= TARGET_FULL and not short else 'NOT met'} "
              f"({short} prompts under {TARGET_PREFIX}, {full} whole)")
        if short:
            failed.append(("prompts under the target prefix", short))
        if full < MIN_FULL:
            failed.append(("greedy whole", full))
        if top1_agree < MIN_TOP1:
            failed.append(("top-1 agreement", top1_agree))
    print(f"took {time.time() - t0:.1f}s")
    return su.verdict(failed, "ok: gemma-3-270m Q4_K_M: llama.cpp's token ids and greedy tokens")


if __name__ == "__main__":
    sys.exit(main())
