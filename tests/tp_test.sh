#!/usr/bin/env bash
# Tensor parallelism on CPU ranks (MPI backend), against one rank:
#   tests/tp_test.sh TRAINER COMPARE DATA DEFAULT_RECIPE RECIPE...
# Each model trains 3 --debug-train-only iterations, fp32, on the recorded rollout DATA at -np 1,
# at -np 2 TP 2, at -np 4 TP 2 (DP 2) and at -np 4 TP 4 (key/value heads fewer than 4 replicated).
# The models: the dense default (Qwen3), also with tied embeddings and with --sequence-parallel,
# and the MoE *_4layer_ci recipes given (GQA and MLA; sequence parallelism always on for MoE).
# The weights saved with --save-hf (gathered from the TP ranks) and every step's grad norm
# must equal -np 1's up to the order of fp32 sums (parallel_train_compare.sh). AdamW turns the
# summation-order noise of near-zero gradients into weight differences of a few hundredths of
# the learning rate, so the dense runs train at --lr 1e-5 (the MoE recipes' own rates are as
# small). Measured: weights within 2.9e-7, grad norms within 5e-7 relative.
set -euo pipefail
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
weight_tol=1e-6
norm_tol=1e-5
failed=0
fail() { echo "FAIL: $*"; failed=1; }
# shellcheck source=tests/parallel_train_compare.sh
. "$here/parallel_train_compare.sh"
trainer="$1" compare="$2" data="$3" default_recipe="$4"
shift 4

# train NAME FLAGS...: -np 1, then each TP layout, each against -np 1.
train() {
  local name="$1"
  shift
  local flags=(--load-debug-rollout-data "$data" --debug-train-only --num-rollout 3
               --params-dtype fp32 --no-use-rollout-routing-replay --no-use-tis "$@")
  run 1 "$name.np1" "${flags[@]}" --save-hf "$tmp/$name.np1" || { fail "$name -np 1"; return; }
  for layout in "2 2" "4 2" "4 4"; do
    read -r np tp <<< "$layout"
    local run_name="$name.np$np.tp$tp"
    if ! run "$np" "$run_name" "${flags[@]}" --tensor-model-parallel-size "$tp" \
        --save-hf "$tmp/$run_name"; then
      fail "$name -np $np TP $tp"
      continue
    fi
    grep -q "parallel layout: TP $tp x DP $((np / tp))" "$tmp/$run_name.log" ||
      fail "$run_name: no TP layout"
    compare_with_np1 "$name.np1" "$run_name"
  done
}

# The default recipe's rollout is larger than the recorded one: 2 prompts x 2 samples here.
small=(--rollout-batch-size 2 --n-samples-per-prompt 2 --global-batch-size 4
       --micro-batch-size 1 --lr 1e-5)
model_config="$(sed -n 's/^model_config = "\(.*\)"/\1/p' "$default_recipe")"
python3 - "$model_config" "$tmp/tied.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["tie_word_embeddings"] = True
json.dump(config, open(sys.argv[2], "w"))
PY
train dense --config "$default_recipe" "${small[@]}"
train dense_tied --config "$default_recipe" "${small[@]}" --model-config "$tmp/tied.json"
train dense_sp --config "$default_recipe" "${small[@]}" --sequence-parallel
for recipe in "$@"; do
  train "$(basename "$recipe" .toml)" --config "$recipe"
done
[[ $failed -eq 0 ]] && echo "PASS" || echo "FAILED"
exit $failed
