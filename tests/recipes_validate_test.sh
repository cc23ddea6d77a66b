#!/usr/bin/env bash
# Every recipe in configs/ validates (trainer --validate-only exits 0) and plans (--plan prints a
# memory plan and exits 0), and a broken copy of one exits 2 naming the bad key and the file.
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
expect_refused() {  # expect_refused MESSAGE ARGS...: --validate-only exits 2 printing MESSAGE
  local message="$1" status
  shift
  set +e
  "$trainer" "$@" --validate-only > /dev/null 2> "$TEST_TMPDIR/err"
  status=$?
  set -e
  if [[ $status -ne 2 ]] || ! grep -qF -- "$message" "$TEST_TMPDIR/err"; then
    echo "FAIL: $* gave status $status, not 2 with '$message':"
    cat "$TEST_TMPDIR/err"
    failed=1
  fi
}
expect_refused "--lr must be a finite number; got inf" --config "$1" --lr inf
expect_refused "--weight-decay must be a finite number; got inf" --config "$1" --weight-decay inf
expect_refused "--entropy-coef must be a finite number; got nan" --config "$1" --entropy-coef nan
expect_refused "--rollout-temperature must be a finite number; got inf" --config "$1" \
  --rollout-temperature inf
expect_refused "--entropy-coef must be >= 0" --config "$1" --entropy-coef -1
nonfinite="$TEST_TMPDIR/nonfinite.toml"
printf '[model]\ninit = "random"\nmodel_config = "tiny.json"\n\n[rl]\ntis_clip = inf\n' > "$nonfinite"
expect_refused "--tis-clip must be a finite number; got inf" --config "$nonfinite"
[[ $failed -eq 0 ]] && echo "PASS: $# recipes validate and plan"
exit $failed
