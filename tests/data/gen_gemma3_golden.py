#!/usr/bin/env python3
"""llama.cpp's token ids and greedy continuations for the real Gemma 3 270M.

On models/gemma-3-270m-q4_k_m.gguf (Q4_K_M, 18 layers, sliding window 512),
llama.cpp (the llama-cpp-python 0.3.36 sdist, its vendored llama.cpp built
as a CPU shared library) computes:

  "tokenize": for every string of STRINGS, with parse_special false and
      true: Llama(vocab_only=True).tokenize(text, add_bos=False, special=...)
  "greedy":   for every prompt of PROMPTS: the prompt ids (add_bos true, as
      llama.cpp does for this file, special text parsed) and up to
      N_NEW greedy tokens (argmax of the logits, the first index on a tie):
      the prompt in one llama_decode per n_batch (512) tokens, then one token
      per llama_decode, the way llama.cpp generates. A generation stops
      early, that token included, at an end-of-generation token
      (llama_vocab_is_eog: <eos>, <end_of_turn>), as llama.cpp does.
      Settings: n_ctx 1024, f16 KV cache, flash attention off, 2 threads.

Writes tests/data/gemma3_llamacpp_golden.json (ids and text only, no
logits). Deterministic: no sampling, the long prompt is a fixed paragraph
repeated; a rerun writes the same file. Usage (tests/data/README.md):

  PYTHONPATH=/work/ref/llama_cpp_python-0.3.36:/work/ref/pydeps \\
  LLAMA_CPP_LIB_PATH=/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \\
      .venv/bin/python tests/data/gen_gemma3_golden.py [models/gemma-3-270m-q4_k_m.gguf]
"""
import ctypes
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "gemma3_llamacpp_golden.json")
N_NEW = 20

STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "   leading spaces",
    "trailing spaces   ",
    "two  spaces,\tthree   spaces\tand\t\ttabs",
    "line one\nline two\n\nline four\r\nwindows",
    "\n\n\n",
    "Größe, café, naïve, façade, Æsir, ß",
    "Привет, как дела? Это тест токенизатора.",
    "日本語のテキストです。東京は大きい都市。",
    "中文分词测试：我们今天去公园散步。",
    "한국어 문장도 시험합니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "שלום עולם, מה שלומך?",
    "Ελληνικά: γεια σου κόσμε",
    "emoji 🎉🚀 here 👍🏽 and 👨‍👩‍👧‍👦 family 🇫🇷",
    "def f(x):\n    return x ** 2  # square",
    "for (int i = 0; i < n; i++) { sum += a[i]; }",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "1234567890 3.14159 -42 1e-10 0x1F 1,000,000",
    "2024-12-05T06:42:47Z",
    "99999999999999999999999999",
    "I'm you're they've we'll it's don't",
    "https://example.com/path?query=1&b=two#frag",
    "user@example.org",
    "ALL CAPS TEXT AND MiXeD cAsE",
    "a\u00a0b\u3000c\u2003d",
    "tab\tseparated\tvalues\t1\t2",
    "∑ ∫ √ ∞ ≤ ≥ ≠ → ← ∀ ∃",
    "«quotes» “curly” ‘single’ — dash … ellipsis",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos>",
    "<start_of_turn>",
    "not special: <start_of_turn > < end_of_turn>",
    "<unk><pad><mask>",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    "a" * 100,
    "x = [1, 2, 3]\ny = {\"k\": \"v\"}\nprint(x, y)",
]

PARAGRAPH = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
             "combined movable metal type, oil-based ink and a wooden screw press into a system that could "
             "produce books far faster than any scribe. Within fifty years printers worked in more than two "
             "hundred European cities, and the price of books fell sharply. ")

PROMPTS = [
    "The capital of France is",
    "The largest planet in the solar system is",
    "Water boils at a temperature of",
    "The theory of relativity was developed by",
    "The chemical symbol for gold is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "import numpy as np\n\ndef mean(xs):\n    return",
    "#include <stdio.h>\n\nint main(void) {\n    ",
    "SELECT name, COUNT(*) FROM orders",
    "Three primary colors:\n1. Red\n2.",
    "Shopping list:\n- eggs\n- milk\n-",
    "The days of the week are Monday, Tuesday,",
    "Translate to French: Good morning, my friend. ->",
    "Москва является столицей",
    "日本の首都は",
    "Q: What is 12 + 30?\nA:",
    "The recipe for pancakes: first, mix",
    PARAGRAPH * 11 + "To summarize, the printing press",
    "<start_of_turn>user\nWrite a short poem about the ocean.<end_of_turn>\n<start_of_turn>model\n",
]


def greedy(llm, lib, ids):
    """llama.cpp's greedy decoding: prompt batches, then one token per decode."""
    n_vocab = llm.n_vocab()
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(N_NEW):
        p = lib.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
        tok = int(np.argmax(logits))
        out.append(tok)
        if lib.llama_vocab_is_eog(llm._model.vocab, tok):
            break
        llm.eval([tok])
    return out


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
    import llama_cpp
    lib = llama_cpp.llama_cpp

    voc = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    toks = []
    for text in STRINGS:
        for special in (False, True):
            ids = voc.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            toks.append({"text": text, "parse_special": special, "ids": [int(i) for i in ids]})
    print(f"tokenized {len(STRINGS)} strings x 2")
    del voc

    llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=512, n_threads=2, n_threads_batch=2, seed=0,
                          flash_attn=False, verbose=False)
    assert llm.metadata.get("tokenizer.ggml.add_bos_token") == "true"
    gen = []
    for prompt in PROMPTS:
        ids = [int(i) for i in llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)]
        out = greedy(llm, lib, ids)
        text = llm.detokenize(out).decode("utf-8", errors="replace")
        print(f"{len(ids):4d} ids {prompt[:40]!r:44} -> {text!r}")
        gen.append({"prompt": prompt, "prompt_ids": ids, "ids": out, "text": text})

    doc = {
        "model": "gemma-3-270m-q4_k_m.gguf",
        "llama_cpp_python": llama_cpp.__version__,
        "settings": {"n_ctx": 1024, "n_batch": 512, "type_k": "f16", "type_v": "f16", "flash_attn": False,
                     "n_threads": 2, "max_new_tokens": N_NEW, "stop_at_eog": True},
        "tokenize": toks,
        "greedy": gen,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(toks)} tokenizations, {len(gen)} continuations")


if __name__ == "__main__":
    main()
