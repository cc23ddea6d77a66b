#!/usr/bin/env bash
# A rank that fails mid-iteration (Note [Fault injection], at the start of iteration 2's train
# phase) does not hang the job, on 2 CPU ranks with --comm-timeout-s 5. One property per mode:
#   hang  rank 1 stops responding: rank 0's next collective fails after the 5 s timeout with a
#         message naming the operation and the rank it waited for, the job is aborted and mpirun
#         exits non-zero, within the timeout plus 15 s of the fault
#   kill  rank 1 is killed (SIGKILL): mpirun names the dead rank and ends the job, non-zero,
#         within 15 s of the fault
#   ep_hang  with the experts spread over both ranks (--expert-model-parallel-size 2), rank 1
#         stops responding inside iteration 2's first expert exchange (exchange_hang): rank 0's
#         all-to-all of the rows over the EP group fails after the timeout naming the operation,
#         the group and rank 1, and the job ends within the timeout plus 15 s
# Times are measured from the fault's log line, not from the start, so a slow start-up on a busy
# machine does not count.
set -uo pipefail
mode="$1" trainer="$2" recipe="$3" data="$4"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
log="$tmp/$mode.log"
fail() { echo "FAIL: $*"; exit 1; }
flags=()
case "$mode" in
  hang) budget=20 fault=hang ;;
  kill) budget=15 fault=kill ;;
  ep_hang) budget=20 fault=exchange_hang flags=(--expert-model-parallel-size 2) ;;
  *) fail "unknown mode $mode" ;;
esac

RL_FAULT="$fault:1:2" RL_MPI_TIMEOUT_S=300 "$here/mpi_run.sh" 2 -x RL_FAULT "$trainer" \
  --config "$recipe" --load-debug-rollout-data "$data" --num-rollout 3 --comm-timeout-s 5 \
  "${flags[@]}" > "$log" 2>&1 &
pid=$!
fault_at=""
while kill -0 "$pid" 2> /dev/null; do
  if [[ -z "$fault_at" ]] && grep -q "RL_FAULT: rank 1 injects" "$log"; then
    fault_at=$(date +%s%3N)
  fi
  sleep 0.1
done
wait "$pid"
status=$?
end_at=$(date +%s%3N)
[[ -n "$fault_at" ]] || { tail -n 30 "$log"; fail "the fault was not injected"; }
elapsed_ms=$((end_at - fault_at))
echo "mpirun exit status $status, $((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000))) s after the fault"
grep -E "did not complete within|RL_FAULT|noticed that process rank" "$log" | cut -c1-300
[[ $status -ne 0 ]] || fail "mpirun exited 0"
((elapsed_ms <= budget * 1000)) || fail "the job took ${elapsed_ms} ms to end (budget $budget s)"
if [[ "$mode" == hang ]]; then
  grep -q "r0 .*did not complete within its timeout of 5000 ms.*waiting for .*rank 1" "$log" ||
    { tail -n 30 "$log"; fail "rank 0 did not report the timed-out collective and rank 1"; }
elif [[ "$mode" == ep_hang ]]; then
  grep -q "r0 .*all_to_all over 'ep'.*did not complete within its timeout of 5000 ms.*waiting for rank 1" "$log" ||
    { tail -n 30 "$log"; fail "rank 0 did not report the timed-out all-to-all over 'ep' and rank 1"; }
else
  grep -q "process rank 1 .* exited on signal 9" "$log" ||
    { tail -n 30 "$log"; fail "mpirun did not name the killed rank"; }
fi
echo "PASS"
