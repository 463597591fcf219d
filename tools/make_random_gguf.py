#!/usr/bin/env python3
"""tools/make_random_gguf.py - a llama-architecture GGUF (v3) with random bf16
weights, from a Hugging Face config.json, that both paged and llama.cpp load.

    tools/make_random_gguf.py tests/gpu/llama3-8b-shape.json /tmp/llama3-8b-shape.gguf
    tools/make_random_gguf.py CONFIG OUT.gguf --seed 0 --device auto|cuda|cpu --threads 16
        [--hf-dir DIR]   also write the same weights as a Hugging Face directory
                         (config.json + model.safetensors, Q/K rows in HF order)

Weights: matrices bf16 (GGUF type 30), a seeded N(0, 0.02^2) (--std), norms
1.0 in f32 (as llama.cpp's converter stores them); Llama-3 rope scaling
(rope_scaling.rope_type "llama3") becomes rope_freqs.weight, as
convert_hf_to_gguf.py writes it. Random values come from torch on the GPU
when it is there (--device auto; fast: 16 GB in well under a minute, mostly
the write), else from numpy (one seeded generator per chunk, chunks on
--threads threads). The two sources give different values for one seed;
each is deterministic.

Tokenizer: SentencePiece ("llama") with vocab_size pieces: <unk>, <s>, </s>,
the 256 byte pieces <0x00>..<0xFF>, "\u2581" and the printable ASCII
characters, then filler pieces "\u2581t<i>" (scores falling with i), so
text still tokenizes (byte fallback) and every filler id detokenizes to
" t<i>". Special ids 0-2 and the byte pieces sit below id 400: benchmark
prompts of random ids should stay above (bench_serve.py draws from
[1000, vocab - 1000]).

Needs numpy; torch only for --device cuda. No gguf package.
"""
import argparse
import json
import math
import os
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32
# value types
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
# tensor types
GGML_F32, GGML_BF16 = 0, 30
# token types (llama.cpp's llama_token_type)
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_BYTE = 1, 2, 3, 6

CHUNK = 1 << 24  # elements per generated chunk (64 MiB of f32)


def s_bytes(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_bytes(key, vtype, value):
    out = s_bytes(key) + struct.pack("<I", vtype)
    if vtype == T_ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == T_STR:
            out += b"".join(s_bytes(x) for x in items)
        elif etype == T_F32:
            out += np.asarray(items, dtype="<f4").tobytes()
        elif etype == T_I32:
            out += np.asarray(items, dtype="<i4").tobytes()
        else:
            raise ValueError(etype)
        return out
    if vtype == T_STR:
        return out + s_bytes(value)
    fmt = {T_U32: "<I", T_I32: "<i", T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q"}[vtype]
    return out + struct.pack(fmt, value)


def read_config(path):
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    c = json.load(open(path))
    hidden = c["hidden_size"]
    heads = c["num_attention_heads"]
    cfg = {
        "hidden": hidden,
        "layers": c["num_hidden_layers"],
        "heads": heads,
        "kv_heads": c.get("num_key_value_heads", heads),
        "head_dim": c.get("head_dim") or hidden // heads,
        "ffn": c["intermediate_size"],
        "vocab": c["vocab_size"],
        "ctx": c.get("max_position_embeddings", 4096),
        "theta": float(c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        "eps": float(c.get("rms_norm_eps", 1e-5)),
        "tie": bool(c.get("tie_word_embeddings", False)),
        "rope_scaling": c.get("rope_scaling") or c.get("rope_parameters"),
        "raw": c,
    }
    if cfg["head_dim"] * heads != hidden:
        # llama.cpp's llama graph takes n_embd_head = n_embd / n_head unless key_length says so;
        # we write key_length/value_length, which both engines read.
        pass
    return cfg


def llama3_rope_factors(cfg):
    rs = cfg["rope_scaling"]
    if not rs or str(rs.get("rope_type", rs.get("type", ""))).lower() != "llama3":
        return None
    dim = cfg["head_dim"]
    base = float(rs.get("rope_theta", cfg["theta"]))
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rs.get("factor", 8.0)
    lo, hi = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def vocab(n):
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    types = [TOK_UNKNOWN, TOK_CONTROL, TOK_CONTROL] + [TOK_BYTE] * 256
    singles = ["\u2581"] + [chr(c) for c in range(33, 127)]
    toks += singles
    types += [TOK_NORMAL] * len(singles)
    if n < len(toks):
        raise SystemExit(f"vocab_size {n} is below the {len(toks)} fixed pieces")
    base = len(toks)
    toks += ["\u2581t%d" % i for i in range(base, n)]
    types += [TOK_NORMAL] * (n - base)
    scores = np.zeros(n, dtype=np.float32)
    scores[base:] = -np.arange(n - base, dtype=np.float32) / 1000.0 - 1.0
    scores[259:base] = -0.5  # single characters
    return toks, scores, types


def tensor_list(cfg):
    """[(name, (rows, cols) or (n,), kind)] in file order; kind: rand | ones | rope."""
    h, hd, ffn, v = cfg["hidden"], cfg["head_dim"], cfg["ffn"], cfg["vocab"]
    q, kv = cfg["heads"] * hd, cfg["kv_heads"] * hd
    t = [("token_embd.weight", (v, h), "rand")]
    rf = llama3_rope_factors(cfg)
    if rf is not None:
        t.append(("rope_freqs.weight", (len(rf),), "rope"))
    for l in range(cfg["layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (h,), "ones"),
              (p + "attn_q.weight", (q, h), "rand"),
              (p + "attn_k.weight", (kv, h), "rand"),
              (p + "attn_v.weight", (kv, h), "rand"),
              (p + "attn_output.weight", (h, q), "rand"),
              (p + "ffn_norm.weight", (h,), "ones"),
              (p + "ffn_gate.weight", (ffn, h), "rand"),
              (p + "ffn_up.weight", (ffn, h), "rand"),
              (p + "ffn_down.weight", (h, ffn), "rand")]
    t.append(("output_norm.weight", (h,), "ones"))
    if not cfg["tie"]:
        t.append(("output.weight", (v, h), "rand"))
    return t, rf


def f32_to_bf16_bits(a):
    """f32 array -> uint16 bf16 bits, round to nearest even (finite inputs)."""
    u = a.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


class NumpySource:
    def __init__(self, seed, std, threads):
        self.seed, self.std = seed, std
        self.pool = ThreadPoolExecutor(max_workers=threads)

    def _chunk(self, ti, ci, n):
        g = np.random.default_rng([self.seed, ti, ci])
        a = g.standard_normal(n, dtype=np.float32)
        a *= np.float32(self.std)
        return f32_to_bf16_bits(a)

    def blobs(self, ti, n):
        """Yields bf16 byte blocks of one tensor in order."""
        chunks = [(ci, min(CHUNK, n - off)) for ci, off in enumerate(range(0, n, CHUNK))]
        futs = [self.pool.submit(self._chunk, ti, ci, m) for ci, m in chunks]
        for f in futs:
            yield f.result()


class TorchSource:
    def __init__(self, seed, std, device="cuda"):
        import torch
        self.torch, self.seed, self.std, self.device = torch, seed, std, device
        self.gen = torch.Generator(device=device)

    def blobs(self, ti, n):
        torch = self.torch
        self.gen.manual_seed(self.seed * 1000003 + ti)
        step = 1 << 28  # 512 MiB of bf16 per copy
        for off in range(0, n, step):
            m = min(step, n - off)
            a = torch.empty(m, device=self.device, dtype=torch.bfloat16).normal_(0.0, self.std, generator=self.gen)
            yield a.view(torch.int16).cpu().numpy()


def permute_hf(w, n_head):
    """GGUF (llama.cpp interleaved) Q/K rows -> Hugging Face rotate-half order."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="Hugging Face config.json (or its directory)")
    ap.add_argument("out", help="GGUF file to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu", "torch-cpu"], default="auto",
                    help="auto: torch on the GPU when there is one, else numpy (cpu); torch-cpu: a test of the "
                         "torch path without a GPU")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--name", default=None, help="general.name (default: the config file's stem)")
    ap.add_argument("--hf-dir", default=None, help="also write config.json + model.safetensors here")
    args = ap.parse_args()

    t0 = time.time()
    cfg = read_config(args.config)
    src = TorchSource(args.seed, args.std, "cpu") if args.device == "torch-cpu" else None
    if args.device in ("auto", "cuda"):
        try:
            import torch
            if torch.cuda.is_available():
                src = TorchSource(args.seed, args.std)
            elif args.device == "cuda":
                raise SystemExit("--device cuda: torch sees no GPU")
        except ImportError:
            if args.device == "cuda":
                raise SystemExit("--device cuda: no torch")
    if src is None:
        src = NumpySource(args.seed, args.std, args.threads)
    tensors, rope = tensor_list(cfg)
    toks, scores, types = vocab(cfg["vocab"])
    name = args.name or os.path.splitext(os.path.basename(os.path.normpath(args.config)))[0]
    if name == "config":
        name = os.path.basename(os.path.dirname(os.path.abspath(args.config)))

    A = "llama."
    kvs = [
        ("general.architecture", T_STR, "llama"),
        ("general.name", T_STR, name),
        ("general.alignment", T_U32, ALIGN),
        ("general.file_type", T_U32, 32),  # LLAMA_FTYPE_MOSTLY_BF16
        (A + "vocab_size", T_U32, cfg["vocab"]),
        (A + "context_length", T_U32, cfg["ctx"]),
        (A + "embedding_length", T_U32, cfg["hidden"]),
        (A + "block_count", T_U32, cfg["layers"]),
        (A + "feed_forward_length", T_U32, cfg["ffn"]),
        (A + "attention.head_count", T_U32, cfg["heads"]),
        (A + "attention.head_count_kv", T_U32, cfg["kv_heads"]),
        (A + "attention.key_length", T_U32, cfg["head_dim"]),
        (A + "attention.value_length", T_U32, cfg["head_dim"]),
        (A + "rope.dimension_count", T_U32, cfg["head_dim"]),
        (A + "rope.freq_base", T_F32, cfg["theta"]),
        (A + "attention.layer_norm_rms_epsilon", T_F32, cfg["eps"]),
        ("tokenizer.ggml.model", T_STR, "llama"),
        ("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
        ("tokenizer.ggml.scores", T_ARR, (T_F32, scores)),
        ("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
        ("tokenizer.ggml.bos_token_id", T_U32, 1),
        ("tokenizer.ggml.eos_token_id", T_U32, 2),
        ("tokenizer.ggml.unknown_token_id", T_U32, 0),
        ("tokenizer.ggml.add_bos_token", T_BOOL, True),
        ("tokenizer.ggml.add_eos_token", T_BOOL, False),
    ]
    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kvs)))
    for k, t, v in kvs:
        header += kv_bytes(k, t, v)
    offset, layout = 0, []
    for tname, shape, kind in tensors:
        ttype = GGML_BF16 if kind == "rand" else GGML_F32
        n = int(np.prod(shape))
        nbytes = n * (2 if ttype == GGML_BF16 else 4)
        header += s_bytes(tname) + struct.pack("<I", len(shape))
        header += b"".join(struct.pack("<Q", d) for d in reversed(shape))  # ggml: innermost first
        header += struct.pack("<IQ", ttype, offset)
        layout.append((tname, shape, kind, n, nbytes, offset))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    header += b"\0" * (-len(header) % ALIGN)
    total = len(header) + offset

    hf = [] if args.hf_dir else None
    written = 0
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        for ti, (tname, shape, kind, n, nbytes, off) in enumerate(layout):
            assert f.tell() == len(header) + off
            if kind == "ones":
                b = np.ones(n, dtype="<f4")
                f.write(b.tobytes())
                if hf is not None:
                    hf.append((tname, np.ones(shape, dtype=np.uint16) * np.uint16(0x3F80)))
            elif kind == "rope":
                f.write(rope.astype("<f4").tobytes())
            else:
                parts = []
                for blk in src.blobs(ti, n):
                    f.write(memoryview(np.ascontiguousarray(blk)).cast("B"))
                    if hf is not None:
                        parts.append(np.asarray(blk).view(np.uint16))
                if hf is not None:
                    hf.append((tname, np.concatenate(parts).reshape(shape)))
            f.write(b"\0" * (-nbytes % ALIGN))
            written += nbytes
            if sys.stderr.isatty() or ti % 50 == 0 or ti == len(layout) - 1:
                print(f"\r  {written / 1e9:6.2f} / {offset / 1e9:.2f} GB  {time.time() - t0:5.1f} s",
                      end="" if sys.stderr.isatty() else "\n", file=sys.stderr, flush=True)
    os.replace(tmp, args.out)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"make_random_gguf: {args.out}: {total / 1e9:.2f} GB, {len(tensors)} tensors, "
          f"{cfg['layers']} layers, hidden {cfg['hidden']}, vocab {cfg['vocab']}, "
          f"source {'torch-' + src.device if isinstance(src, TorchSource) else 'numpy'}, seed {args.seed}, "
          f"{time.time() - t0:.1f} s", flush=True)
    if hf is not None:
        write_hf(args, cfg, hf)


def write_hf(args, cfg, tensors):
    """The same weights as a Hugging Face llama directory (bf16 safetensors)."""
    os.makedirs(args.hf_dir, exist_ok=True)
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}
    header, blobs, off = {}, [], 0
    for tname, a in tensors:
        if tname.startswith("blk."):
            _, l, part, _ = tname.split(".")
            if part == "attn_q":
                a = permute_hf(a, cfg["heads"])
            elif part == "attn_k":
                a = permute_hf(a, cfg["kv_heads"])
            hname = f"model.layers.{l}.{per[part]}.weight"
        else:
            hname = names[tname]
        a = np.ascontiguousarray(a)
        header[hname] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a)
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(args.hf_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in blobs:
            f.write(memoryview(a).cast("B"))
    c = dict(cfg["raw"])
    c["torch_dtype"] = "bfloat16"
    c["bos_token_id"], c["eos_token_id"] = 1, 2
    json.dump(c, open(os.path.join(args.hf_dir, "config.json"), "w"), indent=1)
    print(f"make_random_gguf: {args.hf_dir}: model.safetensors ({off / 1e9:.2f} GB) + config.json", flush=True)


if __name__ == "__main__":
    main()
