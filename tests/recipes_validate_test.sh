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
[[ $failed -eq 0 ]] && echo "PASS: $# recipes validate and plan"
exit $failed
