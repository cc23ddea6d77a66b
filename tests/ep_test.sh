#!/usr/bin/env bash
# Expert parallelism on CPU ranks (MPI backend), against one rank. Three modes:
#   train TRAINER COMPARE DATA RECIPE...
#     each MoE CI model, fp32, trains 3 --debug-train-only iterations on the recorded rollout DATA
#     at -np 1, at -np 2 with EP 2 (EDP 1) and at -np 4 with EP 2 (DP 4, EDP 2). The weights saved
#     with --save-hf (every expert gathered from its rank) equal -np 1's within $weight_tol, and
#     the grad norm of every step (before clipping; a wrong scaling of the expert gradients would
#     change it) within a relative $norm_tol: the runs differ only in the order of fp32 sums
#     (measured: weights within 7.5e-8, grad norms within 4e-8 relative). The recorded rollout has
#     neither routing records nor rollout log-probs, so R3 and TIS are off here.
#   colocated TRAINER RECIPE...
#     each MoE *_4layer_ci recipe runs 2 colocated iterations at -np 2 EP 2, -np 4 EP 2 and -np 4
#     EP 4 with every CI check of the recipe passing (the SHA256 rebuild check, the weight-update
#     check between actor and engine, the first step's ppo_kl, the routing replay check). At -np 4
#     the recipes' 2 prompts leave two ranks without prompts; at EP 4 they share an EP group with
#     the two that have them, and their engines only serve the others' experts (Note
#     [Expert-parallel decode]). The first iteration's rollout (mean reward and response length)
#     equals a -np 1 run's: the decode steps' fixed-capacity dispatch gives the same bits as
#     every expert local (Note [Fixed-capacity dispatch]), and a row's tokens do not depend on
#     the rank or batch it ran in. A dispatch capacity too small for a decode step ends every
#     rank with the overflow error.
#   resume TRAINER RECIPE
#     a checkpoint saved at EP 2 resharded through EP 1 and EP 4 and back comes back bit for bit,
#     and resumes at another DP size (see the mode below).
set -euo pipefail
mode="$1"
shift
here="$(dirname "$0")"
# shellcheck source=tests/parallel_runs.sh
. "$here/parallel_runs.sh"

case "$mode" in
  train)
    trainer="$1" compare="$2" data="$3"
    shift 3
    for recipe in "$@"; do
      name="$(basename "$recipe" .toml)"
      flags=(--config "$recipe" --load-debug-rollout-data "$data" --debug-train-only
             --num-rollout 3 --params-dtype fp32 --no-use-rollout-routing-replay --no-use-tis)
      run 1 "$name.np1" "${flags[@]}" --save-hf "$tmp/$name.np1" || { fail "$name -np 1"; continue; }
      for layout in "2 2" "4 2"; do
        read -r np ep <<< "$layout"
        run_name="$name.np$np.ep$ep"
        if ! run "$np" "$run_name" "${flags[@]}" --expert-model-parallel-size "$ep" \
            --save-hf "$tmp/$run_name"; then
          fail "$name -np $np EP $ep"
          continue
        fi
        grep -q "parallel layout: EP $ep" "$tmp/$run_name.log" || fail "$run_name: no EP layout"
        compare_with_np1 "$name.np1" "$run_name"
      done
    done
    ;;
  colocated)
    trainer="$1"
    shift
    for recipe in "$@"; do
      name="$(basename "$recipe" .toml)"
      run 1 "$name.np1" --config "$recipe" --num-rollout 1 || { fail "$name -np 1"; continue; }
      for layout in "2 2" "4 2" "4 4"; do
        read -r np ep <<< "$layout"
        run_name="$name.np$np.ep$ep"
        run "$np" "$run_name" --config "$recipe" --num-rollout 2 \
          --expert-model-parallel-size "$ep" ||
          { fail "$run_name"; continue; }
        [[ "$(first_rollout "$run_name")" == "$(first_rollout "$name.np1")" ]] ||
          fail "$run_name: first rollout $(first_rollout "$run_name")differs from -np 1's" \
            "$(first_rollout "$name.np1")"
        ci_checks "$run_name" \
          "$(grep -q "^rematerialize_param_from_master_weight = true" "$recipe" && echo true)" \
          "$(grep -q "^use_rollout_routing_replay = true" "$recipe" && echo true)"
      done
    done
    # One row slot per pair of ranks cannot hold a decode step's rows: every rank ends with the
    # overflow error (no rank is left waiting in a collective).
    if run 2 overflow --config "$1" --num-rollout 1 --expert-model-parallel-size 2 \
        --rollout-ep-capacity-factor 0.01 > /dev/null; then
      fail "a decode step over a capacity of 1 row ran"
    fi
    overflows=$(grep -c "more rows than the dispatch capacity of 1 rows" "$tmp/overflow.log" || true)
    [[ $overflows -eq 2 ]] || fail "capacity overflow: $overflows ranks reported it (want 2)"
    echo "capacity 1: both ranks end with the overflow error"
    ;;
  resume)
    # Save at -np 2 EP 2; load and save again (nothing left to run, so the loaded state is saved
    # in the new layout) at -np 1 EP 1, then -np 4 EP 4, then back at -np 2 EP 2: every tensor
    # of the weights and of every rank's optimizer shard must come back bit for bit (the CPU
    # generator state aside, which the resharding ranks do not take over). Then a run at -np 4
    # EP 2 resumes the first checkpoint and trains 1 more iteration with every CI check.
    trainer="$1" recipe="$2"
    hop() {  # hop NP EP FROM TO
      run "$1" "hop.$4" --config "$recipe" --num-rollout 2 --expert-model-parallel-size "$2" \
        --load "$tmp/$3" --save "$tmp/$4" || { fail "load $3 at -np $1 EP $2"; return 1; }
      grep -q "resharded the optimizer state" "$tmp/hop.$4.log" || fail "$4: not resharded"
    }
    run 2 saved --config "$recipe" --num-rollout 2 --expert-model-parallel-size 2 \
      --save "$tmp/a" || fail "the EP 2 run that saves"
    hop 1 1 a b && hop 4 4 b c && hop 2 2 c d
    same_saved_tensors "$tmp/a/iter_0000002" "$tmp/b/iter_0000002" weights || fail "EP 1 weights"
    same_saved_tensors "$tmp/a/iter_0000002" "$tmp/d/iter_0000002" || fail "round trip"
    run 4 resumed --config "$recipe" --num-rollout 3 --expert-model-parallel-size 2 \
      --load "$tmp/a" || fail "resume at -np 4 EP 2"
    grep -q "iteration 3: " "$tmp/resumed.log" || fail "no iteration 3 after the resume"
    ;;
  *)
    echo "unknown mode $mode"
    exit 2
    ;;
esac
finish
