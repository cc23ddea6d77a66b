#!/usr/bin/env bash
# Every recipe in configs/ validates (trainer --validate-only exits 0) and plans (--plan prints a
# memory plan and exits 0), and a broken copy of one exits 2 naming the bad key and the file; so
# do non-finite numbers (naming the option), a model config.json with sizes that crashed the
# parser (naming the file and the key) and options this binary runs at one value only.
set -euo pipefail
trainer="$1"
shift
failed=0
for recipe in "$@"; do
  if ! "$trainer" --config "$recipe" --validate-only > /dev/null 2> "$TEST_TMPDIR/err"; then
    echo "FAIL: $recipe does not validate:"
    cat "$TEST_TMPDIR/err"
    failed=1
  fi
  if ! "$trainer" --config "$recipe" --plan > "$TEST_TMPDIR/plan" 2> "$TEST_TMPDIR/err" ||
     ! grep -q "^GPU bytes per rank" "$TEST_TMPDIR/plan"; then
    echo "FAIL: $recipe does not plan:"
    cat "$TEST_TMPDIR/err"
    failed=1
  fi
done
bad="$TEST_TMPDIR/bad.toml"
cp "$1" "$bad"
printf '\n[optimizer_typo]\nlr = 1\n' >> "$bad"
set +e
"$trainer" --config "$bad" --validate-only > /dev/null 2> "$TEST_TMPDIR/err"
status=$?
set -e
if [[ $status -ne 2 ]] || ! grep -q "bad.toml:.*unknown key 'lr' in \[optimizer_typo\]" "$TEST_TMPDIR/err"; then
  echo "FAIL: a recipe with an unknown section gave status $status:"
  cat "$TEST_TMPDIR/err"
  failed=1
fi
# Note [Finite numbers] (trainer/config/validate.cc): inf and nan, from a flag or the file, exit 2
# naming the option.
expect_refused() {  # expect_refused MESSAGE ARGS...: the trainer exits 2 printing MESSAGE
  local message="$1" status
  shift
  set +e
  "$trainer" "$@" > /dev/null 2> "$TEST_TMPDIR/err"
  status=$?
  set -e
  if [[ $status -ne 2 ]] || ! grep -qF -- "$message" "$TEST_TMPDIR/err"; then
    echo "FAIL: $* gave status $status, not 2 with '$message':"
    cat "$TEST_TMPDIR/err"
    failed=1
  fi
}
expect_refused "--lr must be a finite number; got inf" --config "$1" --lr inf --validate-only
expect_refused "--weight-decay must be a finite number; got inf" --config "$1" \
  --weight-decay inf --validate-only
expect_refused "--entropy-coef must be a finite number; got nan" --config "$1" \
  --entropy-coef nan --validate-only
expect_refused "--rollout-temperature must be a finite number; got inf" --config "$1" \
  --rollout-temperature inf --validate-only
expect_refused "--entropy-coef must be >= 0" --config "$1" --entropy-coef -1 --validate-only
nonfinite="$TEST_TMPDIR/nonfinite.toml"
printf '[model]\ninit = "random"\nmodel_config = "tiny.json"\n\n[rl]\ntis_clip = inf\n' > "$nonfinite"
expect_refused "--tis-clip must be a finite number; got inf" --config "$nonfinite" --validate-only
# Note [Sizes checked before use] (trainer/model/hf_config.cc): a config.json whose sizes would
# divide by zero or size a list beyond memory exits 2 naming the file and the key, in --plan and
# in a run (both read it in the config stage), instead of crashing.
bad_model() {  # bad_model KEY VALUE: configs/models/tiny_qwen3.json with KEY set to VALUE
  python3 - "$1" "$2" "$TEST_TMPDIR/bad_model.json" <<'PY'
import json, sys
config = json.load(open("configs/models/tiny_qwen3.json"))
config[sys.argv[1]] = int(sys.argv[2])
json.dump(config, open(sys.argv[3], "w"))
PY
}
for key_value in "num_attention_heads 0" "num_hidden_layers -1" "num_hidden_layers 1000000000000"; do
  read -r key value <<< "$key_value"
  bad_model "$key" "$value"
  for mode in --plan --num-rollout=1; do
    expect_refused "bad_model.json: key \"$key\" must be" --config configs/default.toml \
      --model-config "$TEST_TMPDIR/bad_model.json" "$mode"
  done
done
# Options that were accepted and ignored (Note [Runnable today], trainer/plan.h): a run refuses
# them, naming the option, and --plan says the recipe is not runnable today, with the reason.
pinned=(--config configs/default.toml --no-rematerialize-param-from-master-weight)
expect_refused "--colocate false: only true runs yet" "${pinned[@]}" --no-colocate
expect_refused "--offload-rollout false: only true runs yet" "${pinned[@]}" --no-offload-rollout
expect_refused "--num-critic-only-steps 2: only 0 runs yet" "${pinned[@]}" \
  --num-critic-only-steps 2
grep -q "not implemented yet" "$TEST_TMPDIR/err" || { echo "FAIL: no 'not implemented yet'"; failed=1; }
if ! "$trainer" "${pinned[@]}" --num-critic-only-steps 2 --plan > "$TEST_TMPDIR/plan" ||
   ! grep -q "planned only: this binary cannot run it today" "$TEST_TMPDIR/plan" ||
   ! grep -q "^  --num-critic-only-steps 2: only 0 runs yet" "$TEST_TMPDIR/plan"; then
  echo "FAIL: --plan does not say that --num-critic-only-steps 2 does not run:"
  cat "$TEST_TMPDIR/plan"
  failed=1
fi
[[ $failed -eq 0 ]] && echo "PASS: $# recipes validate and plan"
exit $failed
