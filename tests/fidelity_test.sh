#!/usr/bin/env bash
# On-policy fidelity on 2 CPU ranks with the Qwen3-MoE CI recipe, one property per case:
#   1. --use-rollout-logprobs runs no old-logprob pass (no phase in the log, no time in the
#      metrics) and passes its CI check; the mismatch metrics are present and finite.
#   2. The routing the engine records (--use-rollout-routing-replay) travels through a recorded
#      rollout file and is replayed by a --debug-train-only run: every replayed (token, MoE layer)
#      pair used exactly the recorded experts.
#   3. Forcing other experts on a few tokens of that file changes the old log-probs (so the
#      mismatch metric) with rollout routing replay, and changes nothing without it.
#   4. The same for the DSA indexer (--use-rollout-indexer-replay, GLM-5 CI recipe): its
#      selections travel through the file, a forced selection changes the log-probs with replay
#      only, and replaying the engine's own selections leaves the first iteration's mismatch no
#      larger than recomputing them.
#   5. The embedded default (dense, fp32) with 24-token responses: the rollout's log-probs equal
#      the recomputed ones bit for bit in every iteration (mismatch exactly 0, Note [Batch-invariant
#      CPU kernels]), so --use-rollout-logprobs changes nothing: the same metrics and
#      SHA256-identical final weights.
set -euo pipefail
trainer="$1" recipe="$2" dsa_recipe="$3" default="$4"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failed=0
fail() { echo "FAIL: $*"; failed=1; }
run() {  # run NAME FLAGS...: 2 ranks, the log in $tmp/NAME.log, the metrics in $tmp/NAME.jsonl
  local name="$1"
  shift
  "$here/mpi_run.sh" 2 "$trainer" --config "${config:-$recipe}" \
    --rollout-max-response-len "${response_len:-8}" \
    --metrics-out "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 ||
    { echo "FAIL: $name exited non-zero"; tail -n 20 "$tmp/$name.log"; exit 1; }
}
metric() {  # metric NAME KEY: the key's values, one per iteration
  sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$tmp/$1.jsonl"
}
# train_on_records PREFIX FLAG DATA FORCED: one --debug-train-only iteration on the recorded
# rollout DATA and on FORCED (its records altered), each with the replay FLAG (runs
# PREFIX_replay_orig, PREFIX_replay_forced) and without it (PREFIX_plain_orig, PREFIX_plain_forced).
train_on_records() {
  local prefix="$1" flag="$2" data="$3" forced="$4" mode
  for mode in replay plain; do
    local flags=(--num-rollout 1 --debug-train-only --no-check-weight-update-equal)
    [[ $mode == replay ]] && flags+=("$flag")
    run "${prefix}_${mode}_orig" "${flags[@]}" --load-debug-rollout-data "$data"
    run "${prefix}_${mode}_forced" "${flags[@]}" --load-debug-rollout-data "$forced"
  done
}

run rollout_lp --num-rollout 2 --use-rollout-logprobs
grep -q "  old_logprobs " "$tmp/rollout_lp.log" && fail "1: an old_logprobs phase ran"
grep -q "time_old_logprobs_s" "$tmp/rollout_lp.jsonl" && fail "1: old_logprobs time in the metrics"
[[ $(metric rollout_lp train_rollout_logprob_abs_diff_max | wc -l) -eq 2 ]] ||
  fail "1: no mismatch metrics"

run record --num-rollout 1 --use-rollout-routing-replay --save-debug-rollout-data "$tmp/data.jsonl"
grep -q '"routed_experts":{"layers":' "$tmp/data.jsonl" || fail "2: no routing record in the file"

# The first sample's ids of MoE layer 0 at positions 2 and 5, slot 0, moved to another expert.
python3 - "$tmp/data.jsonl" "$tmp/forced.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
r = lines[0]["routed_experts"]
for p in (2, 5):
    i = p * r["k"]
    r["ids"][i] = next(e for e in range(128) if e not in r["ids"][i:i + r["k"]])
with open(sys.argv[2], "w") as f:
    f.writelines(json.dumps(l) + "\n" for l in lines)
PY
train_on_records moe --use-rollout-routing-replay "$tmp/data.jsonl" "$tmp/forced.jsonl"
# Case 2: the run that replays the unaltered file.
grep -q "routing replay check: 0 of [1-9][0-9]* (token, MoE layer) pairs" "$tmp/moe_replay_orig.log" ||
  fail "2: $(grep 'routing replay check' "$tmp/moe_replay_orig.log" || echo 'no routing replay check')"
orig=$(metric moe_replay_orig train_rollout_logprob_abs_diff)
forced=$(metric moe_replay_forced train_rollout_logprob_abs_diff)
[[ "$orig" != "$forced" ]] || fail "3: forced experts did not change the replayed log-probs ($orig)"
[[ "$(metric moe_plain_orig train_rollout_logprob_abs_diff)" == "$(metric moe_plain_forced train_rollout_logprob_abs_diff)" ]] ||
  fail "3: without replay, the recorded routing changed the log-probs"
echo "experts: mismatch with replay: recorded routing $orig, forced $forced;" \
  "without replay: $(metric moe_plain_orig train_rollout_logprob_abs_diff) both"

config="$dsa_recipe"
run dsa_record --num-rollout 1 --use-rollout-indexer-replay --save-debug-rollout-data "$tmp/dsa.jsonl"
grep -q '"indexer_topk":{"layers":' "$tmp/dsa.jsonl" || fail "4: no indexer record in the file"
# The first sample's selection at its first recorded position, layer 0: key 0 swapped for another.
python3 - "$tmp/dsa.jsonl" "$tmp/dsa_forced.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
r = lines[0]["indexer_topk"]
keys = r["ids"][:r["k"]]
visible = range(r["first"] + 1)  # the first recorded position sees keys 0..first
r["ids"][0] = next(key for key in visible if key not in keys) if len(keys) < len(visible) else keys[0]
with open(sys.argv[2], "w") as f:
    f.writelines(json.dumps(l) + "\n" for l in lines)
PY
train_on_records dsa --use-rollout-indexer-replay "$tmp/dsa.jsonl" "$tmp/dsa_forced.jsonl"
orig=$(metric dsa_replay_orig train_rollout_logprob_abs_diff)
forced=$(metric dsa_replay_forced train_rollout_logprob_abs_diff)
plain=$(metric dsa_plain_orig train_rollout_logprob_abs_diff)
[[ "$orig" != "$forced" ]] || fail "4: a forced key selection did not change the replayed log-probs"
[[ "$plain" == "$(metric dsa_plain_forced train_rollout_logprob_abs_diff)" ]] ||
  fail "4: without replay, the recorded selections changed the log-probs"
awk -v a="$orig" -v b="$plain" 'BEGIN { exit !(a <= b) }' ||
  fail "4: replaying the engine's selections raised the mismatch ($orig > $plain)"
echo "indexer: mismatch with replay: recorded selections $orig, forced $forced;" \
  "without replay: $plain"

config="$default" response_len=24
for mode in recompute rollout; do
  flags=(--num-rollout 3 --save-hf "$tmp/hf_$mode")
  [[ $mode == rollout ]] && flags+=(--use-rollout-logprobs)
  run "dense_$mode" "${flags[@]}"
done
[[ "$(metric dense_recompute train_rollout_logprob_abs_diff_max | sort -u)" == "0.0" ]] ||
  fail "5: the dense fp32 mismatch is not 0: $(metric dense_recompute train_rollout_logprob_abs_diff_max | tr '\n' ' ')"
for key in reward_mean loss pg_loss kl grad_norm; do
  [[ "$(metric dense_recompute $key)" == "$(metric dense_rollout $key)" ]] ||
    fail "5: --use-rollout-logprobs changed $key"
done
cmp -s "$tmp/hf_recompute/model.safetensors" "$tmp/hf_rollout/model.safetensors" ||
  fail "5: --use-rollout-logprobs changed the final weights"
echo "dense fp32: mismatch max per iteration $(metric dense_recompute train_rollout_logprob_abs_diff_max | tr '\n' ' ')"

[[ $failed -eq 0 ]] && echo "PASS"
exit $failed
