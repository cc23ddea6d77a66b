#!/usr/bin/env bash
# Tensor parallelism on CPU ranks (MPI backend), against one rank, at -np 2 TP 2, -np 4 TP 2
# (DP 2) and -np 4 TP 4 (key/value heads fewer than 4 replicated), and for the MoE recipes also
# -np 4 TP 2 x EP 2 (each TP group the EP group of its ranks' experts). Three modes:
#   train TRAINER COMPARE DATA DEFAULT_RECIPE RECIPE...
#     each model trains 3 --debug-train-only iterations, fp32, on the recorded rollout DATA: the
#     dense default (Qwen3), also with tied embeddings and with --sequence-parallel, and the MoE
#     *_4layer_ci recipes given (GQA and MLA; sequence parallelism always on for MoE). The
#     weights saved with --save-hf (gathered from the TP ranks) and every step's grad norm must
#     equal -np 1's up to the order of fp32 sums (parallel_runs.sh). AdamW turns the
#     summation-order noise of near-zero gradients into weight differences of a few hundredths
#     of the learning rate, so the dense runs train at --lr 1e-5 (the MoE recipes' own rates are
#     as small). Measured: weights within 3.2e-7, grad norms within 5e-7 relative.
#   colocated TRAINER DEFAULT_RECIPE RECIPE...
#     each model runs 2 colocated iterations, fp32, with rematerialize on and every CI check of
#     its recipe passing (the SHA256 rebuild check, the weight-update check between actor and
#     engine, the first step's ppo_kl, the routing replay check): the engines hold their ranks'
#     slices and generate tensor-parallel. The first iteration's samples (every token) equal a
#     -np 1 run's: the TP ranks sample the same tokens from the same gathered logits, which in
#     fp32 differ from one rank's only in the order of sums (in bf16 that flips some tokens).
#   resume TRAINER RECIPE
#     at -np 4 TP 2 (DP 2), 2 iterations saved then resumed for a third give the same checkpoint
#     as 3 straight iterations (the weights and every rank's optimizer shard SHA256-identical).
#     The saved checkpoint loaded and saved again (nothing left to run, so the loaded state is
#     saved in the new layout) at -np 2 TP 1, -np 4 TP 4, -np 4 TP 2 x EP 2, -np 2 TP 2 x EP 2
#     (DP 1), then back at -np 4 TP 2: the optimizer state resharded across TP, EP and DP sizes
#     comes back bit for bit, and so do the weights. Then a run at -np 2 TP 1 resumes the first checkpoint and trains on.
set -euo pipefail
mode="$1"
shift
here="$(dirname "$0")"
# shellcheck source=tests/parallel_runs.sh
. "$here/parallel_runs.sh"
layouts=("2 2 1" "4 2 1" "4 4 1")  # -np, TP, EP
moe_layouts=("${layouts[@]}" "4 2 2")
# The default recipe's rollout is larger than the CI ones: 2 prompts x 2 samples here.
small=(--rollout-batch-size 2 --n-samples-per-prompt 2 --global-batch-size 4
       --micro-batch-size 1 --rollout-max-response-len 4 --lr 1e-5)

case "$mode" in
  train)
    trainer="$1" compare="$2" data="$3" default_recipe="$4"
    shift 4
    train() {  # train NAME LAYOUTS FLAGS...: -np 1, then each layout, each against -np 1
      local name="$1"
      local -n each="$2"
      shift 2
      local flags=(--load-debug-rollout-data "$data" --debug-train-only --num-rollout 3
                   --params-dtype fp32 --no-use-rollout-routing-replay --no-use-tis "$@")
      run 1 "$name.np1" "${flags[@]}" --save-hf "$tmp/$name.np1" || { fail "$name -np 1"; return; }
      for layout in "${each[@]}"; do
        read -r np tp ep <<< "$layout"
        local run_name="$name.np$np.tp$tp.ep$ep"
        if ! run "$np" "$run_name" "${flags[@]}" --tensor-model-parallel-size "$tp" \
            --expert-model-parallel-size "$ep" --save-hf "$tmp/$run_name"; then
          fail "$name -np $np TP $tp EP $ep"
          continue
        fi
        grep -q "parallel layout: TP $tp x DP $((np / tp))" "$tmp/$run_name.log" ||
          fail "$run_name: no TP layout"
        compare_with_np1 "$name.np1" "$run_name"
      done
    }
    model_config="$(sed -n 's/^model_config = "\(.*\)"/\1/p' "$default_recipe")"
    python3 - "$model_config" "$tmp/tied.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["tie_word_embeddings"] = True
json.dump(config, open(sys.argv[2], "w"))
PY
    train dense layouts --config "$default_recipe" "${small[@]}"
    train dense_tied layouts --config "$default_recipe" "${small[@]}" --model-config "$tmp/tied.json"
    train dense_sp layouts --config "$default_recipe" "${small[@]}" --sequence-parallel
    for recipe in "$@"; do
      train "$(basename "$recipe" .toml)" moe_layouts --config "$recipe"
    done
    ;;
  colocated)
    trainer="$1" default_recipe="$2"
    shift 2
    colocated() {  # colocated NAME LAYOUTS R3 FLAGS...
      local name="$1" r3="$3"
      local -n each="$2"
      shift 3
      local flags=(--params-dtype fp32 --rematerialize-param-from-master-weight
                   --check-rematerialize-param-from-master-weight "$@")
      run 1 "$name.np1" "${flags[@]}" --num-rollout 1 \
        --save-debug-rollout-data "$tmp/$name.np1.samples" || { fail "$name -np 1"; return; }
      for layout in "${each[@]}"; do
        read -r np tp ep <<< "$layout"
        local run_name="$name.np$np.tp$tp.ep$ep"
        run "$np" "$run_name" "${flags[@]}" --num-rollout 2 --tensor-model-parallel-size "$tp" \
          --expert-model-parallel-size "$ep" --save-debug-rollout-data "$tmp/$run_name.samples" ||
          { fail "$run_name"; continue; }
        python3 - "$tmp/$name.np1.samples" "$tmp/$run_name.samples" <<'PY' ||
import json, sys
want = [json.loads(line)["tokens"] for line in open(sys.argv[1])]
got = [json.loads(line)["tokens"] for line in open(sys.argv[2])][:len(want)]
sys.exit(0 if want and got == want else 1)
PY
          fail "$run_name: the first iteration's samples differ from -np 1's"
        ci_checks "$run_name" true "$r3"
      done
    }
    colocated dense layouts false --config "$default_recipe" "${small[@]}" --ci-test
    for recipe in "$@"; do
      colocated "$(basename "$recipe" .toml)" moe_layouts \
        "$(grep -q "^use_rollout_routing_replay = true" "$recipe" && echo true)" --config "$recipe"
    done
    ;;
  resume)
    trainer="$1" recipe="$2"
    tp2=(--config "$recipe" --tensor-model-parallel-size 2)
    run 4 saved "${tp2[@]}" --num-rollout 2 --save "$tmp/saved" || fail "the run that saves"
    run 4 resumed "${tp2[@]}" --num-rollout 3 --load "$tmp/saved" --save "$tmp/resumed" ||
      fail "the resumed run"
    run 4 straight "${tp2[@]}" --num-rollout 3 --save "$tmp/straight" || fail "the straight run"
    files=(model.safetensors optimizer/rank_0000{0,1,2,3}.safetensors trainer_state.json)
    for f in "${files[@]}"; do
      cmp -s "$tmp/straight/iter_0000003/$f" "$tmp/resumed/iter_0000003/$f" ||
        fail "resumed and straight runs differ in $f"
    done
    echo "resume at TP 2 x DP 2: ${#files[@]} files identical to the straight run's"
    hop() {  # hop NP TP EP FROM TO
      run "$1" "hop.$5" --config "$recipe" --num-rollout 2 --tensor-model-parallel-size "$2" \
        --expert-model-parallel-size "$3" --load "$tmp/$4" --save "$tmp/$5" ||
        { fail "load $4 at -np $1 TP $2 EP $3"; return 1; }
      grep -q "resharded the optimizer state" "$tmp/hop.$5.log" || fail "$5: not resharded"
    }
    # -np 2 TP 2 x EP 2 has DP 1: EP divides DP x TP, not DP (Note [Rank grid]).
    hop 2 1 1 saved b && hop 4 4 1 b c && hop 4 2 2 c e && hop 2 2 2 e f && hop 4 2 1 f d
    same_saved_tensors "$tmp/saved/iter_0000002" "$tmp/b/iter_0000002" weights ||
      fail "TP 1 weights"
    same_saved_tensors "$tmp/saved/iter_0000002" "$tmp/d/iter_0000002" || fail "round trip"
    run 2 at_tp1 --config "$recipe" --num-rollout 3 --load "$tmp/saved" || fail "resume at TP 1"
    grep -q "iteration 3: " "$tmp/at_tp1.log" || fail "TP 1: no iteration 3 after the resume"
    ;;
  *)
    echo "unknown mode $mode"
    exit 2
    ;;
esac
finish
