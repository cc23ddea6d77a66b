#!/usr/bin/env python3
"""Builds the tiny byte-level BPE tokenizers in this folder and their reference encodings.

Produces (run from the repository root: python3 trainer/data/testdata/make_tokenizer_testdata.py):
  tiny_gpt4.json   Split pre-tokenizer with the GPT-4/Llama-3/GLM-4 regex (\\p{N}{1,3}),
                   merges as [a, b] pairs, ignore_merges = true, NFC normalizer.
  tiny_qwen2.json  Split pre-tokenizer with the Qwen2 regex (\\p{N}), merges as "a b" strings.
  tiny_gpt2.json   ByteLevel pre-tokenizer with its own (GPT-2) regex, merges as "a b" strings.
  qwen_dir/        a checkpoint-style directory for LoadTokenizer: tiny_qwen2.json as
                   tokenizer.json, a tokenizer_config.json (eos <|im_end|>, pad <|endoftext|>,
                   a ChatML chat template) and a generation_config.json (two eos ids).
  tokenizer_reference.json  for each file and each test string: the ids of
                   tokenizers' encode(text, add_special_tokens=False), the pre-tokenizer's split
                   and decode(ids) with and without skip_special_tokens.
Needs `pip install tokenizers` (tested with 0.23.3); the C++ tests only read the outputs.
"""
import json
import os
import shutil

import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import AddedToken, Regex

HERE = os.path.dirname(os.path.abspath(__file__))

GPT4_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs!",
    "def add(a, b):\n    return a + b\n\nprint(add(12, 345))\n",
    "It's the user's turn; they'll say what they've got and I'm done.",
    "Solve 12345 + 678 = 13023. The answer is \\boxed{13023}.",
    "Café crème brûlée à la carte, naïve façade.",
    "你好，世界。我们的模型正在学习。",
    "Hello hello HELLO there there there.",
] * 20

SPECIALS = [
    AddedToken("<|endoftext|>", special=True, normalized=False),
    AddedToken("<|im_start|>", special=True, normalized=False),
    AddedToken("<|im_end|>", special=True, normalized=False),
    AddedToken("<think>", special=False, normalized=False),
]

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\nmany\r\nCRLF \n \n",
    "It's, they'll, I'M, we'VE, O'Neil's",
    "1234567 + 89 = 1234656; pi is 3.14159",
    "punctuation!!! ??? ... --- ((a)) {b} [c] \"q\" `code`",
    "Café crème brûlée à la carte — naïve façade",
    "你好，世界。我们的模型正在学习。",
    "日本語のテキストとカタカナ、ひらがな",
    "emoji 😀👍🏽 and family 👨‍👩‍👧 flags 🇫🇷",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|endoftext|><|endoftext|>",
    "<think>reasoning</think> answer",
    "non\u00a0breaking\u3000ideographic\u2003em space",
    "Hindi हिन्दी with marks, Arabic العربية ١٢٣ digits",
    "superscript x² and fraction ½ and roman Ⅻ",
    "   ",
    "",
    "a",
    "def add(a, b):\n    return a + b\n",
    "\\boxed{\\frac{1}{2}} and $x^2$",
]


def build(path, pre_tokenizer, merges_as_strings, ignore_merges):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + 60, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_special_tokens([t for t in SPECIALS if t.special])
    tok.add_tokens([t for t in SPECIALS if not t.special])
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = ignore_merges
    if merges_as_strings:
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                   for m in data["model"]["merges"]]
    text = json.dumps(data, ensure_ascii=False, indent=1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return Tokenizer.from_str(text)


QWEN_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content"
    " + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is"
    " false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")


def write_qwen_dir():
    d = os.path.join(HERE, "qwen_dir")
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(os.path.join(HERE, "tiny_qwen2.json"), os.path.join(d, "tokenizer.json"))
    config = {"add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "chat_template": QWEN_TEMPLATE,
              "tokenizer_class": "Qwen2Tokenizer"}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [318, 316], "pad_token_id": 316}, f, indent=1)


def main():
    variants = {
        "tiny_gpt4.json": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(GPT4_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), False, True),
        "tiny_qwen2.json": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True, False),
        "tiny_gpt2.json": (pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                           True, False),
    }
    reference = {"tokenizers_version": tokenizers.__version__, "files": {}}
    for name, (pre, as_strings, ignore_merges) in variants.items():
        tok = build(os.path.join(HERE, name), pre, as_strings, ignore_merges)
        cases = []
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
            cases.append({
                "text": text,
                "ids": ids,
                "pre_tokens": words,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            })
        reference["files"][name] = cases
    with open(os.path.join(HERE, "tokenizer_reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
    write_qwen_dir()


if __name__ == "__main__":
    main()
