#!/usr/bin/env bash
# The rollout phase at 1 and at N data-parallel CPU ranks on the same global batch, in one call:
#   tools/bench/dp_rollout_bench.sh [RANKS] [TRAINER ARGS...]
# Each rank computes with one thread (OMP_NUM_THREADS=1), as one GPU per rank would, so N ranks
# need N cores. Prints the mean time_rollout_s of iterations 2..K at each size (the first warms
# up) and their ratio. Default run: the Qwen3-MoE CI recipe, 8 prompts x 8 samples, 32 tokens.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks="${1:-2}"
shift || true
args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(--config configs/qwen3_30b_a3b_4layer_ci.toml --rollout-batch-size 8
        --n-samples-per-prompt 8 --global-batch-size 64 --rollout-max-response-len 32
        --num-rollout 4)
fi
bazel build //trainer >&2
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mean_rollout() {  # the mean time_rollout_s over iterations 2..K of a metrics file
  sed -n 's/.*"time_rollout_s":\([-0-9.e]*\).*/\1/p' "$1" | tail -n +2 |
    awk '{s += $1} END {printf "%.4f", s / NR}'
}
for np in 1 "$ranks"; do
  OMP_NUM_THREADS=1 tests/mpi_run.sh "$np" bazel-bin/trainer/trainer "${args[@]}" \
    --metrics-out "$tmp/$np.jsonl" > "$tmp/$np.log" 2>&1 || { tail -n 20 "$tmp/$np.log"; exit 1; }
done
one=$(mean_rollout "$tmp/1.jsonl")
many=$(mean_rollout "$tmp/$ranks.jsonl")
echo "rollout phase: 1 rank ${one} s, ${ranks} ranks ${many} s per iteration;" \
  "speed-up $(awk -v a="$one" -v b="$many" 'BEGIN {printf "%.2f", a / b}')x"
grep -o '"rollout_samples_per_rank":[^]]*]' "$tmp/$ranks.jsonl" | tail -n 1
