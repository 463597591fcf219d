"""The test strings of the tokenizer golden files (tests/data/gen_tokenizer_golden.py).

cases() returns a list of (text, parse_special). Deterministic: the random
mixes use a fixed seed, so regenerating the golden files gives the same set.
"""
import random

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>",
            "<jupyter_code>", "<empty_output>"]

ASCII = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "hello", "HELLO", "Hello", "hELLO wORLD", "a", "I", "A.", "?!", "...", "!!!???",
    "I'm here", "you're right", "they've gone", "we'll see", "she'd know", "it's", "DON'T STOP",
    "He'S", "'s", "'t", "'re'", "rock'n'roll", "O'Neil's", "quote \"this\" please",
    "semi;colon:colon", "e-mail me at someone@example.com", "https://example.com/a/b?c=d&e=f#g",
    "C:\\Windows\\System32", "snake_case_name", "camelCaseName", "PascalCaseName",
    "UPPER_CASE_CONSTANT", "kebab-case-name", "dots.and.more.dots", "a/b/c",
    "(parenthesised) [bracketed] {braced} <angled>", "~`!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/",
]

WHITESPACE = [
    "", " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r", " \n ",
    "a b", "a  b", "a   b", "a    b", "a\tb", "a \tb", "a\t b", "a \t b", "  leading", "trailing  ",
    "  both  ", "a\n\n\nb", "line1\nline2\r\nline3", "x \n\n y", "end with newline\n",
    "\n\nstart with newlines", "tab\tseparated\tvalues", "\t\tindented", "  \n  \n",
    "a \u00a0b", "\u00a0", "a\u00a0b", "\u3000", "\u3000text\u3000", "a\u2003b", "a\u2009b\u200ac",
    "a\u200bb", "\u180e", "a\u180eb", "\x0b\x0c", "a\x0bb\x0cc", "\x1c\x1d\x1e\x1f",
    "a\x85b", "a \u180e b", "!!\u180e!!", "\u180e\u180e x", "x\u180e ", "\u180e\n", "a\u2028b\u2029c", "a\u202fb\u205fc", "\u1680x", " " * 16, " " * 100 + "x",
    "\n" * 20, "\t" * 10 + "x", " \t \t \n", "word" + " " * 7 + "word",
]

DIGITS = [
    "0", "7", "42", "123", "1234", "12345", "12345678901234567890", "3.14159", "1,000,000",
    "-5", "+1e10", "0x1F", "0b1010", "v1.2.3", "2024-01-15", "12:30:45", "a1b2c3", " 123",
    "123 456", "１２３", "٣٤٥", "۱۲۳", "Ⅻ", "½", "x²+y³", "①②③", "99 bottles", "$19.99",
    "100%", "1st 2nd 3rd 4th", "007", "1e-9", "π≈3.14", "9" * 1000, "0.000001", "٠١٢٣٤٥٦٧٨٩",
    "१२३", "十二", "1 000 000", "+49 (0)30 1234567",
]

CODE = [
    "def foo(x):\n    return x * 2\n",
    "import numpy as np\nprint(np.arange(10))",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "static inline int add(int a, int b) { return a + b; }",
    "const x = () => { console.log(`value: ${x}`); };",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done",
    "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
    "--- a/file.c\n+++ b/file.c\n@@ -1,3 +1,4 @@\n-old\n+new",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }",
    "main :: IO ()\nmain = putStrLn \"hello\"",
    "# Title\n\n- item 1\n- item 2\n\n```python\nx = 1\n```",
    "x+=1;y-=2;z*=3;w/=4;", "if(a&&b||!c){d>>=1;e<<=2;}", "a->b.c[0]++;",
    "    def method(self):\n        pass", "\t\treturn nil, err", "}}}}))))]]]]",
    "print('hello')  # comment", "// TODO: fix this\n/* block */",
    "<?php echo $var; ?>", "lambda x: x**2", "std::vector<std::string> v{\"a\", \"b\"};",
    "git commit -m \"fix: don't crash\"", "SELECT * FROM t;--",
]

CJK = [
    "你好世界", "我爱自然语言处理。", "今天天气很好，我们去公园吧！", "こんにちは世界",
    "日本語のテキストです。", "カタカナとひらがな", "안녕하세요 세계", "한국어 텍스트입니다.",
    "中文English混合text", "「引用」と『二重引用』", "漢字、かな、カナ。", "ＡＢＣ１２３",
    "𠀀𠀁𠀂", "ᄀᄁᄂ", "中 文 空 格", "東京都渋谷区", "北京市", "서울특별시", "一二三四五六七八九十",
    "ﾊﾝｶｸｶﾀｶﾅ", "中" * 300,
]

EMOJI = [
    "😀", "😀😃😄😁", "👍", "👍🏽", "👍🏿👍🏻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "❤️", "✌🏿",
    "🧑🏻‍💻", "1️⃣", "#️⃣", "I love 🍕 and 🍔!", "🔥🔥🔥", "emoji:😀:end", " 😀 ", "😀" * 200,
    "👩‍❤️‍💋‍👨", "🫠🫡🫢", "⭐️✨🌟", "☺", "☺️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "a😀b😃c",
]

ACCENTS = [
    "café", "cafe\u0301", "naïve", "Zürich", "Ångström", "ñ", "e\u0301\u0302\u0303", "Crème brûlée",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "Tiếng Việt có dấu", "Zażółć gęślą jaźń", "Ελληνικά κείμενα",
    "Привет, мир!", "İstanbul ılık", "Straße", "ﬁnance ﬂow", "Ǆ ǅ ǆ", "àáâãäå", "\u0301", "a\u0308\u0304",
    "Ωmega Ω", "ÀÉÎÕÜ", "résumé", "Ĳsselmeer", "ǰ", "ﬀ", "Þorn",
]

RTL = [
    "שלום עולם", "مرحبا بالعالم", "Hello שלום world", "abc \u200fמימין\u200f def", "\u200eLTR\u200e",
    "سلام دنیا", "یہ اردو ہے", "مُحَمَّد", "עִבְרִית", "العربية 123 English", "\u202eRLO text\u202c",
]

INVALID_LOOKING = [
    "\\ud800", "\\udfff", "\\uD83D\\uDE00", "\ufffd", "\ufffd\ufffd\ufffd", "Ã©", "Ã¼ber",
    "\\x80\\xff", "\\xC0\\xAF", "\x7f", "\x01\x02\x03", "\x1b[31mred\x1b[0m", "\ufeff", "\ufeffBOM",
    "\ue000", "\U000f0000", "\uffff", "\ufffe", "\ufdd0", "&amp; &#x1F600; &lt;", "%E2%82%AC",
    "\\u00e9", "\u0378", "a\u0378b", "\U0001fbff", "\u2060", "x\u034fy", "\u00ad", "soft\u00adhyphen",
]

SPECIAL_TEXT = [
    "<|im_start|>user\nHello<|im_end|>", "<|endoftext|>", "<|im_start|><|im_end|>", "<|im_start",
    "<|im_start|", "<|IM_START|>", "< |im_start| >", "<<|im_end|>>", "<|im_start|>assistant\n",
    "<repo_name>foo<file_sep>bar.py", "<jupyter_code>print(1)", "text<|endoftext|>text",
    "<|endoftext|><|endoftext|>", "<empty_output>", " <|im_end|> ", "<|im_start|>system\nYou are "
    "a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<s>", "</s>", "<unk>", "[INST] hi [/INST]", "<|im_end|>\n", "\n<|im_start|>", "<|<|im_end|>|>",
    "<|im_end|><|im_end|><|im_end|>", "x<|im_start|>y<|im_end|>z",
]

LONG = [
    "a" * 1000, "ab" * 500, "supercalifragilisticexpialidocious",
    "https://example.com/" + "path/" * 50 + "?q=" + "x" * 100,
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=" * 20, "deadbeef" * 60, "-" * 300, "=" * 80, "." * 100,
    "The " * 200, "Pneumonoultramicroscopicsilicovolcanoconiosis",
]


def random_mixes(n, seed=1234):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", "  \t\n\r", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "éèêëàâäôöûüçñßøåæœ", "你好世界中文日本語한국어", "😀👍🏽❤️🔥🍕🇺🇸", "שלוםمرحبا",
        "\u0301\u0308\u200d\ufe0f", "'s 't 're 've 'm 'll 'd",
    ]
    out = []
    for _ in range(n):
        k = rng.randint(1, 60)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(k))
        out.append(s)
    return out


def random_words(n, seed=99):
    rng = random.Random(seed)
    words = ["the", "of", "tokenizer", "server", "GPU", "paged", "attention", "KV", "cache",
             "don't", "can't", "1024", "3.5", "naïve", "日本", "😀", "\n", "\t", "  ", "x", "(", ")",
             "->", "::", "==", "!=", "foo_bar", "Ω", "ß"]
    out = []
    for _ in range(n):
        k = rng.randint(2, 30)
        sep = rng.choice([" ", "", "  ", "\n", " "])
        out.append(sep.join(rng.choice(words) for _ in range(k)))
    return out


def cases():
    texts = (ASCII + WHITESPACE + DIGITS + CODE + CJK + EMOJI + ACCENTS + RTL + INVALID_LOOKING +
             SPECIAL_TEXT + LONG + random_mixes(60) + random_words(40))
    out = [(t, False) for t in texts]
    # Special-token text is checked both ways; a few plain strings too (no change expected).
    out += [(t, True) for t in SPECIAL_TEXT + ASCII[:5] + CODE[:3] + EMOJI[:3]]
    seen = set()
    uniq = []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq
