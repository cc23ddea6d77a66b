#!/usr/bin/env bash
# Two decode_bench runs compared in one call, alternately (A, B, A, B, ...: the GPU machines are
# noisy, and alternating spreads the noise over both):
#   tools/bench/decode_ab.sh ROUNDS 'A COMMAND' 'B COMMAND'
# Each command is a whole decode_bench command line (a build and its flags, such as
#   '.gpu/before/decode_bench --checkpoint /tmp/q06 --batch 64 --no-split-k-linear'),
# to which --step-time is added. Prints each run's decode step time, tokens/s, roofline fraction
# and generation_sha256, then per command the median step time, B's speed-up over A (A's median
# over B's) and whether every run generated the same bits. Exit status 1 when a run fails or
# prints no result.
set -euo pipefail
if [ $# -ne 3 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 ROUNDS 'A COMMAND' 'B COMMAND'" >&2
  exit 2
fi
rounds="$1"
commands=("$2" "$3")
labels=(A B)
results="$(mktemp)"
trap 'rm -f "$results"' EXIT

for ((round = 1; round <= rounds; round++)); do
  for side in 0 1; do
    label="${labels[$side]}"
    # shellcheck disable=SC2086  # the command is a command line, split into its words
    if ! line=$(${commands[$side]} --step-time | tail -n 1); then
      echo "decode_ab: run $round of $label failed: ${commands[$side]}" >&2
      exit 1
    fi
    printf '%s\t%s\n' "$label" "$line" >> "$results"
  done
done

python3 - "$results" <<'PY'
import json
import statistics
import sys

runs = {"A": [], "B": []}
for entry in open(sys.argv[1]):
    label, _, text = entry.rstrip("\n").partition("\t")
    try:
        result = json.loads(text)
    except json.JSONDecodeError:
        sys.exit(f"decode_ab: a {label} run printed no result: {text[-200:]!r}")
    if "decode_step_ms" not in result:
        sys.exit(f"decode_ab: a {label} run reported no decode step time (fewer than 2 new tokens?)")
    runs[label].append(result)
    fraction = result.get("decode_step_roofline_fraction")
    print(f"{label}: {result['decode_step_ms']:.3f} ms a step, {result['tokens_per_s']:.0f} tokens/s"
          + (f", {100 * fraction:.1f}% of the roofline" if fraction is not None else "")
          + f", {result.get('generation_sha256', '-')}")
medians = {label: statistics.median(r["decode_step_ms"] for r in rs) for label, rs in runs.items()}
shas = {r.get("generation_sha256") for rs in runs.values() for r in rs}
print(f"median step: A {medians['A']:.3f} ms, B {medians['B']:.3f} ms; "
      f"B / A speed-up {medians['A'] / medians['B']:.3f}x; "
      f"same bits in every run: {len(shas) == 1 and None not in shas}")
PY
