#!/usr/bin/env python3
"""Writes pretokenizer_reference.json: Hugging Face tokenizers' Split (behavior "isolated") of hard
strings under the split regexes of GPT-2, GPT-4 (cl100k; Llama 3, GLM), o200k and Qwen2.

pretokenizer_test.cc checks that SplitRegex (PCRE2) gives the same pieces. Run from the repository
root: python3 trainer/data/testdata/make_pretokenizer_reference.py (needs `pip install
tokenizers`; the C++ test only reads the output).
"""
import json
import os

import tokenizers
from tokenizers import Regex, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
PATTERNS = {
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "gpt4": CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "o200k": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
             + CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
             r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + CONTRACTIONS + r"?|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
TEXTS = [
    "Hello  world\n\n",
    "WE'LL x'Sy",
    "12345 abc",
    " \t\n x",
    "!?\n\nok",
    "It's, they'll, I'M, we'VE, O'Neil's",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D don't DON'T we'Re x'ſ",
    "1234567 + 89 = 1234656; pi is 3.14159 and 12345678901234567890",
    "Café crème brûlée à la carte — naïve façade",
    "你好，世界。我们的模型正在学习。日本語のテキストとカタカナ、ひらがな 한국어 텍스트",
    "مرحبا بالعالم ١٢٣٤٥ نصٌّ عَرَبِيّ",
    "Hindi हिन्दी with marks, Thai ภาษาไทย",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🏳️‍🌈 ❤️ keycap 1️⃣",
    "combining e\u0301 n\u0303 a\u0308\u0304 Z\u0351\u0362 \u0301lone",
    "superscript x² fraction ½ roman Ⅻ digits ٣ ४ ๕",
    "tabs\tand\nnewlines\n\n\nmany\r\nCRLF \n \n",
    "a  \t\t  b    \n\n   c \u00a0\u3000 d \u2003\u2028\u0085e  ",
    "line1\r\nline2\n\n\nline3\r\r\n  \n",
    "mongolian a\u180eb c \u180e d\u180e",
    "HTTPRequest's JSONParser'LL XMLHttpRequest iPhone McDonald's",
    "path/to/file.txt http://x.y/z?q=1&r=2 a//b",
    "\\boxed{\\frac{1}{2}} and $x^2$ {{- '<|im_start|>' }}",
    "def add(a, b):\n    return a + b\n",
    "   ",
    "a",
    "",
]


def main():
    reference = {"tokenizers_version": tokenizers.__version__, "patterns": PATTERNS, "cases": []}
    for text in TEXTS:
        case = {"text": text}
        for name, pattern in PATTERNS.items():
            split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
            case[name] = [piece for piece, _ in split.pre_tokenize_str(text)]
        reference["cases"].append(case)
    # One line per pattern and per case, so that a change shows as the cases it touches.
    dump = lambda v: json.dumps(v, ensure_ascii=False)
    with open(os.path.join(HERE, "pretokenizer_reference.json"), "w", encoding="utf-8") as f:
        f.write('{"tokenizers_version": %s,\n "patterns": {\n' % dump(tokenizers.__version__))
        f.write(",\n".join("  %s: %s" % (dump(k), dump(v)) for k, v in PATTERNS.items()))
        f.write('},\n "cases": [\n')
        f.write(",\n".join("  " + dump(c) for c in reference["cases"]))
        f.write("]}\n")


if __name__ == "__main__":
    main()
