#!/usr/bin/env bash
# Config errors under mpirun on 2 ranks of the embedded default end the whole job with status 2
# and the message of the rank that found them, long before --comm-timeout-s (300 s here; mpirun's
# own timeout, 120 s, would end a hung job with another status). One property per case:
#   1. --metrics-out in a directory that does not exist: rank 0 refuses it in the config stage;
#   2. --metrics-out naming a directory: only rank 0 opens it, once MPI is up, and rank 1 is
#      already waiting in a collective (Note [Config errors after MPI], trainer/main.cc).
set -uo pipefail
trainer="$1" config="$2"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failed=0
fail() { echo "FAIL: $*"; failed=1; }

run() {  # run LOG FLAGS...: prints mpirun's exit status
  local log="$1"
  shift
  RL_MPI_TIMEOUT_S=120 "$here/mpi_run.sh" 2 "$trainer" --config "$config" --num-rollout 1 \
    --comm-timeout-s 300 "$@" > "$log" 2>&1
  echo $?
}

status=$(run "$tmp/1.log" --metrics-out "$tmp/missing/metrics.jsonl")
[[ $status -eq 2 ]] &&
  grep -q "r0 .*--metrics-out $tmp/missing/metrics.jsonl: the directory $tmp/missing cannot take the file (No such file or directory)" "$tmp/1.log" ||
  { tail -n 20 "$tmp/1.log"; fail "1: status $status"; }

mkdir -p "$tmp/a_directory"
start=$(date +%s)
status=$(run "$tmp/2.log" --metrics-out "$tmp/a_directory")
seconds=$(($(date +%s) - start))
echo "2: status $status after $seconds s"
[[ $status -eq 2 ]] && grep -q "r0 .*--metrics-out $tmp/a_directory: cannot open for writing" "$tmp/2.log" ||
  { tail -n 20 "$tmp/2.log"; fail "2: status $status"; }

[[ $failed -eq 0 ]] && echo "PASS"
exit $failed
