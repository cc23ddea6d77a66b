#!/usr/bin/env bash
# Decode speed against the HBM roofline, batch 64 and batch 1, on the GPU machine, in one call:
# tools/bench/decode_roofline.sh OUT_DIR DECODE_BENCH [BEFORE_DECODE_BENCH]
# For three random bf16 checkpoints made by transformers_reference.py make (Qwen3-0.6B-shaped
# dense; GLM-4.7-Flash cut to 4 layers: MLA + MoE; Qwen3-30B-A3B cut to 4 layers: MoE), greedy,
# prompt 128, 128 new tokens, DECODE_BENCH --compare-eager (graph replays must equal eager steps)
# and, when given, BEFORE_DECODE_BENCH (another build, for a before/after ratio in the same
# call). Writes OUT_DIR/decode.jsonl (each line with "model", "build") and prints a table:
# tokens/s, the roofline fraction, kernels per layer of one decode step, after / before, and
# whether both builds generated the same bits (their generation_sha256; "-" where the before
# build does not report it).
set -euo pipefail
out="$1" after="$2" before="${3:-}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
results="$out/decode.jsonl"
: > "$results"

# run MODEL BUILD BINARY ARGS...: one decode_bench line, tagged, appended to the results.
run() {
  local model="$1" build="$2" binary="$3"
  shift 3
  "$binary" --checkpoint "$out/$model" --prompt-len 128 --new-tokens 128 "$@" | tail -n 1 \
    | python3 -c 'import json, sys
print(json.dumps({"model": sys.argv[1], "build": sys.argv[2], **json.loads(sys.stdin.read())}))' \
      "$model" "$build" >> "$results"
}

for model in qwen3_0.6b glm47_flash_4layer qwen3_moe_4layer; do
  python3 "$here/transformers_reference.py" make --shape "$model" --out "$out/$model" > /dev/null
  for batch in 64 1; do
    run "$model" after "$after" --batch "$batch" --compare-eager
    if [ -n "$before" ]; then run "$model" before "$before" --batch "$batch"; fi
  done
  rm -rf "${out:?}/$model"
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def find(model, batch, build):
    return next((r for r in rows if r["model"] == model and r["batch"] == batch
                 and r["build"] == build), None)
print("model | batch | tokens/s | roofline | kernels/layer | graphs = eager | after / before | "
      "same bits as before")
for r in rows:
    if r["build"] != "after":
        continue
    b = find(r["model"], r["batch"], "before")
    ratio = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f} ({b['tokens_per_s']:.0f} tokens/s)" if b else "-"
    same = "-"
    if b and "generation_sha256" in r and "generation_sha256" in b:
        same = str(r["generation_sha256"] == b["generation_sha256"])
    print(f"{r['model']} | {r['batch']} | {r['tokens_per_s']:.0f} | "
          f"{100 * r['roofline_fraction']:.1f}% | {r.get('kernels_per_layer', 0):.2f} | "
          f"{r.get('eager_identical')} | {ratio} | {same}")
PY
