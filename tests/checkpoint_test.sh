#!/usr/bin/env bash
# Trainer checkpoints on 2 CPU ranks with the 4-layer Qwen3-MoE CI recipe, generating (so the
# prompt dataset's position travels through the checkpoint). One property per mode:
#   resume_remat    4 iterations straight and 2 + resume + 2 (rematerialize on) end with
#                   SHA256-identical weights and optimizer shards, and identical training metrics
#   resume_pinned   the same with the pinned backup
#   crash_in_save   rank 0 dying in the middle of iteration 2's checkpoint write (every file but
#                   the manifest written) leaves `latest` on iteration 1, which loads and runs
#                   on; the cut-short directory is refused; the last iteration saved again over
#                   itself replaces it whole
#   refused         a checkpoint with a corrupt optimizer shard, without its manifest, or loaded
#                   with another buffer layout (by as many ranks, or by another number of ranks,
#                   which reshards the state) is refused, naming the file and what differs
set -euo pipefail
mode="$1" trainer="$2" recipe="$3"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
run() {  # run NP NAME FLAGS...  (the log is $tmp/NAME.log; RL_FAULT is passed on when set)
  local np="$1" name="$2" env=()
  shift 2
  [[ -z "${RL_FAULT:-}" ]] || env=(-x RL_FAULT)
  "$here/mpi_run.sh" "$np" "${env[@]}" "$trainer" --config "$recipe" \
    --metrics-out "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1
}
fail() { echo "FAIL: $*"; exit 1; }
# The training metrics of a metrics file, without timings, throughput and memory figures.
training_metrics() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print(json.dumps({k: v for k, v in m.items()
                      if not (k.startswith("time_") or k.endswith("_bytes") or k == "tokens_per_s")},
                     sort_keys=True))' "$1"
}
# sha256sum of the files two checkpoints share, by relative path.
same_files() {  # same_files DIR_A DIR_B FILE...
  local a="$1" b="$2"
  shift 2
  for f in "$@"; do
    [[ "$(sha256sum < "$a/$f")" == "$(sha256sum < "$b/$f")" ]] || fail "$f differs"
  done
  echo "SHA256-identical: $*"
}
expect_refused() {  # expect_refused NAME PATTERN  (after a run that must fail)
  grep -q -- "$2" "$tmp/$1.log" || { tail -n 20 "$tmp/$1.log"; fail "$1: no message matching '$2'"; }
  grep -E "CheckpointError|error" "$tmp/$1.log" | grep -- "$2" | head -n 1 | cut -c1-300
}

case "$mode" in
  resume_remat | resume_pinned)
    if [[ "$mode" == resume_remat ]]; then
      flags=(--rematerialize-param-from-master-weight)
    else
      flags=(--no-rematerialize-param-from-master-weight)
    fi
    run 2 straight "${flags[@]}" --num-rollout 4 --save "$tmp/straight" --save-interval 2 ||
      { cat "$tmp/straight.log"; fail "the straight run failed"; }
    run 2 resumed "${flags[@]}" --num-rollout 2 --save "$tmp/first" ||
      { cat "$tmp/resumed.log"; fail "the first half failed"; }
    [[ "$(cat "$tmp/first/latest")" == iter_0000002 ]] || fail "latest is not iter_0000002"
    run 2 resumed "${flags[@]}" --num-rollout 4 --load "$tmp/first" --save "$tmp/second" ||
      { cat "$tmp/resumed.log"; fail "the resumed run failed"; }
    grep -q "loaded checkpoint .*iter_0000002 (iteration 2" "$tmp/resumed.log" ||
      fail "the resumed run did not load iteration 2"
    same_files "$tmp/straight/iter_0000004" "$tmp/second/iter_0000004" model.safetensors \
      optimizer/rank_00000.safetensors optimizer/rank_00001.safetensors trainer_state.json
    diff <(training_metrics "$tmp/straight.jsonl") <(training_metrics "$tmp/resumed.jsonl") ||
      fail "the training metrics differ"
    echo "identical training metrics for $(wc -l < "$tmp/resumed.jsonl") iterations"
    ;;
  crash_in_save)
    set +e
    RL_FAULT="save_crash:0:2" run 2 crashed --num-rollout 3 --save "$tmp/ckpt" \
      --save-interval 1
    status=$?
    set -e
    [[ $status -ne 0 ]] || fail "the run with a crash in its second save exited 0"
    grep -q "RL_FAULT: rank 0 injects 'save_crash' in iteration 2" "$tmp/crashed.log" ||
      { cat "$tmp/crashed.log"; fail "the fault was not injected"; }
    [[ "$(cat "$tmp/ckpt/latest")" == iter_0000001 ]] || fail "latest moved past iteration 1"
    [[ -d "$tmp/ckpt/iter_0000002.partial" ]] || fail "no cut-short directory left to refuse"
    set +e
    run 2 partial --num-rollout 3 --load "$tmp/ckpt/iter_0000002.partial"
    status=$?
    set -e
    [[ $status -ne 0 ]] || fail "the cut-short checkpoint was loaded"
    expect_refused partial "iter_0000002.partial: not a checkpoint: it has no manifest.sha256"
    run 2 recovered --num-rollout 3 --load "$tmp/ckpt" --save "$tmp/ckpt" --save-interval 1 ||
      { cat "$tmp/recovered.log"; fail "resuming from the previous checkpoint failed"; }
    grep -q "loaded checkpoint .*iter_0000001 (iteration 1" "$tmp/recovered.log" ||
      fail "did not resume from iteration 1"
    [[ "$(cat "$tmp/ckpt/latest")" == iter_0000003 && ! -e "$tmp/ckpt/iter_0000002.partial" ]] ||
      fail "the recovered run did not save iterations 2 and 3 cleanly"
    echo "recovered from iteration 1 after the crash; saved iterations 2 and 3"
    # Note [Re-saving] (trainer/checkpoint.h): nothing left to run, so iteration 3 is saved again
    # over the one `latest` names, exchanged in one step; nothing is left beside it.
    run 2 resaved --num-rollout 3 --load "$tmp/ckpt" --save "$tmp/ckpt" ||
      { cat "$tmp/resaved.log"; fail "saving the loaded iteration 3 again failed"; }
    grep -q "saved checkpoint .*iter_0000003 (iteration 3" "$tmp/resaved.log" ||
      fail "iteration 3 was not saved again"
    (cd "$tmp/ckpt/iter_0000003" && sha256sum --quiet -c manifest.sha256) ||
      fail "the re-saved iteration 3 does not match its manifest"
    [[ "$(cat "$tmp/ckpt/latest")" == iter_0000003 ]] || fail "latest moved off iteration 3"
    [[ ! -e "$tmp/ckpt/iter_0000003.partial" && ! -e "$tmp/ckpt/iter_0000003.old" ]] ||
      fail "the re-save left the earlier iteration 3 behind"
    echo "saved iteration 3 again over itself"
    ;;
  refused)
    run 2 saved --num-rollout 1 --save "$tmp/ckpt" || { cat "$tmp/saved.log"; fail "save failed"; }
    ckpt="$tmp/ckpt/iter_0000001"
    set +e
    # On 1 rank the state is resharded, which needs the saved buffer layouts: refused.
    run 1 one_rank --num-rollout 2 --load "$tmp/ckpt" --no-rematerialize-param-from-master-weight \
      --freeze-params 'layers\.0\.self_attn\.q_proj'
    [[ $? -ne 0 ]] || fail "a DP=2 checkpoint of another buffer layout loaded on 1 rank"
    cp -r "$ckpt" "$tmp/corrupt"
    printf '\x01' | dd of="$tmp/corrupt/optimizer/rank_00001.safetensors" bs=1 seek=200 \
      conv=notrunc status=none
    run 2 corrupt --num-rollout 2 --load "$tmp/corrupt"
    [[ $? -ne 0 ]] || fail "a corrupt checkpoint loaded"
    cp -r "$ckpt" "$tmp/no_manifest"
    rm "$tmp/no_manifest/manifest.sha256"
    run 2 no_manifest --num-rollout 2 --load "$tmp/no_manifest"
    [[ $? -ne 0 ]] || fail "a checkpoint without a manifest loaded"
    # Freezing a parameter takes it out of the optimizer's buffers: another buffer layout.
    run 2 other_layout --num-rollout 2 --load "$tmp/ckpt" --no-rematerialize-param-from-master-weight \
      --freeze-params 'layers\.0\.self_attn\.q_proj'
    [[ $? -ne 0 ]] || fail "a checkpoint with another buffer layout loaded"
    set -e
    expect_refused one_rank "rank_00000.safetensors: its dense buffer layout is not this model's at DP 2, EP 1 and TP 1 .*cannot be resharded"
    expect_refused corrupt "corrupt/optimizer/rank_00001.safetensors: SHA256 [0-9a-f]* differs"
    expect_refused no_manifest "no_manifest: not a checkpoint: it has no manifest.sha256"
    expect_refused other_layout "rank_0000[01].safetensors: optimizer state was saved with a different dense buffer layout"
    ;;
  *)
    fail "unknown mode $mode"
    ;;
esac
echo PASS
