"""Writes safetensors files from numpy arrays (numpy only, so the GPU machine
can use it too). Shared by tools/gguf_to_hf.py and tests/gpu/make_random_model.py."""
import json
import struct

import numpy as np


def to_bytes(a, dtype):
    """f32 array -> (bytes, safetensors dtype) for dtype f32, f16 or bf16."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "f32":
        return a.tobytes(), "F32"
    if dtype == "f16":
        return a.astype(np.float16).tobytes(), "F16"
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    return u.tobytes(), "BF16"


def write_safetensors(path, tensors, dtype):
    """tensors: [(name, array)] written in order, the header padded to 8 bytes."""
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        b, st = to_bytes(a, dtype)
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
