#!/usr/bin/env python3
"""llama.cpp's GGUF LoRA files (engine/model/lora_adapter.c, read_gguf) on the
default model (SmolLM2-135M, GGUF architecture "llama": 9 query and 3 KV
heads of 64).

A random rank-8 PEFT adapter on all seven projections of all 30 layers
(test_lora_server.py's write_adapter) is also written as llama.cpp's
convert_lora_to_gguf.py writes it: general.type "adapter", adapter.type
"lora", adapter.lora.alpha, tensors blk.L.<attn_q|attn_k|attn_v|attn_output|
ffn_gate|ffn_up|ffn_down>.weight.lora_a / lora_b, A as [r][in] and B as
[out][r] (GGUF dims reversed), f32, and the q and k lora_b rows permuted
head by head as its converter permutes a "llama" model's q/k rows.

1. `dump_logits --mode exact --lora FILE.gguf` gives the logits of
   `--lora DIR` bit for bit (same md5 over 11 tokens), and they differ from
   the base model's.
2. The same GGUF without the q/k permutation gives other logits (the
   reader's un-permutation is what makes 1 hold).
3. Through the server: `--lora-modules g=FILE.gguf` answers as the PEFT
   directory does.
2b. The A matrices stored as Q8_0 (convert_lora_to_gguf.py --outtype
   q8_0; B's rows of 8 stay f32) give the logits of the same file with
   gguf-py's dequantized values in f32, bit for bit.
4. Refused in one line naming the file: a GGUF file that is not an
   adapter (general.type "model"), a lora_a of another rank than its
   lora_b.
"""
import hashlib
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

try:
    import gguf
    import numpy as np
    import torch
    from safetensors.torch import load_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

import test_lora_server as tls  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMP = os.path.join(ROOT, "build/tests/tools/dump_logits")
GG = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
      "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
N_HEAD, N_KV = 9, 3
TOKENS = "1,17,5,230,99,42,7,310,8,1000,2000"


def permute(w, n_head):
    # llama.cpp's LlamaModel.permute: rows of each head reordered for its rope.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(src_dir, path, alpha=16, permute_qk=True, general_type="adapter", edit=None, q8=None):
    # q8 "quant": matrices whose rows are whole Q8_0 blocks stored as Q8_0 (what
    # convert_lora_to_gguf.py --outtype q8_0 does to the A matrices); "dequant":
    # the same values dequantized by gguf-py, stored as f32.
    t = load_file(os.path.join(src_dir, "adapter_model.safetensors"))
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_type(general_type)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for name, v in sorted(t.items()):
        parts = name.split(".")  # base_model.model.model.layers.L.parent.module.lora_X.weight
        layer, module, ab = int(parts[4]), parts[6], parts[7][-1].lower()
        a = v.float().numpy()
        if permute_qk and ab == "b" and module in ("q_proj", "k_proj"):
            a = permute(a, N_HEAD if module == "q_proj" else N_KV)
        gname = f"blk.{layer}.{GG[module]}.weight.lora_{ab}"
        if edit:
            gname, a = edit(gname, a)
        if a is not None and q8 and a.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
            if q8 == "quant":
                w.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                w.add_tensor(gname, np.ascontiguousarray(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)))
        elif a is not None:
            w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dump(*lora):
    # "1:" runs the prompt with the first --lora adapter.
    args = [DUMP, su.MODEL, "--mode", "exact"]
    for d in lora:
        args += ["--lora", d]
    args.append(("1:" if lora else "") + TOKENS)
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr.strip()


def main():
    su.require_model_and_binary()
    if not os.path.exists(DUMP):
        print(f"skipped: {DUMP} not built")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        peft_dir, gg, flat = os.path.join(tmp, "peft"), os.path.join(tmp, "a.gguf"), os.path.join(tmp, "flat.gguf")
        tls.write_adapter(peft_dir, 7)
        write_gguf(peft_dir, gg)
        write_gguf(peft_dir, flat, permute_qk=False)
        rc0, base, _ = dump()
        rc1, via_dir, e1 = dump(peft_dir)
        rc2, via_gguf, e2 = dump(gg)
        rc3, via_flat, e3 = dump(flat)
        assert rc0 == rc1 == rc2 == rc3 == 0, (rc0, rc1, e1, rc2, e2, rc3, e3)
        md5 = lambda s: hashlib.md5(s.encode()).hexdigest()[:12]
        print(f"logits md5: base {md5(base)}, PEFT dir {md5(via_dir)}, GGUF {md5(via_gguf)}, "
              f"GGUF without the q/k permutation {md5(via_flat)}")
        assert via_gguf == via_dir, "the GGUF adapter's logits differ from the PEFT directory's"
        assert via_dir != base and via_flat != via_dir
        print("1-2. GGUF LoRA = PEFT directory bit for bit; un-permuting q/k lora_b rows is what makes it so")
        q8, deq = os.path.join(tmp, "q8.gguf"), os.path.join(tmp, "deq.gguf")
        write_gguf(peft_dir, q8, q8="quant")
        write_gguf(peft_dir, deq, q8="dequant")
        rc4, via_q8, e4 = dump(q8)
        rc5, via_deq, e5 = dump(deq)
        assert rc4 == rc5 == 0, (e4, e5)
        print(f"Q8_0 A matrices: logits md5 {md5(via_q8)}, gguf-py's dequantized values as f32 {md5(via_deq)}")
        assert via_q8 == via_deq and via_q8 != base, "a Q8_0 adapter is not read as gguf-py dequantizes it"
        print("2b. a Q8_0 GGUF adapter (convert_lora_to_gguf.py --outtype q8_0) = its dequantized values bit for bit")

        with su.Server("--enable-lora", "--lora-modules", f"p={peft_dir}", f"g={gg}") as srv:
            texts = {}
            for m in ("p", "g"):
                st, r = su.post(srv.port, "/v1/completions",
                                {"model": m, "prompt": "The history of the printing press begins", "max_tokens": 16,
                                 "temperature": 0})
                assert st == 200, (st, r)
                texts[m] = r["choices"][0]["text"]
            assert texts["p"] == texts["g"], texts
            print(f"3. served as g=FILE.gguf: the PEFT directory's text {texts['g']!r}")

        bad = [
            ("a model file", dict(general_type="model"), "not a LoRA adapter"),
            ("a rank-4 lora_a beside rank-8 lora_b",
             dict(edit=lambda n, a: (n, a[:4] if n == "blk.0.attn_v.weight.lora_a" else a)), "expected"),
        ]
        for what, kw, reason in bad:
            path = os.path.join(tmp, "bad.gguf")
            write_gguf(peft_dir, path, **kw)
            rc, _, err = dump(path)
            lines = [l for l in err.splitlines() if l.strip()]
            print(f"4. {what}: exit {rc}: {lines[-1] if lines else ''}")
            assert rc != 0 and lines and path in lines[-1] and reason in lines[-1], (rc, err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
