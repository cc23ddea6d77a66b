#!/usr/bin/env bash
# The trainer starts on 2 ranks, prints the layout of both, runs one iteration and exits 0.
set -euo pipefail
trainer="$1" recipe="$2" data="$3"
here="$(dirname "$0")"
log="${TEST_TMPDIR:-/tmp}/trainer_smoke.log"
"$here/mpi_run.sh" 2 "$trainer" --config "$recipe" --load-debug-rollout-data "$data" \
  --num-rollout 1 --device cpu 2>&1 | tee "$log"
grep -q "rank 0 .*device cpu" "$log" || { echo "FAIL: rank 0 missing from the layout"; exit 1; }
grep -q "rank 1 .*device cpu" "$log" || { echo "FAIL: rank 1 missing from the layout"; exit 1; }
echo "PASS"
