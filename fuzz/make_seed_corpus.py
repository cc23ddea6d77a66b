#!/usr/bin/env python3
"""Writes the hand-made seeds of fuzz/corpus/<target>/ from the repository's fixtures.

Run from anywhere: python3 fuzz/make_seed_corpus.py. Seeds are named seed_*; beside them are the
inputs of fixed findings (descriptive names) and what `fuzz/run.sh --merge` kept (SHA-1 names),
which this script does not touch.
Each seed is a valid input taken from a fixture or one slightly broken copy of it, so that the
fuzzers start with every parser's accepting path covered and each refusal reached once.
"""
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    (directory / ("seed_" + name)).write_bytes(data)


def toml_seeds():
    for recipe in sorted((ROOT / "configs").glob("*.toml")):
        write("toml", recipe.name, recipe.read_text())
    default = (ROOT / "configs" / "default.toml").read_text()
    write("toml", "crlf.toml", default.replace("\n", "\r\n"))
    write("toml", "no_final_newline.toml", default.rstrip("\n"))
    broken = {
        "dotted_key.toml": "[run]\nrun.seed = 1\n",
        "inline_table.toml": "[run]\nseed = {a = 1}\n",
        "duplicate_key.toml": "[run]\nseed = 1\nseed = 2\n",
        "duplicate_section.toml": "[run]\n[model]\n[run]\n",
        "unterminated_string.toml": '[model]\ninit = "random\n',
        "bad_escape.toml": '[model]\ninit = "\\q"\n',
        "unicode_escape.toml": '[model]\ninit = "r\\u00e9\\u4e16\\u0041"\n',
        "short_unicode_escape.toml": '[model]\ninit = "\\u12"\n',
        "integer_overflow.toml": "[run]\nseed = 99999999999999999999\n",
        "float_forms.toml": "[optimizer]\nlr = 1_0.5e-3\nmin_lr = -0.0\nweight_decay = +1e2\n",
        "float_overflow.toml": "[optimizer]\nlr = 1e999\n",
        "hex_integer.toml": "[run]\nseed = 0x10\n",
        "nested_arrays.toml": "[run]\nseed = [[[[[[[[[[1]]]]]]]]]]\n",
        "array_of_tables.toml": "[[run]]\n",
        "outside_section.toml": "seed = 1\n",
        "unknown_key.toml": "[run]\nseeds = 1\n",
        "wrong_type.toml": "[run]\nseed = \"1\"\n[checks]\nci_test = 1\n",
        "removed_option.toml": "[backup]\ndisable_weights_backuper = true\n",
        "literal_string.toml": "[model]\nfreeze_params = 'layers\\.[0-9]+\\.mlp'\n",
        "bad_regex.toml": "[model]\nfreeze_params = '(['\n",
        "stop_ids.toml": '[rollout]\nrollout_stop_token_ids = "2,151329"\n',
        "bare_value.toml": "[model]\ninit = random\n",
        "trailing_garbage.toml": "[run]\nseed = 1 2\n",
    }
    for name, text in broken.items():
        write("toml", name, text)


def rollout_seeds():
    tiny = (ROOT / "tests" / "data" / "rollout_tiny.jsonl").read_text()
    write("rollout_data", "rollout_tiny.jsonl", tiny)
    lines = tiny.splitlines(keepends=True)
    write("rollout_data", "truncated_last_line.jsonl", "".join(lines[:2]) + lines[2][:40])
    write("rollout_data", "blank_lines_crlf.jsonl", "\r\n\n".join(l.rstrip("\n") for l in lines[:3]))
    sample = {"tokens": [1, 2, 3, 4], "response_length": 2, "loss_mask": [1, 0], "reward": 0.5,
              "rollout_log_probs": [-0.25, -1.5], "group": 0}

    def variant(name, **changes):
        s = dict(sample)
        for key, value in changes.items():
            if value is None:
                s.pop(key, None)
            else:
                s[key] = value
        write("rollout_data", name, json.dumps(s) + "\n")

    variant("with_log_probs.jsonl")
    variant("no_group.jsonl", group=None, rollout_log_probs=None)
    variant("bad_loss_mask.jsonl", loss_mask=[1, 2])
    variant("mask_length.jsonl", loss_mask=[1, 0, 1])
    variant("response_too_long.jsonl", response_length=9)
    variant("negative_token.jsonl", tokens=[1, -2, 3, 4])
    variant("float_token.jsonl", tokens=[1, 2.5, 3, 4])
    variant("huge_log_prob.jsonl", rollout_log_probs=[-1e300, 0])
    variant("reward_string.jsonl", reward="1")
    variant("negative_group.jsonl", group=-1)
    variant("unknown_key.jsonl", rewards=1.0)
    write("rollout_data", "not_object.jsonl", "[1, 2, 3]\n")
    write("rollout_data", "groups_not_contiguous.jsonl", "".join(
        json.dumps(dict(sample, group=g)) + "\n" for g in (0, 1, 0)))


def tokenizer_seeds():
    testdata = ROOT / "trainer" / "data" / "testdata"
    for name in ("tiny_gpt2.json", "tiny_gpt4.json", "tiny_qwen2.json"):
        write("tokenizer", name, (testdata / name).read_text())
    qwen = (testdata / "qwen_dir" / "tokenizer.json").read_text()
    config = (testdata / "qwen_dir" / "tokenizer_config.json").read_text()
    write("tokenizer", "qwen_with_config.json", qwen + "\0" + config)
    write("tokenizer", "qwen_bad_config.json", qwen + "\0" + '{"eos_token": "<|nope|>"}')
    write("tokenizer", "qwen_named_templates.json", qwen + "\0" + json.dumps(
        {"eos_token": {"content": "<|im_end|>"},
         "chat_template": [{"name": "default", "template": "<|im_start|>{{ x }} \u00a0<think>"}]}))

    root = json.loads((testdata / "tiny_gpt2.json").read_text())

    def variant(name, edit):
        r = json.loads(json.dumps(root))
        edit(r)
        write("tokenizer", name, json.dumps(r))

    def drop_byte_token(r):
        del r["model"]["vocab"]["Ġ"]

    def bad_merge(r):
        r["model"]["merges"].append("zz qq")

    def gap_in_ids(r):
        r["model"]["vocab"]["extra"] = len(r["model"]["vocab"]) + 5

    def added_stripping(r):
        r.setdefault("added_tokens", []).append(
            {"id": len(r["model"]["vocab"]), "content": "<eos>", "single_word": True,
             "lstrip": True, "rstrip": True, "normalized": False, "special": True})

    def wordpiece(r):
        r["model"]["type"] = "WordPiece"

    variant("missing_byte_token.json", drop_byte_token)
    variant("merge_not_in_vocab.json", bad_merge)
    variant("ids_not_contiguous.json", gap_in_ids)
    variant("added_token_strip.json", added_stripping)
    variant("wordpiece.json", wordpiece)


def safetensors_file(entries, data, metadata=None, pad=True):
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    header.update(entries)
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    data = bytes(range(40))
    good = {
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
        "c": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]},
        "empty": {"dtype": "U8", "shape": [0, 5], "data_offsets": [40, 40]},
    }
    write("safetensors", "valid.safetensors", safetensors_file(good, data, {"format": "pt"}))
    write("safetensors", "unpadded.safetensors", safetensors_file(good, data, pad=False))
    every_dtype = {}
    offset = 0
    for dtype, size in [("BOOL", 1), ("U8", 1), ("I8", 1), ("I16", 2), ("I32", 4), ("I64", 8),
                        ("F16", 2), ("BF16", 2), ("F32", 4), ("F64", 8), ("F8_E4M3", 1),
                        ("F8_E5M2", 1)]:
        every_dtype[dtype.lower()] = {"dtype": dtype, "shape": [2], "data_offsets": [offset, offset + 2 * size]}
        offset += 2 * size
    write("safetensors", "every_dtype.safetensors", safetensors_file(every_dtype, bytes(offset)))

    def broken(name, change, data=data):
        entries = json.loads(json.dumps(good))
        change(entries)
        write("safetensors", name, safetensors_file(entries, data))

    broken("overlap.safetensors", lambda e: e["b"].update(data_offsets=[20, 28]))
    broken("gap.safetensors", lambda e: e["c"].update(data_offsets=[33, 41]), data=bytes(41))
    broken("unsorted.safetensors", lambda e: (e["a"].update(data_offsets=[16, 40]),
                                              e["c"].update(data_offsets=[0, 8]),
                                              e["b"].update(data_offsets=[8, 16])))
    broken("bad_dtype.safetensors", lambda e: e["a"].update(dtype="F33"))
    broken("shape_mismatch.safetensors", lambda e: e["a"].update(shape=[2, 4]))
    broken("offset_past_end.safetensors", lambda e: e["c"].update(data_offsets=[32, 48]))
    broken("negative_dim.safetensors", lambda e: e["a"].update(shape=[-2, -3]))
    broken("huge_shape.safetensors", lambda e: e["a"].update(shape=[1 << 40, 1 << 40]))
    broken("extra_field.safetensors", lambda e: e["a"].update(extra=1))
    write("safetensors", "trailing_bytes.safetensors", safetensors_file(good, data + b"\0"))
    write("safetensors", "bad_metadata.safetensors", safetensors_file(good, data, {"n": 1}))
    write("safetensors", "header_too_long.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
    write("safetensors", "short.safetensors", b"\x02\0\0")
    write("safetensors", "not_object.safetensors", struct.pack("<Q", 2) + b"[]")


if __name__ == "__main__":
    toml_seeds()
    rollout_seeds()
    tokenizer_seeds()
    safetensors_seeds()
