#!/usr/bin/env bash
# The rollout does not depend on the number of data-parallel ranks (Note [Data-parallel rollout]):
# the first iteration's gathered rollout, as --save-debug-rollout-data writes it (tokens, rewards,
# per-token log-probs, groups, in prompt and sample order), is byte-identical at 1 CPU rank and at
# more: the embedded default (dense; 2 and 4 ranks) and the Qwen3-MoE CI recipe with 5 prompts of
# 6 samples (2 and 3 ranks; an uneven split at 3: 2, 2 and 1 prompts). The metrics say what each
# rank generated, and how (one decode batch for all of a rank's samples).
# (Only the first iteration: later ones start from weights trained at different DP sizes, which
# agree to ~1e-7, not bit for bit.)
set -euo pipefail
trainer="$1" default="$2" moe="$3"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failed=0
check() {  # check NAME "RANK COUNTS" CONFIG [ARGS...]
  local name="$1" counts="$2" config="$3"
  shift 3
  for np in 1 $counts; do
    "$here/mpi_run.sh" "$np" "$trainer" --config "$config" --num-rollout 1 "$@" \
      --save-debug-rollout-data "$tmp/$name.$np.jsonl" --metrics-out "$tmp/$name.$np.metrics" \
      > "$tmp/$name.$np.log" 2>&1 || { echo "FAIL: $name at $np ranks"; tail -n 30 "$tmp/$name.$np.log"; exit 1; }
  done
  local want
  want=$(sha256sum < "$tmp/$name.1.jsonl" | cut -d' ' -f1)
  for np in $counts; do
    if [[ $(sha256sum < "$tmp/$name.$np.jsonl" | cut -d' ' -f1) != "$want" ]]; then
      echo "FAIL: $name: the rollout at $np ranks differs from the one at 1 rank"
      diff <(cut -c1-200 "$tmp/$name.1.jsonl") <(cut -c1-200 "$tmp/$name.$np.jsonl") | head -n 10
      failed=1
    fi
  done
  echo "$name: $(wc -l < "$tmp/$name.1.jsonl") samples, the same at 1 and at $counts ranks;" \
    "at $np ranks $(grep -o '"rollout_samples_per_rank":[^]]*]' "$tmp/$name.$np.metrics")"
}
check default "2 4" "$default"
check moe "2 3" "$moe" --rollout-batch-size 5 --n-samples-per-prompt 6 --global-batch-size 30 \
  --rollout-max-response-len 8
if ! grep -q '"rollout_samples_per_rank":\[12,12,6\]' "$tmp/moe.3.metrics"; then
  echo "FAIL: 5 prompts of 6 samples over 3 ranks are not generated as 12, 12 and 6 samples"
  failed=1
fi
# Note [Rollout batching]: at 1 rank the 30 samples (5 prompts) decode as one batch: 7 steps of
# 30 rows (each row generates 8 tokens, the first from the prefill).
if ! grep -q '"rollout_decode_steps":7,"rollout_rows_per_decode_step":30' "$tmp/moe.1.metrics"; then
  echo "FAIL: the 30 samples at 1 rank did not decode as one batch of 7 steps:" \
    "$(grep -o '"rollout_decode_steps":[^,]*,"rollout_rows_per_decode_step":[^,]*' "$tmp/moe.1.metrics")"
  failed=1
fi
[[ $failed -eq 0 ]] && echo "PASS"
exit $failed
