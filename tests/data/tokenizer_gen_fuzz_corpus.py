#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/fuzz_tokenizer.c to tests/fuzz/corpus/tokenizer/.

Each seed is one selector byte followed by the payload (see the target's
header comment): texts from tokenizer_strings.py and raw byte strings
(invalid UTF-8, NULs, the built-in tokenizers' special text) under several
flag combinations; tokenizer.json texts (selector 0x20) and GGUF images
(0x40) from tests/data for the loader modes. Deterministic.

Usage (repository root): python3 tests/data/tokenizer_gen_fuzz_corpus.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tokenizer_strings as ts  # noqa: E402

OUT = os.path.join(HERE, "..", "fuzz", "corpus", "tokenizer")


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    seeds = []
    pick = (ts.ASCII[:6] + ts.WHITESPACE[:12] + ts.DIGITS[:8] + ts.CODE[:4] + ts.CJK[:3] + ts.EMOJI[:6] +
            ts.ACCENTS[:4] + ts.RTL[:3] + ts.INVALID_LOOKING[:6] + ts.SPECIAL_TEXT[:6])
    for i, t in enumerate(pick):
        seeds.append(bytes([i % 32]) + t.encode())
    raw = [b"a\x80b\xc3(\xe2\x82 \xed\xa0\x80 \xf0\x9f\x98", b"\x00\x00abc\x00", b"<|s|>x<|s|><u>the  in",
           b"\xff\xfe\xfd", b"12345 the world hello", b"\xe2\x96\x81the", b"\xc0\xaf\xe0\x80\x80",
           b"    \n\n\t 'sabc"]
    for r in raw:
        for sel in (0, 1, 2, 3, 6, 16, 19):
            seeds.append(bytes([sel]) + r)
    small_json = (b'{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, '
                  b'"added_tokens": [{"id": 3, "content": "<s>", "special": true}], '
                  b'"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}}')
    seeds.append(b"\x20" + small_json)
    seeds.append(b"\x22" + small_json)
    for name in ("tokenizer_spm_tiny.json", "tokenizer_gpt2.json"):
        with open(os.path.join(HERE, name), "rb") as f:
            seeds.append(b"\x20" + f.read())
    for name in ("tokenizer_spm_tiny.gguf", "tokenizer_llama3.gguf"):
        with open(os.path.join(HERE, name), "rb") as f:
            seeds.append(b"\x40" + f.read())
    for k, s in enumerate(seeds):
        with open(os.path.join(OUT, f"seed{k:03d}"), "wb") as f:
            f.write(s)
    print(f"wrote {len(seeds)} seeds to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
