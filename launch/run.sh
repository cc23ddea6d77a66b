#!/usr/bin/env bash
# Runs the main job: launch/run.sh [CONFIG] [--np N] [-- TRAINER FLAGS...]
# With no CONFIG, the embedded default (configs/default.toml: CPU, 2 ranks).
# Installs what it needs (tools/setup.sh), builds the trainer, and starts it under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."

config=""
np=2
trainer_flags=()
while (($#)); do
  case "$1" in
    --np) np="$2"; shift 2 ;;
    --) shift; trainer_flags=("$@"); break ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) config="$1"; shift ;;
  esac
done

tools/setup.sh
bazel build //trainer >&2
args=()
if [[ -n "$config" ]]; then args+=(--config "$config"); fi
exec tests/mpi_run.sh "$np" bazel-bin/trainer/trainer "${args[@]}" "${trainer_flags[@]}"
