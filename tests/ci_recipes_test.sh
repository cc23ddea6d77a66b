#!/usr/bin/env bash
# Every *_4layer_ci recipe runs 2 colocated iterations on 2 CPU ranks (generation by the rollout
# engine on the toy prompts, GRPO training, weight sync) with all CI checks passing: the SHA256
# rebuild check (rematerialize recipes), the weight-update check and the weight version, the
# first step's ppo_kl == 0, the routing replay check where the recipe replays (0 pairs differ, in
# both iterations), and finite log-prob mismatch metrics in every iteration. Any failed check in
# the trainer ends it with a non-zero status.
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
  replays=$(grep -c "routing replay check: 0 of [1-9]" "$tmp/$name.log" || true)
  if grep -q "^use_rollout_routing_replay = true" "$recipe" && [[ $replays -ne 2 ]]; then
    echo "FAIL: $name: $replays routing replay checks with 0 differing pairs (want 2)"
    failed=1
    continue
  fi
  # Note [Log-prob mismatch]: present and finite in every iteration.
  if [[ $(grep -Ec '"train_rollout_logprob_abs_diff":[0-9.e+-]+,"train_rollout_logprob_abs_diff_max":[0-9.e+-]+,"train_rollout_ratio_mean":[0-9.e+-]+' "$tmp/$name.jsonl") -ne 2 ]]; then
    echo "FAIL: $name: the log-prob mismatch metrics are missing or not finite"
    failed=1
    continue
  fi
  echo "PASS: $name ($((SECONDS - start)) s, $checks weight checks, $rebuilds verified rebuilds," \
    "$replays routing replay checks)"
done
exit $failed
