#!/usr/bin/env bash
# Every *_4layer_ci recipe runs 2 colocated iterations on 2 CPU ranks (generation by the rollout
# engine on the toy prompts, GRPO training, weight sync) with all CI checks passing: the SHA256
# rebuild check (rematerialize recipes), the weight-update check and the weight version, and the
# first step's ppo_kl == 0. Any failed check ends the trainer with a non-zero status.
set -euo pipefail
trainer="$1"
shift
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failed=0
for recipe in "$@"; do
  name="$(basename "$recipe" .toml)"
  start=$SECONDS
  if ! "$here/mpi_run.sh" 2 "$trainer" --config "$recipe" --num-rollout 2 \
      --metrics-out "$tmp/$name.jsonl" > "$tmp/$name.log" 2>&1; then
    echo "FAIL: $name"
    tail -n 30 "$tmp/$name.log"
    failed=1
    continue
  fi
  checks=$(grep -c "weight update check: .* SHA256-equal" "$tmp/$name.log" || true)
  rebuilds=$(grep -c "rematerialize restore #.* SHA256-identical" "$tmp/$name.log" || true)
  if [[ $checks -ne 3 ]] || ! grep -q '"iteration":2' "$tmp/$name.jsonl"; then
    echo "FAIL: $name: $checks weight update checks (want 3) or no metrics for iteration 2"
    failed=1
    continue
  fi
  if grep -q "^rematerialize_param_from_master_weight = true" "$recipe" && [[ $rebuilds -ne 3 ]]; then
    echo "FAIL: $name: $rebuilds verified rebuilds (want 3)"
    failed=1
    continue
  fi
  echo "PASS: $name ($((SECONDS - start)) s, $checks weight checks, $rebuilds verified rebuilds)"
done
exit $failed
