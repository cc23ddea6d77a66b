#!/usr/bin/env bash
# Runs a program on N ranks of this machine: tests/mpi_run.sh N PROGRAM [ARGS...]
# Works as root (containers) and with more ranks than cores. mpirun's own --timeout ends a hung
# job (RL_MPI_TIMEOUT_S, default 600 s) so that no test can hang CI.
set -euo pipefail
np="$1"
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Loopback only; no network interfaces are probed, and no daemons are left behind.
exec mpirun -np "$np" --oversubscribe --bind-to none \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
  --timeout "${RL_MPI_TIMEOUT_S:-600}" "$@"
