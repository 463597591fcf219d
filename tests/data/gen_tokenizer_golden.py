#!/usr/bin/env python3
"""Writes the tokenizer golden files from two independent implementations.

  tests/data/tokenizer_golden_smollm2.jsonl     llama.cpp (llama-cpp-python,
      vocab_only) on models/SmolLM2-135M-Instruct.Q4_1.gguf
  tests/data/tokenizer_golden_smollm2_hf.jsonl  Hugging Face `tokenizers` on a
      tokenizer.json built from the same GGUF vocabulary and merges
  tests/data/tokenizer_smollm2.json             that tokenizer.json (written by
      tokenizers' own Tokenizer.save, so it is the real HF format)
  tests/data/tokenizer_smollm2_config.json      a tokenizer_config.json for it
  tests/data/tokenizer_spm_tiny.gguf            a small SentencePiece BPE vocabulary
      (byte fallback, trained here with the sentencepiece package on the test
      strings) written with gguf-py as a Llama-2-style GGUF
  tests/data/tokenizer_golden_spm_tiny.jsonl    llama.cpp on that GGUF
  tests/data/tokenizer_spm_tiny.json            the same SPM vocabulary as a Llama-2-style
      tokenizer.json (BPE + byte_fallback, merges derived from the scores the way
      transformers' LlamaConverter does, Prepend/Replace normalizer)
  tests/data/tokenizer_golden_spm_tiny_hf.jsonl HF tokenizers on that tokenizer.json
  tests/data/tokenizer_<fam>.json / .gguf       for fam in gpt2, llama3, qwen2: a small
      byte-level BPE trained here with HF tokenizers' BpeTrainer using that
      family's pre-tokenizer (as in the family's tokenizer.json), saved by
      tokenizers, and the same vocabulary/merges written as a GGUF with gguf-py
      (tokenizer.ggml.pre = gpt2 / llama-bpe / qwen2)
  tests/data/tokenizer_golden_<fam>.jsonl       "ids": HF tokenizers on the .json;
      "ids_llama_cpp" (only where it differs): llama.cpp on the .gguf

Each golden line: {"text": str, "parse_special": bool, "ids": [int]} with
add_bos false. The strings come from tests/data/tokenizer_strings.py.

Usage (from the repository root):
  PYTHONPATH=<llama-cpp-python sdist> LLAMA_CPP_LIB_PATH=<dir of libllama.so> \
      python3 tests/data/gen_tokenizer_golden.py [--model PATH] [--gguf-py DIR]
Needs: pip install tokenizers (0.23.x used), llama-cpp-python's Python
sources with a built libllama.so, and gguf-py (llama.cpp/gguf-py, or pip gguf).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tokenizer_strings  # noqa: E402


def read_gguf_vocab(path):
    from gguf import GGUFReader
    r = GGUFReader(path)

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in arr("tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.merges")]

    def scalar(key):
        f = r.fields.get(key)
        return None if f is None else f.parts[f.data[0]][0]

    meta = {k: scalar("tokenizer.ggml." + k) for k in
            ["bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"]}
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[r.fields["tokenizer.ggml.pre"].data[0]]).decode()
    return tokens, types, merges, meta, pre


def build_hf(tokens, types, merges, pre):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    assert pre == "smollm", pre
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for m in merges:
        sp = m.index(" ", 1)
        pairs.append((m[:sp], m[sp + 1:]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    # SmolLM2's own tokenizer.json: Digits(individual) then ByteLevel, no normalizer.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def golden_llama(model, cases):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    out = []
    for text, special in cases:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        out.append({"text": text, "parse_special": special, "ids": list(ids)})
    return out


def golden_hf(tok, cases):
    out = []
    for text, special in cases:
        # parse_special false: special tokens are encoded as plain text.
        tok.encode_special_tokens = not special
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append({"text": text, "parse_special": special, "ids": list(ids)})
    tok.encode_special_tokens = False
    return out


SPM_CORPUS_EXTRA = [
    "the cat sat on the mat", "hello world, hello there", "a tokenizer splits text into tokens",
    "Llama and Mistral use SentencePiece with byte fallback", "def main(): return 0",
    "numbers 0 1 2 3 4 5 6 7 8 9", "café naïve résumé", "I'm you're they've we'll",
]


def build_spm(path, cases):
    """Trains a tiny SentencePiece BPE model and writes it as a GGUF vocabulary."""
    import io

    import sentencepiece as spm
    from gguf import GGUFWriter
    corpus = [t for t, _ in cases if t.strip()] * 3 + SPM_CORPUS_EXTRA * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, model_type="bpe", vocab_size=1000,
        byte_fallback=True, character_coverage=0.98, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, user_defined_symbols=["<|user|>", "<tool>"],
        max_sentence_length=1 << 16, num_threads=1, minloglevel=2, seed_sentencepiece_size=100000)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 4 if tokens[-1] in ("<|user|>", "<tool>") else 1)
    w = GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path}: {len(tokens)} tokens")
    return sp


FAMILIES = {
    # name: (GGUF pre name, Split regex or None for ByteLevel's own, ignore_merges)
    "gpt2": ("gpt-2", None, False),
    "llama3": ("llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?"
               "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", True),
    "qwen2": ("qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
              "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", False),
}
UNREACHABLE = ["zzqxv", "\u0120zzqxv", "\u0120\u0120\u0120\u0120\u0120\u0120\u0120\u0120\u0120"]
FAMILY_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]


def build_family(name, out_dir, cases):
    """Trains a small byte-level BPE with a family's pre-tokenizer; writes .json and .gguf."""
    from gguf import GGUFWriter
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    pre_name, regex, ignore_merges = FAMILIES[name]
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=FAMILY_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [t for t, _ in cases] * 2 + SPM_CORPUS_EXTRA * 10
    tok.train_from_iterator(corpus, trainer)
    json_path = os.path.join(out_dir, f"tokenizer_{name}.json")
    tok.save(json_path, pretty=False)
    # The GGUF: the same vocabulary and merges, read back from the saved file.
    with open(json_path, encoding="utf-8") as f:
        j = json.load(f)
    # Whole-word tokens that no merge leads to: only ignore_merges (llama3)
    # emits them, so the golden ids show whether it is honoured.
    top = max(list(j["model"]["vocab"].values()) + [a["id"] for a in j["added_tokens"]]) + 1
    for wtok in UNREACHABLE:
        if wtok not in j["model"]["vocab"]:
            j["model"]["vocab"][wtok] = top
            top += 1
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    tok = Tokenizer.from_file(json_path)
    vocab = j["model"]["vocab"]
    specials = {a["content"]: a["id"] for a in j["added_tokens"]}
    tokens = [None] * (max(list(vocab.values()) + list(specials.values())) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    for t, i in specials.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    w = GGUFWriter(os.path.join(out_dir, f"tokenizer_{name}.gguf"), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_name)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["<|begin_of_text|>"])
    w.add_eos_token_id(specials["<|end_of_text|>"])
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tok


def build_spm_json(sp, path):
    """A Llama-2-style tokenizer.json for a SentencePiece BPE model."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    score = {sp.id_to_piece(i): sp.get_score(i) for i in range(n)}
    merges = []
    for m, mid in vocab.items():
        if not (sp.is_unknown(mid) or sp.is_control(mid) or sp.is_byte(mid) or sp.is_unused(mid)):
            for k in range(1, len(m)):
                a, b = m[:k], m[k:]
                if a in vocab and b in vocab:
                    merges.append((score[m], vocab[a], vocab[b], a, b))
    merges.sort(key=lambda x: (-x[0], x[1], x[2]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True, normalized=False)
                            for i in range(n) if sp.is_control(i) or sp.is_unknown(i)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<|user|>", "<tool>")])
    tok.save(path, pretty=False)
    return tok


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(rows)} entries")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--gguf-py", default=os.environ.get(
        "GGUF_PY", "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py"))
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    if os.path.isdir(args.gguf_py):
        sys.path.insert(0, args.gguf_py)

    cases = tokenizer_strings.cases()
    tokens, types, merges, meta, pre = read_gguf_vocab(args.model)

    hf = build_hf(tokens, types, merges, pre)
    hf.save(os.path.join(args.out, "tokenizer_smollm2.json"), pretty=False)
    with open(os.path.join(args.out, "tokenizer_smollm2_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "bos_token": tokens[meta["bos_token_id"]],
                   "eos_token": tokens[meta["eos_token_id"]], "pad_token": tokens[meta["padding_token_id"]],
                   "unk_token": tokens[meta["unknown_token_id"]]}, f, indent=1)
        f.write("\n")

    g_hf = golden_hf(hf, cases)
    g_ll = golden_llama(args.model, cases)
    write_jsonl(os.path.join(args.out, "tokenizer_golden_smollm2.jsonl"), g_ll)
    write_jsonl(os.path.join(args.out, "tokenizer_golden_smollm2_hf.jsonl"), g_hf)
    spm_path = os.path.join(args.out, "tokenizer_spm_tiny.gguf")
    sp = build_spm(spm_path, cases)
    spm_cases = cases + [(t, True) for t in ["<|user|>hi<tool>", "<s>x</s>", " <unk> "]]
    g_spm = golden_llama(spm_path, spm_cases)
    write_jsonl(os.path.join(args.out, "tokenizer_golden_spm_tiny.jsonl"), g_spm)
    # The sentencepiece library itself, where it is comparable: no special-token
    # text, and add_dummy_prefix (llama.cpp's add_space_prefix) on the whole text.
    same = comparable = 0
    for row in g_spm:
        t = row["text"]
        if row["parse_special"] or any(x in t for x in ("<|user|>", "<tool>")) or t == "":
            continue
        comparable += 1
        same += sp.encode(t) == row["ids"]
    print(f"spm: sentencepiece agrees with llama.cpp on {same} of {comparable} comparable strings")
    spm_tok = build_spm_json(sp, os.path.join(args.out, "tokenizer_spm_tiny.json"))
    g_spm_hf = golden_hf(spm_tok, spm_cases)
    write_jsonl(os.path.join(args.out, "tokenizer_golden_spm_tiny_hf.jsonl"), g_spm_hf)
    d = [(a["text"], a["ids"], b["ids"]) for a, b in zip(g_spm, g_spm_hf) if a["ids"] != b["ids"]]
    print(f"spm: HF (tokenizer.json) and llama.cpp (GGUF) differ on {len(d)} of {len(spm_cases)}")
    for t, a, b in d[:10]:
        print(f"  {t!r}\n    llama.cpp {a}\n    hf        {b}")

    fam_cases = cases + [(t, p) for t in ["<|begin_of_text|>Hi<|end_of_text|>", "x<|im_end|>\n"]
                         for p in (False, True)]
    fam_cases += [(t, False) for t in ["zzqxv", " zzqxv", "azzqxv zzqxv", "a          b", "zzqxv!"]]
    for fam in FAMILIES:
        tok = build_family(fam, args.out, cases)
        g_hf_f = golden_hf(tok, fam_cases)
        g_ll_f = golden_llama(os.path.join(args.out, f"tokenizer_{fam}.gguf"), fam_cases)
        n_diff = 0
        for a, b in zip(g_hf_f, g_ll_f):
            if a["ids"] != b["ids"]:
                a["ids_llama_cpp"] = b["ids"]
                n_diff += 1
                print(f"  {fam}: llama.cpp and HF differ on {a['text']!r} special={a['parse_special']}")
        write_jsonl(os.path.join(args.out, f"tokenizer_golden_{fam}.jsonl"), g_hf_f)
        print(f"{fam}: {len(fam_cases)} cases, llama.cpp and HF differ on {n_diff}")

    diff = [(a["text"], a["parse_special"], a["ids"], b["ids"])
            for a, b in zip(g_ll, g_hf) if a["ids"] != b["ids"]]
    print(f"{len(cases)} cases, llama.cpp and HF differ on {len(diff)}")
    for text, special, a, b in diff:
        print(f"  {text!r} special={special}\n    llama.cpp {a}\n    hf        {b}")


if __name__ == "__main__":
    main()
