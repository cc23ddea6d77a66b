#!/usr/bin/env bash
# Exact resume on the GPU machine: tools/gpu_resume_check.sh OUT_DIR (with .gpu/trainer built here).
# The GLM-5 4-layer CI recipe, 4 iterations straight vs 2 + --load + 2: the final checkpoints' files
# must be SHA256-identical and the training metrics equal. Prints one line per comparison.
set -uo pipefail
out="$1"
run() { mpirun --allow-run-as-root -np 1 .gpu/trainer --config configs/glm5_744b_a40b_4layer_ci.toml \
  --rollout-batch-size 8 --n-samples-per-prompt 8 --global-batch-size 64 "$@"; }
run --num-rollout 4 --save "$out/straight" --save-interval 2 --metrics-out "$out/straight.jsonl" > "$out/straight.log" 2>&1; echo "straight rc $?"
run --num-rollout 2 --save "$out/first" --metrics-out "$out/resumed.jsonl" > "$out/first.log" 2>&1; echo "first rc $?"
run --num-rollout 4 --load "$out/first" --save "$out/second" --metrics-out "$out/resumed.jsonl" > "$out/second.log" 2>&1; echo "second rc $?"
grep -h "saved checkpoint\|loaded checkpoint\|error" "$out"/*.log | cut -c1-200
for f in model.safetensors optimizer/rank_00000.safetensors trainer_state.json; do
  a=$(sha256sum < "$out/straight/iter_0000004/$f"); b=$(sha256sum < "$out/second/iter_0000004/$f")
  [[ "$a" == "$b" ]] && echo "identical: $f" || echo "DIFFERENT: $f"
done
python3 - "$out/straight.jsonl" "$out/resumed.jsonl" <<'PY'
import json, sys
def rows(p):
    return [{k: v for k, v in json.loads(l).items() if k in ("iteration", "reward_mean", "loss", "kl", "grad_norm", "pg_clipfrac", "weight_version")} for l in open(p)]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print("training metrics identical" if a == b else "metrics differ:\n" + "\n".join(f"{x}\n{y}" for x, y in zip(a, b) if x != y))
PY
rm -rf "$out/straight" "$out/first" "$out/second"
