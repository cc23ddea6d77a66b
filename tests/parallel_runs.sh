# Sourced by the parallel-layout tests (ep_test.sh, tp_test.sh): run a trainer on N CPU ranks,
# compare a run's weights and grad norms with a -np 1 run's, and count a colocated run's CI
# checks. The caller sets $here, then $trainer (and $compare to compare); fail records a
# failure, finish prints PASS or FAILED and exits with the result.

tmp="${TEST_TMPDIR:-$(mktemp -d)}"
# How far an fp32 run at another layout may be from -np 1's: the weights absolutely, the grad
# norms relatively (the layouts differ only in the order of sums).
weight_tol=1e-6
norm_tol=1e-5
failed=0
fail() { echo "FAIL: $*"; failed=1; }
finish() {
  [[ $failed -eq 0 ]] && echo "PASS" || echo "FAILED"
  exit $failed
}

run() {  # run NP NAME FLAGS...: true when the trainer exits 0
  local np="$1" name="$2"
  shift 2
  "$here/mpi_run.sh" "$np" "$trainer" --metrics-out "$tmp/$name.jsonl" \
    --actor-num-gpus-per-node "$np" "$@" > "$tmp/$name.log" 2>&1 ||
    { tail -n 30 "$tmp/$name.log"; return 1; }
}

grad_norms() { sed -n 's/.*"grad_norm":\([-0-9.e+]*\).*/\1/p' "$tmp/$1.jsonl"; }

# compare_with_np1 NP1_NAME RUN_NAME: the weights saved with --save-hf within $weight_tol, and
# the grad norm of every step (before clipping; a wrong scaling of some gradients would change
# it) within a relative $norm_tol, over the 3 iterations both ran.
compare_with_np1() {
  local want="$1" got="$2"
  if ! "$compare" "$tmp/$want" "$tmp/$got" --tolerance "$weight_tol" > "$tmp/$got.compare"; then
    tail -n 5 "$tmp/$got.compare"
    fail "$got: weights differ from -np 1 by more than $weight_tol"
  fi
  if ! python3 - "$norm_tol" <(grad_norms "$want") <(grad_norms "$got") <<'PY'
import sys
tol = float(sys.argv[1])
a = [float(x) for x in open(sys.argv[2])]
b = [float(x) for x in open(sys.argv[3])]
worst = max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)), default=float("inf"))
print(f"grad norms {a} vs {b}: largest relative difference {worst:.2e}")
sys.exit(0 if len(a) == len(b) == 3 and worst <= tol else 1)
PY
  then
    fail "$got: grad norms differ from -np 1"
  fi
  echo "$got: $(tail -n 1 "$tmp/$got.compare")"
}

first_rollout() {  # the first metrics line's rollout figures, on one line
  head -n 1 "$tmp/$1.jsonl" | grep -o '"\(reward_mean\|response_length_mean\)":[^,]*' |
    tr '\n' ' '
}

# ci_checks NAME REMAT R3: a colocated run of 2 iterations passed every CI check it runs: 3
# weight-update checks (SHA256, actor vs engine), 3 verified rebuilds when REMAT is "true", 2
# routing replay checks with 0 differing pairs when R3 is "true". Prints the counts.
ci_checks() {
  local name="$1" remat="$2" r3="$3" checks rebuilds replays
  checks=$(grep -c "weight update check: .* SHA256-equal" "$tmp/$name.log" || true)
  rebuilds=$(grep -c "rematerialize restore #.* SHA256-identical" "$tmp/$name.log" || true)
  replays=$(grep -c "routing replay check: 0 of [1-9]" "$tmp/$name.log" || true)
  [[ $checks -eq 3 ]] || fail "$name: $checks weight update checks (want 3)"
  [[ $remat != true || $rebuilds -eq 3 ]] || fail "$name: $rebuilds verified rebuilds (want 3)"
  [[ $r3 != true || $replays -eq 2 ]] ||
    fail "$name: $replays routing replay checks with 0 differing pairs (want 2)"
  echo "$name: $checks weight checks, $rebuilds verified rebuilds, $replays replay checks," \
    "first rollout $(first_rollout "$name")"
}

# same_saved_tensors DIR_A DIR_B [weights]: two checkpoint directories hold bit-identical weights
# (by tensor name, whatever files they are in) and, unless "weights", bit-identical optimizer
# shards (by file and tensor; the CPU generator state aside, which resharding ranks do not take
# over). Prints what it compared.
same_saved_tensors() {
  python3 - "$1" "$2" "${3:-all}" <<'PY'
import glob, json, os, struct, sys

def tensors(path):  # name -> raw bytes of every tensor of a safetensors file
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}

def all_tensors(root, pattern, by_file):  # "file:tensor" (or "tensor") -> bytes
    out = {}
    for path in sorted(glob.glob(os.path.join(root, pattern))):
        for k, v in tensors(path).items():
            out[os.path.basename(path) + ":" + k if by_file else k] = v
    return out

a, b, what = sys.argv[1:]
weights = [all_tensors(x, "*.safetensors", False) for x in (a, b)]
assert weights[0] and weights[0] == weights[1], "the weights differ"
message = f"{len(weights[0])} weight tensors"
if what != "weights":
    shards = [{k: v for k, v in all_tensors(x, "optimizer/*.safetensors", True).items()
               if not k.endswith(":rng.cpu")} for x in (a, b)]
    assert shards[0] and shards[0] == shards[1], "the optimizer shards differ"
    message += f" and {len(shards[0])} optimizer tensors"
print(message + " bit-identical")
PY
}
