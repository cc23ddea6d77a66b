#!/usr/bin/env bash
# Runs the main job: launch/run.sh [CONFIG] [--np N] [-- TRAINER FLAGS...]
# With no CONFIG, the embedded default (configs/default.toml): a tiny model learning a toy task by
# GRPO on 2 CPU ranks. Installs what it needs (tools/setup.sh), builds, starts the trainer under
# mpirun, and plots the metrics: runs/<config name>/metrics.jsonl and metrics.svg, unless the
# trainer flags name another --metrics-out file.
set -euo pipefail
cd "$(dirname "$0")/.."

config="configs/default.toml"
np=2
trainer_flags=()
while (($#)); do
  case "$1" in
    --np) np="$2"; shift 2 ;;
    --) shift; trainer_flags=("$@"); break ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) config="$1"; shift ;;
  esac
done

metrics=""
for ((i = 0; i < ${#trainer_flags[@]}; ++i)); do
  if [[ "${trainer_flags[$i]}" == "--metrics-out" ]]; then metrics="${trainer_flags[$((i + 1))]:-}"; fi
done
if [[ -z "$metrics" ]]; then
  run_dir="runs/$(basename "$config" .toml)"
  mkdir -p "$run_dir"
  metrics="$run_dir/metrics.jsonl"
  trainer_flags+=(--metrics-out "$metrics")
fi

tools/setup.sh
bazel build //trainer //tools:plot_metrics >&2
bin="$(bazel info bazel-bin 2>/dev/null)"
tests/mpi_run.sh "$np" "$bin/trainer/trainer" --config "$config" "${trainer_flags[@]}"
plot="${metrics%.jsonl}.svg"
"$bin/tools/plot_metrics" "$metrics" "$plot"
echo "metrics: $metrics"
echo "plot:    $plot"
