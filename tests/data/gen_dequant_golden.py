#!/usr/bin/env python3
"""Writes tests/data/dequant_golden.bin: random blocks of every weight type
kernels/dtype.c dequantizes, with the floats llama.cpp's own gguf-py package
(gguf/quants.py) dequantizes them to. tests/unit/test_dtype.c checks that
pg_dequantize_row reproduces them.

Usage: python3 tests/data/gen_dequant_golden.py [--gguf-py DIR] [--out FILE]

File format (all little-endian):
    char  magic[4] = "PGDQ"
    u32   version = 1
    u32   n_sections
    n_sections x {
        u32 ggml_type        (GGML type number = pg_dtype value)
        u32 n_elems          (a multiple of the type's block size)
        u32 n_bytes          (raw encoded bytes)
        u8  raw[n_bytes]
        f32 expected[n_elems]
    }

The blocks are random bytes (seeded, so the file is reproducible) with the
fp16 scale fields replaced by random finite fp16 values (some subnormal,
some zero, some negative) so no NaN hides a wrong result; plain f16/bf16/f32
sections are fully random bit patterns and include NaN, Inf and subnormals.
For q4_0/q4_1/q5_0/q5_1/q8_0 one extra section holds blocks produced by gguf-py's
quantizer from random floats, i.e. realistic data.
"""
import argparse
import os
import struct
import sys

import numpy as np

DEFAULT_GGUF_PY = "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py"
SEED = 20240607

# name -> (ggml type, block elems, block bytes, offsets of fp16 scale fields)
TYPES = {
    "F32": (0, 1, 4, []),
    "F16": (1, 1, 2, []),
    "Q4_0": (2, 32, 18, [0]),
    "Q4_1": (3, 32, 20, [0, 2]),
    "Q8_0": (8, 32, 34, [0]),
    "Q4_K": (12, 256, 144, [0, 2]),
    "Q5_K": (13, 256, 176, [0, 2]),
    "Q6_K": (14, 256, 210, [208]),
    "BF16": (30, 1, 2, []),
    # Last, so that adding them left the sections above byte-identical (one
    # random stream feeds every section in this order).
    "Q5_0": (6, 32, 22, [0]),
    "Q5_1": (7, 32, 24, [0, 2]),
}


def random_scale(rng):
    """A finite fp16 value as two bytes: mostly normal, sometimes subnormal or 0."""
    r = rng.random()
    if r < 0.05:
        bits = 0
    elif r < 0.15:
        bits = int(rng.integers(1, 0x400))  # subnormal
    else:
        bits = int(rng.integers(0x0400, 0x7c00))  # normal, any exponent
        # keep most scales small like real weights so products stay in range
        if rng.random() < 0.8:
            bits = int(rng.integers(0x1000, 0x3c00))
    if rng.random() < 0.5:
        bits |= 0x8000
    return struct.pack("<H", bits)


def random_blocks(rng, block_bytes, n_blocks, scale_offs):
    raw = bytearray(rng.integers(0, 256, size=block_bytes * n_blocks, dtype=np.uint8).tobytes())
    for b in range(n_blocks):
        for off in scale_offs:
            raw[b * block_bytes + off: b * block_bytes + off + 2] = random_scale(rng)
    return bytes(raw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", default=os.environ.get("GGUF_PY", DEFAULT_GGUF_PY))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "dequant_golden.bin"))
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    from gguf import GGMLQuantizationType as QT  # noqa: E402
    from gguf import quants  # noqa: E402

    rng = np.random.default_rng(SEED)
    sections = []
    for name, (gtype, be, bb, scale_offs) in TYPES.items():
        qt = QT[name]
        assert int(qt) == gtype, name
        n_elems = 512 if be == 1 else (16 * 32 if be == 32 else 4 * 256)
        n_blocks = n_elems // be
        raw = random_blocks(rng, bb, n_blocks, scale_offs)
        sections.append((gtype, n_elems, raw, quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qt)))
        if name in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"):
            x = (rng.standard_normal(n_elems) * 0.05).astype(np.float32)
            raw = quants.quantize(x, qt).tobytes()
            sections.append((gtype, n_elems, raw, quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qt)))

    out = bytearray(b"PGDQ")
    out += struct.pack("<II", 1, len(sections))
    for gtype, n_elems, raw, expected in sections:
        expected = np.asarray(expected, dtype=np.float32).reshape(-1)
        assert expected.size == n_elems, (gtype, expected.size, n_elems)
        out += struct.pack("<III", gtype, n_elems, len(raw))
        out += raw
        out += expected.astype("<f4").tobytes()
    with open(args.out, "wb") as fp:
        fp.write(out)
    print(f"wrote {args.out}: {len(sections)} sections, {len(out)} bytes")


if __name__ == "__main__":
    main()
