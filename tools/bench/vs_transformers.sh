#!/usr/bin/env bash
# Train step and greedy decode, ours vs `transformers` on the same checkpoint and batch, in one
# call on the GPU machine: tools/bench/vs_transformers.sh BIN_DIR OUT_DIR
# BIN_DIR holds decode_bench and train_step_bench (built here: bazel build //tools/bench/...);
# `transformers` must be importable (on the GPU machine: pip install --no-index from carried
# wheels). Three models, each a random bf16 checkpoint made by transformers_reference.py make:
#   qwen3_0.6b        dense, Qwen3-0.6B-shaped: decode batch 64 x (128 prompt + 128 new tokens)
#   qwen3_moe_4layer  Qwen3-30B-A3B-shaped cut to 4 layers: decode batch 64 x (128 + 64)
#   glm47_flash_4layer  GLM-4.7-Flash (MLA + MoE) cut to 4 layers: decode batch 64 x (128 + 64)
# and for each one train step of batch 8 x 512. Writes OUT_DIR/results.jsonl (each line with its
# "model") and prints one table block per model with the ratios ours / reference.
set -euo pipefail
bin="$1" out="$2"
here="$(cd "$(dirname "$0")" && pwd)"
train_args=(--batch 8 --seq 512)
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"

# The last line of stdin (a benchmark's JSON line) with "model": $1 added, appended to the
# results and printed.
record() {
  tail -n 1 | python3 -c 'import json, sys
print(json.dumps({"model": sys.argv[1], **json.loads(sys.stdin.read())}))' "$1" | tee -a "$results"
}

# bench_model SHAPE DECODE_ARGS...: makes the checkpoint of SHAPE (transformers_reference.py make
# --shape), then reference decode, our decode (graphs and eager), reference train, our train step.
bench_model() {
  local model="$1"
  shift
  local ckpt="$out/${model}_shape"
  python3 "$here/transformers_reference.py" make --shape "$model" --out "$ckpt"
  python3 "$here/transformers_reference.py" decode --checkpoint "$ckpt" "$@" | record "$model"
  "$bin/decode_bench" --checkpoint "$ckpt" "$@" --compare-eager | record "$model"
  python3 "$here/transformers_reference.py" train --checkpoint "$ckpt" "${train_args[@]}" \
    | record "$model"
  mpirun --allow-run-as-root -np 1 "$bin/train_step_bench" --checkpoint "$ckpt" --device auto \
    "${train_args[@]}" --steps 5 --rounds 3 | record "$model"
}

bench_model qwen3_0.6b --batch 64 --prompt-len 128 --new-tokens 128
bench_model qwen3_moe_4layer --batch 64 --prompt-len 128 --new-tokens 64
bench_model glm47_flash_4layer --batch 64 --prompt-len 128 --new-tokens 64

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for model in dict.fromkeys(r["model"] for r in rows):
    print(f"== {model}")
    for bench in ("decode", "train_step"):
        ref = next(r for r in rows if r["model"] == model and r["bench"] == bench
                   and "reference" in r)
        ours = next(r for r in rows if r["model"] == model and r["bench"] == bench
                    and "reference" not in r)
        extra = ""
        if "roofline_fraction" in ours:
            extra = f", {100 * ours['roofline_fraction']:.1f}% of the HBM roofline"
        if "experts_used_per_step" in ours:
            extra += (f" (reading {ours['experts_used_per_step']:.1f} distinct experts per layer"
                      " and step)")
        reference = ref["reference"] + (f" (experts {ref['experts']})" if "experts" in ref else "")
        print(f"{bench}: ours {ours['tokens_per_s']:.0f} tokens/s, {reference} "
              f"{ref['tokens_per_s']:.0f} tokens/s, ratio "
              f"{ours['tokens_per_s'] / ref['tokens_per_s']:.2f}{extra}")
        phases = [k for k in ours if k.endswith("_ms")]
        if phases:
            print("  ms per step, ours / reference: " + ", ".join(
                f"{k[:-3]} {ours[k]:.1f} / " + (f"{ref[k]:.1f}" if k in ref else "-")
                for k in sorted(phases)))
        if "eager_seconds" in ours:
            print(f"  decode by CUDA graphs {ours['seconds']:.3f} s vs eager steps "
                  f"{ours['eager_seconds']:.3f} s per Generate: "
                  f"{ours['eager_seconds'] / ours['seconds']:.2f}x; generations "
                  + ("bit-identical" if ours["eager_identical"] else "DIFFER"))
PY
