#!/usr/bin/env bash
# Train step and greedy decode, ours vs `transformers` on the same checkpoint and batch, in one
# call on the GPU machine: tools/bench/vs_transformers.sh BIN_DIR OUT_DIR
# BIN_DIR holds decode_bench and train_step_bench (built here: bazel build //tools/bench/...);
# `transformers` must be importable (on the GPU machine: pip install --no-index from carried
# wheels). Writes OUT_DIR/results.jsonl and prints a table with the ratios ours / reference.
set -euo pipefail
bin="$1" out="$2"
here="$(cd "$(dirname "$0")" && pwd)"
ckpt="$out/qwen3_0.6b_shape"
decode_args=(--batch 64 --prompt-len 128 --new-tokens 128)
train_args=(--batch 8 --seq 512)
results="$out/results.jsonl"
: > "$results"
python3 "$here/transformers_reference.py" make --out "$ckpt"
python3 "$here/transformers_reference.py" decode --checkpoint "$ckpt" "${decode_args[@]}" \
  | tail -n 1 | tee -a "$results"
"$bin/decode_bench" --checkpoint "$ckpt" "${decode_args[@]}" --compare-eager | tail -n 1 | tee -a "$results"
python3 "$here/transformers_reference.py" train --checkpoint "$ckpt" "${train_args[@]}" \
  | tail -n 1 | tee -a "$results"
mpirun --allow-run-as-root -np 1 "$bin/train_step_bench" --checkpoint "$ckpt" --device auto \
  "${train_args[@]}" --steps 5 --rounds 3 | tail -n 1 | tee -a "$results"
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for bench in ("decode", "train_step"):
    ref = next(r for r in rows if r["bench"] == bench and "reference" in r)
    ours = next(r for r in rows if r["bench"] == bench and "reference" not in r)
    extra = ""
    if "roofline_fraction" in ours:
        extra = f", {100 * ours['roofline_fraction']:.1f}% of the HBM roofline"
    print(f"{bench}: ours {ours['tokens_per_s']:.0f} tokens/s, {ref['reference']} "
          f"{ref['tokens_per_s']:.0f} tokens/s, ratio {ours['tokens_per_s'] / ref['tokens_per_s']:.2f}"
          f"{extra}")
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
