#!/usr/bin/env bash
# Builds and runs every test: unit tests beside their code and the multi-rank tests under
# `mpirun -np 2` (tests/mpi_run.sh). The last line is "N passed, N failed", counting test targets.
# Exit status is non-zero when any test fails or does not build.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
bazel test --keep_going //... "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# Bazel's summary has one line per test target: "//pkg:name   PASSED in 1.2s".
summary='^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|FAILED TO BUILD|INCOMPLETE)'
passed=$(grep -Ec "^//[^ ]+ +(\(cached\) )?PASSED" "$log")
total=$(grep -Ec "$summary" "$log")
failed=$((total - passed))
# The end of each failed test's log, again, just above the count (CI shows the tail of the run).
for target in $(grep -Eo "^//[^ ]+ +(FAILED|TIMEOUT|FLAKY)" "$log" | cut -d' ' -f1); do
  test_log="bazel-testlogs/$(echo "${target#//}" | tr ':' '/')/test.log"
  echo "==== the last 60 lines of ${target} (${test_log})"
  tail -n 60 "$test_log" 2>/dev/null || echo "(no log)"
done
if [[ $status -ne 0 && $failed -eq 0 ]]; then
  failed=1  # the build or Bazel itself failed before any test ran
fi
echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
