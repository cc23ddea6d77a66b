#!/usr/bin/env bash
# A rank that stops responding mid-run (Note [Fault injection]) does not hang the job: the other
# rank's next collective fails with CommError after --comm-timeout-s 5, names the operation, the
# job is aborted, and mpirun exits non-zero, all within the timeout plus 15 s (measured: 7 s).
set -uo pipefail
trainer="$1" recipe="$2" data="$3"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
start=$SECONDS
RL_FAULT_HANG="1:2" RL_MPI_TIMEOUT_S=120 "$here/mpi_run.sh" 2 -x RL_FAULT_HANG "$trainer" \
  --config "$recipe" --load-debug-rollout-data "$data" --num-rollout 3 --comm-timeout-s 5 \
  > "$tmp/log" 2>&1
status=$?
elapsed=$((SECONDS - start))
echo "mpirun exit status $status after $elapsed s"
grep -E "did not complete within its timeout|RL_FAULT_HANG" "$tmp/log" | cut -c1-300
[[ $status -ne 0 ]] || { echo "FAIL: mpirun exited 0"; exit 1; }
[[ $elapsed -le 20 ]] || { echo "FAIL: took $elapsed s"; exit 1; }
grep -q "r0 .*did not complete within its timeout of 5000 ms" "$tmp/log" ||
  { tail -n 30 "$tmp/log"; echo "FAIL: rank 0 did not report the timed-out collective"; exit 1; }
echo "PASS"
