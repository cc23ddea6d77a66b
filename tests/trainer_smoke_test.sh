#!/usr/bin/env bash
# The trainer starts on 2 ranks, prints the layout of both, and exits 0.
set -euo pipefail
trainer="$1"
here="$(dirname "$0")"
log="${TEST_TMPDIR:-/tmp}/trainer_smoke.log"
"$here/mpi_run.sh" 2 "$trainer" --device cpu --init random --model-config none 2>&1 | tee "$log"
grep -q "rank 0 .*device cpu" "$log" || { echo "FAIL: rank 0 missing from the layout"; exit 1; }
grep -q "rank 1 .*device cpu" "$log" || { echo "FAIL: rank 1 missing from the layout"; exit 1; }
echo "PASS"
