#!/usr/bin/env python3
"""Writes the seed corpora for the fuzz targets:

    tests/fuzz/corpus/gguf/*.gguf                 (fuzz_gguf)
    tests/fuzz/corpus/safetensors/*.safetensors   (fuzz_safetensors)

Small valid files (a few KB each) that reach every branch of the readers on
the happy path; the fuzzers mutate them. GGUF seeds are written by
llama.cpp's own gguf-py writer (an independent implementation of the
format), safetensors seeds by hand following the Hugging Face spec.
Deterministic: rerunning produces identical bytes.

Usage: python3 tests/fuzz/gen_corpus.py [--gguf-py DIR]
"""
import argparse
import json
import os
import struct
import sys
import tempfile

import numpy as np

DEFAULT_GGUF_PY = "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py"
HERE = os.path.dirname(os.path.abspath(__file__))


def write_gguf(gguf, path, build, alignment=None, version=None):
    """Runs build(writer) and writes the file; optionally rewrites the
    version field (v2 and v3 share the little-endian layout)."""
    with tempfile.TemporaryDirectory() as td:
        tmp = os.path.join(td, "x.gguf")
        w = gguf.GGUFWriter(tmp, "llama")
        if alignment is not None:
            w.add_custom_alignment(alignment)
        build(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        data = bytearray(open(tmp, "rb").read())
    if version is not None:
        data[4:8] = struct.pack("<I", version)
    with open(path, "wb") as fp:
        fp.write(data)
    return len(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", default=os.environ.get("GGUF_PY", DEFAULT_GGUF_PY))
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402
    from gguf import GGMLQuantizationType as QT  # noqa: E402
    from gguf import GGUFValueType as VT  # noqa: E402

    rng = np.random.default_rng(7)
    gdir = os.path.join(HERE, "corpus", "gguf")
    sdir = os.path.join(HERE, "corpus", "safetensors")
    os.makedirs(gdir, exist_ok=True)
    os.makedirs(sdir, exist_ok=True)
    sizes = {}

    def all_metadata(w):
        w.add_key_value("t.u8", 200, VT.UINT8)
        w.add_key_value("t.i8", -5, VT.INT8)
        w.add_key_value("t.u16", 60000, VT.UINT16)
        w.add_key_value("t.i16", -30000, VT.INT16)
        w.add_key_value("t.u32", 4000000000, VT.UINT32)
        w.add_key_value("t.i32", -7, VT.INT32)
        w.add_key_value("t.u64", 2**63 + 5, VT.UINT64)
        w.add_key_value("t.i64", -(2**62), VT.INT64)
        w.add_key_value("t.f32", 0.25, VT.FLOAT32)
        w.add_key_value("t.f64", 1e-300, VT.FLOAT64)
        w.add_key_value("t.bool", True, VT.BOOL)
        w.add_key_value("t.str", "h\u00e9llo", VT.STRING)
        w.add_key_value("t.arr_i32", [1, -2, 3], VT.ARRAY, sub_type=VT.INT32)
        w.add_key_value("t.arr_f32", [0.5, 1.5], VT.ARRAY, sub_type=VT.FLOAT32)
        w.add_key_value("t.arr_bool", [True, False], VT.ARRAY, sub_type=VT.BOOL)
        w.add_key_value("t.arr_str", ["a", "", "\u2581b"], VT.ARRAY, sub_type=VT.STRING)
        w.add_key_value("t.nested", [[1, 2], [3]], VT.ARRAY, sub_type=VT.ARRAY)

    def tokenizer(w):
        toks = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(29)]
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(32)
        w.add_tokenizer_model("gpt2")
        w.add_token_list(toks)
        w.add_token_types([3, 3, 3] + [1] * 29)
        w.add_token_merges(["t o", "to k"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)

    def f32(shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    def plain_tensors(w):
        w.add_tensor("f32.weight", f32((2, 8)))
        w.add_tensor("f16.weight", f32((3, 4)).astype(np.float16))
        bf = gguf.quants.quantize(f32((2, 4)), QT.BF16)
        w.add_tensor("bf16.weight", bf, raw_dtype=QT.BF16)
        w.add_tensor("norm", f32((32,)))

    def quant_tensors(w):
        for qt in (QT.Q4_0, QT.Q4_1, QT.Q8_0):
            q = gguf.quants.quantize(f32((2, 64)), qt)
            w.add_tensor(f"{qt.name.lower()}.weight", q, raw_dtype=qt)
        # No quantizer in gguf-py for the K-quants: random blocks with sane
        # fp16 scales (the reader does not look at the values).
        for qt, nb in ((QT.Q4_K, 144), (QT.Q5_K, 176), (QT.Q6_K, 210)):
            raw = rng.integers(0, 256, size=(1, nb), dtype=np.uint8)
            w.add_tensor(f"{qt.name.lower()}.weight", raw, raw_dtype=qt)
        # Added later, from a random stream of their own, so that the
        # shared stream (and every other seed file) stays as it was.
        r5 = np.random.default_rng(5)
        for qt in (QT.Q5_0, QT.Q5_1):
            q = gguf.quants.quantize((r5.standard_normal((2, 64)) * 0.1).astype(np.float32), qt)
            w.add_tensor(f"{qt.name.lower()}.weight", q, raw_dtype=qt)

    sizes["metadata_all_types.gguf"] = write_gguf(gguf, os.path.join(gdir, "metadata_all_types.gguf"), all_metadata)
    sizes["tokenizer.gguf"] = write_gguf(gguf, os.path.join(gdir, "tokenizer.gguf"), tokenizer)
    sizes["plain_tensors.gguf"] = write_gguf(gguf, os.path.join(gdir, "plain_tensors.gguf"), plain_tensors)
    sizes["quant_tensors.gguf"] = write_gguf(gguf, os.path.join(gdir, "quant_tensors.gguf"), quant_tensors)
    sizes["align64_v2.gguf"] = write_gguf(
        gguf, os.path.join(gdir, "align64_v2.gguf"), lambda w: (tokenizer(w), plain_tensors(w)), alignment=64,
        version=2)
    sizes["align8.gguf"] = write_gguf(gguf, os.path.join(gdir, "align8.gguf"),
                                      lambda w: (all_metadata(w), quant_tensors(w)), alignment=8)

    def st(name, tensors, metadata=None, pad_to=8, extra_pad=0):
        """tensors: list of (name, dtype, shape, raw bytes)."""
        header, data = {}, bytearray()
        if metadata is not None:
            header["__metadata__"] = metadata
        for tname, dtype, shape, raw in tensors:
            header[tname] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * ((-len(h)) % pad_to + extra_pad)
        out = struct.pack("<Q", len(h)) + h + bytes(data)
        with open(os.path.join(sdir, name), "wb") as fp:
            fp.write(out)
        sizes[name] = len(out)

    def bf16(a):
        return gguf.quants.quantize(a.astype(np.float32), QT.BF16).tobytes()

    st("small.safetensors", [
        ("model.embed_tokens.weight", "F32", (4, 8), f32((4, 8)).tobytes()),
        ("model.norm.weight", "F16", (8,), f32((8,)).astype(np.float16).tobytes()),
        ("lm_head.weight", "BF16", (4, 8), bf16(f32((4, 8)))),
    ], metadata={"format": "pt"})
    st("ranks.safetensors", [
        ("scalar", "F32", (), f32(()).tobytes()),
        ("empty", "F16", (0, 3), b""),
        ("r4", "BF16", (1, 2, 3, 2), bf16(f32((1, 2, 3, 2)))),
        ("r8", "F32", (1, 1, 1, 1, 1, 1, 2, 1), f32((2,)).tobytes()),
    ])
    st("padded.safetensors", [
        ("a", "F16", (3,), f32((3,)).astype(np.float16).tobytes()),
    ], metadata={}, pad_to=1, extra_pad=13)
    st("unsupported_dtype.safetensors", [
        ("ids", "I64", (2,), struct.pack("<qq", 1, 2)),
    ])

    for name, n in sorted(sizes.items()):
        print(f"{name}: {n} bytes")


if __name__ == "__main__":
    main()
